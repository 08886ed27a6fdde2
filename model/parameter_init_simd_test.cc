// FillNormal's vectorized path against the scalar implementation it replaced (kept below as the
// reference, verbatim but for its name): bit-identical values on every SIMD target this CPU has
// (PS_SIMD_MAX caps: none, avx2, sse4, scalar), for awkward ranges (odd starts, state-block edges,
// far starts), several std, and the pairs the vector path must hand back to libm (std = 0).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "base/simd_targets.h"
#include "base/splitmix64.h"
#include "gtest/gtest.h"
#include "model/parameter_init.h"
#include "model/parameter_init_simd.h"

namespace ps {
namespace {

// The scalar FillNormal before the vectorized one (commit 050e37f), the reference.
void ReferenceFillNormal(uint64_t seed, uint64_t stream, double std, int64_t first_elem,
                         absl::Span<float> out) {
  std::mt19937_64 gen(SplitMix64(seed ^ SplitMix64(stream).Next()).Next());
  gen.discard(static_cast<unsigned long long>(first_elem / 2) * 2);
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  int64_t e = first_elem;
  size_t i = 0;
  while (i < out.size()) {
    const double u1 = static_cast<double>((gen() >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(gen() >> 11) * 0x1.0p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    if (e % 2 == 0) {
      out[i++] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
      ++e;
      if (i == out.size()) break;
    }
    out[i++] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
    ++e;
  }
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

std::vector<float> Fill(bool reference, uint64_t seed, uint64_t stream, double std,
                        int64_t first, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -7.0f);
  if (reference) {
    ReferenceFillNormal(seed, stream, std, first, absl::MakeSpan(out));
  } else {
    FillNormal(seed, stream, std, first, absl::MakeSpan(out));
  }
  return out;
}

class SimdCapTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(ApplySimdMax(GetParam()).ok()); }
  // Back to the process's own cap (CI runs the suite again under PS_SIMD_MAX=avx2).
  void TearDown() override {
    const char* env = std::getenv(kSimdMaxEnvVar);
    ASSERT_TRUE(ApplySimdMax(env != nullptr ? env : "").ok());
  }
};

TEST_P(SimdCapTest, TwistAndTemperAreTheStandardEngine) {
  using namespace parameter_init_internal;  // NOLINT
  for (const uint64_t seed : {uint64_t{0}, uint64_t{5489}, ~uint64_t{0}, uint64_t{0x9E3779B97F4A7C15}}) {
    std::mt19937_64 engine(seed);
    uint64_t mt[2 * (kMtPairs + kMtPadPairs)] = {};
    mt[0] = seed;
    for (int i = 1; i < kMtStateWords; ++i) {
      mt[i] = 6364136223846793005ULL * (mt[i - 1] ^ (mt[i - 1] >> 62)) + static_cast<uint64_t>(i);
    }
    for (int block = 0; block < 7; ++block) {
      MtTwist(mt);
      for (int i = 0; i < kMtStateWords; ++i) {
        ASSERT_EQ(MtTemper(mt[i]), engine()) << "seed " << seed << " block " << block << " i " << i;
      }
    }
  }
}

TEST_P(SimdCapTest, AwkwardRangesAreBitIdenticalToTheScalarReference) {
  const int64_t n_whole = 5 * 312 + 17;
  for (const double std : {0.02, 0.02 / std::sqrt(2.0 * 48), 1.0, 3.5e-3, 0.0}) {
    for (const auto& [seed, stream] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, 0}, {1234, 5}, {42, 1u << 20}, {~uint64_t{0}, 77}}) {
      SCOPED_TRACE(testing::Message() << "std " << std << " seed " << seed << " stream " << stream);
      ASSERT_EQ(Bits(Fill(false, seed, stream, std, 0, n_whole)),
                Bits(Fill(true, seed, stream, std, 0, n_whole)));
      for (const auto& [first, n] : std::vector<std::pair<int64_t, int64_t>>{
               {0, 1}, {1, 1}, {1, 2}, {3, 6}, {155, 3}, {310, 4}, {311, 1}, {311, 2},
               {312, 1}, {313, 311}, {623, 626}, {624, 624}, {1001, 1}, {3 * 312 - 1, 313}}) {
        SCOPED_TRACE(testing::Message() << "first " << first << " n " << n);
        ASSERT_EQ(Bits(Fill(false, seed, stream, std, first, n)),
                  Bits(Fill(true, seed, stream, std, first, n)));
      }
    }
  }
}

TEST_P(SimdCapTest, FarStartsAreBitIdentical) {
  for (const int64_t first : {int64_t{1} << 20, (int64_t{1} << 20) + 1, int64_t{3000017}}) {
    SCOPED_TRACE(testing::Message() << "first " << first);
    ASSERT_EQ(Bits(Fill(false, 11, 3, 0.02, first, 777)), Bits(Fill(true, 11, 3, 0.02, first, 777)));
  }
}

// Many streams: about 2^22 values, enough that pairs near a float's rounding midpoint (the ones
// the vector path hands back to libm, ~1 in 10^5) occur.
TEST_P(SimdCapTest, ManyValuesAreBitIdentical) {
  for (uint64_t stream = 0; stream < 8; ++stream) {
    SCOPED_TRACE(testing::Message() << "stream " << stream);
    const int64_t n = (1 << 19) + static_cast<int64_t>(stream) * 37;
    ASSERT_EQ(Bits(Fill(false, 2024, stream, 0.02, 0, n)), Bits(Fill(true, 2024, stream, 0.02, 0, n)));
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdCapTest, testing::Values("", "avx2", "sse4", "scalar"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? std::string("uncapped") : info.param;
                         });

}  // namespace
}  // namespace ps
