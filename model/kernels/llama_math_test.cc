// Direct tests of the PS_HOST_DEVICE math of the Llama-family kernels (rmsnorm_math.h,
// rope_math.h, swiglu_math.h) at edge values, and of their Highway loops
// (internal/llama_simd.h) on every SIMD target this CPU supports (hwy::TestWithParamTarget runs
// each TEST_P once per target) against scalar references built from the same math, for every
// length 0..70 (all tail sizes of every vector width) and a long one, at unaligned starts, with
// guard elements after the end that must stay untouched.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/random/distributions.h"
#include "base/testing/test_rng.h"
#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"
#include "model/kernels/internal/llama_simd.h"
#include "model/kernels/rmsnorm_math.h"
#include "model/kernels/rope_math.h"
#include "model/kernels/swiglu_math.h"

namespace ps {
namespace {

TEST(SwiGluMathTest, SiluAtEdgeValues) {
  EXPECT_EQ(Silu(0.0f), 0.0f);
  EXPECT_EQ(Silu(100.0f), 100.0f);  // exp(-100) underflows: silu = g
  EXPECT_EQ(Silu(-100.0f), -0.0f);  // exp(100) = inf: silu = -0, not NaN
  EXPECT_FALSE(std::isnan(Silu(-1e30f)));
  EXPECT_EQ(SiluDerivative(0.0f), 0.5f);
  EXPECT_EQ(SiluDerivative(100.0f), 1.0f);
  EXPECT_EQ(SiluDerivative(-100.0f), 0.0f);
  EXPECT_FALSE(std::isnan(SiluDerivative(-1e30f)));
  // sigmoid(1) (1 + 1 - sigmoid(1)), evaluated in Python's double.
  EXPECT_NEAR(SiluDerivative(1.0), 0.9276705118714869, 1e-15);
  // silu'(g) against a central difference of silu in double, over a range of g.
  for (double g = -30; g <= 30; g += 0.37) {
    const double h = 1e-6;
    EXPECT_NEAR(SiluDerivative(g), (Silu(g + h) - Silu(g - h)) / (2 * h), 1e-8) << g;
  }
  const SwiGluGrads<double> d = SwiGluBackwardTerms(1.5, -2.0, 0.5);
  EXPECT_DOUBLE_EQ(d.dg, 0.5 * -2.0 * SiluDerivative(1.5));
  EXPECT_DOUBLE_EQ(d.du, 0.5 * Silu(1.5));
}

TEST(RmsNormMathTest, RstdAndGradientIdentities) {
  EXPECT_DOUBLE_EQ(RmsNormRstd(12.0, 3, 0.0), 0.5);  // mean square 4
  EXPECT_FLOAT_EQ(RmsNormRstd(0.0f, 5, 1e-6f), 1000.0f);
  // A gradient dy proportional to the output direction (g = w * xhat scaled) is projected out:
  // with w = 1 and dy = xhat, dx = rstd * (xhat - xhat * mean(xhat^2)) and mean(xhat^2) = 1 for
  // eps = 0.
  const double x[3] = {1.0, -2.0, 3.0};
  const double r = RmsNormRstd(14.0, 3, 0.0);
  double gx = 0;
  for (double xi : x) gx += RmsNormGradTerm(xi * r, 1.0, xi, r);
  for (double xi : x) EXPECT_NEAR(RmsNormInputGrad(xi * r, 1.0, xi, r, gx / 3), 0.0, 1e-15);
}

TEST(RopeMathTest, RotationAndInverse) {
  const double c = std::cos(0.7), s = std::sin(0.7);
  const RopePair<double> y = RopeRotate(1.0, 2.0, c, s);
  EXPECT_DOUBLE_EQ(y.first, c - 2 * s);
  EXPECT_DOUBLE_EQ(y.second, 2 * c + s);
  const RopePair<double> x = RopeRotateInverse(y.first, y.second, c, s);
  EXPECT_NEAR(x.first, 1.0, 1e-15);
  EXPECT_NEAR(x.second, 2.0, 1e-15);
  EXPECT_EQ(RopeDefaultInverseFrequency<double>(10000.0, 0, 64), 1.0);
  EXPECT_NEAR(RopeDefaultInverseFrequency<double>(10000.0, 16, 64), 0.01, 1e-17);
  EXPECT_EQ(RopeAngle<float>(3, 0.5f), 1.5f);
}

TEST(RopeMathTest, Llama3BranchesAtTheirBoundaries) {
  const RopeLlama3Params p{8.0, 1.0, 4.0, 8192.0};  // wavelengths 2048 (high) and 8192 (low)
  const double two_pi = 6.283185307179586;
  // Exactly representable frequencies well inside each region.
  const double high = two_pi / 1024, low = two_pi / 16384, medium = two_pi / 4096;
  EXPECT_NEAR(RopeLlama3InverseFrequency<double>(high, p), high, 1e-18);
  EXPECT_NEAR(RopeLlama3InverseFrequency<double>(low, p), low / 8, 1e-18);
  // Medium: a = (8192 / 4096 - 1) / 3 = 1/3; (1 - a) f / 8 + a f.
  EXPECT_NEAR(RopeLlama3InverseFrequency<double>(medium, p), (2.0 / 3) * medium / 8 + medium / 3,
              1e-15 * medium);
  // Continuity at both region boundaries: the smooth rule meets f/factor and f.
  const double at_low = two_pi / 8192 * (1 + 1e-12), at_high = two_pi / 2048 * (1 - 1e-12);
  EXPECT_NEAR(RopeLlama3InverseFrequency<double>(at_low, p), at_low / 8, 1e-9 * at_low);
  EXPECT_NEAR(RopeLlama3InverseFrequency<double>(at_high, p), at_high, 1e-9 * at_high);
}

// --- The Highway loops, per target ---------------------------------------------------------------

namespace ls = kernels_internal::llama_simd;

constexpr float kGuard = 12345.0f;
constexpr int64_t kOffset = 1;  // unaligned starts

std::vector<int64_t> Lengths() {
  std::vector<int64_t> n;
  for (int64_t i = 0; i <= 70; ++i) n.push_back(i);
  n.push_back(1003);
  return n;
}

// n random values in [lo, hi) after kOffset leading values, followed by 16 guards.
std::vector<float> Buffer(TestRng& gen, int64_t n, double lo = -1, double hi = 1) {
  std::vector<float> v(kOffset + n + 16, kGuard);
  for (int64_t i = 0; i < n; ++i) v[kOffset + i] = static_cast<float>(absl::Uniform(gen, lo, hi));
  return v;
}

void ExpectGuardsIntact(const std::vector<float>& v, int64_t n, const char* what) {
  for (size_t i = kOffset + n; i < v.size(); ++i) ASSERT_EQ(v[i], kGuard) << what << " n " << n;
}

class LlamaSimdTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(LlamaSimdTest);

TEST_P(LlamaSimdTest, RmsNormRowsMatchScalarMath) {
  TestRng gen(1);  // fixed seed: reproducible failures
  const float rstd = 1.7f, g_xhat_mean = 0.3f;
  for (const int64_t n : Lengths()) {
    const auto x = Buffer(gen, n, -2, 2), w = Buffer(gen, n, 0.5, 1.5), dy = Buffer(gen, n);
    auto y = Buffer(gen, n), dx = Buffer(gen, n), dw = Buffer(gen, n);
    const auto dx0 = dx, dw0 = dw;
    ls::RmsNormOutputRow(x.data() + kOffset, rstd, w.data() + kOffset, y.data() + kOffset, n);
    const float sum =
        ls::RmsNormGradSumRow(dy.data() + kOffset, w.data() + kOffset, x.data() + kOffset, rstd, n);
    ls::RmsNormInputGradRow(dy.data() + kOffset, w.data() + kOffset, x.data() + kOffset, rstd,
                            g_xhat_mean, dx.data() + kOffset, n);
    ls::RmsNormParamGradRow(dy.data() + kOffset, x.data() + kOffset, rstd, dw.data() + kOffset, n);
    double sum_ref = 0;
    for (int64_t i = kOffset; i < kOffset + n; ++i) {
      sum_ref += RmsNormGradTerm<double>(dy[i], w[i], x[i], rstd);
      // Element-wise: a couple of f32 roundings (and fused multiply-adds) of O(1) values.
      ASSERT_NEAR(y[i], RmsNormOutput<double>(x[i], rstd, w[i]), 1e-6) << n;
      ASSERT_NEAR(dx[i], dx0[i] + RmsNormInputGrad<double>(dy[i], w[i], x[i], rstd, g_xhat_mean),
                  2e-6)
          << n;
      ASSERT_NEAR(dw[i], dw0[i] + RmsNormWeightGradTerm<double>(dy[i], x[i], rstd), 1e-6) << n;
    }
    EXPECT_NEAR(sum, sum_ref, 1e-6 * (n + 1)) << n;
    ExpectGuardsIntact(y, n, "y");
    ExpectGuardsIntact(dx, n, "dx");
    ExpectGuardsIntact(dw, n, "dw");
  }
}

TEST_P(LlamaSimdTest, RopeRotatesPairsLikeScalarMath) {
  TestRng gen(2);  // fixed seed: reproducible failures
  for (const int64_t half : Lengths()) {
    for (const bool inverse : {false, true}) {
      auto x = Buffer(gen, 2 * half, -2, 2);
      const auto x0 = x, c = Buffer(gen, half), s = Buffer(gen, half);
      ls::RopeRotateHead(x.data() + kOffset, c.data() + kOffset, s.data() + kOffset, half, inverse);
      for (int64_t i = 0; i < half; ++i) {
        const double a = x0[kOffset + i], b = x0[kOffset + half + i];
        const double ci = c[kOffset + i], si = s[kOffset + i];
        const RopePair<double> r =
            inverse ? RopeRotateInverse(a, b, ci, si) : RopeRotate(a, b, ci, si);
        ASSERT_NEAR(x[kOffset + i], r.first, 1e-6) << half << " " << inverse;
        ASSERT_NEAR(x[kOffset + half + i], r.second, 1e-6) << half << " " << inverse;
      }
      ExpectGuardsIntact(x, 2 * half, "x");
    }
  }
}

TEST_P(LlamaSimdTest, SwiGluMatchesScalarMath) {
  TestRng gen(3);  // fixed seed: reproducible failures
  for (const int64_t n : Lengths()) {
    auto g = Buffer(gen, n, -20, 20);
    if (n > 2) {
      g[kOffset] = 120.0f;  // beyond Highway's exp range on both sides
      g[kOffset + 1] = -120.0f;
    }
    const auto u = Buffer(gen, n), dh = Buffer(gen, n);
    auto h = Buffer(gen, n), dg = Buffer(gen, n), du = Buffer(gen, n);
    const auto dg0 = dg, du0 = du;
    ls::SwiGluForward(g.data() + kOffset, u.data() + kOffset, h.data() + kOffset, n);
    ls::SwiGluBackward(g.data() + kOffset, u.data() + kOffset, dh.data() + kOffset,
                       dg.data() + kOffset, du.data() + kOffset, n);
    for (int64_t i = kOffset; i < kOffset + n; ++i) {
      const SwiGluGrads<double> d = SwiGluBackwardTerms<double>(g[i], u[i], dh[i]);
      // |silu(g)| <= 20; a 1-ulp exp and a few f32 roundings: relative 1e-6.
      ASSERT_NEAR(h[i], SwiGlu<double>(g[i], u[i]), 1e-6 * (1 + std::abs(g[i]))) << g[i];
      ASSERT_NEAR(dg[i], dg0[i] + d.dg, 2e-6) << g[i];
      ASSERT_NEAR(du[i], du0[i] + d.du, 1e-6 * (1 + std::abs(g[i]))) << g[i];
      ASSERT_FALSE(std::isnan(h[i]) || std::isnan(dg[i]) || std::isnan(du[i])) << g[i];
    }
    ExpectGuardsIntact(h, n, "h");
    ExpectGuardsIntact(dg, n, "dg");
    ExpectGuardsIntact(du, n, "du");
  }
}

TEST_P(LlamaSimdTest, GeGluMatchesScalarMath) {
  TestRng gen(4);  // fixed seed: reproducible failures
  for (const int64_t n : Lengths()) {
    auto g = Buffer(gen, n, -12, 12);
    if (n > 2) {
      g[kOffset] = 120.0f;  // beyond Highway's exp range on both sides
      g[kOffset + 1] = -120.0f;
    }
    const auto u = Buffer(gen, n), dh = Buffer(gen, n);
    auto h = Buffer(gen, n), dg = Buffer(gen, n), du = Buffer(gen, n);
    const auto dg0 = dg, du0 = du;
    ls::SwiGluForward(g.data() + kOffset, u.data() + kOffset, h.data() + kOffset, n,
                      /*gelu=*/true);
    ls::SwiGluBackward(g.data() + kOffset, u.data() + kOffset, dh.data() + kOffset,
                       dg.data() + kOffset, du.data() + kOffset, n, /*gelu=*/true);
    for (int64_t i = kOffset; i < kOffset + n; ++i) {
      const SwiGluGrads<double> d =
          GatedActivationBackwardTerms<double>(GateActivation::kGeluTanh, g[i], u[i], dh[i]);
      ASSERT_NEAR(h[i], GatedActivation<double>(GateActivation::kGeluTanh, g[i], u[i]),
                  1e-6 * (1 + std::abs(g[i])))
          << g[i];
      ASSERT_NEAR(dg[i], dg0[i] + d.dg, 2e-6) << g[i];
      ASSERT_NEAR(du[i], du0[i] + d.du, 1e-6 * (1 + std::abs(g[i]))) << g[i];
      ASSERT_FALSE(std::isnan(h[i]) || std::isnan(dg[i]) || std::isnan(du[i])) << g[i];
    }
    ExpectGuardsIntact(h, n, "h");
    ExpectGuardsIntact(dg, n, "dg");
    ExpectGuardsIntact(du, n, "du");
  }
}

}  // namespace
}  // namespace ps
