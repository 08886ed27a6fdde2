#include "model/kernels/rmsnorm.h"

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

struct Inputs {
  std::vector<double> x, w, dy;
};

// A residual-stream-like x (offset, spread) and gains around 1.
Inputs MakeInputs(TestRng& gen, const RmsNormShape& s) {
  Inputs in;
  in.x = RandomVector<double>(gen, s.rows * s.channels, -1.5, 2.5);
  in.w = RandomVector<double>(gen, s.channels, 0.5, 1.5);
  in.dy = RandomVector<double>(gen, s.rows * s.channels);
  return in;
}

// The definition in double: y = w * x / sqrt(mean(x^2) + eps), and the backward by the chain rule
// written without the kernel's rearrangement: dx_k = sum_c dy_c w_c d(x_c r)/dx_k.
struct Reference {
  std::vector<double> y, rstd, dx, dw;
};
Reference NaiveRmsNorm(const RmsNormShape& s, const Inputs& in) {
  const int64_t N = s.rows, C = s.channels;
  Reference ref;
  ref.y.assign(N * C, 0);
  ref.rstd.assign(N, 0);
  ref.dx.assign(N * C, 0);
  ref.dw.assign(C, 0);
  for (int64_t r = 0; r < N; ++r) {
    const double* x = in.x.data() + r * C;
    const double* dy = in.dy.data() + r * C;
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[c] * x[c] / C;
    const double rs = 1 / std::sqrt(ms + s.eps);
    ref.rstd[r] = rs;
    for (int64_t c = 0; c < C; ++c) {
      ref.y[r * C + c] = in.w[c] * x[c] * rs;
      ref.dw[c] += dy[c] * x[c] * rs;
    }
    // d(x_c r)/dx_k = delta_ck r - x_c r^3 x_k / C.
    for (int64_t k = 0; k < C; ++k) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) {
        acc += dy[c] * in.w[c] * ((c == k ? rs : 0.0) - x[c] * rs * rs * rs * x[k] / C);
      }
      ref.dx[r * C + k] = acc;
    }
  }
  return ref;
}

TEST(RmsNormTest, FloatMatchesDoubleReference) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // One channel; tails of every vector width; C above a task's 32-channel dw slice; many rows.
  for (const RmsNormShape s :
       {RmsNormShape{1, 1, 1e-6}, RmsNormShape{3, 7, 1e-5}, RmsNormShape{37, 67, 1e-6},
        RmsNormShape{5, 130, 1e-5}, RmsNormShape{300, 33, 1e-6}}) {
    const Inputs in = MakeInputs(gen, s);
    const Reference ref = NaiveRmsNorm(s, in);
    const int64_t N = s.rows, C = s.channels;
    std::vector<float> y(N * C), rstd(N), dx(N * C, 0.f), dw(C, 0.f);
    const std::vector<float> x = Convert<float>(in.x), w = Convert<float>(in.w),
                             dy = Convert<float>(in.dy);
    ASSERT_OK(RmsNormForward<float>(s, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), &pool));
    ASSERT_OK(
        RmsNormBackward<float>(s, x, w, rstd, dy, absl::MakeSpan(dx), absl::MakeSpan(dw), &pool));
    // Inputs rounded to f32 (6e-8 relative), C-term f32 sums of O(1) values: a few ulps of O(1)
    // results for y, rstd and dx; dw sums N rows of O(1) terms.
    ExpectAllNear(y, ref.y, 1e-5, 1e-5, "y");
    ExpectAllNear(rstd, ref.rstd, 1e-6, 1e-5, "rstd");
    ExpectAllNear(dx, ref.dx, 2e-5, 1e-5, "dx");
    ExpectAllNear(dw, ref.dw, 2e-6 * N, 1e-5, "dw");
  }
}

TEST(RmsNormTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const RmsNormShape s{3, 9, 1e-5};
  Inputs in = MakeInputs(gen, s);
  std::vector<double> y(s.rows * s.channels), rstd(s.rows);
  auto loss = [&]() {
    PS_CHECK_OK(
        RmsNormForward<double>(s, in.x, in.w, absl::MakeSpan(y), absl::MakeSpan(rstd), nullptr));
    return Dot(y, in.dy);
  };
  loss();
  // Gradients start nonzero to check that the kernel adds.
  std::vector<double> dx(in.x.size(), 0.5), dw(s.channels, -0.25);
  ASSERT_OK(RmsNormBackward<double>(s, in.x, in.w, rstd, in.dy, absl::MakeSpan(dx),
                                    absl::MakeSpan(dw), nullptr));
  for (double& v : dx) v -= 0.5;
  for (double& v : dw) v += 0.25;
  ExpectGradientMatchesFiniteDifferences(in.x, dx, loss, "dx", 1e-8, 1e-6, 1000);
  ExpectGradientMatchesFiniteDifferences(in.w, dw, loss, "dw", 1e-8, 1e-6, 1000);
}

TEST(RmsNormTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const RmsNormShape s{301, 100, 1e-6};
  const Inputs in = MakeInputs(gen, s);
  const std::vector<float> x = Convert<float>(in.x), w = Convert<float>(in.w),
                           dy = Convert<float>(in.dy);
  const int64_t N = s.rows, C = s.channels;
  ThreadPool pool(4);
  std::vector<float> results[2][4];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    std::vector<float> y(N * C), rstd(N), dx(N * C, 0.f), dw(C, 0.f);
    ASSERT_OK(RmsNormForward<float>(s, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), p));
    ASSERT_OK(RmsNormBackward<float>(s, x, w, rstd, dy, absl::MakeSpan(dx), absl::MakeSpan(dw), p));
    results[run][0] = y;
    results[run][1] = rstd;
    results[run][2] = dx;
    results[run][3] = dw;
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[0][i], results[1][i]) << i;
}

// weight_offset 1 (Gemma's gain 1 + w) is the kernel run on the gain 1 + w rounded to T, bit
// for bit: y, dx; dw does not depend on the gain. f32 (the SIMD rows) and f64.
template <typename T>
void ExpectOffsetIsTheShiftedGain() {
  TestRng gen(7);  // fixed seed: reproducible failures
  for (const RmsNormShape s : {RmsNormShape{5, 7, 1e-6, 1.0}, RmsNormShape{33, 70, 1e-5, 1.0}}) {
    const int64_t N = s.rows, C = s.channels;
    const std::vector<T> x = RandomVector<T>(gen, N * C, -2, 2);
    const std::vector<T> w = RandomVector<T>(gen, C, -0.5, 0.5);
    const std::vector<T> dy = RandomVector<T>(gen, N * C);
    std::vector<T> gain(C);
    for (int64_t c = 0; c < C; ++c) gain[c] = T{1} + w[c];
    RmsNormShape plain = s;
    plain.weight_offset = 0;
    std::vector<T> y(N * C), rstd(N), y_ref(N * C), rstd_ref(N);
    ASSERT_OK(RmsNormForward<T>(s, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), nullptr));
    ASSERT_OK(RmsNormForward<T>(plain, x, gain, absl::MakeSpan(y_ref), absl::MakeSpan(rstd_ref),
                                nullptr));
    EXPECT_EQ(y, y_ref);
    EXPECT_EQ(rstd, rstd_ref);
    std::vector<T> dx(N * C, T{0.5}), dw(C, T{0.25}), dx_ref = dx, dw_ref = dw;
    ASSERT_OK(RmsNormBackward<T>(s, x, w, rstd, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                 nullptr));
    ASSERT_OK(RmsNormBackward<T>(plain, x, gain, rstd, dy, absl::MakeSpan(dx_ref),
                                 absl::MakeSpan(dw_ref), nullptr));
    EXPECT_EQ(dx, dx_ref);
    EXPECT_EQ(dw, dw_ref);
    // And the offset matters: the plain kernel on w differs.
    ASSERT_OK(RmsNormForward<T>(plain, x, w, absl::MakeSpan(y_ref), absl::MakeSpan(rstd_ref),
                                nullptr));
    EXPECT_NE(y, y_ref);
  }
}

TEST(RmsNormTest, WeightOffsetIsTheShiftedGain) {
  ExpectOffsetIsTheShiftedGain<float>();
  ExpectOffsetIsTheShiftedGain<double>();
}

TEST(RmsNormTest, ZeroRowGivesZeroOutputNotNaN) {
  // mean(x^2) = 0: rstd = 1/sqrt(eps) is finite, y = 0, gradients finite.
  const RmsNormShape s{1, 5, 1e-6};
  std::vector<float> x(5, 0.f), w(5, 1.f), y(5), rstd(1), dy(5, 1.f), dx(5, 0.f), dw(5, 0.f);
  ASSERT_OK(RmsNormForward<float>(s, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), nullptr));
  ASSERT_OK(
      RmsNormBackward<float>(s, x, w, rstd, dy, absl::MakeSpan(dx), absl::MakeSpan(dw), nullptr));
  EXPECT_FLOAT_EQ(rstd[0], 1000.f);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(y[i], 0.f);
    EXPECT_FLOAT_EQ(dx[i], 1000.f);
    EXPECT_EQ(dw[i], 0.f);
  }
}

TEST(RmsNormTest, RejectsBadShapes) {
  std::vector<float> x(6), w(3), y(6), rstd(2);
  EXPECT_THAT(RmsNormForward<float>({2, 3}, x, absl::MakeSpan(w).subspan(1), absl::MakeSpan(y),
                                    absl::MakeSpan(rstd), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("w has 2 elements")));
  EXPECT_THAT(RmsNormForward<float>({2, 3}, x, w, absl::MakeSpan(y),
                                    absl::MakeSpan(rstd).subspan(1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rstd")));
  EXPECT_THAT(RmsNormForward<float>({0, 3}, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
  EXPECT_THAT(
      RmsNormForward<float>({2, 3, 0.0}, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rms_norm_eps")));
  std::vector<float> dx(6), dw(3);
  EXPECT_THAT(RmsNormBackward<float>({2, 3}, x, w, rstd, absl::MakeSpan(y).subspan(1),
                                     absl::MakeSpan(dx), absl::MakeSpan(dw), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dy")));
}

}  // namespace
}  // namespace ps
