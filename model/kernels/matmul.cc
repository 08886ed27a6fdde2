#include "model/kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"
#include "base/thread_pool.h"

namespace ps {
namespace {

using kernels_internal::CheckBlasDim;
using kernels_internal::CheckElems;
using kernels_internal::Gemm;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::RowsPerTask;

constexpr int64_t kColumnsPerTask = 64;

absl::Status CheckShape(const char* kernel, const MatmulShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return absl::OkStatus();
}

}  // namespace

void SetBlasThreads(int num_threads) {
  CHECK_GE(num_threads, 1) << "OpenBLAS needs at least one thread";
  openblas_set_num_threads(num_threads);
}

int BlasThreads() { return openblas_get_num_threads(); }

template <typename T>
absl::Status MatmulForward(const MatmulShape& shape, absl::Span<const T> x, absl::Span<const T> w,
                           absl::Span<const T> b, absl::Span<T> y, ThreadPool* pool) {
  constexpr char kKernel[] = "MatmulForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, I * O, "in_features*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, O, "out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, N * O, "rows*out_features"));
  // y = b broadcast over rows, then y += x W.
  const int64_t grain = RowsPerTask(O);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) std::copy(b.begin(), b.end(), y.data() + r * O);
  });
  Gemm(false, false, N, O, I, T{1}, x.data(), I, w.data(), O, T{1}, y.data(), O);
  return absl::OkStatus();
}

template <typename T>
absl::Status MatmulBackward(const MatmulShape& shape, absl::Span<const T> x, absl::Span<const T> w,
                            absl::Span<const T> dy, absl::Span<T> dx, absl::Span<T> dw,
                            absl::Span<T> db, ThreadPool* pool) {
  constexpr char kKernel[] = "MatmulBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, I * O, "in_features*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, N * O, "rows*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dw", dw, I * O, "in_features*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "db", db, O, "out_features"));
  // dx[N,I] += dy[N,O] W[I,O]^T
  Gemm(false, true, N, I, O, T{1}, dy.data(), O, w.data(), O, T{1}, dx.data(), I);
  // dW[I,O] += x[N,I]^T dy[N,O]
  Gemm(true, false, I, O, N, T{1}, x.data(), I, dy.data(), O, T{1}, dw.data(), O);
  ParallelFor(pool, NumTasks(O, kColumnsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kColumnsPerTask;
    const int64_t c1 = std::min(O, c0 + kColumnsPerTask);
    T acc[kColumnsPerTask] = {};
    for (int64_t r = 0; r < N; ++r) {
      const T* dyr = dy.data() + r * O;
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::simd::AddTo(dyr + c0, acc, c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dyr[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) db[c] += acc[c - c0];
  });
  return absl::OkStatus();
}

#define PS_MATMUL_INSTANTIATE_(T)                                                                  \
  template absl::Status MatmulForward<T>(const MatmulShape&, absl::Span<const T>,                  \
                                         absl::Span<const T>, absl::Span<const T>, absl::Span<T>,  \
                                         ThreadPool*);                                             \
  template absl::Status MatmulBackward<T>(const MatmulShape&, absl::Span<const T>,                 \
                                          absl::Span<const T>, absl::Span<const T>, absl::Span<T>, \
                                          absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_MATMUL_INSTANTIATE_(float);
PS_MATMUL_INSTANTIATE_(double);
#undef PS_MATMUL_INSTANTIATE_

}  // namespace ps
