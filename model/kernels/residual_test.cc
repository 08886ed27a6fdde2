#include "model/kernels/residual.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

TEST(ResidualTest, AddsAndScattersGradientToBothInputs) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  const int64_t n = 16384 * 2 + 5;
  const std::vector<float> a = RandomVector<float>(gen, n), b = RandomVector<float>(gen, n),
                           dout = RandomVector<float>(gen, n);
  std::vector<float> out(n), da(n, 1.f), db(n, 2.f);
  ASSERT_OK(ResidualForward<float>(a, b, absl::MakeSpan(out), &pool));
  ASSERT_OK(ResidualBackward<float>(dout, absl::MakeSpan(da), absl::MakeSpan(db), &pool));
  for (int64_t i = 0; i < n; ++i) {
    // One float addition each: exact comparison with the same operation is the definition.
    ASSERT_EQ(out[i], a[i] + b[i]) << i;
    ASSERT_EQ(da[i], 1.f + dout[i]) << i;
    ASSERT_EQ(db[i], 2.f + dout[i]) << i;
  }
}

TEST(ResidualTest, OutputMayAliasAnInput) {
  std::vector<double> a = {1, 2, 3};
  const std::vector<double> b = {10, 20, 30};
  ASSERT_OK(ResidualForward<double>(a, b, absl::MakeSpan(a), nullptr));
  EXPECT_EQ(a, (std::vector<double>{11, 22, 33}));
}

TEST(ResidualTest, RejectsMismatchedSizes) {
  std::vector<float> a(4), b(3), out(4);
  EXPECT_THAT(ResidualForward<float>(a, b, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b has 3")));
}

}  // namespace
}  // namespace ps
