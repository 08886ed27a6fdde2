// Per-target building blocks shared by the Highway files of model/kernels/internal (simd.cc,
// attention_simd.cc): the padded-tail loads and stores and the exact dot product. A Highway
// "-inl.h" header: it is re-included once per SIMD target by each file that includes it after
// hwy/foreach_target.h (the include guard toggles with HWY_TARGET_TOGGLE), and its code lives in
// ps::kernels_internal::simd::HWY_NAMESPACE.
//
// DotExact is *the* f32 dot product of the CPU kernels: simd::Dot calls it, and the attention
// kernels inline it, so a score computed by either is the same bits. Its arithmetic is spelled
// out: four vector accumulators fed by fused multiply-adds (MulAdd; a multiply then an add on
// targets without FMA), combined as (acc0 + acc1) + (acc2 + acc3), the padded tail vector
// multiply-added last, then Highway's SumOfLanes. (Before it was spelled out, simd::Dot wrote
// Add(acc, Mul(a, b)) and GCC contracted every such pair into an FMA; the explicit form compiles
// to the same instructions and no longer depends on -ffp-contract.)
//
// Thread safety: pure functions.

// Per-target include guard (Highway's convention for -inl.h headers).
#if defined(PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_INL_H_
#undef PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_INL_H_
#else
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ps::kernels_internal::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Staging buffers for the tail vector.
struct TailBuffers {
  HWY_ALIGN float in[kMaxLanes];
  HWY_ALIGN float out[kMaxLanes];
};

// The first `count` < Lanes elements of p, the other lanes set to `fill` (staged through `buf`, so
// nothing beyond p + count is read).
HWY_INLINE V LoadTail(D d, const float* p, size_t count, float fill, float* buf) {
  const size_t lanes = hn::Lanes(d);
  for (size_t i = 0; i < lanes; ++i) buf[i] = i < count ? p[i] : fill;
  return hn::Load(d, buf);
}

// Stores the first `count` lanes of v to p (through `buf`).
HWY_INLINE void StoreTail(D d, V v, float* p, size_t count, float* buf) {
  hn::Store(v, d, buf);
  for (size_t i = 0; i < count; ++i) p[i] = buf[i];
}

// sum_i a[i] b[i] with the arithmetic described in the file comment.
HWY_INLINE float DotExact(D d, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const size_t N = hn::Lanes(d);
  V acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), acc1);
    acc2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), acc2);
    acc3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), acc3);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
  V acc = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  if (i < n) {
    TailBuffers t;
    acc = hn::MulAdd(LoadTail(d, a + i, n - i, 0.0f, t.in), LoadTail(d, b + i, n - i, 0.0f, t.out),
                     acc);
  }
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

}  // namespace HWY_NAMESPACE
}  // namespace ps::kernels_internal::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
