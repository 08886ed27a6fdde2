// Causal self-attention with grouped-query heads (GQA) of Llama 2/3, Qwen2 and Mistral, from the
// rotated q/k and the v projection to the merged heads (before o_proj), computed blockwise with the
// online softmax of GPT-2's attention (model/kernels/attention.h), so no T x T matrix is ever
// stored. Multi-head attention is the case num_kv_heads == num_heads, multi-query attention
// num_kv_heads == 1.
//
// Layout (row-major, Hugging Face's view(B, T, H, D) of each projection's output):
//   q, out [B, T, Hq, D]   (Hq = num_attention_heads)
//   k, v   [B, T, Hkv, D]  (Hkv = num_key_value_heads; Hq % Hkv == 0)
//   lse    [B, Hq, T]
// Query head h reads key/value head g(h) = h / (Hq / Hkv) — transformers' repeat_kv, which
// repeats each kv head for Hq/Hkv consecutive query heads. out's [T, Hq*D] rows are o_proj's input.
//
// Forward, per (b, h) and query position i, with scale = 1/sqrt(D) (Hugging Face's head_dim**-0.5):
//   s_ij = scale * q_i . k_j  for j <= i (causal),  out_i = sum_j softmax_j(s_i) v_j,
//   lse_i = log sum_{j<=i} exp(s_ij)
// over key tiles of `tile` positions with the streaming softmax of attention.h (running max,
// running sum, running unnormalized output rescaled by SoftmaxRescale when the max grows).
//
// Backward (FlashAttention-2, as attention.h), with P_ij = exp(s_ij - lse_i) recomputed and
// D_i = dO_i . out_i:
//   dS_ij = P_ij (dO_i . v_j - D_i)
//   dq_i += scale sum_j dS_ij k_j
//   dk_j += scale sum_{h in group(g)} sum_i dS^h_ij q^h_i,   dv_j += sum_{h in group} sum_i P^h_ij
//   dO^h_i
// i.e. the gradients of a kv head sum over every query head that reads it. Two passes keep every
// output owned by one task without atomics: pass A, parallel over (b, kv head, key tile),
// accumulates dk and dv over the group's query heads in increasing order and then queries in
// increasing order; pass B, parallel over (b, query head, query tile), accumulates dq.
// The per-score math is attention_math.h and softmax_math.h, shared with GPT-2 and the GPU.
//
// SIMD: f32 dot products, rescales and axpys run the Highway loops of internal/simd.h; f64 is
// scalar. Results do not depend on the thread count. The forward's workspace is one slot
// (tile + D elements) per pool thread, independent of T; the backward needs none. Gradients
// accumulate (+=). f32 and f64 only (low-precision activations are converted by the caller).
#ifndef PATRICKSTAR_MODEL_KERNELS_GQA_ATTENTION_H_
#define PATRICKSTAR_MODEL_KERNELS_GQA_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct GqaAttentionShape {
  int64_t batch = 0;         // B
  int64_t seq_len = 0;       // T
  int64_t num_heads = 0;     // Hq (num_attention_heads)
  int64_t num_kv_heads = 0;  // Hkv (num_key_value_heads); REQUIRES: divides num_heads
  int64_t head_dim = 0;      // D
  int64_t tile = 64;         // key positions whose scores are held at once; query rows per task
};

// Forward workspace, in elements of the kernel's type, for a pool of `num_threads` threads (1 for
// no pool): (tile + D) per thread. Independent of seq_len.
int64_t GqaAttentionWorkspaceElems(const GqaAttentionShape& shape, int num_threads);
template <typename T>
int64_t GqaAttentionWorkspaceBytes(const GqaAttentionShape& shape, int num_threads) {
  return GqaAttentionWorkspaceElems(shape, num_threads) * static_cast<int64_t>(sizeof(T));
}

// out = attention(q, k, v), lse [B, Hq, T] saved. workspace must hold
// GqaAttentionWorkspaceElems(shape, pool ? pool->num_threads() : 1) elements. InvalidArgument on a
// bad shape (naming num_key_value_heads when it does not divide num_attention_heads) or buffer.
template <typename T>
[[nodiscard]] absl::Status GqaAttentionForward(const GqaAttentionShape& shape,
                                               absl::Span<const T> q, absl::Span<const T> k,
                                               absl::Span<const T> v, absl::Span<T> out,
                                               absl::Span<T> lse, absl::Span<T> workspace,
                                               ThreadPool* pool);

// dq += dL/dq, dk += dL/dk, dv += dL/dv for L = sum dout . out, from the forward's q, k, v, out
// and lse.
template <typename T>
[[nodiscard]] absl::Status GqaAttentionBackward(const GqaAttentionShape& shape,
                                                absl::Span<const T> q, absl::Span<const T> k,
                                                absl::Span<const T> v, absl::Span<const T> out,
                                                absl::Span<const T> lse, absl::Span<const T> dout,
                                                absl::Span<T> dq, absl::Span<T> dk,
                                                absl::Span<T> dv, ThreadPool* pool);

#define PS_GQA_ATTENTION_EXTERN_(T)                                                                \
  extern template absl::Status GqaAttentionForward<T>(                                             \
      const GqaAttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*);                                   \
  extern template absl::Status GqaAttentionBackward<T>(                                            \
      const GqaAttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<const T>, absl::Span<const T>, absl::Span<const T>, absl::Span<T>, absl::Span<T>, \
      absl::Span<T>, ThreadPool*)
PS_GQA_ATTENTION_EXTERN_(float);
PS_GQA_ATTENTION_EXTERN_(double);
#undef PS_GQA_ATTENTION_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_GQA_ATTENTION_H_
