// LayerNorm on the GPU, f32: the math, layouts, saved statistics and
// accumulation (+=) of the CPU kernel (model/kernels/layernorm.h), with the
// per-element arithmetic of layernorm_math.h. One warp per row for y and dx; dw
// and db are deterministic column reductions (fixed order, no atomics). Differs
// from the CPU only by rounding (the order of the row sums, fused
// multiply-adds).
//
// Device pointers; validates shape and pointers, enqueues on `stream`, returns
// the launch status. Never allocates or synchronizes. Needs no workspace.
// Thread safety: stateless.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_LAYERNORM_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_LAYERNORM_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "model/kernels/layernorm.h"

namespace ps::cuda {

// y = LayerNorm(x) * w + b; writes mean[N], rstd[N]. x, y [N,C]; w, b [C].
[[nodiscard]] absl::Status LayerNormForward(const LayerNormShape& shape, const float* x,
                                            const float* w, const float* b, float* y, float* mean,
                                            float* rstd, cudaStream_t stream);

// dx += dL/dx, dw += dL/dw, db += dL/db from dy and the forward's x, w, mean,
// rstd. dw and db may be null: skipped (input gradient only).
[[nodiscard]] absl::Status LayerNormBackward(const LayerNormShape& shape, const float* x,
                                             const float* w, const float* mean, const float* rstd,
                                             const float* dy, float* dx, float* dw, float* db,
                                             cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_LAYERNORM_H_
