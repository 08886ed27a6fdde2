// Highway implementation of model/kernels/internal/simd.h. Compiled once per SIMD target:
// hwy/foreach_target.h re-includes this file with HWY_TARGET set to each target, and HWY_EXPORT /
// HWY_DYNAMIC_DISPATCH (the HWY_ONCE section at the bottom) pick one at run time, as in Highway's
// hwy/examples/skeleton.cc and memory/convert.cc.
//
// Every loop runs whole vectors with unaligned loads, then the remaining 0 < r < Lanes elements
// as one more vector padded with a neutral value (0 for sums, -inf for the max) in a stack buffer,
// so no load or store ever touches memory beyond n and every element sees the same arithmetic.
#include "model/kernels/internal/simd.h"

#include <cstddef>
#include <cstdint>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/kernels/internal/simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h: per-target, re-included with each HWY_TARGET.
#include "hwy/contrib/math/math-inl.h"
#include "model/kernels/internal/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ps::kernels_internal::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// D, V, kMaxLanes, TailBuffers, LoadTail, StoreTail and DotExact: internal/simd-inl.h.

// sum over i of f(i-th vectors), four accumulators, then the tail with `fill` padding.
template <class F>
HWY_INLINE float ReduceSum(D d, size_t n, F f) {
  const size_t N = hn::Lanes(d);
  V acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    acc0 = hn::Add(acc0, f(i));
    acc1 = hn::Add(acc1, f(i + N));
    acc2 = hn::Add(acc2, f(i + 2 * N));
    acc3 = hn::Add(acc3, f(i + 3 * N));
  }
  for (; i + N <= n; i += N) acc0 = hn::Add(acc0, f(i));
  V acc = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  if (i < n) acc = hn::Add(acc, f.Tail(i, n - i));
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

float DotImpl(const float* a, const float* b, int64_t n) {
  return DotExact(D(), a, b, static_cast<size_t>(n));
}

float SumImpl(const float* x, int64_t n) {
  const D d;
  struct F {
    D d;
    const float* x;
    V operator()(size_t i) const { return hn::LoadU(d, x + i); }
    V Tail(size_t i, size_t r) const {
      TailBuffers t;
      return LoadTail(d, x + i, r, 0.0f, t.in);
    }
  };
  return ReduceSum(d, static_cast<size_t>(n), F{d, x});
}

float SumSquaredDeviationImpl(const float* x, float mean, int64_t n) {
  const D d;
  struct F {
    D d;
    const float* x;
    V m;
    V operator()(size_t i) const {
      const V dev = hn::Sub(hn::LoadU(d, x + i), m);
      return hn::Mul(dev, dev);
    }
    V Tail(size_t i, size_t r) const {
      TailBuffers t;
      // Padding with the mean makes the padded deviations exactly 0.
      const V dev = hn::Sub(LoadTail(d, x + i, r, hn::GetLane(m), t.in), m);
      return hn::Mul(dev, dev);
    }
  };
  return ReduceSum(d, static_cast<size_t>(n), F{d, x, hn::Set(d, mean)});
}

float MaxImpl(const float* x, int64_t n_elems) {
  const D d;
  const size_t N = hn::Lanes(d), n = static_cast<size_t>(n_elems);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  V acc = hn::Set(d, neg_inf);
  size_t i = 0;
  for (; i + N <= n; i += N) acc = hn::Max(acc, hn::LoadU(d, x + i));
  if (i < n) {
    TailBuffers t;
    acc = hn::Max(acc, LoadTail(d, x + i, n - i, neg_inf, t.in));
  }
  return hn::GetLane(hn::MaxOfLanes(d, acc));
}

float SumExpMinusImpl(const float* z, float m, int64_t n) {
  const D d;
  struct F {
    D d;
    const float* z;
    V m;
    V operator()(size_t i) const { return hn::Exp(d, hn::Sub(hn::LoadU(d, z + i), m)); }
    V Tail(size_t i, size_t r) const {
      TailBuffers t;
      // Padding with -inf gives exp(-inf) = 0.
      return hn::Exp(
          d, hn::Sub(LoadTail(d, z + i, r, -std::numeric_limits<float>::infinity(), t.in), m));
    }
  };
  return ReduceSum(d, static_cast<size_t>(n), F{d, z, hn::Set(d, m)});
}

// Element-wise loop: out = f(inputs at i) over whole vectors and the padded tail. `f` takes the
// index loader `load(p)` so that one body serves both the vector and the tail path.
template <class F>
HWY_INLINE void ForEachVector(D d, size_t n, F f) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    f(
        i, [&](const float* p) { return hn::LoadU(d, p + i); },
        [&](V v, float* p) { hn::StoreU(v, d, p + i); });
  }
  if (i < n) {
    const size_t r = n - i;
    TailBuffers t;  // a load copies the staged lanes into a register: one buffer serves all
    f(
        i, [&](const float* p) { return LoadTail(d, p + i, r, 0.0f, t.in); },
        [&](V v, float* p) { StoreTail(d, v, p + i, r, t.out); });
  }
}

void AxpyImpl(float alpha, const float* x, float* y, int64_t n) {
  const D d;
  const V a = hn::Set(d, alpha);
  ForEachVector(d, static_cast<size_t>(n),
                [&](size_t, auto load, auto store) { store(hn::MulAdd(a, load(x), load(y)), y); });
}

void ScaleImpl(float alpha, float* y, int64_t n) {
  const D d;
  const V a = hn::Set(d, alpha);
  ForEachVector(d, static_cast<size_t>(n),
                [&](size_t, auto load, auto store) { store(hn::Mul(a, load(y)), y); });
}

void AddImpl(const float* a, const float* b, float* out, int64_t n) {
  const D d;
  ForEachVector(d, static_cast<size_t>(n),
                [&](size_t, auto load, auto store) { store(hn::Add(load(a), load(b)), out); });
}

void AddToImpl(const float* x, float* y, int64_t n) {
  const D d;
  ForEachVector(d, static_cast<size_t>(n),
                [&](size_t, auto load, auto store) { store(hn::Add(load(y), load(x)), y); });
}

void ScaledExpMinusImpl(float scale, float lse, float* z, int64_t n) {
  const D d;
  const V s = hn::Set(d, scale), l = hn::Set(d, lse);
  ForEachVector(d, static_cast<size_t>(n), [&](size_t, auto load, auto store) {
    store(hn::Mul(s, hn::Exp(d, hn::Sub(load(z), l))), z);
  });
}

// s = 1 / (1 + e) and e = exp(GeluExponent(x)), as in gelu_math.h. The exponent is capped at 100:
// Highway's Exp is specified up to +104, and every value above ~88.7 overflows f32 to inf anyway,
// as libm's exp does.
HWY_INLINE V GeluE(D d, V x) {
  const V k = hn::Set(d, -1.5957691216057307117597842397375f);
  const V c = hn::Set(d, 0.044715f);
  const V cube = hn::Mul(hn::Mul(x, x), x);
  const V exponent = hn::Mul(k, hn::MulAdd(c, cube, x));
  return hn::Exp(d, hn::Min(exponent, hn::Set(d, 100.0f)));
}

void GeluForwardImpl(const float* x, float* y, int64_t n) {
  const D d;
  const V one = hn::Set(d, 1.0f);
  ForEachVector(d, static_cast<size_t>(n), [&](size_t, auto load, auto store) {
    const V xv = load(x);
    store(hn::Div(xv, hn::Add(one, GeluE(d, xv))), y);
  });
}

void GeluBackwardImpl(const float* x, const float* dy, float* dx, int64_t n) {
  const D d;
  const V one = hn::Set(d, 1.0f), two = hn::Set(d, 2.0f);
  const V k = hn::Set(d, 0.79788456080286535587989211986876f);
  const V three_c = hn::Set(d, static_cast<float>(3 * 0.044715));
  ForEachVector(d, static_cast<size_t>(n), [&](size_t, auto load, auto store) {
    const V xv = load(x);
    const V e = GeluE(d, xv);
    const V s = hn::Div(one, hn::Add(one, e));
    const V one_minus_s = hn::IfThenElse(hn::Le(e, one), hn::Mul(e, s), hn::Sub(one, s));
    const V poly = hn::MulAdd(three_c, hn::Mul(xv, xv), one);
    const V grad =
        hn::MulAdd(hn::Mul(hn::Mul(hn::Mul(hn::Mul(two, xv), s), one_minus_s), k), poly, s);
    const V dyv = load(dy);
    store(hn::MulAdd(dyv, grad, load(dx)), dx);
  });
}

void LayerNormOutputRowImpl(const float* x, float mean, float rstd, const float* w, const float* b,
                            float* y, int64_t n) {
  const D d;
  const V m = hn::Set(d, mean), s = hn::Set(d, rstd);
  ForEachVector(d, static_cast<size_t>(n), [&](size_t, auto load, auto store) {
    const V xhat = hn::Mul(hn::Sub(load(x), m), s);
    store(hn::MulAdd(xhat, load(w), load(b)), y);
  });
}

void LayerNormGradSumsRowImpl(const float* dy, const float* w, const float* x, float mean,
                              float rstd, int64_t n, float* g_sum, float* g_xhat_sum) {
  const D d;
  struct G {
    D d;
    const float* dy;
    const float* w;
    V operator()(size_t i) const { return hn::Mul(hn::LoadU(d, dy + i), hn::LoadU(d, w + i)); }
    V Tail(size_t i, size_t r) const {
      TailBuffers t;
      return hn::Mul(LoadTail(d, dy + i, r, 0.0f, t.in), LoadTail(d, w + i, r, 0.0f, t.out));
    }
  };
  struct GX {
    D d;
    const float* dy;
    const float* w;
    const float* x;
    V m, s;
    V operator()(size_t i) const {
      const V g = hn::Mul(hn::LoadU(d, dy + i), hn::LoadU(d, w + i));
      return hn::Mul(hn::Mul(g, hn::Sub(hn::LoadU(d, x + i), m)), s);
    }
    V Tail(size_t i, size_t r) const {
      TailBuffers t;
      HWY_ALIGN float xb[kMaxLanes];
      const V g = hn::Mul(LoadTail(d, dy + i, r, 0.0f, t.in), LoadTail(d, w + i, r, 0.0f, t.out));
      return hn::Mul(hn::Mul(g, hn::Sub(LoadTail(d, x + i, r, 0.0f, xb), m)), s);
    }
  };
  const size_t len = static_cast<size_t>(n);
  *g_sum = ReduceSum(d, len, G{d, dy, w});
  *g_xhat_sum = ReduceSum(d, len, GX{d, dy, w, x, hn::Set(d, mean), hn::Set(d, rstd)});
}

void LayerNormInputGradRowImpl(const float* dy, const float* w, const float* x, float mean,
                               float rstd, float g_mean, float g_xhat_mean, float* dx, int64_t n) {
  const D d;
  const V m = hn::Set(d, mean), s = hn::Set(d, rstd), gm = hn::Set(d, g_mean),
          gxm = hn::Set(d, g_xhat_mean);
  ForEachVector(d, static_cast<size_t>(n), [&](size_t, auto load, auto store) {
    const V xhat = hn::Mul(hn::Sub(load(x), m), s);
    const V inner = hn::Sub(hn::Sub(hn::Mul(load(dy), load(w)), gm), hn::Mul(xhat, gxm));
    store(hn::MulAdd(s, inner, load(dx)), dx);
  });
}

void LayerNormParamGradRowImpl(const float* dy, const float* x, float mean, float rstd,
                               float* dw_acc, float* db_acc, int64_t n) {
  const D d;
  const V m = hn::Set(d, mean), s = hn::Set(d, rstd);
  ForEachVector(d, static_cast<size_t>(n), [&](size_t, auto load, auto store) {
    const V dyv = load(dy);
    store(hn::MulAdd(hn::Mul(dyv, hn::Sub(load(x), m)), s, load(dw_acc)), dw_acc);
    store(hn::Add(load(db_acc), dyv), db_acc);
  });
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace ps::kernels_internal::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ps::kernels_internal::simd {

HWY_EXPORT(DotImpl);
HWY_EXPORT(SumImpl);
HWY_EXPORT(SumSquaredDeviationImpl);
HWY_EXPORT(MaxImpl);
HWY_EXPORT(SumExpMinusImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(ScaleImpl);
HWY_EXPORT(AddImpl);
HWY_EXPORT(AddToImpl);
HWY_EXPORT(ScaledExpMinusImpl);
HWY_EXPORT(GeluForwardImpl);
HWY_EXPORT(GeluBackwardImpl);
HWY_EXPORT(LayerNormOutputRowImpl);
HWY_EXPORT(LayerNormGradSumsRowImpl);
HWY_EXPORT(LayerNormInputGradRowImpl);
HWY_EXPORT(LayerNormParamGradRowImpl);
HWY_EXPORT(TargetNameImpl);

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}
float Sum(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumImpl)(x, n); }
float SumSquaredDeviation(const float* x, float mean, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumSquaredDeviationImpl)(x, mean, n);
}
float Max(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxImpl)(x, n); }
float SumExpMinus(const float* z, float m, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumExpMinusImpl)(z, m, n);
}
void Axpy(float alpha, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(alpha, x, y, n);
}
void Scale(float alpha, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ScaleImpl)(alpha, y, n); }
void Add(const float* a, const float* b, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddImpl)(a, b, out, n);
}
void AddTo(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddToImpl)(x, y, n); }
void ScaledExpMinus(float scale, float lse, float* z, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaledExpMinusImpl)(scale, lse, z, n);
}
void GeluForward(const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluForwardImpl)(x, y, n);
}
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluBackwardImpl)(x, dy, dx, n);
}
void LayerNormOutputRow(const float* x, float mean, float rstd, const float* w, const float* b,
                        float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LayerNormOutputRowImpl)(x, mean, rstd, w, b, y, n);
}
void LayerNormGradSumsRow(const float* dy, const float* w, const float* x, float mean, float rstd,
                          int64_t n, float* g_sum, float* g_xhat_sum) {
  HWY_DYNAMIC_DISPATCH(LayerNormGradSumsRowImpl)(dy, w, x, mean, rstd, n, g_sum, g_xhat_sum);
}
void LayerNormInputGradRow(const float* dy, const float* w, const float* x, float mean, float rstd,
                           float g_mean, float g_xhat_mean, float* dx, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LayerNormInputGradRowImpl)(dy, w, x, mean, rstd, g_mean, g_xhat_mean, dx, n);
}
void LayerNormParamGradRow(const float* dy, const float* x, float mean, float rstd, float* dw_acc,
                           float* db_acc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LayerNormParamGradRowImpl)(dy, x, mean, rstd, dw_acc, db_acc, n);
}
const char* TargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace ps::kernels_internal::simd
#endif  // HWY_ONCE
