// Bit-exact scalar conversions between f32 and the two 16-bit storage types, f16 and bf16.
//
// These functions are the definition of what a conversion means in this project. The vectorized
// CPU paths (memory/convert.h) and the CUDA kernels (memory/cuda/convert_kernels.h) are required
// to produce the same bits for every input; the GPU kernels call these very functions, and the CPU
// tests compare the SIMD paths against them on every instruction set.
//
// Bit layouts (sign | exponent | mantissa, most significant bit first):
//
//   f32   1 |  8 (bias 127) | 23      value = (-1)^s * 1.m * 2^(e-127), e in [1, 254]
//   f16   1 |  5 (bias  15) | 10      value = (-1)^s * 1.m * 2^(e-15),  e in [1, 30]
//   bf16  1 |  8 (bias 127) |  7      value = (-1)^s * 1.m * 2^(e-127), e in [1, 254]
//
// Exponent field 0 holds zero (m == 0) and subnormals, value = (-1)^s * 0.m * 2^(1-bias); the
// all-ones exponent holds infinity (m == 0) and NaN (m != 0). bf16 is exactly the top half of an
// f32, so bf16 -> f32 is a shift and f32 -> bf16 only has to round away the low 16 bits. f16 has a
// smaller exponent range: largest finite 65504 = 0x7bff, smallest normal 2^-14 = 0x0400, smallest
// subnormal 2^-24 = 0x0001.
//
// Rounding (f32 -> f16/bf16) is IEEE round-to-nearest, ties-to-even, done with integer arithmetic
// so that it does not depend on the FPU's rounding mode, flush-to-zero or denormals-are-zero
// flags, and is identical on host and device. To drop the low k bits of a non-negative integer
// magnitude x with round-to-nearest-even:
//
//     (x + (2^(k-1) - 1) + ((x >> k) & 1)) >> k
//
// Adding just under one half rounds up exactly when the dropped bits exceed one half; the extra
// +1 when the kept part is odd turns an exact tie into a round-up for odd results only, so ties go
// to the even neighbour. A carry out of the mantissa increments the exponent, which is exactly
// right (1.111..1 rounds up to 2.0), and a carry out of the largest finite value lands on the
// infinity encoding. For f32 -> bf16 this works on the whole bit pattern with k = 16. For f32 ->
// f16 normal results we first rebias the exponent (subtract (127 - 15) << 23) and use k = 13.
// Results that are f16 subnormals are computed from the f32 significand with its implicit 1
// restored, shifted right by k = 126 - e (14..24), so a value just under 2^-14 may round up to the
// smallest normal, again with no special case. |x| <= 2^-25 (half the smallest subnormal; the tie
// goes to even zero) gives a signed zero, |x| >= 65520 (halfway between 65504 and 2^16) gives
// infinity.
//
// Infinity maps to infinity, zero to zero, both keeping their sign.
//
// NaN policy (the same as x86 F16C VCVTPS2PH/VCVTPH2PS and the IEEE recommendation): the result of
// converting a NaN is a *quiet* NaN with the same sign, whose payload is the input payload aligned
// at the top of the mantissa, truncated when narrowing, zero-extended when widening; the quiet bit
// (the mantissa's most significant bit) is always set. Concretely:
//   f32 -> f16:   sign | 0x7e00 | (f32 mantissa bits 22..13)
//   f32 -> bf16:  sign | 0x7fc0 | (f32 mantissa bits 22..16)
//   f16 -> f32:   sign | 0x7fc00000 | (f16 mantissa << 13)
//   bf16 -> f32:  sign | 0x7fc00000 | (bf16 mantissa << 16)
// So a quiet NaN survives a narrow -> widen -> narrow round trip bit for bit, and a signaling NaN
// comes back quiet (with the quiet bit ORed in) instead of ever turning into infinity.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MEMORY_DTYPE_MATH_H_
#define PATRICKSTAR_MEMORY_DTYPE_MATH_H_

#include <cstdint>
#include <cstring>

#include "base/host_device.h"

namespace ps {
namespace dtype_internal {

// Bit casts usable in host C++ and in CUDA device code (where std::memcpy and std::bit_cast are
// not guaranteed to be available).
PS_HOST_DEVICE uint32_t FloatAsBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

PS_HOST_DEVICE float BitsAsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Number of leading zero bits. REQUIRES: x != 0.
PS_HOST_DEVICE int CountLeadingZeros32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(x));
#else
  return __builtin_clz(x);
#endif
}

// Constants of the encodings, named once.
inline constexpr uint32_t kF32AbsMask = 0x7fffffffu;
inline constexpr uint32_t kF32Inf = 0x7f800000u;
inline constexpr uint32_t kF32QuietBit = 0x00400000u;
inline constexpr uint32_t kF32MantissaMask = 0x007fffffu;
inline constexpr uint32_t kF16Inf = 0x7c00u;
inline constexpr uint32_t kF16QuietNaN = 0x7e00u;  // Inf | quiet bit
inline constexpr uint32_t kBF16QuietBit = 0x0040u;
// (127 - 15) << 23: subtracting it from an f32 pattern rebiases the exponent to f16's bias.
inline constexpr uint32_t kF32ToF16Rebias = 0x38000000u;
// |x| at or above this rounds to f16 infinity: 65520 = 65504 + half an ulp (the tie goes to the
// even encoding 0x7c00).
inline constexpr uint32_t kF16OverflowThreshold = 0x477ff000u;
// 2^-14, the smallest normal f16.
inline constexpr uint32_t kF16MinNormalAsF32 = 0x38800000u;
// 2^-25, half the smallest f16 subnormal; |x| <= this rounds to zero.
inline constexpr uint32_t kF16HalfMinSubnormalAsF32 = 0x33000000u;

}  // namespace dtype_internal

// f32 -> f16 bits, round-to-nearest-even; overflow to +-Inf; NaN as described above.
PS_HOST_DEVICE uint16_t FloatToHalfBits(float f) {
  namespace di = dtype_internal;
  const uint32_t x = di::FloatAsBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & di::kF32AbsMask;
  uint32_t h;
  if (abs > di::kF32Inf) {  // NaN: quiet, keep the top 10 payload bits.
    h = di::kF16QuietNaN | ((abs >> 13) & 0x03ffu);
  } else if (abs >= di::kF16OverflowThreshold) {  // Rounds past 65504, or is Inf.
    h = di::kF16Inf;
  } else if (abs >= di::kF16MinNormalAsF32) {  // Normal f16: rebias, drop 13 bits.
    h = (abs - di::kF32ToF16Rebias + 0x0fffu + ((abs >> 13) & 1u)) >> 13;
  } else if (abs > di::kF16HalfMinSubnormalAsF32) {  // Subnormal f16 (or rounds up to 2^-14).
    // value / 2^-24 = significand * 2^(e - 150 + 24) = significand >> (126 - e).
    const uint32_t shift = 126u - (abs >> 23);  // in [14, 24]
    const uint32_t significand = (abs & di::kF32MantissaMask) | 0x00800000u;
    h = (significand + ((1u << (shift - 1)) - 1u) + ((significand >> shift) & 1u)) >> shift;
  } else {  // |x| <= 2^-25, including f32 subnormals and zero.
    h = 0;
  }
  return static_cast<uint16_t>(sign | h);
}

// f16 bits -> f32. Exact (every f16 is an f32) except that a signaling NaN comes back quiet.
PS_HOST_DEVICE float HalfBitsToFloat(uint16_t h) {
  namespace di = dtype_internal;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x03ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {  // Inf or NaN.
    bits = di::kF32Inf | (mantissa << 13) | (mantissa != 0 ? di::kF32QuietBit : 0u);
  } else if (exponent != 0) {  // Normal: rebias the exponent, widen the mantissa.
    bits = ((exponent + (127u - 15u)) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // Subnormal: mantissa * 2^-24, normalized.
    // p = index of the leading 1 (0..9); value = 1.xxx * 2^(p - 24), biased exponent p + 103.
    const uint32_t p = 31u - static_cast<uint32_t>(di::CountLeadingZeros32(mantissa));
    bits = ((p + 103u) << 23) | ((mantissa << (23u - p)) & di::kF32MantissaMask);
  } else {
    bits = 0;
  }
  return di::BitsAsFloat(sign | bits);
}

// f32 -> bf16 bits, round-to-nearest-even; overflow to +-Inf; NaN as described above.
PS_HOST_DEVICE uint16_t FloatToBFloat16Bits(float f) {
  namespace di = dtype_internal;
  const uint32_t x = di::FloatAsBits(f);
  if ((x & di::kF32AbsMask) > di::kF32Inf) {  // NaN: quiet, keep the top 7 payload bits.
    return static_cast<uint16_t>((x >> 16) | di::kBF16QuietBit);
  }
  // Cannot overflow 32 bits: the largest non-NaN pattern is 0xff800000.
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// bf16 bits -> f32. Exact except that a signaling NaN comes back quiet.
PS_HOST_DEVICE float BFloat16BitsToFloat(uint16_t b) {
  namespace di = dtype_internal;
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  if ((bits & di::kF32AbsMask) > di::kF32Inf) bits |= di::kF32QuietBit;
  return di::BitsAsFloat(bits);
}

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_DTYPE_MATH_H_
