#include "model/kernels/linear.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"

namespace ps {
namespace {

using kernels_internal::CheckBlasDim;
using kernels_internal::CheckElems;
using kernels_internal::Gemm;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::RowsPerTask;

constexpr int64_t kColumnsPerTask = 64;

absl::Status CheckShape(const char* kernel, const LinearShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status LinearForward(const LinearShape& shape, absl::Span<const T> x, absl::Span<const T> w,
                           absl::Span<const T> b, absl::Span<T> y, ThreadPool* pool) {
  constexpr char kKernel[] = "LinearForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, O * I, "out_features*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, shape.bias ? O : 0,
                             shape.bias ? "out_features" : "0: the shape has no bias"));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, N * O, "rows*out_features"));
  T beta = T{0};
  if (shape.bias) {  // y = b broadcast over rows, then y += x W^T.
    const int64_t grain = RowsPerTask(O);
    ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
      const int64_t end = std::min(N, (task + 1) * grain);
      for (int64_t r = task * grain; r < end; ++r) std::copy(b.begin(), b.end(), y.data() + r * O);
    });
    beta = T{1};
  }
  Gemm(false, true, N, O, I, T{1}, x.data(), I, w.data(), I, beta, y.data(), O, pool);
  return absl::OkStatus();
}

template <typename T>
absl::Status LinearBackward(const LinearShape& shape, absl::Span<const T> x, absl::Span<const T> w,
                            absl::Span<const T> dy, absl::Span<T> dx, absl::Span<T> dw,
                            absl::Span<T> db, ThreadPool* pool) {
  constexpr char kKernel[] = "LinearBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, O * I, "out_features*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, N * O, "rows*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, N * I, "rows*in_features"));
  if (!dw.empty()) {
    RETURN_IF_ERROR(CheckElems(kKernel, "dw", dw, O * I, "out_features*in_features"));
  }
  if (!db.empty()) {
    RETURN_IF_ERROR(CheckElems(kKernel, "db", db, shape.bias ? O : 0,
                               shape.bias ? "out_features" : "0: the shape has no bias"));
  }
  // dx[N,I] += dy[N,O] W[O,I]
  Gemm(false, false, N, I, O, T{1}, dy.data(), O, w.data(), I, T{1}, dx.data(), I, pool);
  // dW[O,I] += dy[N,O]^T x[N,I]
  if (!dw.empty()) {
    Gemm(true, false, O, I, N, T{1}, dy.data(), O, x.data(), I, T{1}, dw.data(), I, pool);
  }
  if (!shape.bias || db.empty()) return absl::OkStatus();
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

#define PS_LINEAR_INSTANTIATE_(T)                                                                  \
  template absl::Status LinearForward<T>(const LinearShape&, absl::Span<const T>,                  \
                                         absl::Span<const T>, absl::Span<const T>, absl::Span<T>,  \
                                         ThreadPool*);                                             \
  template absl::Status LinearBackward<T>(const LinearShape&, absl::Span<const T>,                 \
                                          absl::Span<const T>, absl::Span<const T>, absl::Span<T>, \
                                          absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_LINEAR_INSTANTIATE_(float);
PS_LINEAR_INSTANTIATE_(double);
#undef PS_LINEAR_INSTANTIATE_

}  // namespace ps
