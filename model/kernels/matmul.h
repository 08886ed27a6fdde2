// The affine map of Hugging Face's Conv1D (GPT-2's c_attn, c_proj, c_fc, mlp.c_proj):
//   y[N, out] = x[N, in] W[in, out] + b[out]
// Note the layout: W is stored [in, out] (transposed relative to torch.nn.Linear), exactly as in
// GPT-2 checkpoints, so the forward is a plain GEMM without transposes.
//
// Backward, from dy[N, out]:
//   dx[N, in]  += dy W^T        (GEMM, B transposed)
//   dW[in, out] += x^T dy       (GEMM, A transposed)
//   db[out]    += sum over rows of dy
// The GEMMs run in OpenBLAS (cblas_sgemm / cblas_dgemm); db is summed in this file, parallel over
// column slices with the rows in order, so it is deterministic.
//
// Threading and determinism: each GEMM is a grid of single-threaded OpenBLAS calls fixed by the
// shape, run on `pool` (internal/blas.h), so results are bit-identical for any pool size.
//
// MatmulForward/MatmulBackward: f32 and f64, no workspace; f16 weights are converted to an f32
// workspace by the caller (the conversion buffer counts as non-model data). Gradients accumulate
// (+=). All dimensions must fit OpenBLAS's 32-bit integers.
//
// The bf16 variants (MatmulForwardBf16/MatmulBackwardBf16) multiply in bf16 with f32
// accumulation (internal/bf16_gemm.h: oneDNN on AVX512-BF16, else f32 sgemm on the same bf16
// values), PyTorch CPU autocast's treatment of a Linear layer:
//   - W is read as bf16 in place (the param chunk's own values; nothing is converted);
//   - the GEMM's activation operands are rounded to bf16 (round-to-nearest-even) into the
//     workspace: x in the forward; dy and x (transposed, so every GEMM operand is plain) in the
//     backward;
//   - products are exact and summed in f32; y, dx, dw are f32 (dw is rounded to bf16 only when
//     the caller writes it into the param slot); b and db stay f32 (db sums the unrounded dy).
// So each output carries the rounding of its K bf16 inputs on both sides (relative 2^-8 each,
// bf16's unit roundoff) plus f32 summation. Threading: the GEMM blocks run on `pool`, a grid fixed
// by the shape, so results do not depend on the thread count.
#ifndef PATRICKSTAR_MODEL_KERNELS_MATMUL_H_
#define PATRICKSTAR_MODEL_KERNELS_MATMUL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct MatmulShape {
  int64_t rows = 0;          // N = B*T
  int64_t in_features = 0;   // Conv1D nx
  int64_t out_features = 0;  // Conv1D nf
};

// Workspace Matmul needs: none.
inline int64_t MatmulWorkspaceBytes(const MatmulShape&) { return 0; }

// y = x W + b. x [N,in], w [in,out], b [out], y [N,out] (overwritten). `pool` (may be null) runs
// the bias broadcast.
template <typename T>
[[nodiscard]] absl::Status MatmulForward(const MatmulShape& shape, absl::Span<const T> x,
                                         absl::Span<const T> w, absl::Span<const T> b,
                                         absl::Span<T> y, ThreadPool* pool);

// dx += dy W^T, dw += x^T dy, db += column sums of dy. An empty dw or db skips that gradient
// (input gradient only, for a frozen projection); dx is the same bits.
template <typename T>
[[nodiscard]] absl::Status MatmulBackward(const MatmulShape& shape, absl::Span<const T> x,
                                          absl::Span<const T> w, absl::Span<const T> dy,
                                          absl::Span<T> dx, absl::Span<T> dw, absl::Span<T> db,
                                          ThreadPool* pool);

// Workspace of the bf16 variants in f32 elements (it holds the bf16 copies of the activations):
// forward N*in bf16 values, backward N*out + N*in.
int64_t MatmulBf16ForwardWorkspaceElems(const MatmulShape& shape);
int64_t MatmulBf16BackwardWorkspaceElems(const MatmulShape& shape);

// y = bf16(x) W + b, w [in, out] bf16 bit patterns. Errors as MatmulForward, plus InvalidArgument
// for a workspace smaller than MatmulBf16ForwardWorkspaceElems and the errors of GemmBf16
// (FailedPrecondition for --bf16_gemm=onednn without AVX512-BF16).
[[nodiscard]] absl::Status MatmulForwardBf16(const MatmulShape& shape, absl::Span<const float> x,
                                             absl::Span<const uint16_t> w,
                                             absl::Span<const float> b, absl::Span<float> y,
                                             absl::Span<float> workspace, ThreadPool* pool);

// dx += bf16(dy) W^T, dw += bf16(x)^T bf16(dy), db += column sums of dy (f32). An empty dw or db
// skips that gradient (and x's rounding); dx is the same bits.
[[nodiscard]] absl::Status MatmulBackwardBf16(const MatmulShape& shape, absl::Span<const float> x,
                                              absl::Span<const uint16_t> w,
                                              absl::Span<const float> dy, absl::Span<float> dx,
                                              absl::Span<float> dw, absl::Span<float> db,
                                              absl::Span<float> workspace, ThreadPool* pool);

#define PS_MATMUL_EXTERN_(T)                                                              \
  extern template absl::Status MatmulForward<T>(const MatmulShape&, absl::Span<const T>,  \
                                                absl::Span<const T>, absl::Span<const T>, \
                                                absl::Span<T>, ThreadPool*);              \
  extern template absl::Status MatmulBackward<T>(                                         \
      const MatmulShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_MATMUL_EXTERN_(float);
PS_MATMUL_EXTERN_(double);
#undef PS_MATMUL_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_MATMUL_H_
