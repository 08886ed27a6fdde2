// The SwiGLU gate of Llama/Qwen2/Mistral MLPs (hidden_act "silu"), between the gate/up projections
// and the down projection:
//   mlp(x) = down_proj(silu(gate_proj(x)) * up_proj(x))
//   h = silu(g) * u,   silu(g) = g * sigmoid(g)
// Backward, with s = sigmoid(g):
//   dg += dh * u * s * (1 + g * (1 - s)),   du += dh * silu(g)
// The three projections are model/kernels/linear.h GEMMs; this kernel is the element-wise part.
// Its option `act` (GateActivation, swiglu_math.h) makes it Gemma's GeGLU instead: h = gelu(g) * u
// with the tanh GELU of gelu_math.h (kSilu, the default, is the SwiGLU above bit for bit).
// The scalar math is model/kernels/swiglu_math.h (shared with the CUDA kernel); f32 runs the
// Highway loop of internal/llama_simd.h (the same formulas lane-wise, Highway's exp within 1 ulp
// of libm's, fused multiply-adds); f64 is scalar.
//
// Layout: g (gate_proj output), u (up_proj output), h, dh, dg, du are [N, I] (N = B*T rows,
// I = intermediate_size), any contiguous layout as long as all agree — the kernel is element-wise.
// h may alias g or u (the backward then needs g and u kept elsewhere). Element-wise; parallel over
// fixed blocks. Gradients accumulate (+=). Needs no workspace. f32 and f64 only (conversion from
// f16/bf16 storage is the caller's, as for GPT-2).
#ifndef PATRICKSTAR_MODEL_KERNELS_SWIGLU_H_
#define PATRICKSTAR_MODEL_KERNELS_SWIGLU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "model/kernels/swiglu_math.h"

namespace ps {

// Workspace SwiGLU needs: none.
inline int64_t SwiGluWorkspaceBytes(int64_t /*num_elems*/) { return 0; }

// h = silu(g) * u. g, u and h have the same positive size.
template <typename T>
[[nodiscard]] absl::Status SwiGluForward(absl::Span<const T> g, absl::Span<const T> u,
                                         absl::Span<T> h, ThreadPool* pool,
                                         GateActivation act = GateActivation::kSilu);

// dg += dh * u * silu'(g), du += dh * silu(g). All buffers have the same size; dg and du must not
// overlap each other or the inputs.
template <typename T>
[[nodiscard]] absl::Status SwiGluBackward(absl::Span<const T> g, absl::Span<const T> u,
                                          absl::Span<const T> dh, absl::Span<T> dg,
                                          absl::Span<T> du, ThreadPool* pool,
                                          GateActivation act = GateActivation::kSilu);

#define PS_SWIGLU_EXTERN_(T)                                                                 \
  extern template absl::Status SwiGluForward<T>(absl::Span<const T>, absl::Span<const T>,    \
                                                absl::Span<T>, ThreadPool*, GateActivation); \
  extern template absl::Status SwiGluBackward<T>(absl::Span<const T>, absl::Span<const T>,   \
                                                 absl::Span<const T>, absl::Span<T>,         \
                                                 absl::Span<T>, ThreadPool*, GateActivation)
PS_SWIGLU_EXTERN_(float);
PS_SWIGLU_EXTERN_(double);
#undef PS_SWIGLU_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_SWIGLU_H_
