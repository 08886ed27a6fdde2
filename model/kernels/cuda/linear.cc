#include "model/kernels/cuda/linear.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/linear.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckBlasDim;

absl::Status CheckShape(const char* kernel, const LinearShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearForward(const CublasHandle& cublas, const LinearShape& shape, const float* x,
                           const float* w, const float* b, float* y, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LinearForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"y", y}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  float beta = 0.0f;
  if (shape.bias) {
    RETURN_IF_ERROR(CheckNotNull(kKernel, {{"b", b}}));
    RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchBroadcastRows(N, O, b, y, stream), kKernel));
    beta = 1.0f;
  }
  // y[N,O] (+)= x[N,I] W[O,I]^T
  return Gemm(cublas, stream, false, true, N, O, I, 1.0f, x, I, w, I, beta, y, O);
}

absl::Status LinearBackward(const CublasHandle& cublas, const LinearShape& shape, const float* x,
                            const float* w, const float* dy, float* dx, float* dw, float* db,
                            cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LinearBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  // dw and db are optional (input gradient only).
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  // dx[N,I] += dy[N,O] W[O,I]
  RETURN_IF_ERROR(Gemm(cublas, stream, false, false, N, I, O, 1.0f, dy, O, w, I, 1.0f, dx, I));
  // dW[O,I] += dy[N,O]^T x[N,I]
  if (dw != nullptr) {
    RETURN_IF_ERROR(Gemm(cublas, stream, true, false, O, I, N, 1.0f, dy, O, x, I, 1.0f, dw, I));
  }
  if (!shape.bias || db == nullptr) return absl::OkStatus();
  return LaunchStatus(cuda_internal::LaunchColumnSums(N, O, dy, db, stream), kKernel);
}

}  // namespace ps::cuda
