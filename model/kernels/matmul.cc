#include "model/kernels/matmul.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "glog/logging.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"

namespace ps {
namespace {

using kernels_internal::Bf16GemmBackend;
using kernels_internal::CheckBlasDim;
using kernels_internal::CheckElems;
using kernels_internal::CheckWorkspace;
using kernels_internal::FallbackScratch;
using kernels_internal::Gemm;
using kernels_internal::GemmBf16;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::ResolveBf16GemmBackend;
using kernels_internal::RoundToBf16;
using kernels_internal::RoundToBf16Transposed;
using kernels_internal::RoundToBf16Values;
using kernels_internal::RowsPerTask;
using kernels_internal::WidenBf16;

constexpr int64_t kColumnsPerTask = 64;

// y[r, :] = b for every row r < rows.
template <typename T>
void BroadcastRows(absl::Span<const T> b, int64_t rows, T* y, ThreadPool* pool) {
  const int64_t O = static_cast<int64_t>(b.size());
  const int64_t grain = RowsPerTask(O);
  ParallelFor(pool, NumTasks(rows, grain), [&](int64_t task) {
    const int64_t end = std::min(rows, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) std::copy(b.begin(), b.end(), y + r * O);
  });
}

// db += column sums of dy [N, O], parallel over column slices with the rows in order.
template <typename T>
void AddColumnSums(absl::Span<const T> dy, int64_t N, int64_t O, absl::Span<T> db,
                   ThreadPool* pool) {
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
}

// Offset of the second bf16 array of the backward workspace: 64-byte aligned.
int64_t Bf16SecondArrayOffset(int64_t first_elems) { return (first_elems + 31) / 32 * 32; }

// The workspace's f32 elements as bf16 bit patterns.
uint16_t* Bf16Workspace(absl::Span<float> workspace) {
  return reinterpret_cast<uint16_t*>(workspace.data());
}

absl::Status CheckShape(const char* kernel, const MatmulShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return absl::OkStatus();
}

}  // namespace

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
  BroadcastRows(b, N, y.data(), pool);
  Gemm(false, false, N, O, I, T{1}, x.data(), I, w.data(), O, T{1}, y.data(), O, pool);
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
  if (!dw.empty()) {
    RETURN_IF_ERROR(CheckElems(kKernel, "dw", dw, I * O, "in_features*out_features"));
  }
  if (!db.empty()) RETURN_IF_ERROR(CheckElems(kKernel, "db", db, O, "out_features"));
  // dx[N,I] += dy[N,O] W[I,O]^T
  Gemm(false, true, N, I, O, T{1}, dy.data(), O, w.data(), O, T{1}, dx.data(), I, pool);
  // dW[I,O] += x[N,I]^T dy[N,O]
  if (!dw.empty()) {
    Gemm(true, false, I, O, N, T{1}, x.data(), I, dy.data(), O, T{1}, dw.data(), O, pool);
  }
  if (!db.empty()) AddColumnSums(dy, N, O, db, pool);
  return absl::OkStatus();
}

int64_t MatmulBf16ForwardWorkspaceElems(const MatmulShape& shape) {
  return (shape.rows * shape.in_features + 1) / 2;
}

int64_t MatmulBf16BackwardWorkspaceElems(const MatmulShape& shape) {
  const int64_t bf16_elems =
      Bf16SecondArrayOffset(shape.rows * shape.out_features) + shape.rows * shape.in_features;
  return (bf16_elems + 1) / 2;
}

absl::Status MatmulForwardBf16(const MatmulShape& shape, absl::Span<const float> x,
                               absl::Span<const uint16_t> w, absl::Span<const float> b,
                               absl::Span<float> y, absl::Span<float> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "MatmulForwardBf16";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, I * O, "in_features*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "b", b, O, "out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "y", y, N * O, "rows*out_features"));
  RETURN_IF_ERROR(CheckWorkspace(kKernel, workspace, MatmulBf16ForwardWorkspaceElems(shape)));
  Bf16GemmBackend backend;
  RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
  if (backend == Bf16GemmBackend::kFallback) {
    // No native bf16 GEMM: the same products through sgemm on f32 copies holding x rounded to
    // bf16 and W widened (internal/bf16_gemm.h), with no bf16 copy of x in between.
    float* xr = FallbackScratch(0, N * I);
    float* wf = FallbackScratch(1, I * O);
    RoundToBf16Values(x.data(), xr, N * I, pool);
    WidenBf16(w.data(), wf, I * O, pool);
    BroadcastRows(b, N, y.data(), pool);
    Gemm(false, false, N, O, I, 1.0f, xr, I, wf, O, 1.0f, y.data(), O, pool);
    return absl::OkStatus();
  }
  uint16_t* xb = Bf16Workspace(workspace);
  RoundToBf16(x.data(), xb, N * I, pool);
  BroadcastRows(b, N, y.data(), pool);
  return GemmBf16({.m = N,
                   .n = O,
                   .k = I,
                   .a = xb,
                   .lda = I,
                   .b = w.data(),
                   .ldb = O,
                   .accumulate = true,
                   .c = y.data(),
                   .ldc = O},
                  pool);
}

absl::Status MatmulBackwardBf16(const MatmulShape& shape, absl::Span<const float> x,
                                absl::Span<const uint16_t> w, absl::Span<const float> dy,
                                absl::Span<float> dx, absl::Span<float> dw, absl::Span<float> db,
                                absl::Span<float> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "MatmulBackwardBf16";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kKernel, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "w", w, I * O, "in_features*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dy", dy, N * O, "rows*out_features"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dx", dx, N * I, "rows*in_features"));
  if (!dw.empty()) {
    RETURN_IF_ERROR(CheckElems(kKernel, "dw", dw, I * O, "in_features*out_features"));
  }
  if (!db.empty()) RETURN_IF_ERROR(CheckElems(kKernel, "db", db, O, "out_features"));
  RETURN_IF_ERROR(CheckWorkspace(kKernel, workspace, MatmulBf16BackwardWorkspaceElems(shape)));
  Bf16GemmBackend backend;
  RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
  if (backend == Bf16GemmBackend::kFallback) {
    // As MatmulForwardBf16's fallback: dy and x rounded to bf16 values in f32, W widened; sgemm
    // reads x transposed itself (no transposed copy).
    float* dyr = FallbackScratch(0, N * O);
    float* wf = FallbackScratch(1, I * O);
    float* xr = FallbackScratch(2, N * I);
    RoundToBf16Values(dy.data(), dyr, N * O, pool);
    WidenBf16(w.data(), wf, I * O, pool);
    // dx[N,I] += dy[N,O] W[I,O]^T
    Gemm(false, true, N, I, O, 1.0f, dyr, O, wf, O, 1.0f, dx.data(), I, pool);
    // dW[I,O] += x[N,I]^T dy[N,O]
    if (!dw.empty()) {
      RoundToBf16Values(x.data(), xr, N * I, pool);
      Gemm(true, false, I, O, N, 1.0f, xr, I, dyr, O, 1.0f, dw.data(), O, pool);
    }
    if (!db.empty()) AddColumnSums(dy, N, O, db, pool);
    return absl::OkStatus();
  }
  // dy in bf16 [N, O]; x in bf16 and transposed, [I, N], so that dW's GEMM reads both operands
  // in plain layout (oneDNN would copy a transposed A once per output block).
  uint16_t* dyb = Bf16Workspace(workspace);
  uint16_t* xbt = dyb + Bf16SecondArrayOffset(N * O);
  RoundToBf16(dy.data(), dyb, N * O, pool);
  if (!dw.empty()) RoundToBf16Transposed(x.data(), N, I, xbt, pool);
  // dx[N,I] += dy[N,O] W[I,O]^T
  RETURN_IF_ERROR(GemmBf16({.trans_b = true,
                            .m = N,
                            .n = I,
                            .k = O,
                            .a = dyb,
                            .lda = O,
                            .b = w.data(),
                            .ldb = O,
                            .accumulate = true,
                            .c = dx.data(),
                            .ldc = I},
                           pool));
  if (dw.empty()) {
    if (!db.empty()) AddColumnSums(dy, N, O, db, pool);
    return absl::OkStatus();
  }
  // dW[I,O] += x[N,I]^T dy[N,O]
  RETURN_IF_ERROR(GemmBf16({.m = I,
                            .n = O,
                            .k = N,
                            .a = xbt,
                            .lda = N,
                            .b = dyb,
                            .ldb = O,
                            .accumulate = true,
                            .c = dw.data(),
                            .ldc = O},
                           pool));
  if (!db.empty()) AddColumnSums(dy, N, O, db, pool);
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
