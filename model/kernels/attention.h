// GPT-2's attention shape, kept only for the model code that still calls
// Kernels::AttentionForward / AttentionBackward (model/kernels/kernels.h).
//
// Transition: removed when the model calls GqaAttention directly (issue #26). There is one
// attention kernel (model/kernels/gqa_attention.h); GPT-2's multi-head attention is its case
// num_kv_heads == num_heads, read from the fused qkv [B, T, 3C] through row strides of 3C.
#ifndef PATRICKSTAR_MODEL_KERNELS_ATTENTION_H_
#define PATRICKSTAR_MODEL_KERNELS_ATTENTION_H_

#include <cstdint>

#include "model/kernels/gqa_attention.h"

namespace ps {

// Transition: removed when the model calls GqaAttention directly (issue #26).
struct AttentionShape {
  int64_t batch = 0;      // B
  int64_t seq_len = 0;    // T
  int64_t channels = 0;   // C; REQUIRES: a multiple of num_heads
  int64_t num_heads = 0;  // H
  int64_t tile = 64;      // key positions whose scores are held at once; query rows per task
};

// The grouped-query shape of GPT-2's attention on qkv [B, T, 3C]: kv heads = heads, head_dim =
// C / H, q = qkv, k = qkv + C, v = qkv + 2C (and dq, dk, dv likewise in dqkv), both row strides
// 3C. channels % num_heads must be 0 (GqaAttention then validates the rest).
// Transition: removed when the model calls GqaAttention directly (issue #26).
inline GqaAttentionShape GqaShapeOfPackedQkv(const AttentionShape& s) {
  GqaAttentionShape g;
  g.batch = s.batch;
  g.seq_len = s.seq_len;
  g.num_heads = s.num_heads;
  g.num_kv_heads = s.num_heads;
  g.head_dim = s.num_heads > 0 ? s.channels / s.num_heads : 0;
  g.tile = s.tile;
  g.q_row_stride = 3 * s.channels;
  g.kv_row_stride = 3 * s.channels;
  return g;
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_ATTENTION_H_
