#include "base/testing/test_rng.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "glog/logging.h"

namespace ps {

uint64_t TestSeed() {
  const char* value = std::getenv(kTestSeedEnvVar);
  if (value == nullptr) return kDefaultTestSeed;
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(value, &seed)) {
    LOG(FATAL) << kTestSeedEnvVar << "='" << value
               << "' is not a decimal unsigned 64-bit integer; set it as e.g. --test_env="
               << kTestSeedEnvVar << "=12345, or unset it for the default seed "
               << kDefaultTestSeed;
  }
  return seed;
}

TestRng::TestRng(uint64_t stream, std::source_location location)
    : TestRng(TestSeed(), stream, location) {}

TestRng::TestRng(uint64_t test_seed, uint64_t stream, std::source_location location)
    : test_seed_(test_seed),
      stream_(stream),
      engine_seed_(DeriveSeed(test_seed, stream)),
      location_(location),
      engine_(engine_seed_),
      trace_(location.file_name(), static_cast<int>(location.line()), Describe()) {}

std::string TestRng::Describe() const {
  std::string replay = "bazel test ";
  const char* target = std::getenv("TEST_TARGET");  // set by `bazel test`
  absl::StrAppend(&replay, target != nullptr ? target : "<target>", " --test_env=", kTestSeedEnvVar,
                  "=", test_seed_);
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (test != nullptr) {
    absl::StrAppend(&replay, " --test_filter='", test->test_suite_name(), ".", test->name(), "'");
  }
  return absl::StrCat("TestRng stream ", stream_, " made at ", location_.file_name(), ":",
                      location_.line(), " with ", kTestSeedEnvVar, "=", test_seed_,
                      " (engine seed 0x", absl::Hex(engine_seed_), "); replay: ", replay);
}

}  // namespace ps
