// torch.nn.Linear (y = x W^T + b, W stored [out, in]; the bias optional) on the GPU, f32, with
// cuBLAS GEMMs in f32 accumulation (no TF32) through model/kernels/cuda/cublas.h. Same layouts,
// transposes and accumulation (+=) as the CPU kernel (model/kernels/linear.h):
//   forward   y = b (broadcast kernel) when there is a bias, then y += x W^T     GEMM(N, T)
//   backward  dx += dy W                                                       GEMM(N, N)
//             dW += dy^T x                                                     GEMM(T, N)
//             db += column sums of dy (with a bias)                  deterministic reduction
// As for GPT-2's Conv1D (cuda/matmul.h), low-precision weights are converted to f32 by the caller.
//
// Device pointers; validates shape and pointers, enqueues on `stream`, returns the first failure.
// Never allocates (the handle owns cuBLAS's workspace) or synchronizes. Needs no workspace.
// Thread safety: the handle is used by one thread at a time.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_LINEAR_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_LINEAR_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/linear.h"

namespace ps::cuda {

// y[N,out] = x[N,in] W[out,in]^T + b[out] (y overwritten; b may be null when !shape.bias and is
// then not read).
[[nodiscard]] absl::Status LinearForward(const CublasHandle& cublas, const LinearShape& shape,
                                         const float* x, const float* w, const float* b, float* y,
                                         cudaStream_t stream);

// dx += dy W, dw += dy^T x, db += column sums of dy. dw and db may be null: that gradient is
// skipped (input gradient only; db is also unused when !shape.bias).
[[nodiscard]] absl::Status LinearBackward(const CublasHandle& cublas, const LinearShape& shape,
                                          const float* x, const float* w, const float* dy,
                                          float* dx, float* dw, float* db, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_LINEAR_H_
