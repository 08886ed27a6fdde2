// The CUDA kernels' own device workspaces (without cuBLAS's, which CudaKernels adds): sizes and
// layouts as pure host functions of the shapes, with no CUDA dependency, so that
// CudaKernelWorkspaces (model/kernels/kernel_workspaces.h) can answer for a GPU run in any build —
// the pre-flight plan runs before a GPU is touched, and the emulated accelerator's tests replay a
// GPU's workspaces. The kernels carve their workspaces with the same layouts (cuda/*.cc), so the
// sizes asked for and the bytes used are one computation.
//
// Every part starts on a 256-byte boundary (as cudaMalloc returns memory), so every part is
// aligned for any element type and for cuBLAS.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_WORKSPACE_SIZES_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_WORKSPACE_SIZES_H_

#include <cstdint>

#include "memory/dtype.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::cuda {

inline constexpr int64_t kWorkspaceAlignment = 256;
// `bytes` rounded up to kWorkspaceAlignment.
inline constexpr int64_t AlignWorkspaceBytes(int64_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Attention (GPT-2's too: kv heads = heads). The forward needs no workspace; the backward's holds
// D_i = dout_i . out_i per (batch, query head, position), B*Hq*T floats.
inline int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape&) { return 0; }
int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& shape);

// The bf16-weight Conv1D GEMMs (cuda/matmul.h): forward bf16(x) [N, in]; backward bf16(x), then
// bf16(dy) [N, out].
int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& shape);
int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& shape);

// The tiles the LM-head kernels compute at a time: rows of h by rows of the vocabulary.
struct VocabTiles {
  int64_t rows = 0;
  int64_t vocab = 0;
};
VocabTiles VocabTilesOf(const LmHeadCrossEntropyShape& shape);  // the whole vocabulary
VocabTiles VocabTilesOf(const VocabBlockShape& shape);          // one block of it

// cuda/lm_head_cross_entropy.h, forward and backward: byte offsets of the parts and the total.
struct LmHeadCrossEntropyWorkspaceLayout {
  int64_t logits = 0;        // [R, Vt] f32
  int64_t run_max = 0;       // [R] f32
  int64_t run_sum = 0;       // [R] f32
  int64_t target_logit = 0;  // [R] f32
  int64_t scale = 0;         // one f32
  int64_t row_loss = 0;      // [N] f64
  int64_t bytes = 0;
};
LmHeadCrossEntropyWorkspaceLayout LmHeadCrossEntropyLayout(const LmHeadCrossEntropyShape& shape);
int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& shape);

// cuda/vocab_blocks.h's LM head over a block stored as `block_dtype`: byte offsets of the parts
// (-1 where the dtype or direction needs none) and the total.
struct LmHeadBlockWorkspaceLayout {
  int64_t logits = -1;  // [R, Vt] f32: the logits tile, then dlogits in place
  int64_t scale = -1;   // backward: loss_grad / valid targets, one f32
  int64_t wide = -1;    // f16: a vocabulary tile widened [Vt, C] f32
  int64_t hb = -1;      // bf16: h rounded [N, C] bf16
  int64_t dzb = -1;     // bf16 backward: the dlogits tile rounded [R, Vt] bf16
  int64_t bytes = 0;
};
LmHeadBlockWorkspaceLayout LmHeadBlockLayout(const VocabBlockShape& shape, DType block_dtype,
                                             bool backward);
int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& shape, DType block_dtype);
int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& shape, DType block_dtype);

// The dequantizing nn.Linear over a 4-bit weight (cuda/nf4.h, through CudaKernels): one f32 tile
// of W [out, in] that the kernel dequantizes into and cuBLAS reads, reused tile after tile in
// stream order. It holds the whole W when W has at most kQuant4LinearTileBudgetElems values, else
// that budget (16 MiB), but never less than one row and one column of W (the forward's tiles are
// whole rows, the input gradient's whole columns). A larger tile means fewer, larger GEMMs.
//
// Computing in bf16 / f16 (bnb_4bit_compute_dtype), the same tile holds 16-bit values, and two
// parts follow it: the activations rounded to 16 bits (x [rows, in] forward, dy [rows, out]
// backward: rows * max(in, out) values) and the input gradient's f32 product of one tile
// ([rows, tile columns], rounded before it is added to dx).
inline constexpr int64_t kQuant4LinearTileBudgetElems = int64_t{1} << 22;
int64_t Quant4LinearTileElems(const LinearShape& shape);
// Byte offsets of the parts (-1 where absent) and the total.
struct Quant4LinearWorkspaceLayout {
  int64_t tile = 0;
  int64_t activations = -1;  // 16-bit compute
  int64_t product = -1;      // 16-bit compute
  int64_t bytes = 0;
};
Quant4LinearWorkspaceLayout Quant4LinearLayout(const LinearShape& shape, DType compute_dtype);
// The input gradient's tile width (columns of W per tile): min(in, tile / out).
int64_t Quant4LinearTileColumns(const LinearShape& shape);
// f32: the f32 tile, in bytes; 16-bit: Quant4LinearLayout's total.
int64_t Quant4LinearWorkspaceBytes(const LinearShape& shape, DType compute_dtype = DType::kF32);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_WORKSPACE_SIZES_H_
