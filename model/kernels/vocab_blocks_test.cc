#include "model/kernels/vocab_blocks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/convert.h"
#include "model/kernels/encoder.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/lm_head_cross_entropy.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<T> Random(TestRng& rng, int64_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(d(rng));
  return v;
}

template <typename T>
bool BitEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Block starts: every `block_rows` rows (a multiple of the vocabulary tile).
std::vector<std::pair<int64_t, int64_t>> Blocks(int64_t vocab, int64_t block_rows) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t r = 0; r < vocab; r += block_rows) {
    blocks.emplace_back(r, std::min(block_rows, vocab - r));
  }
  return blocks;
}

struct Case {
  int64_t rows, channels, vocab, row_tile, vocab_tile, block_tiles;
  bool some_ignored;
};

// The LM head and the embedding computed block by block equal the whole-matrix kernels bit for
// bit (f32 and f64, awkward sizes: tails in rows, vocabulary and tiles; ignored targets).
template <typename T>
void CheckBlocksEqualWholeMatrix(const Case& c, uint64_t seed, ThreadPool* pool) {
  SCOPED_TRACE(absl::StrCat("N ", c.rows, " C ", c.channels, " V ", c.vocab, " tiles ", c.row_tile,
                            "x", c.vocab_tile, " block tiles ", c.block_tiles,
                            sizeof(T) == 4 ? " f32" : " f64"));
  TestRng rng(seed);
  const int64_t N = c.rows, C = c.channels, V = c.vocab;
  const std::vector<T> h = Random<T>(rng, N * C);
  const std::vector<T> wte = Random<T>(rng, V * C, 0.5);
  std::vector<int32_t> targets(N), tokens(N);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  for (int64_t n = 0; n < N; ++n) {
    tokens[n] = tok(rng);
    targets[n] = (c.some_ignored && n % 3 == 1) ? -100 : tok(rng);
  }
  // Repeated tokens, so the scatter is a reduction.
  if (N > 3) tokens[N - 1] = tokens[0];

  // The whole-matrix kernels.
  const LmHeadCrossEntropyShape ce{.rows = N,
                                   .channels = C,
                                   .vocab_size = V,
                                   .row_tile = c.row_tile,
                                   .vocab_tile = c.vocab_tile};
  std::vector<T> ws(LmHeadCrossEntropyWorkspaceElems(ce)), lse_ref(N), dh_ref(N * C, 0),
      dwte_ref(V * C, 0);
  ASSERT_OK_AND_ASSIGN(const double loss_ref,
                       LmHeadCrossEntropyForward<T>(ce, h, wte, targets, absl::MakeSpan(lse_ref),
                                                    absl::MakeSpan(ws), pool));
  ASSERT_OK(LmHeadCrossEntropyBackward<T>(ce, h, wte, targets, lse_ref, 3.5, absl::MakeSpan(dh_ref),
                                          absl::MakeSpan(dwte_ref), absl::MakeSpan(ws), pool));
  const int64_t T_ = std::max<int64_t>(1, N / 2), B_ = N / T_;
  std::vector<T> wpe, enc_ref, dwpe_ref, dout;
  if (B_ * T_ == N) {
    wpe = Random<T>(rng, (T_ + 1) * C);
    dout = Random<T>(rng, N * C);
    enc_ref.assign(N * C, 0);
    dwpe_ref.assign((T_ + 1) * C, 0);
    const EncoderShape es{B_, T_, C, V, T_ + 1};
    ASSERT_OK(EncoderForward<T>(es, tokens, wte, wpe, absl::MakeSpan(enc_ref), pool));
    ASSERT_OK(EncoderBackward<T>(es, tokens, dout, absl::MakeSpan(dwte_ref),
                                 absl::MakeSpan(dwpe_ref), pool));
  }

  // Block by block.
  const int64_t block_rows = c.block_tiles * c.vocab_tile;
  std::vector<T> state(3 * N), lse(N), dh(N * C, 0), dwte(V * C, 0);
  LmHeadStateInit<T>(absl::MakeSpan(state));
  for (const auto& [r0, rows] : Blocks(V, block_rows)) {
    const VocabBlockShape s{.rows = N,
                            .channels = C,
                            .vocab_size = V,
                            .row_begin = r0,
                            .block_rows = rows,
                            .row_tile = c.row_tile,
                            .vocab_tile = c.vocab_tile};
    std::vector<T> fws(LmHeadBlockForwardWorkspaceElems(s, false));
    ASSERT_OK(LmHeadBlockForward<T>(s, h, absl::MakeConstSpan(wte).subspan(r0 * C, rows * C),
                                    targets, absl::MakeSpan(state), absl::MakeSpan(fws), pool));
  }
  const VocabBlockShape any{.rows = N, .channels = C, .vocab_size = V};
  ASSERT_OK_AND_ASSIGN(const double loss,
                       LmHeadFinish<T>(any, targets, state, absl::MakeSpan(lse)));
  EXPECT_EQ(loss, loss_ref);
  EXPECT_TRUE(BitEqual(lse, lse_ref));
  for (const auto& [r0, rows] : Blocks(V, block_rows)) {
    const VocabBlockShape s{.rows = N,
                            .channels = C,
                            .vocab_size = V,
                            .row_begin = r0,
                            .block_rows = rows,
                            .row_tile = c.row_tile,
                            .vocab_tile = c.vocab_tile};
    std::vector<T> bws(LmHeadBlockBackwardWorkspaceElems(s, false));
    int64_t next_row = r0;
    ASSERT_OK(LmHeadBlockBackward<T>(
        s, h, absl::MakeConstSpan(wte).subspan(r0 * C, rows * C), targets, lse, 3.5,
        absl::MakeSpan(dh), absl::MakeSpan(bws),
        [&](int64_t v0, int64_t n, const T* grad) -> absl::Status {
          EXPECT_EQ(v0, next_row);  // tiles in order, each once
          next_row = v0 + n;
          std::copy(grad, grad + n * C, dwte.begin() + v0 * C);
          return absl::OkStatus();
        },
        pool));
    EXPECT_EQ(next_row, r0 + rows);
  }
  EXPECT_TRUE(BitEqual(dh, dh_ref));
  if (wpe.empty()) {
    EXPECT_TRUE(BitEqual(dwte, dwte_ref));
    return;
  }
  // Embedding: every block writes its tokens' rows, then the positions are added.
  std::vector<T> enc(N * C, T{-7});
  for (const auto& [r0, rows] : Blocks(V, block_rows)) {
    const VocabBlockShape s{
        .rows = N, .channels = C, .vocab_size = V, .row_begin = r0, .block_rows = rows};
    ASSERT_OK(EmbeddingBlockForward<T>(
        s, tokens, absl::MakeConstSpan(wte).subspan(r0 * C, rows * C), absl::MakeSpan(enc), pool));
  }
  ASSERT_OK(PositionEmbeddingForward<T>(B_, T_, C, wpe, absl::MakeSpan(enc), pool));
  EXPECT_TRUE(BitEqual(enc, enc_ref));
  // The embedding's gradient into the LM head's, through slots of the rows the batch touches.
  std::vector<int32_t> slot(V, -1);
  std::vector<int32_t> touched;
  for (int32_t t : tokens) {
    if (slot[t] < 0) {
      slot[t] = static_cast<int32_t>(touched.size());
      touched.push_back(t);
    }
  }
  std::vector<T> rows_buf(touched.size() * C);
  for (size_t i = 0; i < touched.size(); ++i) {
    std::copy(dwte.begin() + touched[i] * C, dwte.begin() + (touched[i] + 1) * C,
              rows_buf.begin() + static_cast<int64_t>(i) * C);
  }
  ASSERT_OK(ScatterRowsAdd<T>(C, tokens, slot, dout, absl::MakeSpan(rows_buf), pool));
  for (size_t i = 0; i < touched.size(); ++i) {
    std::copy(rows_buf.begin() + static_cast<int64_t>(i) * C,
              rows_buf.begin() + static_cast<int64_t>(i + 1) * C, dwte.begin() + touched[i] * C);
  }
  EXPECT_TRUE(BitEqual(dwte, dwte_ref));
  std::vector<T> dwpe((T_ + 1) * C, 0);
  ASSERT_OK(PositionEmbeddingBackward<T>(B_, T_, C, dout, absl::MakeSpan(dwpe), pool));
  EXPECT_TRUE(BitEqual(dwpe, dwpe_ref));
}

const Case kCases[] = {
    // rows, channels, vocab, row_tile, vocab_tile, block tiles, ignored
    {12, 8, 37, 5, 8, 1, true},      // tails everywhere; last block shorter
    {12, 8, 37, 5, 8, 2, false},     // two tiles per block
    {7, 3, 5, 4, 8, 1, true},        // vocabulary below one tile: one block
    {64, 40, 300, 16, 32, 3, true},  // more rows than a row tile
    {10, 16, 64, 10, 16, 4, false},  // one block holding the whole vocabulary exactly
    {9, 5, 50, 100, 7, 5, true},     // row tile above the rows
};

TEST(VocabBlocksTest, BlocksEqualTheWholeMatrixKernelsBitForBit) {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    CheckBlocksEqualWholeMatrix<float>(c, seed, nullptr);
    CheckBlocksEqualWholeMatrix<double>(c, seed, nullptr);
    ++seed;
  }
}

TEST(VocabBlocksTest, ThreadCountDoesNotChangeResults) {
  ThreadPool pool(3);
  uint64_t seed = 100;
  for (const Case& c : kCases) CheckBlocksEqualWholeMatrix<float>(c, seed++, &pool);
}

TEST(VocabBlocksTest, AllTargetsIgnoredGivesZeroGradientsForEveryTile) {
  const VocabBlockShape s{.rows = 4,
                          .channels = 3,
                          .vocab_size = 10,
                          .row_begin = 4,
                          .block_rows = 6,
                          .row_tile = 2,
                          .vocab_tile = 4};
  std::vector<float> h(12, 1.0f), block(18, 0.5f), lse(4, 0.0f), dh(12, 0.0f);
  std::vector<int32_t> targets(4, -100);
  std::vector<float> ws(LmHeadBlockBackwardWorkspaceElems(s, false));
  int tiles = 0;
  ASSERT_OK(LmHeadBlockBackward<float>(
      s, h, block, targets, lse, 1.0, absl::MakeSpan(dh), absl::MakeSpan(ws),
      [&](int64_t, int64_t n, const float* g) -> absl::Status {
        ++tiles;
        for (int64_t i = 0; i < n * 3; ++i) EXPECT_EQ(g[i], 0.0f);
        return absl::OkStatus();
      },
      nullptr));
  EXPECT_EQ(tiles, 2);
  for (float v : dh) EXPECT_EQ(v, 0.0f);
  std::vector<float> state(12);
  LmHeadStateInit<float>(absl::MakeSpan(state));
  ASSERT_OK_AND_ASSIGN(double loss, LmHeadFinish<float>(s, targets, state, absl::MakeSpan(lse)));
  EXPECT_EQ(loss, 0.0);
}

// f16 blocks widen tile by tile exactly as converting the whole block first would.
TEST(VocabBlocksTest, F16BlocksEqualTheWidenedBlock) {
  TestRng rng(7);
  const int64_t N = 9, C = 6, V = 21;
  for (DType dtype : {DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> wide_src = Random<float>(rng, V * C);
    std::vector<uint16_t> narrow(V * C);
    ASSERT_OK(Convert(DType::kF32, wide_src.data(), dtype, narrow.data(), V * C));
    std::vector<float> wide(V * C);
    ASSERT_OK(Convert(dtype, narrow.data(), DType::kF32, wide.data(), V * C));
    const std::vector<float> h = Random<float>(rng, N * C);
    std::vector<int32_t> targets = {0, 5, 20, -100, 7, 7, 13, 2, 19};
    std::vector<float> state16(3 * N), state32(3 * N);
    LmHeadStateInit<float>(absl::MakeSpan(state16));
    LmHeadStateInit<float>(absl::MakeSpan(state32));
    std::vector<float> dh16(N * C, 0), dh32(N * C, 0), g16(V * C), g32(V * C);
    std::vector<float> enc16(N * C, 0), enc32(N * C, 0);
    for (const auto& [r0, rows] : Blocks(V, 8)) {
      const VocabBlockShape s{.rows = N,
                              .channels = C,
                              .vocab_size = V,
                              .row_begin = r0,
                              .block_rows = rows,
                              .row_tile = 4,
                              .vocab_tile = 4};
      const Block16 b16{narrow.data() + r0 * C, dtype};
      const auto b32 = absl::MakeConstSpan(wide).subspan(r0 * C, rows * C);
      std::vector<float> ws16(LmHeadBlockBackwardWorkspaceElems(s, true));
      std::vector<float> ws32(LmHeadBlockBackwardWorkspaceElems(s, false));
      ASSERT_OK(LmHeadBlockForward(s, h, b16, targets, absl::MakeSpan(state16),
                                   absl::MakeSpan(ws16), nullptr));
      ASSERT_OK(LmHeadBlockForward<float>(s, h, b32, targets, absl::MakeSpan(state32),
                                          absl::MakeSpan(ws32), nullptr));
    }
    EXPECT_TRUE(BitEqual(state16, state32));
    std::vector<float> lse(N);
    ASSERT_OK(LmHeadFinish<float>({.rows = N}, targets, state32, absl::MakeSpan(lse)).status());
    std::vector<int32_t> tokens = {0, 5, 20, 3, 7, 7, 13, 2, 19};
    for (const auto& [r0, rows] : Blocks(V, 8)) {
      const VocabBlockShape s{.rows = N,
                              .channels = C,
                              .vocab_size = V,
                              .row_begin = r0,
                              .block_rows = rows,
                              .row_tile = 4,
                              .vocab_tile = 4};
      const Block16 b16{narrow.data() + r0 * C, dtype};
      const auto b32 = absl::MakeConstSpan(wide).subspan(r0 * C, rows * C);
      std::vector<float> ws16(LmHeadBlockBackwardWorkspaceElems(s, true));
      std::vector<float> ws32(LmHeadBlockBackwardWorkspaceElems(s, false));
      auto keep = [&](std::vector<float>& g) {
        return [&g, C](int64_t v0, int64_t n, const float* grad) -> absl::Status {
          std::copy(grad, grad + n * C, g.begin() + v0 * C);
          return absl::OkStatus();
        };
      };
      ASSERT_OK(LmHeadBlockBackward(s, h, b16, targets, lse, 2.0, absl::MakeSpan(dh16),
                                    absl::MakeSpan(ws16), keep(g16), nullptr));
      ASSERT_OK(LmHeadBlockBackward<float>(s, h, b32, targets, lse, 2.0, absl::MakeSpan(dh32),
                                           absl::MakeSpan(ws32), keep(g32), nullptr));
      ASSERT_OK(EmbeddingBlockForward(s, tokens, b16, absl::MakeSpan(enc16), nullptr));
      ASSERT_OK(EmbeddingBlockForward<float>(s, tokens, b32, absl::MakeSpan(enc32), nullptr));
    }
    EXPECT_TRUE(BitEqual(dh16, dh32));
    EXPECT_TRUE(BitEqual(g16, g32));
    EXPECT_TRUE(BitEqual(enc16, enc32));
  }
}

// bf16 blocks run bf16 x bf16 GEMMs with f32 accumulation: block by block they equal the
// whole-matrix bf16 kernels (LmHeadCrossEntropy*Bf16) bit for bit, on both GEMM backends and for
// any pool size.
void CheckBf16BlocksEqualWholeMatrix(const Case& c, uint64_t seed, ThreadPool* pool) {
  SCOPED_TRACE(absl::StrCat("N ", c.rows, " C ", c.channels, " V ", c.vocab, " tiles ", c.row_tile,
                            "x", c.vocab_tile, " block tiles ", c.block_tiles,
                            pool == nullptr ? " no pool" : " pool"));
  TestRng rng(seed);
  const int64_t N = c.rows, C = c.channels, V = c.vocab;
  const std::vector<float> h = Random<float>(rng, N * C);
  const std::vector<float> wte_src = Random<float>(rng, V * C, 0.5);
  std::vector<uint16_t> wte(V * C);
  ASSERT_OK(Convert(DType::kF32, wte_src.data(), DType::kBF16, wte.data(), V * C));
  std::vector<int32_t> targets(N);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  for (int64_t n = 0; n < N; ++n) targets[n] = (c.some_ignored && n % 3 == 1) ? -100 : tok(rng);

  const LmHeadCrossEntropyShape ce{.rows = N,
                                   .channels = C,
                                   .vocab_size = V,
                                   .row_tile = c.row_tile,
                                   .vocab_tile = c.vocab_tile};
  std::vector<float> ws(LmHeadCrossEntropyBf16WorkspaceElems(ce)), lse_ref(N), dh_ref(N * C, 0),
      dwte_ref(V * C, 0);
  ASSERT_OK_AND_ASSIGN(const double loss_ref,
                       LmHeadCrossEntropyForwardBf16(ce, h, wte, targets, absl::MakeSpan(lse_ref),
                                                     absl::MakeSpan(ws), pool));
  ASSERT_OK(LmHeadCrossEntropyBackwardBf16(ce, h, wte, targets, lse_ref, 3.5,
                                           absl::MakeSpan(dh_ref), absl::MakeSpan(dwte_ref),
                                           absl::MakeSpan(ws), pool));

  const int64_t block_rows = c.block_tiles * c.vocab_tile;
  std::vector<float> state(3 * N), lse(N), dh(N * C, 0), dwte(V * C, 0);
  LmHeadStateInit<float>(absl::MakeSpan(state));
  auto shape_of = [&](int64_t r0, int64_t rows) {
    return VocabBlockShape{.rows = N,
                           .channels = C,
                           .vocab_size = V,
                           .row_begin = r0,
                           .block_rows = rows,
                           .row_tile = c.row_tile,
                           .vocab_tile = c.vocab_tile};
  };
  for (const auto& [r0, rows] : Blocks(V, block_rows)) {
    const VocabBlockShape s = shape_of(r0, rows);
    // Filled with garbage: nothing may depend on the workspace's contents.
    std::vector<float> fws(LmHeadBlockForwardWorkspaceElems(s, true), -3.0f);
    ASSERT_OK(LmHeadBlockForward(s, h, Block16{wte.data() + r0 * C, DType::kBF16}, targets,
                                 absl::MakeSpan(state), absl::MakeSpan(fws), pool));
  }
  ASSERT_OK_AND_ASSIGN(const double loss,
                       LmHeadFinish<float>({.rows = N}, targets, state, absl::MakeSpan(lse)));
  EXPECT_EQ(loss, loss_ref);
  EXPECT_TRUE(BitEqual(lse, lse_ref));
  for (const auto& [r0, rows] : Blocks(V, block_rows)) {
    const VocabBlockShape s = shape_of(r0, rows);
    std::vector<float> bws(LmHeadBlockBackwardWorkspaceElems(s, true), -3.0f);
    ASSERT_OK(LmHeadBlockBackward(
        s, h, Block16{wte.data() + r0 * C, DType::kBF16}, targets, lse, 3.5, absl::MakeSpan(dh),
        absl::MakeSpan(bws),
        [&](int64_t v0, int64_t n, const float* grad) -> absl::Status {
          std::copy(grad, grad + n * C, dwte.begin() + v0 * C);
          return absl::OkStatus();
        },
        pool));
  }
  EXPECT_TRUE(BitEqual(dh, dh_ref));
  EXPECT_TRUE(BitEqual(dwte, dwte_ref));
}

TEST(VocabBlocksTest, Bf16BlocksEqualTheWholeMatrixBf16KernelsBitForBit) {
  using kernels_internal::Bf16GemmBackend;
  ThreadPool pool(3);
  for (Bf16GemmBackend backend : {Bf16GemmBackend::kAuto, Bf16GemmBackend::kFallback}) {
    SCOPED_TRACE(kernels_internal::Bf16GemmBackendName(backend));
    kernels_internal::SetBf16GemmBackendForTest(backend);
    uint64_t seed = 200;
    for (const Case& c : kCases) {
      CheckBf16BlocksEqualWholeMatrix(c, seed, nullptr);
      CheckBf16BlocksEqualWholeMatrix(c, seed, &pool);
      ++seed;
    }
  }
  kernels_internal::SetBf16GemmBackendForTest(Bf16GemmBackend::kAuto);
}

TEST(VocabBlocksTest, BadArgumentsAreInvalidArgument) {
  std::vector<float> h(8), block(8), state(6), ws(1000), lse(2), dh(8), out(8);
  std::vector<int32_t> targets = {1, 2};
  VocabBlockShape s{.rows = 2,
                    .channels = 4,
                    .vocab_size = 10,
                    .row_begin = 3,
                    .block_rows = 2,
                    .row_tile = 2,
                    .vocab_tile = 2};
  LmHeadStateInit<float>(absl::MakeSpan(state));
  // A block that does not start on a vocabulary tile.
  EXPECT_THAT(LmHeadBlockForward<float>(s, h, block, targets, absl::MakeSpan(state),
                                        absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of vocab_tile")));
  s.row_begin = 2;
  ASSERT_OK(LmHeadBlockForward<float>(s, h, block, targets, absl::MakeSpan(state),
                                      absl::MakeSpan(ws), nullptr));
  // Outside the vocabulary, wrong sizes, a bad target, a small workspace.
  VocabBlockShape o = s;
  o.row_begin = 10;
  EXPECT_THAT(LmHeadBlockForward<float>(o, h, block, targets, absl::MakeSpan(state),
                                        absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
  std::vector<float> small_block(4);
  EXPECT_THAT(LmHeadBlockForward<float>(s, h, small_block, targets, absl::MakeSpan(state),
                                        absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_rows*channels")));
  std::vector<int32_t> bad_targets = {1, 10};
  EXPECT_THAT(LmHeadBlockForward<float>(s, h, block, bad_targets, absl::MakeSpan(state),
                                        absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target 10")));
  std::vector<float> tiny_ws(1);
  EXPECT_THAT(LmHeadBlockForward<float>(s, h, block, targets, absl::MakeSpan(state),
                                        absl::MakeSpan(tiny_ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  EXPECT_THAT(EmbeddingBlockForward<float>(s, bad_targets, block, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 10")));
  EXPECT_THAT(EmbeddingBlockForward(s, targets, Block16{nullptr, DType::kBF16}, absl::MakeSpan(out),
                                    nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16-bit")));
  std::vector<int32_t> slot(10, -1);
  slot[2] = 5;
  EXPECT_THAT(ScatterRowsAdd<float>(4, targets, slot, dh, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slot 5")));
  EXPECT_THAT(PositionEmbeddingForward<float>(2, 3, 4, block, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wpe")));
}

}  // namespace
}  // namespace ps
