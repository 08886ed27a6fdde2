// RunSubprocess: runs a program with a watchdog and captures its output, for tests that launch
// mpirun. Test-only; POSIX.
#ifndef PATRICKSTAR_COMM_TESTING_SUBPROCESS_H_
#define PATRICKSTAR_COMM_TESTING_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {

struct SubprocessResult {
  bool timed_out = false;  // the watchdog killed it
  int exit_code = -1;      // when it exited normally
  int term_signal = 0;     // when a signal ended it
  std::string output;      // stdout and stderr, interleaved
  absl::Duration elapsed;
};

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the program's path
  // Environment: this process's, minus `unset_env` (names or prefixes ending in '*'), plus
  // `set_env` ("NAME=value").
  std::vector<std::string> unset_env;
  std::vector<std::string> set_env;
  // After this long the whole process group is killed (SIGKILL) and timed_out is set.
  absl::Duration timeout = absl::Seconds(60);
};

// Runs the program in its own process group and waits for it (or the watchdog). Errors only for
// failures to start (fork, pipe); a program that cannot be executed exits with code 127.
absl::StatusOr<SubprocessResult> RunSubprocess(const SubprocessOptions& options);

// "exit code 3", "signal 9 (Killed)" or "killed by the watchdog after 60s", for messages.
std::string DescribeExit(const SubprocessResult& result);

// The mpirun to launch: $PS_MPIRUN if set, else the first executable `mpirun` in a PATH
// directory, resolved (mpirun derives its installation prefix from the directory it is run from,
// and refuses "/", which is what /bin/mpirun gives where /bin is a link to /usr/bin), else
// /usr/bin/mpirun.
std::string FindMpirun();

}  // namespace ps

#endif  // PATRICKSTAR_COMM_TESTING_SUBPROCESS_H_
