#include "model/atomic_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {
namespace {

struct Entry {
  std::string name;
  mode_t type;  // S_IFREG, S_IFLNK, S_IFDIR, ...
};

absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot list directory", dir);
  absl::Cleanup close_dir = [d] { ::closedir(d); };
  std::vector<Entry> entries;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    const std::string path = absl::StrCat(dir, "/", name);
    if (::lstat(path.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat", path);
    entries.push_back({name, static_cast<mode_t>(st.st_mode & S_IFMT)});
    errno = 0;
  }
  if (errno != 0) return ErrnoError(errno, "cannot list directory", dir);
  return entries;
}

// Removes `dir` and everything under it.
absl::Status RemoveTree(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::vector<Entry> entries, ListDirectory(dir));
  for (const Entry& e : entries) {
    const std::string path = absl::StrCat(dir, "/", e.name);
    if (e.type == S_IFDIR) {
      RETURN_IF_ERROR(RemoveTree(path));
    } else if (::unlink(path.c_str()) != 0) {
      return ErrnoError(errno, "cannot remove", path);
    }
  }
  if (::rmdir(dir.c_str()) != 0) return ErrnoError(errno, "cannot remove directory", dir);
  return absl::OkStatus();
}

absl::Status CopyFile(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoError(errno, "cannot open", from);
  absl::Cleanup close_in = [in] { ::close(in); };
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) return ErrnoError(errno, "cannot create", to);
  absl::Cleanup close_out = [out] { ::close(out); };
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", from);
    }
    if (n == 0) break;
    RETURN_IF_ERROR(WriteAll(out, buffer.data(), static_cast<size_t>(n), to));
  }
  if (::fsync(out) != 0) return ErrnoError(errno, "cannot fsync", to);
  return absl::OkStatus();
}

// Puts a copy of `from` (a regular file or a symlink) at `to`: a hard link where possible.
absl::Status CarryOver(const std::string& from, const std::string& to, mode_t type) {
  if (::linkat(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), 0) == 0) return absl::OkStatus();
  const int err = errno;
  if (err != EXDEV && err != EPERM && err != EMLINK && err != ENOTSUP && err != EOPNOTSUPP) {
    return ErrnoError(err, absl::StrCat("cannot link '", from, "' to"), to);
  }
  if (type == S_IFLNK) {
    std::string target(4096, '\0');
    const ssize_t n = ::readlink(from.c_str(), target.data(), target.size());
    if (n < 0) return ErrnoError(errno, "cannot read symlink", from);
    target.resize(static_cast<size_t>(n));
    if (::symlink(target.c_str(), to.c_str()) != 0) return ErrnoError(errno, "cannot create", to);
    return absl::OkStatus();
  }
  return CopyFile(from, to);
}

}  // namespace

absl::Status ReplaceDirectoryAtomically(
    const std::string& dir_in, const DirectoryReplaceOptions& options,
    const std::function<absl::Status(const std::string& staging_dir)>& write) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : dir.substr(0, slash);
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  if (base.empty() || base == "." || base == ".." || dir == "/") {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot replace '", dir_in, "': it does not name a directory entry"));
  }
  struct stat st;
  if (::stat(parent.c_str(), &st) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot write '", dir, "': the parent directory"),
                      parent);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", dir, "': '", parent, "' is not a directory"));
  }

  // What is there now, and may it be replaced?
  bool target_exists = false;
  mode_t mode = 0755;  // of the new directory: the old one's, or 0755
  std::vector<Entry> old_entries;
  if (::lstat(dir.c_str(), &st) == 0) {
    target_exists = true;
    mode = st.st_mode & 07777;
    if (S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to replace '", dir, "': it is a symbolic link; name the real directory"));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("refusing to replace '", dir, "': it exists and is not a directory"));
    }
    ASSIGN_OR_RETURN(old_entries, ListDirectory(dir));
    bool has_marker = false;
    for (const Entry& e : old_entries) {
      if (e.type != S_IFREG && e.type != S_IFLNK) {
        return absl::FailedPreconditionError(
            absl::StrCat("refusing to replace '", dir, "': it contains '", e.name,
                         "', which is not a regular file (a model directory holds files only)"));
      }
      if (e.name == options.marker_file) has_marker = true;
    }
    if (!old_entries.empty() && !has_marker) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to replace '", dir, "': it is not empty and has no ", options.marker_file,
          ", so it does not look like a directory this program wrote; choose another path or "
          "empty it"));
    }
  } else if (errno != ENOENT) {
    return ErrnoError(errno, "cannot stat", dir);
  }

  std::string staging = absl::StrCat(parent, "/.", base, ".tmp.XXXXXX");
  if (::mkdtemp(staging.data()) == nullptr) {
    return ErrnoError(errno, "cannot create a staging directory for", dir);
  }
  bool staged = true;  // `staging` exists and must be removed on the way out
  absl::Cleanup remove_staging = [&] {
    if (!staged) return;
    if (const absl::Status s = RemoveTree(staging); !s.ok()) {
      LOG(WARNING) << "could not remove staging directory: " << s;
    }
  };
  // mkdtemp makes the directory private (0700); give it the old directory's mode, or 0755.
  if (::chmod(staging.c_str(), mode) != 0) {
    return ErrnoError(errno, "cannot chmod", staging);
  }
  RETURN_IF_ERROR(write(staging));
  for (const Entry& e : old_entries) {
    if (options.is_replaced && options.is_replaced(e.name)) continue;
    const std::string to = absl::StrCat(staging, "/", e.name);
    if (::lstat(to.c_str(), &st) == 0) continue;  // the new directory has its own
    RETURN_IF_ERROR(CarryOver(absl::StrCat(dir, "/", e.name), to, e.type));
  }
  RETURN_IF_ERROR(FsyncPath(staging, /*directory=*/true));

  if (!target_exists) {
    if (::rename(staging.c_str(), dir.c_str()) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot rename '", staging, "' to"), dir);
    }
    staged = false;
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    // `staging` now holds the old contents; the cleanup removes them.
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    // No atomic exchange on this file system: move the old one aside, then the new one in.
    std::string aside = absl::StrCat(parent, "/.", base, ".old.XXXXXX");
    if (::mkdtemp(aside.data()) == nullptr) {
      return ErrnoError(errno, "cannot create a directory to move the old one to, for", dir);
    }
    if (::rename(dir.c_str(), aside.c_str()) != 0) {
      const int err = errno;
      ::rmdir(aside.c_str());
      return ErrnoError(err, absl::StrCat("cannot move '", dir, "' aside to"), aside);
    }
    if (::rename(staging.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      if (::rename(aside.c_str(), dir.c_str()) != 0) {
        LOG(ERROR) << "could not put the old '" << dir << "' back; it is at '" << aside << "'";
      }
      return ErrnoError(err, absl::StrCat("cannot rename '", staging, "' to"), dir);
    }
    staged = false;
    if (const absl::Status s = RemoveTree(aside); !s.ok()) {
      LOG(WARNING) << "could not remove the replaced directory: " << s;
    }
  } else {
    return ErrnoError(errno, absl::StrCat("cannot exchange '", staging, "' with"), dir);
  }
  return FsyncPath(parent, /*directory=*/true);
}

}  // namespace ps
