// Tests for optimizer/cpu_adam.h: the fused kernel against the scalar reference
// (optimizer/adam_math.h) for Adam and AdamW, f32/f16/bf16 gradients, loss scale and clipping on
// and off, lengths 0..10^5 with tails, and unaligned starts — on every Highway target this CPU
// supports (the TEST_P suites run once per target, selected with hwy::SetSupportedTargetsForTest
// by hwy::TestWithParamTarget). Also: results independent of the thread count, Inf/NaN counting,
// gradient statistics, parameter restore, and argument errors.
#include "optimizer/cpu_adam.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/adam_math.h"
#include "optimizer/grad_stats_math.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr float kSentinel = -12345.0f;
constexpr uint16_t kSentinel16 = 0xdeadu & 0x7bffu;

// Lengths: every one up to 70 (tails of every vector width), around the tile and block sizes, and
// large and odd ones up to 10^5.
std::vector<int64_t> Lengths() {
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int64_t n :
       {int64_t{127}, int64_t{128}, int64_t{129}, int64_t{1000}, kCpuAdamTileElems - 1,
        kCpuAdamTileElems, kCpuAdamTileElems + 1, 3 * kCpuAdamTileElems + 17,
        kCpuAdamBlockElems - 1, kCpuAdamBlockElems, kCpuAdamBlockElems + 5, int64_t{100000}}) {
    lengths.push_back(n);
  }
  return lengths;
}

uint16_t Narrow(DType dtype, float x) {
  return dtype == DType::kF16 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
}
float Widen(DType dtype, uint16_t x) {
  return dtype == DType::kF16 ? HalfBitsToFloat(x) : BFloat16BitsToFloat(x);
}

// One Adam problem: the arrays of one segment, each starting `offset` elements into its own
// buffer, which ends exactly after the segment (so ASan flags any read past the end); elements
// before the offset hold sentinels that must survive.
struct Problem {
  DType dtype = DType::kF32;
  int64_t n = 0;
  bool in_place = false;
  int64_t grad_off = 0, master_off = 0, m_off = 0, v_off = 0, param_off = 0;
  std::vector<float> grad32, param32;
  std::vector<uint16_t> grad16, param16;
  std::vector<float> master, m, v;

  const void* grad() const {
    return dtype == DType::kF32 ? static_cast<const void*>(grad32.data() + grad_off)
                                : static_cast<const void*>(grad16.data() + grad_off);
  }
  void* param() {
    if (in_place) return const_cast<void*>(grad());
    return dtype == DType::kF32 ? static_cast<void*>(param32.data() + param_off)
                                : static_cast<void*>(param16.data() + param_off);
  }
  float RawGrad(int64_t i) const {
    return dtype == DType::kF32 ? grad32[grad_off + i] : Widen(dtype, grad16[grad_off + i]);
  }
  void SetRawGrad(int64_t i, float g) {
    if (dtype == DType::kF32) {
      grad32[grad_off + i] = g;
    } else {
      grad16[grad_off + i] = Narrow(dtype, g);
    }
  }
  AdamSegment Segment(const AdamStepScalars& s) {
    return AdamSegment{
        s, dtype, grad(), param(), master.data() + master_off, m.data() + m_off, v.data() + v_off,
        n};
  }
};

Problem MakeProblem(DType dtype, int64_t n, float loss_scale, bool in_place, uint32_t seed) {
  TestRng rng(seed);
  std::normal_distribution<float> normal;
  Problem p;
  p.dtype = dtype;
  p.n = n;
  p.in_place = in_place;
  p.grad_off = seed % 4;
  p.master_off = (seed / 4) % 4;
  p.m_off = (seed / 16) % 4;
  p.v_off = (seed / 64) % 4;
  p.param_off = (seed / 3) % 4;
  if (dtype == DType::kF32) {
    p.grad32.assign(p.grad_off + n, kSentinel);
    p.param32.assign(p.param_off + n, kSentinel);
  } else {
    p.grad16.assign(p.grad_off + n, kSentinel16);
    p.param16.assign(p.param_off + n, kSentinel16);
  }
  p.master.assign(p.master_off + n, kSentinel);
  p.m.assign(p.m_off + n, kSentinel);
  p.v.assign(p.v_off + n, kSentinel);
  for (int64_t i = 0; i < n; ++i) {
    p.SetRawGrad(i, normal(rng) * loss_scale);
    // Every other master value is as small as one update, so that the update's own rounding,
    // not just the parameter's, is checked.
    p.master[p.master_off + i] = normal(rng) * (i % 2 ? 1.0f : 1e-3f);
    p.m[p.m_off + i] = 0.1f * normal(rng);
    p.v[p.v_off + i] = 0.01f * std::abs(normal(rng));
  }
  return p;
}

// Checks the kernel's output in `got` against the scalar reference applied to `before`, with
// tolerances from a first-order error analysis of each formula (kUlps units of f32 rounding of the
// magnitudes involved), and the param output against the kernel's own master exactly.
void ExpectMatchesReference(const Problem& before, Problem& got, const AdamStepScalars& s,
                            const std::string& label) {
  constexpr double kUlps = 8;
  constexpr double kEps = FLT_EPSILON;
  int failures = 0;
  for (int64_t i = 0; i < before.n && failures < 5; ++i) {
    const float raw = before.RawGrad(i);
    float p = before.master[before.master_off + i];
    float m = before.m[before.m_off + i];
    float v = before.v[before.v_off + i];
    const double p_old = p, m_old = m, v_old = v;
    AdamUpdate(s, raw, p, m, v);
    // Magnitudes the rounding errors scale with.
    const double g = std::abs(static_cast<double>(raw) / s.loss_scale * s.clip_coef);
    const double g2 = g + std::abs(s.l2 * p_old);
    const double m_scale = std::abs(s.beta1 * m_old) + s.one_minus_beta1 * g2;
    const double v_scale = s.beta2 * v_old + s.one_minus_beta2 * g2 * g2;
    const double denom = std::sqrt(static_cast<double>(v)) * s.inv_sqrt_bias_correction2 + s.eps;
    const double p_scale = std::abs(p_old) + s.step_size * m_scale / denom;
    const float got_master = got.master[got.master_off + i];
    const float got_m = got.m[got.m_off + i];
    const float got_v = got.v[got.v_off + i];
    const bool ok = std::abs(got_m - m) <= kUlps * kEps * m_scale + FLT_MIN &&
                    std::abs(got_v - v) <= kUlps * kEps * v_scale + FLT_MIN &&
                    std::abs(got_master - p) <= kUlps * kEps * p_scale + FLT_MIN;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << label << " element " << i << ": master " << got_master << " vs " << p
                    << ", m " << got_m << " vs " << m << ", v " << got_v << " vs " << v;
    }
    // The parameter written is the kernel's own new master value, rounded to the compute dtype.
    if (got.dtype == DType::kF32) {
      const float out = static_cast<const float*>(got.param())[i];
      if (std::memcmp(&out, &got_master, 4) != 0 && failures++ < 5) {
        ADD_FAILURE() << label << " element " << i << ": param " << out << " != master "
                      << got_master;
      }
    } else {
      const uint16_t out = static_cast<const uint16_t*>(got.param())[i];
      if (out != Narrow(got.dtype, got_master) && failures++ < 5) {
        ADD_FAILURE() << label << " element " << i << ": param 0x" << std::hex << out
                      << " != rounded master 0x" << Narrow(got.dtype, got_master);
      }
    }
  }
  // Nothing before the offsets was touched (reads/writes past the end are ASan's job).
  for (int64_t i = 0; i < got.master_off; ++i) EXPECT_EQ(got.master[i], kSentinel) << label;
  for (int64_t i = 0; i < got.m_off; ++i) EXPECT_EQ(got.m[i], kSentinel) << label;
  for (int64_t i = 0; i < got.v_off; ++i) EXPECT_EQ(got.v[i], kSentinel) << label;
  for (int64_t i = 0; i < got.param_off; ++i) {
    if (got.dtype == DType::kF32) {
      EXPECT_EQ(got.param32[i], kSentinel) << label;
    } else {
      EXPECT_EQ(got.param16[i], kSentinel16) << label;
    }
  }
}

std::unique_ptr<CpuAdam> MakeCpuAdam(int threads) {
  auto adam = CpuAdam::Create({.num_threads = threads});
  if (!adam.ok()) {
    ADD_FAILURE() << adam.status();
    return nullptr;
  }
  return *std::move(adam);
}

class CpuAdamTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(CpuAdamTest);

TEST_P(CpuAdamTest, DispatchesToTheTargetUnderTest) {
  EXPECT_STREQ(CpuAdamTargetName(), hwy::TargetName(GetParam()));
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  EXPECT_THAT(adam->name(), HasSubstr(hwy::TargetName(GetParam())));
}

TEST_P(CpuAdamTest, StepMatchesScalarReference) {
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  uint32_t seed = 1;
  for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (double loss_scale : {1.0, 1024.0}) {
        const double clip = loss_scale == 1.0 ? 1.0 : 0.75;
        const AdamStepScalars s =
            MakeAdamStepScalars(mode, 1e-3, 0.9, 0.999, 1e-8, 0.01, /*step=*/5, loss_scale, clip);
        for (int64_t n : Lengths()) {
          ++seed;
          const bool in_place = seed % 3 != 0;
          const Problem before =
              MakeProblem(dtype, n, static_cast<float>(loss_scale), in_place, seed);
          Problem got = before;
          const AdamSegment segment = got.Segment(s);
          ASSERT_OK_AND_ASSIGN(const AdamStepResult result, adam->Step({&segment, 1}));
          EXPECT_EQ(result.nonfinite_elems, 0);
          const std::string label = std::string(mode == AdamMode::kAdam ? "Adam" : "AdamW") + " " +
                                    std::string(DTypeName(dtype)) + " scale " +
                                    std::to_string(loss_scale) + " n " + std::to_string(n) +
                                    (in_place ? " in place" : "");
          ExpectMatchesReference(before, got, s, label);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// Several segments with different constants in one call (how the hybrid optimizer batches the
// tensors of a chunk by parameter group).
TEST_P(CpuAdamTest, SeveralSegmentsInOneCall) {
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  std::vector<Problem> before, got;
  std::vector<AdamStepScalars> scalars;
  std::vector<AdamSegment> segments;
  const int64_t lengths[] = {5, kCpuAdamBlockElems + 3, 0, 777, 2 * kCpuAdamBlockElems};
  for (int i = 0; i < 5; ++i) {
    before.push_back(MakeProblem(DType::kF16, lengths[i], 8.0f, true, 100 + i));
    scalars.push_back(MakeAdamStepScalars(i % 2 ? AdamMode::kAdamW : AdamMode::kAdam,
                                          1e-3 * (i + 1), 0.9, 0.95, 1e-6, 0.1 * i, 1 + i, 8.0));
  }
  got = before;
  for (int i = 0; i < 5; ++i) segments.push_back(got[i].Segment(scalars[i]));
  ASSERT_OK(adam->Step(segments));
  for (int i = 0; i < 5; ++i) {
    ExpectMatchesReference(before[i], got[i], scalars[i], "segment " + std::to_string(i));
  }
}

// The same inputs through pools of 1, 2, 3 and 5 threads give identical bits.
TEST_P(CpuAdamTest, ResultsDoNotDependOnThreadCount) {
  const AdamStepScalars s = MakeAdamStepScalars(AdamMode::kAdamW, 1e-3, 0.9, 0.999, 1e-8, 0.01, 7,
                                                /*loss_scale=*/64.0);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Problem input = MakeProblem(dtype, 5 * kCpuAdamBlockElems + 123, 64.0f, true, 77);
    std::vector<Problem> outputs;
    GradStats first_stats;
    for (int threads : {1, 2, 3, 5}) {
      auto adam = MakeCpuAdam(threads);
      ASSERT_NE(adam, nullptr);
      Problem p = input;
      const GradSegment grads{dtype, p.grad(), p.n};
      ASSERT_OK_AND_ASSIGN(const GradStats stats, adam->GradientStats({&grads, 1}));
      if (outputs.empty()) {
        first_stats = stats;
      } else {
        EXPECT_EQ(stats.sum_squares, first_stats.sum_squares) << threads << " threads";
      }
      const AdamSegment segment = p.Segment(s);
      ASSERT_OK(adam->Step({&segment, 1}));
      outputs.push_back(std::move(p));
    }
    for (size_t k = 1; k < outputs.size(); ++k) {
      EXPECT_EQ(outputs[k].master, outputs[0].master) << DTypeName(dtype) << " run " << k;
      EXPECT_EQ(outputs[k].m, outputs[0].m);
      EXPECT_EQ(outputs[k].v, outputs[0].v);
      EXPECT_EQ(outputs[k].grad16, outputs[0].grad16);
      EXPECT_EQ(outputs[k].grad32, outputs[0].grad32);
    }
  }
}

// Inf and NaN gradients anywhere (vector body, tile boundary, tail) are counted by Step, and
// by GradientStats, which also leaves them out of the sum of squares.
TEST_P(CpuAdamTest, CountsNonFiniteGradients) {
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t n = 2 * kCpuAdamBlockElems + 37;
    Problem p = MakeProblem(dtype, n, 1.0f, true, 5);
    double want_sum = 0;
    const std::vector<int64_t> bad = {0, 17, kCpuAdamTileElems - 1, kCpuAdamBlockElems, n - 1};
    for (size_t k = 0; k < bad.size(); ++k) p.SetRawGrad(bad[k], k % 2 ? nan : -inf);
    for (int64_t i = 0; i < n; ++i) {
      const double g = p.RawGrad(i);
      if (std::isfinite(g)) want_sum += g * g;
    }
    const GradSegment grads{dtype, p.grad(), n};
    ASSERT_OK_AND_ASSIGN(const GradStats stats, adam->GradientStats({&grads, 1}));
    EXPECT_EQ(stats.nonfinite_elems, static_cast<int64_t>(bad.size())) << DTypeName(dtype);
    EXPECT_FALSE(stats.finite());
    EXPECT_NEAR(stats.sum_squares, want_sum, 1e-6 * want_sum);

    const AdamSegment segment =
        p.Segment(MakeAdamStepScalars(AdamMode::kAdam, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1));
    ASSERT_OK_AND_ASSIGN(const AdamStepResult result, adam->Step({&segment, 1}));
    EXPECT_EQ(result.nonfinite_elems, static_cast<int64_t>(bad.size())) << DTypeName(dtype);
  }
}

TEST_P(CpuAdamTest, GradientStatsMatchDoubleSum) {
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  uint32_t seed = 1000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : Lengths()) {
      const Problem p = MakeProblem(dtype, n, 512.0f, false, ++seed);
      double want = 0;
      for (int64_t i = 0; i < n; ++i) want += static_cast<double>(p.RawGrad(i)) * p.RawGrad(i);
      const GradSegment grads{dtype, p.grad(), n};
      ASSERT_OK_AND_ASSIGN(const GradStats stats, adam->GradientStats({&grads, 1}));
      ASSERT_EQ(stats.nonfinite_elems, 0);
      ASSERT_NEAR(stats.sum_squares, want, 1e-6 * want) << DTypeName(dtype) << " n " << n;
    }
  }
}

// Finite f32 gradients whose squares overflow f32 still give the exact double sum.
TEST_P(CpuAdamTest, GradientStatsSurviveF32Overflow) {
  auto adam = MakeCpuAdam(1);
  ASSERT_NE(adam, nullptr);
  std::vector<float> g(3000, 1e30f);
  g[5] = 3e38f;
  double want = 0;
  for (float x : g) want += static_cast<double>(x) * x;
  const GradSegment grads{DType::kF32, g.data(), static_cast<int64_t>(g.size())};
  ASSERT_OK_AND_ASSIGN(const GradStats stats, adam->GradientStats({&grads, 1}));
  EXPECT_EQ(stats.nonfinite_elems, 0);
  EXPECT_NEAR(stats.sum_squares, want, 1e-9 * want);
  EXPECT_NEAR(stats.Norm(1.0), std::sqrt(want), 1e-9 * std::sqrt(want));
}

// GradientStats of one call in the order optimizer/grad_stats_math.h spells out (the order the
// CUDA kernel runs), for `shape`: per segment, blocks, tiles, the fast tile sum or the recount.
GradStats SharedOrderGradStats(const std::vector<Problem>& problems, CpuSumSquaresShape shape) {
  GradStats total;
  for (const Problem& p : problems) {
    for (int64_t begin = 0; begin < p.n; begin += kCpuAdamBlockElems) {
      const int64_t len = std::min(kCpuAdamBlockElems, p.n - begin);
      GradStats block;
      for (int64_t off = 0; off < len; off += kCpuAdamTileElems) {
        const int64_t t = std::min(kCpuAdamTileElems, len - off);
        const auto x = [&](int64_t i) { return p.RawGrad(begin + off + i); };
        const double sum = TileSumSquares(x, t, shape.lanes, shape.fused);
        if (std::isfinite(sum)) {
          block.sum_squares += sum;
        } else {
          AddTileSquaresSlowly(x, t, block.sum_squares, block.nonfinite_elems);
        }
      }
      total += block;
    }
  }
  return total;
}

// The CPU's statistics follow the shared order bit for bit on every target (so CudaAdam, which
// runs that order with the dispatched target's lanes, gives a chunk the same norm): tails of every
// length, block and tile boundaries, 16-bit gradients, several segments, Inf/NaN tiles and tiles
// whose f32 partial sums overflow.
TEST_P(CpuAdamTest, GradientStatsFollowTheSharedOrderBitForBit) {
  const CpuSumSquaresShape shape = CpuAdamSumSquaresShape();
  ASSERT_GE(shape.lanes, 1);
  auto adam = MakeCpuAdam(3);
  ASSERT_NE(adam, nullptr);
  uint32_t seed = 7000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<Problem> problems;
    for (int64_t n : Lengths()) problems.push_back(MakeProblem(dtype, n, 64.0f, false, ++seed));
    // A tile with Inf and NaN, and (f32) one whose squares overflow the f32 accumulators.
    Problem& bad = problems.back();
    bad.SetRawGrad(3, std::numeric_limits<float>::infinity());
    bad.SetRawGrad(kCpuAdamBlockElems + 1, std::numeric_limits<float>::quiet_NaN());
    if (dtype == DType::kF32) {
      for (int64_t i = 0; i < 40; ++i) bad.SetRawGrad(5 * kCpuAdamTileElems + i, 3e37f);
    }
    for (size_t first = 0; first < problems.size(); first += 20) {
      const size_t count = std::min<size_t>(20, problems.size() - first);
      const std::vector<Problem> batch(problems.begin() + first, problems.begin() + first + count);
      std::vector<GradSegment> segments;
      for (const Problem& p : batch) segments.push_back({dtype, p.grad(), p.n});
      ASSERT_OK_AND_ASSIGN(const GradStats got, adam->GradientStats(segments));
      const GradStats want = SharedOrderGradStats(batch, shape);
      EXPECT_EQ(got.nonfinite_elems, want.nonfinite_elems) << DTypeName(dtype);
      EXPECT_EQ(std::memcmp(&got.sum_squares, &want.sum_squares, sizeof(double)), 0)
          << DTypeName(dtype) << " segments from " << first << ": " << got.sum_squares << " vs "
          << want.sum_squares;
    }
  }
}

// On targets with native FMA (AVX2, AVX-512) the step is AdamUpdate bit for bit, vectors and
// scalar tail alike: the explicit FusedMulAdds of adam_math.h are the kernel's MulAdds. CudaAdam
// runs the same AdamUpdate, so a chunk steps to the same bits on either device.
TEST_P(CpuAdamTest, StepIsTheScalarReferenceBitForBitWithNativeFma) {
  if (!CpuAdamSumSquaresShape().fused) {
    GTEST_SKIP() << hwy::TargetName(GetParam()) << " has no native FMA: checked within ULPs above";
  }
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  uint32_t seed = 9000;
  for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      const AdamStepScalars s =
          MakeAdamStepScalars(mode, 1e-3, 0.9, 0.999, 1e-8, 0.01, /*step=*/7, 256.0, 0.625);
      for (int64_t n : Lengths()) {
        ++seed;
        const Problem before = MakeProblem(dtype, n, 256.0f, seed % 2 == 0, seed);
        Problem got = before;
        const AdamSegment segment = got.Segment(s);
        ASSERT_OK(adam->Step({&segment, 1}));
        int failures = 0;
        for (int64_t i = 0; i < n && failures < 5; ++i) {
          float p = before.master[before.master_off + i];
          float m = before.m[before.m_off + i];
          float v = before.v[before.v_off + i];
          AdamUpdate(s, before.RawGrad(i), p, m, v);
          const float got_p = got.master[got.master_off + i];
          const float got_m = got.m[got.m_off + i];
          const float got_v = got.v[got.v_off + i];
          if (std::memcmp(&got_p, &p, 4) != 0 || std::memcmp(&got_m, &m, 4) != 0 ||
              std::memcmp(&got_v, &v, 4) != 0) {
            ++failures;
            ADD_FAILURE() << DTypeName(dtype) << " n " << n << " element " << i << ": master "
                          << got_p << " vs " << p << ", m " << got_m << " vs " << m << ", v "
                          << got_v << " vs " << v;
          }
        }
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(CpuAdamTest, RestoreParamsRoundsMasterExactly) {
  auto adam = MakeCpuAdam(2);
  ASSERT_NE(adam, nullptr);
  uint32_t seed = 2000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : Lengths()) {
      Problem p = MakeProblem(dtype, n, 1.0f, false, ++seed);
      const ParamRestoreSegment segment{p.master.data() + p.master_off, dtype, p.param(), n};
      ASSERT_OK(adam->RestoreParams({&segment, 1}));
      for (int64_t i = 0; i < n; ++i) {
        const float master = p.master[p.master_off + i];
        if (dtype == DType::kF32) {
          ASSERT_EQ(p.param32[p.param_off + i], master);
        } else {
          ASSERT_EQ(p.param16[p.param_off + i], Narrow(dtype, master)) << i;
        }
      }
      for (int64_t i = 0; i < p.param_off; ++i) {
        if (dtype == DType::kF32) {
          ASSERT_EQ(p.param32[i], kSentinel);
        } else {
          ASSERT_EQ(p.param16[i], kSentinel16);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Errors. These return before any dispatch, so they need not run per target.

TEST(CpuAdamErrorTest, RejectsNegativeThreadCount) {
  EXPECT_THAT(CpuAdam::Create({.num_threads = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_threads")));
}

TEST(CpuAdamErrorTest, DefaultsToAtLeastOneThread) {
  ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create());
  EXPECT_GE(adam->num_threads(), 1);
}

TEST(CpuAdamErrorTest, RejectsBadSegmentsAndWritesNothing) {
  ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create({.num_threads = 1}));
  alignas(8) float buf[16] = {};
  alignas(8) uint16_t grad[8] = {};
  AdamSegment good{MakeAdamStepScalars(AdamMode::kAdam, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
                   DType::kF16,
                   grad,
                   grad,
                   buf,
                   buf + 4,
                   buf + 8,
                   4};
  AdamSegment bad = good;
  bad.n_elems = -1;
  EXPECT_THAT(adam->Step({&bad, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "n_elems"));
  bad = good;
  bad.exp_avg = nullptr;
  EXPECT_THAT(adam->Step({&bad, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "exp_avg"));
  bad = good;
  bad.master = reinterpret_cast<float*>(reinterpret_cast<char*>(buf) + 2);
  EXPECT_THAT(adam->Step({&bad, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "aligned"));
  bad = good;
  bad.scalars.loss_scale = 0.0f;
  EXPECT_THAT(adam->Step({&bad, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "loss_scale"));
  bad = good;
  bad.scalars.step_size = std::numeric_limits<float>::infinity();
  EXPECT_THAT(adam->Step({&bad, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "step_size"));
  bad = good;
  bad.dtype = static_cast<DType>(9);
  EXPECT_THAT(adam->Step({&bad, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
  // A bad segment after a good one: nothing is written at all.
  buf[0] = 7.0f;
  grad[0] = 0x3c00;  // 1.0
  bad = good;
  bad.param = nullptr;
  const AdamSegment both[] = {good, bad};
  EXPECT_THAT(adam->Step(both), StatusIs(absl::StatusCode::kInvalidArgument, "param"));
  EXPECT_EQ(buf[0], 7.0f);

  const GradSegment bad_grads{DType::kF16, nullptr, 3};
  EXPECT_THAT(adam->GradientStats({&bad_grads, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "grad"));
  const ParamRestoreSegment bad_restore{buf, DType::kBF16, reinterpret_cast<char*>(grad) + 1, 2};
  EXPECT_THAT(adam->RestoreParams({&bad_restore, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "aligned"));
  // Empty segments need no pointers.
  const AdamSegment empty{};
  EXPECT_OK(adam->Step({&empty, 1}));
}

}  // namespace
}  // namespace ps
