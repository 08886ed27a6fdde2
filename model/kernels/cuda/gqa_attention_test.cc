// cuda::GqaAttention* against the CPU kernel: sequence lengths not multiples of the 8-row groups
// or the 32-key tiles, MQA/GQA/MHA head layouts and GPT-2's fused qkv (strided rows), head dims
// below, at, between and at the limit of the per-lane registers. Every test reports SKIPPED without
// a GPU, and in a build without
// --config=cuda — never passed.
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
#include "model/kernels/cuda/gqa_attention.h"
#include "model/kernels/gqa_attention.h"
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

class CudaGqaAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
};

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result RunGpu(const GqaAttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
              const std::vector<float>& v, const std::vector<float>& dout,
              const std::vector<float>& dq0, const std::vector<float>& dkv0, cudaStream_t stream) {
  DeviceVector<float> d_q(q), d_k(k), d_v(v), d_out(q.size()),
      d_lse(s.batch * s.num_heads * s.seq_len), d_dout(dout), d_dq(dq0), d_dk(dkv0), d_dv(dkv0);
  DeviceVector<char> ws(cuda::GqaAttentionBackwardWorkspaceBytes(s));
  EXPECT_OK(cuda::GqaAttentionForward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(),
                                      stream));
  EXPECT_OK(cuda::GqaAttentionBackward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(),
                                       d_dout.get(), d_dq.get(), d_dk.get(), d_dv.get(), ws.get(),
                                       static_cast<int64_t>(ws.size()), stream));
  return {d_out.Download(), d_lse.Download(), d_dq.Download(), d_dk.Download(), d_dv.Download()};
}

TEST_F(CudaGqaAttentionTest, ForwardAndBackwardMatchCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  // {B, T, Hq, Hkv, D}: T = 1; T = 37 (tails of both the 8-row groups and the 32-key tiles); MQA,
  // GQA 4:1 and 3:1, MHA; D = 5, 33 (one lane with two elements), 64, 128 (the limit); T = 300
  // crosses many tiles.
  for (const GqaAttentionShape& s :
       {GqaAttentionShape{1, 1, 2, 1, 4}, GqaAttentionShape{2, 37, 4, 1, 5},
        GqaAttentionShape{1, 33, 6, 2, 33}, GqaAttentionShape{2, 70, 8, 2, 128},
        GqaAttentionShape{1, 41, 2, 2, 128}, GqaAttentionShape{1, 300, 4, 2, 64}}) {
    const int64_t nq = s.batch * s.seq_len * s.num_heads * s.head_dim;
    const int64_t nkv = s.batch * s.seq_len * s.num_kv_heads * s.head_dim;
    // Scores reach |s| ~ 6 at D = 64: the online softmax rescales across tiles for real.
    const auto q = RandomVector<float>(gen, nq, -2, 2), k = RandomVector<float>(gen, nkv, -2, 2),
               v = RandomVector<float>(gen, nkv, -2, 2), dout = RandomVector<float>(gen, nq);
    const auto dq0 = RandomVector<float>(gen, nq), dkv0 = RandomVector<float>(gen, nkv);
    const Result gpu = RunGpu(s, q, k, v, dout, dq0, dkv0, stream_->get());
    std::vector<float> out(nq), lse(s.batch * s.num_heads * s.seq_len),
        ws(GqaAttentionWorkspaceElems(s, 1)), dq = dq0, dk = dkv0, dv = dkv0;
    ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                         absl::MakeSpan(ws), nullptr));
    ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out, lse, dout, absl::MakeSpan(dq),
                                          absl::MakeSpan(dk), absl::MakeSpan(dv), nullptr));
    // Twice the CPU kernel's own bound against a double reference
    // (gqa_attention_test: 1e-5 for out and lse, 3e-5 + 1e-4 relative for gradients, scaled by the
    // group size for dk and dv, which sum over the group's query heads).
    const double G = static_cast<double>(s.num_heads / s.num_kv_heads);
    ExpectAllNear(gpu.out, out, 2e-5, 2e-5, "out");
    ExpectAllNear(gpu.lse, lse, 2e-5, 2e-6, "lse");
    ExpectAllNear(gpu.dq, dq, 6e-5, 2e-4, "dq");
    ExpectAllNear(gpu.dk, dk, 6e-5 * G, 2e-4, "dk");
    ExpectAllNear(gpu.dv, dv, 6e-5 * G, 2e-4, "dv");
  }
}

// GPT-2's attention: kv heads = heads, q, k, v read from the fused qkv [B, T, 3C] through row
// strides of 3C and the gradients written likewise into dqkv (the shapes of the former multi-head
// kernel's test: head dims 2, 5, 33, 64 and the limit 128).
TEST_F(CudaGqaAttentionTest, FusedQkvMatchesCpu) {
  TestRng gen(3);  // fixed seed: reproducible failures
  // {B, T, C, H}.
  const int64_t shapes[][4] = {{1, 1, 4, 2},    {2, 37, 10, 2},  {1, 33, 66, 2},
                               {2, 70, 128, 2}, {1, 41, 128, 1}, {1, 300, 64, 1}};
  for (const auto& [B, L, C, H] : shapes) {
    const GqaAttentionShape s{.batch = B,
                              .seq_len = L,
                              .num_heads = H,
                              .num_kv_heads = H,
                              .head_dim = C / H,
                              .q_row_stride = 3 * C,
                              .kv_row_stride = 3 * C};
    const int64_t n = GqaAttentionQElems(s), nout = B * L * C;
    const auto qkv = RandomVector<float>(gen, B * L * 3 * C, -2, 2);
    const auto dout = RandomVector<float>(gen, nout);
    auto dqkv = RandomVector<float>(gen, B * L * 3 * C);  // accumulates
    DeviceVector<float> d_qkv(qkv), d_out(nout), d_lse(B * H * L), d_dout(dout), d_dqkv(dqkv);
    DeviceVector<char> ws(cuda::GqaAttentionBackwardWorkspaceBytes(s));
    float* x = d_qkv.get();
    float* dx = d_dqkv.get();
    ASSERT_OK(cuda::GqaAttentionForward(s, x, x + C, x + 2 * C, d_out.get(), d_lse.get(),
                                        stream_->get()));
    ASSERT_OK(cuda::GqaAttentionBackward(s, x, x + C, x + 2 * C, d_out.get(), d_lse.get(),
                                         d_dout.get(), dx, dx + C, dx + 2 * C, ws.get(),
                                         static_cast<int64_t>(ws.size()), stream_->get()));
    std::vector<float> out(nout), lse(B * H * L), cpu_ws(GqaAttentionWorkspaceElems(s, 1));
    const absl::Span<const float> in(qkv);
    const absl::Span<float> d = absl::MakeSpan(dqkv);
    ASSERT_OK(GqaAttentionForward<float>(s, in.subspan(0, n), in.subspan(C, n),
                                         in.subspan(2 * C, n), absl::MakeSpan(out),
                                         absl::MakeSpan(lse), absl::MakeSpan(cpu_ws), nullptr));
    ASSERT_OK(GqaAttentionBackward<float>(s, in.subspan(0, n), in.subspan(C, n),
                                          in.subspan(2 * C, n), out, lse, dout, d.subspan(0, n),
                                          d.subspan(C, n), d.subspan(2 * C, n), nullptr));
    // As ForwardAndBackwardMatchCpu with one kv head per query head.
    ExpectAllNear(d_out.Download(), out, 2e-5, 2e-5, "out");
    ExpectAllNear(d_lse.Download(), lse, 2e-5, 2e-6, "lse");
    ExpectAllNear(d_dqkv.Download(), dqkv, 6e-5, 2e-4, "dqkv");
  }
}

TEST_F(CudaGqaAttentionTest, ResultsAreReproducible) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const GqaAttentionShape s{2, 45, 6, 2, 16};
  const int64_t nq = 2 * 45 * 6 * 16, nkv = 2 * 45 * 2 * 16;
  const auto q = RandomVector<float>(gen, nq), k = RandomVector<float>(gen, nkv),
             v = RandomVector<float>(gen, nkv), dout = RandomVector<float>(gen, nq);
  const std::vector<float> zq(nq, 0.0f), zkv(nkv, 0.0f);
  const Result a = RunGpu(s, q, k, v, dout, zq, zkv, stream_->get());
  const Result b = RunGpu(s, q, k, v, dout, zq, zkv, stream_->get());
  EXPECT_EQ(a.out, b.out);  // no atomics: bit for bit
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

TEST_F(CudaGqaAttentionTest, RejectsBadArguments) {
  DeviceVector<float> buf(4096);
  DeviceVector<char> ws(16);
  float* p = buf.get();
  EXPECT_THAT(cuda::GqaAttentionForward({1, 4, 2, 1, 130}, p, p, p, p, p, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
  EXPECT_THAT(cuda::GqaAttentionForward({1, 4, 6, 4, 8}, p, p, p, p, p, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads")));
  EXPECT_THAT(cuda::GqaAttentionForward({1, 4, 2, 1, 8}, p, nullptr, p, p, p, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k is null")));
  GqaAttentionShape short_stride{1, 4, 2, 1, 8};
  short_stride.kv_row_stride = 7;  // a row of k holds Hkv*D = 8
  EXPECT_THAT(cuda::GqaAttentionForward(short_stride, p, p, p, p, p, stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_row_stride 7")));
  EXPECT_THAT(cuda::GqaAttentionBackward({1, 8, 2, 1, 8}, p, p, p, p, p, p, p, p, p, ws.get(), 16,
                                         stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace has 16 bytes")));
}

#else  // !PS_WITH_CUDA

TEST(CudaGqaAttention, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
