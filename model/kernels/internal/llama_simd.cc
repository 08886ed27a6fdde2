// Highway implementation of model/kernels/internal/llama_simd.h, compiled once per SIMD target
// (hwy/foreach_target.h) and dispatched at run time (HWY_EXPORT / HWY_DYNAMIC_DISPATCH), as
// internal/simd.cc. Whole vectors use unaligned loads; the remaining 0 < r < Lanes elements are
// staged in a padded stack buffer, so nothing touches memory beyond n.
#include "model/kernels/internal/llama_simd.h"

#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/kernels/internal/llama_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h: per-target, re-included with each HWY_TARGET.
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ps::kernels_internal::llama_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Up to six staged input streams and two outputs for the tail vector.
struct TailBuffers {
  HWY_ALIGN float in[6][kMaxLanes];
  HWY_ALIGN float out[2][kMaxLanes];
};

HWY_INLINE V LoadTail(D d, const float* p, size_t count, float fill, float* buf) {
  const size_t lanes = hn::Lanes(d);
  for (size_t i = 0; i < lanes; ++i) buf[i] = i < count ? p[i] : fill;
  return hn::Load(d, buf);
}

HWY_INLINE void StoreTail(D d, V v, float* p, size_t count, float* buf) {
  hn::Store(v, d, buf);
  for (size_t i = 0; i < count; ++i) p[i] = buf[i];
}

// Runs f(load, store) over whole vectors and then the padded tail. load(k, p) loads input stream
// k (each stream must use its own k < 6 so the tail stages do not collide) at the current
// position; store(k, v, p) stores output k (< 2).
template <class F>
HWY_INLINE void ForEachVector(D d, size_t n, F f) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    f([&](int, const float* p) { return hn::LoadU(d, p + i); },
      [&](int, V v, float* p) { hn::StoreU(v, d, p + i); });
  }
  if (i < n) {
    const size_t r = n - i;
    TailBuffers t;
    f([&](int k, const float* p) { return LoadTail(d, p + i, r, 0.0f, t.in[k]); },
      [&](int k, V v, float* p) { StoreTail(d, v, p + i, r, t.out[k]); });
  }
}

void RmsNormOutputRowImpl(const float* x, float rstd, const float* w, float* y, int64_t n) {
  const D d;
  const V s = hn::Set(d, rstd);
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    store(0, hn::Mul(load(1, w), hn::Mul(load(0, x), s)), y);
  });
}

float RmsNormGradSumRowImpl(const float* dy, const float* w, const float* x, float rstd,
                            int64_t n_elems) {
  const D d;
  const size_t N = hn::Lanes(d), n = static_cast<size_t>(n_elems);
  const V s = hn::Set(d, rstd);
  auto term = [&](V dyv, V wv, V xv) { return hn::Mul(hn::Mul(dyv, wv), hn::Mul(xv, s)); };
  V acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
  auto at = [&](size_t i) {
    return term(hn::LoadU(d, dy + i), hn::LoadU(d, w + i), hn::LoadU(d, x + i));
  };
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    acc0 = hn::Add(acc0, at(i));
    acc1 = hn::Add(acc1, at(i + N));
    acc2 = hn::Add(acc2, at(i + 2 * N));
    acc3 = hn::Add(acc3, at(i + 3 * N));
  }
  for (; i + N <= n; i += N) acc0 = hn::Add(acc0, at(i));
  V acc = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  if (i < n) {
    TailBuffers t;
    const size_t r = n - i;
    acc = hn::Add(acc,
                  term(LoadTail(d, dy + i, r, 0.0f, t.in[0]), LoadTail(d, w + i, r, 0.0f, t.in[1]),
                       LoadTail(d, x + i, r, 0.0f, t.in[2])));
  }
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

void RmsNormInputGradRowImpl(const float* dy, const float* w, const float* x, float rstd,
                             float g_xhat_mean, float* dx, int64_t n) {
  const D d;
  const V s = hn::Set(d, rstd), m = hn::Set(d, g_xhat_mean);
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    const V xhat = hn::Mul(load(2, x), s);
    const V inner = hn::Sub(hn::Mul(load(0, dy), load(1, w)), hn::Mul(xhat, m));
    store(0, hn::MulAdd(s, inner, load(3, dx)), dx);
  });
}

void RmsNormParamGradRowImpl(const float* dy, const float* x, float rstd, float* dw_acc,
                             int64_t n) {
  const D d;
  const V s = hn::Set(d, rstd);
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    store(0, hn::MulAdd(load(0, dy), hn::Mul(load(1, x), s), load(2, dw_acc)), dw_acc);
  });
}

void RopeRotateHeadImpl(float* x, const float* cos, const float* sin, int64_t half, bool inverse) {
  const D d;
  float* x2 = x + half;
  ForEachVector(d, static_cast<size_t>(half), [&](auto load, auto store) {
    const V a = load(0, x), b = load(1, x2), c = load(2, cos), s = load(3, sin);
    if (inverse) {
      store(0, hn::MulAdd(b, s, hn::Mul(a, c)), x);      // a c + b s
      store(1, hn::NegMulAdd(a, s, hn::Mul(b, c)), x2);  // b c - a s
    } else {
      store(0, hn::NegMulAdd(b, s, hn::Mul(a, c)), x);  // a c - b s
      store(1, hn::MulAdd(a, s, hn::Mul(b, c)), x2);    // b c + a s
    }
  });
}

// silu(g) = g / (1 + e) with e = exp(-g); the exponent is capped at 100: Highway's Exp is
// specified up to +104 and everything above ~88.7 overflows f32 to inf anyway, as libm's exp does.
HWY_INLINE V ExpNeg(D d, V g) { return hn::Exp(d, hn::Min(hn::Neg(g), hn::Set(d, 100.0f))); }

void SwiGluForwardImpl(const float* g, const float* u, float* h, int64_t n) {
  const D d;
  const V one = hn::Set(d, 1.0f);
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    const V gv = load(0, g);
    store(0, hn::Mul(hn::Div(gv, hn::Add(one, ExpNeg(d, gv))), load(1, u)), h);
  });
}

void SwiGluBackwardImpl(const float* g, const float* u, const float* dh, float* dg, float* du,
                        int64_t n) {
  const D d;
  const V one = hn::Set(d, 1.0f);
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    const V gv = load(0, g), uv = load(1, u), dhv = load(2, dh);
    const V e = ExpNeg(d, gv);
    const V s = hn::Div(one, hn::Add(one, e));
    const V one_minus_s = hn::IfThenElse(hn::Le(e, one), hn::Mul(e, s), hn::Sub(one, s));
    const V dsilu = hn::Mul(s, hn::MulAdd(gv, one_minus_s, one));
    const V silu = hn::Div(gv, hn::Add(one, e));
    store(0, hn::MulAdd(hn::Mul(dhv, uv), dsilu, load(3, dg)), dg);
    store(1, hn::MulAdd(dhv, silu, load(4, du)), du);
  });
}

// GeGLU: GELU(tanh) of the gate (gelu_math.h, as internal/simd.cc's GPT-2 GELU computes it
// lane-wise) times up. e = exp(GeluExponent(g)), the exponent capped at 100 as there.
HWY_INLINE V GeluE(D d, V x) {
  const V k = hn::Set(d, -1.5957691216057307117597842397375f);
  const V c = hn::Set(d, 0.044715f);
  const V cube = hn::Mul(hn::Mul(x, x), x);
  const V exponent = hn::Mul(k, hn::MulAdd(c, cube, x));
  return hn::Exp(d, hn::Min(exponent, hn::Set(d, 100.0f)));
}

void GeGluForwardImpl(const float* g, const float* u, float* h, int64_t n) {
  const D d;
  const V one = hn::Set(d, 1.0f);
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    const V gv = load(0, g);
    store(0, hn::Mul(hn::Div(gv, hn::Add(one, GeluE(d, gv))), load(1, u)), h);
  });
}

void GeGluBackwardImpl(const float* g, const float* u, const float* dh, float* dg, float* du,
                       int64_t n) {
  const D d;
  const V one = hn::Set(d, 1.0f), two = hn::Set(d, 2.0f);
  const V k = hn::Set(d, 0.79788456080286535587989211986876f);
  const V three_c = hn::Set(d, static_cast<float>(3 * 0.044715));
  ForEachVector(d, static_cast<size_t>(n), [&](auto load, auto store) {
    const V gv = load(0, g), uv = load(1, u), dhv = load(2, dh);
    const V e = GeluE(d, gv);
    const V s = hn::Div(one, hn::Add(one, e));
    const V one_minus_s = hn::IfThenElse(hn::Le(e, one), hn::Mul(e, s), hn::Sub(one, s));
    const V poly = hn::MulAdd(three_c, hn::Mul(gv, gv), one);
    const V dgelu =
        hn::MulAdd(hn::Mul(hn::Mul(hn::Mul(hn::Mul(two, gv), s), one_minus_s), k), poly, s);
    const V gelu = hn::Div(gv, hn::Add(one, e));
    store(0, hn::MulAdd(hn::Mul(dhv, uv), dgelu, load(3, dg)), dg);
    store(1, hn::MulAdd(dhv, gelu, load(4, du)), du);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace ps::kernels_internal::llama_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ps::kernels_internal::llama_simd {

HWY_EXPORT(RmsNormOutputRowImpl);
HWY_EXPORT(RmsNormGradSumRowImpl);
HWY_EXPORT(RmsNormInputGradRowImpl);
HWY_EXPORT(RmsNormParamGradRowImpl);
HWY_EXPORT(RopeRotateHeadImpl);
HWY_EXPORT(SwiGluForwardImpl);
HWY_EXPORT(SwiGluBackwardImpl);
HWY_EXPORT(GeGluForwardImpl);
HWY_EXPORT(GeGluBackwardImpl);

void RmsNormOutputRow(const float* x, float rstd, const float* w, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(RmsNormOutputRowImpl)(x, rstd, w, y, n);
}
float RmsNormGradSumRow(const float* dy, const float* w, const float* x, float rstd, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(RmsNormGradSumRowImpl)(dy, w, x, rstd, n);
}
void RmsNormInputGradRow(const float* dy, const float* w, const float* x, float rstd,
                         float g_xhat_mean, float* dx, int64_t n) {
  HWY_DYNAMIC_DISPATCH(RmsNormInputGradRowImpl)(dy, w, x, rstd, g_xhat_mean, dx, n);
}
void RmsNormParamGradRow(const float* dy, const float* x, float rstd, float* dw_acc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(RmsNormParamGradRowImpl)(dy, x, rstd, dw_acc, n);
}
void RopeRotateHead(float* x, const float* cos, const float* sin, int64_t half, bool inverse) {
  HWY_DYNAMIC_DISPATCH(RopeRotateHeadImpl)(x, cos, sin, half, inverse);
}
void SwiGluForward(const float* g, const float* u, float* h, int64_t n, bool gelu) {
  if (gelu) return HWY_DYNAMIC_DISPATCH(GeGluForwardImpl)(g, u, h, n);
  HWY_DYNAMIC_DISPATCH(SwiGluForwardImpl)(g, u, h, n);
}
void SwiGluBackward(const float* g, const float* u, const float* dh, float* dg, float* du,
                    int64_t n, bool gelu) {
  if (gelu) return HWY_DYNAMIC_DISPATCH(GeGluBackwardImpl)(g, u, dh, dg, du, n);
  HWY_DYNAMIC_DISPATCH(SwiGluBackwardImpl)(g, u, dh, dg, du, n);
}

}  // namespace ps::kernels_internal::llama_simd
#endif  // HWY_ONCE
