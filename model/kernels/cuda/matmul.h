// Hugging Face Conv1D (y = x W + b, W stored [in, out]) on the GPU, f32, with
// cuBLAS GEMMs in f32 accumulation (no TF32) through
// model/kernels/cuda/cublas.h. Same layouts, transposes and accumulation (+=)
// as the CPU kernel (model/kernels/matmul.h):
//   forward   y = b (broadcast kernel), then y += x W            GEMM(N, N)
//   backward  dx += dy W^T                                       GEMM(N, T)
//             dW += x^T dy                                       GEMM(T, N)
//             db += column sums of dy                            deterministic
//             column reduction
// Device pointers; validates shape and pointers, enqueues on `stream`, returns
// the first failure. Never allocates (the handle owns cuBLAS's workspace) or
// synchronizes. Needs no workspace. Thread safety: the handle is used by one
// thread at a time.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_MATMUL_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_MATMUL_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/workspace_sizes.h"
#include "model/kernels/matmul.h"

namespace ps::cuda {

// y[N,out] = x[N,in] W[in,out] + b[out] (y overwritten).
[[nodiscard]] absl::Status MatmulForward(const CublasHandle& cublas, const MatmulShape& shape,
                                         const float* x, const float* w, const float* b, float* y,
                                         cudaStream_t stream);

// dx += dy W^T, dw += x^T dy, db += column sums of dy. dw and db may be null: skipped (input
// gradient only; likewise in MatmulBackwardBf16).
[[nodiscard]] absl::Status MatmulBackward(const CublasHandle& cublas, const MatmulShape& shape,
                                          const float* x, const float* w, const float* dy,
                                          float* dx, float* dw, float* db, cudaStream_t stream);

// The bf16-weight variants (model/kernels/matmul.h's MatmulForwardBf16 / MatmulBackwardBf16):
// W [in, out] bf16 read in place; the activation operands rounded to bf16 (round to nearest even,
// memory/cuda/convert_kernels.h) into the caller's workspace; cublasGemmEx with bf16 operands and
// CUBLAS_COMPUTE_32F (exact products, f32 sums, f32 outputs):
//   forward   y = b, then y += bf16(x) W
//   backward  dx += bf16(dy) W^T;  dW += bf16(x)^T bf16(dy);  db += column sums of dy (f32)
// The workspace (MatmulBf16ForwardWorkspaceBytes / MatmulBf16BackwardWorkspaceBytes in
// cuda/workspace_sizes.h, 256-byte aligned; cuBLAS's own is separate): forward bf16(x), backward
// bf16(x) and bf16(dy).
[[nodiscard]] absl::Status MatmulForwardBf16(const CublasHandle& cublas, const MatmulShape& shape,
                                             const float* x, const uint16_t* w, const float* b,
                                             float* y, void* workspace, int64_t workspace_bytes,
                                             cudaStream_t stream);
[[nodiscard]] absl::Status MatmulBackwardBf16(const CublasHandle& cublas, const MatmulShape& shape,
                                              const float* x, const uint16_t* w, const float* dy,
                                              float* dx, float* dw, float* db, void* workspace,
                                              int64_t workspace_bytes, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_MATMUL_H_
