// Causal self-attention with grouped-query heads (GQA), the one attention kernel of every model:
// Llama 2/3, Qwen2 and Mistral (num_kv_heads < num_heads), and GPT-2's multi-head attention, which
// is the case num_kv_heads == num_heads read from its fused [B, T, 3C] qkv projection through row
// strides (multi-query attention is num_kv_heads == 1). From the (rotated) q/k and v to the merged
// heads (before o_proj / c_proj), computed blockwise with an online softmax, so no T x T matrix is
// ever stored.
//
// Layout (row-major, Hugging Face's view(B, T, H, D) of each projection's output):
//   q      [B, T, Hq, D]   row (b, t) at q + (b*T + t) * q_row_stride
//   k, v   [B, T, Hkv, D]  row (b, t) at k + (b*T + t) * kv_row_stride (likewise v)
//   out    [B, T, Hq, D]   packed (out's [T, Hq*D] rows are o_proj's input)
//   lse    [B, Hq, T]
// Hq = num_attention_heads, Hkv = num_key_value_heads, Hq % Hkv == 0. Within a row head h owns the
// D elements [h*D, (h+1)*D). The gradients dq and dk, dv have the strides of q and k, v; dout is
// packed like out. A stride of 0 means packed (Hq*D, Hkv*D). GPT-2's qkv [B, T, 3C] is
// q = qkv, k = qkv + C, v = qkv + 2C with both strides 3C, Hq = Hkv = H, D = C/H (its gradient
// likewise into dqkv). Query head h reads key/value head g(h) = h / (Hq / Hkv) — transformers'
// repeat_kv, which repeats each kv head for Hq/Hkv consecutive query heads.
//
// Forward, per (b, h) and query position i, with scale = 1/sqrt(D) (Hugging Face's head_dim**-0.5):
//   s_ij = scale * q_i . k_j  for j <= i (causal mask: j > i gets probability 0)
//   out_i = sum_j softmax_j(s_i) v_j,    lse_i = log sum_{j<=i} exp(s_ij)
// computed over key tiles of `tile` positions with the streaming (online) softmax: keep the
// running max m, the running sum l = sum exp(s - m) and the running unnormalized output
// a = sum exp(s - m) v. For a tile with scores s_j and m' = max(m, max_j s_j):
//   l <- l exp(m - m') + sum_j exp(s_j - m'),   a <- a exp(m - m') + sum_j exp(s_j - m') v_j
// and finally out_i = a / l, lse_i = m + log l. The forward saves lse for the backward pass.
//
// Backward (the FlashAttention-2 derivation). With P_ij = exp(s_ij - lse_i) (recomputed from q, k
// and the saved lse), dO = dout and D_i = dO_i . out_i = sum_j P_ij (dO_i . v_j):
//   dS_ij = P_ij (dO_i . v_j - D_i)                  (softmax Jacobian)
//   dq_i += scale sum_j dS_ij k_j
//   dk_j += scale sum_{h in group(g)} sum_i dS^h_ij q^h_i
//   dv_j += sum_{h in group(g)} sum_i P^h_ij dO^h_i
// i.e. the gradients of a kv head sum over every query head that reads it. The order of every sum
// is fixed: dk_j and dv_j over the group's query heads ascending and, for each, over queries i >= j
// ascending; dq_i over keys j <= i ascending. The per-score math is attention_math.h and
// softmax_math.h, shared with the GPU kernels (model/kernels/cuda/gqa_attention.h).
//
// Schedules. f64 runs the reference schedule (internal/attention_reference.h): the loops as
// written above, one task per (b, head, tile) and two backward passes (A over kv heads' key tiles
// for dk, dv; B over query tiles for dq) so every output has one owner without atomics. f32 runs
// a faster schedule with the same bits (internal/attention_simd.h; gqa_attention_test compares
// the two on every SIMD target): inlined dot products, output rows accumulated in registers, one
// backward task per (b, kv head) that computes each (query block, key block)'s P and dS once and
// feeds dq, dk and dv from them in the reference's orders. A dot product sums in vector
// accumulators and a lane tree (internal/simd-inl.h DotExact), not in index order.
//
// Threading and determinism: each task writes only its own rows and sums in a fixed order, so
// results do not depend on the thread count or on which thread ran a task. The forward's
// workspace is one slot (tile + D elements) per pool thread, independent of T; the backward needs
// none (the f32 schedule keeps its two 64 x 64 blocks, 32 KiB, on the task's stack). Gradients
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
  // Elements between consecutive tokens' rows of q (and dq), and of k, v (and dk, dv); 0 means
  // packed (num_heads * head_dim, num_kv_heads * head_dim). REQUIRES: 0 or at least the packed
  // row. out, dout and lse are always packed.
  int64_t q_row_stride = 0;
  int64_t kv_row_stride = 0;
  // Sliding window: 0 for none; w > 0 lets query t see only keys j > t - w (transformers'
  // Mistral / Gemma-2 convention: the query and the w - 1 keys before it). REQUIRES: >= 0.
  int64_t sliding_window = 0;
};

// The row strides in effect (the packed row where the shape says 0).
inline int64_t GqaQRowStride(const GqaAttentionShape& s) {
  return s.q_row_stride != 0 ? s.q_row_stride : s.num_heads * s.head_dim;
}
inline int64_t GqaKvRowStride(const GqaAttentionShape& s) {
  return s.kv_row_stride != 0 ? s.kv_row_stride : s.num_kv_heads * s.head_dim;
}

// The elements a q (dq) and a k, v (dk, dv) span covers: from the first row's start to the last
// row's end, (B*T - 1) * stride + heads * D. Equal to B*T*heads*D when packed.
inline int64_t GqaAttentionQElems(const GqaAttentionShape& s) {
  return (s.batch * s.seq_len - 1) * GqaQRowStride(s) + s.num_heads * s.head_dim;
}
inline int64_t GqaAttentionKvElems(const GqaAttentionShape& s) {
  return (s.batch * s.seq_len - 1) * GqaKvRowStride(s) + s.num_kv_heads * s.head_dim;
}

// Forward workspace, in elements of the kernel's type, for a pool of `num_threads` threads (1 for
// no pool): (tile + D) per thread. Independent of seq_len.
int64_t GqaAttentionWorkspaceElems(const GqaAttentionShape& shape, int num_threads);
template <typename T>
int64_t GqaAttentionWorkspaceBytes(const GqaAttentionShape& shape, int num_threads) {
  return GqaAttentionWorkspaceElems(shape, num_threads) * static_cast<int64_t>(sizeof(T));
}

// out = attention(q, k, v), lse [B, Hq, T] saved. q holds GqaAttentionQElems(shape) elements, k
// and v GqaAttentionKvElems(shape) (they may be views into one fused buffer), out B*T*Hq*D, lse
// B*Hq*T; workspace must hold GqaAttentionWorkspaceElems(shape, pool ? pool->num_threads() : 1)
// elements. InvalidArgument on a bad shape (naming num_key_value_heads when it does not divide
// num_attention_heads) or buffer size.
template <typename T>
[[nodiscard]] absl::Status GqaAttentionForward(const GqaAttentionShape& shape,
                                               absl::Span<const T> q, absl::Span<const T> k,
                                               absl::Span<const T> v, absl::Span<T> out,
                                               absl::Span<T> lse, absl::Span<T> workspace,
                                               ThreadPool* pool,
                                               absl::Span<const int32_t> key_start = {});

// dq += dL/dq, dk += dL/dk, dv += dL/dv for L = sum dout . out, from the forward's q, k, v, out
// and lse. dq has q's size and stride, dk and dv those of k and v; the three may interleave in one
// fused buffer (GPT-2's dqkv) but no element may belong to two of them.
template <typename T>
[[nodiscard]] absl::Status GqaAttentionBackward(const GqaAttentionShape& shape,
                                                absl::Span<const T> q, absl::Span<const T> k,
                                                absl::Span<const T> v, absl::Span<const T> out,
                                                absl::Span<const T> lse, absl::Span<const T> dout,
                                                absl::Span<T> dq, absl::Span<T> dk,
                                                absl::Span<T> dv, ThreadPool* pool,
                                                absl::Span<const int32_t> key_start = {});

#define PS_GQA_ATTENTION_EXTERN_(T)                                                                \
  extern template absl::Status GqaAttentionForward<T>(                                             \
      const GqaAttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*, absl::Span<const int32_t>);        \
  extern template absl::Status GqaAttentionBackward<T>(                                            \
      const GqaAttentionShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,     \
      absl::Span<const T>, absl::Span<const T>, absl::Span<const T>, absl::Span<T>, absl::Span<T>, \
      absl::Span<T>, ThreadPool*, absl::Span<const int32_t>)
PS_GQA_ATTENTION_EXTERN_(float);
PS_GQA_ATTENTION_EXTERN_(double);
#undef PS_GQA_ATTENTION_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_GQA_ATTENTION_H_
