#include "model/kernels/internal/blas.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps::kernels_internal {
namespace {

// OpenBLAS's thread count is process-wide: set to 1 once, before the first call of any Gemm.
void PinOpenBlasToOneThread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

CBLAS_TRANSPOSE Op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void Call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, Op(ta), Op(tb), static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void Call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, Op(ta), Op(tb), static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

int64_t BlockExtent(int64_t extent) {
  constexpr int64_t kMin = 64, kMax = 256, kMultiple = 16;
  const int64_t quarter = (extent + 3) / 4;
  return std::clamp((quarter + kMultiple - 1) / kMultiple * kMultiple, kMin, kMax);
}

template <typename T>
void GridGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool) {
  PinOpenBlasToOneThread();
  const GemmBlocks blocks = GemmBlocksFor(m, n);
  const int64_t m_blocks = NumTasks(m, blocks.rows), n_blocks = NumTasks(n, blocks.cols);
  ParallelFor(pool, m_blocks * n_blocks, [&](int64_t task) {
    const int64_t m0 = (task / n_blocks) * blocks.rows, n0 = (task % n_blocks) * blocks.cols;
    const int64_t bm = std::min(blocks.rows, m - m0), bn = std::min(blocks.cols, n - n0);
    // op(A)'s rows m0.. : A's rows (plain) or columns (transposed); op(B)'s columns n0.. likewise.
    const T* a0 = ta ? a + m0 : a + m0 * lda;
    const T* b0 = tb ? b + n0 * ldb : b + n0;
    Call(ta, tb, bm, bn, k, alpha, a0, lda, b0, ldb, beta, c + m0 * ldc + n0, ldc);
  });
}

}  // namespace

GemmBlocks GemmBlocksFor(int64_t m, int64_t n) {
  const int64_t cols = BlockExtent(n);
  // A skinny product (a LoRA step's 128 tokens against a 4096-wide weight): its row blocks would
  // each pack the whole of op(B) again for a sliver of rows. One row block, when the columns alone
  // give the pool enough blocks.
  constexpr int64_t kSkinnyRows = 256, kSkinnyMinColumnBlocks = 8;
  if (m <= kSkinnyRows && NumTasks(n, cols) >= kSkinnyMinColumnBlocks) {
    return {std::max<int64_t>(m, 64), cols};
  }
  return {BlockExtent(m), cols};
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          ThreadPool* pool) {
  GridGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pool);
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc, ThreadPool* pool) {
  GridGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pool);
}

void GemmSingleCall(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) {
  PinOpenBlasToOneThread();
  Call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int OpenBlasThreads() { return openblas_get_num_threads(); }

std::string OpenBlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? std::string("unknown") : std::string(name);
}

}  // namespace ps::kernels_internal
