#include "model/kernels/swiglu.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

// The textbook definitions in long double: silu(g) = g / (1 + exp(-g)), and its derivative
// sigmoid(g) + g sigmoid(g) (1 - sigmoid(g)).
long double RefSilu(long double g) { return g / (1 + std::exp(-g)); }
long double RefSiluGrad(long double g) {
  const long double s = 1 / (1 + std::exp(-g));
  return s + g * s * (1 - s);
}

TEST(SwiGluTest, FloatMatchesLongDoubleReference) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // One element; tails of every vector width; more than one 8192-element task; gates far into
  // both saturated regions.
  for (const int64_t n : {1, 7, 33, 1000, 20001}) {
    std::vector<float> g = RandomVector<float>(gen, n, -12, 12), u = RandomVector<float>(gen, n),
                       dh = RandomVector<float>(gen, n);
    if (n > 4) {
      g[0] = 95.f;   // exp(-g) underflows: silu = g
      g[1] = -95.f;  // exp(-g) overflows: silu = -0
      g[2] = 0.f;
      g[3] = -1e-30f;
    }
    std::vector<float> h(n), dg(n, 0.25f), du(n, -0.5f);
    ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(h), &pool));
    ASSERT_OK(SwiGluBackward<float>(g, u, dh, absl::MakeSpan(dg), absl::MakeSpan(du), &pool));
    std::vector<double> h_ref(n), dg_ref(n), du_ref(n);
    for (int64_t i = 0; i < n; ++i) {
      h_ref[i] = static_cast<double>(RefSilu(g[i]) * u[i]);
      dg_ref[i] =
          0.25 + static_cast<double>(static_cast<long double>(dh[i]) * u[i] * RefSiluGrad(g[i]));
      du_ref[i] = -0.5 + static_cast<double>(dh[i] * RefSilu(g[i]));
    }
    // A handful of f32 roundings and a 1-ulp exp on values of size up to ~12 (|silu(g)| <= |g|,
    // |silu'| <= 1.1): relative 1e-6 plus a small absolute term for the cancelling += above.
    ExpectAllNear(h, h_ref, 1e-6, 1e-6, "h");
    ExpectAllNear(dg, dg_ref, 1e-6, 1e-6, "dgate");
    ExpectAllNear(du, du_ref, 1e-6, 1e-6, "dup");
    for (float v : h) ASSERT_FALSE(std::isnan(v));
  }
}

TEST(SwiGluTest, InPlaceForwardMatchesOutOfPlace) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const std::vector<float> g = RandomVector<float>(gen, 77, -4, 4),
                           u = RandomVector<float>(gen, 77);
  std::vector<float> h(77), in_place = g;
  ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(h), nullptr));
  ASSERT_OK(SwiGluForward<float>(in_place, u, absl::MakeSpan(in_place), nullptr));
  EXPECT_EQ(h, in_place);
}

TEST(SwiGluTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const int64_t n = 40;
  std::vector<double> g = RandomVector<double>(gen, n, -6, 6),
                      u = RandomVector<double>(gen, n, -2, 2);
  const std::vector<double> r = RandomVector<double>(gen, n);
  std::vector<double> h(n);
  auto loss = [&]() {
    PS_CHECK_OK(SwiGluForward<double>(g, u, absl::MakeSpan(h), nullptr));
    return Dot(h, r);
  };
  std::vector<double> dg(n, 0.0), du(n, 0.0);
  ASSERT_OK(SwiGluBackward<double>(g, u, r, absl::MakeSpan(dg), absl::MakeSpan(du), nullptr));
  ExpectGradientMatchesFiniteDifferences(g, dg, loss, "dgate", 1e-9, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(u, du, loss, "dup", 1e-9, 1e-7, 1000);
}

TEST(SwiGluTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(4);  // fixed seed: reproducible failures
  const int64_t n = 50000;
  const std::vector<float> g = RandomVector<float>(gen, n, -8, 8), u = RandomVector<float>(gen, n),
                           dh = RandomVector<float>(gen, n);
  ThreadPool pool(3);
  std::vector<float> results[2][3];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    std::vector<float> h(n), dg(n, 0.f), du(n, 0.f);
    ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(h), p));
    ASSERT_OK(SwiGluBackward<float>(g, u, dh, absl::MakeSpan(dg), absl::MakeSpan(du), p));
    results[run][0] = h;
    results[run][1] = dg;
    results[run][2] = du;
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results[0][i], results[1][i]) << i;
}

// GeGLU (GateActivation::kGeluTanh, Gemma's gelu_pytorch_tanh): against the textbook tanh form
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) in long double, and its derivative by the
// product and chain rules (tanh' = 1 - tanh^2): an independent formula, not gelu_math.h's
// logistic rewrite.
long double RefGelu(long double g) {
  const long double k = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
  return 0.5L * g * (1 + std::tanh(k * (g + 0.044715L * g * g * g)));
}
long double RefGeluGrad(long double g) {
  const long double k = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
  const long double t = std::tanh(k * (g + 0.044715L * g * g * g));
  return 0.5L * (1 + t) + 0.5L * g * (1 - t * t) * k * (1 + 3 * 0.044715L * g * g);
}

TEST(GeGluTest, FloatMatchesLongDoubleReference) {
  TestRng gen(5);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const int64_t n : {1, 7, 33, 1000, 20001}) {
    std::vector<float> g = RandomVector<float>(gen, n, -9, 9), u = RandomVector<float>(gen, n),
                       dh = RandomVector<float>(gen, n);
    if (n > 4) {
      g[0] = 95.f;   // saturated: gelu = g, gelu' = 1
      g[1] = -95.f;  // saturated: gelu = -0, gelu' = 0
      g[2] = 0.f;
      g[3] = -1e-30f;
    }
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> h(n), dg(n, 0.25f), du(n, -0.5f);
      ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(h), p, GateActivation::kGeluTanh));
      ASSERT_OK(SwiGluBackward<float>(g, u, dh, absl::MakeSpan(dg), absl::MakeSpan(du), p,
                                      GateActivation::kGeluTanh));
      std::vector<double> h_ref(n), dg_ref(n), du_ref(n);
      for (int64_t i = 0; i < n; ++i) {
        h_ref[i] = static_cast<double>(RefGelu(g[i]) * u[i]);
        dg_ref[i] =
            0.25 + static_cast<double>(static_cast<long double>(dh[i]) * u[i] * RefGeluGrad(g[i]));
        du_ref[i] = -0.5 + static_cast<double>(dh[i] * RefGelu(g[i]));
      }
      // A handful of f32 roundings and a 1-ulp exp on values up to ~9 (|gelu(g)| <= |g|,
      // |gelu'| <= 1.13): relative 1e-6 plus a small absolute term for the cancelling +=.
      ExpectAllNear(h, h_ref, 1e-6, 1e-6, "h");
      ExpectAllNear(dg, dg_ref, 1e-6, 1e-6, "dgate");
      ExpectAllNear(du, du_ref, 1e-6, 1e-6, "dup");
      for (float v : h) ASSERT_FALSE(std::isnan(v));
    }
  }
}

TEST(GeGluTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(6);  // fixed seed: reproducible failures
  const int64_t n = 40;
  std::vector<double> g = RandomVector<double>(gen, n, -5, 5),
                      u = RandomVector<double>(gen, n, -2, 2);
  const std::vector<double> r = RandomVector<double>(gen, n);
  std::vector<double> h(n);
  auto loss = [&]() {
    PS_CHECK_OK(SwiGluForward<double>(g, u, absl::MakeSpan(h), nullptr, GateActivation::kGeluTanh));
    return Dot(h, r);
  };
  std::vector<double> dg(n, 0.0), du(n, 0.0);
  ASSERT_OK(SwiGluBackward<double>(g, u, r, absl::MakeSpan(dg), absl::MakeSpan(du), nullptr,
                                   GateActivation::kGeluTanh));
  ExpectGradientMatchesFiniteDifferences(g, dg, loss, "dgate", 1e-9, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(u, du, loss, "dup", 1e-9, 1e-7, 1000);
}

TEST(GeGluTest, DiffersFromSwiGluAndDefaultIsSilu) {
  TestRng gen(7);  // fixed seed: reproducible failures
  const std::vector<float> g = RandomVector<float>(gen, 64, -3, 3),
                           u = RandomVector<float>(gen, 64);
  std::vector<float> silu(64), silu_default(64), gelu(64);
  ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(silu), nullptr, GateActivation::kSilu));
  ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(silu_default), nullptr));
  ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(gelu), nullptr, GateActivation::kGeluTanh));
  EXPECT_EQ(silu, silu_default);
  EXPECT_NE(silu, gelu);
}

TEST(SwiGluTest, RejectsMismatchedSizes) {
  std::vector<float> g(6), u(5), h(6);
  EXPECT_THAT(SwiGluForward<float>(g, u, absl::MakeSpan(h), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("up has 5 elements")));
  EXPECT_THAT(SwiGluForward<float>({}, {}, {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gate size")));
  std::vector<float> u6(6), dg(6), du(4);
  EXPECT_THAT(SwiGluBackward<float>(g, u6, h, absl::MakeSpan(dg), absl::MakeSpan(du), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dup")));
}

}  // namespace
}  // namespace ps
