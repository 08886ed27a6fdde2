// model/kernels/internal/simd.h on every Highway target this CPU supports (the TEST_P suites run
// once per target, selected with hwy::SetSupportedTargetsForTest by hwy::TestWithParamTarget):
// each loop against a double-precision scalar reference built from the *_math.h functions, for
// every length 0..70 (all tail sizes of every vector width) and a long one, at unaligned starts,
// with guard elements after the end that must stay untouched.
#include "model/kernels/internal/simd.h"

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
#include "model/kernels/gelu_math.h"
#include "model/kernels/layernorm_math.h"

namespace ps::kernels_internal::simd {
namespace {

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

class SimdTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(SimdTest);

TEST_P(SimdTest, DispatchesToTheTargetUnderTest) {
  EXPECT_STREQ(TargetName(), hwy::TargetName(GetParam()));
}

TEST_P(SimdTest, ReductionsMatchDoubleSums) {
  TestRng gen(1);  // fixed seed: reproducible failures
  for (const int64_t n : Lengths()) {
    const auto a = Buffer(gen, n), b = Buffer(gen, n), big = Buffer(gen, n, 50, 60);
    double dot = 0, sum = 0, sq = 0, mx = -INFINITY, sexp = 0;
    const float mean = 55.0f;
    for (int64_t i = kOffset; i < kOffset + n; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      sum += a[i];
      sq += (static_cast<double>(big[i]) - mean) * (static_cast<double>(big[i]) - mean);
      mx = std::max<double>(mx, a[i]);
    }
    for (int64_t i = kOffset; i < kOffset + n; ++i) sexp += std::exp(a[i] - mx);
    // n terms of magnitude <= 1 (<= 25 for sq) summed in f32: <= n * 6e-8 relative to the sum
    // of magnitudes; 1e-6 * (n + 1) leaves room.
    const double tol = 1e-6 * static_cast<double>(n + 1);
    EXPECT_NEAR(Dot(a.data() + kOffset, b.data() + kOffset, n), dot, tol) << n;
    EXPECT_NEAR(Sum(a.data() + kOffset, n), sum, tol) << n;
    EXPECT_NEAR(SumSquaredDeviation(big.data() + kOffset, mean, n), sq, 25 * tol) << n;
    EXPECT_EQ(Max(a.data() + kOffset, n), static_cast<float>(mx)) << n;  // exact
    if (n > 0) {
      EXPECT_NEAR(SumExpMinus(a.data() + kOffset, static_cast<float>(mx), n), sexp, tol) << n;
    } else {
      EXPECT_EQ(SumExpMinus(a.data(), 0.0f, 0), 0.0f);
    }
  }
  EXPECT_EQ(Max(nullptr, 0), -std::numeric_limits<float>::infinity());
}

TEST_P(SimdTest, ElementWiseLoopsMatchScalarFormulas) {
  TestRng gen(2);  // fixed seed: reproducible failures
  for (const int64_t n : Lengths()) {
    const auto x = Buffer(gen, n, -8, 8), dy = Buffer(gen, n), w = Buffer(gen, n);
    const auto b = Buffer(gen, n);
    const float* xp = x.data() + kOffset;
    const float* dyp = dy.data() + kOffset;
    const float* wp = w.data() + kOffset;
    const float* bp = b.data() + kOffset;
    auto check = [&](const std::vector<float>& got, const std::vector<double>& want, double atol,
                     double rtol, const char* what) {
      ExpectGuardsIntact(got, n, what);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[kOffset + i], want[i], atol + rtol * std::abs(want[i]))
            << what << " n " << n << " i " << i << " x " << xp[i];
      }
    };
    std::vector<double> want(n);
    // One rounding (or one FMA) per element: within an ulp or two of the double value.
    std::vector<float> y = Buffer(gen, n);
    const std::vector<float> y0 = y;
    Axpy(0.75f, xp, y.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) want[i] = y0[kOffset + i] + 0.75 * xp[i];
    check(y, want, 1e-6, 2e-7, "axpy");
    y = y0;
    Scale(-1.5f, y.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) want[i] = -1.5 * y0[kOffset + i];
    check(y, want, 0, 6e-8, "scale");  // one rounding: within half an ulp
    std::vector<float> out(kOffset + n + 16, kGuard);
    Add(xp, dyp, out.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) want[i] = static_cast<double>(xp[i]) + dyp[i];
    check(out, want, 1e-6, 1e-7, "add");
    y = y0;
    AddTo(xp, y.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) want[i] = static_cast<double>(y0[kOffset + i]) + xp[i];
    check(y, want, 1e-6, 1e-7, "add_to");
    y = dy;  // values in [-1, 1]: exp(y - 0.5) in [0.22, 1.65]
    ScaledExpMinus(0.25f, 0.5f, y.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) want[i] = 0.25 * std::exp(static_cast<double>(dyp[i]) - 0.5);
    check(y, want, 0, 5e-7, "scaled_exp");  // Highway's exp: 1 ulp; plus the subtraction
    // GELU against the double evaluation of gelu_math.h: the f32 rounding of the exponent
    // (|exponent| <= ~60 here) dominates, ~|exponent| * 6e-8 relative in s.
    std::vector<float> g(kOffset + n + 16, kGuard);
    GeluForward(xp, g.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) want[i] = GeluTanh(static_cast<double>(xp[i]));
    check(g, want, 1e-6, 5e-6, "gelu");
    std::vector<float> dx = Buffer(gen, n);
    const std::vector<float> dx0 = dx;
    GeluBackward(xp, dyp, dx.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = dx0[kOffset + i] + dyp[i] * GeluTanhDerivative(static_cast<double>(xp[i]));
    }
    check(dx, want, 2e-6, 5e-6, "gelu_backward");
    // LayerNorm rows.
    const float mean = 0.25f, rstd = 1.75f;
    std::vector<float> ln(kOffset + n + 16, kGuard);
    LayerNormOutputRow(xp, mean, rstd, wp, bp, ln.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = LayerNormOutput<double>(xp[i], mean, rstd, wp[i], bp[i]);
    }
    check(ln, want, 2e-6, 1e-6, "layernorm_output");
    float g_sum = 0, g_xhat_sum = 0;
    LayerNormGradSumsRow(dyp, wp, xp, mean, rstd, n, &g_sum, &g_xhat_sum);
    double want_g = 0, want_gx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto t = LayerNormBackwardTerms<double>(dyp[i], wp[i], xp[i], mean, rstd);
      want_g += t.g;
      want_gx += t.g_xhat;
    }
    EXPECT_NEAR(g_sum, want_g, 1e-6 * (n + 1)) << n;
    EXPECT_NEAR(g_xhat_sum, want_gx, 2e-5 * (n + 1)) << n;  // terms up to 8 * 1.75 = 14
    dx = dx0;
    LayerNormInputGradRow(dyp, wp, xp, mean, rstd, 0.125f, -0.5f, dx.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = dx0[kOffset + i] +
                LayerNormInputGrad<double>(dyp[i], wp[i], xp[i], mean, rstd, 0.125, -0.5);
    }
    check(dx, want, 1e-5, 1e-6, "layernorm_input_grad");  // terms up to ~1.75 * 8
    std::vector<float> dw = Buffer(gen, n), db = Buffer(gen, n);
    const std::vector<float> dw0 = dw, db0 = db;
    LayerNormParamGradRow(dyp, xp, mean, rstd, dw.data() + kOffset, db.data() + kOffset, n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = dw0[kOffset + i] + LayerNormWeightGradTerm<double>(dyp[i], xp[i], mean, rstd);
    }
    check(dw, want, 5e-6, 1e-6, "layernorm_dw");
    for (int64_t i = 0; i < n; ++i) want[i] = static_cast<double>(db0[kOffset + i]) + dyp[i];
    check(db, want, 1e-6, 1e-7, "layernorm_db");
  }
}

TEST_P(SimdTest, GeluSaturatesLikeTheScalarFormula) {
  const std::vector<float> x = {-1e30f, -1e12f, -100.0f, -20.0f, 0.0f, 20.0f, 1e12f, 1e30f};
  std::vector<float> y(x.size()), dx(x.size(), 0.0f);
  const std::vector<float> ones(x.size(), 1.0f);
  GeluForward(x.data(), y.data(), static_cast<int64_t>(x.size()));
  GeluBackward(x.data(), ones.data(), dx.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], GeluTanh(x[i])) << x[i];  // saturated values are exact on both paths
    if (std::abs(x[i]) < 1e13f) {
      EXPECT_EQ(dx[i], GeluTanhDerivative(x[i])) << x[i];
    }
  }
}

}  // namespace
}  // namespace ps::kernels_internal::simd
