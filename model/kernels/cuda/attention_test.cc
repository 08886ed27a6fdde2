// cuda::Attention* against the CPU kernel: sequence lengths not multiples of
// the 8-query groups or the 32-key tiles, head dims below, at, between and at
// the limit of the per-lane registers, B and H > 1. Every test reports SKIPPED
// without a GPU, and in a build without --config=cuda — never passed.
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
#include "model/kernels/attention.h"
#include "model/kernels/cuda/attention.h"
#include "model/kernels/cuda/cuda_test_util.h"
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

class CudaAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
};

TEST_F(CudaAttentionTest, ForwardAndBackwardMatchCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  // {B, T, C, H}: T = 1; T = 37 (tails of both the 8-query groups and the
  // 32-key tiles); hd = 5, 33 (one lane with two elements), 64 (GPT-2), 128
  // (the limit); T = 300 crosses many tiles.
  for (const AttentionShape s : {AttentionShape{1, 1, 4, 2}, AttentionShape{2, 37, 10, 2},
                                 AttentionShape{1, 33, 66, 2}, AttentionShape{2, 70, 128, 2},
                                 AttentionShape{1, 41, 128, 1}, AttentionShape{1, 300, 64, 1}}) {
    const int64_t B = s.batch, L = s.seq_len, C = s.channels, H = s.num_heads;
    // Scores reach |s| ~ 6 at hd = 64 scaled: the online softmax rescales
    // across tiles for real.
    const auto qkv = RandomVector<float>(gen, B * L * 3 * C, -2, 2);
    const auto dout = RandomVector<float>(gen, B * L * C);
    auto dqkv = RandomVector<float>(gen, B * L * 3 * C);  // accumulates
    DeviceVector<float> d_qkv(qkv), d_out(B * L * C), d_lse(B * H * L), d_dout(dout), d_dqkv(dqkv);
    DeviceVector<char> ws(cuda::AttentionBackwardWorkspaceBytes(s));
    ASSERT_OK(cuda::AttentionForward(s, d_qkv.get(), d_out.get(), d_lse.get(), stream_->get()));
    ASSERT_OK(cuda::AttentionBackward(s, d_qkv.get(), d_out.get(), d_lse.get(), d_dout.get(),
                                      d_dqkv.get(), ws.get(), static_cast<int64_t>(ws.size()),
                                      stream_->get()));
    std::vector<float> out(B * L * C), lse(B * H * L), cpu_ws(AttentionWorkspaceElems(s, 1));
    ASSERT_OK(AttentionForward<float>(s, qkv, absl::MakeSpan(out), absl::MakeSpan(lse),
                                      absl::MakeSpan(cpu_ws), nullptr));
    ASSERT_OK(AttentionBackward<float>(s, qkv, out, lse, dout, absl::MakeSpan(dqkv), nullptr));
    // Same formulas; the dot products and tile sums are taken in different
    // orders. The CPU test bounds the CPU's own error against a double
    // reference by 1e-5 (out, lse) and 3e-5 + 1e-4 relative (dqkv, sums of up
    // to T terms); the GPU's is of the same size, so twice those bound the
    // difference. The backward also uses each side's own forward outputs.
    ExpectAllNear(d_out.Download(), out, 2e-5, 2e-5, "out");
    ExpectAllNear(d_lse.Download(), lse, 2e-5, 2e-6, "lse");
    ExpectAllNear(d_dqkv.Download(), dqkv, 6e-5, 2e-4, "dqkv");
  }
}

TEST_F(CudaAttentionTest, ResultsAreReproducible) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const AttentionShape s{2, 45, 48, 3};
  const auto qkv = RandomVector<float>(gen, 2 * 45 * 144);
  const auto dout = RandomVector<float>(gen, 2 * 45 * 48);
  std::vector<float> first[3];
  for (int run = 0; run < 2; ++run) {
    DeviceVector<float> d_qkv(qkv), d_out(2 * 45 * 48), d_lse(2 * 3 * 45), d_dout(dout),
        d_dqkv(std::vector<float>(qkv.size(), 0.0f));
    DeviceVector<char> ws(cuda::AttentionBackwardWorkspaceBytes(s));
    ASSERT_OK(cuda::AttentionForward(s, d_qkv.get(), d_out.get(), d_lse.get(), stream_->get()));
    ASSERT_OK(cuda::AttentionBackward(s, d_qkv.get(), d_out.get(), d_lse.get(), d_dout.get(),
                                      d_dqkv.get(), ws.get(), static_cast<int64_t>(ws.size()),
                                      stream_->get()));
    const std::vector<float> results[3] = {d_out.Download(), d_lse.Download(), d_dqkv.Download()};
    for (int i = 0; i < 3; ++i) {
      if (run == 0) {
        first[i] = results[i];
      } else {
        EXPECT_EQ(results[i], first[i]) << i;  // no atomics: bit for bit
      }
    }
  }
}

TEST_F(CudaAttentionTest, RejectsBadArguments) {
  DeviceVector<float> buf(1024);
  DeviceVector<char> ws(16);
  EXPECT_THAT(
      cuda::AttentionForward({1, 4, 258, 2}, buf.get(), buf.get(), buf.get(), stream_->get()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head dim")));
  EXPECT_THAT(cuda::AttentionForward({1, 4, 9, 2}, buf.get(), buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a multiple")));
  EXPECT_THAT(cuda::AttentionForward({1, 4, 8, 2}, buf.get(), nullptr, buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out is null")));
  EXPECT_THAT(cuda::AttentionBackward({1, 8, 8, 2}, buf.get(), buf.get(), buf.get(), buf.get(),
                                      buf.get(), ws.get(), 16, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace has 16 bytes")));
}

#else  // !PS_WITH_CUDA

TEST(CudaAttention, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
