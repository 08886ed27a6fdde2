#include "trainer/testing/train_process.h"

#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "trainer/testing/test_files.h"

namespace ps::trainer_testing {

SubprocessResult RunProgram(std::vector<std::string> argv, absl::Duration timeout) {
  SubprocessOptions options;
  options.argv = std::move(argv);
  options.unset_env = {
      "XML_OUTPUT_FILE",           "GTEST_OUTPUT",       "TEST_PREMATURE_EXIT_FILE",
      "TEST_WARNINGS_OUTPUT_FILE", "GTEST_SHARD_*",      "TEST_SHARD_*",
      "TEST_TOTAL_SHARDS",         "GTEST_TOTAL_SHARDS", "TMPDIR"};
  options.set_env = {"TMPDIR=/tmp"};
  if (const char* asan = std::getenv("ASAN_OPTIONS"); asan != nullptr) {
    options.unset_env.push_back("ASAN_OPTIONS");
    options.set_env.push_back(absl::StrCat("ASAN_OPTIONS=", asan, ":detect_leaks=0"));
  }
  options.timeout = timeout;
  absl::StatusOr<SubprocessResult> result = RunSubprocess(options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : SubprocessResult{};
}

SubprocessResult RunSingle(std::vector<std::string> flags, absl::Duration timeout) {
  flags.insert(flags.begin(), Runfile("trainer/train"));
  flags.push_back("--comm=local");
  return RunProgram(std::move(flags), timeout);
}

std::vector<nlohmann::json> ReadMetrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

int64_t HeldModelBytes(const std::string& output) {
  const size_t at = output.find("after the last step:");
  if (at == std::string::npos) return -1;
  const size_t open = output.find('(', at);
  const size_t space = output.find(" bytes)", open);
  int64_t bytes = -1;
  if (open == std::string::npos || space == std::string::npos ||
      !absl::SimpleAtoi(output.substr(open + 1, space - open - 1), &bytes)) {
    return -1;
  }
  return bytes;
}

}  // namespace ps::trainer_testing
