// nn.Linear over a 4-bit frozen weight (QLoRA's base layers): W [out, in] stored as
// model/kernels/nf4.h's codes + absmax (plain or nested), dequantized tile by tile into a small f32
// workspace inside the GEMM, never as a whole matrix.
//
//   forward:         y[N, out]  = x[N, in] dequant(W)^T (+ b)
//   input gradient:  dx[N, in] += dy[N, out] dequant(W)          (the base is frozen: no dW)
//
// Bit for bit what LinearForward / LinearBackward's dx (linear.h) give on the dequantized f32
// matrix, on every CPU: the GEMM is cut into internal/blas.h's grid (GemmBlocksFor, fixed by the
// shape) and each grid block is the same single-threaded OpenBLAS call over the whole of k, with
// the block's weight columns read from a dequantized tile instead of the full matrix (OpenBLAS
// packs its operands, so where they come from does not change a bit). A tile is one column block of
// the grid: bn rows of W ([bn, in], forward) or bn columns of W ([out, bn], backward), bn <= 256.
//
// Workspace: `slots` tiles of f32 (Quant4LinearWorkspaceElems). The tiles of a wave of `slots`
// column blocks are dequantized in parallel on `pool`, then that wave's grid blocks run in
// parallel; with slots = the pool's thread count both phases keep every thread busy. The result
// does not depend on slots or the pool.
#ifndef PATRICKSTAR_MODEL_KERNELS_NF4_LINEAR_H_
#define PATRICKSTAR_MODEL_KERNELS_NF4_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "model/kernels/linear.h"
#include "model/kernels/nf4.h"

namespace ps {

// f32 elements of one tile (the larger of the forward's and the backward's).
int64_t Quant4LinearTileElems(const LinearShape& shape);
// f32 elements of workspace for `slots` tiles (slots >= 1), forward and backward.
inline int64_t Quant4LinearWorkspaceElems(const LinearShape& shape, int slots) {
  return Quant4LinearTileElems(shape) * slots;
}

// y = x dequant(W)^T + b. x [N, in], w: out*in values, b [out] (empty when !shape.bias), y [N, out]
// (overwritten). workspace: at least one tile; its size sets the slots. InvalidArgument on a bad
// shape, tensor or buffer size.
[[nodiscard]] absl::Status Quant4LinearForward(const LinearShape& shape, absl::Span<const float> x,
                                               const Quant4Tensor& w, absl::Span<const float> b,
                                               absl::Span<float> y, absl::Span<float> workspace,
                                               ThreadPool* pool);

// dx += dy dequant(W). dy [N, out], dx [N, in].
[[nodiscard]] absl::Status Quant4LinearBackwardInput(const LinearShape& shape,
                                                     const Quant4Tensor& w,
                                                     absl::Span<const float> dy,
                                                     absl::Span<float> dx,
                                                     absl::Span<float> workspace, ThreadPool* pool);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_NF4_LINEAR_H_
