// Causal multi-head self-attention of GPT-2, from the fused QKV projection to the merged heads
// (before c_proj), computed blockwise with an online softmax so no T x T matrix is ever stored.
//
// Layout. qkv [B, T, 3C] is c_attn's output: q = qkv[..., 0:C], k = qkv[..., C:2C],
// v = qkv[..., 2C:3C]; head h owns channels [h*hd, (h+1)*hd) of each, hd = C / H. out [B, T, C]
// holds head h's result in the same channels (Hugging Face's _merge_heads).
//
// Forward, per (b, h) and query position i, with scale = 1/sqrt(hd):
//   s_ij = scale * q_i . k_j          for j <= i (causal mask: j > i gets probability 0)
//   out_i = sum_j softmax_j(s_i) v_j,    lse_i = log sum_{j<=i} exp(s_ij)
// computed over key tiles of `tile` positions with the streaming (online) softmax: keep the
// running max m, the running sum l = sum exp(s - m) and the running unnormalized output
// a = sum exp(s - m) v. For a tile with scores s_j and m' = max(m, max_j s_j):
//   l <- l exp(m - m') + sum_j exp(s_j - m'),   a <- a exp(m - m') + sum_j exp(s_j - m') v_j
// and finally out_i = a / l, lse_i = m + log l. Only one tile of scores and one output row per
// worker are live; the forward saves lse [B, H, T] for the backward pass.
//
// Backward (the FlashAttention-2 derivation). With P_ij = exp(s_ij - lse_i) (recomputed from q, k
// and the saved lse), dO = dout and D_i = dO_i . out_i = sum_j P_ij (dO_i . v_j):
//   dP_ij = dO_i . v_j
//   dS_ij = P_ij (dP_ij - D_i)                       (softmax Jacobian)
//   dq_i += scale sum_j dS_ij k_j,   dk_j += scale sum_i dS_ij q_i,   dv_j += sum_i P_ij dO_i
// dq is a sum over keys and dk, dv sums over queries. The reference schedule
// (internal/attention_reference.h, the f64 path) keeps every output owned by one task without
// atomics with two passes: pass A, parallel over key tiles, accumulates dk and dv; pass B,
// parallel over query tiles, accumulates dq; each recomputes the probabilities it needs.
//
// f32 (internal/attention_simd.h) runs a faster schedule with the same bits as the reference:
// the forward inlines its dot products and accumulates the output row chunk by chunk in
// registers; the backward runs one task per (b, h) that walks 64 x 64 (query, key) blocks, computes
// each block's P and dS once and feeds dk, dv and dq from them, keeping every sum in the
// reference's order (dk_j, dv_j over queries ascending, dq_i over keys ascending). A dot product
// sums in vector accumulators and a lane tree (internal/simd-inl.h DotExact), not in index order
// (rounding differences from a scalar loop only). f64 is scalar.
//
// Threading and determinism: work items are (b, h) for f32 (claimed dynamically in the forward)
// and (b, h, query or key tile) in the reference schedule; each writes only its own rows and sums
// in a fixed order, so results do not depend on the thread count or on which thread ran an item. The forward's workspace is one slot (a score tile and an output row) per
// pool thread — O(threads * (tile + hd)), independent of T. The backward needs no workspace (the
// f32 schedule keeps its two 64 x 64 blocks, 32 KiB, on the task's stack). Gradients accumulate
// (+=).
#ifndef PATRICKSTAR_MODEL_KERNELS_ATTENTION_H_
#define PATRICKSTAR_MODEL_KERNELS_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct AttentionShape {
  int64_t batch = 0;      // B
  int64_t seq_len = 0;    // T
  int64_t channels = 0;   // C; REQUIRES: a multiple of num_heads
  int64_t num_heads = 0;  // H
  int64_t tile = 64;      // key positions whose scores are held at once; query rows per task
};

// Forward workspace, in elements of the kernel's type, for a pool of `num_threads` threads (1 for
// no pool): (tile + hd) per thread. Independent of seq_len.
int64_t AttentionWorkspaceElems(const AttentionShape& shape, int num_threads);
template <typename T>
int64_t AttentionWorkspaceBytes(const AttentionShape& shape, int num_threads) {
  return AttentionWorkspaceElems(shape, num_threads) * static_cast<int64_t>(sizeof(T));
}

// out = attention(qkv), lse [B, H, T] saved. workspace must hold
// AttentionWorkspaceElems(shape, pool ? pool->num_threads() : 1) elements. InvalidArgument on a
// bad shape or buffer size.
template <typename T>
[[nodiscard]] absl::Status AttentionForward(const AttentionShape& shape, absl::Span<const T> qkv,
                                            absl::Span<T> out, absl::Span<T> lse,
                                            absl::Span<T> workspace, ThreadPool* pool);

// dqkv += d(sum dout . out)/d qkv, from the forward's qkv, out and lse.
template <typename T>
[[nodiscard]] absl::Status AttentionBackward(const AttentionShape& shape, absl::Span<const T> qkv,
                                             absl::Span<const T> out, absl::Span<const T> lse,
                                             absl::Span<const T> dout, absl::Span<T> dqkv,
                                             ThreadPool* pool);

#define PS_ATTENTION_EXTERN_(T)                                                                 \
  extern template absl::Status AttentionForward<T>(const AttentionShape&, absl::Span<const T>,  \
                                                   absl::Span<T>, absl::Span<T>, absl::Span<T>, \
                                                   ThreadPool*);                                \
  extern template absl::Status AttentionBackward<T>(                                            \
      const AttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<const T>, absl::Span<T>, ThreadPool*)
PS_ATTENTION_EXTERN_(float);
PS_ATTENTION_EXTERN_(double);
#undef PS_ATTENTION_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_ATTENTION_H_
