// Device-side helpers shared by the .cu files of model/kernels/cuda (nvcc
// only).
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_DEVICE_UTIL_CUH_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_DEVICE_UTIL_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "model/kernels/softmax_math.h"

namespace ps::cuda_internal {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Blocks of `threads` for `work` items, capped (grid-stride loops cover the
// rest).
inline unsigned int GridFor(int64_t work, int threads, int64_t max_blocks = 65535) {
  return static_cast<unsigned int>(
      std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, max_blocks)));
}

// Butterfly (xor) reductions: every lane ends with the result, and the order of
// the additions depends only on the lane layout, so results are reproducible.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = MaxOf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// std::min for device code (std::min is constexpr host-only without
// --expt-relaxed-constexpr).
template <typename T>
__host__ __device__ __forceinline__ T MinOf(T a, T b) {
  return b < a ? b : a;
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

}  // namespace ps::cuda_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_DEVICE_UTIL_CUH_
