#include "model/kernels/lora.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/dropout_math.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps {
namespace {

using kernels_internal::CheckBlasDim;
using kernels_internal::CheckElems;
using kernels_internal::CheckWorkspace;
using kernels_internal::Gemm;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;

constexpr int64_t kDropoutElemsPerTask = 16384;

absl::Status CheckShape(const char* kernel, const LoraShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return CheckBlasDim(kernel, "rank", s.rank);
}

absl::Status CheckP(const char* kernel, float p) {
  if (p >= 0.0f && p < 1.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": dropout probability p must be in [0, 1), got ", p));
}

}  // namespace

template <typename T>
absl::Status LoraForward(const LoraShape& shape, absl::Span<const T> x, absl::Span<const T> a,
                         absl::Span<const T> b, absl::Span<T> h, absl::Span<T> y,
                         ThreadPool* pool) {
  constexpr char kKernel[] = "LoraForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features, R = shape.rank;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "a", a, R * I, "rank*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, O * R, "out_features*rank"));
  RETURN_IF_ERROR(CheckElems(kKernel, "h", h, N * R, "rows*rank"));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, N * O, "rows*out_features"));
  const T scale = static_cast<T>(shape.scale);
  // h[N,R] = x[N,I] A[R,I]^T
  Gemm(false, true, N, R, I, T{1}, x.data(), I, a.data(), I, T{0}, h.data(), R, pool);
  // y[N,O] += scale * h[N,R] B[O,R]^T
  Gemm(false, true, N, O, R, scale, h.data(), R, b.data(), R, T{1}, y.data(), O, pool);
  return absl::OkStatus();
}

template <typename T>
absl::Status LoraBackward(const LoraShape& shape, absl::Span<const T> x, absl::Span<const T> a,
                          absl::Span<const T> b, absl::Span<const T> h, absl::Span<const T> dy,
                          absl::Span<T> dx, absl::Span<T> da, absl::Span<T> db,
                          absl::Span<T> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "LoraBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features, R = shape.rank;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "a", a, R * I, "rank*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, O * R, "out_features*rank"));
  RETURN_IF_ERROR(CheckElems(kKernel, "h", h, N * R, "rows*rank"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, N * O, "rows*out_features"));
  if (!dx.empty()) RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "da", da, R * I, "rank*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "db", db, O * R, "out_features*rank"));
  RETURN_IF_ERROR(CheckWorkspace(kKernel, workspace, LoraBackwardWorkspaceElems(shape)));
  const T scale = static_cast<T>(shape.scale);
  T* g = workspace.data();
  // g[N,R] = scale * dy[N,O] B[O,R]
  Gemm(false, false, N, R, O, scale, dy.data(), O, b.data(), R, T{0}, g, R, pool);
  // dB[O,R] += scale * dy[N,O]^T h[N,R]
  Gemm(true, false, O, R, N, scale, dy.data(), O, h.data(), R, T{1}, db.data(), R, pool);
  // dA[R,I] += g[N,R]^T x[N,I]
  Gemm(true, false, R, I, N, T{1}, g, R, x.data(), I, T{1}, da.data(), I, pool);
  // dx[N,I] += g[N,R] A[R,I]
  if (!dx.empty()) Gemm(false, false, N, I, R, T{1}, g, R, a.data(), I, T{1}, dx.data(), I, pool);
  return absl::OkStatus();
}

absl::Status DropoutForward(float p, uint64_t seed, absl::Span<const float> x, absl::Span<float> y,
                            ThreadPool* pool) {
  constexpr char kKernel[] = "DropoutForward";
  RETURN_IF_ERROR(CheckP(kKernel, p));
  const int64_t n = static_cast<int64_t>(x.size());
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, n, "x's elements"));
  const uint32_t threshold = DropoutThreshold(p);
  const float scale = DropoutScale(p);
  ParallelFor(pool, NumTasks(n, kDropoutElemsPerTask), [&](int64_t task) {
    const int64_t end = std::min(n, (task + 1) * kDropoutElemsPerTask);
    for (int64_t i = task * kDropoutElemsPerTask; i < end; ++i) {
      y[i] = DropoutApply(seed, static_cast<uint64_t>(i), threshold, scale, x[i]);
    }
  });
  return absl::OkStatus();
}

absl::Status DropoutBackward(float p, uint64_t seed, absl::Span<const float> dy,
                             absl::Span<float> dx, ThreadPool* pool) {
  constexpr char kKernel[] = "DropoutBackward";
  RETURN_IF_ERROR(CheckP(kKernel, p));
  const int64_t n = static_cast<int64_t>(dy.size());
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, n, "dy's elements"));
  const uint32_t threshold = DropoutThreshold(p);
  const float scale = DropoutScale(p);
  ParallelFor(pool, NumTasks(n, kDropoutElemsPerTask), [&](int64_t task) {
    const int64_t end = std::min(n, (task + 1) * kDropoutElemsPerTask);
    for (int64_t i = task * kDropoutElemsPerTask; i < end; ++i) {
      dx[i] += DropoutApply(seed, static_cast<uint64_t>(i), threshold, scale, dy[i]);
    }
  });
  return absl::OkStatus();
}

#define PS_LORA_INSTANTIATE_(T)                                                                    \
  template absl::Status LoraForward<T>(const LoraShape&, absl::Span<const T>, absl::Span<const T>, \
                                       absl::Span<const T>, absl::Span<T>, absl::Span<T>,          \
                                       ThreadPool*);                                               \
  template absl::Status LoraBackward<T>(const LoraShape&, absl::Span<const T>,                     \
                                        absl::Span<const T>, absl::Span<const T>,                  \
                                        absl::Span<const T>, absl::Span<const T>, absl::Span<T>,   \
                                        absl::Span<T>, absl::Span<T>, absl::Span<T>, ThreadPool*)
PS_LORA_INSTANTIATE_(float);
PS_LORA_INSTANTIATE_(double);
#undef PS_LORA_INSTANTIATE_

}  // namespace ps
