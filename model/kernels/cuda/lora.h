// LoRA adapters (model/kernels/lora.h has the math and the layouts) on the GPU, f32: the four
// GEMMs are cuBLAS sgemms in f32 accumulation (no TF32) through model/kernels/cuda/cublas.h, with
// the CPU kernel's transposes and scale placement:
//   forward   h = x A^T                      GEMM(N, T)
//             y += scale * h B^T             GEMM(N, T), alpha = scale
//   backward  g = scale * dy B               GEMM(N, N), alpha = scale (g in the workspace)
//             dB += scale * dy^T h           GEMM(T, N), alpha = scale
//             dA += g^T x                    GEMM(T, N)
//             dx += g A                      GEMM(N, N), skipped when dx is null
// Results differ from the CPU's by the GEMMs' summation order. The input dropout
// (lora_kernels.cu) evaluates dropout_math.h per element and matches the CPU bit for bit.
//
// Device pointers; validates shape and pointers, enqueues on `stream`, returns the first failure.
// Never allocates or synchronizes. Thread safety: the handle is used by one thread at a time.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_LORA_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_LORA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/lora.h"

namespace ps::cuda {

// The backward's own workspace (g [rows, rank] f32), before cuBLAS's.
inline int64_t LoraBackwardWorkspaceBytes(const LoraShape& shape) {
  return LoraBackwardWorkspaceElems(shape) * static_cast<int64_t>(sizeof(float));
}

// h[N,rank] = x A^T; y[N,out] += scale * h B^T.
[[nodiscard]] absl::Status LoraForward(const CublasHandle& cublas, const LoraShape& shape,
                                       const float* x, const float* a, const float* b, float* h,
                                       float* y, cudaStream_t stream);

// g = scale * dy B (in `workspace`, at least LoraBackwardWorkspaceBytes); db += scale * dy^T h;
// da += g^T x; dx += g A unless dx is null.
[[nodiscard]] absl::Status LoraBackward(const CublasHandle& cublas, const LoraShape& shape,
                                        const float* x, const float* a, const float* b,
                                        const float* h, const float* dy, float* dx, float* da,
                                        float* db, void* workspace, int64_t workspace_bytes,
                                        cudaStream_t stream);

// y[i] = keep(seed, i) ? x[i] * scale(p) : 0 (dropout_math.h). REQUIRES 0 <= p < 1, n > 0.
[[nodiscard]] absl::Status DropoutForward(int64_t n, float p, uint64_t seed, const float* x,
                                          float* y, cudaStream_t stream);
// dx[i] += keep(seed, i) ? dy[i] * scale(p) : 0.
[[nodiscard]] absl::Status DropoutBackward(int64_t n, float p, uint64_t seed, const float* dy,
                                           float* dx, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_LORA_H_
