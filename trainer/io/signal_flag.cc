#include "trainer/io/signal_flag.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "disk/swap_dir.h"

namespace ps {
namespace {

std::atomic<int> g_stop_signal{0};
// SIGINTs received since InstallStopSignalHandlers().
std::atomic<int> g_sigints{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the stop flag must be lock-free to be touched from a signal handler");

void WriteToStderr(const char* message) {
  // Only async-signal-safe calls here: strlen and write.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, message, ::strlen(message));
}

// The second SIGINT: the user wants the process gone now. The files registered for removal on a
// fatal signal (the disk tier's swap, lock and probe files: disk/swap_dir.h) are removed, SIGINT's
// default action is restored and the signal raised again: it is blocked while this handler runs,
// so the process dies of it as soon as the handler returns, with the usual status.
void KillOnSecondSigint() {
  WriteToStderr("\nSIGINT again: removing the swap files and exiting now\n");
  RemoveFilesRegisteredForSignalCleanup();
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ::sigaction(SIGINT, &default_action, nullptr);
  ::raise(SIGINT);
}

extern "C" void OnStopSignal(int signal) {
  const int saved_errno = errno;  // a handler must not change errno under the interrupted code
  if (signal == SIGINT && g_sigints.fetch_add(1) >= 1) {
    KillOnSecondSigint();
    errno = saved_errno;
    return;
  }
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signal);
  if (signal == SIGINT) {
    WriteToStderr(
        "\nSIGINT received: stopping after the current step (press Ctrl-C again to kill)\n");
  } else {
    WriteToStderr("\nSIGTERM received: stopping after the current step\n");
  }
  errno = saved_errno;
}

absl::Status Install(int signal) {
  struct sigaction action = {};
  action.sa_handler = &OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(signal, &action, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("sigaction(", signal, ") failed: ", ::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InstallStopSignalHandlers() {
  absl::Status status = Install(SIGTERM);
  if (!status.ok()) return status;
  g_sigints.store(0);
  return Install(SIGINT);
}

bool StopRequested() { return g_stop_signal.load(std::memory_order_relaxed) != 0; }

int StopSignal() { return g_stop_signal.load(std::memory_order_relaxed); }

void ClearStopRequest() { g_stop_signal.store(0, std::memory_order_relaxed); }

}  // namespace ps
