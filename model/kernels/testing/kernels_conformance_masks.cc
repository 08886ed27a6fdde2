// The Kernels conformance suite (kernels_conformance.h): packed documents (issue #36) and sliding
// windows (#40) — the masked attention with a per-token key_start in device memory, RoPE and
// GPT-2's learned positions with per-token position ids — each against the direct f32 CPU kernel
// and the f64 reference, gradients pre-filled to check +=. On a GPU this is where the CUDA
// kernels meet the CPU's.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/rope.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/testing/kernels_conformance.h"
#include "model/kernels/testing/kernels_conformance_util.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::kernel_testing {
namespace {

// Random documents per row (lengths 1 .. max_len): key_start[b, t] = the row position where t's
// document starts; positions[b, t] = t - key_start[b, t] (restarting at every document).
struct Packing {
  std::vector<int32_t> key_start, positions;
};
Packing RandomPacking(TestRng& rng, int64_t B, int64_t T, int64_t max_len) {
  Packing p{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t start = 0; start < T;) {
      const int64_t len = std::min<int64_t>(T - start, 1 + static_cast<int64_t>(rng() % max_len));
      for (int64_t t = start; t < start + len; ++t) {
        p.key_start[b * T + t] = static_cast<int32_t>(start);
        p.positions[b * T + t] = static_cast<int32_t>(t - start);
      }
      start += len;
    }
  }
  return p;
}

// Grouped, multi-query and multi-head (fused-strided) shapes; documents, windows and both; T
// beyond the GPU's 32-key tiles and 8-row blocks and the CPU's 64-row backward block.
TEST_P(KernelsConformanceTest, MaskedGqaAttention) {
  TestRng rng(41);
  struct Case {
    GqaAttentionShape shape;
    int64_t max_doc;  // 0: no key_start
  };
  const Case cases[] = {
      {{.batch = 2, .seq_len = 45, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8, .tile = 8},
       12},
      {{.batch = 1,
        .seq_len = 100,
        .num_heads = 4,
        .num_kv_heads = 1,
        .head_dim = 16,
        .tile = 16,
        .sliding_window = 9},
       40},
      {{.batch = 2,
        .seq_len = 70,
        .num_heads = 3,
        .num_kv_heads = 3,
        .head_dim = 8,
        .tile = 8,
        .q_row_stride = 72,
        .kv_row_stride = 72,
        .sliding_window = 5},
       25},
      {{.batch = 2,
        .seq_len = 40,
        .num_heads = 4,
        .num_kv_heads = 2,
        .head_dim = 5,
        .tile = 4,
        .sliding_window = 33},
       0},
  };
  for (const Case& c : cases) {
    const GqaAttentionShape& s = c.shape;
    SCOPED_TRACE(::testing::Message() << "T=" << s.seq_len << " window=" << s.sliding_window
                                      << " max_doc=" << c.max_doc);
    const std::vector<int32_t> ks =
        c.max_doc > 0 ? RandomPacking(rng, s.batch, s.seq_len, c.max_doc).key_start
                      : std::vector<int32_t>{};
    const int64_t nq = GqaAttentionQElems(s), nkv = GqaAttentionKvElems(s);
    const int64_t nout = s.batch * s.seq_len * s.num_heads * s.head_dim;
    const int64_t bht = s.batch * s.num_heads * s.seq_len;
    const auto q = Rand(rng, nq, -2, 2), k = Rand(rng, nkv, -2, 2), v = Rand(rng, nkv),
               dout = Rand(rng, nout), dq0 = Rand(rng, nq), dk0 = Rand(rng, nkv),
               dv0 = Rand(rng, nkv);
    const int32_t* d_ks = ks.empty() ? nullptr : Upload(ks);
    float *d_q = Upload(q), *d_k = Upload(k), *d_v = Upload(v), *d_out = Alloc<float>(nout),
          *d_lse = Alloc<float>(bht), *d_dq = Upload(dq0), *d_dk = Upload(dk0), *d_dv = Upload(dv0);
    const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
    const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
    ASSERT_OK(kernels().GqaAttentionForward(stream(), s, d_q, d_k, d_v, d_out, d_lse,
                                            Workspace(fws), fws, d_ks));
    ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_q, d_k, d_v, d_out, d_lse, Upload(dout),
                                             d_dq, d_dk, d_dv, Workspace(bws), bws, d_ks));
    std::vector<float> out(nout), lse(bht), dq = dq0, dk = dk0, dv = dv0;
    std::vector<float> ws(GqaAttentionWorkspaceElems(s, 1));
    ASSERT_OK(GqaAttentionForward<float>(s, C(q), C(k), C(v), M(out), M(lse), M(ws), nullptr, ks));
    ASSERT_OK(GqaAttentionBackward<float>(s, C(q), C(k), C(v), C(out), C(lse), C(dout), M(dq),
                                          M(dk), M(dv), nullptr, ks));
    std::vector<double> out_r(nout), lse_r(bht), dq_r = D(dq0), dk_r = D(dk0), dv_r = D(dv0),
                                                 ws_r(ws.size());
    ASSERT_OK(GqaAttentionForward<double>(s, C(D(q)), C(D(k)), C(D(v)), M(out_r), M(lse_r), M(ws_r),
                                          nullptr, ks));
    ASSERT_OK(GqaAttentionBackward<double>(s, C(D(q)), C(D(k)), C(D(v)), C(out_r), C(lse_r),
                                           C(D(dout)), M(dq_r), M(dk_r), M(dv_r), nullptr, ks));
    Check(Download(d_out, nout), out, out_r, "masked GqaAttentionForward out");
    Check(Download(d_lse, bht), lse, lse_r, "masked GqaAttentionForward lse");
    Check(Download(d_dq, nq), dq, dq_r, "masked GqaAttentionBackward dq");
    Check(Download(d_dk, nkv), dk, dk_r, "masked GqaAttentionBackward dk");
    Check(Download(d_dv, nkv), dv, dv_r, "masked GqaAttentionBackward dv");
  }
}

TEST_P(KernelsConformanceTest, RopeWithPositions) {
  TestRng rng(42);
  const RopeShape s{
      .batch = 3, .seq_len = 21, .num_heads = 3, .head_dim = 10, .table_positions = 21};
  RopeConfig config;
  config.head_dim = 10;
  config.theta = 10000.0;
  const int64_t half = s.head_dim / 2, table = s.table_positions * half;
  const int64_t n = s.batch * s.seq_len * s.num_heads * s.head_dim;
  std::vector<float> cos(table), sin(table);
  ASSERT_OK(RopeTables<float>(config, s.table_positions, M(cos), M(sin)));
  const std::vector<int32_t> positions = RandomPacking(rng, s.batch, s.seq_len, 8).positions;
  const auto x = Rand(rng, n), dx0 = Rand(rng, n);
  float *d_x = Upload(x), *d_dx = Upload(dx0), *d_cos = Upload(cos), *d_sin = Upload(sin);
  const int32_t* d_pos = Upload(positions);
  ASSERT_OK(kernels().RopeForward(stream(), s, d_cos, d_sin, d_x, d_pos));
  ASSERT_OK(kernels().RopeBackward(stream(), s, d_cos, d_sin, d_dx, d_pos));
  std::vector<float> y = x, dx = dx0;
  ASSERT_OK(RopeForward<float>(s, C(cos), C(sin), M(y), nullptr, positions));
  ASSERT_OK(RopeBackward<float>(s, C(cos), C(sin), M(dx), nullptr, positions));
  std::vector<double> y_r = D(x), dx_r = D(dx0);
  ASSERT_OK(RopeForward<double>(s, C(D(cos)), C(D(sin)), M(y_r), nullptr, positions));
  ASSERT_OK(RopeBackward<double>(s, C(D(cos)), C(D(sin)), M(dx_r), nullptr, positions));
  Check(Download(d_x, n), y, y_r, "RopeForward x (positions)");
  Check(Download(d_dx, n), dx, dx_r, "RopeBackward dx (positions)");
}

// The backward with positions sums each dwpe row's terms in (b, t) order on every implementation.
TEST_P(KernelsConformanceTest, PositionEmbeddingWithPositions) {
  TestRng rng(43);
  const int64_t B = 3, T = 37, Ch = 67, max_T = 40;
  const std::vector<int32_t> positions = RandomPacking(rng, B, T, 15).positions;
  const auto wpe = Rand(rng, max_T * Ch), out0 = Rand(rng, B * T * Ch),
             dout = Rand(rng, B * T * Ch), dwpe0 = Rand(rng, max_T * Ch);
  float *d_out = Upload(out0), *d_dwpe = Upload(dwpe0);
  const int32_t* d_pos = Upload(positions);
  ASSERT_OK(
      kernels().PositionEmbeddingForward(stream(), B, T, Ch, max_T, Upload(wpe), d_out, d_pos));
  ASSERT_OK(
      kernels().PositionEmbeddingBackward(stream(), B, T, Ch, max_T, Upload(dout), d_dwpe, d_pos));
  std::vector<float> out = out0, dwpe = dwpe0;
  ASSERT_OK(PositionEmbeddingForward<float>(B, T, Ch, C(wpe), M(out), nullptr, positions));
  ASSERT_OK(PositionEmbeddingBackward<float>(B, T, Ch, C(dout), M(dwpe), nullptr, positions));
  std::vector<double> out_r = D(out0), dwpe_r = D(dwpe0);
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t c = 0; c < Ch; ++c) {
      out_r[r * Ch + c] += wpe[positions[r] * Ch + c];
      dwpe_r[positions[r] * Ch + c] += dout[r * Ch + c];
    }
  }
  Check(Download(d_out, B * T * Ch), out, out_r, "PositionEmbeddingForward out (positions)");
  Check(Download(d_dwpe, max_T * Ch), dwpe, dwpe_r, "PositionEmbeddingBackward dwpe (positions)");
}

TEST_P(KernelsConformanceTest, RejectsNegativeSlidingWindow) {
  GqaAttentionShape s{
      .batch = 1, .seq_len = 4, .num_heads = 2, .num_kv_heads = 1, .head_dim = 4, .tile = 4};
  s.sliding_window = -2;
  float *q = Alloc<float>(32), *kv = Alloc<float>(16), *out = Alloc<float>(32),
        *lse = Alloc<float>(8);
  EXPECT_THAT(
      kernels().GqaAttentionForward(stream(), s, q, kv, kv, out, lse, Workspace(1 << 16), 1 << 16),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::HasSubstr("sliding_window -2 is negative")));
}

}  // namespace
}  // namespace ps::kernel_testing
