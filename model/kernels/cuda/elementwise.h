// The element-wise GPT-2 kernels on the GPU: encoder (token + position
// embedding), GELU and the residual add, forward and backward, f32. Same math,
// layouts and accumulation (+=) contract as the CPU kernels in
// model/kernels/{encoder,gelu,residual}.h; GELU's arithmetic is the very
// gelu_math.h the CPU kernel calls.
//
// Pointers are device pointers; every function validates the shape and the
// pointers, enqueues on `stream` and returns the launch status. Nothing
// allocates or synchronizes; buffers must stay valid until the work ran. Needs
// no workspace.
//
// Tokens live in device memory, so they cannot be range-checked on the host
// without a copy and a synchronization. The kernels check them instead and
// never read out of bounds: a row whose token is outside [0, V) comes out as
// NaN in the forward (loud, not silently wrong), and its gradient is dropped
// from dwte in the backward.
//
// Determinism: every output element is computed by one thread in a fixed order.
// The encoder backward adds rows in increasing order, exactly as the CPU
// kernel, and matches it bit for bit; the residual matches too. GELU differs
// from the CPU by the exp implementations (CUDA's expf vs Highway's) and fused
// multiply-adds.
//
// Thread safety: as for any kernel launch; the functions have no state.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_ELEMENTWISE_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/kernels/encoder.h"

namespace ps::cuda {

// out[B,T,C] = wte[tokens] + wpe[0..T). tokens [B,T] int32, wte [V,C], wpe
// [max_T,C].
[[nodiscard]] absl::Status EncoderForward(const EncoderShape& shape, const int32_t* tokens,
                                          const float* wte, const float* wpe, float* out,
                                          cudaStream_t stream);
// dwte += scatter(dout by token), dwpe[0..T) += sum over batch of dout.
[[nodiscard]] absl::Status EncoderBackward(const EncoderShape& shape, const int32_t* tokens,
                                           const float* dout, float* dwte, float* dwpe,
                                           cudaStream_t stream);

// y = gelu_new(x) over n elements; y may equal x.
[[nodiscard]] absl::Status GeluForward(int64_t n, const float* x, float* y, cudaStream_t stream);
// dx += dy * gelu_new'(x).
[[nodiscard]] absl::Status GeluBackward(int64_t n, const float* x, const float* dy, float* dx,
                                        cudaStream_t stream);

// out = a + b over n elements; out may equal a or b.
[[nodiscard]] absl::Status ResidualForward(int64_t n, const float* a, const float* b, float* out,
                                           cudaStream_t stream);
// da += dout, db += dout. REQUIRES: da and db do not overlap.
[[nodiscard]] absl::Status ResidualBackward(int64_t n, const float* dout, float* da, float* db,
                                            cudaStream_t stream);
// x *= alpha over n elements.
[[nodiscard]] absl::Status ScaleInPlace(int64_t n, float alpha, float* x, cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_ELEMENTWISE_H_
