// The 4-bit dequantization on the GPU: nf4_math.h's arithmetic (one float32 product per value,
// the nested absmax as __fmul_rn then __fadd_rn), so each value is bit for bit the CPU codec's;
// bf16 / f16 outputs round that value with memory/dtype_math.h's conversions, as the CPU's do.
// Also the roundings of the 16-bit compute (bnb_4bit_compute_dtype bf16 / f16; cuda/nf4.h).
#include <cstdint>

#include "memory/dtype_math.h"
#include "model/kernels/cuda/internal/nf4_launchers.h"
#include "model/kernels/nf4_math.h"

namespace ps::cuda_internal {
namespace {

__constant__ float kLevels[2][16] = {{PS_NF4_LEVELS}, {PS_FP4_LEVELS}};
__constant__ float kMap[256] = {PS_DYNAMIC_MAP_8BIT};

constexpr int kThreads = 256;

// Stores one dequantized value as Out.
template <Quant4Out kOut>
__device__ __forceinline__ void Store(float v, void* dst, int64_t i) {
  if constexpr (kOut == Quant4Out::kF32) {
    static_cast<float*>(dst)[i] = v;
  } else if constexpr (kOut == Quant4Out::kBF16) {
    static_cast<uint16_t*>(dst)[i] = FloatToBFloat16Bits(v);
  } else {
    static_cast<uint16_t*>(dst)[i] = FloatToHalfBits(v);
  }
}

template <Quant4Out kOut>
__global__ void Dequantize4BitKernel(int type, const uint8_t* __restrict__ codes,
                                     const float* __restrict__ absmax,
                                     const uint8_t* __restrict__ nested_codes,
                                     const float* __restrict__ nested_absmax, float offset,
                                     int64_t e0, int64_t rows, int64_t cols, int64_t ld,
                                     void* __restrict__ dst) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const int64_t e = e0 + r * ld + c;
    const int64_t block = e / kQuant4BlockElems;
    const float a = absmax != nullptr
                        ? absmax[block]
                        : DequantizeNestedAbsmax(kMap, nested_codes[block],
                                                 nested_absmax[block / kQuant4NestedBlockElems],
                                                 offset);
    const uint8_t byte = codes[e >> 1];
    const uint8_t code = (e & 1) ? (byte & 0x0F) : (byte >> 4);
    Store<kOut>(__fmul_rn(kLevels[type][code], a), dst, i);
  }
}

__global__ void BroadcastRowsKernel(const float* __restrict__ b, int64_t rows, int64_t n,
                                    float* __restrict__ y) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = b[i % n];
  }
}

// v rounded to bf16 / f16 (nearest even) and widened back.
template <Quant4Out kOut>
__device__ __forceinline__ float Round16(float v) {
  if constexpr (kOut == Quant4Out::kBF16) {
    return BFloat16BitsToFloat(FloatToBFloat16Bits(v));
  } else {
    return HalfBitsToFloat(FloatToHalfBits(v));
  }
}

template <Quant4Out kOut>
__global__ void RoundTo16BitsKernel(const float* __restrict__ src, int64_t n,
                                    uint16_t* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = kOut == Quant4Out::kBF16 ? FloatToBFloat16Bits(src[i]) : FloatToHalfBits(src[i]);
  }
}

template <Quant4Out kOut>
__global__ void Round16InPlaceKernel(float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = Round16<kOut>(y[i]);
  }
}

template <Quant4Out kOut>
__global__ void AddRounded16Kernel(const float* __restrict__ g, int64_t rows, int64_t cols,
                                   float* __restrict__ dst, int64_t ld) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * ld + c] = __fadd_rn(dst[r * ld + c], Round16<kOut>(g[i]));
  }
}

unsigned int Blocks(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace

cudaError_t LaunchDequantize4Bit(int type, const uint8_t* codes, const float* absmax,
                                 const uint8_t* nested_codes, const float* nested_absmax,
                                 float offset, int64_t e0, int64_t rows, int64_t cols, int64_t ld,
                                 Quant4Out out, void* dst, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  const unsigned int blocks = Blocks(rows * cols);
  switch (out) {
    case Quant4Out::kF32:
      Dequantize4BitKernel<Quant4Out::kF32><<<blocks, kThreads, 0, stream>>>(
          type, codes, absmax, nested_codes, nested_absmax, offset, e0, rows, cols, ld, dst);
      break;
    case Quant4Out::kBF16:
      Dequantize4BitKernel<Quant4Out::kBF16><<<blocks, kThreads, 0, stream>>>(
          type, codes, absmax, nested_codes, nested_absmax, offset, e0, rows, cols, ld, dst);
      break;
    case Quant4Out::kF16:
      Dequantize4BitKernel<Quant4Out::kF16><<<blocks, kThreads, 0, stream>>>(
          type, codes, absmax, nested_codes, nested_absmax, offset, e0, rows, cols, ld, dst);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchBroadcastRows(const float* b, int64_t rows, int64_t n, float* y,
                                cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  BroadcastRowsKernel<<<Blocks(rows * n), kThreads, 0, stream>>>(b, rows, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchRoundTo16Bits(const float* src, int64_t n, Quant4Out out, uint16_t* dst,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (out == Quant4Out::kBF16) {
    RoundTo16BitsKernel<Quant4Out::kBF16><<<Blocks(n), kThreads, 0, stream>>>(src, n, dst);
  } else {
    RoundTo16BitsKernel<Quant4Out::kF16><<<Blocks(n), kThreads, 0, stream>>>(src, n, dst);
  }
  return cudaGetLastError();
}

cudaError_t LaunchRound16InPlace(float* y, int64_t n, Quant4Out out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (out == Quant4Out::kBF16) {
    Round16InPlaceKernel<Quant4Out::kBF16><<<Blocks(n), kThreads, 0, stream>>>(y, n);
  } else {
    Round16InPlaceKernel<Quant4Out::kF16><<<Blocks(n), kThreads, 0, stream>>>(y, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddRounded16(const float* g, int64_t rows, int64_t cols, Quant4Out out,
                               float* dst, int64_t ld, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  if (out == Quant4Out::kBF16) {
    AddRounded16Kernel<Quant4Out::kBF16><<<Blocks(rows * cols), kThreads, 0, stream>>>(
        g, rows, cols, dst, ld);
  } else {
    AddRounded16Kernel<Quant4Out::kF16><<<Blocks(rows * cols), kThreads, 0, stream>>>(
        g, rows, cols, dst, ld);
  }
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
