// GELU with the tanh approximation, exactly Hugging Face's "gelu_new" (GPT-2's
// activation_function), as scalar PS_HOST_DEVICE functions shared by the CPU kernel
// (model/kernels/gelu.h; its vectorized f32 path in internal/simd.cc evaluates the same formulas
// lane-wise), the CUDA kernel (model/kernels/cuda/) and the tests:
//   y = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
// Evaluated as x * s with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) (the logistic function of
// 2u): the same value without the cancellation of 1 + tanh(u) for negative x, where tanh(u) -> -1
// and its few-ulp error would be amplified. Only exp is needed, which vectorizes well.
// Derivative, by the product and chain rules with d tanh(u)/du = 1 - tanh(u)^2 = 4 s (1 - s):
//   dy/dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// where 1 - s is taken as e s (e = exp(-2u)) when e <= 1, i.e. when s >= 1/2 and 1 - s would be a
// tiny difference of nearly equal numbers, and as 1 - s otherwise (exact, and right for e = inf).
// Large |x|: e = 0 (x > 0) gives y = x, dy/dx = 1; e = inf (x < 0) gives y = -0, dy/dx = 0 while
// x^2 is finite (|x| < ~1e19 in f32). In between, for x < 0, y is the tiny true value (e.g.
// gelu(-10) ~ -1e-37), not a flushed zero.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_GELU_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_GELU_MATH_H_

#include <cmath>

#include "base/host_device.h"

namespace ps {

// The exponent -2u = -2 sqrt(2/pi) (x + 0.044715 x^3) of the logistic form.
template <typename T>
PS_HOST_DEVICE T GeluExponent(T x) {
  constexpr T kMinusTwoSqrt2OverPi = static_cast<T>(-1.5957691216057307117597842397375);
  return kMinusTwoSqrt2OverPi * (x + static_cast<T>(0.044715) * x * x * x);
}

template <typename T>
PS_HOST_DEVICE T GeluTanh(T x) {
  const T s = T{1} / (T{1} + std::exp(GeluExponent(x)));
  return x * s;
}

template <typename T>
PS_HOST_DEVICE T GeluTanhDerivative(T x) {
  constexpr T kSqrt2OverPi = static_cast<T>(0.79788456080286535587989211986876);
  constexpr T kThreeCoeff = static_cast<T>(3 * 0.044715);
  const T e = std::exp(GeluExponent(x));
  const T s = T{1} / (T{1} + e);
  const T one_minus_s = e <= T{1} ? e * s : T{1} - s;
  return s + 2 * x * s * one_minus_s * kSqrt2OverPi * (1 + kThreeCoeff * x * x);
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_GELU_MATH_H_
