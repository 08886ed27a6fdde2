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
//
// Compute dtype (bitsandbytes' bnb_4bit_compute_dtype): f32 (the default) is the above. bf16 or
// f16 computes what Linear4bit does with that compute dtype (bitsandbytes/autograd/_functions.py,
// MatMul4Bit: F.linear(A.to(dt), dequantize_4bit(W).to(dt), bias.to(dt)) and, backward,
// grad_A = matmul(grad_out.to(dt), dequantize_4bit(W).to(dt))), with every activation kept as an
// f32 buffer holding 16-bit values:
//   - x (dy) rounded to the compute dtype (round-to-nearest-even, memory/convert.h);
//   - each dequantized weight value is its f32 product rounded to nearest even (Dequantize4Bit's
//     bf16/f16 output);
//   - the products (exact in f32) summed in f32 by the same single-threaded sgemm grid as f32
//     (what internal/bf16_gemm.h's fallback computes; the oneDNN backend is not used here, so the
//     bits do not depend on --bf16_gemm or the CPU's bf16 instructions);
//   - forward: y = round(bias rounded + sum), one rounding of the f32 result (torch's bf16 addmm
//     adds the bias to the f32 accumulator); backward: dx += round(sum) (grad_A is a 16-bit
//     tensor; the cast back to the f32 input is exact, and the accumulation into dx is f32).
// The rounded activations need rows * max(in, out) more f32 elements of workspace, before the
// tiles; the backward also keeps one f32 grid block per thread (thread-local, at most 256 x 256
// values, kept for the thread's life). Same bits for any slot count or pool, as for f32.
#ifndef PATRICKSTAR_MODEL_KERNELS_NF4_LINEAR_H_
#define PATRICKSTAR_MODEL_KERNELS_NF4_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "memory/dtype.h"
#include "model/kernels/linear.h"
#include "model/kernels/nf4.h"

namespace ps {

// f32 elements of one tile (the larger of the forward's and the backward's).
int64_t Quant4LinearTileElems(const LinearShape& shape);
// f32 elements of workspace for `slots` tiles (slots >= 1), forward and backward, computing in
// `compute_dtype` (16-bit: plus the rounded activations, rows * max(in, out)).
inline int64_t Quant4LinearWorkspaceElems(const LinearShape& shape, int slots,
                                          DType compute_dtype = DType::kF32) {
  const int64_t activations =
      compute_dtype == DType::kF32
          ? 0
          : shape.rows * (shape.in_features > shape.out_features ? shape.in_features
                                                                  : shape.out_features);
  return activations + Quant4LinearTileElems(shape) * slots;
}

// y = x dequant(W)^T + b. x [N, in], w: out*in values, b [out] (empty when !shape.bias), y [N, out]
// (overwritten). workspace: at least Quant4LinearWorkspaceElems(shape, 1, compute_dtype); its size
// sets the slots. InvalidArgument on a bad shape, tensor, buffer size or compute dtype.
[[nodiscard]] absl::Status Quant4LinearForward(const LinearShape& shape, absl::Span<const float> x,
                                               const Quant4Tensor& w, absl::Span<const float> b,
                                               absl::Span<float> y, absl::Span<float> workspace,
                                               ThreadPool* pool,
                                               DType compute_dtype = DType::kF32);

// dx += dy dequant(W). dy [N, out], dx [N, in].
[[nodiscard]] absl::Status Quant4LinearBackwardInput(const LinearShape& shape,
                                                     const Quant4Tensor& w,
                                                     absl::Span<const float> dy,
                                                     absl::Span<float> dx,
                                                     absl::Span<float> workspace, ThreadPool* pool,
                                                     DType compute_dtype = DType::kF32);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_NF4_LINEAR_H_
