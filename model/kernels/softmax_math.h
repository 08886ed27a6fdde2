// The online (streaming) softmax state shared by attention and the fused LM head + cross-entropy,
// on the CPU and the GPU (PS_HOST_DEVICE: the CPU tests exercise the exact arithmetic the CUDA
// kernels run).
//
// A state (max, sum) stands for the values x_1..x_n seen so far through
//   max = max_i x_i,   sum = sum_i exp(x_i - max),   so   log sum_i exp(x_i) = max + log(sum).
// Adding values or merging two states moves both sums to the larger max by multiplying with
// exp(old_max - new_max) <= 1, so nothing overflows however large the values are. The empty state
// is (-inf, 0); its log-sum-exp is -inf.
//
// Infinities. exp(old - new) is NaN when both are -inf (or both +inf); SoftmaxRescale defines those
// cases instead: a -inf max (an empty state, or a -inf value, i.e. probability 0) rescales by 0 and
// equal maxima by exactly 1. So empty states merge into empty states, -inf values add nothing, and
// a +inf value gives a +inf log-sum-exp. For finite inputs the results equal the plain formulas
// bit for bit (exp(0) is exactly 1 and exp(-inf) exactly 0).
//
// Thread safety: pure functions and a value type.
#ifndef PATRICKSTAR_MODEL_KERNELS_SOFTMAX_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_SOFTMAX_MATH_H_

#include <cmath>

#include "base/host_device.h"

namespace ps {

// -inf of type T (usable in device code, unlike std::numeric_limits without relaxed constexpr).
template <typename T>
PS_HOST_DEVICE T NegativeInfinity() {
  return -static_cast<T>(INFINITY);
}

// std::max's semantics, (a < b) ? b : a, callable from device code.
template <typename T>
PS_HOST_DEVICE T MaxOf(T a, T b) {
  return a < b ? b : a;
}

// The factor exp(old_max - new_max) that moves a sum taken relative to old_max to new_max, for
// new_max >= old_max: 0 when old_max is -inf, exactly 1 when the two are equal (also both
// infinite), else exp(old_max - new_max).
template <typename T>
PS_HOST_DEVICE T SoftmaxRescale(T old_max, T new_max) {
  if (old_max == NegativeInfinity<T>()) return T{0};
  if (old_max == new_max) return T{1};
  return std::exp(old_max - new_max);
}

// The weight exp(x - max) of a value x relative to a running max (0 for x = -inf and a finite max).
template <typename T>
PS_HOST_DEVICE T SoftmaxWeight(T x, T running_max) {
  return std::exp(x - running_max);
}

template <typename T>
struct SoftmaxState {
  T max;  // largest value seen; -inf when empty
  T sum;  // sum of exp(x - max) over the values seen; 0 when empty
};

template <typename T>
PS_HOST_DEVICE SoftmaxState<T> EmptySoftmaxState() {
  return SoftmaxState<T>{NegativeInfinity<T>(), T{0}};
}

// The state after also seeing x.
template <typename T>
PS_HOST_DEVICE SoftmaxState<T> SoftmaxAdd(SoftmaxState<T> s, T x) {
  const T m = MaxOf(s.max, x);
  return SoftmaxState<T>{m, s.sum * SoftmaxRescale(s.max, m) + SoftmaxRescale(x, m)};
}

// The state of the union of the values behind a and b. Commutative up to rounding; exact when one
// side is empty.
template <typename T>
PS_HOST_DEVICE SoftmaxState<T> SoftmaxMerge(SoftmaxState<T> a, SoftmaxState<T> b) {
  const T m = MaxOf(a.max, b.max);
  return SoftmaxState<T>{m, a.sum * SoftmaxRescale(a.max, m) + b.sum * SoftmaxRescale(b.max, m)};
}

// log sum exp of the values seen: max + log(sum); -inf for the empty state.
template <typename T>
PS_HOST_DEVICE T SoftmaxLogSumExp(SoftmaxState<T> s) {
  return s.max + std::log(s.sum);
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_SOFTMAX_MATH_H_
