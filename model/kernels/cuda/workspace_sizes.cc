#include "model/kernels/cuda/workspace_sizes.h"

#include <algorithm>
#include <cstdint>

namespace ps::cuda {
namespace {

constexpr int64_t kF32 = 4, kF64 = 8, kBF16 = 2;

// Appends parts to a layout, each on a kWorkspaceAlignment boundary.
class Parts {
 public:
  int64_t Take(int64_t bytes) {
    const int64_t at = end_;
    end_ += AlignWorkspaceBytes(bytes);
    return at;
  }
  int64_t end() const { return end_; }

 private:
  int64_t end_ = 0;
};

}  // namespace

int64_t Quant4LinearTileElems(const LinearShape& s) {
  const int64_t whole = s.out_features * s.in_features;
  const int64_t at_least = std::max(s.in_features, s.out_features);
  return std::min(whole, std::max(kQuant4LinearTileBudgetElems, at_least));
}

int64_t Quant4LinearTileColumns(const LinearShape& s) {
  return std::min(s.in_features, Quant4LinearTileElems(s) / std::max<int64_t>(s.out_features, 1));
}

Quant4LinearWorkspaceLayout Quant4LinearLayout(const LinearShape& s, DType compute_dtype) {
  Quant4LinearWorkspaceLayout l;
  if (compute_dtype == DType::kF32) {
    l.bytes = Quant4LinearTileElems(s) * kF32;
    return l;
  }
  Parts parts;
  l.tile = parts.Take(Quant4LinearTileElems(s) * kBF16);
  l.activations = parts.Take(s.rows * std::max(s.in_features, s.out_features) * kBF16);
  l.product = parts.Take(s.rows * Quant4LinearTileColumns(s) * kF32);
  l.bytes = parts.end();
  return l;
}

int64_t Quant4LinearWorkspaceBytes(const LinearShape& s, DType compute_dtype) {
  return Quant4LinearLayout(s, compute_dtype).bytes;
}

int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& s) {
  return s.batch * s.num_heads * s.seq_len * kF32;
}

int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) {
  return AlignWorkspaceBytes(s.rows * s.in_features * kBF16);
}

int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) {
  return AlignWorkspaceBytes(s.rows * s.in_features * kBF16) +
         AlignWorkspaceBytes(s.rows * s.out_features * kBF16);
}

VocabTiles VocabTilesOf(const LmHeadCrossEntropyShape& s) {
  return {std::min(s.rows, s.row_tile), std::min(s.vocab_size, s.vocab_tile)};
}

VocabTiles VocabTilesOf(const VocabBlockShape& s) {
  return {std::min(s.rows, s.row_tile), std::min(s.block_rows, s.vocab_tile)};
}

LmHeadCrossEntropyWorkspaceLayout LmHeadCrossEntropyLayout(const LmHeadCrossEntropyShape& s) {
  const VocabTiles t = VocabTilesOf(s);
  Parts parts;
  LmHeadCrossEntropyWorkspaceLayout w;
  w.logits = parts.Take(t.rows * t.vocab * kF32);
  w.run_max = parts.Take(t.rows * kF32);
  w.run_sum = parts.Take(t.rows * kF32);
  w.target_logit = parts.Take(t.rows * kF32);
  w.scale = parts.Take(kF32);
  w.row_loss = parts.Take(std::max<int64_t>(0, s.rows) * kF64);
  w.bytes = parts.end();
  return w;
}

int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& s) {
  return LmHeadCrossEntropyLayout(s).bytes;
}

LmHeadBlockWorkspaceLayout LmHeadBlockLayout(const VocabBlockShape& s, DType dtype, bool backward) {
  const VocabTiles t = VocabTilesOf(s);
  Parts parts;
  LmHeadBlockWorkspaceLayout w;
  w.logits = parts.Take(t.rows * t.vocab * kF32);
  if (backward) w.scale = parts.Take(kF32);
  if (dtype == DType::kF16) w.wide = parts.Take(t.vocab * s.channels * kF32);
  if (dtype == DType::kBF16) {
    w.hb = parts.Take(s.rows * s.channels * kBF16);
    if (backward) w.dzb = parts.Take(t.rows * t.vocab * kBF16);
  }
  w.bytes = parts.end();
  return w;
}

int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s, DType dtype) {
  return LmHeadBlockLayout(s, dtype, /*backward=*/false).bytes;
}

int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s, DType dtype) {
  return LmHeadBlockLayout(s, dtype, /*backward=*/true).bytes;
}

}  // namespace ps::cuda
