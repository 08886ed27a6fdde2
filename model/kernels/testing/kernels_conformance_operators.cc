// The Kernels conformance suite (kernels_conformance.h): the GPT-2 and Llama operators, each
// against the direct f32 CPU kernel and the f64 reference, gradients pre-filled to check +=.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "model/kernels/embedding.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/testing/kernels_conformance.h"
#include "model/kernels/testing/kernels_conformance_util.h"

namespace ps::kernel_testing {
namespace {

// --- GPT-2
// ----------------------------------------------------------------------------------------

TEST_P(KernelsConformanceTest, Encoder) {
  TestRng rng(4);
  const EncoderShape s{
      .batch = 3, .seq_len = 5, .channels = 13, .vocab_size = 11, .max_seq_len = 7};
  const int64_t bt = s.batch * s.seq_len, btc = bt * s.channels;
  std::vector<int32_t> tokens(bt);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 4);  // many repeats
  tokens.back() = 10;
  const auto wte = Rand(rng, s.vocab_size * s.channels),
             wpe = Rand(rng, s.max_seq_len * s.channels);
  const auto dout = Rand(rng, btc);
  const auto dwte0 = Rand(rng, s.vocab_size * s.channels),
             dwpe0 = Rand(rng, s.max_seq_len * s.channels);
  int32_t* d_tokens = Upload(tokens);
  float* d_out = Alloc<float>(btc);
  float *d_dwte = Upload(dwte0), *d_dwpe = Upload(dwpe0);
  ASSERT_OK(kernels().EncoderForward(stream(), s, d_tokens, Upload(wte), Upload(wpe), d_out));
  ASSERT_OK(kernels().EncoderBackward(stream(), s, d_tokens, Upload(dout), d_dwte, d_dwpe));

  std::vector<float> out(btc), dwte = dwte0, dwpe = dwpe0;
  ASSERT_OK(EncoderForward<float>(s, C(tokens), C(wte), C(wpe), M(out), nullptr));
  ASSERT_OK(EncoderBackward<float>(s, C(tokens), C(dout), M(dwte), M(dwpe), nullptr));
  std::vector<double> out_r(btc), dwte_r = D(dwte0), dwpe_r = D(dwpe0);
  ASSERT_OK(EncoderForward<double>(s, C(tokens), C(D(wte)), C(D(wpe)), M(out_r), nullptr));
  ASSERT_OK(EncoderBackward<double>(s, C(tokens), C(D(dout)), M(dwte_r), M(dwpe_r), nullptr));
  Check(Download(d_out, btc), out, out_r, "EncoderForward out");
  Check(Download(d_dwte, s.vocab_size * s.channels), dwte, dwte_r, "EncoderBackward dwte");
  Check(Download(d_dwpe, s.max_seq_len * s.channels), dwpe, dwpe_r, "EncoderBackward dwpe");
}

TEST_P(KernelsConformanceTest, LayerNorm) {
  TestRng rng(5);
  for (const LayerNormShape s :
       {LayerNormShape{.rows = 37, .channels = 19}, LayerNormShape{.rows = 5, .channels = 131}}) {
    const int64_t nc = s.rows * s.channels;
    const auto x = Rand(rng, nc, -3, 3), w = Rand(rng, s.channels), b = Rand(rng, s.channels);
    const auto dy = Rand(rng, nc), dx0 = Rand(rng, nc);
    const auto dw0 = Rand(rng, s.channels), db0 = Rand(rng, s.channels);
    float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(nc);
    float *d_mean = Alloc<float>(s.rows), *d_rstd = Alloc<float>(s.rows);
    float *d_dx = Upload(dx0), *d_dw = Upload(dw0), *d_db = Upload(db0);
    ASSERT_OK(kernels().LayerNormForward(stream(), s, d_x, d_w, Upload(b), d_y, d_mean, d_rstd));
    ASSERT_OK(kernels().LayerNormBackward(stream(), s, d_x, d_w, d_mean, d_rstd, Upload(dy), d_dx,
                                          d_dw, d_db));

    std::vector<float> y(nc), mean(s.rows), rstd(s.rows), dx = dx0, dw = dw0, db = db0;
    ASSERT_OK(LayerNormForward<float>(s, C(x), C(w), C(b), M(y), M(mean), M(rstd), nullptr));
    ASSERT_OK(LayerNormBackward<float>(s, C(x), C(w), C(mean), C(rstd), C(dy), M(dx), M(dw), M(db),
                                       nullptr));
    std::vector<double> y_r(nc), mean_r(s.rows), rstd_r(s.rows), dx_r = D(dx0), dw_r = D(dw0),
                                                                 db_r = D(db0);
    ASSERT_OK(LayerNormForward<double>(s, C(D(x)), C(D(w)), C(D(b)), M(y_r), M(mean_r), M(rstd_r),
                                       nullptr));
    ASSERT_OK(LayerNormBackward<double>(s, C(D(x)), C(D(w)), C(mean_r), C(rstd_r), C(D(dy)),
                                        M(dx_r), M(dw_r), M(db_r), nullptr));
    const std::string c = absl::StrCat(" C=", s.channels);
    Check(Download(d_y, nc), y, y_r, "LayerNormForward y" + c);
    Check(Download(d_mean, s.rows), mean, mean_r, "LayerNormForward mean" + c);
    Check(Download(d_rstd, s.rows), rstd, rstd_r, "LayerNormForward rstd" + c);
    Check(Download(d_dx, nc), dx, dx_r, "LayerNormBackward dx" + c);
    Check(Download(d_dw, s.channels), dw, dw_r, "LayerNormBackward dw" + c);
    Check(Download(d_db, s.channels), db, db_r, "LayerNormBackward db" + c);
  }
}

TEST_P(KernelsConformanceTest, Matmul) {
  TestRng rng(6);
  const MatmulShape s{.rows = 23, .in_features = 17, .out_features = 29};
  const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                io = s.in_features * s.out_features;
  const auto x = Rand(rng, ni), w = Rand(rng, io), b = Rand(rng, s.out_features);
  const auto dy = Rand(rng, no), dx0 = Rand(rng, ni), dw0 = Rand(rng, io),
             db0 = Rand(rng, s.out_features);
  float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(no);
  float *d_dx = Upload(dx0), *d_dw = Upload(dw0), *d_db = Upload(db0);
  const int64_t ws = kernels().MatmulWorkspaceBytes(s);
  void* d_ws = Workspace(ws);
  ASSERT_OK(kernels().MatmulForward(stream(), s, d_x, d_w, Upload(b), d_y, d_ws, ws));
  ASSERT_OK(
      kernels().MatmulBackward(stream(), s, d_x, d_w, Upload(dy), d_dx, d_dw, d_db, d_ws, ws));
  std::vector<float> y(no), dx = dx0, dw = dw0, db = db0;
  ASSERT_OK(MatmulForward<float>(s, C(x), C(w), C(b), M(y), nullptr));
  ASSERT_OK(MatmulBackward<float>(s, C(x), C(w), C(dy), M(dx), M(dw), M(db), nullptr));
  std::vector<double> y_r(no), dx_r = D(dx0), dw_r = D(dw0), db_r = D(db0);
  ASSERT_OK(MatmulForward<double>(s, C(D(x)), C(D(w)), C(D(b)), M(y_r), nullptr));
  ASSERT_OK(
      MatmulBackward<double>(s, C(D(x)), C(D(w)), C(D(dy)), M(dx_r), M(dw_r), M(db_r), nullptr));
  Check(Download(d_y, no), y, y_r, "MatmulForward y");
  Check(Download(d_dx, ni), dx, dx_r, "MatmulBackward dx");
  Check(Download(d_dw, io), dw, dw_r, "MatmulBackward dw");
  Check(Download(d_db, s.out_features), db, db_r, "MatmulBackward db");
}

TEST_P(KernelsConformanceTest, GeluAndResidual) {
  TestRng rng(7);
  constexpr int64_t kN = 1031;
  const auto x = Rand(rng, kN, -4, 4), x2 = Rand(rng, kN), dy = Rand(rng, kN), dx0 = Rand(rng, kN),
             db0 = Rand(rng, kN);
  float *d_x = Upload(x), *d_x2 = Upload(x2), *d_dy = Upload(dy);
  float *d_y = Alloc<float>(kN), *d_dx = Upload(dx0), *d_sum = Alloc<float>(kN);
  float *d_da = Upload(dx0), *d_db = Upload(db0);
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_x, d_y));
  ASSERT_OK(kernels().GeluBackward(stream(), kN, d_x, d_dy, d_dx));
  ASSERT_OK(kernels().ResidualForward(stream(), kN, d_x, d_x2, d_sum));
  ASSERT_OK(kernels().ResidualBackward(stream(), kN, d_dy, d_da, d_db));
  // In place: y may equal x, out may equal a.
  float* d_inplace = Upload(x);
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_inplace, d_inplace));

  std::vector<float> y(kN), dx = dx0, sum(kN), da = dx0, db = db0;
  ASSERT_OK(GeluForward<float>(C(x), M(y), nullptr));
  ASSERT_OK(GeluBackward<float>(C(x), C(dy), M(dx), nullptr));
  ASSERT_OK(ResidualForward<float>(C(x), C(x2), M(sum), nullptr));
  ASSERT_OK(ResidualBackward<float>(C(dy), M(da), M(db), nullptr));
  std::vector<double> y_r(kN), dx_r = D(dx0), sum_r(kN), da_r = D(dx0), db_r = D(db0);
  ASSERT_OK(GeluForward<double>(C(D(x)), M(y_r), nullptr));
  ASSERT_OK(GeluBackward<double>(C(D(x)), C(D(dy)), M(dx_r), nullptr));
  ASSERT_OK(ResidualForward<double>(C(D(x)), C(D(x2)), M(sum_r), nullptr));
  ASSERT_OK(ResidualBackward<double>(C(D(dy)), M(da_r), M(db_r), nullptr));
  Check(Download(d_y, kN), y, y_r, "GeluForward y");
  Check(Download(d_inplace, kN), y, y_r, "GeluForward in place");
  Check(Download(d_dx, kN), dx, dx_r, "GeluBackward dx");
  Check(Download(d_sum, kN), sum, sum_r, "ResidualForward out");
  Check(Download(d_da, kN), da, da_r, "ResidualBackward da");
  Check(Download(d_db, kN), db, db_r, "ResidualBackward db");
}

// GPT-2's multi-head attention: kv heads = heads, q, k and v read from the fused qkv [B, T, 3C]
// (C = 24) through row strides of 3C, the gradients written likewise into one dqkv.
TEST_P(KernelsConformanceTest, MultiHeadAttentionOnAFusedQkv) {
  TestRng rng(8);
  const GqaAttentionShape s{.batch = 2,
                            .seq_len = 19,
                            .num_heads = 3,
                            .num_kv_heads = 3,
                            .head_dim = 8,
                            .tile = 8,
                            .q_row_stride = 72,
                            .kv_row_stride = 72};
  const int64_t c = s.num_heads * s.head_dim;
  const int64_t btc = s.batch * s.seq_len * c, bht = s.batch * s.num_heads * s.seq_len;
  const auto qkv = Rand(rng, 3 * btc, -2, 2), dout = Rand(rng, btc), dqkv0 = Rand(rng, 3 * btc);
  float *d_qkv = Upload(qkv), *d_out = Alloc<float>(btc), *d_lse = Alloc<float>(bht);
  float* d_dqkv = Upload(dqkv0);
  const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
  const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
  ASSERT_OK(kernels().GqaAttentionForward(stream(), s, d_qkv, d_qkv + c, d_qkv + 2 * c, d_out,
                                          d_lse, Workspace(fws), fws));
  ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_qkv, d_qkv + c, d_qkv + 2 * c, d_out,
                                           d_lse, Upload(dout), d_dqkv, d_dqkv + c, d_dqkv + 2 * c,
                                           Workspace(bws), bws));
  std::vector<float> out(btc), lse(bht), dqkv = dqkv0;
  std::vector<float> ws(GqaAttentionWorkspaceElems(s, 1));
  ASSERT_OK(FusedQkvAttentionForward<float>(s, C(qkv), M(out), M(lse), M(ws)));
  ASSERT_OK(FusedQkvAttentionBackward<float>(s, C(qkv), C(out), C(lse), C(dout), M(dqkv)));
  std::vector<double> out_r(btc), lse_r(bht), dqkv_r = D(dqkv0), ws_r(ws.size());
  ASSERT_OK(FusedQkvAttentionForward<double>(s, C(D(qkv)), M(out_r), M(lse_r), M(ws_r)));
  ASSERT_OK(
      FusedQkvAttentionBackward<double>(s, C(D(qkv)), C(out_r), C(lse_r), C(D(dout)), M(dqkv_r)));
  Check(Download(d_out, btc), out, out_r, "GqaAttentionForward out (fused qkv)");
  Check(Download(d_lse, bht), lse, lse_r, "GqaAttentionForward lse (fused qkv)");
  Check(Download(d_dqkv, 3 * btc), dqkv, dqkv_r, "GqaAttentionBackward dqkv (fused qkv)");
}

TEST_P(KernelsConformanceTest, LmHeadCrossEntropy) {
  TestRng rng(9);
  const LmHeadCrossEntropyShape s{
      .rows = 21, .channels = 16, .vocab_size = 150, .row_tile = 8, .vocab_tile = 64};
  const int64_t nc = s.rows * s.channels, vc = s.vocab_size * s.channels;
  std::vector<int32_t> targets(s.rows);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % s.vocab_size);
  targets[2] = targets[11] = s.ignore_index;
  const auto h = Rand(rng, nc, -2, 2), wte = Rand(rng, vc), dh0 = Rand(rng, nc),
             dwte0 = Rand(rng, vc);
  constexpr double kLossGrad = 1.7;
  float *d_h = Upload(h), *d_wte = Upload(wte), *d_lse = Alloc<float>(s.rows);
  float *d_dh = Upload(dh0), *d_dwte = Upload(dwte0);
  int32_t* d_targets = Upload(targets);
  double* d_loss = Alloc<double>(1);
  const int64_t ws = kernels().LmHeadCrossEntropyWorkspaceBytes(s);
  void* d_ws = Workspace(ws);
  ASSERT_OK(kernels().LmHeadCrossEntropyForward(stream(), s, d_h, d_wte, d_targets, d_lse, d_loss,
                                                d_ws, ws));
  ASSERT_OK(kernels().LmHeadCrossEntropyBackward(stream(), s, d_h, d_wte, d_targets, d_lse,
                                                 kLossGrad, d_dh, d_dwte, d_ws, ws));
  std::vector<float> lse(s.rows), dh = dh0, dwte = dwte0;
  std::vector<float> ws_f(LmHeadCrossEntropyWorkspaceElems(s));
  ASSERT_OK_AND_ASSIGN(
      const double loss,
      LmHeadCrossEntropyForward<float>(s, C(h), C(wte), C(targets), M(lse), M(ws_f), nullptr));
  ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, C(h), C(wte), C(targets), C(lse), kLossGrad, M(dh),
                                              M(dwte), M(ws_f), nullptr));
  std::vector<double> lse_r(s.rows), dh_r = D(dh0), dwte_r = D(dwte0), ws_r(ws_f.size());
  ASSERT_OK_AND_ASSIGN(const double loss_r,
                       LmHeadCrossEntropyForward<double>(s, C(D(h)), C(D(wte)), C(targets),
                                                         M(lse_r), M(ws_r), nullptr));
  ASSERT_OK(LmHeadCrossEntropyBackward<double>(s, C(D(h)), C(D(wte)), C(targets), C(lse_r),
                                               kLossGrad, M(dh_r), M(dwte_r), M(ws_r), nullptr));
  const double got_loss = Download(d_loss, 1)[0];
  if (bit_identical()) {
    EXPECT_EQ(got_loss, loss);
  }
  EXPECT_NEAR(got_loss, loss_r, 1e-5 * std::abs(loss_r));
  Check(Download(d_lse, s.rows), lse, lse_r, "LmHeadCrossEntropyForward lse");
  Check(Download(d_dh, nc), dh, dh_r, "LmHeadCrossEntropyBackward dh");
  Check(Download(d_dwte, vc), dwte, dwte_r, "LmHeadCrossEntropyBackward dwte");
}

// --- Llama / Qwen2 / Mistral
// ----------------------------------------------------------------------

TEST_P(KernelsConformanceTest, RmsNorm) {
  TestRng rng(10);
  const RmsNormShape s{.rows = 29, .channels = 45, .eps = 1e-6};
  const int64_t nc = s.rows * s.channels;
  const auto x = Rand(rng, nc, -2, 2), w = Rand(rng, s.channels), dy = Rand(rng, nc),
             dx0 = Rand(rng, nc), dw0 = Rand(rng, s.channels);
  float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(nc), *d_rstd = Alloc<float>(s.rows);
  float *d_dx = Upload(dx0), *d_dw = Upload(dw0);
  ASSERT_OK(kernels().RmsNormForward(stream(), s, d_x, d_w, d_y, d_rstd));
  ASSERT_OK(kernels().RmsNormBackward(stream(), s, d_x, d_w, d_rstd, Upload(dy), d_dx, d_dw));
  std::vector<float> y(nc), rstd(s.rows), dx = dx0, dw = dw0;
  ASSERT_OK(RmsNormForward<float>(s, C(x), C(w), M(y), M(rstd), nullptr));
  ASSERT_OK(RmsNormBackward<float>(s, C(x), C(w), C(rstd), C(dy), M(dx), M(dw), nullptr));
  std::vector<double> y_r(nc), rstd_r(s.rows), dx_r = D(dx0), dw_r = D(dw0);
  ASSERT_OK(RmsNormForward<double>(s, C(D(x)), C(D(w)), M(y_r), M(rstd_r), nullptr));
  ASSERT_OK(
      RmsNormBackward<double>(s, C(D(x)), C(D(w)), C(rstd_r), C(D(dy)), M(dx_r), M(dw_r), nullptr));
  Check(Download(d_y, nc), y, y_r, "RmsNormForward y");
  Check(Download(d_rstd, s.rows), rstd, rstd_r, "RmsNormForward rstd");
  Check(Download(d_dx, nc), dx, dx_r, "RmsNormBackward dx");
  Check(Download(d_dw, s.channels), dw, dw_r, "RmsNormBackward dw");
}

TEST_P(KernelsConformanceTest, Rope) {
  TestRng rng(11);
  const RopeShape s{
      .batch = 2, .seq_len = 9, .num_heads = 3, .head_dim = 10, .table_positions = 12};
  RopeConfig config;
  config.head_dim = 10;
  config.theta = 10000.0;
  const int64_t half = s.head_dim / 2, table = s.table_positions * half;
  const int64_t n = s.batch * s.seq_len * s.num_heads * s.head_dim;
  std::vector<float> cos(table), sin(table);
  ASSERT_OK(RopeTables<float>(config, s.table_positions, M(cos), M(sin)));
  std::vector<double> cos_r(table), sin_r(table);
  ASSERT_OK(RopeTables<double>(config, s.table_positions, M(cos_r), M(sin_r)));
  const auto x = Rand(rng, n), dx0 = Rand(rng, n);
  float *d_cos = Upload(cos), *d_sin = Upload(sin), *d_x = Upload(x), *d_dx = Upload(dx0);
  ASSERT_OK(kernels().RopeForward(stream(), s, d_cos, d_sin, d_x));
  ASSERT_OK(kernels().RopeBackward(stream(), s, d_cos, d_sin, d_dx));
  std::vector<float> y = x, dx = dx0;
  ASSERT_OK(RopeForward<float>(s, C(cos), C(sin), M(y), nullptr));
  ASSERT_OK(RopeBackward<float>(s, C(cos), C(sin), M(dx), nullptr));
  // The reference rotates in double with the f32 tables widened (what the f32 kernels use).
  std::vector<double> y_r = D(x), dx_r = D(dx0);
  ASSERT_OK(RopeForward<double>(s, C(D(cos)), C(D(sin)), M(y_r), nullptr));
  ASSERT_OK(RopeBackward<double>(s, C(D(cos)), C(D(sin)), M(dx_r), nullptr));
  Check(Download(d_x, n), y, y_r, "RopeForward x");
  Check(Download(d_dx, n), dx, dx_r, "RopeBackward dx");
}

TEST_P(KernelsConformanceTest, SwiGlu) {
  TestRng rng(12);
  constexpr int64_t kN = 1031;
  const auto g = Rand(rng, kN, -5, 5), u = Rand(rng, kN), dh = Rand(rng, kN), dg0 = Rand(rng, kN),
             du0 = Rand(rng, kN);
  float *d_g = Upload(g), *d_u = Upload(u), *d_h = Alloc<float>(kN);
  float *d_dg = Upload(dg0), *d_du = Upload(du0);
  ASSERT_OK(kernels().SwiGluForward(stream(), kN, d_g, d_u, d_h));
  ASSERT_OK(kernels().SwiGluBackward(stream(), kN, d_g, d_u, Upload(dh), d_dg, d_du));
  std::vector<float> h(kN), dg = dg0, du = du0;
  ASSERT_OK(SwiGluForward<float>(C(g), C(u), M(h), nullptr));
  ASSERT_OK(SwiGluBackward<float>(C(g), C(u), C(dh), M(dg), M(du), nullptr));
  std::vector<double> h_r(kN), dg_r = D(dg0), du_r = D(du0);
  ASSERT_OK(SwiGluForward<double>(C(D(g)), C(D(u)), M(h_r), nullptr));
  ASSERT_OK(SwiGluBackward<double>(C(D(g)), C(D(u)), C(D(dh)), M(dg_r), M(du_r), nullptr));
  Check(Download(d_h, kN), h, h_r, "SwiGluForward h");
  Check(Download(d_dg, kN), dg, dg_r, "SwiGluBackward dg");
  Check(Download(d_du, kN), du, du_r, "SwiGluBackward du");
}

// Gemma's embedding multiplier: x *= alpha, one rounded product per element (exact against the
// f32 product of the same operands).
TEST_P(KernelsConformanceTest, ScaleInPlace) {
  TestRng rng(22);
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{40000}}) {
    const auto x = Rand(rng, n, -50, 50);
    const float alpha = static_cast<float>(std::sqrt(640.0));
    float* d_x = Upload(x);
    ASSERT_OK(kernels().ScaleInPlace(stream(), n, alpha, d_x));
    const std::vector<float> got = Download(d_x, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i] * alpha) << i << " of " << n;
  }
}

// Gemma's GeGLU: the SwiGLU kernel with the tanh GELU gate.
TEST_P(KernelsConformanceTest, GeGlu) {
  TestRng rng(21);
  constexpr int64_t kN = 1031;
  const auto g = Rand(rng, kN, -6, 6), u = Rand(rng, kN), dh = Rand(rng, kN), dg0 = Rand(rng, kN),
             du0 = Rand(rng, kN);
  constexpr GateActivation kGelu = GateActivation::kGeluTanh;
  float *d_g = Upload(g), *d_u = Upload(u), *d_h = Alloc<float>(kN);
  float *d_dg = Upload(dg0), *d_du = Upload(du0);
  ASSERT_OK(kernels().SwiGluForward(stream(), kN, d_g, d_u, d_h, kGelu));
  ASSERT_OK(kernels().SwiGluBackward(stream(), kN, d_g, d_u, Upload(dh), d_dg, d_du, kGelu));
  std::vector<float> h(kN), dg = dg0, du = du0;
  ASSERT_OK(SwiGluForward<float>(C(g), C(u), M(h), nullptr, kGelu));
  ASSERT_OK(SwiGluBackward<float>(C(g), C(u), C(dh), M(dg), M(du), nullptr, kGelu));
  std::vector<double> h_r(kN), dg_r = D(dg0), du_r = D(du0);
  ASSERT_OK(SwiGluForward<double>(C(D(g)), C(D(u)), M(h_r), nullptr, kGelu));
  ASSERT_OK(SwiGluBackward<double>(C(D(g)), C(D(u)), C(D(dh)), M(dg_r), M(du_r), nullptr, kGelu));
  Check(Download(d_h, kN), h, h_r, "GeGluForward h");
  Check(Download(d_dg, kN), dg, dg_r, "GeGluBackward dg");
  Check(Download(d_du, kN), du, du_r, "GeGluBackward du");
}

TEST_P(KernelsConformanceTest, GqaAttention) {
  TestRng rng(13);
  const GqaAttentionShape s{
      .batch = 2, .seq_len = 17, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8, .tile = 8};
  const int64_t bt = s.batch * s.seq_len, nq = bt * s.num_heads * s.head_dim,
                nkv = bt * s.num_kv_heads * s.head_dim, bht = s.batch * s.num_heads * s.seq_len;
  const auto q = Rand(rng, nq, -2, 2), k = Rand(rng, nkv, -2, 2), v = Rand(rng, nkv),
             dout = Rand(rng, nq), dq0 = Rand(rng, nq), dk0 = Rand(rng, nkv), dv0 = Rand(rng, nkv);
  float *d_q = Upload(q), *d_k = Upload(k), *d_v = Upload(v), *d_out = Alloc<float>(nq),
        *d_lse = Alloc<float>(bht), *d_dq = Upload(dq0), *d_dk = Upload(dk0), *d_dv = Upload(dv0);
  const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
  const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
  ASSERT_OK(
      kernels().GqaAttentionForward(stream(), s, d_q, d_k, d_v, d_out, d_lse, Workspace(fws), fws));
  ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_q, d_k, d_v, d_out, d_lse, Upload(dout),
                                           d_dq, d_dk, d_dv, Workspace(bws), bws));
  std::vector<float> out(nq), lse(bht), dq = dq0, dk = dk0, dv = dv0;
  std::vector<float> ws(GqaAttentionWorkspaceElems(s, 1));
  ASSERT_OK(GqaAttentionForward<float>(s, C(q), C(k), C(v), M(out), M(lse), M(ws), nullptr));
  ASSERT_OK(GqaAttentionBackward<float>(s, C(q), C(k), C(v), C(out), C(lse), C(dout), M(dq), M(dk),
                                        M(dv), nullptr));
  std::vector<double> out_r(nq), lse_r(bht), dq_r = D(dq0), dk_r = D(dk0), dv_r = D(dv0),
                                             ws_r(ws.size());
  ASSERT_OK(GqaAttentionForward<double>(s, C(D(q)), C(D(k)), C(D(v)), M(out_r), M(lse_r), M(ws_r),
                                        nullptr));
  ASSERT_OK(GqaAttentionBackward<double>(s, C(D(q)), C(D(k)), C(D(v)), C(out_r), C(lse_r),
                                         C(D(dout)), M(dq_r), M(dk_r), M(dv_r), nullptr));
  Check(Download(d_out, nq), out, out_r, "GqaAttentionForward out");
  Check(Download(d_lse, bht), lse, lse_r, "GqaAttentionForward lse");
  Check(Download(d_dq, nq), dq, dq_r, "GqaAttentionBackward dq");
  Check(Download(d_dk, nkv), dk, dk_r, "GqaAttentionBackward dk");
  Check(Download(d_dv, nkv), dv, dv_r, "GqaAttentionBackward dv");
}

// q, k and v as strided views into one fused projection [B, T, (Hq + 2 Hkv) D] (the layout of
// GPT-2's qkv, here with grouped heads), the gradients likewise into one buffer.
TEST_P(KernelsConformanceTest, GqaAttentionOnAFusedProjection) {
  TestRng rng(20);
  GqaAttentionShape s{
      .batch = 2, .seq_len = 17, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8, .tile = 8};
  const int64_t qd = s.num_heads * s.head_dim, kvd = s.num_kv_heads * s.head_dim;
  const int64_t width = qd + 2 * kvd;
  s.q_row_stride = s.kv_row_stride = width;
  const int64_t bt = s.batch * s.seq_len, n = bt * width, nout = bt * qd,
                bht = s.batch * s.num_heads * s.seq_len;
  const int64_t nq = GqaAttentionQElems(s), nkv = GqaAttentionKvElems(s);
  const auto qkv = Rand(rng, n, -2, 2), dout = Rand(rng, nout), dqkv0 = Rand(rng, n);
  float *d_qkv = Upload(qkv), *d_out = Alloc<float>(nout), *d_lse = Alloc<float>(bht),
        *d_dqkv = Upload(dqkv0);
  const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
  const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
  ASSERT_OK(kernels().GqaAttentionForward(stream(), s, d_qkv, d_qkv + qd, d_qkv + qd + kvd, d_out,
                                          d_lse, Workspace(fws), fws));
  ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_qkv, d_qkv + qd, d_qkv + qd + kvd, d_out,
                                           d_lse, Upload(dout), d_dqkv, d_dqkv + qd,
                                           d_dqkv + qd + kvd, Workspace(bws), bws));
  auto run = [&](auto zero, const auto& in, const auto& d_out_host, auto& out, auto& lse,
                 auto& dqkv, auto& ws) {
    using T = decltype(zero);
    const absl::Span<const T> x(in);
    const absl::Span<T> dx = absl::MakeSpan(dqkv);
    ASSERT_OK(GqaAttentionForward<T>(s, x.subspan(0, nq), x.subspan(qd, nkv),
                                     x.subspan(qd + kvd, nkv), M(out), M(lse), M(ws), nullptr));
    ASSERT_OK(GqaAttentionBackward<T>(
        s, x.subspan(0, nq), x.subspan(qd, nkv), x.subspan(qd + kvd, nkv), C(out), C(lse),
        C(d_out_host), dx.subspan(0, nq), dx.subspan(qd, nkv), dx.subspan(qd + kvd, nkv), nullptr));
  };
  std::vector<float> out(nout), lse(bht), dqkv = dqkv0, ws(GqaAttentionWorkspaceElems(s, 1));
  run(0.0f, qkv, dout, out, lse, dqkv, ws);
  std::vector<double> out_r(nout), lse_r(bht), dqkv_r = D(dqkv0), ws_r(ws.size());
  run(0.0, D(qkv), D(dout), out_r, lse_r, dqkv_r, ws_r);
  Check(Download(d_out, nout), out, out_r, "GqaAttentionForward out (fused projection)");
  Check(Download(d_lse, bht), lse, lse_r, "GqaAttentionForward lse (fused projection)");
  Check(Download(d_dqkv, n), dqkv, dqkv_r, "GqaAttentionBackward dqkv (fused projection)");
}

TEST_P(KernelsConformanceTest, LinearWithAndWithoutBias) {
  TestRng rng(14);
  for (bool bias : {false, true}) {
    const LinearShape s{.rows = 19, .in_features = 23, .out_features = 14, .bias = bias};
    const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                  oi = s.out_features * s.in_features;
    const auto x = Rand(rng, ni), w = Rand(rng, oi), b = Rand(rng, s.out_features),
               dy = Rand(rng, no), dx0 = Rand(rng, ni), dw0 = Rand(rng, oi),
               db0 = Rand(rng, s.out_features);
    float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(no), *d_dx = Upload(dx0),
          *d_dw = Upload(dw0), *d_db = Upload(db0);
    const int64_t ws = kernels().LinearWorkspaceBytes(s);
    void* d_ws = Workspace(ws);
    ASSERT_OK(
        kernels().LinearForward(stream(), s, d_x, d_w, bias ? Upload(b) : nullptr, d_y, d_ws, ws));
    ASSERT_OK(kernels().LinearBackward(stream(), s, d_x, d_w, Upload(dy), d_dx, d_dw,
                                       bias ? d_db : nullptr, d_ws, ws));
    std::vector<float> y(no), dx = dx0, dw = dw0, db = db0;
    const absl::Span<const float> b_span = bias ? C(b) : absl::Span<const float>();
    const absl::Span<float> db_span = bias ? M(db) : absl::Span<float>();
    ASSERT_OK(LinearForward<float>(s, C(x), C(w), b_span, M(y), nullptr));
    ASSERT_OK(LinearBackward<float>(s, C(x), C(w), C(dy), M(dx), M(dw), db_span, nullptr));
    const std::vector<double> b_d = D(b);
    std::vector<double> y_r(no), dx_r = D(dx0), dw_r = D(dw0), db_r = D(db0);
    ASSERT_OK(LinearForward<double>(s, C(D(x)), C(D(w)), bias ? C(b_d) : absl::Span<const double>(),
                                    M(y_r), nullptr));
    ASSERT_OK(LinearBackward<double>(s, C(D(x)), C(D(w)), C(D(dy)), M(dx_r), M(dw_r),
                                     bias ? M(db_r) : absl::Span<double>(), nullptr));
    const std::string tag = bias ? " (bias)" : " (no bias)";
    Check(Download(d_y, no), y, y_r, "LinearForward y" + tag);
    Check(Download(d_dx, ni), dx, dx_r, "LinearBackward dx" + tag);
    Check(Download(d_dw, oi), dw, dw_r, "LinearBackward dw" + tag);
    // Without a bias, db is neither read nor written.
    Check(Download(d_db, s.out_features), db, db_r, "LinearBackward db" + tag);
  }
}

TEST_P(KernelsConformanceTest, EmbeddingWithPadding) {
  TestRng rng(15);
  const EmbeddingShape s{.rows = 31, .channels = 11, .vocab_size = 9, .padding_idx = 3};
  std::vector<int32_t> tokens(s.rows);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % s.vocab_size);
  tokens[0] = tokens[5] = 3;
  const int64_t vc = s.vocab_size * s.channels, nc = s.rows * s.channels;
  const auto wte = Rand(rng, vc), dout = Rand(rng, nc), dwte0 = Rand(rng, vc);
  int32_t* d_tokens = Upload(tokens);
  float *d_out = Alloc<float>(nc), *d_dwte = Upload(dwte0);
  ASSERT_OK(kernels().EmbeddingForward(stream(), s, d_tokens, Upload(wte), d_out));
  ASSERT_OK(kernels().EmbeddingBackward(stream(), s, d_tokens, Upload(dout), d_dwte));
  std::vector<float> out(nc), dwte = dwte0;
  ASSERT_OK(EmbeddingForward<float>(s, C(tokens), C(wte), M(out), nullptr));
  ASSERT_OK(EmbeddingBackward<float>(s, C(tokens), C(dout), M(dwte), nullptr));
  std::vector<double> out_r(nc), dwte_r = D(dwte0);
  ASSERT_OK(EmbeddingForward<double>(s, C(tokens), C(D(wte)), M(out_r), nullptr));
  ASSERT_OK(EmbeddingBackward<double>(s, C(tokens), C(D(dout)), M(dwte_r), nullptr));
  Check(Download(d_out, nc), out, out_r, "EmbeddingForward out");
  Check(Download(d_dwte, vc), dwte, dwte_r, "EmbeddingBackward dwte");
}

}  // namespace
}  // namespace ps::kernel_testing
