// CUDA kernels of memory/cuda/convert_kernels.h: one grid-stride loop per conversion, applying the
// __host__ __device__ functions of memory/dtype_math.h, so GPU and CPU agree bit for bit.
//
// The conversions are memory-bound (a handful of integer operations per 6 bytes moved), so the
// kernel is a plain coalesced element-per-thread loop; the grid is capped and strided so one
// launch covers any n_elems with a bounded number of blocks.
#include "memory/cuda/convert_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "memory/dtype_math.h"

namespace ps {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill any current GPU several times over; larger inputs are strided.
constexpr int64_t kMaxBlocks = 8192;

struct F32ToF16Op {
  __device__ uint16_t operator()(float x) const { return FloatToHalfBits(x); }
};
struct F16ToF32Op {
  __device__ float operator()(uint16_t x) const { return HalfBitsToFloat(x); }
};
struct F32ToBF16Op {
  __device__ uint16_t operator()(float x) const { return FloatToBFloat16Bits(x); }
};
struct BF16ToF32Op {
  __device__ float operator()(uint16_t x) const { return BFloat16BitsToFloat(x); }
};
struct F16ToBF16Op {
  __device__ uint16_t operator()(uint16_t x) const {
    return FloatToBFloat16Bits(HalfBitsToFloat(x));
  }
};
struct BF16ToF16Op {
  __device__ uint16_t operator()(uint16_t x) const {
    return FloatToHalfBits(BFloat16BitsToFloat(x));
  }
};

template <typename Src, typename Dst, typename Op>
__global__ void ConvertKernel(const Src* __restrict__ src, Dst* __restrict__ dst, int64_t n_elems,
                              Op op) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_elems;
       i += stride) {
    dst[i] = op(src[i]);
  }
}

template <typename Op, typename Src, typename Dst>
cudaError_t Launch(const Src* src, Dst* dst, int64_t n_elems, cudaStream_t stream) {
  if (n_elems < 0) return cudaErrorInvalidValue;
  if (n_elems == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  const int64_t blocks =
      std::min<int64_t>((n_elems + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks);
  ConvertKernel<<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0, stream>>>(src, dst,
                                                                                   n_elems, Op{});
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchConvertF32ToF16(const float* src, uint16_t* dst, int64_t n_elems,
                                  cudaStream_t stream) {
  return Launch<F32ToF16Op>(src, dst, n_elems, stream);
}

cudaError_t LaunchConvertF16ToF32(const uint16_t* src, float* dst, int64_t n_elems,
                                  cudaStream_t stream) {
  return Launch<F16ToF32Op>(src, dst, n_elems, stream);
}

cudaError_t LaunchConvertF32ToBF16(const float* src, uint16_t* dst, int64_t n_elems,
                                   cudaStream_t stream) {
  return Launch<F32ToBF16Op>(src, dst, n_elems, stream);
}

cudaError_t LaunchConvertBF16ToF32(const uint16_t* src, float* dst, int64_t n_elems,
                                   cudaStream_t stream) {
  return Launch<BF16ToF32Op>(src, dst, n_elems, stream);
}

cudaError_t LaunchConvertF16ToBF16(const uint16_t* src, uint16_t* dst, int64_t n_elems,
                                   cudaStream_t stream) {
  return Launch<F16ToBF16Op>(src, dst, n_elems, stream);
}

cudaError_t LaunchConvertBF16ToF16(const uint16_t* src, uint16_t* dst, int64_t n_elems,
                                   cudaStream_t stream) {
  return Launch<BF16ToF16Op>(src, dst, n_elems, stream);
}

}  // namespace cuda
}  // namespace ps
