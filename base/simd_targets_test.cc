#include "base/simd_targets.h"

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kAvx512 = HWY_AVX3 | HWY_AVX3_DL;

// Restores the cap this process started with (CI runs the suite under PS_SIMD_MAX=avx2 too).
class SimdTargetsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const char* env = std::getenv(kSimdMaxEnvVar);
    ASSERT_OK(ApplySimdMax(env == nullptr ? "" : env));
  }
};

TEST_F(SimdTargetsTest, EachCapDisablesTheTargetsAboveIt) {
  EXPECT_THAT(SimdTargetsDisabledBy(""), IsOkAndHolds(0));
  EXPECT_THAT(SimdTargetsDisabledBy("avx512"), IsOkAndHolds(0));
  EXPECT_THAT(SimdTargetsDisabledBy("AVX2"), IsOkAndHolds(kAvx512));
  EXPECT_THAT(SimdTargetsDisabledBy("sse4"), IsOkAndHolds(kAvx512 | HWY_AVX2));
  EXPECT_THAT(SimdTargetsDisabledBy("ssse3"), IsOkAndHolds(kAvx512 | HWY_AVX2 | HWY_SSE4));
  EXPECT_THAT(SimdTargetsDisabledBy("scalar"),
              IsOkAndHolds(kAvx512 | HWY_AVX2 | HWY_SSE4 | HWY_SSSE3));
}

TEST_F(SimdTargetsTest, AnUnknownCapIsRefusedNamingTheVariable) {
  for (const char* bad : {"avx", "avx-512", "neon", " avx2"}) {
    EXPECT_THAT(SimdTargetsDisabledBy(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("PS_SIMD_MAX"), HasSubstr(bad),
                               HasSubstr("avx512, avx2, sse4, ssse3 or scalar"))));
  }
  const int64_t before = hwy::SupportedTargets();
  EXPECT_THAT(ApplySimdMax("avx3"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(hwy::SupportedTargets(), before) << "a refused cap must change nothing";
}

// The dispatch itself: under each cap no target above it is supported, and the description names
// the chosen target and the cap.
TEST_F(SimdTargetsTest, TheCapReachesHighwaysDispatch) {
  ASSERT_OK(ApplySimdMax("avx2"));
  EXPECT_EQ(hwy::SupportedTargets() & kAvx512, 0);
  EXPECT_THAT(DescribeSimdDispatch(), HasSubstr("PS_SIMD_MAX=avx2"));
  ASSERT_OK(ApplySimdMax("sse4"));
  EXPECT_EQ(hwy::SupportedTargets() & (kAvx512 | HWY_AVX2), 0);
  ASSERT_OK(ApplySimdMax("scalar"));
  EXPECT_EQ(hwy::SupportedTargets() & (kAvx512 | HWY_AVX2 | HWY_SSE4 | HWY_SSSE3), 0);
  EXPECT_THAT(DescribeSimdDispatch(),
              AllOf(::testing::AnyOf(HasSubstr("EMU128"), HasSubstr("SCALAR")),
                    HasSubstr("PS_SIMD_MAX=scalar")));
  // Lifting the cap gives back every target the CPU has.
  ASSERT_OK(ApplySimdMax(""));
  EXPECT_THAT(DescribeSimdDispatch(), HasSubstr("the best target this CPU has"));
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_NE(hwy::SupportedTargets() & HWY_AVX2, 0);
  }
}

}  // namespace
}  // namespace ps
