#include "trainer/io/signal_flag.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the stop flag must be lock-free to be touched from a signal handler");

void WriteToStderr(const char* message) {
  // Only async-signal-safe calls here: strlen and write.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, message, ::strlen(message));
}

extern "C" void OnStopSignal(int signal) {
  const int saved_errno = errno;  // a handler must not change errno under the interrupted code
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

absl::Status Install(int signal, int extra_flags) {
  struct sigaction action = {};
  action.sa_handler = &OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | extra_flags;
  if (::sigaction(signal, &action, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("sigaction(", signal, ") failed: ", ::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InstallStopSignalHandlers() {
  absl::Status status = Install(SIGTERM, 0);
  if (!status.ok()) return status;
  return Install(SIGINT, SA_RESETHAND);
}

bool StopRequested() { return g_stop_signal.load(std::memory_order_relaxed) != 0; }

int StopSignal() { return g_stop_signal.load(std::memory_order_relaxed); }

void ClearStopRequest() { g_stop_signal.store(0, std::memory_order_relaxed); }

}  // namespace ps
