// GELU with the tanh approximation, exactly Hugging Face's "gelu_new" (GPT-2's
// activation_function), as scalar PS_HOST_DEVICE functions shared by the CPU kernel
// (model/kernels/gelu.h), the CUDA kernel (model/kernels/cuda/) and the tests:
//   y = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
// Derivative, by the product and chain rules with d tanh(u)/du = 1 - tanh(u)^2:
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// Large |x|: tanh saturates to +-1, so y -> x (x > 0) or -0 (x < 0) and dy/dx -> 1 or 0; x^3
// overflows to +-inf beyond |x| ~ 1e13 (f32), where tanh(+-inf) = +-1 still gives those limits for
// y, and the derivative's inf * 0 is NaN (the kernels never see such activations in practice).
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_GELU_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_GELU_MATH_H_

#include <cmath>

#include "base/host_device.h"

namespace ps {

template <typename T>
PS_HOST_DEVICE T GeluTanh(T x) {
  constexpr T kSqrt2OverPi = static_cast<T>(0.79788456080286535587989211986876);
  const T u = kSqrt2OverPi * (x + static_cast<T>(0.044715) * x * x * x);
  return static_cast<T>(0.5) * x * (1 + std::tanh(u));
}

template <typename T>
PS_HOST_DEVICE T GeluTanhDerivative(T x) {
  constexpr T kSqrt2OverPi = static_cast<T>(0.79788456080286535587989211986876);
  constexpr T kCoeff = static_cast<T>(0.044715);
  const T th = std::tanh(kSqrt2OverPi * (x + kCoeff * x * x * x));
  return static_cast<T>(0.5) * (1 + th) +
         static_cast<T>(0.5) * x * (1 - th * th) * kSqrt2OverPi * (1 + 3 * kCoeff * x * x);
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_GELU_MATH_H_
