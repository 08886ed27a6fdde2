#include "model/kernels/gelu.h"

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

// Values of 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) computed independently in Python (math.tanh,
// double), the definition of transformers.activations.NewGELUActivation.
TEST(GeluTest, MatchesHuggingFaceGeluNewValues) {
  const std::vector<double> x = {-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 5.0};
  const std::vector<double> expected = {
      -0.0036373920817729943, -0.15880800939172324, -0.15428599017485606, 0.0,
      0.34571400982514394,    0.8411919906082768,   1.954597694087775,    4.999999770820381};
  std::vector<double> y(x.size());
  ASSERT_OK(GeluForward<double>(x, absl::MakeSpan(y), nullptr));
  ExpectAllNear(y, expected, 1e-15, 1e-14, "double");
  std::vector<float> yf(x.size());
  ASSERT_OK(GeluForward<float>(Convert<float>(x), absl::MakeSpan(yf), nullptr));
  // float tanh and the polynomial each round at ~6e-8 relative.
  ExpectAllNear(yf, expected, 1e-7, 1e-6, "float");
}

TEST(GeluTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(1);  // fixed seed: reproducible failures
  std::vector<double> x = RandomVector<double>(gen, 301, -6.0, 6.0);
  const std::vector<double> r = RandomVector<double>(gen, 301);
  std::vector<double> y(301);
  auto loss = [&]() {
    PS_CHECK_OK(GeluForward<double>(x, absl::MakeSpan(y), nullptr));
    return Dot(y, r);
  };
  std::vector<double> dx(301, 0.0);
  ASSERT_OK(GeluBackward<double>(x, r, absl::MakeSpan(dx), nullptr));
  ExpectGradientMatchesFiniteDifferences(x, dx, loss, "dx", 1e-8, 1e-7, 1000);
}

TEST(GeluTest, FloatMatchesDoubleAcrossBlocksAndThreads) {
  TestRng gen(2);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  const int64_t n = 8192 * 2 + 77;  // three blocks, the last partial
  const std::vector<double> x = RandomVector<double>(gen, n, -8.0, 8.0);
  const std::vector<double> dy = RandomVector<double>(gen, n);
  std::vector<double> y(n), dx(n, 0.5);
  ASSERT_OK(GeluForward<double>(x, absl::MakeSpan(y), nullptr));
  ASSERT_OK(GeluBackward<double>(x, dy, absl::MakeSpan(dx), nullptr));
  std::vector<float> yf(n), dxf(n, 0.5f), yf1(n), dxf1(n, 0.5f);
  const std::vector<float> xf = Convert<float>(x), dyf = Convert<float>(dy);
  ASSERT_OK(GeluForward<float>(xf, absl::MakeSpan(yf), &pool));
  ASSERT_OK(GeluBackward<float>(xf, dyf, absl::MakeSpan(dxf), &pool));
  ASSERT_OK(GeluForward<float>(xf, absl::MakeSpan(yf1), nullptr));
  ASSERT_OK(GeluBackward<float>(xf, dyf, absl::MakeSpan(dxf1), nullptr));
  // Rounding x to float moves y by |gelu'(x)| * 6e-8 * |x| <= ~1e-6 at |x| = 8.
  ExpectAllNear(yf, y, 2e-6, 1e-6, "y");
  ExpectAllNear(dxf, dx, 2e-6, 1e-5, "dx");
  EXPECT_EQ(yf, yf1);
  EXPECT_EQ(dxf, dxf1);
}

TEST(GeluTest, RejectsMismatchedSizes) {
  std::vector<float> x(4), y(3);
  EXPECT_THAT(GeluForward<float>(x, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("y has 3")));
  EXPECT_THAT(GeluBackward<float>(x, x, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx has 3")));
}

}  // namespace
}  // namespace ps
