// optimizer/grad_accumulate_math.h against the CPU path it must reproduce, CpuAdam's
// AccumulateGradients (optimizer/cpu_adam.h): for f32, f16 and bf16 gradients of awkward lengths
// (tails around vector widths, tiles and blocks; unaligned starts), random values and the special
// ones (Inf, NaN, subnormals, overflowing sums, signed zeros), the helper applied element by
// element gives the accumulator CpuAdam gives, bit for bit (NaN as NaN). The CUDA kernel calls
// this helper, so this is the CPU coverage of its arithmetic.
#include "optimizer/grad_accumulate_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/cpu_adam.h"

namespace ps {
namespace {

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// A value drawn from a mix of scales and the special values accumulation must carry through.
float Draw(TestRng& rng) {
  std::uniform_int_distribution<int> pick(0, 15);
  std::normal_distribution<float> normal;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  switch (pick(rng)) {
    case 0:
      return kInf;
    case 1:
      return -kInf;
    case 2:
      return std::numeric_limits<float>::quiet_NaN();
    case 3:
      return std::numeric_limits<float>::denorm_min() * static_cast<float>(pick(rng) + 1);
    case 4:
      return -0.0f;
    case 5:
      return 0.0f;
    case 6:
      return 3e38f * (normal(rng) > 0 ? 1.0f : -1.0f);  // sums overflow to Inf in f32
    case 7:
      return 6e4f * normal(rng);  // near f16's largest finite value
    case 8:
      return 1e-6f * normal(rng);  // f16 subnormals
    default:
      return normal(rng) * std::ldexp(1.0f, pick(rng) - 8);
  }
}

std::vector<int64_t> Lengths() {
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 40; ++n) lengths.push_back(n);
  for (int64_t n : {int64_t{1023}, int64_t{1024}, int64_t{1025}, int64_t{3 * 1024 + 17},
                    kCpuAdamBlockElems - 1, kCpuAdamBlockElems + 5, int64_t{100003}}) {
    lengths.push_back(n);
  }
  return lengths;
}

TEST(GradAccumulateMathTest, MatchesCpuAdamAccumulateGradientsBitForBit) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuAdam> cpu, CpuAdam::Create({.num_threads = 2}));
  TestRng rng(41);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : Lengths()) {
      for (int64_t off : {0, 1, 3}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " off=" << off);
        std::vector<float> grad32(n + off);
        std::vector<uint16_t> grad16(n + off);
        std::vector<float> acc(n + off), expected(n);
        for (int64_t i = 0; i < n; ++i) {
          const float g = Draw(rng);
          grad32[off + i] = g;
          grad16[off + i] = dtype == DType::kF16 ? FloatToHalfBits(g) : FloatToBFloat16Bits(g);
          acc[off + i] = Draw(rng);
          switch (dtype) {
            case DType::kF32:
              expected[i] = AccumulateGradF32(acc[off + i], grad32[off + i]);
              break;
            case DType::kF16:
              expected[i] = AccumulateGradF16(acc[off + i], grad16[off + i]);
              break;
            case DType::kBF16:
              expected[i] = AccumulateGradBF16(acc[off + i], grad16[off + i]);
              break;
          }
        }
        const void* grad = dtype == DType::kF32 ? static_cast<const void*>(grad32.data() + off)
                                                : static_cast<const void*>(grad16.data() + off);
        const GradAccumulateSegment segment{dtype, grad, acc.data() + off, n};
        ASSERT_OK(cpu->AccumulateGradients({&segment, 1}));
        int failures = 0;
        for (int64_t i = 0; i < n && failures < 5; ++i) {
          const float got = acc[off + i];
          const bool same =
              std::isnan(expected[i]) ? std::isnan(got) : Bits(got) == Bits(expected[i]);
          if (!same) {
            ++failures;
            ADD_FAILURE() << "element " << i << ": CpuAdam " << got << " helper " << expected[i];
          }
        }
      }
    }
  }
}

// The helper is a plain f32 addition of the exactly widened gradient: spot values whose result is
// known without running either implementation.
TEST(GradAccumulateMathTest, KnownValues) {
  EXPECT_EQ(AccumulateGradF32(1.0f, 2.0f), 3.0f);
  EXPECT_EQ(AccumulateGradF16(0.5f, 0x3c00u), 1.5f);                   // f16 1.0
  EXPECT_EQ(AccumulateGradBF16(0.5f, 0xc000u), -1.5f);                 // bf16 -2.0
  EXPECT_EQ(AccumulateGradF16(0.0f, 0x0001u), std::ldexp(1.0f, -24));  // smallest f16 subnormal
  // Round to nearest even of the f32 sum: 1 + 2^-24 is a tie and rounds down to 1.
  EXPECT_EQ(AccumulateGradF32(1.0f, std::ldexp(1.0f, -24)), 1.0f);
  EXPECT_EQ(AccumulateGradF32(1.0f, std::ldexp(1.0f, -23)), 1.0f + std::ldexp(1.0f, -23));
  EXPECT_TRUE(std::isinf(AccumulateGradF32(3e38f, 3e38f)));
  EXPECT_TRUE(std::isinf(AccumulateGradF16(0.0f, 0x7c00u)));   // f16 +Inf
  EXPECT_TRUE(std::isnan(AccumulateGradBF16(1.0f, 0x7fc1u)));  // bf16 NaN
  EXPECT_TRUE(std::isnan(AccumulateGradF16(1.0f, 0x7e00u)));   // f16 NaN
}

}  // namespace
}  // namespace ps
