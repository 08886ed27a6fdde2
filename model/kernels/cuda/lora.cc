#include "model/kernels/cuda/lora.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/lora.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckBlasDim;

absl::Status CheckShape(const char* kernel, const LoraShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return CheckBlasDim(kernel, "rank", s.rank);
}

absl::Status CheckDropout(const char* kernel, int64_t n, float p) {
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat(kernel, ": n must be positive"));
  if (p >= 0.0f && p < 1.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": dropout probability p must be in [0, 1), got ", p));
}

}  // namespace

absl::Status LoraForward(const CublasHandle& cublas, const LoraShape& shape, const float* x,
                         const float* a, const float* b, float* h, float* y, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LoraForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"a", a}, {"b", b}, {"h", h}, {"y", y}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features, R = shape.rank;
  // h[N,R] = x[N,I] A[R,I]^T
  RETURN_IF_ERROR(Gemm(cublas, stream, false, true, N, R, I, 1.0f, x, I, a, I, 0.0f, h, R));
  // y[N,O] += scale * h[N,R] B[O,R]^T
  return Gemm(cublas, stream, false, true, N, O, R, shape.scale, h, R, b, R, 1.0f, y, O);
}

absl::Status LoraBackward(const CublasHandle& cublas, const LoraShape& shape, const float* x,
                          const float* a, const float* b, const float* h, const float* dy,
                          float* dx, float* da, float* db, void* workspace, int64_t workspace_bytes,
                          cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LoraBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  // dx is optional (no input gradient).
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x},
                                         {"a", a},
                                         {"b", b},
                                         {"h", h},
                                         {"dy", dy},
                                         {"da", da},
                                         {"db", db},
                                         {"workspace", workspace}}));
  if (workspace_bytes < LoraBackwardWorkspaceBytes(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": workspace has ", workspace_bytes,
                                                   " bytes, needs ",
                                                   LoraBackwardWorkspaceBytes(shape)));
  }
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features, R = shape.rank;
  float* g = static_cast<float*>(workspace);
  // g[N,R] = scale * dy[N,O] B[O,R]
  RETURN_IF_ERROR(
      Gemm(cublas, stream, false, false, N, R, O, shape.scale, dy, O, b, R, 0.0f, g, R));
  // dB[O,R] += scale * dy[N,O]^T h[N,R]
  RETURN_IF_ERROR(
      Gemm(cublas, stream, true, false, O, R, N, shape.scale, dy, O, h, R, 1.0f, db, R));
  // dA[R,I] += g[N,R]^T x[N,I]
  RETURN_IF_ERROR(Gemm(cublas, stream, true, false, R, I, N, 1.0f, g, R, x, I, 1.0f, da, I));
  if (dx == nullptr) return absl::OkStatus();
  // dx[N,I] += g[N,R] A[R,I]
  return Gemm(cublas, stream, false, false, N, I, R, 1.0f, g, R, a, I, 1.0f, dx, I);
}

absl::Status DropoutForward(int64_t n, float p, uint64_t seed, const float* x, float* y,
                            cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::DropoutForward";
  RETURN_IF_ERROR(CheckDropout(kKernel, n, p));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"y", y}}));
  return LaunchStatus(cuda_internal::LaunchDropoutForward(n, p, seed, x, y, stream), kKernel);
}

absl::Status DropoutBackward(int64_t n, float p, uint64_t seed, const float* dy, float* dx,
                             cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::DropoutBackward";
  RETURN_IF_ERROR(CheckDropout(kKernel, n, p));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"dy", dy}, {"dx", dx}}));
  return LaunchStatus(cuda_internal::LaunchDropoutBackward(n, p, seed, dy, dx, stream), kKernel);
}

}  // namespace ps::cuda
