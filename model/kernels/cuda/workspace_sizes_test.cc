// The CUDA kernels' workspace sizes and layouts (cuda/workspace_sizes.h), on the CPU: worked
// examples computed by hand from the kernels' documented parts, and on random shapes the layout
// rules the kernels rely on when they carve a workspace (every part 256-byte aligned, parts in
// order without overlap, each large enough for its tile, the total covering the last part, the
// parts a dtype and direction need present and no others).
#include "model/kernels/cuda/workspace_sizes.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/random/distributions.h"
#include "base/testing/test_rng.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"

namespace ps::cuda {
namespace {

TEST(WorkspaceSizes, AlignsTo256Bytes) {
  EXPECT_EQ(AlignWorkspaceBytes(0), 0);
  EXPECT_EQ(AlignWorkspaceBytes(1), 256);
  EXPECT_EQ(AlignWorkspaceBytes(256), 256);
  EXPECT_EQ(AlignWorkspaceBytes(257), 512);
}

// The 4-bit Linear's tile: the whole W up to the budget (4 Mi f32), else the budget, never less than
// one row (in) and one column (out) of W.
TEST(WorkspaceSizes, Quant4LinearTile) {
  EXPECT_EQ(Quant4LinearTileElems({.rows = 1, .in_features = 10, .out_features = 14}), 140);
  EXPECT_EQ(Quant4LinearTileElems({.rows = 9, .in_features = 4096, .out_features = 11008}),
            int64_t{1} << 22);
  EXPECT_EQ(Quant4LinearWorkspaceBytes({.rows = 9, .in_features = 4096, .out_features = 11008}),
            int64_t{16} << 20);
  // A row longer than the budget: one row (forward) and one column (backward) must fit.
  EXPECT_EQ(Quant4LinearTileElems({.rows = 1, .in_features = 5000000, .out_features = 2}),
            5000000);
  EXPECT_EQ(Quant4LinearTileElems({.rows = 1, .in_features = 3, .out_features = 6000000}),
            6000000);
}

// bf16 / f16 compute: the 16-bit tile, the rounded activations, the backward's f32 product of one
// tile, each on a 256-byte boundary.
TEST(WorkspaceSizes, Quant4LinearSixteenBitLayout) {
  const LinearShape small{.rows = 3, .in_features = 10, .out_features = 14};
  const Quant4LinearWorkspaceLayout l = Quant4LinearLayout(small, DType::kBF16);
  EXPECT_EQ(l.tile, 0);
  // tile: 140 bf16 = 280 bytes -> 512; activations: 3 * max(10, 14) bf16 = 84 bytes -> 256;
  // product: 3 rows * 10 columns (min(10, 140 / 14)) f32 = 120 bytes -> 256.
  EXPECT_EQ(l.activations, 512);
  EXPECT_EQ(l.product, 512 + 256);
  EXPECT_EQ(l.bytes, 512 + 256 + 256);
  EXPECT_EQ(Quant4LinearWorkspaceBytes(small, DType::kF16), l.bytes);
  EXPECT_EQ(Quant4LinearWorkspaceBytes(small, DType::kF32), 140 * 4);
  const LinearShape big{.rows = 9, .in_features = 4096, .out_features = 11008};
  EXPECT_EQ(Quant4LinearTileColumns(big), (int64_t{1} << 22) / 11008);
  EXPECT_EQ(Quant4LinearWorkspaceBytes(big, DType::kBF16),
            (int64_t{8} << 20) + AlignWorkspaceBytes(9 * 11008 * 2) +
                AlignWorkspaceBytes(9 * ((int64_t{1} << 22) / 11008) * 4));
}

// By hand: N = 10 positions, C = 16 channels, tiles of 4 rows by 8 vocabulary rows.
TEST(WorkspaceSizes, WorkedExamples) {
  const VocabBlockShape block{.rows = 10,
                              .channels = 16,
                              .vocab_size = 100,
                              .row_begin = 16,
                              .block_rows = 20,
                              .row_tile = 4,
                              .vocab_tile = 8};
  // logits 4*8 f32 = 128 -> 256; scale -> 256; h in bf16 10*16*2 = 320 -> 512; dlogits in bf16
  // 4*8*2 = 64 -> 256; an f16 tile widened 8*16 f32 = 512.
  EXPECT_EQ(LmHeadBlockForwardWorkspaceBytes(block, DType::kF32), 256);
  EXPECT_EQ(LmHeadBlockBackwardWorkspaceBytes(block, DType::kF32), 512);
  EXPECT_EQ(LmHeadBlockForwardWorkspaceBytes(block, DType::kF16), 256 + 512);
  EXPECT_EQ(LmHeadBlockBackwardWorkspaceBytes(block, DType::kF16), 256 + 256 + 512);
  EXPECT_EQ(LmHeadBlockForwardWorkspaceBytes(block, DType::kBF16), 256 + 512);
  EXPECT_EQ(LmHeadBlockBackwardWorkspaceBytes(block, DType::kBF16), 256 + 256 + 512 + 256);
  const LmHeadBlockWorkspaceLayout l = LmHeadBlockLayout(block, DType::kBF16, true);
  EXPECT_EQ(l.logits, 0);
  EXPECT_EQ(l.scale, 256);
  EXPECT_EQ(l.wide, -1);
  EXPECT_EQ(l.hb, 512);
  EXPECT_EQ(l.dzb, 1024);

  // logits 128 -> 256, three per-row floats 16 -> 256 each, the scale 256, row losses 10 doubles
  // 80 -> 256.
  const LmHeadCrossEntropyShape ce{
      .rows = 10, .channels = 16, .vocab_size = 100, .row_tile = 4, .vocab_tile = 8};
  EXPECT_EQ(LmHeadCrossEntropyWorkspaceBytes(ce), 6 * 256);
  EXPECT_EQ(LmHeadCrossEntropyLayout(ce).row_loss, 5 * 256);

  // bf16(x) 3*5*2 = 30 -> 256; bf16(dy) 3*7*2 = 42 -> 256.
  const MatmulShape mm{.rows = 3, .in_features = 5, .out_features = 7};
  EXPECT_EQ(MatmulBf16ForwardWorkspaceBytes(mm), 256);
  EXPECT_EQ(MatmulBf16BackwardWorkspaceBytes(mm), 512);

  // One f32 per (batch, query head, position); the forwards need none. GPT-2's attention (C = 12,
  // 3 heads) is the case kv heads = heads over its fused qkv (row strides 3C).
  const GqaAttentionShape gpt2{.batch = 2,
                               .seq_len = 5,
                               .num_heads = 3,
                               .num_kv_heads = 3,
                               .head_dim = 4,
                               .q_row_stride = 36,
                               .kv_row_stride = 36};
  EXPECT_EQ(GqaAttentionBackwardWorkspaceBytes(gpt2), 2 * 3 * 5 * 4);
  EXPECT_EQ(GqaAttentionBackwardWorkspaceBytes(
                {.batch = 2, .seq_len = 5, .num_heads = 4, .num_kv_heads = 2, .head_dim = 8}),
            2 * 4 * 5 * 4);
  EXPECT_EQ(GqaAttentionForwardWorkspaceBytes(gpt2), 0);
}

struct Part {
  int64_t offset;
  int64_t bytes;  // what the kernel writes there
};

// The carving rules, for parts in layout order; `total` is the layout's size.
void ExpectCarvable(const std::vector<Part>& parts, int64_t total) {
  int64_t end = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(parts[i].offset % kWorkspaceAlignment, 0);
    EXPECT_GE(parts[i].offset, end);
    end = parts[i].offset + parts[i].bytes;
  }
  EXPECT_GE(total, end);
  EXPECT_EQ(total % kWorkspaceAlignment, 0);
  EXPECT_LT(total - end, kWorkspaceAlignment);  // no part is missing from the sum
}

TEST(WorkspaceSizes, RandomLmHeadBlockLayoutsCanBeCarved) {
  TestRng gen(1);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t vocab_tile = absl::Uniform<int64_t>(gen, 1, 300);
    const int64_t vocab = absl::Uniform<int64_t>(gen, 1, 5000);
    const int64_t row_begin =
        absl::Uniform<int64_t>(gen, 0, (vocab - 1) / vocab_tile + 1) * vocab_tile;
    VocabBlockShape s{.rows = absl::Uniform<int64_t>(gen, 1, 700),
                      .channels = absl::Uniform<int64_t>(gen, 1, 300),
                      .vocab_size = vocab,
                      .row_begin = row_begin,
                      .block_rows = absl::Uniform<int64_t>(gen, 1, vocab - row_begin + 1),
                      .row_tile = absl::Uniform<int64_t>(gen, 1, 400),
                      .vocab_tile = vocab_tile};
    const int64_t R = std::min(s.rows, s.row_tile), Vt = std::min(s.block_rows, s.vocab_tile);
    const VocabTiles t = VocabTilesOf(s);
    EXPECT_EQ(t.rows, R);
    EXPECT_EQ(t.vocab, Vt);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (bool backward : {false, true}) {
        SCOPED_TRACE(testing::Message() << "trial " << trial << " " << DTypeName(dtype)
                                        << (backward ? " backward" : " forward"));
        const LmHeadBlockWorkspaceLayout l = LmHeadBlockLayout(s, dtype, backward);
        std::vector<Part> parts = {{l.logits, R * Vt * 4}};
        EXPECT_EQ(l.scale >= 0, backward);
        if (backward) parts.push_back({l.scale, 4});
        EXPECT_EQ(l.wide >= 0, dtype == DType::kF16);
        if (l.wide >= 0) parts.push_back({l.wide, Vt * s.channels * 4});
        EXPECT_EQ(l.hb >= 0, dtype == DType::kBF16);
        if (l.hb >= 0) parts.push_back({l.hb, s.rows * s.channels * 2});
        EXPECT_EQ(l.dzb >= 0, dtype == DType::kBF16 && backward);
        if (l.dzb >= 0) parts.push_back({l.dzb, R * Vt * 2});
        ExpectCarvable(parts, l.bytes);
        EXPECT_EQ(l.bytes, backward ? LmHeadBlockBackwardWorkspaceBytes(s, dtype)
                                    : LmHeadBlockForwardWorkspaceBytes(s, dtype));
      }
    }
  }
}

TEST(WorkspaceSizes, RandomLmHeadCrossEntropyLayoutsCanBeCarved) {
  TestRng gen(2);
  for (int trial = 0; trial < 300; ++trial) {
    const LmHeadCrossEntropyShape s{.rows = absl::Uniform<int64_t>(gen, 1, 3000),
                                    .channels = absl::Uniform<int64_t>(gen, 1, 300),
                                    .vocab_size = absl::Uniform<int64_t>(gen, 1, 60000),
                                    .row_tile = absl::Uniform<int64_t>(gen, 1, 600),
                                    .vocab_tile = absl::Uniform<int64_t>(gen, 1, 5000)};
    SCOPED_TRACE(trial);
    const int64_t R = std::min(s.rows, s.row_tile), Vt = std::min(s.vocab_size, s.vocab_tile);
    const LmHeadCrossEntropyWorkspaceLayout l = LmHeadCrossEntropyLayout(s);
    ExpectCarvable({{l.logits, R * Vt * 4},
                    {l.run_max, R * 4},
                    {l.run_sum, R * 4},
                    {l.target_logit, R * 4},
                    {l.scale, 4},
                    {l.row_loss, s.rows * 8}},
                   l.bytes);
    EXPECT_EQ(l.bytes, LmHeadCrossEntropyWorkspaceBytes(s));
  }
}

}  // namespace
}  // namespace ps::cuda
