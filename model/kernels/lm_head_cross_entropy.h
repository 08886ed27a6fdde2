// The fused LM head and cross-entropy loss of GPT-2: logits = h wte^T (the head is tied to the
// token embedding), loss = mean over the non-ignored positions of -log softmax(logits)[target].
// The [N, V] logits (N = B*T, V = 50257 for GPT-2: 1.6 GB at N = 8192 in f32) are never
// materialized: they are produced one [row_tile, vocab_tile] tile at a time by a GEMM and consumed
// at once.
//
// Forward. For row n with hidden state h_n (after the final LayerNorm) and target t_n:
//   z_nv = h_n . wte_v
//   lse_n = log sum_v exp(z_nv)              (computed online over vocabulary tiles: keep the
//                                             running max m and s = sum exp(z - m); a new tile
//                                             with max m' rescales s by exp(m - m'))
//   loss  = (1 / |valid|) sum_{n valid} (lse_n - z_{n,t_n}),  valid = {n : t_n != ignore_index}
// lse_n is saved for the backward pass ([N] numbers).
//
// Backward, with g = dL_total/dloss (1, or the loss scale) and p_nv = exp(z_nv - lse_n):
//   dz_nv = g / |valid| * (p_nv - [v == t_n])  for valid n, 0 for ignored rows
//   dh_n  += sum_v dz_nv wte_v                (GEMM per tile: dh += dZ wte_tile)
//   dwte_v += sum_n dz_nv h_n                 (GEMM per tile: dwte_tile += dZ^T h)
// Each tile's logits are recomputed from h and wte (one extra GEMM) instead of stored, unless
// the fused training kernel (LmHeadCrossEntropyForwardBackward, below) keeps a row tile's logits.
//
// Threading: GEMMs run in fixed blocks on `pool` (OpenBLAS: internal/blas.h; the bf16 variants:
// internal/bf16_gemm.h); the per-tile softmax runs on `pool` over rows,
// each row in a fixed order. The loss sum is taken in double in row order.
// Results do not depend on the pool's thread count.
//
// SIMD: for f32 the row max, the sum of exp(z - max) (vector accumulators, Highway's exp) and
// the gradient scale * exp(z - lse) run Highway loops (internal/simd.h); f64 is scalar.
//
// Workspace: one logits tile plus three numbers per tile row; see LmHeadCrossEntropyWorkspaceElems.
// Gradients accumulate (+=).
#ifndef PATRICKSTAR_MODEL_KERNELS_LM_HEAD_CROSS_ENTROPY_H_
#define PATRICKSTAR_MODEL_KERNELS_LM_HEAD_CROSS_ENTROPY_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct LmHeadCrossEntropyShape {
  int64_t rows = 0;        // N = B*T positions
  int64_t channels = 0;    // C
  int64_t vocab_size = 0;  // V
  // Tile sizes: memory is row_tile * vocab_tile logits. Defaults: 2 MiB in f32.
  int64_t row_tile = 256;
  int64_t vocab_tile = 2048;
  // Targets equal to this are excluded from the loss (PyTorch's and Hugging Face's default).
  int32_t ignore_index = -100;
};

// Workspace elements (of the kernel's element type) the forward and the backward need.
inline int64_t LmHeadCrossEntropyWorkspaceElems(const LmHeadCrossEntropyShape& s) {
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.vocab_size, s.vocab_tile);
  return r * v + 3 * r;
}
template <typename T>
int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& s) {
  return LmHeadCrossEntropyWorkspaceElems(s) * static_cast<int64_t>(sizeof(T));
}

// Returns the mean cross-entropy over the valid targets (0 if there are none) and writes lse[N].
// h [N,C], wte [V,C], targets [N] each in [0, V) or ignore_index. InvalidArgument on a bad shape,
// buffer size or target; workspace must hold LmHeadCrossEntropyWorkspaceElems(shape) elements.
template <typename T>
[[nodiscard]] absl::StatusOr<double> LmHeadCrossEntropyForward(
    const LmHeadCrossEntropyShape& shape, absl::Span<const T> h, absl::Span<const T> wte,
    absl::Span<const int32_t> targets, absl::Span<T> lse, absl::Span<T> workspace,
    ThreadPool* pool);

// dh += dloss/dh * loss_grad and dwte += dloss/dwte * loss_grad, from the forward's lse.
template <typename T>
[[nodiscard]] absl::Status LmHeadCrossEntropyBackward(
    const LmHeadCrossEntropyShape& shape, absl::Span<const T> h, absl::Span<const T> wte,
    absl::Span<const int32_t> targets, absl::Span<const T> lse, double loss_grad, absl::Span<T> dh,
    absl::Span<T> dwte, absl::Span<T> workspace, ThreadPool* pool);

// bf16 variants (as matmul.h's, internal/bf16_gemm.h): wte [V, C] is read as bf16 in place (the
// param chunk's own values); h is rounded to bf16 once per call and each dz tile before its two
// GEMMs (round-to-nearest-even); logits, the softmax, the loss, dh and dwte stay f32 (products
// exact, f32 accumulation). The workspace, in f32 elements, holds the f32 workspace above plus
// the bf16 copies of h and of one dz tile. Errors as the f32 kernels, plus those of GemmBf16.
int64_t LmHeadCrossEntropyBf16WorkspaceElems(const LmHeadCrossEntropyShape& s);
[[nodiscard]] absl::StatusOr<double> LmHeadCrossEntropyForwardBf16(
    const LmHeadCrossEntropyShape& shape, absl::Span<const float> h, absl::Span<const uint16_t> wte,
    absl::Span<const int32_t> targets, absl::Span<float> lse, absl::Span<float> workspace,
    ThreadPool* pool);
[[nodiscard]] absl::Status LmHeadCrossEntropyBackwardBf16(
    const LmHeadCrossEntropyShape& shape, absl::Span<const float> h, absl::Span<const uint16_t> wte,
    absl::Span<const int32_t> targets, absl::Span<const float> lse, double loss_grad,
    absl::Span<float> dh, absl::Span<float> dwte, absl::Span<float> workspace, ThreadPool* pool);

// Training: LmHeadCrossEntropyForward and LmHeadCrossEntropyBackward(loss_grad) in one call,
// bit-identical to calling the two, without the backward's second computation of the logits
// (a third of the head's GEMM FLOPs): each row tile's logits for the whole vocabulary are kept
// until the tile's lse is known and then turned into dz in place. The price is the workspace:
// row_tile * vocab_size logits instead of one row_tile * vocab_tile tile (GPT-2, row tile 256:
// 51 MB instead of 2 MB). Returns the loss; writes lse, dh += ..., dwte += ... Errors as the two.
int64_t LmHeadCrossEntropyFusedWorkspaceElems(const LmHeadCrossEntropyShape& s);
template <typename T>
[[nodiscard]] absl::StatusOr<double> LmHeadCrossEntropyForwardBackward(
    const LmHeadCrossEntropyShape& shape, absl::Span<const T> h, absl::Span<const T> wte,
    absl::Span<const int32_t> targets, double loss_grad, absl::Span<T> lse, absl::Span<T> dh,
    absl::Span<T> dwte, absl::Span<T> workspace, ThreadPool* pool);
// The bf16 variant (the bf16 kernels' rounding, see above), bit-identical to
// LmHeadCrossEntropyForwardBf16 followed by LmHeadCrossEntropyBackwardBf16.
int64_t LmHeadCrossEntropyFusedBf16WorkspaceElems(const LmHeadCrossEntropyShape& s);
[[nodiscard]] absl::StatusOr<double> LmHeadCrossEntropyForwardBackwardBf16(
    const LmHeadCrossEntropyShape& shape, absl::Span<const float> h, absl::Span<const uint16_t> wte,
    absl::Span<const int32_t> targets, double loss_grad, absl::Span<float> lse,
    absl::Span<float> dh, absl::Span<float> dwte, absl::Span<float> workspace, ThreadPool* pool);

#define PS_LM_HEAD_CE_EXTERN_(T)                                                            \
  extern template absl::StatusOr<double> LmHeadCrossEntropyForwardBackward<T>(              \
      const LmHeadCrossEntropyShape&, absl::Span<const T>, absl::Span<const T>,             \
      absl::Span<const int32_t>, double, absl::Span<T>, absl::Span<T>, absl::Span<T>,       \
      absl::Span<T>, ThreadPool*);                                                          \
  extern template absl::StatusOr<double> LmHeadCrossEntropyForward<T>(                      \
      const LmHeadCrossEntropyShape&, absl::Span<const T>, absl::Span<const T>,             \
      absl::Span<const int32_t>, absl::Span<T>, absl::Span<T>, ThreadPool*);                \
  extern template absl::Status LmHeadCrossEntropyBackward<T>(                               \
      const LmHeadCrossEntropyShape&, absl::Span<const T>, absl::Span<const T>,             \
      absl::Span<const int32_t>, absl::Span<const T>, double, absl::Span<T>, absl::Span<T>, \
      absl::Span<T>, ThreadPool*)
PS_LM_HEAD_CE_EXTERN_(float);
PS_LM_HEAD_CE_EXTERN_(double);
#undef PS_LM_HEAD_CE_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_LM_HEAD_CROSS_ENTROPY_H_
