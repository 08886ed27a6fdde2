// LayerNorm over the channel dimension, as torch.nn.LayerNorm(C, eps=1e-5) in GPT-2.
//
// Math, per row x of C channels:
//   mean = (1/C) sum_c x_c
//   var  = (1/C) sum_c (x_c - mean)^2            (biased, as PyTorch)
//   rstd = 1 / sqrt(var + eps)
//   xhat_c = (x_c - mean) * rstd
//   y_c  = w_c * xhat_c + b_c
// The forward saves mean and rstd per row (2 numbers; the row itself is kept by the caller).
//
// Backward. With g_c = dy_c * w_c (the gradient reaching xhat), and using
// d xhat_c / d x_k = rstd * (delta_ck - 1/C - xhat_c xhat_k / C), which follows from
// d mean/dx_k = 1/C and d rstd/dx_k = -rstd^3 (x_k - mean)/C:
//   dx_k = rstd * (g_k - mean_c(g_c) - xhat_k * mean_c(g_c xhat_c))
//   dw_c = sum over rows of dy_c * xhat_c
//   db_c = sum over rows of dy_c
// dx is computed row-parallel (each row needs two row reductions). dw and db are reductions over
// rows; to keep them deterministic without per-thread partial sums they are computed in a second
// pass parallel over channel slices, each task summing its channels over all rows in row order
// (xhat is recomputed from the saved mean/rstd).
//
// f32 rows run Highway loops (internal/simd.h): the row sums are taken in four vector
// accumulators and a lane tree instead of index order, so f32 results differ from a scalar loop by
// rounding; f64 is scalar. Either way results do not depend on the thread count.
//
// Layouts: x, y, dy, dx [N, C] row-major (N = B*T); w, b, dw, db [C]; mean, rstd [N].
// Gradients accumulate (+=). Needs no workspace.
#ifndef PATRICKSTAR_MODEL_KERNELS_LAYERNORM_H_
#define PATRICKSTAR_MODEL_KERNELS_LAYERNORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct LayerNormShape {
  int64_t rows = 0;      // N = B*T
  int64_t channels = 0;  // C
  double eps = 1e-5;     // GPT-2's layer_norm_epsilon
};

// Workspace LayerNorm needs: none.
inline int64_t LayerNormWorkspaceBytes(const LayerNormShape&) { return 0; }

// y = LayerNorm(x) * w + b; writes mean[N] and rstd[N] for the backward pass. InvalidArgument on
// a bad shape or buffer size. `pool` may be null.
template <typename T>
[[nodiscard]] absl::Status LayerNormForward(const LayerNormShape& shape, absl::Span<const T> x,
                                            absl::Span<const T> w, absl::Span<const T> b,
                                            absl::Span<T> y, absl::Span<T> mean, absl::Span<T> rstd,
                                            ThreadPool* pool);

// dx += dL/dx, dw += dL/dw, db += dL/db given dy and the forward's x, w, mean and rstd. An empty
// dw or db skips that gradient (input gradient only, for a frozen norm); dx is the same bits.
template <typename T>
[[nodiscard]] absl::Status LayerNormBackward(const LayerNormShape& shape, absl::Span<const T> x,
                                             absl::Span<const T> w, absl::Span<const T> mean,
                                             absl::Span<const T> rstd, absl::Span<const T> dy,
                                             absl::Span<T> dx, absl::Span<T> dw, absl::Span<T> db,
                                             ThreadPool* pool);

#define PS_LAYERNORM_EXTERN_(T)                                                              \
  extern template absl::Status LayerNormForward<T>(                                          \
      const LayerNormShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*);                             \
  extern template absl::Status LayerNormBackward<T>(                                         \
      const LayerNormShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<const T>, absl::Span<const T>, absl::Span<T>, absl::Span<T>, absl::Span<T>, \
      ThreadPool*)
PS_LAYERNORM_EXTERN_(float);
PS_LAYERNORM_EXTERN_(double);
#undef PS_LAYERNORM_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_LAYERNORM_H_
