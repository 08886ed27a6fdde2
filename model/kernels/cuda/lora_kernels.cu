// The dropout kernels of the LoRA adapters' input (model/kernels/cuda/lora.h): one thread per
// element in a grid-stride loop, dropout_math.h's mask and arithmetic, so the results are the CPU
// kernel's bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/dropout_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kThreads = 256;

__global__ void DropoutForwardKernel(int64_t n, uint64_t seed, uint32_t threshold, float scale,
                                     const float* __restrict__ x, float* __restrict__ y) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    y[i] = DropoutApply(seed, static_cast<uint64_t>(i), threshold, scale, x[i]);
  }
}

__global__ void DropoutBackwardKernel(int64_t n, uint64_t seed, uint32_t threshold, float scale,
                                      const float* __restrict__ dy, float* __restrict__ dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    dx[i] = __fadd_rn(dx[i], DropoutApply(seed, static_cast<uint64_t>(i), threshold, scale, dy[i]));
  }
}

}  // namespace

cudaError_t LaunchDropoutForward(int64_t n, float p, uint64_t seed, const float* x, float* y,
                                 cudaStream_t stream) {
  DropoutForwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, seed, DropoutThreshold(p),
                                                                      DropoutScale(p), x, y);
  return cudaGetLastError();
}

cudaError_t LaunchDropoutBackward(int64_t n, float p, uint64_t seed, const float* dy, float* dx,
                                  cudaStream_t stream) {
  DropoutBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, seed, DropoutThreshold(p),
                                                                       DropoutScale(p), dy, dx);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
