#include "trainer/io/checkpoint_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/crc32c.h"
#include "base/file_io.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {
namespace {

constexpr absl::string_view kStepPrefix = "step-";
constexpr absl::string_view kTmpStepPrefix = ".tmp-step-";
constexpr absl::string_view kTmpDeletePrefix = ".tmp-delete-";
// A manifest larger than this is not one this library wrote.
constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;
constexpr size_t kReadBlockBytes = size_t{1} << 20;

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string Hex32(uint32_t v) { return absl::StrFormat("%08x", v); }

std::optional<uint32_t> ParseHex32(absl::string_view s) {
  if (s.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  return v;
}

std::optional<int64_t> ParseDecimal(absl::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

// The step of a committed directory's name, only for the canonical spelling CheckpointDirName
// gives (so "step-5" and "step-00000005" cannot both claim step 5).
std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::StartsWith(name, kStepPrefix)) return std::nullopt;
  const std::optional<int64_t> step = ParseDecimal(name.substr(kStepPrefix.size()));
  if (!step.has_value() || CheckpointDirName(*step) != name) return std::nullopt;
  return step;
}

// The writer pid encoded in a temporary directory's name: ".tmp-step-<N>-<pid>-<rnd>" or
// ".tmp-delete-step-<N>-<pid>-<rnd>"; nullopt for any other name (which is then left alone).
std::optional<pid_t> ParseTmpOwner(absl::string_view name) {
  absl::string_view rest;
  if (absl::StartsWith(name, kTmpStepPrefix)) {
    rest = name.substr(kTmpStepPrefix.size());
  } else if (absl::StartsWith(name, kTmpDeletePrefix) &&
             absl::StartsWith(name.substr(kTmpDeletePrefix.size()), kStepPrefix)) {
    rest = name.substr(kTmpDeletePrefix.size() + kStepPrefix.size());
  } else {
    return std::nullopt;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, '-');
  if (parts.size() != 3 || !ParseDecimal(parts[0]).has_value() || parts[2].empty()) {
    return std::nullopt;
  }
  for (char c : parts[2]) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c))) return std::nullopt;
  }
  const std::optional<int64_t> pid = ParseDecimal(parts[1]);
  if (!pid.has_value() || *pid <= 0 || *pid > std::numeric_limits<pid_t>::max()) {
    return std::nullopt;
  }
  return static_cast<pid_t>(*pid);
}

bool ValidFileName(absl::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// The temporary directories (base names) owned by live CheckpointWriters of this process. Creating
// a temporary directory and registering it happen under the mutex, as does the debris check, so
// debris cleanup in one thread never removes another thread's fresh directory.
struct LiveTmpDirs {
  Mutex mu;
  absl::flat_hash_set<std::string> names ABSL_GUARDED_BY(mu);
};

LiveTmpDirs& GetLiveTmpDirs() {
  static LiveTmpDirs* const dirs = new LiveTmpDirs();
  return *dirs;
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot list directory", dir);
  absl::Cleanup close_dir = [d] { ::closedir(d); };
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(d);
    if (entry == nullptr) {
      if (errno != 0) return ErrnoError(errno, "cannot list directory", dir);
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool IsDirectoryNoFollow(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoError(ec.value(), "cannot remove", path);
  return absl::OkStatus();
}

// Writes a new file (O_EXCL); with `durable`, fsyncs it before closing.
absl::Status WriteNewFile(const std::string& path, absl::string_view bytes, bool durable) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create", path);
  bool open = true;
  absl::Cleanup close_fd = [&] {
    if (open) ::close(fd);
  };
  RETURN_IF_ERROR(WriteAll(fd, bytes.data(), bytes.size(), path));
  if (durable && ::fsync(fd) != 0) return ErrnoError(errno, "cannot fsync", path);
  open = false;
  if (::close(fd) != 0) return ErrnoError(errno, "cannot close", path);
  return absl::OkStatus();
}

struct SizeAndCrc {
  int64_t size_bytes = 0;
  uint32_t crc32c = 0;
};

// Reads a whole file computing its CRC-32C; with `durable`, fsyncs it too.
absl::StatusOr<SizeAndCrc> ChecksumFile(const std::string& path, bool durable) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<char[]> buffer(new char[kReadBlockBytes]);
  SizeAndCrc out;
  while (true) {
    const ssize_t n = ::read(fd, buffer.get(), kReadBlockBytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (n == 0) break;
    out.crc32c = Crc32cExtend(out.crc32c, buffer.get(), static_cast<size_t>(n));
    out.size_bytes += n;
  }
  if (durable && ::fsync(fd) != 0) return ErrnoError(errno, "cannot fsync", path);
  return out;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  std::string text;
  char buffer[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > max_bytes) {
      return absl::DataLossError(absl::StrCat("'", path, "' is larger than ", max_bytes,
                                              " bytes; it is not a checkpoint manifest"));
    }
  }
  return text;
}

// Checks that `root` is a directory, creating it (and its parents) if it does not exist.
absl::Status EnsureRoot(const std::string& root) {
  struct stat st;
  if (::stat(root.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint root '", root, "' exists but is not a directory; pass a directory path"));
    }
    return absl::OkStatus();
  }
  if (errno != ENOENT) return ErrnoError(errno, "cannot stat checkpoint root", root);
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return ErrnoError(ec.value(), "cannot create checkpoint root", root);
  // Make the new root's own directory entry durable (commits fsync only the root itself).
  std::filesystem::path normal = std::filesystem::path(root).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "a/b/" -> "a/b"
  std::filesystem::path parent = normal.parent_path();
  if (parent.empty()) parent = ".";
  const absl::Status synced = FsyncPath(parent.string(), /*directory=*/true);
  LOG_IF(WARNING, !synced.ok()) << "created checkpoint root '" << root << "' but " << synced;
  return absl::OkStatus();
}

// Removes the temporary directories of writers that are gone (see the header).
void CleanDebris(const std::string& root) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(root);
  if (!names.ok()) {
    LOG(WARNING) << "not cleaning checkpoint debris: " << names.status();
    return;
  }
  const pid_t self = ::getpid();
  LiveTmpDirs& live = GetLiveTmpDirs();
  for (const std::string& name : *names) {
    const std::optional<pid_t> owner = ParseTmpOwner(name);
    if (!owner.has_value()) continue;
    const std::string path = JoinPath(root, name);
    if (!IsDirectoryNoFollow(path)) continue;
    MutexLock lock(&live.mu);
    bool stale;
    if (*owner == self) {
      stale = !live.names.contains(name);
    } else {
      stale = ::kill(*owner, 0) != 0 && errno == ESRCH;
    }
    if (!stale) continue;
    const absl::Status removed = RemoveTree(path);
    if (removed.ok()) {
      LOG(INFO) << "removed '" << path << "', left by checkpoint writer pid " << *owner
                << " which is gone";
    } else {
      LOG(WARNING) << "cannot remove checkpoint debris: " << removed;
    }
  }
}

// Keeps the `keep_last` highest committed steps and `just_written`; deletes the rest.
void Prune(const std::string& root, int keep_last, int64_t just_written) {
  if (keep_last <= 0) return;
  absl::StatusOr<std::vector<CheckpointRef>> all = ListCheckpoints(root);
  if (!all.ok()) {
    LOG(WARNING) << "not pruning checkpoints: " << all.status();
    return;
  }
  if (static_cast<int>(all->size()) <= keep_last) return;
  static std::atomic<uint64_t> counter{0};
  for (size_t i = 0; i + keep_last < all->size(); ++i) {
    const CheckpointRef& old = (*all)[i];
    if (old.step == just_written) continue;
    // Out of the listing atomically first, then deleted at leisure.
    const std::string doomed = JoinPath(
        root, absl::StrCat(kTmpDeletePrefix, CheckpointDirName(old.step), "-", ::getpid(), "-",
                           absl::StrFormat("%x%x", absl::GetCurrentTimeNanos(), counter++)));
    if (::rename(old.path.c_str(), doomed.c_str()) != 0) {
      LOG(WARNING) << "cannot prune checkpoint: "
                   << ErrnoError(errno, absl::StrCat("cannot rename to '", doomed, "'"), old.path);
      continue;
    }
    const absl::Status removed = RemoveTree(doomed);
    LOG_IF(WARNING, !removed.ok())
        << "pruned checkpoint step " << old.step
        << " was not fully deleted (it is cleaned up later): " << removed;
  }
  const absl::Status synced = FsyncPath(root, /*directory=*/true);
  LOG_IF(WARNING, !synced.ok()) << synced;
}

}  // namespace

std::string CheckpointDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

absl::StatusOr<std::string> Checkpoint::FilePath(absl::string_view name) const {
  for (const CheckpointFileInfo& f : files) {
    if (f.name == name) return f.path;
  }
  std::vector<std::string> names;
  for (const CheckpointFileInfo& f : files) names.push_back(f.name);
  return absl::NotFoundError(absl::StrCat("checkpoint '", path, "' has no file '", name,
                                          "'; its files: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<CheckpointWriter> CheckpointWriter::Begin(const std::string& root, int64_t step,
                                                         CheckpointOptions options) {
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root is empty");
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step must be >= 0, got ", step, " (root '", root, "')"));
  }
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CheckpointOptions.keep_last must be >= 0 (0 keeps all), got ", options.keep_last));
  }
  RETURN_IF_ERROR(EnsureRoot(root));
  const std::string final_path = JoinPath(root, CheckpointDirName(step));
  struct stat st;
  if (::lstat(final_path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("a checkpoint for step ", step, " already exists at '", final_path, "'"));
  }
  CleanDebris(root);

  CheckpointWriter w;
  w.root_ = root;
  w.step_ = step;
  w.options_ = options;
  std::string templ =
      JoinPath(root, absl::StrCat(kTmpStepPrefix, step, "-", ::getpid(), "-XXXXXX"));
  LiveTmpDirs& live = GetLiveTmpDirs();
  {
    MutexLock lock(&live.mu);
    if (::mkdtemp(templ.data()) == nullptr) {
      return ErrnoError(errno, "cannot create a temporary checkpoint directory in", root);
    }
    live.names.insert(std::string(std::filesystem::path(templ).filename()));
  }
  w.tmp_path_ = std::move(templ);
  w.active_ = true;
  return w;
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& other) noexcept
    : root_(std::move(other.root_)),
      step_(other.step_),
      options_(other.options_),
      tmp_path_(std::move(other.tmp_path_)),
      active_(std::exchange(other.active_, false)),
      files_(std::move(other.files_)),
      file_set_(std::move(other.file_set_)) {}

CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&& other) noexcept {
  if (this != &other) {
    if (active_) (void)Abort();
    root_ = std::move(other.root_);
    step_ = other.step_;
    options_ = other.options_;
    tmp_path_ = std::move(other.tmp_path_);
    active_ = std::exchange(other.active_, false);
    files_ = std::move(other.files_);
    file_set_ = std::move(other.file_set_);
  }
  return *this;
}

CheckpointWriter::~CheckpointWriter() {
  if (!active_) return;
  const absl::Status status = Abort();
  LOG_IF(WARNING, !status.ok()) << "uncommitted checkpoint: " << status;
}

std::string CheckpointWriter::FilePath(absl::string_view name) const {
  return JoinPath(tmp_path_, name);
}

void CheckpointWriter::Release() {
  LiveTmpDirs& live = GetLiveTmpDirs();
  MutexLock lock(&live.mu);
  live.names.erase(std::string(std::filesystem::path(tmp_path_).filename()));
  active_ = false;
}

absl::Status CheckpointWriter::AddFile(absl::string_view name) {
  if (!active_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint writer for step ", step_,
                     " is finished (committed or aborted); cannot add '", name, "'"));
  }
  if (!ValidFileName(name) || name == kCheckpointManifestName) {
    return absl::InvalidArgumentError(absl::StrCat("invalid checkpoint file name '", name,
                                                   "': use [A-Za-z0-9._-]+, not '.', '..' or '",
                                                   kCheckpointManifestName, "'"));
  }
  if (file_set_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("file '", name, "' was already added to the checkpoint of step ", step_));
  }
  const std::string path = FilePath(name);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return ErrnoError(errno, "cannot add checkpoint file: cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint file '", path, "' is not a regular file"));
  }
  files_.emplace_back(name);
  file_set_.emplace(name);
  return absl::OkStatus();
}

absl::Status CheckpointWriter::WriteFile(absl::string_view name, absl::string_view bytes) {
  if (!active_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint writer for step ", step_,
                     " is finished (committed or aborted); cannot write '", name, "'"));
  }
  if (!ValidFileName(name) || name == kCheckpointManifestName) return AddFile(name);  // the error
  RETURN_IF_ERROR(WriteNewFile(FilePath(name), bytes, /*durable=*/false));
  return AddFile(name);
}

absl::StatusOr<std::string> CheckpointWriter::Commit(const nlohmann::json& state) {
  if (!active_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint writer for step ", step_, " is finished (committed or aborted)"));
  }
  // Everything in the directory must have been added: a file the caller forgot to add would be
  // committed without a checksum and ignored by readers.
  ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(tmp_path_));
  std::vector<std::string> unknown;
  for (const std::string& entry : entries) {
    if (!file_set_.contains(entry)) unknown.push_back(entry);
  }
  if (!unknown.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory '", tmp_path_,
        "' holds entries that were not added with AddFile: ", absl::StrJoin(unknown, ", ")));
  }

  std::vector<std::string> names = files_;
  std::sort(names.begin(), names.end());
  nlohmann::ordered_json manifest = nlohmann::ordered_json::object();
  manifest["format"] = std::string(kCheckpointFormat);
  manifest["version"] = kCheckpointFormatVersion;
  manifest["step"] = step_;
  manifest["files"] = nlohmann::ordered_json::array();
  for (const std::string& name : names) {
    const std::string path = FilePath(name);
    absl::StatusOr<SizeAndCrc> sum = ChecksumFile(path, /*durable=*/true);
    if (!sum.ok()) return sum.status();
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["name"] = name;
    entry["size_bytes"] = sum->size_bytes;
    entry["crc32c"] = Hex32(sum->crc32c);
    manifest["files"].push_back(std::move(entry));
  }
  manifest["state"] = nlohmann::ordered_json::parse(
      state.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), nullptr,
      /*allow_exceptions=*/false);
  const std::string text =
      manifest.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  RETURN_IF_ERROR(WriteNewFile(FilePath(kCheckpointManifestName), text, /*durable=*/true));
  RETURN_IF_ERROR(FsyncPath(tmp_path_, /*directory=*/true));

  // The commit point.
  const std::string final_path = JoinPath(root_, CheckpointDirName(step_));
  const auto already_exists = [&] {
    return absl::AlreadyExistsError(absl::StrCat("a checkpoint for step ", step_,
                                                 " already exists at '", final_path,
                                                 "'; not overwriting it"));
  };
  if (::renameat2(AT_FDCWD, tmp_path_.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) !=
      0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) return already_exists();
    if (err != EINVAL && err != ENOSYS) {
      return ErrnoError(err, absl::StrCat("cannot rename '", tmp_path_, "' to"), final_path);
    }
    // The file system cannot rename without replacing: check, then rename (a directory is never
    // renamed over a non-empty one, and committed checkpoints are never empty).
    struct stat st;
    if (::lstat(final_path.c_str(), &st) == 0) return already_exists();
    if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) return already_exists();
      return ErrnoError(errno, absl::StrCat("cannot rename '", tmp_path_, "' to"), final_path);
    }
  }
  Release();
  const absl::Status synced = FsyncPath(root_, /*directory=*/true);
  if (!synced.ok()) {
    // The checkpoint is complete and visible; only its durability across a power loss is unsure.
    LOG(WARNING) << "checkpoint '" << final_path << "' committed but " << synced;
  }
  Prune(root_, options_.keep_last, step_);
  CleanDebris(root_);
  return final_path;
}

absl::Status CheckpointWriter::Abort() {
  if (!active_) return absl::OkStatus();
  const std::string path = tmp_path_;
  Release();
  return RemoveTree(path);
}

absl::StatusOr<std::vector<CheckpointRef>> ListCheckpoints(const std::string& root) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::vector<CheckpointRef>();
    return ErrnoError(errno, "cannot stat checkpoint root", root);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint root '", root, "' is not a directory"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(root));
  std::vector<CheckpointRef> out;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = ParseStepDirName(name);
    if (!step.has_value()) continue;
    CheckpointRef ref;
    ref.step = *step;
    ref.path = JoinPath(root, name);
    if (!IsDirectoryNoFollow(ref.path)) continue;
    struct stat manifest;
    if (::lstat(JoinPath(ref.path, kCheckpointManifestName).c_str(), &manifest) != 0) continue;
    out.push_back(std::move(ref));
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return out;
}

absl::StatusOr<CheckpointRef> LatestCheckpoint(const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<CheckpointRef> all, ListCheckpoints(root));
  if (all.empty()) {
    return absl::NotFoundError(absl::StrCat("no committed checkpoint in '", root, "'"));
  }
  return all.back();
}

absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir, OpenCheckpointOptions options) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot open checkpoint", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", dir, "' is not a checkpoint: not a directory"));
  }
  const std::string manifest_path = JoinPath(dir, kCheckpointManifestName);
  if (::lstat(manifest_path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", dir, "' is not a checkpoint directory: it has no ", kCheckpointManifestName));
    }
    return ErrnoError(errno, "cannot stat", manifest_path);
  }
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(manifest_path, kMaxManifestBytes));
  nlohmann::json manifest = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest '", manifest_path, "' is corrupt: ", what));
  };
  if (manifest.is_discarded()) return corrupt("not valid JSON");
  if (!manifest.is_object() || !manifest.contains("format") ||
      manifest["format"] != std::string(kCheckpointFormat)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", dir, "' is not a checkpoint directory: its ", kCheckpointManifestName,
                     " is not a \"", kCheckpointFormat, "\" manifest"));
  }
  const nlohmann::json& version = manifest["version"];
  if (!version.is_number_integer()) return corrupt("\"version\" is not an integer");
  if (version.get<int64_t>() != kCheckpointFormatVersion) {
    return absl::UnimplementedError(absl::StrCat("checkpoint '", dir, "' has format version ",
                                                 version.dump(), "; this program reads ",
                                                 kCheckpointFormatVersion));
  }
  const nlohmann::json& step = manifest["step"];
  if (!step.is_number_unsigned() || step.get<uint64_t>() > uint64_t{INT64_MAX}) {
    return corrupt("\"step\" is not a non-negative integer");
  }
  Checkpoint out;
  out.step = step.get<int64_t>();
  out.path = dir;
  // A canonical directory name must agree with the manifest.
  const std::optional<int64_t> dir_step =
      ParseStepDirName(std::string(std::filesystem::path(dir).lexically_normal().filename()));
  if (dir_step.has_value() && *dir_step != out.step) {
    return corrupt(
        absl::StrCat("it records step ", out.step, " but the directory is step ", *dir_step));
  }
  if (!manifest.contains("state")) return corrupt("no \"state\"");
  const nlohmann::json& files = manifest["files"];
  if (!files.is_array()) return corrupt("\"files\" is not an array");
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < files.size(); ++i) {
    const nlohmann::json& f = files[i];
    const std::string where = absl::StrCat("files[", i, "]");
    if (!f.is_object()) return corrupt(absl::StrCat(where, " is not an object"));
    const auto name = f.find("name");
    const auto size = f.find("size_bytes");
    const auto crc = f.find("crc32c");
    if (name == f.end() || !name->is_string() ||
        !ValidFileName(name->get_ref<const std::string&>()) ||
        name->get_ref<const std::string&>() == kCheckpointManifestName) {
      return corrupt(absl::StrCat(where, " has no valid \"name\""));
    }
    if (size == f.end() || !size->is_number_unsigned() ||
        size->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return corrupt(absl::StrCat(where, " has no valid \"size_bytes\""));
    }
    std::optional<uint32_t> crc_value;
    if (crc != f.end() && crc->is_string())
      crc_value = ParseHex32(crc->get_ref<const std::string&>());
    if (!crc_value.has_value()) {
      return corrupt(absl::StrCat(where, " has no valid \"crc32c\" (8 lowercase hex digits)"));
    }
    CheckpointFileInfo info;
    info.name = name->get<std::string>();
    info.path = JoinPath(dir, info.name);
    info.size_bytes = size->get<int64_t>();
    info.crc32c = *crc_value;
    if (!seen.insert(info.name).second) {
      return corrupt(absl::StrCat("file '", info.name, "' is listed twice"));
    }
    out.files.push_back(std::move(info));
  }
  std::sort(
      out.files.begin(), out.files.end(),
      [](const CheckpointFileInfo& a, const CheckpointFileInfo& b) { return a.name < b.name; });

  for (const CheckpointFileInfo& f : out.files) {
    struct stat fst;
    if (::stat(f.path.c_str(), &fst) != 0) {
      if (errno == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat("checkpoint '", dir, "' lists file '", f.name, "', which does not exist"));
      }
      return ErrnoError(errno, "cannot stat checkpoint file", f.path);
    }
    if (!S_ISREG(fst.st_mode)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file '", f.path, "' is not a regular file"));
    }
    if (fst.st_size != f.size_bytes) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", f.path, "' has ", fst.st_size,
                                              " bytes but the manifest records ", f.size_bytes,
                                              fst.st_size < f.size_bytes ? " (truncated)" : ""));
    }
    if (!options.verify_checksums) continue;
    ASSIGN_OR_RETURN(const SizeAndCrc sum, ChecksumFile(f.path, /*durable=*/false));
    if (sum.size_bytes != f.size_bytes) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", f.path, "' changed size while ",
                                              "being verified: ", sum.size_bytes, " bytes read, ",
                                              f.size_bytes, " expected"));
    }
    if (sum.crc32c != f.crc32c) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", f.path,
                                              "' is corrupt: its CRC-32C is ", Hex32(sum.crc32c),
                                              " but the manifest records ", Hex32(f.crc32c)));
    }
  }
  out.state = std::move(manifest["state"]);
  return out;
}

}  // namespace ps
