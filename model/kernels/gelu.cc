#include "model/kernels/gelu.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"
#include "base/thread_pool.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::ParallelForRanges;

constexpr int64_t kElemsPerTask = 8192;

}  // namespace

template <typename T>
absl::Status GeluForward(absl::Span<const T> x, absl::Span<T> y, ThreadPool* pool) {
  constexpr char kKernel[] = "GeluForward";
  const int64_t n = static_cast<int64_t>(x.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "x size", n));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, n, "size of x"));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::simd::GeluForward(x.data() + begin, y.data() + begin, end - begin);
    } else {
      for (int64_t i = begin; i < end; ++i) y[i] = GeluTanh(x[i]);
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluBackward(absl::Span<const T> x, absl::Span<const T> dy, absl::Span<T> dx,
                          ThreadPool* pool) {
  constexpr char kKernel[] = "GeluBackward";
  const int64_t n = static_cast<int64_t>(x.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "x size", n));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, n, "size of x"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, n, "size of x"));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::simd::GeluBackward(x.data() + begin, dy.data() + begin, dx.data() + begin,
                                           end - begin);
    } else {
      for (int64_t i = begin; i < end; ++i) dx[i] += dy[i] * GeluTanhDerivative(x[i]);
    }
  });
  return absl::OkStatus();
}

#define PS_GELU_INSTANTIATE_(T)                                                                  \
  template absl::Status GeluForward<T>(absl::Span<const T>, absl::Span<T>, ThreadPool*);         \
  template absl::Status GeluBackward<T>(absl::Span<const T>, absl::Span<const T>, absl::Span<T>, \
                                        ThreadPool*)
PS_GELU_INSTANTIATE_(float);
PS_GELU_INSTANTIATE_(double);
#undef PS_GELU_INSTANTIATE_

}  // namespace ps
