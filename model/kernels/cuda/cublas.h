// cuBLAS for the CUDA kernels of model/kernels: cublasStatus_t as absl::Status,
// an owning handle, and a row-major GEMM with the same conventions as
// model/kernels/internal/blas.h:
//   C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C[m,n]
// with op(X) = X or X^T and leading dimensions lda, ldb, ldc (elements between
// rows). cuBLAS is column-major; a row-major matrix is its transpose seen
// column-major, so the call computes C^T = op(B)^T op(A)^T, i.e.
// cublasGemmEx(op_b, op_a, n, m, k, B, A, C) — no data is moved.
//
// Precision: always CUBLAS_COMPUTE_32F (f32 accumulation, no TF32). C is f32; A
// and B are both f32, both f16 or both bf16 (16-bit operands halve GEMM memory
// traffic; the products, exact in f32, are still summed in f32).
//
// Allocation: the handle owns a device workspace allocated once by Create and
// re-attached on every call (cublasSetStream resets it), so GEMMs never
// allocate. Thread safety: a CublasHandle must not be used by two threads at
// once (cuBLAS's rule); distinct handles are independent.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_CUBLAS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_CUBLAS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::cuda {

// OK for CUBLAS_STATUS_SUCCESS; otherwise a Status naming `what` and the cuBLAS
// error. CUBLAS_STATUS_ALLOC_FAILED is ResourceExhausted, INVALID_VALUE
// InvalidArgument, NOT_INITIALIZED Unavailable (usually no GPU or driver),
// everything else Internal.
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

// An owned cublasHandle_t plus its workspace. Move-only.
class CublasHandle {
 public:
  // 32 MiB: what NVIDIA recommends for Hopper; more than enough for earlier
  // GPUs.
  static constexpr int64_t kDefaultWorkspaceBytes = int64_t{32} << 20;

  // Creates a handle on the current device with a device workspace of
  // `workspace_bytes` (>= 0). Unavailable without a GPU; ResourceExhausted if
  // the workspace cannot be allocated.
  static absl::StatusOr<CublasHandle> Create(int64_t workspace_bytes = kDefaultWorkspaceBytes);

  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasHandle_t get() const { return handle_; }

  // Points the handle at `stream` and re-attaches the workspace. Every call
  // below does this.
  [[nodiscard]] absl::Status Bind(cudaStream_t stream) const;

  // From now on, Bind attaches `workspace` (`bytes` of device memory, not
  // owned, 256-byte aligned; nullptr with 0 runs cuBLAS without a workspace)
  // instead of the handle's own, so that cuBLAS's scratch is the caller's
  // memory and counts against its allocator's cap (CudaKernels passes each
  // operation's workspace). The memory must stay valid until the calls that
  // used it have run on their stream. Not thread-safe (as the handle).
  void UseExternalWorkspace(void* workspace, int64_t bytes) {
    external_ = true;
    external_workspace_ = workspace;
    external_workspace_bytes_ = bytes;
  }

 private:
  CublasHandle(cublasHandle_t handle, void* workspace, int64_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  void Reset();

  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
  // Set by UseExternalWorkspace.
  bool external_ = false;
  void* external_workspace_ = nullptr;
  int64_t external_workspace_bytes_ = 0;
};

// Element type of the GEMM operands A and B.
enum class GemmOperand { kF32, kF16, kBF16 };

// The row-major GEMM above, enqueued on `stream`. InvalidArgument for a
// non-positive or >= 2^31 dimension, a leading dimension smaller than its row,
// or a null pointer; cuBLAS failures as CublasStatus. Device pointers must stay
// valid until the GEMM ran.
[[nodiscard]] absl::Status Gemm(const CublasHandle& handle, cudaStream_t stream, bool trans_a,
                                bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                GemmOperand ab_type, const void* a, int64_t lda, const void* b,
                                int64_t ldb, float beta, float* c, int64_t ldc);

// All-f32 convenience form.
[[nodiscard]] inline absl::Status Gemm(const CublasHandle& handle, cudaStream_t stream,
                                       bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                       float alpha, const float* a, int64_t lda, const float* b,
                                       int64_t ldb, float beta, float* c, int64_t ldc) {
  return Gemm(handle, stream, trans_a, trans_b, m, n, k, alpha, GemmOperand::kF32, a, lda, b, ldb,
              beta, c, ldc);
}

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_CUBLAS_H_
