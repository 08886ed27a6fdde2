// Bulk dtype conversions on the CPU: f32 <-> f16, f32 <-> bf16, and a DType-driven Convert().
//
// Every function here produces, element for element, exactly the bits of the scalar reference in
// memory/dtype_math.h (round-to-nearest-even, subnormals, overflow to Inf, quiet NaNs keeping sign
// and payload), on every instruction set. They are vectorized with Highway and pick the best
// instruction set of the running CPU at the first call (AVX-512, AVX2+F16C, SSE4, SSSE3 or
// scalar); no -march flag is needed. Where the hardware has an exactly matching instruction (F16C
// VCVTPS2PH with an explicit round-to-nearest immediate, VCVTPH2PS) it is used; everywhere else the
// rounding is done with integer SIMD operations that mirror dtype_math.h, because Highway 1.0.3's
// portable DemoteTo/PromoteTo do not (bf16 demotion truncates; f16 demotion without F16C truncates,
// clamps overflow to a finite value and turns NaN into a number; f16 promotion without F16C turns
// Inf/NaN into 65536-ish numbers).
//
// Lengths are in elements. Any length works, and src and dst need no alignment beyond their
// element type's (no vector alignment); the four typed functions do nothing when n_elems <= 0.
// REQUIRES for all functions: src and dst do not overlap; when n_elems > 0 both point to at least
// n_elems elements of their type, aligned to the element size.
//
// Thread safety: all functions are thread-safe (they only read src and write dst; the one-time
// target selection inside Highway is thread-safe).
#ifndef PATRICKSTAR_MEMORY_CONVERT_H_
#define PATRICKSTAR_MEMORY_CONVERT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "memory/dtype.h"

namespace ps {

// dst[i] = FloatToHalfBits(src[i]) for i in [0, n_elems).
void ConvertF32ToF16(const float* src, uint16_t* dst, int64_t n_elems);

// dst[i] = HalfBitsToFloat(src[i]).
void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n_elems);

// dst[i] = FloatToBFloat16Bits(src[i]).
void ConvertF32ToBF16(const float* src, uint16_t* dst, int64_t n_elems);

// dst[i] = BFloat16BitsToFloat(src[i]).
void ConvertBF16ToF32(const uint16_t* src, float* dst, int64_t n_elems);

// Converts n_elems elements of src_dtype at src into dst_dtype at dst, for all nine (src, dst)
// pairs. Same dtype is a plain copy (bits preserved, signaling NaNs included). f16 <-> bf16 goes
// through f32, i.e. gives exactly FloatToBFloat16Bits(HalfBitsToFloat(x)) and
// FloatToHalfBits(BFloat16BitsToFloat(x)) (the f32 step is exact, so only one rounding happens).
// Errors: InvalidArgument if n_elems < 0, if a dtype is not one of the enumerators, or, when
// n_elems > 0, if src or dst is null or not aligned to its element size. Nothing is written on
// error.
[[nodiscard]] absl::Status Convert(DType src_dtype, const void* src, DType dst_dtype, void* dst,
                                   int64_t n_elems);

// The Highway target the conversions above dispatch to right now, e.g. "AVX3", "AVX2", "SSE4",
// "SCALAR". For logs and benchmark labels. Tests may change it with
// hwy::SetSupportedTargetsForTest().
const char* ConvertTargetName();

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CONVERT_H_
