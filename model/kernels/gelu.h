// GELU with the tanh approximation, exactly Hugging Face's "gelu_new" (GPT-2's
// activation_function):
//   y = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
// Backward, by the product and chain rules with d tanh(u)/du = 1 - tanh(u)^2 = sech^2(u):
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   dx += dout * dy/dx
// The scalar math is model/kernels/gelu_math.h (shared with the CUDA kernel).
// f32 runs the Highway loop of internal/simd.h (the same formula lane-wise, Highway's exp within
// 1 ulp of libm's, fused multiply-adds); f64 is scalar. Element-wise; parallel over fixed blocks. Gradients accumulate (+=). Needs no workspace.
#ifndef PATRICKSTAR_MODEL_KERNELS_GELU_H_
#define PATRICKSTAR_MODEL_KERNELS_GELU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "model/kernels/gelu_math.h"  // GeluTanh, GeluTanhDerivative: the scalar math
#include "base/thread_pool.h"

namespace ps {

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
