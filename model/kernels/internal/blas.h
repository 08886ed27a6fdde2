// Row-major GEMM over OpenBLAS for float and double, so templated kernels call one name:
//   C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C[m,n]
// with op(X) = X or X^T and leading dimensions lda, ldb, ldc (elements between rows).
//
// Threading: OpenBLAS runs its own worker threads inside each call (see SetBlasThreads in
// model/kernels/matmul.h). Kernels call these only from the calling thread, never from inside a
// ThreadPool task.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_BLAS_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_BLAS_H_

#include <cblas.h>

#include <cstdint>

namespace ps::kernels_internal {

inline void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

inline void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_BLAS_H_
