// Row-major GEMM over OpenBLAS for float and double, so templated kernels call one name:
//   C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C[m,n]
// with op(X) = X or X^T and leading dimensions lda, ldb, ldc (elements between rows).
//
// Threading and determinism: C is cut into a grid of blocks (GemmBlocks), fixed by (m, n) alone,
// and each block is one single-threaded OpenBLAS call over the whole of k, run as a task of `pool`
// (may be null: the calling thread runs them all). So the bits of C depend on the shape and the
// CPU's OpenBLAS kernel, never on the thread count. OpenBLAS's own threading cannot promise that:
// on Haswell/Zen kernels (AVX2) a 2-thread sgemm rounds differently from a 1-thread one for every
// GPT-2-shaped product (its edge micro-kernels sum in another order), so the trainer's losses
// changed with `threads` on CPUs without AVX-512. OpenBLAS's thread count is pinned to 1 for the
// process on the first call (the grid is the parallelism; nothing else in this project may raise
// it).
//
// Callers call Gemm from the calling thread, never from inside a task of the same pool.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_BLAS_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_BLAS_H_

#include <cstdint>
#include <string>

#include "base/thread_pool.h"

namespace ps::kernels_internal {

// The grid's block extents for an m x n C: a quarter of each extent rounded up to a multiple of 16,
// at least 64 and at most 256 — so a small product still gives a pool up to 16 blocks, and a large
// one blocks that keep OpenBLAS's packing cheap. A block packs its own rows of op(A) and columns of
// op(B): the repacking the grid adds over one whole call is (m/bm)·n·k + (n/bn)·m·k elements
// against 2·m·n·k flops. Skinny products (m <= 256 rows, at least 8 column blocks: a LoRA step's
// 128 tokens against a 4096-wide weight) get one row block of all m rows, so op(B) is packed once
// (issue #38: 64-row blocks packed each 4096 x 256 column block of the weight twice for 128 rows;
// this changed the bits of such products once, on every CPU kind, and they stay pool-independent).
struct GemmBlocks {
  int64_t rows = 0;
  int64_t cols = 0;
};
GemmBlocks GemmBlocksFor(int64_t m, int64_t n);

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          ThreadPool* pool);

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc, ThreadPool* pool);

// One single-threaded OpenBLAS call for the whole product (no grid): what each block of Gemm
// runs. For tests that check Gemm's blocks, and for benchmarks.
void GemmSingleCall(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc);

// The thread count OpenBLAS runs with (1 once any Gemm ran).
int OpenBlasThreads();

// The kernel family OpenBLAS chose for this CPU, e.g. "Haswell", "Zen", "SkylakeX" (its
// OPENBLAS_CORETYPE override included).
std::string OpenBlasCoreName();

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_BLAS_H_
