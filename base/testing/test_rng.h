// TestRng: the random-number generator for tests. Its sequence depends only on a per-call-site
// stream number and the process's test seed, so a failure on "random and awkward inputs" replays
// exactly, and other inputs are one flag away:
//
//   TEST(Gelu, MatchesReference) {
//     TestRng gen(1);  // stream 1 of this test file
//     const float x = absl::Uniform<float>(gen, -4.0f, 4.0f);
//     ...
//   }
//
//   bazel test //model/kernels:gelu_test --test_env=PS_TEST_SEED=7   # explore another seed
//
// Why not absl::BitGen(std::seed_seq{...}): Abseil salts every seed sequence with a per-process
// value (absl::random_internal::MakeSaltedSeedSeq), so such a generator differs on every run; a
// failure could not be replayed, and Bazel's cached results hid the flakes.
//
// The engine is std::mt19937_64, whose output for a given 64-bit seed is specified bit for bit by
// the C++ standard; its seed is DeriveSeed(test seed, stream) (base/splitmix64.h). TestRng is a
// uniform random bit generator, so absl::Uniform, absl::Bernoulli, absl::Gaussian and
// std::shuffle work with it. Abseil's distributions are deterministic given the generator's
// output; std::*_distribution are too on one standard library, but libstdc++ and libc++ differ, so
// prefer Abseil's where inputs should match across toolchains.
//
// The test seed is PS_TEST_SEED from the environment (a decimal unsigned 64-bit integer), or
// kDefaultTestSeed when unset. A malformed PS_TEST_SEED ends the process with a message: a typo
// must not silently run the default seed.
//
// Every failure while a TestRng is alive names its seed: the constructor pushes a gtest trace
// ("TestRng stream 1 from file:line, PS_TEST_SEED=7 ...: replay with ...") that gtest prints with
// each failed assertion on the constructing thread, and the destructor pops it.
//
// Thread safety: a TestRng is a value that one thread uses at a time. Because of the trace it must
// be destroyed on the thread that created it, in reverse order of creation relative to other gtest
// traces (SCOPED_TRACE) — which a local variable or a test-fixture member always is. It is neither
// copyable nor movable: pass it by reference.
#ifndef PATRICKSTAR_BASE_TESTING_TEST_RNG_H_
#define PATRICKSTAR_BASE_TESTING_TEST_RNG_H_

#include <cstdint>
#include <limits>
#include <random>
#include <source_location>
#include <string>

#include "gtest/gtest.h"

namespace ps {

// The test seed when PS_TEST_SEED is unset.
inline constexpr uint64_t kDefaultTestSeed = 0;

// The name of the environment variable that overrides the test seed.
inline constexpr char kTestSeedEnvVar[] = "PS_TEST_SEED";

// The test seed of this process: PS_TEST_SEED if set, else kDefaultTestSeed. Reads the environment
// on every call (a test may set it); dies with a message naming the variable if it is malformed.
uint64_t TestSeed();

class TestRng {
 public:
  using result_type = uint64_t;

  // A generator for stream `stream` of the test seed (TestSeed()). Distinct streams give unrelated
  // sequences; the same (test seed, stream) gives the same sequence in every process, on every run.
  // `location` is where the generator was made, for the failure trace.
  explicit TestRng(uint64_t stream,
                   std::source_location location = std::source_location::current());

  TestRng(const TestRng&) = delete;
  TestRng& operator=(const TestRng&) = delete;

  static constexpr result_type min() { return std::numeric_limits<result_type>::min(); }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() { return engine_(); }

  uint64_t test_seed() const { return test_seed_; }
  uint64_t stream() const { return stream_; }
  // The std::mt19937_64 seed: DeriveSeed(test_seed(), stream()).
  uint64_t engine_seed() const { return engine_seed_; }

  // What the failure trace says: the stream, where it was made, the seeds, and the command line
  // that replays it.
  std::string Describe() const;

 private:
  TestRng(uint64_t test_seed, uint64_t stream, std::source_location location);

  uint64_t test_seed_;
  uint64_t stream_;
  uint64_t engine_seed_;
  std::source_location location_;
  std::mt19937_64 engine_;
  ::testing::ScopedTrace trace_;  // last: constructed from the fields above
};

}  // namespace ps

#endif  // PATRICKSTAR_BASE_TESTING_TEST_RNG_H_
