// RMSNorm on the GPU, f32: the math, layouts, saved rstd and accumulation (+=) of the CPU kernel
// (model/kernels/rmsnorm.h), with the per-element arithmetic of rmsnorm_math.h. One warp per row
// for y and dx; dw is a deterministic column reduction (fixed order, no atomics). Differs from the
// CPU only by rounding (the order of the row sums, fused multiply-adds).
//
// Device pointers; validates shape and pointers, enqueues on `stream`, returns the launch status.
// Never allocates or synchronizes. Needs no workspace. Thread safety: stateless.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_RMSNORM_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_RMSNORM_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "model/kernels/rmsnorm.h"

namespace ps::cuda {

// y = RMSNorm(x) * w; writes rstd[N]. x, y [N,C]; w [C].
[[nodiscard]] absl::Status RmsNormForward(const RmsNormShape& shape, const float* x, const float* w,
                                          float* y, float* rstd, cudaStream_t stream);

// dx += dL/dx, dw += dL/dw from dy and the forward's x, w, rstd. dw may be null: skipped.
[[nodiscard]] absl::Status RmsNormBackward(const RmsNormShape& shape, const float* x,
                                           const float* w, const float* rstd, const float* dy,
                                           float* dx, float* dw, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_RMSNORM_H_
