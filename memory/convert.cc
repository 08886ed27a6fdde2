// Highway implementation of memory/convert.h. This file is compiled once per SIMD target:
// hwy/foreach_target.h re-includes it with HWY_TARGET set to each target and HWY_EXPORT /
// HWY_DYNAMIC_DISPATCH (in the HWY_ONCE section at the bottom) pick one at run time, as in
// Highway's hwy/examples/skeleton.cc.
//
// Per target, each conversion is one loop over whole vectors (unaligned loads and stores) plus a
// scalar tail that calls memory/dtype_math.h directly. The vector bodies below are the scalar
// functions of dtype_math.h written lane-wise with branches turned into selects; see that header
// for the bit layouts and the rounding argument. Every branch is computed for every lane and the
// right one selected, so lanes whose branch is not taken may compute garbage (wrapped unsigned
// arithmetic, clamped shift counts) that is never used.
#include "memory/convert.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memory/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ps {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x86 targets from AVX2 up guarantee F16C, whose conversions (with the explicit round-to-nearest
// immediate Highway passes) are bit-identical to dtype_math.h, NaN quieting included. Every other
// target uses the integer emulation below.
#undef PS_CONVERT_USE_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define PS_CONVERT_USE_F16C 1
#else
#define PS_CONVERT_USE_F16C 0
#endif

// Signed compare of u32 lanes known to be in [0, 2^31): a > b, as a u32 mask.
template <class DU32, class V>
HWY_INLINE hn::Mask<DU32> GreaterThan(DU32 du32, V a, uint32_t b) {
  const hn::RebindToSigned<DU32> di32;
  return hn::RebindMask(du32, hn::BitCast(di32, a) > hn::Set(di32, static_cast<int32_t>(b)));
}

// FloatToHalfBits, lane-wise: f32 bit patterns in, f16 bit patterns (zero-extended) out.
template <class DU32, class V>
HWY_INLINE V F32BitsToF16Bits(DU32 du32, V x) {
  namespace dti = dtype_internal;
  const hn::RebindToSigned<DU32> di32;
  const V abs = hn::And(x, hn::Set(du32, dti::kF32AbsMask));
  const V sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du32, 0x8000u));
  const V one = hn::Set(du32, 1u);

  const V nan = hn::Or(hn::Set(du32, dti::kF16QuietNaN),
                       hn::And(hn::ShiftRight<13>(abs), hn::Set(du32, 0x03ffu)));

  const V normal_odd = hn::And(hn::ShiftRight<13>(abs), one);
  const V normal = hn::ShiftRight<13>(hn::Add(hn::Sub(abs, hn::Set(du32, dti::kF32ToF16Rebias)),
                                              hn::Add(hn::Set(du32, 0x0fffu), normal_odd)));

  // Subnormal: significand >> (126 - e), rounded; the shift is clamped to [14, 24] so lanes of
  // other classes never shift by >= 32 (undefined in C++, which the scalar target would be).
  const V exponent = hn::ShiftRight<23>(abs);
  const V shift = hn::BitCast(
      du32,
      hn::Min(hn::Max(hn::Sub(hn::Set(di32, 126), hn::BitCast(di32, exponent)), hn::Set(di32, 14)),
              hn::Set(di32, 24)));
  const V significand =
      hn::Or(hn::And(abs, hn::Set(du32, dti::kF32MantissaMask)), hn::Set(du32, 0x00800000u));
  const V half_minus_one = hn::Sub((one << hn::Sub(shift, one)), one);
  const V sub_odd = hn::And((significand >> shift), one);
  const V subnormal = hn::Add(significand, hn::Add(half_minus_one, sub_odd)) >> shift;

  V h = hn::IfThenElseZero(GreaterThan(du32, abs, dti::kF16HalfMinSubnormalAsF32), subnormal);
  h = hn::IfThenElse(GreaterThan(du32, abs, dti::kF16MinNormalAsF32 - 1), normal, h);
  h = hn::IfThenElse(GreaterThan(du32, abs, dti::kF16OverflowThreshold - 1),
                     hn::Set(du32, dti::kF16Inf), h);
  h = hn::IfThenElse(GreaterThan(du32, abs, dti::kF32Inf), nan, h);
  return hn::Or(sign, h);
}

// HalfBitsToFloat, lane-wise: zero-extended f16 bit patterns in, f32 bit patterns out.
template <class DU32, class V>
HWY_INLINE V F16BitsToF32Bits(DU32 du32, V h) {
  namespace dti = dtype_internal;
  const hn::Rebind<float, DU32> df32;
  const hn::RebindToSigned<DU32> di32;
  const V sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du32, 0x8000u)));
  const V abs = hn::And(h, hn::Set(du32, 0x7fffu));
  const V widened = hn::ShiftLeft<13>(abs);

  const V normal = hn::Add(widened, hn::Set(du32, (127u - 15u) << 23));
  // Inf/NaN: all-ones exponent, payload kept, quiet bit set for NaN.
  const V nan_quiet =
      hn::IfThenElseZero(GreaterThan(du32, abs, dti::kF16Inf), hn::Set(du32, dti::kF32QuietBit));
  const V inf_nan = hn::Or(hn::Or(widened, hn::Set(du32, dti::kF32Inf)), nan_quiet);
  // Subnormal (and zero): mantissa * 2^-24. Both steps are exact in f32 (an integer below 2^10,
  // and a power-of-two scaling with a normal result), so neither the rounding mode nor FTZ/DAZ can
  // change the outcome.
  const V subnormal = hn::BitCast(du32, hn::Mul(hn::ConvertTo(df32, hn::BitCast(di32, abs)),
                                                hn::Set(df32, 1.0f / 16777216.0f)));

  V bits = hn::IfThenElse(GreaterThan(du32, abs, 0x03ffu), normal, subnormal);
  bits = hn::IfThenElse(GreaterThan(du32, abs, dti::kF16Inf - 1), inf_nan, bits);
  return hn::Or(sign, bits);
}

// FloatToBFloat16Bits, lane-wise.
template <class DU32, class V>
HWY_INLINE V F32BitsToBF16Bits(DU32 du32, V x) {
  namespace dti = dtype_internal;
  const V abs = hn::And(x, hn::Set(du32, dti::kF32AbsMask));
  const V odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du32, 1u));
  const V rounded = hn::ShiftRight<16>(hn::Add(x, hn::Add(hn::Set(du32, 0x7fffu), odd)));
  const V nan = hn::Or(hn::ShiftRight<16>(x), hn::Set(du32, dti::kBF16QuietBit));
  return hn::IfThenElse(GreaterThan(du32, abs, dti::kF32Inf), nan, rounded);
}

// BFloat16BitsToFloat, lane-wise.
template <class DU32, class V>
HWY_INLINE V BF16BitsToF32Bits(DU32 du32, V b) {
  namespace dti = dtype_internal;
  const V bits = hn::ShiftLeft<16>(b);
  const V abs = hn::And(bits, hn::Set(du32, dti::kF32AbsMask));
  return hn::Or(bits, hn::IfThenElseZero(GreaterThan(du32, abs, dti::kF32Inf),
                                         hn::Set(du32, dti::kF32QuietBit)));
}

void F32ToF16Loop(const float* HWY_RESTRICT src, uint16_t* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> df32;
  const hn::Rebind<uint16_t, decltype(df32)> du16;
  const size_t lanes = hn::Lanes(df32);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df32, src + i);
#if PS_CONVERT_USE_F16C
    const hn::Rebind<hwy::float16_t, decltype(df32)> df16;
    hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, v)), du16, dst + i);
#else
    const hn::RebindToUnsigned<decltype(df32)> du32;
    const hn::RebindToSigned<decltype(df32)> di32;
    const auto h = F32BitsToF16Bits(du32, hn::BitCast(du32, v));
    // Lanes hold values <= 0xffff, so the saturating i32 -> u16 demotion is exact.
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, h)), du16, dst + i);
#endif
  }
  for (; i < n; ++i) dst[i] = FloatToHalfBits(src[i]);
}

void F16ToF32Loop(const uint16_t* HWY_RESTRICT src, float* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> df32;
  const hn::Rebind<uint16_t, decltype(df32)> du16;
  const size_t lanes = hn::Lanes(df32);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto h = hn::LoadU(du16, src + i);
#if PS_CONVERT_USE_F16C
    const hn::Rebind<hwy::float16_t, decltype(df32)> df16;
    hn::StoreU(hn::PromoteTo(df32, hn::BitCast(df16, h)), df32, dst + i);
#else
    const hn::RebindToUnsigned<decltype(df32)> du32;
    const auto bits = F16BitsToF32Bits(du32, hn::PromoteTo(du32, h));
    hn::StoreU(hn::BitCast(df32, bits), df32, dst + i);
#endif
  }
  for (; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
}

void F32ToBF16Loop(const float* HWY_RESTRICT src, uint16_t* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> df32;
  const hn::RebindToUnsigned<decltype(df32)> du32;
  const hn::RebindToSigned<decltype(df32)> di32;
  const hn::Rebind<uint16_t, decltype(df32)> du16;
  const size_t lanes = hn::Lanes(df32);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto b = F32BitsToBF16Bits(du32, hn::BitCast(du32, hn::LoadU(df32, src + i)));
    // Lanes hold values <= 0xffff, so the saturating i32 -> u16 demotion is exact.
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, b)), du16, dst + i);
  }
  for (; i < n; ++i) dst[i] = FloatToBFloat16Bits(src[i]);
}

void BF16ToF32Loop(const uint16_t* HWY_RESTRICT src, float* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> df32;
  const hn::RebindToUnsigned<decltype(df32)> du32;
  const hn::Rebind<uint16_t, decltype(df32)> du16;
  const size_t lanes = hn::Lanes(df32);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto bits = BF16BitsToF32Bits(du32, hn::PromoteTo(du32, hn::LoadU(du16, src + i)));
    hn::StoreU(hn::BitCast(df32, bits), df32, dst + i);
  }
  for (; i < n; ++i) dst[i] = BFloat16BitsToFloat(src[i]);
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace ps
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ps {

HWY_EXPORT(F32ToF16Loop);
HWY_EXPORT(F16ToF32Loop);
HWY_EXPORT(F32ToBF16Loop);
HWY_EXPORT(BF16ToF32Loop);
HWY_EXPORT(TargetNameImpl);

namespace {

// Elements per step of the two-stage f16 <-> bf16 conversions; the f32 staging buffer (16 KiB)
// stays in L1.
constexpr size_t kStagingElems = 4096;

bool IsValidDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

}  // namespace

void ConvertF32ToF16(const float* src, uint16_t* dst, int64_t n_elems) {
  if (n_elems <= 0) return;
  HWY_DYNAMIC_DISPATCH(F32ToF16Loop)(src, dst, static_cast<size_t>(n_elems));
}

void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n_elems) {
  if (n_elems <= 0) return;
  HWY_DYNAMIC_DISPATCH(F16ToF32Loop)(src, dst, static_cast<size_t>(n_elems));
}

void ConvertF32ToBF16(const float* src, uint16_t* dst, int64_t n_elems) {
  if (n_elems <= 0) return;
  HWY_DYNAMIC_DISPATCH(F32ToBF16Loop)(src, dst, static_cast<size_t>(n_elems));
}

void ConvertBF16ToF32(const uint16_t* src, float* dst, int64_t n_elems) {
  if (n_elems <= 0) return;
  HWY_DYNAMIC_DISPATCH(BF16ToF32Loop)(src, dst, static_cast<size_t>(n_elems));
}

absl::Status Convert(DType src_dtype, const void* src, DType dst_dtype, void* dst,
                     int64_t n_elems) {
  if (!IsValidDType(src_dtype) || !IsValidDType(dst_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Convert: unknown dtype (src_dtype=", static_cast<int>(src_dtype),
                     ", dst_dtype=", static_cast<int>(dst_dtype), ")"));
  }
  if (n_elems < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Convert: n_elems must be >= 0, got ", n_elems));
  }
  if (n_elems == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Convert: null ", src == nullptr ? "src" : "dst", " pointer for ", n_elems,
                     " elements (", DTypeName(src_dtype), " -> ", DTypeName(dst_dtype), ")"));
  }
  const auto src_addr = reinterpret_cast<uintptr_t>(src);
  const auto dst_addr = reinterpret_cast<uintptr_t>(dst);
  if (src_addr % SizeOf(src_dtype) != 0 || dst_addr % SizeOf(dst_dtype) != 0) {
    const bool bad_src = src_addr % SizeOf(src_dtype) != 0;
    const DType bad_dtype = bad_src ? src_dtype : dst_dtype;
    return absl::InvalidArgumentError(absl::StrCat(
        "Convert: ", bad_src ? "src" : "dst", " pointer 0x",
        absl::Hex(bad_src ? src_addr : dst_addr), " is not aligned to its element size (",
        SizeOf(bad_dtype), " bytes for ", DTypeName(bad_dtype), ")"));
  }
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n_elems * SizeOf(src_dtype)));
    return absl::OkStatus();
  }
  const auto* src16 = static_cast<const uint16_t*>(src);
  auto* dst16 = static_cast<uint16_t*>(dst);
  if (src_dtype == DType::kF32) {
    if (dst_dtype == DType::kF16) {
      ConvertF32ToF16(static_cast<const float*>(src), dst16, n_elems);
    } else {
      ConvertF32ToBF16(static_cast<const float*>(src), dst16, n_elems);
    }
    return absl::OkStatus();
  }
  if (dst_dtype == DType::kF32) {
    if (src_dtype == DType::kF16) {
      ConvertF16ToF32(src16, static_cast<float*>(dst), n_elems);
    } else {
      ConvertBF16ToF32(src16, static_cast<float*>(dst), n_elems);
    }
    return absl::OkStatus();
  }
  // f16 <-> bf16 through an f32 staging buffer. Widening is exact, so the only rounding is the
  // final narrowing: the result is the scalar composition, bit for bit.
  alignas(64) float staging[kStagingElems];
  const bool from_f16 = src_dtype == DType::kF16;
  for (int64_t done = 0; done < n_elems;) {
    const int64_t step = std::min<int64_t>(n_elems - done, static_cast<int64_t>(kStagingElems));
    if (from_f16) {
      ConvertF16ToF32(src16 + done, staging, step);
      ConvertF32ToBF16(staging, dst16 + done, step);
    } else {
      ConvertBF16ToF32(src16 + done, staging, step);
      ConvertF32ToF16(staging, dst16 + done, step);
    }
    done += step;
  }
  return absl::OkStatus();
}

const char* ConvertTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace ps
#endif  // HWY_ONCE
