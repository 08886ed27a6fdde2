// GemmShape: the shape of Kernels::Gemm (model/kernels/kernels.h), on its own so that the
// workspace queries (kernel_workspaces.h) can name it without the kernel interface.
#ifndef PATRICKSTAR_MODEL_KERNELS_GEMM_SHAPE_H_
#define PATRICKSTAR_MODEL_KERNELS_GEMM_SHAPE_H_

#include <cstdint>

#include "memory/dtype.h"

namespace ps {

// A row-major GEMM with f32 accumulation and an f32 output (cuBLAS's and internal/blas.h's
// conventions):
//   C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C[m,n],  op(X) = X or X^T
// A and B are both of `ab_dtype` (f32, f16 or bf16); lda, ldb, ldc are the elements between rows
// of the matrices as stored (A is [m,k] or, transposed, [k,m]). With beta == 0, C is not read.
struct GemmShape {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;  // each in [1, 2^31)
  int64_t lda = 0, ldb = 0, ldc = 0;
  DType ab_dtype = DType::kF32;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_GEMM_SHAPE_H_
