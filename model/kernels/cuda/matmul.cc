#include "model/kernels/cuda/matmul.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/cuda/convert_kernels.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/matmul.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckBlasDim;

absl::Status CheckShape(const char* kernel, const MatmulShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "out_features", s.out_features));
  return absl::OkStatus();
}

}  // namespace

absl::Status MatmulForward(const CublasHandle& cublas, const MatmulShape& shape, const float* x,
                           const float* w, const float* b, float* y, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::MatmulForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"b", b}, {"y", y}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchBroadcastRows(N, O, b, y, stream), kKernel));
  return Gemm(cublas, stream, false, false, N, O, I, 1.0f, x, I, w, O, 1.0f, y, O);
}

absl::Status MatmulBackward(const CublasHandle& cublas, const MatmulShape& shape, const float* x,
                            const float* w, const float* dy, float* dx, float* dw, float* db,
                            cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::MatmulBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  // dw and db are optional (input gradient only).
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  // dx[N,I] += dy[N,O] W[I,O]^T
  RETURN_IF_ERROR(Gemm(cublas, stream, false, true, N, I, O, 1.0f, dy, O, w, O, 1.0f, dx, I));
  // dW[I,O] += x[N,I]^T dy[N,O]
  if (dw != nullptr) {
    RETURN_IF_ERROR(Gemm(cublas, stream, true, false, I, O, N, 1.0f, x, I, dy, O, 1.0f, dw, O));
  }
  if (db == nullptr) return absl::OkStatus();
  return LaunchStatus(cuda_internal::LaunchColumnSums(N, O, dy, db, stream), kKernel);
}

namespace {

absl::Status CheckBf16Workspace(const char* kernel, const void* workspace, int64_t bytes,
                                int64_t needed) {
  RETURN_IF_ERROR(CheckNotNull(kernel, {{"workspace", workspace}}));
  if (bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": workspace has ", bytes, " bytes, needs ", needed));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": workspace must be 256-byte aligned (as cudaMalloc returns it)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MatmulForwardBf16(const CublasHandle& cublas, const MatmulShape& shape, const float* x,
                               const uint16_t* w, const float* b, float* y, void* workspace,
                               int64_t workspace_bytes, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::MatmulForwardBf16";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"b", b}, {"y", y}}));
  RETURN_IF_ERROR(CheckBf16Workspace(kKernel, workspace, workspace_bytes,
                                     MatmulBf16ForwardWorkspaceBytes(shape)));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  auto* xb = static_cast<uint16_t*>(workspace);
  RETURN_IF_ERROR(LaunchStatus(LaunchConvertF32ToBF16(x, xb, N * I, stream), kKernel));
  RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchBroadcastRows(N, O, b, y, stream), kKernel));
  return Gemm(cublas, stream, false, false, N, O, I, 1.0f, GemmOperand::kBF16, xb, I, w, O, 1.0f, y,
              O);
}

absl::Status MatmulBackwardBf16(const CublasHandle& cublas, const MatmulShape& shape,
                                const float* x, const uint16_t* w, const float* dy, float* dx,
                                float* dw, float* db, void* workspace, int64_t workspace_bytes,
                                cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::MatmulBackwardBf16";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  // dw and db are optional (input gradient only).
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}}));
  RETURN_IF_ERROR(CheckBf16Workspace(kKernel, workspace, workspace_bytes,
                                     MatmulBf16BackwardWorkspaceBytes(shape)));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  auto* xb = static_cast<uint16_t*>(workspace);
  auto* dyb = reinterpret_cast<uint16_t*>(static_cast<char*>(workspace) +
                                          cuda_internal::AlignBytes(N * I * 2));
  RETURN_IF_ERROR(LaunchStatus(LaunchConvertF32ToBF16(dy, dyb, N * O, stream), kKernel));
  // dx[N,I] += bf16(dy)[N,O] W[I,O]^T
  RETURN_IF_ERROR(Gemm(cublas, stream, false, true, N, I, O, 1.0f, GemmOperand::kBF16, dyb, O, w, O,
                       1.0f, dx, I));
  if (dw != nullptr) {
    RETURN_IF_ERROR(LaunchStatus(LaunchConvertF32ToBF16(x, xb, N * I, stream), kKernel));
    // dW[I,O] += bf16(x)[N,I]^T bf16(dy)[N,O]
    RETURN_IF_ERROR(Gemm(cublas, stream, true, false, I, O, N, 1.0f, GemmOperand::kBF16, xb, I, dyb,
                         O, 1.0f, dw, O));
  }
  if (db == nullptr) return absl::OkStatus();
  return LaunchStatus(cuda_internal::LaunchColumnSums(N, O, dy, db, stream), kKernel);
}

}  // namespace ps::cuda
