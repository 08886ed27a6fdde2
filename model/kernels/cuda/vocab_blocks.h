// The vocabulary in row blocks on the GPU: the CUDA side of model/kernels/vocab_blocks.h (the
// math, the block and tile rules, the bit-identity argument) behind Kernels' block entry points
// (model/kernels/kernels.h). Device pointers; each function validates what the interface has not
// (null pointers, the workspace), enqueues on `stream` and returns the first failure; nothing
// allocates or synchronizes.
//
//   EmbeddingBlockForward, ScatterRowsAdd, CopyRowsToSlots, CopySlotsToRows,
//   PositionEmbeddingForward/Backward: element-wise kernels (vocab_blocks_kernels.cu) with the
//     CPU's results bit for bit — copies, exact widenings, and additions in the CPU's order
//     (ScatterRowsAdd: tokens increasing per element; PositionEmbeddingBackward: b increasing).
//   LmHeadStateInit / LmHeadBlockForward / LmHeadFinish / LmHeadBlockBackward: the LM head over
//     blocks with the unsplit CUDA LM head's tiling and row kernels
//     (model/kernels/cuda/lm_head_cross_entropy.h), vocabulary tiles outside, row tiles inside.
//     The state has the CPU's layout — [running max (rows), running sum (rows), target logit
//     (rows)], initialized to (-inf, 0, 0) — so a state is meaningful to either implementation.
//     Per block dtype:
//       f32   the block's rows are the GEMM operand;
//       f16   each vocabulary tile is widened exactly into the workspace (f32 GEMMs), as the CPU;
//       bf16  h is rounded to bf16 once per call and the block's rows are used in place, the
//             backward rounds each dlogits tile to bf16 before both gradient GEMMs, as the CPU:
//             cublasGemmEx with bf16 operands and CUBLAS_COMPUTE_32F.
//     The backward writes each tile of dblock (the first row tile with beta = 0), and adds dh in
//     increasing vocabulary order; calling it per vocabulary tile gives the same bits as one call.
//     Differences from the CPU are rounding only: cuBLAS's summation order, and the softmax state
//     folded per tile by a tree (cross_entropy_kernels.cu). Loss and lse therefore agree to a few
//     ULP, not bit for bit.
//
// Device-data errors (vocab_blocks_math.h): a token outside the vocabulary makes its embedding
// row NaN; a target outside the vocabulary (not ignore_index) makes the loss and that row's
// gradients NaN; a slot outside the touched-rows buffer makes the copied row NaN (CopySlotsToRows)
// or adds nothing (ScatterRowsAdd, CopyRowsToSlots).
//
// Thread safety: the cuBLAS handle is used by one thread at a time; the rest is reentrant.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_VOCAB_BLOCKS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_VOCAB_BLOCKS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "memory/dtype.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/workspace_sizes.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::cuda {

[[nodiscard]] absl::Status EmbeddingBlockForward(const VocabBlockShape& shape,
                                                 const int32_t* tokens, DType block_dtype,
                                                 const void* block, float* out,
                                                 cudaStream_t stream);

// The touched-rows buffer: slot_of_token [vocab_size], slot_rows [num_slots, channels].
[[nodiscard]] absl::Status ScatterRowsAdd(int64_t channels, int64_t vocab_size, int64_t num_slots,
                                          int64_t num_tokens, const int32_t* tokens,
                                          const int32_t* slot_of_token, const float* dout,
                                          float* slot_rows, cudaStream_t stream);
[[nodiscard]] absl::Status CopyRowsToSlots(int64_t channels, int64_t vocab_size, int64_t num_slots,
                                           int64_t row_begin, int64_t rows,
                                           const int32_t* slot_of_token, const float* src,
                                           float* slot_rows, cudaStream_t stream);
[[nodiscard]] absl::Status CopySlotsToRows(int64_t channels, int64_t vocab_size, int64_t num_slots,
                                           int64_t row_begin, int64_t rows,
                                           const int32_t* slot_of_token, const float* slot_rows,
                                           DType dst_dtype, void* dst, cudaStream_t stream);

// positions (device, [B*T], null: position t) as in model/kernels/vocab_blocks.h; wpe / dwpe
// have max_positions rows (read only with positions: a row whose position is outside
// [0, max_positions) comes out NaN in the forward and adds nothing in the backward). With
// positions the backward is one thread per channel walking (b, t) in increasing order — the CPU
// kernel's order, so the same bits — O(B*T) steps per thread.
[[nodiscard]] absl::Status PositionEmbeddingForward(int64_t batch, int64_t seq_len,
                                                    int64_t channels, const float* wpe, float* out,
                                                    cudaStream_t stream,
                                                    const int32_t* positions = nullptr,
                                                    int64_t max_positions = 0);
[[nodiscard]] absl::Status PositionEmbeddingBackward(int64_t batch, int64_t seq_len,
                                                     int64_t channels, const float* dout,
                                                     float* dwpe, cudaStream_t stream,
                                                     const int32_t* positions = nullptr,
                                                     int64_t max_positions = 0);

// The kernels' own workspace (without cuBLAS's; LmHeadBlockForwardWorkspaceBytes /
// LmHeadBlockBackwardWorkspaceBytes in cuda/workspace_sizes.h), each part 256-byte aligned: the
// logits tile, plus a widened vocabulary tile (f16) or h in bf16 (bf16); the backward also the
// gradient scale and (bf16) a dlogits tile in bf16.

[[nodiscard]] absl::Status LmHeadStateInit(int64_t rows, float* state, cudaStream_t stream);
[[nodiscard]] absl::Status LmHeadBlockForward(const CublasHandle& cublas,
                                              const VocabBlockShape& shape, const float* h,
                                              DType block_dtype, const void* block,
                                              const int32_t* targets, float* state, void* workspace,
                                              int64_t workspace_bytes, cudaStream_t stream);
// *loss (device) = the mean loss; lse [rows] written.
[[nodiscard]] absl::Status LmHeadFinish(const VocabBlockShape& shape, const int32_t* targets,
                                        const float* state, float* lse, double* loss,
                                        cudaStream_t stream);
[[nodiscard]] absl::Status LmHeadBlockBackward(
    const CublasHandle& cublas, const VocabBlockShape& shape, const float* h, DType block_dtype,
    const void* block, const int32_t* targets, const float* lse, double loss_grad, float* dh,
    float* dblock, void* workspace, int64_t workspace_bytes, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_VOCAB_BLOCKS_H_
