// The fused LM head (tied to wte) + mean cross-entropy on the GPU, f32: the
// math, layouts, tiling and accumulation (+=) of the CPU kernel
// (model/kernels/lm_head_cross_entropy.h), with the arithmetic of
// cross_entropy_math.h and softmax_math.h. The [N, V] logits are never
// materialized: for each [row_tile, vocab_tile] tile a cuBLAS GEMM (f32
// accumulation, no TF32) writes the logits into the workspace and a row kernel
// consumes them at once:
//   forward   per tile: z = h_tile wte_tile^T; fold into each row's running
//   (max, sum)
//             per row tile: lse, per-row loss; at the end: the mean loss (one
//             block, double)
//   backward  per tile: z recomputed; dz = scale (softmax - onehot) in place;
//             dh_tile += dz wte_tile;  dwte_tile += dz^T h_tile
// The loss and the number of valid targets are computed on the device (targets
// live there), so the forward writes the loss to device memory instead of
// returning it; read it after the stream reached that point.
//
// Targets are not range-checked on the host (that would need a copy and a
// synchronization). The kernels never index by a target; a row whose target is
// outside [0, V) and is not ignore_index gets a NaN loss (so the mean loss is
// NaN) and NaN gradients — loud, not silently wrong.
//
// Device pointers; validates shape, pointers and workspace, enqueues on
// `stream`, returns the first failure. Never allocates or synchronizes. Thread
// safety: the cuBLAS handle is used by one thread at a time.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_LM_HEAD_CROSS_ENTROPY_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_LM_HEAD_CROSS_ENTROPY_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/workspace_sizes.h"
#include "model/kernels/lm_head_cross_entropy.h"

namespace ps::cuda {

// Device workspace of the forward and the backward (LmHeadCrossEntropyWorkspaceBytes in
// cuda/workspace_sizes.h): one logits tile, three floats per tile row, a scale, and one double per
// row (the row losses), each part 256-byte aligned.

// *loss (device) = mean cross-entropy over the valid targets (0 if none);
// lse[N] written. h [N,C], wte [V,C], targets [N] int32.
[[nodiscard]] absl::Status LmHeadCrossEntropyForward(const CublasHandle& cublas,
                                                     const LmHeadCrossEntropyShape& shape,
                                                     const float* h, const float* wte,
                                                     const int32_t* targets, float* lse,
                                                     double* loss, void* workspace,
                                                     int64_t workspace_bytes, cudaStream_t stream);

// dh += dloss/dh * loss_grad, dwte += dloss/dwte * loss_grad, from the
// forward's lse.
[[nodiscard]] absl::Status LmHeadCrossEntropyBackward(
    const CublasHandle& cublas, const LmHeadCrossEntropyShape& shape, const float* h,
    const float* wte, const int32_t* targets, const float* lse, double loss_grad, float* dh,
    float* dwte, void* workspace, int64_t workspace_bytes, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_LM_HEAD_CROSS_ENTROPY_H_
