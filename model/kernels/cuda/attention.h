// Causal multi-head attention on the GPU, f32: the math, layouts (qkv [B,T,3C]
// -> out [B,T,C], lse [B,H,T]) and accumulation (+=) of the CPU kernel
// (model/kernels/attention.h), with its online-softmax and backward arithmetic
// (attention_math.h, softmax_math.h).
//
// Tiling (see attention_kernels.cu): a block per (batch, head, group of 8 query
// positions), one warp per position; keys and values stream through shared
// memory in tiles of 32 positions with the online softmax, so nothing of size T
// x T exists. The backward recomputes the probabilities from the saved lse,
// FlashAttention-2 style: a key pass for dk/dv and a query pass for dq, each
// output row owned by one warp (deterministic, no atomics).
// AttentionShape::tile (the CPU kernel's tile) is not used: the GPU tiles are
// fixed.
//
// Limits: head dim C/H <= 128 (the per-lane register arrays), B and H <= 65535
// (grid dimensions).
//
// Device pointers; validates shape, pointers and workspace, enqueues on
// `stream`, returns the launch status. Never allocates or synchronizes. Thread
// safety: stateless.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_ATTENTION_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/attention.h"
#include "model/kernels/cuda/workspace_sizes.h"

namespace ps::cuda {

// Workspace sizes: AttentionForwardWorkspaceBytes / AttentionBackwardWorkspaceBytes in
// cuda/workspace_sizes.h.

// out = attention(qkv), lse [B,H,T] saved.
[[nodiscard]] absl::Status AttentionForward(const AttentionShape& shape, const float* qkv,
                                            float* out, float* lse, cudaStream_t stream);

// dqkv += d(sum dout . out)/d qkv from the forward's qkv, out and lse.
// `workspace` (device) holds at least AttentionBackwardWorkspaceBytes(shape)
// bytes, 4-byte aligned.
[[nodiscard]] absl::Status AttentionBackward(const AttentionShape& shape, const float* qkv,
                                             const float* out, const float* lse, const float* dout,
                                             float* dqkv, void* workspace, int64_t workspace_bytes,
                                             cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_ATTENTION_H_
