// cuda::Linear* against the CPU kernel on awkward shapes, with and without a bias. Every test
// reports SKIPPED without a GPU, and in a build without --config=cuda — never passed.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/linear.h"
#include "model/kernels/linear.h"
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

using ::ps::cuda_testing::DeviceVector;
using ::ps::cuda_testing::TestStream;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

class CudaLinearTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
    ASSERT_OK_AND_ASSIGN(cublas_, cuda::CublasHandle::Create());
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
  absl::StatusOr<cuda::CublasHandle> cublas_ = absl::UnknownError("not created");
};

// As cuda/matmul_test: f32 products of values in [-1, 1] summed over k terms, both sides
// accumulating in f32 in different orders: 1e-6 * k + 1e-6.
double GemmTolerance(int64_t k) { return 1e-6 * static_cast<double>(k) + 1e-6; }

TEST_F(CudaLinearTest, ForwardAndBackwardMatchCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  for (const bool bias : {false, true}) {
    for (const LinearShape s0 : {LinearShape{1, 1, 1}, LinearShape{7, 13, 5},
                                 LinearShape{37, 64, 96}, LinearShape{130, 33, 257}}) {
      LinearShape s = s0;
      s.bias = bias;
      const int64_t N = s.rows, I = s.in_features, O = s.out_features;
      const auto x = RandomVector<float>(gen, N * I), w = RandomVector<float>(gen, O * I);
      const auto b = RandomVector<float>(gen, bias ? O : 0), dy = RandomVector<float>(gen, N * O);
      auto dx = RandomVector<float>(gen, N * I), dw = RandomVector<float>(gen, O * I);
      auto db = RandomVector<float>(gen, bias ? O : 0);  // all accumulate
      DeviceVector<float> d_x(x), d_w(w), d_b(b), d_y(N * O), d_dy(dy), d_dx(dx), d_dw(dw),
          d_db(db);
      ASSERT_OK(cuda::LinearForward(*cublas_, s, d_x.get(), d_w.get(), bias ? d_b.get() : nullptr,
                                    d_y.get(), stream_->get()));
      ASSERT_OK(cuda::LinearBackward(*cublas_, s, d_x.get(), d_w.get(), d_dy.get(), d_dx.get(),
                                     d_dw.get(), bias ? d_db.get() : nullptr, stream_->get()));
      std::vector<float> y(N * O);
      ASSERT_OK(LinearForward<float>(s, x, w, b, absl::MakeSpan(y), nullptr));
      ASSERT_OK(LinearBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                      absl::MakeSpan(db), nullptr));
      ExpectAllNear(d_y.Download(), y, GemmTolerance(I), 0, "y");
      ExpectAllNear(d_dx.Download(), dx, GemmTolerance(O), 0, "dx");
      ExpectAllNear(d_dw.Download(), dw, GemmTolerance(N), 0, "dw");
      if (bias) ExpectAllNear(d_db.Download(), db, GemmTolerance(N), 0, "db");
    }
  }
}

TEST_F(CudaLinearTest, RejectsBadArguments) {
  DeviceVector<float> buf(64);
  float* p = buf.get();
  EXPECT_THAT(cuda::LinearForward(*cublas_, {4, 0, 4}, p, p, p, p, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in_features")));
  EXPECT_THAT(cuda::LinearForward(*cublas_, {2, 2, 2, true}, p, p, nullptr, p, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b is null")));
  // dw and db may be null (input gradient only); dx may not.
  EXPECT_THAT(
      cuda::LinearBackward(*cublas_, {2, 2, 2, true}, p, p, p, nullptr, p, p, stream_->get()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx is null")));
}

#else  // !PS_WITH_CUDA

TEST(CudaLinear, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
