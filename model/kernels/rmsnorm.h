// RMSNorm over the channel dimension, as Hugging Face's LlamaRMSNorm / Qwen2RMSNorm /
// MistralRMSNorm (which compute in f32 whatever the storage type):
//
// Math, per row x of C channels:
//   rstd   = 1 / sqrt((1/C) sum_c x_c^2 + eps)        (no mean is subtracted, no bias)
//   xhat_c = x_c * rstd
//   y_c    = w_c * xhat_c
// The forward saves rstd per row (the row itself is kept by the caller).
//
// Backward. With g_c = dy_c * w_c (the gradient reaching xhat) and
// d rstd / d x_k = -rstd^3 x_k / C:
//   dx_k = rstd * (g_k - xhat_k * (1/C) sum_c g_c xhat_c)
//   dw_c = sum over rows of dy_c * xhat_c
// dx is computed row-parallel; dw is a reduction over rows, computed deterministically in a second
// pass parallel over channel slices, each task summing its channels over all rows in row order
// (xhat is recomputed from the saved rstd). The scalar math is model/kernels/rmsnorm_math.h
// (shared with the CUDA kernel).
//
// f32 rows run Highway loops (internal/llama_simd.h; the row sums in vector accumulators and a lane
// tree), f64 is scalar. Either way results do not depend on the thread count.
//
// Layouts: x, y, dy, dx [N, C] row-major (N = B*T); w, dw [C]; rstd [N]. y may not alias x (the
// backward needs x). Gradients accumulate (+=). Needs no workspace. Storage: f32 and f64 only;
// f16/bf16 parameters and activations are converted to f32 by the caller, as for GPT-2 (the
// conversion buffer counts as non-model data).
#ifndef PATRICKSTAR_MODEL_KERNELS_RMSNORM_H_
#define PATRICKSTAR_MODEL_KERNELS_RMSNORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct RmsNormShape {
  int64_t rows = 0;      // N = B*T
  int64_t channels = 0;  // C (hidden_size)
  double eps = 1e-6;     // rms_norm_eps of the model's config.json; must be positive
  // The gain is (weight_offset + w): 0 for Llama's w, 1 for Gemma's RMSNorm, which multiplies by
  // (1 + w) (its weights are stored as offsets from 1). The sum weight_offset + w[c] is rounded
  // to T, as transformers' (1.0 + weight.float()) is; dw is the same either way.
  double weight_offset = 0;
};

// Workspace RMSNorm needs: none.
inline int64_t RmsNormWorkspaceBytes(const RmsNormShape&) { return 0; }

// y = RMSNorm(x) * w; writes rstd[N] for the backward pass. InvalidArgument on a bad shape or
// buffer size. `pool` may be null.
template <typename T>
[[nodiscard]] absl::Status RmsNormForward(const RmsNormShape& shape, absl::Span<const T> x,
                                          absl::Span<const T> w, absl::Span<T> y,
                                          absl::Span<T> rstd, ThreadPool* pool);

// dx += dL/dx and dw += dL/dw given dy and the forward's x, w and rstd. An empty dw skips it
// (input gradient only, for a frozen norm); dx is the same bits.
template <typename T>
[[nodiscard]] absl::Status RmsNormBackward(const RmsNormShape& shape, absl::Span<const T> x,
                                           absl::Span<const T> w, absl::Span<const T> rstd,
                                           absl::Span<const T> dy, absl::Span<T> dx,
                                           absl::Span<T> dw, ThreadPool* pool);

#define PS_RMSNORM_EXTERN_(T)                                                              \
  extern template absl::Status RmsNormForward<T>(const RmsNormShape&, absl::Span<const T>, \
                                                 absl::Span<const T>, absl::Span<T>,       \
                                                 absl::Span<T>, ThreadPool*);              \
  extern template absl::Status RmsNormBackward<T>(                                         \
      const RmsNormShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<const T>, absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_RMSNORM_EXTERN_(float);
PS_RMSNORM_EXTERN_(double);
#undef PS_RMSNORM_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_RMSNORM_H_
