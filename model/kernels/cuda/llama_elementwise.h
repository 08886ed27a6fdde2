// The element-wise Llama-family kernels on the GPU, f32: RoPE, SwiGLU and the token embedding,
// forward and backward. Same math, layouts and contracts as the CPU kernels
// (model/kernels/{rope,swiglu,embedding}.h); the arithmetic is the very rope_math.h and
// swiglu_math.h the CPU kernels call.
//
// RoPE reads the cos/sin tables [P, D/2] from device memory: compute them once on the host with
// ps::RopeTables<float> (model/kernels/rope.h) and copy them to the device.
//
// Pointers are device pointers; every function validates the shape and the pointers, enqueues on
// `stream` and returns the launch status. Nothing allocates or synchronizes; buffers must stay
// valid until the work ran. Needs no workspace.
//
// Tokens live in device memory, so they are not range-checked on the host (that would need a copy
// and a synchronization); the kernels check them and never read out of bounds: a row whose token
// is outside [0, V) comes out as NaN in the forward, and adds nothing to dwte in the backward.
//
// Determinism: every output element is computed by one thread in a fixed order; the embedding
// backward adds rows in increasing order, as the CPU kernel, and matches it bit for bit. RoPE and
// SwiGLU differ from the CPU by fused multiply-adds and the exp implementation.
//
// Thread safety: as for any kernel launch; the functions have no state.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_LLAMA_ELEMENTWISE_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_LLAMA_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/embedding.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu_math.h"

namespace ps::cuda {

// x [B,T,H,D] <- RoPE(x) in place; cos, sin [table_positions, D/2]. positions (device, [B*T],
// null: row (b, t) has position t) as in model/kernels/rope.h; a row whose position is outside
// [0, table_positions) comes out as NaN (device data is not checked on the host).
[[nodiscard]] absl::Status RopeForward(const RopeShape& shape, const float* cos, const float* sin,
                                       float* x, cudaStream_t stream,
                                       const int32_t* positions = nullptr);
// dx [B,T,H,D] <- RoPE^T(dx) in place (see model/kernels/rope.h: a transform, not a +=).
[[nodiscard]] absl::Status RopeBackward(const RopeShape& shape, const float* cos, const float* sin,
                                        float* dx, cudaStream_t stream,
                                        const int32_t* positions = nullptr);

// h = silu(g) * u over n elements (act kGeluTanh: gelu_tanh(g) * u); h may equal g or u.
[[nodiscard]] absl::Status SwiGluForward(int64_t n, const float* g, const float* u, float* h,
                                         cudaStream_t stream,
                                         GateActivation act = GateActivation::kSilu);
// dg += dh * u * silu'(g), du += dh * silu(g) (act kGeluTanh: gelu_tanh). dg and du must not
// overlap.
[[nodiscard]] absl::Status SwiGluBackward(int64_t n, const float* g, const float* u,
                                          const float* dh, float* dg, float* du,
                                          cudaStream_t stream,
                                          GateActivation act = GateActivation::kSilu);

// out[N,C] = wte[tokens]. tokens [N] int32 (device), wte [V,C].
[[nodiscard]] absl::Status EmbeddingForward(const EmbeddingShape& shape, const int32_t* tokens,
                                            const float* wte, float* out, cudaStream_t stream);
// dwte += scatter(dout by token), skipping padding_idx.
[[nodiscard]] absl::Status EmbeddingBackward(const EmbeddingShape& shape, const int32_t* tokens,
                                             const float* dout, float* dwte, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_LLAMA_ELEMENTWISE_H_
