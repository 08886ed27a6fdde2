// cuda::RmsNorm* against the CPU kernel on awkward shapes. Every test reports SKIPPED without a
// GPU, and in a build without --config=cuda — never passed.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/rmsnorm.h"
#include "model/kernels/rmsnorm.h"
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

class CudaRmsNormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
};

TEST_F(CudaRmsNormTest, ForwardAndBackwardMatchCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  // Rows not a multiple of the 8 rows per block or 32 row lanes; channels below, at and above a
  // warp, not multiples of 32; a Llama-like 4096.
  for (const RmsNormShape s :
       {RmsNormShape{1, 1, 1e-6}, RmsNormShape{3, 7, 1e-5}, RmsNormShape{37, 33, 1e-6},
        RmsNormShape{70, 768, 1e-5}, RmsNormShape{301, 100, 1e-6}, RmsNormShape{9, 4096, 1e-5},
        // Gemma's gain 1 + w (weights near 0, as Gemma's are).
        RmsNormShape{37, 33, 1e-6, 1.0}, RmsNormShape{9, 1152, 1e-6, 1.0}}) {
    const int64_t N = s.rows, C = s.channels;
    const auto x = RandomVector<float>(gen, N * C, -1.5, 2.5);
    const auto w = RandomVector<float>(gen, C, 0.5 - s.weight_offset, 1.5 - s.weight_offset);
    const auto dy = RandomVector<float>(gen, N * C);
    auto dx = RandomVector<float>(gen, N * C), dw = RandomVector<float>(gen, C);  // accumulate
    DeviceVector<float> d_x(x), d_w(w), d_y(N * C), d_rstd(N), d_dy(dy), d_dx(dx), d_dw(dw);
    ASSERT_OK(
        cuda::RmsNormForward(s, d_x.get(), d_w.get(), d_y.get(), d_rstd.get(), stream_->get()));
    ASSERT_OK(cuda::RmsNormBackward(s, d_x.get(), d_w.get(), d_rstd.get(), d_dy.get(), d_dx.get(),
                                    d_dw.get(), stream_->get()));
    std::vector<float> y(N * C), rstd(N);
    ASSERT_OK(RmsNormForward<float>(s, x, w, absl::MakeSpan(y), absl::MakeSpan(rstd), nullptr));
    ASSERT_OK(
        RmsNormBackward<float>(s, x, w, rstd, dy, absl::MakeSpan(dx), absl::MakeSpan(dw), nullptr));
    // Both sides sum a row of C squares (<= 6.25) in f32 in different orders: ~sqrt(C) * 6e-8
    // relative in practice, C * 6e-8 worst case (2.5e-4 at C = 4096, halved by the square root in
    // rstd). rstd ~1 to 1e-5 relative plus that; y = w x rstd to 3e-5.
    ExpectAllNear(d_rstd.Download(), rstd, 1e-6, 1e-4, "rstd");
    ExpectAllNear(d_y.Download(), y, 3e-5, 1e-4, "y");
    // dx: one row reduction of O(1) terms times rstd; dw: sums over up to 301 rows of O(1) terms in
    // different orders (GPU: 32 strided partials and a tree).
    ExpectAllNear(d_dx.Download(), dx, 1e-4, 1e-4, "dx");
    ExpectAllNear(d_dw.Download(), dw, 2e-4, 1e-5, "dw");
  }
}

TEST_F(CudaRmsNormTest, RejectsBadArguments) {
  DeviceVector<float> buf(64);
  EXPECT_THAT(
      cuda::RmsNormForward({4, 0}, buf.get(), buf.get(), buf.get(), buf.get(), stream_->get()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("channels must be positive")));
  EXPECT_THAT(
      cuda::RmsNormForward({4, 4, 0.0}, buf.get(), buf.get(), buf.get(), buf.get(), stream_->get()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rms_norm_eps")));
  // dw may be null (input gradient only); dx may not.
  EXPECT_THAT(cuda::RmsNormBackward({4, 4}, buf.get(), buf.get(), buf.get(), buf.get(), nullptr,
                                    buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx is null")));
}

#else  // !PS_WITH_CUDA

TEST(CudaRmsNorm, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
