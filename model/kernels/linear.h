// torch.nn.Linear: y[N, out] = x[N, in] W^T + b, with W stored [out, in] — the layout of every
// projection in Llama/Qwen2/Mistral checkpoints (q_proj, k_proj, v_proj, o_proj, gate_proj,
// up_proj, down_proj, lm_head). GPT-2's Conv1D stores W [in, out] instead and is
// model/kernels/matmul.h; the two differ only in which GEMM operand is transposed.
//
// The bias is optional (LinearShape::bias): Llama has none, Qwen2 has q/k/v biases.
//
// Backward, from dy[N, out]:
//   dx[N, in]   += dy W                  (GEMM, no transposes)
//   dW[out, in] += dy^T x                (GEMM, A transposed)
//   db[out]     += sum over rows of dy   (when there is a bias)
// The GEMMs run in OpenBLAS (cblas_sgemm / cblas_dgemm) as a grid fixed by the shape on `pool`
// (internal/blas.h); db is summed in this file, parallel over column slices with the rows in
// order. Results do not depend on the pool's size.
//
// f32 and f64 only: low-precision weights are converted to an f32 workspace by the caller, as for
// GPT-2. Gradients accumulate (+=). Needs no workspace. All dimensions must fit OpenBLAS's 32-bit
// integers.
#ifndef PATRICKSTAR_MODEL_KERNELS_LINEAR_H_
#define PATRICKSTAR_MODEL_KERNELS_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct LinearShape {
  int64_t rows = 0;          // N = B*T
  int64_t in_features = 0;   // nn.Linear in_features
  int64_t out_features = 0;  // nn.Linear out_features
  bool bias = false;         // whether b / db are used (they must then hold out_features values)
};

// Workspace Linear needs: none.
inline int64_t LinearWorkspaceBytes(const LinearShape&) { return 0; }

// y = x W^T + b. x [N,in], w [out,in], b [out] (empty when !shape.bias), y [N,out] (overwritten).
// `pool` (may be null) runs the bias broadcast. InvalidArgument on a bad shape or buffer size.
template <typename T>
[[nodiscard]] absl::Status LinearForward(const LinearShape& shape, absl::Span<const T> x,
                                         absl::Span<const T> w, absl::Span<const T> b,
                                         absl::Span<T> y, ThreadPool* pool);

// dx += dy W, dw += dy^T x, db += column sums of dy (db empty when !shape.bias). An empty dw or
// db skips that gradient (input gradient only, for a frozen projection); dx is the same bits.
template <typename T>
[[nodiscard]] absl::Status LinearBackward(const LinearShape& shape, absl::Span<const T> x,
                                          absl::Span<const T> w, absl::Span<const T> dy,
                                          absl::Span<T> dx, absl::Span<T> dw, absl::Span<T> db,
                                          ThreadPool* pool);

#define PS_LINEAR_EXTERN_(T)                                                              \
  extern template absl::Status LinearForward<T>(const LinearShape&, absl::Span<const T>,  \
                                                absl::Span<const T>, absl::Span<const T>, \
                                                absl::Span<T>, ThreadPool*);              \
  extern template absl::Status LinearBackward<T>(                                         \
      const LinearShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_LINEAR_EXTERN_(float);
PS_LINEAR_EXTERN_(double);
#undef PS_LINEAR_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_LINEAR_H_
