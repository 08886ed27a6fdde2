// Bulk dtype conversions on the GPU: f32 <-> f16, f32 <-> bf16 and f16 <-> bf16.
//
// Each kernel applies the scalar functions of memory/dtype_math.h element by element, so a GPU
// conversion gives exactly the bits the CPU paths (memory/convert.h) give: round-to-nearest-even,
// subnormals kept, overflow to Inf, NaNs quieted with sign and payload kept. CUDA's own
// __float2half/__float2bfloat16 are deliberately not used: they canonicalize NaNs.
//
// The launchers are plain C++ (no Abseil, includable from host code compiled by the host compiler):
// they enqueue one grid-stride kernel on `stream` and return the launch status from
// cudaGetLastError() (which also reports, and clears, an earlier asynchronous error of this
// thread). They never allocate and never synchronize; completion is observed through the stream.
//
// REQUIRES for every launcher: src and dst are device (or managed) pointers to at least n_elems
// elements each, aligned to their element type, not overlapping; they stay valid until the
// kernel has run. n_elems == 0 launches nothing and returns cudaSuccess; n_elems < 0, or a null
// pointer with n_elems > 0, returns cudaErrorInvalidValue without launching.
//
// Thread safety: as for any kernel launch; the launchers have no state.
#ifndef PATRICKSTAR_MEMORY_CUDA_CONVERT_KERNELS_H_
#define PATRICKSTAR_MEMORY_CUDA_CONVERT_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace ps {
namespace cuda {

// dst[i] = FloatToHalfBits(src[i]).
cudaError_t LaunchConvertF32ToF16(const float* src, uint16_t* dst, int64_t n_elems,
                                  cudaStream_t stream);

// dst[i] = HalfBitsToFloat(src[i]).
cudaError_t LaunchConvertF16ToF32(const uint16_t* src, float* dst, int64_t n_elems,
                                  cudaStream_t stream);

// dst[i] = FloatToBFloat16Bits(src[i]).
cudaError_t LaunchConvertF32ToBF16(const float* src, uint16_t* dst, int64_t n_elems,
                                   cudaStream_t stream);

// dst[i] = BFloat16BitsToFloat(src[i]).
cudaError_t LaunchConvertBF16ToF32(const uint16_t* src, float* dst, int64_t n_elems,
                                   cudaStream_t stream);

// dst[i] = FloatToBFloat16Bits(HalfBitsToFloat(src[i])): f16 -> bf16 through an exact f32.
cudaError_t LaunchConvertF16ToBF16(const uint16_t* src, uint16_t* dst, int64_t n_elems,
                                   cudaStream_t stream);

// dst[i] = FloatToHalfBits(BFloat16BitsToFloat(src[i])): bf16 -> f16 through an exact f32.
cudaError_t LaunchConvertBF16ToF16(const uint16_t* src, uint16_t* dst, int64_t n_elems,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CUDA_CONVERT_KERNELS_H_
