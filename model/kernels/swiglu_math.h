// The element-wise arithmetic of the SwiGLU gate of Llama/Qwen2/Mistral MLPs (see
// model/kernels/swiglu.h), as PS_HOST_DEVICE functions shared by the CPU kernel (its vectorized
// f32 path in internal/llama_simd.cc evaluates the same formulas lane-wise), the CUDA kernel and
// the tests:
//   h = silu(g) * u,   silu(g) = g * sigmoid(g) = g / (1 + e),   e = exp(-g)
// silu is evaluated as g / (1 + e), PyTorch's formula, rather than g * sigmoid(g) (one rounding
// fewer, and bit-compatible with torch.nn.functional.silu where both use the same exp).
// Derivatives, with s = sigmoid(g) = 1 / (1 + e):
//   dh/du = silu(g)
//   dh/dg = u * silu'(g),   silu'(g) = s + g s (1 - s) = s (1 + g (1 - s))
// where 1 - s is taken as e s when e <= 1 (g >= 0, s >= 1/2, where 1 - s would cancel) and as
// 1 - s otherwise (exact, and right for e = inf).
// Large |g|: e = 0 (g > ~88) gives silu = g, silu' = 1; e = inf (g < ~-88) gives silu = -0 and
// silu' = 0 * (1 + g) = -0 while g is finite.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_SWIGLU_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_SWIGLU_MATH_H_

#include <cmath>

#include "base/host_device.h"
#include "model/kernels/gelu_math.h"

namespace ps {

template <typename T>
PS_HOST_DEVICE T Silu(T g) {
  return g / (T{1} + std::exp(-g));
}

template <typename T>
PS_HOST_DEVICE T SiluDerivative(T g) {
  const T e = std::exp(-g);
  const T s = T{1} / (T{1} + e);
  const T one_minus_s = e <= T{1} ? e * s : T{1} - s;
  return s * (T{1} + g * one_minus_s);
}

// h = silu(g) * u.
template <typename T>
PS_HOST_DEVICE T SwiGlu(T g, T u) {
  return Silu(g) * u;
}

// The two partial derivatives of h = silu(g) * u times the incoming gradient dh.
template <typename T>
struct SwiGluGrads {
  T dg;
  T du;
};
template <typename T>
PS_HOST_DEVICE SwiGluGrads<T> SwiGluBackwardTerms(T g, T u, T dh) {
  return SwiGluGrads<T>{dh * u * SiluDerivative(g), dh * Silu(g)};
}

// The gate's activation: silu (SwiGLU: Llama and the llama-likes, hidden_act "silu") or GELU
// with the tanh approximation (GeGLU: Gemma's hidden_act "gelu_pytorch_tanh", gelu_math.h's
// GeluTanh, the function of GPT-2's MLP):
//   h = GeluTanh(g) * u,   dg = dh * u * GeluTanhDerivative(g),   du = dh * GeluTanh(g).
enum class GateActivation { kSilu, kGeluTanh };

template <typename T>
PS_HOST_DEVICE T GatedActivation(GateActivation act, T g, T u) {
  return act == GateActivation::kSilu ? SwiGlu(g, u) : GeluTanh(g) * u;
}

template <typename T>
PS_HOST_DEVICE SwiGluGrads<T> GatedActivationBackwardTerms(GateActivation act, T g, T u, T dh) {
  if (act == GateActivation::kSilu) return SwiGluBackwardTerms(g, u, dh);
  return SwiGluGrads<T>{dh * u * GeluTanhDerivative(g), dh * GeluTanh(g)};
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_SWIGLU_MATH_H_
