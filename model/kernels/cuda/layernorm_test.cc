// cuda::LayerNorm* against the CPU kernel on awkward shapes. Every test reports
// SKIPPED without a GPU, and in a build without --config=cuda — never passed.
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
#include "model/kernels/cuda/layernorm.h"
#include "model/kernels/layernorm.h"
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

class CudaLayerNormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
};

TEST_F(CudaLayerNormTest, ForwardAndBackwardMatchCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  // Rows not a multiple of the 8 rows per block or 32 row lanes; channels
  // below, at and above a warp, not multiples of 32; GPT-2's 768.
  for (const LayerNormShape s : {LayerNormShape{1, 1}, LayerNormShape{3, 7}, LayerNormShape{37, 33},
                                 LayerNormShape{70, 768}, LayerNormShape{301, 100}}) {
    const int64_t N = s.rows, C = s.channels;
    // An offset mean: the two-pass variance must not cancel.
    const auto x = RandomVector<float>(gen, N * C, 2.0, 4.0);
    const auto w = RandomVector<float>(gen, C, 0.5, 1.5), b = RandomVector<float>(gen, C);
    const auto dy = RandomVector<float>(gen, N * C);
    auto dx = RandomVector<float>(gen, N * C);
    auto dw = RandomVector<float>(gen, C), db = RandomVector<float>(gen, C);
    DeviceVector<float> d_x(x), d_w(w), d_b(b), d_y(N * C), d_mean(N), d_rstd(N), d_dy(dy),
        d_dx(dx), d_dw(dw), d_db(db);
    ASSERT_OK(cuda::LayerNormForward(s, d_x.get(), d_w.get(), d_b.get(), d_y.get(), d_mean.get(),
                                     d_rstd.get(), stream_->get()));
    ASSERT_OK(cuda::LayerNormBackward(s, d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(),
                                      d_dy.get(), d_dx.get(), d_dw.get(), d_db.get(),
                                      stream_->get()));
    std::vector<float> y(N * C), mean(N), rstd(N);
    ASSERT_OK(LayerNormForward<float>(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(mean),
                                      absl::MakeSpan(rstd), nullptr));
    ASSERT_OK(LayerNormBackward<float>(s, x, w, mean, rstd, dy, absl::MakeSpan(dx),
                                       absl::MakeSpan(dw), absl::MakeSpan(db), nullptr));
    // Both sides sum a row of C values of size <= 4 in f32, in different
    // orders: the sums agree to ~C * 6e-8 relative in the worst case (~5e-5 at
    // C = 768), much less in practice (random rounding: sqrt(C) * 6e-8). mean
    // (~3) to 1e-5; rstd (~1.7 for var ~1/3) to 1e-5 relative; y = xhat w + b
    // with |xhat| <= ~2 to 3e-5.
    ExpectAllNear(d_mean.Download(), mean, 1e-5, 1e-6, "mean");
    ExpectAllNear(d_rstd.Download(), rstd, 1e-6, 1e-5, "rstd");
    ExpectAllNear(d_y.Download(), y, 3e-5, 1e-5, "y");
    // dx: two row reductions of O(1) terms, a difference of O(1) terms, times
    // rstd (up to ~10 for the short rows): 1e-4. dw, db: sums over up to 301
    // rows of terms <= ~3 in different orders (GPU: 32 strided partials and a
    // tree): 1e-4 absolute.
    ExpectAllNear(d_dx.Download(), dx, 1e-4, 1e-5, "dx");
    ExpectAllNear(d_dw.Download(), dw, 1e-4, 1e-5, "dw");
    ExpectAllNear(d_db.Download(), db, 1e-4, 1e-5, "db");
  }
}

TEST_F(CudaLayerNormTest, RejectsBadArguments) {
  DeviceVector<float> buf(64);
  EXPECT_THAT(cuda::LayerNormForward({4, 0}, buf.get(), buf.get(), buf.get(), buf.get(), buf.get(),
                                     buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("channels must be positive")));
  EXPECT_THAT(cuda::LayerNormForward({4, 4, 0.0}, buf.get(), buf.get(), buf.get(), buf.get(),
                                     buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));
  // dw and db may be null (input gradient only); dx may not.
  EXPECT_THAT(cuda::LayerNormBackward({4, 4}, buf.get(), buf.get(), buf.get(), buf.get(), buf.get(),
                                      nullptr, buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx is null")));
}

#else  // !PS_WITH_CUDA

TEST(CudaLayerNorm, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
