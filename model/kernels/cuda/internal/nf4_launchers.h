// cudaError_t launchers of model/kernels/cuda/nf4_kernels.cu (no argument checks: nf4.cc's).
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_NF4_LAUNCHERS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_NF4_LAUNCHERS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace ps::cuda_internal {

// How a dequantized value is stored: f32, or that f32 value rounded to nearest even to bf16 / f16
// (memory/dtype_math.h's conversions, as the CPU codec's bulk ones).
enum class Quant4Out { kF32 = 0, kBF16 = 1, kF16 = 2 };

// dst[r * cols + c] = value e0 + r * ld + c of the 4-bit tensor (device pointers; type 0 NF4, 1
// FP4; absmax null: the nested state), stored as `out`, for r < rows, c < cols: one element per
// thread, scales resolved per element (nested: the 8-bit code book in constant memory). Plain
// pointers, so nvcc never parses the host headers (model/kernels/nf4.h's Quant4Tensor holds the
// same fields).
cudaError_t LaunchDequantize4Bit(int type, const uint8_t* codes, const float* absmax,
                                 const uint8_t* nested_codes, const float* nested_absmax,
                                 float offset, int64_t e0, int64_t rows, int64_t cols, int64_t ld,
                                 Quant4Out out, void* dst, cudaStream_t stream);

// y[r * n + c] = b[c] for r < rows, c < n.
cudaError_t LaunchBroadcastRows(const float* b, int64_t rows, int64_t n, float* y,
                                cudaStream_t stream);

// The 16-bit compute (out kBF16 or kF16; memory/dtype_math.h's round-to-nearest-even):
// dst[i] = the bits of src[i] rounded, for i < n.
cudaError_t LaunchRoundTo16Bits(const float* src, int64_t n, Quant4Out out, uint16_t* dst,
                                cudaStream_t stream);
// y[i] = y[i] rounded and widened back to f32, for i < n.
cudaError_t LaunchRound16InPlace(float* y, int64_t n, Quant4Out out, cudaStream_t stream);
// dst[r * ld + c] += g[r * cols + c] rounded (widened back to f32), for r < rows, c < cols.
cudaError_t LaunchAddRounded16(const float* g, int64_t rows, int64_t cols, Quant4Out out,
                               float* dst, int64_t ld, cudaStream_t stream);

}  // namespace ps::cuda_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_NF4_LAUNCHERS_H_
