#include "model/kernels/linear.h"

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
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

class LinearTest : public ::testing::Test {};

TEST_F(LinearTest, FloatMatchesNaiveReferenceWithAndWithoutBias) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const bool bias : {false, true}) {
    // One row; odd sizes; more than one 64-column bias task.
    for (const LinearShape s0 : {LinearShape{1, 1, 1}, LinearShape{7, 13, 5},
                                 LinearShape{33, 20, 130}, LinearShape{64, 96, 72}}) {
      LinearShape s = s0;
      s.bias = bias;
      const int64_t N = s.rows, I = s.in_features, O = s.out_features;
      const std::vector<double> x = RandomVector<double>(gen, N * I),
                                w = RandomVector<double>(gen, O * I),
                                b = RandomVector<double>(gen, bias ? O : 0),
                                dy = RandomVector<double>(gen, N * O);
      std::vector<double> y_ref(N * O), dx_ref(N * I, 0.5), dw_ref(O * I, 0.5), db_ref(O, 0.5);
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t o = 0; o < O; ++o) {
          double acc = bias ? b[o] : 0.0;
          for (int64_t i = 0; i < I; ++i) acc += x[r * I + i] * w[o * I + i];
          y_ref[r * O + o] = acc;
          for (int64_t i = 0; i < I; ++i) {
            dx_ref[r * I + i] += dy[r * O + o] * w[o * I + i];
            dw_ref[o * I + i] += dy[r * O + o] * x[r * I + i];
          }
          db_ref[o] += dy[r * O + o];
        }
      }
      std::vector<float> y(N * O), dx(N * I, 0.5f), dw(O * I, 0.5f), db(bias ? O : 0, 0.5f);
      const std::vector<float> xf = Convert<float>(x), wf = Convert<float>(w),
                               bf = Convert<float>(b), dyf = Convert<float>(dy);
      ASSERT_OK(LinearForward<float>(s, xf, wf, bf, absl::MakeSpan(y), &pool));
      ASSERT_OK(LinearBackward<float>(s, xf, wf, dyf, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                      absl::MakeSpan(db), &pool));
      // Sums of up to ~100 products of values in [-1, 1) in f32: a few 1e-6 absolute.
      ExpectAllNear(y, y_ref, 1e-5, 1e-5, "y");
      ExpectAllNear(dx, dx_ref, 1e-5, 1e-5, "dx");
      ExpectAllNear(dw, dw_ref, 1e-5, 1e-5, "dw");
      if (bias) ExpectAllNear(db, db_ref, 1e-5, 1e-5, "db");
    }
  }
}

// nn.Linear with W [out, in] is Conv1D with W^T [in, out]: both kernels must agree.
TEST_F(LinearTest, AgreesWithConv1DOnTheTransposedWeight) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const int64_t N = 9, I = 11, O = 6;
  const std::vector<double> x = RandomVector<double>(gen, N * I),
                            w = RandomVector<double>(gen, O * I), b = RandomVector<double>(gen, O),
                            dy = RandomVector<double>(gen, N * O);
  std::vector<double> w_t(I * O);
  for (int64_t o = 0; o < O; ++o) {
    for (int64_t i = 0; i < I; ++i) w_t[i * O + o] = w[o * I + i];
  }
  std::vector<double> y1(N * O), y2(N * O), dx1(N * I, 0), dx2(N * I, 0), dw1(O * I, 0),
      dwt(I * O, 0), db1(O, 0), db2(O, 0);
  ASSERT_OK(LinearForward<double>({N, I, O, true}, x, w, b, absl::MakeSpan(y1), nullptr));
  ASSERT_OK(MatmulForward<double>({N, I, O}, x, w_t, b, absl::MakeSpan(y2), nullptr));
  ASSERT_OK(LinearBackward<double>({N, I, O, true}, x, w, dy, absl::MakeSpan(dx1),
                                   absl::MakeSpan(dw1), absl::MakeSpan(db1), nullptr));
  ASSERT_OK(MatmulBackward<double>({N, I, O}, x, w_t, dy, absl::MakeSpan(dx2), absl::MakeSpan(dwt),
                                   absl::MakeSpan(db2), nullptr));
  std::vector<double> dw2(O * I);
  for (int64_t o = 0; o < O; ++o) {
    for (int64_t i = 0; i < I; ++i) dw2[o * I + i] = dwt[i * O + o];
  }
  ExpectAllNear(y1, y2, 1e-14, 0, "y");
  ExpectAllNear(dx1, dx2, 1e-14, 0, "dx");
  ExpectAllNear(dw1, dw2, 1e-14, 0, "dw");
  EXPECT_EQ(db1, db2);
}

TEST_F(LinearTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const LinearShape s{4, 5, 3, true};
  std::vector<double> x = RandomVector<double>(gen, 20), w = RandomVector<double>(gen, 15),
                      b = RandomVector<double>(gen, 3);
  const std::vector<double> r = RandomVector<double>(gen, 12);
  std::vector<double> y(12);
  auto loss = [&]() {
    PS_CHECK_OK(LinearForward<double>(s, x, w, b, absl::MakeSpan(y), nullptr));
    return Dot(y, r);
  };
  std::vector<double> dx(20, 0), dw(15, 0), db(3, 0);
  ASSERT_OK(LinearBackward<double>(s, x, w, r, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                   absl::MakeSpan(db), nullptr));
  ExpectGradientMatchesFiniteDifferences(x, dx, loss, "dx");
  ExpectGradientMatchesFiniteDifferences(w, dw, loss, "dw");
  ExpectGradientMatchesFiniteDifferences(b, db, loss, "db");
}

TEST_F(LinearTest, RejectsBadShapesAndBiasMismatch) {
  std::vector<float> x(6), w(6), b(3), y(9);
  EXPECT_THAT(LinearForward<float>({3, 2, 3, false}, x, w, b, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the shape has no bias")));
  EXPECT_THAT(LinearForward<float>({3, 2, 3, true}, x, w, {}, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b has 0 elements")));
  EXPECT_THAT(LinearForward<float>({3, 2, 0, false}, x, w, {}, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_features")));
  EXPECT_THAT(LinearForward<float>({3, 2, 3, true}, x, absl::MakeSpan(w).subspan(1), b,
                                   absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("w has 5")));
  std::vector<float> dx(6), dw(6);
  EXPECT_THAT(LinearBackward<float>({3, 2, 3, false}, x, w, y, absl::MakeSpan(dx),
                                    absl::MakeSpan(dw), absl::MakeSpan(b), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("db")));
}

}  // namespace
}  // namespace ps
