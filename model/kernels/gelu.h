// GELU with the tanh approximation, exactly Hugging Face's "gelu_new" (GPT-2's
// activation_function):
//   y = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
// Backward, by the product and chain rules with d tanh(u)/du = 1 - tanh(u)^2 = sech^2(u):
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   dx += dout * dy/dx
// Element-wise; parallel over fixed blocks. Gradients accumulate (+=). Needs no workspace.
#ifndef PATRICKSTAR_MODEL_KERNELS_GELU_H_
#define PATRICKSTAR_MODEL_KERNELS_GELU_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "optimizer/thread_pool.h"

namespace ps {

// The scalar math, shared by the kernel and its tests.
template <typename T>
inline T GeluTanh(T x) {
  constexpr T kSqrt2OverPi = static_cast<T>(0.79788456080286535587989211986876);
  const T u = kSqrt2OverPi * (x + static_cast<T>(0.044715) * x * x * x);
  return static_cast<T>(0.5) * x * (1 + std::tanh(u));
}

template <typename T>
inline T GeluTanhDerivative(T x) {
  constexpr T kSqrt2OverPi = static_cast<T>(0.79788456080286535587989211986876);
  constexpr T kCoeff = static_cast<T>(0.044715);
  const T th = std::tanh(kSqrt2OverPi * (x + kCoeff * x * x * x));
  return static_cast<T>(0.5) * (1 + th) +
         static_cast<T>(0.5) * x * (1 - th * th) * kSqrt2OverPi * (1 + 3 * kCoeff * x * x);
}

// Workspace GELU needs: none.
inline int64_t GeluWorkspaceBytes(int64_t /*num_elems*/) { return 0; }

// y = gelu_new(x). x and y have the same (positive) size; they may be the same buffer.
template <typename T>
[[nodiscard]] absl::Status GeluForward(absl::Span<const T> x, absl::Span<T> y, ThreadPool* pool);

// dx += dy * gelu_new'(x). x, dy and dx have the same size.
template <typename T>
[[nodiscard]] absl::Status GeluBackward(absl::Span<const T> x, absl::Span<const T> dy,
                                        absl::Span<T> dx, ThreadPool* pool);

#define PS_GELU_EXTERN_(T)                                                                      \
  extern template absl::Status GeluForward<T>(absl::Span<const T>, absl::Span<T>, ThreadPool*); \
  extern template absl::Status GeluBackward<T>(absl::Span<const T>, absl::Span<const T>,        \
                                               absl::Span<T>, ThreadPool*)
PS_GELU_EXTERN_(float);
PS_GELU_EXTERN_(double);
#undef PS_GELU_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_GELU_H_
