// Rotary position embeddings (RoPE) of Llama, Qwen2 and Mistral, exactly Hugging Face's
// LlamaRotaryEmbedding + apply_rotary_pos_emb: each head of q and k is rotated pairwise by
// position-dependent angles before the attention scores are taken. The math (the half-split
// pairing (i, i + D/2), the frequencies and the "llama3" scaling) is model/kernels/rope_math.h.
//
// Use:
//   1. ValidateRopeConfig(config)  — once, when the model config is read;
//   2. RopeTables(config, P, cos, sin) — the caller allocates cos and sin [P, D/2] (P >= the
//      longest sequence) and computes them once; they depend only on the config. For the GPU the
//      caller copies the f32 tables to device memory (the CUDA kernel reads them).
//   3. RopeForward on q and on k after their projections, RopeBackward on dq and dk after the
//      attention backward.
//
// Partial rotary (RopeShape::rotary_dim R < D): the tables are [P, R/2] (RopeConfig::head_dim =
// R) and only channels [0, R) of each head are rotated, exactly transformers' Phi-3
// apply_rotary_pos_emb (q_rot = q[..., :R] rotated with the half-split pairing, q[..., R:] kept).
//
// Layout: x [B, T, H, D] row-major — the output of q_proj (H = num_attention_heads) or k_proj
// (H = num_key_value_heads) viewed per head, as Hugging Face's view(B, T, H, D); position of row
// (b, t) is t (position_ids 0 .. T-1 for every sequence) unless the caller passes per-token
// `positions` [B*T] (packed rows restart at 0 at each document, as Hugging Face's position_ids of
// a packed batch do); the tables need max position + 1 rows. cos, sin [P, D/2]: row p holds
// cos/sin(p * inv_freq_i) for i < D/2 (Hugging Face's tables repeat these for the second half).
//
// Both passes work in place: the forward replaces x by its rotation (q and k are needed only
// rotated later on: the rotation is linear, so its backward needs no saved input), the backward
// replaces the gradient w.r.t. the rotated values by the gradient w.r.t. the unrotated ones
// (the inverse rotation). Note this is a transform, not an accumulation: dx must hold exactly the
// gradient w.r.t. the rotated tensor when RopeBackward runs.
//
// f32 runs the Highway loop of internal/llama_simd.h, f64 is scalar. Parallel over fixed blocks of
// rows; results do not depend on the thread count. Needs no workspace. f32 and f64 only.
#ifndef PATRICKSTAR_MODEL_KERNELS_ROPE_H_
#define PATRICKSTAR_MODEL_KERNELS_ROPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "model/kernels/rope_math.h"

namespace ps {

// The rotary-embedding part of a Hugging Face config.json.
struct RopeConfig {
  int64_t head_dim = 0;    // dimensions rotated per head: the whole head (head_dim); must be even
  double theta = 10000.0;  // rope_theta
  // rope_scaling's "rope_type" (legacy key "type"): "" (no rope_scaling, or null) or "default" for
  // none, "llama3" for Llama 3.1+'s scaling. Anything else is refused.
  std::string scaling_type;
  RopeLlama3Params llama3;  // used when scaling_type == "llama3"
  // scaling_type "longrope" (Phi-3): the factor of each frequency (head_dim / 2 of them: the
  // short or the long factors, as the caller chose for its sequence length), and the attention
  // factor cos and sin are multiplied by (transformers' attention_scaling; 1 leaves them as
  // they are).
  std::vector<double> longrope_factors = {};
  double attention_factor = 1.0;
  // scaling_type "linear" (Gemma 3's global layers): inv_freq / linear_factor (positive).
  double linear_factor = 1.0;
};

// OK if `config` is usable; InvalidArgument naming the config.json key otherwise: head_dim not
// positive and even, rope_theta not positive and finite, a rope_scaling type other than
// "default"/"llama3"/"longrope" (e.g. "linear", "dynamic", "yarn"), longrope factors not
// head_dim / 2 positive finite numbers or a non-positive attention factor, or llama3 parameters
// out of
// range (factor, low_freq_factor, original_max_position_embeddings positive;
// high_freq_factor > low_freq_factor).
[[nodiscard]] absl::Status ValidateRopeConfig(const RopeConfig& config);

// inv_freq [D/2] (transformers' rotary_emb.inv_freq). For T = float every step rounds to f32 in
// transformers' order (rope_math.h). InvalidArgument for an invalid config or a wrong size.
template <typename T>
[[nodiscard]] absl::Status RopeInverseFrequencies(const RopeConfig& config, absl::Span<T> inv_freq);

// cos, sin [num_positions, D/2]: row p = cos/sin(RopeAngle(p, inv_freq_i)). For T = float the
// angle is the f32 product (as torch's), its cosine and sine are taken in double and rounded once
// (within an ulp of torch's f32 cos/sin). InvalidArgument for an invalid config, num_positions < 1
// or wrong sizes.
template <typename T>
[[nodiscard]] absl::Status RopeTables(const RopeConfig& config, int64_t num_positions,
                                      absl::Span<T> cos, absl::Span<T> sin);

struct RopeShape {
  int64_t batch = 0;            // B
  int64_t seq_len = 0;          // T; REQUIRES: <= table_positions
  int64_t num_heads = 0;        // H of this tensor (query heads or key/value heads)
  int64_t head_dim = 0;         // D; even
  int64_t table_positions = 0;  // P, rows of the cos/sin tables
  // Partial rotary (Phi-3's partial_rotary_factor): only the first rotary_dim channels of each
  // head are rotated (pairs (i, i + rotary_dim/2)), the rest pass through; the tables are then
  // [P, rotary_dim/2]. 0 = head_dim (every channel). Even, <= head_dim.
  int64_t rotary_dim = 0;

  int64_t rotated() const { return rotary_dim == 0 ? head_dim : rotary_dim; }
};

// Workspace RoPE needs: none.
inline int64_t RopeWorkspaceBytes(const RopeShape&) { return 0; }

// x [B,T,H,D] <- RoPE(x), in place. Row (b, t) is rotated by the angles of position
// positions[b*T + t] (transformers' position_ids), or of t when `positions` is empty.
// InvalidArgument on a bad shape or buffer size, or a position outside [0, table_positions)
// (naming the first such (b, t)).
template <typename T>
[[nodiscard]] absl::Status RopeForward(const RopeShape& shape, absl::Span<const T> cos,
                                       absl::Span<const T> sin, absl::Span<T> x, ThreadPool* pool,
                                       absl::Span<const int32_t> positions = {});

// dx [B,T,H,D] <- RoPE^T(dx), in place: from the gradient w.r.t. the rotated tensor to the
// gradient w.r.t. its input. `positions` as in RopeForward (the forward's).
template <typename T>
[[nodiscard]] absl::Status RopeBackward(const RopeShape& shape, absl::Span<const T> cos,
                                        absl::Span<const T> sin, absl::Span<T> dx, ThreadPool* pool,
                                        absl::Span<const int32_t> positions = {});

#define PS_ROPE_EXTERN_(T)                                                                      \
  extern template absl::Status RopeInverseFrequencies<T>(const RopeConfig&, absl::Span<T>);     \
  extern template absl::Status RopeTables<T>(const RopeConfig&, int64_t, absl::Span<T>,         \
                                             absl::Span<T>);                                    \
  extern template absl::Status RopeForward<T>(const RopeShape&, absl::Span<const T>,            \
                                              absl::Span<const T>, absl::Span<T>, ThreadPool*,  \
                                              absl::Span<const int32_t>);                       \
  extern template absl::Status RopeBackward<T>(const RopeShape&, absl::Span<const T>,           \
                                               absl::Span<const T>, absl::Span<T>, ThreadPool*, \
                                               absl::Span<const int32_t>)
PS_ROPE_EXTERN_(float);
PS_ROPE_EXTERN_(double);
#undef PS_ROPE_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_ROPE_H_
