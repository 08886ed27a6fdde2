// LoRA (Hu et al. 2021; PEFT's LoraLayer with bias "none"): a trainable low-rank update beside a
// frozen projection, y = W x + scale * B (A x), scale = lora_alpha / r. This file is the adapter
// half only (the caller runs W x with Linear or Matmul and passes its y here to accumulate into),
// plus the inverted dropout PEFT applies to the adapter's input (dropout_math.h has the rule).
// Layouts are PEFT's: A [rank, in] (lora_A.weight), B [out, rank] (lora_B.weight), row-major.
//
// Forward, x [N, in], y [N, out]:
//   h[N, rank] = x A^T                 (overwritten; the caller keeps it for the backward)
//   y[N, out] += scale * h B^T
// Backward, from dy [N, out]:
//   g[N, rank]    = scale * dy B       (workspace)
//   dB[out, rank] += scale * dy^T h
//   dA[rank, in]  += g^T x
//   dx[N, in]     += g A                (skipped when dx is empty: no input gradient wanted)
// The GEMMs run in OpenBLAS (cblas_sgemm / cblas_dgemm) as a grid fixed by the shape on `pool`
// (internal/blas.h), so results do not depend on the pool's size. Any rank >= 1 is allowed (also
// rank > in or out: PEFT refuses those, the math does not need to). Gradients accumulate (+=).
// All dimensions must fit OpenBLAS's 32-bit integers.
//
// Thread safety: the kernels are reentrant; concurrent calls must not write the same buffers.
#ifndef PATRICKSTAR_MODEL_KERNELS_LORA_H_
#define PATRICKSTAR_MODEL_KERNELS_LORA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct LoraShape {
  int64_t rows = 0;          // N = B*T
  int64_t in_features = 0;   // the base projection's in_features
  int64_t out_features = 0;  // the base projection's out_features
  int64_t rank = 0;          // r
  float scale = 1.0f;        // lora_alpha / r
};

// Workspace elements (of T) the backward needs: g, rows * rank. The forward needs none.
inline int64_t LoraBackwardWorkspaceElems(const LoraShape& s) { return s.rows * s.rank; }

// h = x A^T; y += scale * h B^T. x [N,in], a [rank,in], b [out,rank], h [N,rank], y [N,out].
// InvalidArgument on a bad shape or buffer size.
template <typename T>
[[nodiscard]] absl::Status LoraForward(const LoraShape& shape, absl::Span<const T> x,
                                       absl::Span<const T> a, absl::Span<const T> b,
                                       absl::Span<T> h, absl::Span<T> y, ThreadPool* pool);

// g = scale * dy B (in workspace, at least LoraBackwardWorkspaceElems); db += scale * dy^T h;
// da += g^T x; dx += g A unless dx is empty.
template <typename T>
[[nodiscard]] absl::Status LoraBackward(const LoraShape& shape, absl::Span<const T> x,
                                        absl::Span<const T> a, absl::Span<const T> b,
                                        absl::Span<const T> h, absl::Span<const T> dy,
                                        absl::Span<T> dx, absl::Span<T> da, absl::Span<T> db,
                                        absl::Span<T> workspace, ThreadPool* pool);

// Inverted dropout (dropout_math.h) over x.size() elements: y[i] = keep(seed, i) ? x[i] *
// scale(p) : 0. y has x's size and must not alias it. InvalidArgument unless 0 <= p < 1.
[[nodiscard]] absl::Status DropoutForward(float p, uint64_t seed, absl::Span<const float> x,
                                          absl::Span<float> y, ThreadPool* pool);
// dx[i] += keep(seed, i) ? dy[i] * scale(p) : 0 — exactly the forward's mask for the same seed.
[[nodiscard]] absl::Status DropoutBackward(float p, uint64_t seed, absl::Span<const float> dy,
                                           absl::Span<float> dx, ThreadPool* pool);

#define PS_LORA_EXTERN_(T)                                                                   \
  extern template absl::Status LoraForward<T>(const LoraShape&, absl::Span<const T>,         \
                                              absl::Span<const T>, absl::Span<const T>,      \
                                              absl::Span<T>, absl::Span<T>, ThreadPool*);    \
  extern template absl::Status LoraBackward<T>(                                              \
      const LoraShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,       \
      absl::Span<const T>, absl::Span<const T>, absl::Span<T>, absl::Span<T>, absl::Span<T>, \
      absl::Span<T>, ThreadPool*)
PS_LORA_EXTERN_(float);
PS_LORA_EXTERN_(double);
#undef PS_LORA_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_LORA_H_
