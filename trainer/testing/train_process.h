// Launching the train binary from the trainer's end-to-end tests, and reading what it wrote.
// Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_TRAIN_PROCESS_H_
#define PATRICKSTAR_TRAINER_TESTING_TRAIN_PROCESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "comm/testing/subprocess.h"
#include "nlohmann/json.hpp"

namespace ps::trainer_testing {

// Runs `argv` (argv[0] a program path: the train binary, mpirun, a shell) under a watchdog of
// `timeout`, without the test runner's output, sharding and TMPDIR variables (TMPDIR=/tmp);
// under AddressSanitizer the children do not report leaks (mpirun's own are not ours). A failure
// to start is a test failure and an empty result.
SubprocessResult RunProgram(std::vector<std::string> argv, absl::Duration timeout);

// The train binary with `flags` and --comm=local: one process, a world of one.
SubprocessResult RunSingle(std::vector<std::string> flags, absl::Duration timeout);

// The JSON objects of a --metrics_out file, one per non-empty line.
std::vector<nlohmann::json> ReadMetrics(const std::string& path);

// N from the run summary's "model data held after the last step: X (N bytes)"; -1 if absent.
int64_t HeldModelBytes(const std::string& output);

}  // namespace ps::trainer_testing

#endif  // PATRICKSTAR_TRAINER_TESTING_TRAIN_PROCESS_H_
