#include "model/kernels/residual.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::ParallelForRanges;

constexpr int64_t kElemsPerTask = 16384;

}  // namespace

template <typename T>
absl::Status ResidualForward(absl::Span<const T> a, absl::Span<const T> b, absl::Span<T> out,
                             ThreadPool* pool) {
  constexpr char kKernel[] = "ResidualForward";
  const int64_t n = static_cast<int64_t>(a.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "a size", n));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, n, "size of a"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, n, "size of a"));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::simd::Add(a.data() + begin, b.data() + begin, out.data() + begin,
                                  end - begin);
    } else {
      for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status ResidualBackward(absl::Span<const T> dout, absl::Span<T> da, absl::Span<T> db,
                              ThreadPool* pool) {
  constexpr char kKernel[] = "ResidualBackward";
  const int64_t n = static_cast<int64_t>(dout.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "dout size", n));
  RETURN_IF_ERROR(CheckElems(kKernel, "da", da, n, "size of dout"));
  RETURN_IF_ERROR(CheckElems(kKernel, "db", db, n, "size of dout"));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::simd::AddTo(dout.data() + begin, da.data() + begin, end - begin);
      kernels_internal::simd::AddTo(dout.data() + begin, db.data() + begin, end - begin);
    } else {
      for (int64_t i = begin; i < end; ++i) {
        da[i] += dout[i];
        db[i] += dout[i];
      }
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status ScaleInPlace(T alpha, absl::Span<T> x, ThreadPool* pool) {
  constexpr char kKernel[] = "ScaleInPlace";
  const int64_t n = static_cast<int64_t>(x.size());
  RETURN_IF_ERROR(CheckPositive(kKernel, "x size", n));
  ParallelForRanges(pool, n, kElemsPerTask, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      kernels_internal::simd::Scale(alpha, x.data() + begin, end - begin);
    } else {
      for (int64_t i = begin; i < end; ++i) x[i] *= alpha;
    }
  });
  return absl::OkStatus();
}

#define PS_RESIDUAL_INSTANTIATE_(T)                                                            \
  template absl::Status ResidualForward<T>(absl::Span<const T>, absl::Span<const T>,           \
                                           absl::Span<T>, ThreadPool*);                        \
  template absl::Status ResidualBackward<T>(absl::Span<const T>, absl::Span<T>, absl::Span<T>, \
                                            ThreadPool*);                                      \
  template absl::Status ScaleInPlace<T>(T, absl::Span<T>, ThreadPool*)
PS_RESIDUAL_INSTANTIATE_(float);
PS_RESIDUAL_INSTANTIATE_(double);
#undef PS_RESIDUAL_INSTANTIATE_

}  // namespace ps
