#include "model/kernels/matmul.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/random/random.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "base/thread_pool.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

class MatmulTest : public ::testing::Test {
 protected:
  void SetUp() override { SetBlasThreads(1); }
};

TEST_F(MatmulTest, SetBlasThreadsPinsTheCount) { EXPECT_EQ(BlasThreads(), 1); }

TEST_F(MatmulTest, ForwardAndBackwardMatchNaiveLoops) {
  absl::BitGen gen(std::seed_seq{1});  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const MatmulShape s :
       {MatmulShape{1, 3, 5}, MatmulShape{17, 33, 99}, MatmulShape{40, 24, 130}}) {
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    const std::vector<float> x = RandomVector<float>(gen, N * I);
    const std::vector<float> w = RandomVector<float>(gen, I * O);
    const std::vector<float> b = RandomVector<float>(gen, O);
    const std::vector<float> dy = RandomVector<float>(gen, N * O);
    std::vector<float> y(N * O, 9.f), dx(N * I, 1.f), dw(I * O, 2.f), db(O, 3.f);
    ASSERT_OK(MatmulForward<float>(s, x, w, b, absl::MakeSpan(y), &pool));
    ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                    absl::MakeSpan(db), &pool));
    std::vector<double> y_ref(N * O), dx_ref(N * I, 1.0), dw_ref(I * O, 2.0), db_ref(O, 3.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = b[o];
        for (int64_t i = 0; i < I; ++i) {
          acc += double{x[n * I + i]} * w[i * O + o];
          dx_ref[n * I + i] += double{dy[n * O + o]} * w[i * O + o];
          dw_ref[i * O + o] += double{x[n * I + i]} * dy[n * O + o];
        }
        y_ref[n * O + o] = acc;
        db_ref[o] += dy[n * O + o];
      }
    }
    // Float dot products of K terms of magnitude <= 1: error <= ~K * 6e-8 in the worst case,
    // sqrt(K) typically; with K <= 130, 1e-5 absolute is an honest worst-case bound.
    ExpectAllNear(y, y_ref, 1e-5, 1e-6, "y");
    ExpectAllNear(dx, dx_ref, 1e-5, 1e-6, "dx");
    ExpectAllNear(dw, dw_ref, 1e-5, 1e-6, "dw");
    ExpectAllNear(db, db_ref, 1e-5, 1e-6, "db");
  }
}

TEST_F(MatmulTest, GradientMatchesFiniteDifferencesInDouble) {
  absl::BitGen gen(std::seed_seq{2});  // fixed seed: reproducible failures
  const MatmulShape s{4, 5, 7};
  std::vector<double> x = RandomVector<double>(gen, 20), w = RandomVector<double>(gen, 35),
                      b = RandomVector<double>(gen, 7);
  const std::vector<double> r = RandomVector<double>(gen, 28);
  std::vector<double> y(28);
  auto loss = [&]() {
    PS_CHECK_OK(MatmulForward<double>(s, x, w, b, absl::MakeSpan(y), nullptr));
    return Dot(y, r);
  };
  std::vector<double> dx(20, 0.0), dw(35, 0.0), db(7, 0.0);
  ASSERT_OK(MatmulBackward<double>(s, x, w, r, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                   absl::MakeSpan(db), nullptr));
  ExpectGradientMatchesFiniteDifferences(x, dx, loss, "dx", 1e-8, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(w, dw, loss, "dw", 1e-8, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(b, db, loss, "db", 1e-8, 1e-7, 1000);
}

TEST_F(MatmulTest, ResultsDoNotDependOnPoolThreads) {
  absl::BitGen gen(std::seed_seq{3});  // fixed seed: reproducible failures
  const MatmulShape s{300, 8, 200};
  const std::vector<float> x = RandomVector<float>(gen, 2400), w = RandomVector<float>(gen, 1600),
                           dy = RandomVector<float>(gen, 60000);
  std::vector<float> db1(200, 0.f), db2(200, 0.f), dx(2400), dw(1600);
  ThreadPool pool(4);
  ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                  absl::MakeSpan(db1), nullptr));
  ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                  absl::MakeSpan(db2), &pool));
  EXPECT_EQ(db1, db2);
}

TEST_F(MatmulTest, RejectsBadShapes) {
  std::vector<float> x(6), w(12), b(4), y(8);
  EXPECT_THAT(MatmulForward<float>({2, 3, 4}, x, w, absl::MakeSpan(b).subspan(1), absl::MakeSpan(y),
                                   nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b has 3")));
  EXPECT_THAT(MatmulForward<float>({2, 3, 0}, x, w, b, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_features")));
  EXPECT_THAT(MatmulForward<float>({int64_t{1} << 31, 3, 4}, x, w, b, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
}

}  // namespace
}  // namespace ps
