// Runs a benchmark's measured work in a fork()ed child process, so that the child's peak resident
// set (VmHWM) is the work's own host peak and a run the OOM killer ends is reported, not fatal to
// the benchmark. The child fills a Result and sends its bytes back through a pipe; the parent
// waits for the child and returns what it read.
//
// Used by the benchmarks that measure a training run's host memory (disk_tier_benchmark,
// lora_benchmark).
#ifndef PATRICKSTAR_BENCHMARKS_INTERNAL_CHILD_RUN_H_
#define PATRICKSTAR_BENCHMARKS_INTERNAL_CHILD_RUN_H_

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <memory>
#include <type_traits>

#include "absl/functional/function_ref.h"

namespace ps {
namespace benchmarks_internal {

// Flushes std::cout and std::cerr, forks, and in the child value-initializes a Result on the
// heap, runs `body` on it, writes its bytes to the parent and _exit(0)s (no destructors, no atexit
// handlers, no stdio flush: write the child's output to std::cerr, or flush it in `body`). The
// parent returns the bytes read from the child.
//
// When the child sends fewer than sizeof(Result) bytes (it died or exited in `body`), returns a
// value-initialized Result whose `error` says so with the wait status ("the training process died
// (wait status 9: SIGKILL, likely the OOM killer)"); when the pipe cannot be made, one whose
// `error` is "pipe failed". A Result with an empty `error` is the child's own.
//
// REQUIRES: Result is trivially copyable and value-initializable, and has a member
// `char error[N]` (N > 0). `body` reports its own failures in the Result (e.g. in `error` and a
// flag of its own); it may end the child itself (prctl(PR_SET_PDEATHSIG), _exit).
// Thread safety: the child has only the calling thread; `body` must not wait for other threads
// or take locks they may have held at the fork.
template <typename Result>
Result RunInChild(absl::FunctionRef<void(Result&)> body) {
  static_assert(std::is_trivially_copyable_v<Result>, "Result's bytes go through a pipe");
  static_assert(std::is_same_v<std::remove_extent_t<decltype(Result::error)>, char> &&
                    std::extent_v<decltype(Result::error)> > 0,
                "Result needs a `char error[N]` member");
  Result result{};
  int fds[2];
  if (pipe(fds) != 0) {
    std::snprintf(result.error, sizeof(result.error), "pipe failed");
    return result;
  }
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto r = std::make_unique<Result>();
    body(*r);
    const char* p = reinterpret_cast<const char*>(r.get());
    for (size_t done = 0; done < sizeof(Result);) {
      const ssize_t n = write(fds[1], p + done, sizeof(Result) - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  char* p = reinterpret_cast<char*>(&result);
  size_t got = 0;
  if (pid > 0) {
    while (got < sizeof(Result)) {
      const ssize_t n = read(fds[0], p + got, sizeof(Result) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
  }
  close(fds[0]);
  int wstatus = 0;
  if (pid > 0) waitpid(pid, &wstatus, 0);
  if (got != sizeof(Result)) {
    result = Result{};
    std::snprintf(
        result.error, sizeof(result.error), "the training process died (wait status %d%s)", wstatus,
        WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL ? ": SIGKILL, likely the OOM killer"
                                                             : "");
  }
  return result;
}

}  // namespace benchmarks_internal
}  // namespace ps

#endif  // PATRICKSTAR_BENCHMARKS_INTERNAL_CHILD_RUN_H_
