#include "model/kernels/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/llama_simd.h"
#include "model/kernels/internal/simd.h"
#include "model/kernels/rmsnorm_math.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::RowsPerTask;

constexpr int64_t kChannelsPerTask = 32;

absl::Status CheckShape(const char* kernel, const RmsNormShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  if (!(s.eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": eps (rms_norm_eps) must be positive, got ", s.eps));
  }
  if (!std::isfinite(s.weight_offset)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": weight_offset must be finite, got ", s.weight_offset));
  }
  return absl::OkStatus();
}

// The gain weight_offset + w[c] rounded to T (empty when weight_offset is 0: the gain is w).
template <typename T>
std::vector<T> Shifted(const RmsNormShape& shape, absl::Span<const T> w) {
  std::vector<T> out;
  if (shape.weight_offset == 0) return out;
  out.resize(w.size());
  const T offset = static_cast<T>(shape.weight_offset);
  for (size_t c = 0; c < w.size(); ++c) out[c] = offset + w[c];
  return out;
}

}  // namespace

template <typename T>
absl::Status RmsNormForward(const RmsNormShape& shape, absl::Span<const T> x, absl::Span<const T> w,
                            absl::Span<T> y, absl::Span<T> rstd, ThreadPool* pool) {
  constexpr char kKernel[] = "RmsNormForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, C, "C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "rstd", rstd, N, "N"));
  const std::vector<T> shifted = Shifted(shape, w);
  if (!shifted.empty()) w = absl::MakeConstSpan(shifted);
  const T eps = static_cast<T>(shape.eps);
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) {
      const T* xr = x.data() + r * C;
      T* yr = y.data() + r * C;
      if constexpr (std::is_same_v<T, float>) {
        const float s = RmsNormRstd(kernels_internal::simd::Dot(xr, xr, C), C, eps);
        kernels_internal::llama_simd::RmsNormOutputRow(xr, s, w.data(), yr, C);
        rstd[r] = s;
      } else {
        T sq = 0;
        for (int64_t c = 0; c < C; ++c) sq += xr[c] * xr[c];
        const T s = RmsNormRstd(sq, C, eps);
        for (int64_t c = 0; c < C; ++c) yr[c] = RmsNormOutput(xr[c], s, w[c]);
        rstd[r] = s;
      }
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status RmsNormBackward(const RmsNormShape& shape, absl::Span<const T> x,
                             absl::Span<const T> w, absl::Span<const T> rstd,
                             absl::Span<const T> dy, absl::Span<T> dx, absl::Span<T> dw,
                             ThreadPool* pool) {
  constexpr char kKernel[] = "RmsNormBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, C, "C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "rstd", rstd, N, "N"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, N * C, "N*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, N * C, "N*C"));
  if (!dw.empty()) RETURN_IF_ERROR(CheckElems(kKernel, "dw", dw, C, "C"));
  const std::vector<T> shifted = Shifted(shape, w);
  if (!shifted.empty()) w = absl::MakeConstSpan(shifted);
  // Pass 1: dx, row-parallel.
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) {
      const T* xr = x.data() + r * C;
      const T* dyr = dy.data() + r * C;
      T* dxr = dx.data() + r * C;
      const T s = rstd[r];
      if constexpr (std::is_same_v<T, float>) {
        namespace ls = kernels_internal::llama_simd;
        const float g_xhat_mean =
            ls::RmsNormGradSumRow(dyr, w.data(), xr, s, C) / static_cast<float>(C);
        ls::RmsNormInputGradRow(dyr, w.data(), xr, s, g_xhat_mean, dxr, C);
      } else {
        T g_xhat_sum = 0;
        for (int64_t c = 0; c < C; ++c) g_xhat_sum += RmsNormGradTerm(dyr[c], w[c], xr[c], s);
        const T g_xhat_mean = g_xhat_sum / static_cast<T>(C);
        for (int64_t c = 0; c < C; ++c) {
          dxr[c] += RmsNormInputGrad(dyr[c], w[c], xr[c], s, g_xhat_mean);
        }
      }
    }
  });
  // Pass 2: dw, parallel over channel slices, rows summed in order.
  if (dw.empty()) return absl::OkStatus();
  ParallelFor(pool, NumTasks(C, kChannelsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kChannelsPerTask;
    const int64_t c1 = std::min(C, c0 + kChannelsPerTask);
    T dw_acc[kChannelsPerTask] = {};
    for (int64_t r = 0; r < N; ++r) {
      const T* xr = x.data() + r * C;
      const T* dyr = dy.data() + r * C;
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::llama_simd::RmsNormParamGradRow(dyr + c0, xr + c0, rstd[r], dw_acc,
                                                          c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c) {
          dw_acc[c - c0] += RmsNormWeightGradTerm(dyr[c], xr[c], rstd[r]);
        }
      }
    }
    for (int64_t c = c0; c < c1; ++c) dw[c] += dw_acc[c - c0];
  });
  return absl::OkStatus();
}

#define PS_RMSNORM_INSTANTIATE_(T)                                                           \
  template absl::Status RmsNormForward<T>(const RmsNormShape&, absl::Span<const T>,          \
                                          absl::Span<const T>, absl::Span<T>, absl::Span<T>, \
                                          ThreadPool*);                                      \
  template absl::Status RmsNormBackward<T>(                                                  \
      const RmsNormShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const T>,    \
      absl::Span<const T>, absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_RMSNORM_INSTANTIATE_(float);
PS_RMSNORM_INSTANTIATE_(double);
#undef PS_RMSNORM_INSTANTIATE_

}  // namespace ps
