// Launchers of the Llama-family CUDA kernels of model/kernels/cuda (RMSNorm, RoPE, SwiGLU, token
// embedding, grouped-query attention), one per device kernel or short sequence of kernels. Plain
// C++ without Abseil so that nvcc compiles the .cu files that define them; the public host API
// (model/kernels/cuda/{rmsnorm,llama_elementwise,gqa_attention}.h) validates shapes and pointers,
// calls these and turns the returned cudaError_t (cudaGetLastError after the launch) into a
// Status. The GPT-2 kernels' launchers are internal/launchers.h.
//
// Every launcher enqueues on `stream` and returns; none allocates or synchronizes. Shapes are
// REQUIRED valid (checked by the callers); dimensions are element counts.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_LLAMA_LAUNCHERS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_LLAMA_LAUNCHERS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/swiglu_math.h"

namespace ps::cuda_internal {

// --- RMSNorm (rmsnorm_kernels.cu) ---------------------------------------------------------------

// The gain is weight_offset + w[c] (0: Llama's w; 1: Gemma's 1 + w), summed in f32.
cudaError_t LaunchRmsNormForward(int64_t rows, int64_t channels, float eps, float weight_offset,
                                 const float* x, const float* w, float* y, float* rstd,
                                 cudaStream_t stream);
// dx += ..., dw += ... (dw a deterministic column reduction).
cudaError_t LaunchRmsNormBackward(int64_t rows, int64_t channels, float weight_offset,
                                  const float* x, const float* w, const float* rstd,
                                  const float* dy, float* dx, float* dw, cudaStream_t stream);

// --- Element-wise (llama_elementwise_kernels.cu) -------------------------------------------------

// x [B,T,H,D] rotated in place by the tables cos/sin [P, R/2] (row t for position t): channels
// [0, R) of each head (R = rotary_dim <= D; the rest untouched); the inverse rotation when
// `inverse`.
// positions: null (row (b, t) at position t) or [batch * seq_len] device int32; a position
// outside [0, table_positions) turns its row into NaN.
cudaError_t LaunchRope(int64_t batch, int64_t seq_len, int64_t num_heads, int64_t head_dim,
                       int64_t rotary_dim, int64_t table_positions, const float* cos,
                       const float* sin, const int32_t* positions, float* x, bool inverse,
                       cudaStream_t stream);
// h = GatedActivation(act, g, u) over n elements (h may equal g or u): silu(g) * u, or
// gelu_tanh(g) * u.
cudaError_t LaunchSwiGluForward(int64_t n, const float* g, const float* u, float* h,
                                GateActivation act, cudaStream_t stream);
// dg += GatedActivationBackwardTerms(act, ...).dg, du += ....du.
cudaError_t LaunchSwiGluBackward(int64_t n, const float* g, const float* u, const float* dh,
                                 float* dg, float* du, GateActivation act, cudaStream_t stream);
// out[r,:] = wte[tokens[r],:]; a row whose token is outside [0, V) becomes NaN.
cudaError_t LaunchEmbeddingForward(int64_t rows, int64_t channels, int64_t vocab,
                                   const int32_t* tokens, const float* wte, float* out,
                                   cudaStream_t stream);
// dwte[tokens[r],:] += dout[r,:] (rows in order per element), skipping padding_idx (-1: none)
// and out-of-range tokens.
cudaError_t LaunchEmbeddingBackward(int64_t rows, int64_t channels, int64_t vocab,
                                    int64_t padding_idx, const int32_t* tokens, const float* dout,
                                    float* dwte, cudaStream_t stream);

// --- Grouped-query attention (gqa_attention_kernels.cu) ------------------------------------------

// Largest head dimension the GQA kernels support (registers per lane: kGqaMaxHeadDim / 32; shared
// memory 2 * 32 * D floats = 32 KiB at D = 128, within the 48 KiB a launch gets without opting in).
inline constexpr int64_t kGqaMaxHeadDim = 128;
// Query (or key) rows per block, one warp each, and keys per shared-memory tile.
inline constexpr int kGqaRowsPerBlock = 8;
inline constexpr int kGqaKeyTile = 32;

// q_stride, kv_stride: elements between consecutive tokens' rows of q (dq) and of k, v (dk, dv),
// never 0 here (the caller resolves packed rows); out, dout and lse are packed. window (0: none)
// and key_start (device [batch * seq_len], null: 0) mask the keys as model/kernels/gqa_attention.h
// says.
cudaError_t LaunchGqaAttentionForward(int64_t batch, int64_t seq_len, int64_t num_heads,
                                      int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                                      int64_t kv_stride, int64_t window, const int32_t* key_start,
                                      const float* q, const float* k, const float* v, float* out,
                                      float* lse, cudaStream_t stream);
// row_d: workspace of batch * num_heads * seq_len floats (D_i = dout_i . out_i).
cudaError_t LaunchGqaAttentionBackward(int64_t batch, int64_t seq_len, int64_t num_heads,
                                       int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                                       int64_t kv_stride, int64_t window, const int32_t* key_start,
                                       const float* q, const float* k, const float* v,
                                       const float* out, const float* lse, const float* dout,
                                       float* row_d, float* dq, float* dk, float* dv,
                                       cudaStream_t stream);

}  // namespace ps::cuda_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_LLAMA_LAUNCHERS_H_
