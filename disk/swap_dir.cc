#include "disk/swap_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "glog/logging.h"

namespace ps {
namespace {

constexpr char kSwapPrefix[] = "patrickstar-swap-rank";
constexpr char kProbePrefix[] = "patrickstar-probe-";

// --- The signal-cleanup registry -----------------------------------------------------------------
// Fixed storage: the handler reads it without locks or allocation. An entry's state is kFree,
// kWriting (a registration is filling it) or kLive; the handler unlinks only kLive entries.

constexpr int kMaxCleanupFiles = 64;
enum : int { kFree = 0, kWriting = 1, kLive = 2 };
struct CleanupEntry {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
CleanupEntry g_cleanup[kMaxCleanupFiles];
static_assert(std::atomic<int>::is_always_lock_free,
              "the cleanup registry must be lock-free to be read from a signal handler");

extern "C" void UnlinkRegisteredAndReraise(int signal) {
  // Async-signal-safe only: atomics, unlink, raise.
  RemoveFilesRegisteredForSignalCleanup();
  // SA_RESETHAND restored the default disposition; the signal is blocked until this handler
  // returns, so the process then dies of it as it would have without the handler.
  ::raise(signal);
}

void InstallCleanupHandlers() {
  for (int signal : {SIGINT, SIGTERM}) {
    struct sigaction old = {};
    if (::sigaction(signal, nullptr, &old) != 0) continue;
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;  // someone's
    struct sigaction action = {};
    action.sa_handler = &UnlinkRegisteredAndReraise;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    if (::sigaction(signal, &action, nullptr) != 0) {
      LOG(WARNING) << "cannot install the " << ::strsignal(signal)
                   << " handler that removes the swap files: " << ::strerror(errno);
    }
  }
}

// --- Claiming
// -------------------------------------------------------------------------------------

std::string ReadPid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "unknown";
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buf, static_cast<size_t>(n))));
}

bool SameInode(int fd, const std::string& path) {
  struct stat a = {}, b = {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Opens and locks `lock_path` (creating it when `create`). Returns the descriptor, -1 with
// *holder set when another process holds it, or -1 with *error set (errno) otherwise.
int LockFile(const std::string& lock_path, bool create, std::string* holder, int* error) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0) {
      *error = errno;
      return -1;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) *holder = ReadPid(fd);
      ::close(fd);
      *error = err == EWOULDBLOCK ? 0 : err;
      return -1;
    }
    // The previous holder may have unlinked the file between our open and our flock.
    if (SameInode(fd, lock_path)) return fd;
    ::close(fd);
    if (!create) {
      *error = ENOENT;
      return -1;
    }
  }
  *error = EAGAIN;
  return -1;
}

void RemoveStale(const std::string& path, absl::string_view why,
                 std::vector<std::string>* removed) {
  if (::unlink(path.c_str()) != 0) {
    if (errno != ENOENT) {
      LOG(WARNING) << "cannot remove the stale swap file '" << path << "': " << ::strerror(errno);
    }
    return;
  }
  LOG(WARNING) << "removed the stale swap file '" << path << "' (" << why
               << "); swap files are scratch and never reused";
  removed->push_back(path);
}

}  // namespace

void RemoveFilesRegisteredForSignalCleanup() {
  const int saved_errno = errno;  // unlink may set it under the interrupted code
  for (CleanupEntry& e : g_cleanup) {
    if (e.state.load(std::memory_order_acquire) == kLive) ::unlink(e.path);
  }
  errno = saved_errno;
}

int RegisterFileForSignalCleanup(const std::string& path) {
  static std::once_flag once;
  std::call_once(once, InstallCleanupHandlers);
  if (path.size() >= PATH_MAX) {
    LOG(WARNING) << "path too long to be removed on SIGINT/SIGTERM: " << path;
    return -1;
  }
  for (int i = 0; i < kMaxCleanupFiles; ++i) {
    int expected = kFree;
    if (!g_cleanup[i].state.compare_exchange_strong(expected, kWriting,
                                                    std::memory_order_acq_rel)) {
      continue;
    }
    ::memcpy(g_cleanup[i].path, path.c_str(), path.size() + 1);
    g_cleanup[i].state.store(kLive, std::memory_order_release);
    return i;
  }
  LOG(WARNING) << "more than " << kMaxCleanupFiles
               << " files registered for removal on SIGINT/SIGTERM; '" << path
               << "' is only removed at normal exit";
  return -1;
}

void UnregisterFileForSignalCleanup(int handle) {
  if (handle < 0 || handle >= kMaxCleanupFiles) return;
  g_cleanup[handle].state.store(kFree, std::memory_order_release);
}

absl::StatusOr<std::unique_ptr<SwapDir>> SwapDir::Claim(const std::string& dir, int rank) {
  if (rank < 0) return absl::InvalidArgumentError(absl::StrCat("SwapDir: rank ", rank, " < 0"));
  struct stat st = {};
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoError(errno, "the swap directory (nvme_path) cannot be used: cannot stat", dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the swap directory (nvme_path) '", dir, "' is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoError(errno, "the swap directory (nvme_path) is not writable:", dir);
  }
  std::unique_ptr<SwapDir> claim(new SwapDir());
  claim->dir_ = dir;
  claim->rank_ = rank;
  claim->swap_path_ = absl::StrCat(dir, "/", kSwapPrefix, rank, ".bin");
  claim->lock_path_ = absl::StrCat(dir, "/", kSwapPrefix, rank, ".lock");

  std::string holder;
  int err = 0;
  claim->lock_fd_ = LockFile(claim->lock_path_, /*create=*/true, &holder, &err);
  if (claim->lock_fd_ < 0) {
    if (err != 0) return ErrnoError(err, "cannot create the swap lock file", claim->lock_path_);
    return absl::FailedPreconditionError(
        absl::StrCat("the swap directory '", dir, "' is in use by another run: process ", holder,
                     " holds the lock '", claim->lock_path_, "' of rank ", rank,
                     "; wait for it to finish or give this run another directory (nvme_path)"));
  }
  // From here the destructor releases the lock and removes the files.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(claim->lock_fd_, 0) != 0) {
    return ErrnoError(errno, "cannot truncate", claim->lock_path_);
  }
  if (::pwrite(claim->lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return ErrnoError(errno, "cannot write the pid into", claim->lock_path_);
  }
  claim->cleanup_handles_.push_back(RegisterFileForSignalCleanup(claim->swap_path_));
  claim->cleanup_handles_.push_back(RegisterFileForSignalCleanup(claim->lock_path_));

  // Stale files of this and other ranks, and of dead probes.
  RemoveStale(claim->swap_path_, absl::StrCat("left by a run of rank ", rank, " that was killed"),
              &claim->removed_stale_files_);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot list", dir);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& name : names) {
    absl::string_view rest = name;
    int other = 0;
    if (absl::ConsumePrefix(&rest, kSwapPrefix) && absl::ConsumeSuffix(&rest, ".bin") &&
        absl::SimpleAtoi(rest, &other) && other != rank) {
      const std::string other_lock = absl::StrCat(dir, "/", kSwapPrefix, other, ".lock");
      std::string other_holder;
      int other_err = 0;
      const int fd = LockFile(other_lock, /*create=*/false, &other_holder, &other_err);
      if (fd < 0 && other_err != ENOENT) continue;  // held by a live run (or unreadable)
      RemoveStale(absl::StrCat(dir, "/", name),
                  absl::StrCat("left by a run of rank ", other, " that was killed"),
                  &claim->removed_stale_files_);
      if (fd >= 0) {
        ::unlink(other_lock.c_str());
        ::close(fd);
      }
      continue;
    }
    rest = name;
    int probe_pid = 0;
    // "<prefix><pid>-<n>.bin" (n: the process's probe count).
    if (absl::ConsumePrefix(&rest, kProbePrefix) && absl::ConsumeSuffix(&rest, ".bin") &&
        absl::SimpleAtoi(rest.substr(0, rest.find('-')), &probe_pid) && probe_pid > 0 &&
        ::kill(probe_pid, 0) != 0 && errno == ESRCH) {
      RemoveStale(absl::StrCat(dir, "/", name),
                  absl::StrCat("left by a disk probe of process ", probe_pid, ", which is gone"),
                  &claim->removed_stale_files_);
    }
  }
  return claim;
}

SwapDir::~SwapDir() {
  for (int handle : cleanup_handles_) UnregisterFileForSignalCleanup(handle);
  if (lock_fd_ < 0) return;
  if (::unlink(swap_path_.c_str()) != 0 && errno != ENOENT) {
    LOG(WARNING) << "cannot remove the swap file '" << swap_path_ << "': " << ::strerror(errno);
  }
  // Unlinked while still held: a claim that opened the old file sees the inode change and retries.
  ::unlink(lock_path_.c_str());
  ::close(lock_fd_);
}

}  // namespace ps
