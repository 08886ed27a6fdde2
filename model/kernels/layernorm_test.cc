#include "model/kernels/layernorm.h"

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

// Inputs with a nonzero mean (offset 0.5) and spread, like a residual stream.
struct Inputs {
  std::vector<double> x, w, b, dy;
};

Inputs MakeInputs(TestRng& gen, const LayerNormShape& s) {
  Inputs in;
  in.x = RandomVector<double>(gen, s.rows * s.channels, -1.5, 2.5);
  in.w = RandomVector<double>(gen, s.channels, 0.5, 1.5);
  in.b = RandomVector<double>(gen, s.channels, -0.5, 0.5);
  in.dy = RandomVector<double>(gen, s.rows * s.channels);
  return in;
}

TEST(LayerNormTest, ForwardMatchesDefinition) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const LayerNormShape s :
       {LayerNormShape{1, 7}, LayerNormShape{37, 67}, LayerNormShape{5, 130}}) {
    const Inputs in = MakeInputs(gen, s);
    const int64_t N = s.rows, C = s.channels;
    std::vector<float> y(N * C), mean(N), rstd(N);
    ASSERT_OK(LayerNormForward<float>(s, Convert<float>(in.x), Convert<float>(in.w),
                                      Convert<float>(in.b), absl::MakeSpan(y), absl::MakeSpan(mean),
                                      absl::MakeSpan(rstd), &pool));
    std::vector<double> y_ref(N * C), mean_ref(N), rstd_ref(N);
    for (int64_t r = 0; r < N; ++r) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += in.x[r * C + c] / C;
      for (int64_t c = 0; c < C; ++c) v += (in.x[r * C + c] - m) * (in.x[r * C + c] - m) / C;
      mean_ref[r] = m;
      rstd_ref[r] = 1 / std::sqrt(v + 1e-5);
      for (int64_t c = 0; c < C; ++c) {
        y_ref[r * C + c] = (in.x[r * C + c] - m) * rstd_ref[r] * in.w[c] + in.b[c];
      }
    }
    // Inputs are rounded to float first (relative 6e-8), then C-term sums in float: errors are
    // a few ulps of O(1) values; 1e-5 absolute leaves room for C up to a few hundred.
    ExpectAllNear(y, y_ref, 1e-5, 1e-5, "y");
    ExpectAllNear(mean, mean_ref, 1e-6, 1e-5, "mean");
    ExpectAllNear(rstd, rstd_ref, 1e-6, 1e-5, "rstd");
  }
}

TEST(LayerNormTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const LayerNormShape s{3, 9};
  Inputs in = MakeInputs(gen, s);
  std::vector<double> y(s.rows * s.channels), mean(s.rows), rstd(s.rows);
  auto forward = [&]() {
    PS_CHECK_OK(LayerNormForward<double>(s, in.x, in.w, in.b, absl::MakeSpan(y),
                                         absl::MakeSpan(mean), absl::MakeSpan(rstd), nullptr));
  };
  auto loss = [&]() {
    forward();
    return Dot(y, in.dy);
  };
  forward();
  std::vector<double> dx(in.x.size(), 0.0), dw(s.channels, 0.0), db(s.channels, 0.0);
  ASSERT_OK(LayerNormBackward<double>(s, in.x, in.w, mean, rstd, in.dy, absl::MakeSpan(dx),
                                      absl::MakeSpan(dw), absl::MakeSpan(db), nullptr));
  ExpectGradientMatchesFiniteDifferences(in.x, dx, loss, "dx", 1e-7, 1e-6, 1000);
  ExpectGradientMatchesFiniteDifferences(in.w, dw, loss, "dw", 1e-7, 1e-6, 1000);
  ExpectGradientMatchesFiniteDifferences(in.b, db, loss, "db", 1e-7, 1e-6, 1000);
}

TEST(LayerNormTest, FloatBackwardMatchesDoubleBackwardAndAccumulates) {
  TestRng gen(3);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  const LayerNormShape s{29, 75};
  const Inputs in = MakeInputs(gen, s);
  const int64_t N = s.rows, C = s.channels;
  std::vector<double> y(N * C), mean(N), rstd(N);
  ASSERT_OK(LayerNormForward<double>(s, in.x, in.w, in.b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                     absl::MakeSpan(rstd), nullptr));
  // Gradients start nonzero to check that the kernel adds.
  std::vector<double> dx(N * C, 1.0), dw(C, 2.0), db(C, 3.0);
  ASSERT_OK(LayerNormBackward<double>(s, in.x, in.w, mean, rstd, in.dy, absl::MakeSpan(dx),
                                      absl::MakeSpan(dw), absl::MakeSpan(db), nullptr));
  std::vector<float> dxf(N * C, 1.f), dwf(C, 2.f), dbf(C, 3.f);
  ASSERT_OK(LayerNormBackward<float>(
      s, Convert<float>(in.x), Convert<float>(in.w), Convert<float>(mean), Convert<float>(rstd),
      Convert<float>(in.dy), absl::MakeSpan(dxf), absl::MakeSpan(dwf), absl::MakeSpan(dbf), &pool));
  // dx: O(1) values from C-term float sums. dw, db: sums of N = 29 O(1) terms.
  ExpectAllNear(dxf, dx, 2e-5, 1e-5, "dx");
  ExpectAllNear(dwf, dw, 2e-5 * N, 1e-5, "dw");
  ExpectAllNear(dbf, db, 2e-5 * N, 1e-5, "db");
}

TEST(LayerNormTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(4);  // fixed seed: reproducible failures
  const LayerNormShape s{300, 100};
  const Inputs in = MakeInputs(gen, s);
  const std::vector<float> x = Convert<float>(in.x), w = Convert<float>(in.w),
                           b = Convert<float>(in.b), dy = Convert<float>(in.dy);
  const int64_t N = s.rows, C = s.channels;
  ThreadPool pool(4);
  std::vector<float> results[2][5];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.f), dw(C, 0.f), db(C, 0.f);
    ASSERT_OK(LayerNormForward<float>(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                      absl::MakeSpan(rstd), p));
    ASSERT_OK(LayerNormBackward<float>(s, x, w, mean, rstd, dy, absl::MakeSpan(dx),
                                       absl::MakeSpan(dw), absl::MakeSpan(db), p));
    results[run][0] = y;
    results[run][1] = rstd;
    results[run][2] = dx;
    results[run][3] = dw;
    results[run][4] = db;
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(results[0][i], results[1][i]) << i;
}

TEST(LayerNormTest, RejectsBadShapes) {
  std::vector<float> x(6), w(3), b(3), y(6), mean(2), rstd(2);
  EXPECT_THAT(LayerNormForward<float>({2, 3}, x, absl::MakeSpan(w).subspan(1), b, absl::MakeSpan(y),
                                      absl::MakeSpan(mean), absl::MakeSpan(rstd), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("w has 2 elements")));
  EXPECT_THAT(LayerNormForward<float>({2, 3}, x, w, b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                      absl::MakeSpan(rstd).subspan(1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rstd")));
  EXPECT_THAT(LayerNormForward<float>({2, 0}, x, w, b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                      absl::MakeSpan(rstd), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("channels")));
  EXPECT_THAT(LayerNormForward<float>({2, 3, 0.0}, x, w, b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                      absl::MakeSpan(rstd), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));
}

}  // namespace
}  // namespace ps
