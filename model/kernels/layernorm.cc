#include "model/kernels/layernorm.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"
#include "model/kernels/layernorm_math.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::RowsPerTask;

constexpr int64_t kChannelsPerTask = 32;

absl::Status CheckShape(const char* kernel, const LayerNormShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  if (!(s.eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": eps must be positive, got ", s.eps));
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status LayerNormForward(const LayerNormShape& shape, absl::Span<const T> x,
                              absl::Span<const T> w, absl::Span<const T> b, absl::Span<T> y,
                              absl::Span<T> mean, absl::Span<T> rstd, ThreadPool* pool) {
  constexpr char kKernel[] = "LayerNormForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, C, "C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, C, "C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "mean", mean, N, "N"));
  RETURN_IF_ERROR(CheckElems(kKernel, "rstd", rstd, N, "N"));
  const T eps = static_cast<T>(shape.eps);
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) {
      const T* xr = x.data() + r * C;
      T* yr = y.data() + r * C;
      if constexpr (std::is_same_v<T, float>) {
        namespace simd = kernels_internal::simd;
        const T m = LayerNormMean(simd::Sum(xr, C), C);
        const T s = LayerNormRstd(simd::SumSquaredDeviation(xr, m, C), C, eps);
        simd::LayerNormOutputRow(xr, m, s, w.data(), b.data(), yr, C);
        mean[r] = m;
        rstd[r] = s;
        continue;
      }
      T sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const T m = LayerNormMean(sum, C);
      T sq = 0;  // Two passes: no cancellation when |mean| >> std.
      for (int64_t c = 0; c < C; ++c) sq += (xr[c] - m) * (xr[c] - m);
      const T s = LayerNormRstd(sq, C, eps);
      for (int64_t c = 0; c < C; ++c) yr[c] = LayerNormOutput(xr[c], m, s, w[c], b[c]);
      mean[r] = m;
      rstd[r] = s;
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status LayerNormBackward(const LayerNormShape& shape, absl::Span<const T> x,
                               absl::Span<const T> w, absl::Span<const T> mean,
                               absl::Span<const T> rstd, absl::Span<const T> dy, absl::Span<T> dx,
                               absl::Span<T> dw, absl::Span<T> db, ThreadPool* pool) {
  constexpr char kKernel[] = "LayerNormBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, C, "C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "mean", mean, N, "N"));
  RETURN_IF_ERROR(CheckElems(kKernel, "rstd", rstd, N, "N"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, N * C, "N*C"));
  if (!dw.empty()) RETURN_IF_ERROR(CheckElems(kKernel, "dw", dw, C, "C"));
  if (!db.empty()) RETURN_IF_ERROR(CheckElems(kKernel, "db", db, C, "C"));
  // Pass 1: dx, row-parallel.
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) {
      const T* xr = x.data() + r * C;
      const T* dyr = dy.data() + r * C;
      T* dxr = dx.data() + r * C;
      const T m = mean[r], s = rstd[r];
      if constexpr (std::is_same_v<T, float>) {
        namespace simd = kernels_internal::simd;
        float g_sum = 0, g_xhat_sum = 0;
        simd::LayerNormGradSumsRow(dyr, w.data(), xr, m, s, C, &g_sum, &g_xhat_sum);
        simd::LayerNormInputGradRow(dyr, w.data(), xr, m, s, LayerNormMean(g_sum, C),
                                    LayerNormMean(g_xhat_sum, C), dxr, C);
        continue;
      }
      T g_sum = 0, g_xhat_sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const LayerNormGradTerms<T> terms = LayerNormBackwardTerms(dyr[c], w[c], xr[c], m, s);
        g_sum += terms.g;
        g_xhat_sum += terms.g_xhat;
      }
      const T g_mean = LayerNormMean(g_sum, C);
      const T g_xhat_mean = LayerNormMean(g_xhat_sum, C);
      for (int64_t c = 0; c < C; ++c) {
        dxr[c] += LayerNormInputGrad(dyr[c], w[c], xr[c], m, s, g_mean, g_xhat_mean);
      }
    }
  });
  // Pass 2: dw and db, parallel over channel slices, rows summed in order.
  if (dw.empty() && db.empty()) return absl::OkStatus();
  ParallelFor(pool, NumTasks(C, kChannelsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kChannelsPerTask;
    const int64_t c1 = std::min(C, c0 + kChannelsPerTask);
    T dw_acc[kChannelsPerTask] = {};
    T db_acc[kChannelsPerTask] = {};
    for (int64_t r = 0; r < N; ++r) {
      const T* xr = x.data() + r * C;
      const T* dyr = dy.data() + r * C;
      const T m = mean[r], s = rstd[r];
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::simd::LayerNormParamGradRow(dyr + c0, xr + c0, m, s, dw_acc, db_acc,
                                                      c1 - c0);
        continue;
      }
      for (int64_t c = c0; c < c1; ++c) {
        dw_acc[c - c0] += LayerNormWeightGradTerm(dyr[c], xr[c], m, s);
        db_acc[c - c0] += dyr[c];
      }
    }
    if (!dw.empty()) {
      for (int64_t c = c0; c < c1; ++c) dw[c] += dw_acc[c - c0];
    }
    if (!db.empty()) {
      for (int64_t c = c0; c < c1; ++c) db[c] += db_acc[c - c0];
    }
  });
  return absl::OkStatus();
}

#define PS_LAYERNORM_INSTANTIATE_(T)                                                         \
  template absl::Status LayerNormForward<T>(                                                 \
      const LayerNormShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*);                             \
  template absl::Status LayerNormBackward<T>(                                                \
      const LayerNormShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,  \
      absl::Span<const T>, absl::Span<const T>, absl::Span<T>, absl::Span<T>, absl::Span<T>, \
      ThreadPool*)
PS_LAYERNORM_INSTANTIATE_(float);
PS_LAYERNORM_INSTANTIATE_(double);
#undef PS_LAYERNORM_INSTANTIATE_

}  // namespace ps
