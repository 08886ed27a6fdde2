// Highway implementation of model/parameter_init_simd.h, compiled once per SIMD target
// (hwy/foreach_target.h) and dispatched at run time (HWY_EXPORT / HWY_DYNAMIC_DISPATCH).
//
// Why the values stay bit-identical. The draws are exact (integer recurrence, tempering and the
// conversions of 53-bit integers to double are exact; 2 pi u2 is one IEEE multiplication, as in
// the scalar formula). Only log, sin and cos differ from libm's: Highway's are within 4 ULP (log)
// and 3 ULP (sin, cos) of the true values, glibc's within 1 ULP, so the vector value of
// std r cos(2 pi u2) is within a few 2^-52 std r of the scalar one — far inside the margin
// B = 2^-44 std r. If every double in [v - B, v + B] rounds to one float (both ends do, compared
// bit for bit so that -0 and +0 differ), the scalar value, inside that interval, rounds to it too;
// otherwise (about one pair in 10^5, and every r = 0) the pair goes back to the scalar formula.
#include "model/parameter_init_simd.h"

#include <cstddef>
#include <cstdint>
#include <numbers>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/parameter_init_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h: per-target, re-included with each HWY_TARGET.
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ps::parameter_init_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr uint64_t kUpperMask = 0xFFFFFFFF80000000ULL;
constexpr uint64_t kLowerMask = 0x7FFFFFFFULL;
constexpr uint64_t kMatrixA = 0xB5026F5AA96619E9ULL;

// One word of the recurrence, scalar: the new mt[i] from mt[i], mt[i + 1] and mt[i + m].
inline uint64_t TwistWord(uint64_t cur, uint64_t next, uint64_t far) {
  const uint64_t y = (cur & kUpperMask) | (next & kLowerMask);
  return far ^ (y >> 1) ^ ((y & 1) != 0 ? kMatrixA : 0);
}

void MtTwistImpl(uint64_t* HWY_RESTRICT mt) {
  const hn::ScalableTag<uint64_t> du;
  using VU = hn::Vec<decltype(du)>;
  const size_t lanes = hn::Lanes(du);
  const VU upper = hn::Set(du, kUpperMask);
  const VU lower = hn::Set(du, kLowerMask);
  const VU matrix = hn::Set(du, kMatrixA);
  const VU one = hn::Set(du, 1);
  const VU zero = hn::Zero(du);
  // Words [begin, end) from the old mt[i], mt[i + 1] and mt[i + offset] (offset = m: old words;
  // offset = m - n: words this twist already wrote, at least m = 156 >= lanes behind i). Loading
  // mt[i + 1 .. i + lanes] before storing mt[i .. i + lanes - 1] reads the old values, as the
  // scalar recurrence does.
  auto run = [&](int begin, int end, int offset) {
    int i = begin;
    for (; i + static_cast<int>(lanes) <= end; i += static_cast<int>(lanes)) {
      const VU cur = hn::LoadU(du, mt + i);
      const VU next = hn::LoadU(du, mt + i + 1);
      const VU far = hn::LoadU(du, mt + i + offset);
      const VU y = hn::Or(hn::And(cur, upper), hn::And(next, lower));
      const VU mag = hn::IfThenElse(hn::Eq(hn::And(y, one), one), matrix, zero);
      hn::StoreU(hn::Xor(hn::Xor(far, hn::ShiftRight<1>(y)), mag), du, mt + i);
    }
    for (; i < end; ++i) mt[i] = TwistWord(mt[i], mt[i + 1], mt[i + offset]);
  };
  run(0, kMtStateWords - kMtShiftWords, kMtShiftWords);
  run(kMtStateWords - kMtShiftWords, kMtStateWords - 1, kMtShiftWords - kMtStateWords);
  mt[kMtStateWords - 1] =
      TwistWord(mt[kMtStateWords - 1], mt[0], mt[kMtShiftWords - 1]);
}

template <class DU, class VU = hn::Vec<DU>>
HWY_INLINE VU Temper(DU du, VU y) {
  y = hn::Xor(y, hn::And(hn::ShiftRight<29>(y), hn::Set(du, 0x5555555555555555ULL)));
  y = hn::Xor(y, hn::And(hn::ShiftLeft<17>(y), hn::Set(du, 0x71D67FFFEDA60000ULL)));
  y = hn::Xor(y, hn::And(hn::ShiftLeft<37>(y), hn::Set(du, 0xFFF7EEE000000000ULL)));
  return hn::Xor(y, hn::ShiftRight<43>(y));
}

int NormalBlockImpl(const uint64_t* HWY_RESTRICT raw, double std, float* HWY_RESTRICT cos_out,
                    float* HWY_RESTRICT sin_out, int* HWY_RESTRICT redo) {
  const hn::ScalableTag<uint64_t> du;
  const hn::Rebind<int64_t, decltype(du)> di;
  const hn::Rebind<double, decltype(du)> dd;
  const hn::Rebind<float, decltype(du)> df;
  const hn::Rebind<uint32_t, decltype(du)> du32;
  using VD = hn::Vec<decltype(dd)>;
  using VF = hn::Vec<decltype(df)>;
  const size_t lanes = hn::Lanes(du);
  const VD scale = hn::Set(dd, 0x1.0p-53);
  const VD two_pi = hn::Set(dd, 2.0 * std::numbers::pi);
  const VD minus_two = hn::Set(dd, -2.0);
  const VD stdv = hn::Set(dd, std);
  const VD margin = hn::Set(dd, 0x1.0p-44);
  const VD tiny = hn::Set(dd, 0x1.0p-140);  // makes r = 0 straddle zero: redone
  HWY_ALIGN uint32_t ok_lanes[2 * kMtPadPairs];
  int redone = 0;
  // Whether every double within `b` of `v` rounds to the float `f` (bit for bit).
  auto settled = [&](VD v, VD b, VF f) {
    const auto fb = hn::BitCast(du32, f);
    const auto lo = hn::BitCast(du32, hn::DemoteTo(df, hn::Sub(v, b)));
    const auto hi = hn::BitCast(du32, hn::DemoteTo(df, hn::Add(v, b)));
    return hn::And(hn::Eq(lo, fb), hn::Eq(hi, fb));
  };
  for (int p = 0; p < kMtPairs; p += static_cast<int>(lanes)) {
    hn::Vec<decltype(du)> a, b;
    hn::LoadInterleaved2(du, raw + 2 * p, a, b);
    a = Temper(du, a);
    b = Temper(du, b);
    const VD u1 = hn::Mul(
        hn::ConvertTo(dd, hn::BitCast(di, hn::Add(hn::ShiftRight<11>(a), hn::Set(du, 1)))), scale);
    const VD u2 = hn::Mul(hn::ConvertTo(dd, hn::BitCast(di, hn::ShiftRight<11>(b))), scale);
    const VD r = hn::Sqrt(hn::Mul(minus_two, hn::Log(dd, u1)));
    const VD x = hn::Mul(two_pi, u2);
    const VD sr = hn::Mul(stdv, r);
    const VD c = hn::Mul(sr, hn::Cos(dd, x));
    const VD s = hn::Mul(sr, hn::Sin(dd, x));
    const VD bound = hn::Add(hn::Mul(hn::Abs(sr), margin), tiny);
    const VF fc = hn::DemoteTo(df, c);
    const VF fs = hn::DemoteTo(df, s);
    hn::StoreU(fc, df, cos_out + p);
    hn::StoreU(fs, df, sin_out + p);
    const auto ok = hn::And(settled(c, bound, fc), settled(s, bound, fs));
    if (!hn::AllTrue(du32, ok)) {
      hn::Store(hn::VecFromMask(du32, ok), du32, ok_lanes);
      for (size_t k = 0; k < lanes; ++k) {
        const int pair = p + static_cast<int>(k);
        if (ok_lanes[k] == 0 && pair < kMtPairs) redo[redone++] = pair;
      }
    }
  }
  return redone;
}

}  // namespace HWY_NAMESPACE
}  // namespace ps::parameter_init_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ps::parameter_init_internal {

HWY_EXPORT(MtTwistImpl);
HWY_EXPORT(NormalBlockImpl);

void MtTwist(uint64_t* mt) { HWY_DYNAMIC_DISPATCH(MtTwistImpl)(mt); }

int NormalBlock(const uint64_t* raw, double std, float* cos_out, float* sin_out, int* redo) {
  return HWY_DYNAMIC_DISPATCH(NormalBlockImpl)(raw, std, cos_out, sin_out, redo);
}

}  // namespace ps::parameter_init_internal
#endif  // HWY_ONCE
