// The f32 inner loops of causal attention (model/kernels/gqa_attention.h), one (batch, head) at a
// time, in Highway with run-time dispatch (the best instruction set of this CPU, like
// internal/simd.h).
//
// Exactness. These loops compute, bit for bit, what the reference loops of
// internal/attention_reference.h compute with simd::Dot, simd::Axpy and simd::Scale per call
// (gqa_attention_test checks it on every target): every score, probability and weight goes through
// the same operations in the same order. What changed is only the schedule:
//   - the dot products are inlined (internal/simd-inl.h DotExact, the function simd::Dot runs)
//     instead of one dispatched call each;
//   - an output row's accumulation over keys runs one vector chunk at a time with the chunk in a
//     register (per lane the same multiply-adds in the same key order) instead of a call per key
//     that loads and stores the whole row;
//   - the backward computes each probability P_ij and score gradient dS_ij once per
//     (query block, key block) and uses it for dk, dv and dq, where the reference recomputed both
//     in each of its two passes. The sums keep their orders: dk_j and dv_j over queries i
//     ascending, dq_i over keys j ascending.
// The scalar steps (exp, log, the running softmax sums) are the *_math.h functions, called in
// the reference's order. This file's translation unit is compiled with -ffp-contract=off so the
// compiler cannot fuse a scalar multiply and add that the reference rounds separately.
//
// Thread safety: pure functions of their arguments; callers give each thread its own outputs.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_SIMD_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_SIMD_H_

#include <cstdint>

#include "model/kernels/attention_math.h"

namespace ps::kernels_internal::simd {

// One (batch, query head) and the kv head it reads: row t of q starts at q + t * q_stride, row t
// of k and v at k + t * kv_stride and v + t * kv_stride; a row's head_dim elements are contiguous.
struct AttentionHeadView {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0;   // elements between consecutive positions of q (3C for GPT-2's qkv)
  int64_t kv_stride = 0;  // elements between consecutive positions of k and v
  int64_t seq_len = 0;    // T
  int64_t head_dim = 0;   // D
  float scale = 0;        // 1 / sqrt(D)
  // The mask (model/kernels/gqa_attention.h): query t sees keys [AttentionFirstKey(t,
  // key_start[t], window), t]. key_start: this batch row's [T] (non-decreasing, <= t), or null
  // for 0; window 0: none.
  const int32_t* key_start = nullptr;
  int64_t window = 0;
  int64_t FirstKey(int64_t t) const {
    return AttentionFirstKey(t, key_start == nullptr ? 0 : key_start[t], window);
  }
};

// Query rows per block and key columns per block of AttentionBackwardHead (its stack buffers are
// two kAttentionBlock^2 tiles of floats). Any value gives the same results.
inline constexpr int64_t kAttentionBlock = 64;

// Forward of query rows [i0, i1) over key tiles of `tile` positions starting at each query's first
// visible key (the online softmax of gqa_attention.h; the tile fixes the rounding): out row i at
// out + i * out_stride (head_dim elements), lse[i]. `scores` holds `tile` floats and `acc` head_dim
// floats of scratch.
void AttentionForwardRows(const AttentionHeadView& head, int64_t tile, int64_t i0, int64_t i1,
                          float* out, int64_t out_stride, float* lse, float* scores, float* acc);

// Backward of the whole head: dq (rows at dq + t * q_stride), dk and dv (rows at dk + t *
// kv_stride, likewise dv) += the gradients, from the forward's out and its gradient dout (rows at
// + t * out_stride) and lse. dk_j and dv_j sum over queries i ascending, dq_i over keys ascending,
// so calling this for the query heads of a group in increasing order gives the reference's dk, dv.
// Under a mask, (query block, key block) pairs where no query sees a key are skipped, and within
// a pair only the visible (i, j) are computed.
void AttentionBackwardHead(const AttentionHeadView& head, const float* out, const float* dout,
                           int64_t out_stride, const float* lse, float* dq, float* dk, float* dv);

}  // namespace ps::kernels_internal::simd

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_SIMD_H_
