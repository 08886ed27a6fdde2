// SwapDir: one rank's claim on the directory that holds the disk tier's swap files
// (zero_optimization.offload_optimizer.nvme_path, --nvme_path), and the cleanup of those files.
//
// Claiming (SwapDir::Claim):
//  - The directory must exist and be writable (errors name it).
//  - A lock file "<dir>/patrickstar-swap-rank<R>.lock" is held with flock(LOCK_EX | LOCK_NB) for
//    the claim's lifetime, with the holder's pid written in it. A second run on the same directory
//    and rank while the first lives gets FailedPrecondition naming the directory, the lock file and
//    the other pid. (One lock per rank, not per directory: the ranks of one run started by mpirun
//    are separate processes sharing the directory.) After taking the lock, the lock file's inode
//    is compared with the path's, so a claim never holds a lock file another run just unlinked.
//  - Swap files left by a killed run — "<dir>/patrickstar-swap-rank<S>.bin" whose rank's lock is
//    free (or gone), and probe files "<dir>/patrickstar-probe-<pid>.bin" of dead pids — are never
//    trusted: they are removed with a LOG(WARNING) naming each, listed in removed_stale_files(),
//    and the directory is reused.
//
// Removal of the files:
//  - At normal exit: ~SwapDir removes the swap file (when the swap did not already) and the lock
//    file. A trainer that installed its SIGINT/SIGTERM handlers (trainer/io/signal_flag.h) stops
//    gracefully on those signals, so the destructors run and remove the files.
//  - A process that left SIGINT/SIGTERM at their default disposition (a benchmark, a tool) would be
//    killed without running destructors. For it, RegisterFileForSignalCleanup() installs, once per
//    process and only for a signal whose disposition is still SIG_DFL when the first file is
//    registered, an async-signal-safe handler that unlinks every registered file and re-raises
//    the signal with the default disposition (SA_RESETHAND), so the process still dies of the
//    signal with the usual exit status. Handlers installed later (the trainer's) replace it, and
//    then the graceful stop above applies; the trainer's second Ctrl-C, which kills instead of
//    stopping, removes the files first (RemoveFilesRegisteredForSignalCleanup, called by
//    trainer/io/signal_flag.h's handler). Files are not removed when the process dies of a
//    signal nobody handles: SIGKILL or a crash; those files are the stale files the next claim
//    removes.
//
// Thread safety: SwapDir is thread-compatible. The registration functions are thread-safe.
#ifndef PATRICKSTAR_DISK_SWAP_DIR_H_
#define PATRICKSTAR_DISK_SWAP_DIR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

class SwapDir {
 public:
  // Claims `dir` for `rank` (>= 0): see the file comment. NotFound / FailedPrecondition /
  // PermissionDenied naming the directory when it is missing, not a directory or not writable;
  // FailedPrecondition naming the other pid when another live process holds the rank's lock.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SwapDir>> Claim(const std::string& dir,
                                                                      int rank);

  // Removes the swap file (if present) and the lock file, and releases the lock.
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& dir() const { return dir_; }
  int rank() const { return rank_; }
  // "<dir>/patrickstar-swap-rank<R>.bin": the file this rank's swap may create. It is registered
  // for removal on SIGINT/SIGTERM (see the file comment) for the claim's lifetime.
  const std::string& swap_path() const { return swap_path_; }
  const std::string& lock_path() const { return lock_path_; }
  // The stale files the claim removed.
  const std::vector<std::string>& removed_stale_files() const { return removed_stale_files_; }

 private:
  SwapDir() = default;

  std::string dir_;
  int rank_ = 0;
  std::string swap_path_;
  std::string lock_path_;
  int lock_fd_ = -1;
  std::vector<int> cleanup_handles_;
  std::vector<std::string> removed_stale_files_;
};

// Adds `path` to the process-wide list of files unlinked when SIGINT or SIGTERM kills the process
// under the handler described in the file comment (installed here on first use). Returns a handle
// for UnregisterFileForSignalCleanup, or -1 when the list (64 entries) is full or the path is too
// long (the file is then only removed at normal exit; a warning is logged).
int RegisterFileForSignalCleanup(const std::string& path);
// Removes the entry (a handle < 0 is ignored).
void UnregisterFileForSignalCleanup(int handle);
// Unlinks every file registered now (errno preserved). Async-signal-safe: for a signal handler
// that is about to let its signal kill the process (the trainer's second SIGINT).
void RemoveFilesRegisteredForSignalCleanup();

}  // namespace ps

#endif  // PATRICKSTAR_DISK_SWAP_DIR_H_
