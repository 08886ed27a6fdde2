#include "model/kernels/cuda/cublas.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "memory/cuda/cuda_status.h"

namespace ps::cuda {
namespace {

cudaDataType_t DataType(GemmOperand t) {
  switch (t) {
    case GemmOperand::kF16:
      return CUDA_R_16F;
    case GemmOperand::kBF16:
      return CUDA_R_16BF;
    case GemmOperand::kF32:
      break;
  }
  return CUDA_R_32F;
}

absl::Status CheckDim(const char* name, int64_t value) {
  if (value > 0 && value <= INT32_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("Gemm: ", name, " must be in [1, 2^31), got ", value));
}

absl::Status CheckLd(const char* name, int64_t ld, int64_t row_elems) {
  if (ld >= row_elems && ld <= INT32_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "Gemm: ", name, " is ", ld, ", less than the row length ", row_elems, " (or >= 2^31)"));
}

}  // namespace

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, " failed: ", cublasGetStatusName(status), " (",
                                           cublasGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<CublasHandle> CublasHandle::Create(int64_t workspace_bytes) {
  if (workspace_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CublasHandle: workspace_bytes must be >= 0, got ", workspace_bytes));
  }
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace, static_cast<size_t>(workspace_bytes)));
  }
  cublasHandle_t handle = nullptr;
  const absl::Status created = CublasStatus(cublasCreate(&handle), "cublasCreate");
  if (!created.ok()) {
    if (workspace != nullptr) (void)cudaFree(workspace);
    return created;
  }
  CublasHandle result(handle, workspace, workspace_bytes);
  // Full f32: no TF32 tensor-core rounding of f32 operands.
  RETURN_IF_ERROR(
      CublasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  return result;
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      workspace_(std::exchange(other.workspace_, nullptr)),
      workspace_bytes_(std::exchange(other.workspace_bytes_, 0)),
      external_(std::exchange(other.external_, false)),
      external_workspace_(std::exchange(other.external_workspace_, nullptr)),
      external_workspace_bytes_(std::exchange(other.external_workspace_bytes_, 0)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::exchange(other.workspace_, nullptr);
    workspace_bytes_ = std::exchange(other.workspace_bytes_, 0);
    external_ = std::exchange(other.external_, false);
    external_workspace_ = std::exchange(other.external_workspace_, nullptr);
    external_workspace_bytes_ = std::exchange(other.external_workspace_bytes_, 0);
  }
  return *this;
}

CublasHandle::~CublasHandle() { Reset(); }

void CublasHandle::Reset() {
  // Destruction cannot report errors; cublasDestroy synchronizes with the
  // handle's work first.
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
  handle_ = nullptr;
  workspace_ = nullptr;
  workspace_bytes_ = 0;
}

absl::Status CublasHandle::Bind(cudaStream_t stream) const {
  if (handle_ == nullptr) return absl::FailedPreconditionError("CublasHandle: moved-from handle");
  RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"));
  if (external_) {
    return CublasStatus(cublasSetWorkspace(handle_, external_workspace_,
                                           static_cast<size_t>(external_workspace_bytes_)),
                        "cublasSetWorkspace");
  }
  if (workspace_ != nullptr) {
    RETURN_IF_ERROR(
        CublasStatus(cublasSetWorkspace(handle_, workspace_, static_cast<size_t>(workspace_bytes_)),
                     "cublasSetWorkspace"));
  }
  return absl::OkStatus();
}

absl::Status Gemm(const CublasHandle& handle, cudaStream_t stream, bool trans_a, bool trans_b,
                  int64_t m, int64_t n, int64_t k, float alpha, GemmOperand ab_type, const void* a,
                  int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  RETURN_IF_ERROR(CheckDim("m", m));
  RETURN_IF_ERROR(CheckDim("n", n));
  RETURN_IF_ERROR(CheckDim("k", k));
  // Row lengths of the stored (untransposed) matrices.
  RETURN_IF_ERROR(CheckLd("lda", lda, trans_a ? m : k));
  RETURN_IF_ERROR(CheckLd("ldb", ldb, trans_b ? k : n));
  RETURN_IF_ERROR(CheckLd("ldc", ldc, n));
  if (a == nullptr || b == nullptr || c == nullptr) {
    return absl::InvalidArgumentError("Gemm: null matrix pointer");
  }
  RETURN_IF_ERROR(handle.Bind(stream));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the
  // operands.
  return CublasStatus(
      cublasGemmEx(handle.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), &alpha, b, DataType(ab_type), static_cast<int>(ldb), a,
                   DataType(ab_type), static_cast<int>(lda), &beta, c, CUDA_R_32F,
                   static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

}  // namespace ps::cuda
