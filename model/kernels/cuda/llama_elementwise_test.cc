// cuda::Rope*, cuda::SwiGlu*, cuda::Embedding* against the CPU kernels on awkward shapes. Every
// test reports SKIPPED without a GPU, and in a build without --config=cuda — never passed.
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
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/llama_elementwise.h"
#include "model/kernels/embedding.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"
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

class CudaLlamaElementwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
};

TEST_F(CudaLlamaElementwiseTest, RopeMatchesCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  RopeConfig config{0, 500000.0, "llama3", {8.0, 1.0, 4.0, 8192.0}};
  // D = 2; odd half; Llama's 128 with GQA-sized head counts; tables longer than T.
  // Partial rotary (Phi-3): 96 of 128 channels, 2 of 10, 4 of 6.
  for (const RopeShape s :
       {RopeShape{1, 1, 1, 2, 1}, RopeShape{2, 37, 3, 10, 40}, RopeShape{1, 70, 8, 128, 70},
        RopeShape{3, 5, 2, 64, 9}, RopeShape{2, 33, 3, 128, 40, 96}, RopeShape{2, 9, 2, 10, 9, 2},
        RopeShape{1, 7, 5, 6, 7, 4}}) {
    config.head_dim = s.rotated();
    const int64_t half = s.rotated() / 2, n = s.batch * s.seq_len * s.num_heads * s.head_dim;
    std::vector<float> cos(s.table_positions * half), sin(s.table_positions * half);
    ASSERT_OK(
        RopeTables<float>(config, s.table_positions, absl::MakeSpan(cos), absl::MakeSpan(sin)));
    const auto x = RandomVector<float>(gen, n, -2, 2), dy = RandomVector<float>(gen, n);
    DeviceVector<float> d_cos(cos), d_sin(sin), d_x(x), d_dy(dy);
    ASSERT_OK(cuda::RopeForward(s, d_cos.get(), d_sin.get(), d_x.get(), stream_->get()));
    ASSERT_OK(cuda::RopeBackward(s, d_cos.get(), d_sin.get(), d_dy.get(), stream_->get()));
    std::vector<float> y = x, dx = dy;
    ASSERT_OK(RopeForward<float>(s, cos, sin, absl::MakeSpan(y), nullptr));
    ASSERT_OK(RopeBackward<float>(s, cos, sin, absl::MakeSpan(dx), nullptr));
    // Two products and a sum of |x| <= 2 values; the sides differ only by fused multiply-adds.
    ExpectAllNear(d_x.Download(), y, 1e-6, 1e-6, "rotated");
    ExpectAllNear(d_dy.Download(), dx, 1e-6, 1e-6, "dx");
  }
}

TEST_F(CudaLlamaElementwiseTest, SwiGluMatchesCpu) {
  TestRng gen(2);  // fixed seed: reproducible failures
  for (const int64_t n : {int64_t{1}, int64_t{33}, int64_t{100003}}) {
    auto g = RandomVector<float>(gen, n, -12, 12);
    if (n > 2) {
      g[0] = 95.f;  // exp(-g) underflows / overflows
      g[1] = -95.f;
    }
    const auto u = RandomVector<float>(gen, n), dh = RandomVector<float>(gen, n);
    auto dg = RandomVector<float>(gen, n), du = RandomVector<float>(gen, n);  // accumulate
    DeviceVector<float> d_g(g), d_u(u), d_h(n), d_dh(dh), d_dg(dg), d_du(du);
    ASSERT_OK(cuda::SwiGluForward(n, d_g.get(), d_u.get(), d_h.get(), stream_->get()));
    ASSERT_OK(cuda::SwiGluBackward(n, d_g.get(), d_u.get(), d_dh.get(), d_dg.get(), d_du.get(),
                                   stream_->get()));
    std::vector<float> h(n);
    ASSERT_OK(SwiGluForward<float>(g, u, absl::MakeSpan(h), nullptr));
    ASSERT_OK(SwiGluBackward<float>(g, u, dh, absl::MakeSpan(dg), absl::MakeSpan(du), nullptr));
    // The same formulas; CUDA's expf and Highway's exp are each within ~1-2 ulp, plus fused
    // multiply-adds: relative 1e-6 on values up to ~12.
    ExpectAllNear(d_h.Download(), h, 1e-6, 1e-6, "h");
    ExpectAllNear(d_dg.Download(), dg, 2e-6, 1e-6, "dgate");
    ExpectAllNear(d_du.Download(), du, 2e-6, 1e-6, "dup");
  }
}

TEST_F(CudaLlamaElementwiseTest, EmbeddingMatchesCpuBitForBit) {
  TestRng gen(3);  // fixed seed: reproducible failures
  for (const int64_t padding_idx : {int64_t{-1}, int64_t{2}}) {
    // More rows than buckets; C not a multiple of 32; repeated tokens.
    const EmbeddingShape s{301, 70, 130, padding_idx};
    std::vector<int32_t> tokens(s.rows);
    for (int32_t& t : tokens) t = absl::Uniform<int32_t>(gen, 0, 5) * 64 % 130;
    tokens[7] = 2;
    const auto wte = RandomVector<float>(gen, 130 * 70), dout = RandomVector<float>(gen, 301 * 70);
    auto dwte = RandomVector<float>(gen, 130 * 70);
    DeviceVector<int32_t> d_tokens(tokens);
    DeviceVector<float> d_wte(wte), d_out(301 * 70), d_dout(dout), d_dwte(dwte);
    ASSERT_OK(cuda::EmbeddingForward(s, d_tokens.get(), d_wte.get(), d_out.get(), stream_->get()));
    ASSERT_OK(
        cuda::EmbeddingBackward(s, d_tokens.get(), d_dout.get(), d_dwte.get(), stream_->get()));
    std::vector<float> out(301 * 70);
    ASSERT_OK(EmbeddingForward<float>(s, tokens, wte, absl::MakeSpan(out), nullptr));
    ASSERT_OK(EmbeddingBackward<float>(s, tokens, dout, absl::MakeSpan(dwte), nullptr));
    EXPECT_EQ(d_out.Download(), out);
    EXPECT_EQ(d_dwte.Download(), dwte);  // same additions in the same order
  }
}

TEST_F(CudaLlamaElementwiseTest, OutOfRangeTokenGivesNaNNotACrash) {
  const EmbeddingShape s{2, 3, 4, -1};
  DeviceVector<int32_t> d_tokens(std::vector<int32_t>{1, 9});
  DeviceVector<float> d_wte(std::vector<float>(12, 1.0f)), d_out(6);
  DeviceVector<float> d_dwte(std::vector<float>(12, 0.0f)), d_dout(std::vector<float>(6, 1.0f));
  ASSERT_OK(cuda::EmbeddingForward(s, d_tokens.get(), d_wte.get(), d_out.get(), stream_->get()));
  ASSERT_OK(cuda::EmbeddingBackward(s, d_tokens.get(), d_dout.get(), d_dwte.get(), stream_->get()));
  const std::vector<float> out = d_out.Download(), dwte = d_dwte.Download();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(out[c], 1.0f);
    EXPECT_TRUE(std::isnan(out[3 + c]));
    EXPECT_EQ(dwte[3 + c], 1.0f);  // row 1 from token 1; token 9 is dropped
  }
}

TEST_F(CudaLlamaElementwiseTest, RejectsBadArguments) {
  DeviceVector<float> buf(64);
  EXPECT_THAT(cuda::RopeForward({1, 4, 1, 5, 4}, buf.get(), buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd")));
  EXPECT_THAT(cuda::RopeForward({1, 5, 1, 4, 4}, buf.get(), buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds")));
  EXPECT_THAT(cuda::RopeBackward({1, 4, 1, 4, 4}, buf.get(), buf.get(), nullptr, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx is null")));
  EXPECT_THAT(cuda::SwiGluForward(0, buf.get(), buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n must be positive")));
  EXPECT_THAT(cuda::EmbeddingForward({2, 3, 4, 4}, nullptr, buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("padding_idx")));
}

#else  // !PS_WITH_CUDA

TEST(CudaLlamaElementwise, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
