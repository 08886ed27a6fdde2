// cuda::LmHeadCrossEntropy* against the CPU kernel: row and vocabulary tiles
// with tails, ignored targets, all rows ignored, an out-of-range target. Every
// test reports SKIPPED without a GPU, and in a build without --config=cuda —
// never passed.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/lm_head_cross_entropy.h"
#include "model/kernels/lm_head_cross_entropy.h"
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

class CudaLmHeadCrossEntropyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
    ASSERT_OK_AND_ASSIGN(cublas_, cuda::CublasHandle::Create());
  }

  struct Result {
    double loss = 0;
    std::vector<float> lse, dh, dwte;
  };

  // Forward then backward on the GPU, gradients accumulated onto dh0 / dwte0.
  Result RunGpu(const LmHeadCrossEntropyShape& s, const std::vector<float>& h,
                const std::vector<float>& wte, const std::vector<int32_t>& targets,
                double loss_grad, const std::vector<float>& dh0, const std::vector<float>& dwte0) {
    DeviceVector<float> d_h(h), d_wte(wte), d_lse(s.rows), d_dh(dh0), d_dwte(dwte0);
    DeviceVector<int32_t> d_targets(targets);
    DeviceVector<double> d_loss(1);
    DeviceVector<char> ws(cuda::LmHeadCrossEntropyWorkspaceBytes(s));
    const int64_t ws_bytes = static_cast<int64_t>(ws.size());
    Result r;
    EXPECT_OK(cuda::LmHeadCrossEntropyForward(*cublas_, s, d_h.get(), d_wte.get(), d_targets.get(),
                                              d_lse.get(), d_loss.get(), ws.get(), ws_bytes,
                                              stream_->get()));
    EXPECT_OK(cuda::LmHeadCrossEntropyBackward(*cublas_, s, d_h.get(), d_wte.get(), d_targets.get(),
                                               d_lse.get(), loss_grad, d_dh.get(), d_dwte.get(),
                                               ws.get(), ws_bytes, stream_->get()));
    r.loss = d_loss.Download()[0];
    r.lse = d_lse.Download();
    r.dh = d_dh.Download();
    r.dwte = d_dwte.Download();
    return r;
  }

  std::optional<TestStream> stream_;  // created once a GPU is known to exist
  absl::StatusOr<cuda::CublasHandle> cublas_ = absl::UnknownError("not created");
};

TEST_F(CudaLmHeadCrossEntropyTest, MatchesCpuWithTileTailsAndIgnoredRows) {
  TestRng gen(1);  // fixed seed: reproducible failures
  // {N, C, V, row_tile, vocab_tile}: tails in both tile dimensions; one tile
  // covering everything; vocabulary tiles narrower than the 256 threads of a
  // row block (threads with empty states).
  for (const LmHeadCrossEntropyShape s :
       {LmHeadCrossEntropyShape{37, 24, 301, 16, 100}, LmHeadCrossEntropyShape{5, 8, 11, 256, 2048},
        LmHeadCrossEntropyShape{64, 40, 1000, 64, 7}, LmHeadCrossEntropyShape{3, 768, 5000}}) {
    const int64_t N = s.rows, C = s.channels, V = s.vocab_size;
    const auto h = RandomVector<float>(gen, N * C, -1, 1);
    const auto wte = RandomVector<float>(gen, V * C, -0.5, 0.5);
    std::vector<int32_t> targets(N);
    for (int32_t& t : targets) {
      t = absl::Bernoulli(gen, 0.2) ? s.ignore_index
                                    : absl::Uniform<int32_t>(gen, 0, static_cast<int32_t>(V));
    }
    const double loss_grad = 1.5;
    auto dh = RandomVector<float>(gen, N * C), dwte = RandomVector<float>(gen, V * C);
    const Result gpu = RunGpu(s, h, wte, targets, loss_grad, dh, dwte);
    std::vector<float> lse(N), ws(LmHeadCrossEntropyWorkspaceElems(s));
    ASSERT_OK_AND_ASSIGN(const double loss,
                         LmHeadCrossEntropyForward<float>(s, h, wte, targets, absl::MakeSpan(lse),
                                                          absl::MakeSpan(ws), nullptr));
    ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, h, wte, targets, lse, loss_grad,
                                                absl::MakeSpan(dh), absl::MakeSpan(dwte),
                                                absl::MakeSpan(ws), nullptr));
    // Logits are C-term f32 dot products (|z| <= ~C/4, error ~C * 6e-8 * |z| on
    // either side, ~2e-5 at C = 768); lse ~ log V + max z inherits that and the
    // tile-merge rounding. The loss is a mean of such differences. Gradients:
    // sums over up to V (dh) or N (dwte) terms of p * |wte| or p * |h| with p
    // <= 1 summing to 1 per row, so their errors stay ~1e-6.
    EXPECT_NEAR(gpu.loss, loss, 5e-5 + 1e-5 * std::abs(loss));
    ExpectAllNear(gpu.lse, lse, 5e-5, 1e-5, "lse");
    ExpectAllNear(gpu.dh, dh, 2e-5, 1e-5, "dh");
    ExpectAllNear(gpu.dwte, dwte, 2e-5, 1e-5, "dwte");
  }
}

TEST_F(CudaLmHeadCrossEntropyTest, AllIgnoredGivesZeroLossAndNoGradient) {
  const LmHeadCrossEntropyShape s{6, 4, 9, 4, 4};
  TestRng gen(2);  // fixed seed: reproducible failures
  const auto dh0 = RandomVector<float>(gen, 24), dwte0 = RandomVector<float>(gen, 36);
  const Result r = RunGpu(s, RandomVector<float>(gen, 24), RandomVector<float>(gen, 36),
                          std::vector<int32_t>(6, s.ignore_index), 1.0, dh0, dwte0);
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_EQ(r.dh, dh0);
  EXPECT_EQ(r.dwte, dwte0);
}

TEST_F(CudaLmHeadCrossEntropyTest, OutOfRangeTargetGivesNaNNotACrash) {
  const LmHeadCrossEntropyShape s{4, 4, 9, 4, 4};
  TestRng gen(3);  // fixed seed: reproducible failures
  const Result r =
      RunGpu(s, RandomVector<float>(gen, 16), RandomVector<float>(gen, 36), {1, 9, 2, -5}, 1.0,
             std::vector<float>(16, 0.0f), std::vector<float>(36, 0.0f));
  EXPECT_TRUE(std::isnan(r.loss));
  for (int c = 0; c < 4; ++c) EXPECT_TRUE(std::isnan(r.dh[4 + c])) << c;
}

TEST_F(CudaLmHeadCrossEntropyTest, RejectsBadArguments) {
  const LmHeadCrossEntropyShape s{4, 4, 9, 4, 4};
  DeviceVector<float> buf(64);
  DeviceVector<int32_t> targets(4);
  DeviceVector<double> loss(1);
  DeviceVector<char> ws(cuda::LmHeadCrossEntropyWorkspaceBytes(s));
  const int64_t bytes = static_cast<int64_t>(ws.size());
  EXPECT_THAT(
      cuda::LmHeadCrossEntropyForward(*cublas_, s, buf.get(), buf.get(), targets.get(), buf.get(),
                                      loss.get(), ws.get(), bytes - 1, stream_->get()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace has")));
  EXPECT_THAT(
      cuda::LmHeadCrossEntropyForward(*cublas_, s, buf.get(), buf.get(), targets.get(), buf.get(),
                                      loss.get(), ws.get() + 4, bytes - 4, stream_->get()),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cuda::LmHeadCrossEntropyForward(*cublas_, s, buf.get(), buf.get(), targets.get(),
                                              buf.get(), nullptr, ws.get(), bytes, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("loss is null")));
  EXPECT_THAT(cuda::LmHeadCrossEntropyBackward(*cublas_, {4, 4, 0, 4, 4}, buf.get(), buf.get(),
                                               targets.get(), buf.get(), 1.0, buf.get(), buf.get(),
                                               ws.get(), bytes, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_size")));
}

#else  // !PS_WITH_CUDA

TEST(CudaLmHeadCrossEntropy, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
