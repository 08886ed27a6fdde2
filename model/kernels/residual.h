// The residual connection: out = a + b (element-wise). Backward: da += dout, db += dout.
// f32 runs Highway loops (internal/simd.h; exact, single additions). Element-wise; parallel over
// fixed blocks. Gradients accumulate (+=). Needs no workspace.
#ifndef PATRICKSTAR_MODEL_KERNELS_RESIDUAL_H_
#define PATRICKSTAR_MODEL_KERNELS_RESIDUAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

// Workspace the residual add needs: none.
inline int64_t ResidualWorkspaceBytes(int64_t /*num_elems*/) { return 0; }

// out = a + b. All three have the same (positive) size; out may alias a or b.
template <typename T>
[[nodiscard]] absl::Status ResidualForward(absl::Span<const T> a, absl::Span<const T> b,
                                           absl::Span<T> out, ThreadPool* pool);

// da += dout, db += dout. REQUIRES: da and db do not overlap.
template <typename T>
[[nodiscard]] absl::Status ResidualBackward(absl::Span<const T> dout, absl::Span<T> da,
                                            absl::Span<T> db, ThreadPool* pool);

// x *= alpha, element-wise (one rounded product each): Gemma's token embedding times
// sqrt(hidden_size), and the same factor on its gradient. x has a positive size.
template <typename T>
[[nodiscard]] absl::Status ScaleInPlace(T alpha, absl::Span<T> x, ThreadPool* pool);

#define PS_RESIDUAL_EXTERN_(T)                                                              \
  extern template absl::Status ResidualForward<T>(absl::Span<const T>, absl::Span<const T>, \
                                                  absl::Span<T>, ThreadPool*);              \
  extern template absl::Status ResidualBackward<T>(absl::Span<const T>, absl::Span<T>,      \
                                                   absl::Span<T>, ThreadPool*);             \
  extern template absl::Status ScaleInPlace<T>(T, absl::Span<T>, ThreadPool*)
PS_RESIDUAL_EXTERN_(float);
PS_RESIDUAL_EXTERN_(double);
#undef PS_RESIDUAL_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_RESIDUAL_H_
