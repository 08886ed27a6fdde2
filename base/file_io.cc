#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace ps {

absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " '", path, "'"));
}

absl::Status WriteAll(int fd, const void* data, size_t size, absl::string_view path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) return ErrnoError(errno, "cannot open for fsync", path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(err, "cannot fsync", path);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(
    const std::string& path,
    absl::FunctionRef<absl::Status(int fd, const std::string& tmp_path)> write) {
  std::string tmp_path = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(tmp_path.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot create a temporary file for", path);
  bool fd_open = true;
  bool committed = false;
  absl::Cleanup cleanup = [&] {
    if (fd_open) ::close(fd);
    if (!committed) ::unlink(tmp_path.c_str());
  };
  if (::fchmod(fd, 0644) != 0) return ErrnoError(errno, "cannot chmod", tmp_path);
  RETURN_IF_ERROR(write(fd, tmp_path));
  if (::fsync(fd) != 0) return ErrnoError(errno, "cannot fsync", tmp_path);
  fd_open = false;
  if (::close(fd) != 0) return ErrnoError(errno, "cannot close", tmp_path);
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot rename '", tmp_path, "' to"), path);
  }
  committed = true;
  // Make the rename durable.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int rc = ::fsync(dir_fd);
    const int err = errno;
    ::close(dir_fd);
    if (rc != 0) return ErrnoError(err, "cannot fsync the directory of", path);
  }
  return absl::OkStatus();
}

}  // namespace ps
