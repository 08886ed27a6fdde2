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

#include "absl/status/status.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/matmul.h"

namespace ps::cuda {

// y[N,out] = x[N,in] W[in,out] + b[out] (y overwritten).
[[nodiscard]] absl::Status MatmulForward(const CublasHandle& cublas, const MatmulShape& shape,
                                         const float* x, const float* w, const float* b, float* y,
                                         cudaStream_t stream);

// dx += dy W^T, dw += x^T dy, db += column sums of dy.
[[nodiscard]] absl::Status MatmulBackward(const CublasHandle& cublas, const MatmulShape& shape,
                                          const float* x, const float* w, const float* dy,
                                          float* dx, float* dw, float* db, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_MATMUL_H_
