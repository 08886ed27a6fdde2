// A stop flag set by SIGINT and SIGTERM, so the trainer can finish the current step, write a
// checkpoint and exit cleanly when a user presses Ctrl-C or a scheduler (Slurm, Kubernetes) asks it
// to stop.
//
//   RETURN_IF_ERROR(InstallStopSignalHandlers());
//   for (step = ...; step < steps && !StopRequested(); ++step) { ... }
//   if (StopRequested()) LOG(INFO) << "stopping on " << strsignal(StopSignal());
//
// Semantics:
//   - The first SIGINT or SIGTERM sets the flag (StopSignal() then returns that signal) and writes
//     one line to stderr (with write(2): async-signal-safe).
//   - A second SIGINT kills a run that hangs instead of stopping, after removing the files
//     registered for removal on a fatal signal (disk/swap_dir.h: the disk tier's swap, lock and
//     probe files): the handler unlinks them, restores the default action and raises SIGINT
//     again, so the process dies of SIGINT as it would without the handler.
//   - SIGTERM stays handled; a scheduler that wants the process dead sends SIGKILL after its grace
//     period.
//   - SA_RESTART: system calls interrupted by the signal are restarted, so no caller sees EINTR
//     because of it.
// The flag and the SIGINT count are lock-free std::atomic<int>s, written only with
// async-signal-safe operations.
//
// Thread safety: all functions are thread-safe. The handlers are process-wide state (there is one
// signal disposition per process); InstallStopSignalHandlers() may be called again to re-arm
// SIGINT after it fired (the next SIGINT is a first one again).
#ifndef PATRICKSTAR_TRAINER_IO_SIGNAL_FLAG_H_
#define PATRICKSTAR_TRAINER_IO_SIGNAL_FLAG_H_

#include "absl/status/status.h"

namespace ps {

// Installs the SIGINT and SIGTERM handlers. Internal on failure of sigaction (never expected).
[[nodiscard]] absl::Status InstallStopSignalHandlers();

// True once SIGINT or SIGTERM arrived after InstallStopSignalHandlers().
bool StopRequested();

// The first stop signal received (SIGINT or SIGTERM), or 0.
int StopSignal();

// Clears the flag (tests; or a program that handled one stop request and wants the next).
void ClearStopRequest();

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_IO_SIGNAL_FLAG_H_
