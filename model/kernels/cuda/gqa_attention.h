// Causal grouped-query attention on the GPU, f32, the one attention kernel of every model: the
// math, layouts (q, out [B,T,Hq,D]; k, v [B,T,Hkv,D], q and k, v rows shape.q_row_stride and
// kv_row_stride apart, 0 = packed; lse [B,Hq,T]) and accumulation (+=) of the CPU kernel
// (model/kernels/gqa_attention.h), with its online-softmax and backward arithmetic
// (attention_math.h, softmax_math.h). GPT-2's multi-head attention is the case Hkv = Hq over its
// fused qkv [B,T,3C]: q = qkv, k = qkv + C, v = qkv + 2C, both strides 3C.
//
// Tiling (see gqa_attention_kernels.cu): a block per (batch, head, group of 8 positions), one warp
// per position; keys and values stream through shared memory in tiles of 32 positions with the
// online softmax, so nothing of size T x T exists. The backward recomputes the probabilities from
// the saved lse, FlashAttention-2 style: a key pass per kv head for dk/dv (summing over the query
// heads of its group) and a query pass for dq, each output row owned by one warp (deterministic,
// no atomics). GqaAttentionShape::tile (the CPU kernel's tile) is not used: the GPU tiles are
// fixed.
//
// Limits: head_dim <= 128 (the per-lane register arrays, and 32 KiB of shared memory per block),
// B and Hq <= 65535 (grid dimensions).
//
// Device pointers; validates shape, pointers and workspace, enqueues on `stream`, returns the
// launch status. Never allocates or synchronizes. Thread safety: stateless.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_GQA_ATTENTION_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_GQA_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/cuda/workspace_sizes.h"
#include "model/kernels/gqa_attention.h"

namespace ps::cuda {

// Workspace sizes: GqaAttentionForwardWorkspaceBytes / GqaAttentionBackwardWorkspaceBytes in
// cuda/workspace_sizes.h.

// out = attention(q, k, v), lse [B,Hq,T] saved.
[[nodiscard]] absl::Status GqaAttentionForward(const GqaAttentionShape& shape, const float* q,
                                               const float* k, const float* v, float* out,
                                               float* lse, cudaStream_t stream,
                                               const int32_t* key_start = nullptr);

// dq += dL/dq, dk += dL/dk, dv += dL/dv for L = sum dout . out, from the forward's q, k, v, out and
// lse. `workspace` (device) holds at least GqaAttentionBackwardWorkspaceBytes(shape) bytes, 4-byte
// aligned.
[[nodiscard]] absl::Status GqaAttentionBackward(const GqaAttentionShape& shape, const float* q,
                                                const float* k, const float* v, const float* out,
                                                const float* lse, const float* dout, float* dq,
                                                float* dk, float* dv, void* workspace,
                                                int64_t workspace_bytes, cudaStream_t stream,
                                                const int32_t* key_start = nullptr);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_GQA_ATTENTION_H_
