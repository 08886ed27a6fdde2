// The Kernels conformance suite (kernels_conformance.h): the model's entry points for large
// vocabularies and bf16 weights — bf16-weight GEMMs, embedding and LM-head blocks, touched rows,
// position embeddings — and their argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "model/kernels/embedding.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/testing/kernels_conformance.h"
#include "model/kernels/testing/kernels_conformance_util.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::kernel_testing {

using ::testing::HasSubstr;

namespace {

// --- The model's entry points: bf16-weight GEMMs and the vocabulary in row blocks --------------

// `v` rounded to bf16 bit patterns, and those widened back.
std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  ConvertF32ToBF16(v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}
std::vector<float> Widened(DType dtype, const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  if (dtype == DType::kF16) {
    ConvertF16ToF32(v.data(), out.data(), static_cast<int64_t>(v.size()));
  } else {
    ConvertBF16ToF32(v.data(), out.data(), static_cast<int64_t>(v.size()));
  }
  return out;
}
std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  return Widened(DType::kBF16, ToBf16(v));
}

TEST_P(KernelsConformanceTest, MatmulWithBf16WeightsReadInPlace) {
  TestRng rng(31);
  const MatmulShape s{.rows = 23, .in_features = 17, .out_features = 29};
  const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                io = s.in_features * s.out_features;
  const auto x = Rand(rng, ni), b = Rand(rng, s.out_features), dy = Rand(rng, no);
  const std::vector<uint16_t> w = ToBf16(Rand(rng, io));
  const auto dx0 = Rand(rng, ni), dw0 = Rand(rng, io), db0 = Rand(rng, s.out_features);
  float *d_x = Upload(x), *d_y = Alloc<float>(no);
  uint16_t* d_w = Upload(w);
  float *d_dx = Upload(dx0), *d_dw = Upload(dw0), *d_db = Upload(db0);
  const int64_t fws = kernels().MatmulBf16ForwardWorkspaceBytes(s);
  const int64_t bws = kernels().MatmulBf16BackwardWorkspaceBytes(s);
  ASSERT_OK(
      kernels().MatmulForwardBf16(stream(), s, d_x, d_w, Upload(b), d_y, Workspace(fws), fws));
  ASSERT_OK(kernels().MatmulBackwardBf16(stream(), s, d_x, d_w, Upload(dy), d_dx, d_dw, d_db,
                                         Workspace(bws), bws));
  // Direct: the CPU kernels on the host.
  std::vector<float> y(no), dx = dx0, dw = dw0, db = db0;
  std::vector<float> ws(
      std::max(MatmulBf16ForwardWorkspaceElems(s), MatmulBf16BackwardWorkspaceElems(s)));
  ASSERT_OK(MatmulForwardBf16(s, C(x), C(w), C(b), M(y), M(ws), nullptr));
  ASSERT_OK(MatmulBackwardBf16(s, C(x), C(w), C(dy), M(dx), M(dw), M(db), M(ws), nullptr));
  // Reference: f64 on the operands rounded to bf16 (the products are exact), db on the unrounded
  // dy.
  const std::vector<double> xr = D(RoundedToBf16(x)), wr = D(Widened(DType::kBF16, w)),
                            dyr = D(RoundedToBf16(dy));
  std::vector<double> y_r(no), dx_r = D(dx0), dw_r = D(dw0), db_r = D(db0), unused(s.out_features);
  ASSERT_OK(MatmulForward<double>(s, C(xr), C(wr), C(D(b)), M(y_r), nullptr));
  ASSERT_OK(MatmulBackward<double>(s, C(xr), C(wr), C(dyr), M(dx_r), M(dw_r), M(unused), nullptr));
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t o = 0; o < s.out_features; ++o) db_r[o] += dy[r * s.out_features + o];
  }
  Check(Download(d_y, no), y, y_r, "MatmulForwardBf16 y");
  Check(Download(d_dx, ni), dx, dx_r, "MatmulBackwardBf16 dx");
  Check(Download(d_dw, io), dw, dw_r, "MatmulBackwardBf16 dw");
  Check(Download(d_db, s.out_features), db, db_r, "MatmulBackwardBf16 db");
}

// A block's values in `dtype` (f32 values, or 16-bit patterns) as the device holds them, and the
// f32 values they stand for.
struct BlockData {
  std::vector<float> f32;      // dtype == kF32
  std::vector<uint16_t> bits;  // 16-bit dtypes
  std::vector<float> values;   // what the block means, widened
};
BlockData MakeBlock(TestRng& rng, DType dtype, int64_t n) {
  BlockData b;
  const std::vector<float> v = Rand(rng, n);
  if (dtype == DType::kF32) {
    b.f32 = v;
    b.values = v;
    return b;
  }
  b.bits.resize(v.size());
  if (dtype == DType::kF16) {
    ConvertF32ToF16(v.data(), b.bits.data(), n);
  } else {
    ConvertF32ToBF16(v.data(), b.bits.data(), n);
  }
  b.values = Widened(dtype, b.bits);
  return b;
}

TEST_P(KernelsConformanceTest, EmbeddingBlockForwardForEveryBlockDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    TestRng rng(32);
    // A block that does not start at row 0 and has a tail of rows no token uses.
    const VocabBlockShape s{
        .rows = 31, .channels = 13, .vocab_size = 20, .row_begin = 5, .block_rows = 7};
    std::vector<int32_t> tokens(s.rows);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % s.vocab_size);
    tokens[0] = 5, tokens[1] = 11, tokens[2] = 4, tokens[3] = 12;
    const BlockData block = MakeBlock(rng, dtype, s.block_rows * s.channels);
    const auto out0 = Rand(rng, s.rows * s.channels);
    float* d_out = Upload(out0);
    const void* d_block = dtype == DType::kF32 ? static_cast<const void*>(Upload(block.f32))
                                               : static_cast<const void*>(Upload(block.bits));
    ASSERT_OK(kernels().EmbeddingBlockForward(stream(), s, Upload(tokens), dtype, d_block, d_out));
    std::vector<float> out = out0;
    if (dtype == DType::kF32) {
      ASSERT_OK(EmbeddingBlockForward<float>(s, C(tokens), C(block.f32), M(out), nullptr));
    } else {
      ASSERT_OK(
          EmbeddingBlockForward(s, C(tokens), Block16{block.bits.data(), dtype}, M(out), nullptr));
    }
    std::vector<double> out_r = D(out0);
    for (int64_t n = 0; n < s.rows; ++n) {
      const int64_t r = tokens[n] - s.row_begin;
      if (r < 0 || r >= s.block_rows) continue;
      for (int64_t c = 0; c < s.channels; ++c) {
        out_r[n * s.channels + c] = block.values[r * s.channels + c];
      }
    }
    Check(Download(d_out, s.rows * s.channels), out, out_r, "EmbeddingBlockForward out", 0);
  }
}

TEST_P(KernelsConformanceTest, TouchedRowsScatterAndCopies) {
  TestRng rng(33);
  const int64_t N = 37, Ch = 70, V = 23;  // Ch > 64: two channel slices, the second a tail
  std::vector<int32_t> tokens(N);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  tokens[4] = tokens[9] = tokens[30] = 22;  // a repeated token in the last row
  std::vector<int32_t> slot_of_token(V, -1);
  int32_t num_slots = 0;
  for (int32_t t : tokens) {
    if (slot_of_token[t] < 0) slot_of_token[t] = num_slots++;
  }
  const TouchedRowsShape s{.channels = Ch, .vocab_size = V, .num_slots = num_slots};
  const auto dout = Rand(rng, N * Ch), rows0 = Rand(rng, num_slots * Ch);
  int32_t* d_slots = Upload(slot_of_token);
  float* d_rows = Upload(rows0);
  ASSERT_OK(
      kernels().ScatterRowsAdd(stream(), s, N, Upload(tokens), d_slots, Upload(dout), d_rows));
  std::vector<float> rows = rows0;
  ASSERT_OK(ScatterRowsAdd<float>(Ch, C(tokens), C(slot_of_token), C(dout), M(rows), nullptr));
  std::vector<double> rows_r = D(rows0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t slot = slot_of_token[tokens[n]];
    for (int64_t c = 0; c < Ch; ++c) rows_r[slot * Ch + c] += dout[n * Ch + c];
  }
  Check(Download(d_rows, num_slots * Ch), rows, rows_r, "ScatterRowsAdd slot_rows");
  rows_r = D(rows);  // the copies are exact: from here on, the f32 values are the reference

  // A tile of rows [6, 6 + 17): its touched rows go into their slots.
  const int64_t row_begin = 6, tile_rows = 17;
  const auto tile = Rand(rng, tile_rows * Ch);
  ASSERT_OK(
      kernels().CopyRowsToSlots(stream(), s, row_begin, tile_rows, d_slots, Upload(tile), d_rows));
  for (int64_t r = 0; r < tile_rows; ++r) {
    const int32_t slot = slot_of_token[row_begin + r];
    if (slot < 0) continue;
    std::copy_n(tile.begin() + r * Ch, Ch, rows.begin() + slot * Ch);
    for (int64_t c = 0; c < Ch; ++c) rows_r[slot * Ch + c] = tile[r * Ch + c];
  }
  Check(Download(d_rows, num_slots * Ch), rows, rows_r, "CopyRowsToSlots slot_rows", 0);

  // And back out of the slots into rows [3, 3 + 20) of every dtype; untouched rows stay.
  const std::vector<float> final_rows = Download(d_rows, num_slots * Ch);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    const int64_t begin = 3, n_rows = 20, e = SizeOf(dtype);
    std::vector<uint8_t> dst0(n_rows * Ch * e);
    for (auto& byte : dst0) byte = static_cast<uint8_t>(rng());
    uint8_t* d_dst = Upload(dst0);
    ASSERT_OK(kernels().CopySlotsToRows(stream(), s, begin, n_rows, d_slots, d_rows, dtype, d_dst));
    std::vector<uint8_t> expected = dst0;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int32_t slot = slot_of_token[begin + r];
      if (slot < 0) continue;
      ASSERT_OK(Convert(DType::kF32, final_rows.data() + slot * Ch, dtype,
                        expected.data() + r * Ch * e, Ch));
    }
    EXPECT_EQ(Download(d_dst, n_rows * Ch * e), expected) << "CopySlotsToRows";
  }
}

TEST_P(KernelsConformanceTest, PositionEmbedding) {
  TestRng rng(34);
  const int64_t B = 3, T = 5, Ch = 67, max_T = 7;
  const auto wpe = Rand(rng, max_T * Ch), out0 = Rand(rng, B * T * Ch),
             dout = Rand(rng, B * T * Ch), dwpe0 = Rand(rng, max_T * Ch);
  float *d_out = Upload(out0), *d_dwpe = Upload(dwpe0);
  ASSERT_OK(kernels().PositionEmbeddingForward(stream(), B, T, Ch, max_T, Upload(wpe), d_out));
  ASSERT_OK(kernels().PositionEmbeddingBackward(stream(), B, T, Ch, max_T, Upload(dout), d_dwpe));
  std::vector<float> out = out0, dwpe = dwpe0;
  ASSERT_OK(PositionEmbeddingForward<float>(B, T, Ch, C(wpe), M(out), nullptr));
  ASSERT_OK(PositionEmbeddingBackward<float>(B, T, Ch, C(dout), M(dwpe), nullptr));
  std::vector<double> out_r = D(out0), dwpe_r = D(dwpe0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < Ch; ++c) {
        out_r[(b * T + t) * Ch + c] += wpe[t * Ch + c];
        dwpe_r[t * Ch + c] += dout[(b * T + t) * Ch + c];
      }
    }
  }
  Check(Download(d_out, B * T * Ch), out, out_r, "PositionEmbeddingForward out");
  Check(Download(d_dwpe, max_T * Ch), dwpe, dwpe_r, "PositionEmbeddingBackward dwpe");
}

// The LM head over three blocks (the last one short, ending in a partial vocabulary tile) of every
// dtype; the backward called once per vocabulary tile with a one-tile dblock, as the model does.
// Direct: the CPU block kernels called once per *block* — so the per-tile calls are checked to
// give the per-block bits. Reference: the f64 whole-matrix kernel on the block's values.
TEST_P(KernelsConformanceTest, LmHeadOverVocabularyBlocksAndTiles) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    TestRng rng(35);
    const int64_t N = 21, Ch = 16, V = 150, kTile = 32;
    const std::vector<std::pair<int64_t, int64_t>> blocks = {{0, 64}, {64, 64}, {128, 22}};
    VocabBlockShape s{
        .rows = N, .channels = Ch, .vocab_size = V, .row_tile = 8, .vocab_tile = kTile};
    std::vector<int32_t> targets(N);
    for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
    targets[2] = targets[11] = s.ignore_index;
    targets[5] = 149;
    const auto h = Rand(rng, N * Ch, -2, 2), dh0 = Rand(rng, N * Ch);
    const BlockData wte = MakeBlock(rng, dtype, V * Ch);
    constexpr double kLossGrad = 1.7;
    const int64_t e = SizeOf(dtype);
    const char* d_wte = dtype == DType::kF32 ? reinterpret_cast<const char*>(Upload(wte.f32))
                                             : reinterpret_cast<const char*>(Upload(wte.bits));
    float *d_h = Upload(h), *d_dh = Upload(dh0);
    int32_t* d_targets = Upload(targets);
    float *d_state = Alloc<float>(LmHeadStateElems(s)), *d_lse = Alloc<float>(N);
    double* d_loss = Alloc<double>(1);
    float* d_dblock = Alloc<float>(kTile * Ch);
    std::vector<float> dwte(V * Ch);
    ASSERT_OK(kernels().LmHeadStateInit(stream(), s, d_state));
    for (const auto& [begin, rows] : blocks) {
      VocabBlockShape b = s;
      b.row_begin = begin, b.block_rows = rows;
      const int64_t ws = kernels().LmHeadBlockForwardWorkspaceBytes(b, dtype);
      ASSERT_OK(kernels().LmHeadBlockForward(stream(), b, d_h, dtype, d_wte + begin * Ch * e,
                                             d_targets, d_state, Workspace(ws), ws));
    }
    ASSERT_OK(kernels().LmHeadFinish(stream(), s, d_targets, d_state, d_lse, d_loss));
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      VocabBlockShape t = s;
      t.row_begin = v0, t.block_rows = std::min(kTile, V - v0);
      const int64_t ws = kernels().LmHeadBlockBackwardWorkspaceBytes(t, dtype);
      ASSERT_OK(kernels().LmHeadBlockBackward(stream(), t, d_h, dtype, d_wte + v0 * Ch * e,
                                              d_targets, d_lse, kLossGrad, d_dh, d_dblock,
                                              Workspace(ws), ws));
      const std::vector<float> tile = Download(d_dblock, t.block_rows * Ch);
      std::copy(tile.begin(), tile.end(), dwte.begin() + v0 * Ch);
    }
    // Direct, per block.
    std::vector<float> state(LmHeadStateElems(s)), lse(N), dh = dh0, dwte_direct(V * Ch);
    LmHeadStateInit<float>(M(state));
    for (const auto& [begin, rows] : blocks) {
      VocabBlockShape b = s;
      b.row_begin = begin, b.block_rows = rows;
      std::vector<float> ws(LmHeadBlockForwardWorkspaceElems(b, dtype != DType::kF32));
      if (dtype == DType::kF32) {
        ASSERT_OK(LmHeadBlockForward<float>(b, C(h), C(wte.f32).subspan(begin * Ch, rows * Ch),
                                            C(targets), M(state), M(ws), nullptr));
      } else {
        ASSERT_OK(LmHeadBlockForward(b, C(h), Block16{wte.bits.data() + begin * Ch, dtype},
                                     C(targets), M(state), M(ws), nullptr));
      }
    }
    ASSERT_OK_AND_ASSIGN(const double loss, LmHeadFinish<float>(s, C(targets), C(state), M(lse)));
    for (const auto& [begin, rows] : blocks) {
      VocabBlockShape b = s;
      b.row_begin = begin, b.block_rows = rows;
      std::vector<float> ws(LmHeadBlockBackwardWorkspaceElems(b, dtype != DType::kF32));
      auto on_tile = [&](int64_t v0, int64_t n, const float* g) {
        std::copy_n(g, n * Ch, dwte_direct.begin() + v0 * Ch);
        return absl::OkStatus();
      };
      if (dtype == DType::kF32) {
        ASSERT_OK(LmHeadBlockBackward<float>(b, C(h), C(wte.f32).subspan(begin * Ch, rows * Ch),
                                             C(targets), C(lse), kLossGrad, M(dh), M(ws), on_tile,
                                             nullptr));
      } else {
        ASSERT_OK(LmHeadBlockBackward(b, C(h), Block16{wte.bits.data() + begin * Ch, dtype},
                                      C(targets), C(lse), kLossGrad, M(dh), M(ws), on_tile,
                                      nullptr));
      }
    }
    // Reference: f64 over the whole matrix; bf16 blocks multiply bf16(h).
    const LmHeadCrossEntropyShape whole{
        .rows = N, .channels = Ch, .vocab_size = V, .row_tile = 8, .vocab_tile = kTile};
    const std::vector<double> h_r = D(dtype == DType::kBF16 ? RoundedToBf16(h) : h);
    std::vector<double> lse_r(N), dh_r = D(dh0), dwte_r(V * Ch, 0.0),
                                  ws_r(LmHeadCrossEntropyWorkspaceElems(whole));
    ASSERT_OK_AND_ASSIGN(const double loss_r,
                         LmHeadCrossEntropyForward<double>(whole, C(h_r), C(D(wte.values)),
                                                           C(targets), M(lse_r), M(ws_r), nullptr));
    ASSERT_OK(LmHeadCrossEntropyBackward<double>(whole, C(h_r), C(D(wte.values)), C(targets),
                                                 C(lse_r), kLossGrad, M(dh_r), M(dwte_r), M(ws_r),
                                                 nullptr));
    // bf16 rounds the logit gradient tile before the gradient GEMMs.
    const double tol = dtype == DType::kBF16 ? 2e-2 : 2e-4;
    const double got_loss = Download(d_loss, 1)[0];
    if (bit_identical()) {
      EXPECT_EQ(got_loss, loss);
    }
    EXPECT_NEAR(got_loss, loss_r, 1e-5 * std::abs(loss_r));
    Check(Download(d_lse, N), lse, lse_r, "LmHeadFinish lse", tol);
    Check(Download(d_dh, N * Ch), dh, dh_r, "LmHeadBlockBackward dh", tol);
    Check(dwte, dwte_direct, dwte_r, "LmHeadBlockBackward dblock", tol);
  }
}

TEST_P(KernelsConformanceTest, ModelEntryPointArgumentErrorsAreFoundAtEnqueue) {
  constexpr int64_t kN = 256;
  std::vector<float> pattern(kN, 7.0f);
  float* out = Upload(pattern);
  float* in = Upload(std::vector<float>(kN, 1.0f));
  const auto* tokens = reinterpret_cast<const int32_t*>(in);
  Kernels& k = kernels();
  Stream& s = stream();
  const auto invalid = [](absl::string_view substring) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(std::string(substring)));
  };
  const VocabBlockShape block{.rows = 2,
                              .channels = 2,
                              .vocab_size = 40,
                              .row_begin = 8,
                              .block_rows = 4,
                              .row_tile = 2,
                              .vocab_tile = 16};
  EXPECT_THAT(k.LmHeadBlockForward(s, block, in, DType::kF32, in, tokens, out, out, kN),
              invalid("LmHeadBlockForward: the block starts at row 8, not a multiple of "
                      "vocab_tile 16"));
  VocabBlockShape outside = block;
  outside.row_begin = 38;
  EXPECT_THAT(k.EmbeddingBlockForward(s, outside, tokens, DType::kF32, in, out),
              invalid("EmbeddingBlockForward: block rows [38, 42) are not inside"));
  EXPECT_THAT(k.EmbeddingBlockForward(s, block, tokens, static_cast<DType>(7), in, out),
              invalid("block_dtype"));
  const TouchedRowsShape touched{.channels = 2, .vocab_size = 40, .num_slots = 3};
  EXPECT_THAT(k.CopyRowsToSlots(s, touched, 39, 2, tokens, in, out),
              invalid("CopyRowsToSlots: rows [39, 41) are not inside"));
  EXPECT_THAT(k.CopySlotsToRows(s, touched, 0, 2, tokens, in, DType::kBF16, in + 2),
              invalid("overlap"));
  EXPECT_THAT(k.ScatterRowsAdd(s, touched, 0, tokens, tokens, in, out),
              invalid("num_tokens must be positive"));
  EXPECT_THAT(k.PositionEmbeddingForward(s, 1, 9, 2, 8, in, out), invalid("exceeds max_seq_len"));
  EXPECT_THAT(
      k.LmHeadBlockBackward(s, {.rows = 2, .channels = 2, .vocab_size = 4, .block_rows = 4}, in,
                            DType::kF32, in, tokens, in, 1.0, out, out + 2, out, kN * 4),
      invalid("dh and dblock overlap"));
  const MatmulShape mm{.rows = 4, .in_features = 4, .out_features = 4};
  const int64_t needed = k.MatmulBf16ForwardWorkspaceBytes(mm);
  if (needed > 0) {
    EXPECT_THAT(k.MatmulForwardBf16(s, mm, in, reinterpret_cast<const uint16_t*>(in), in, out,
                                    Workspace(needed), needed - 1),
                invalid("workspace has"));
  }
  EXPECT_THAT(k.MatmulForwardBf16(s, mm, in, nullptr, in, out, Workspace(needed), needed),
              invalid("MatmulForwardBf16: w is null"));
  EXPECT_EQ(Download(out, kN), pattern);
}

}  // namespace
}  // namespace ps::kernel_testing
