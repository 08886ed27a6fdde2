#include "model/kernels/kernels_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/kernels/cpu_kernels.h"

#if PS_WITH_CUDA
#include "model/kernels/cuda/cuda_kernels.h"
#endif

namespace ps {

absl::StatusOr<std::unique_ptr<Kernels>> CreateKernels(Backend* backend,
                                                       const KernelsOptions& options) {
  if (backend == nullptr) return absl::InvalidArgumentError("CreateKernels: the backend is null");
  if (backend->name() == "cpu") {
    absl::StatusOr<std::unique_ptr<CpuKernels>> kernels =
        CpuKernels::Create(backend, {.pool = options.cpu_pool});
    if (!kernels.ok()) return kernels.status();
    return std::unique_ptr<Kernels>(*std::move(kernels));
  }
  if (backend->name() == "cuda") {
#if PS_WITH_CUDA
    absl::StatusOr<std::unique_ptr<cuda::CudaKernels>> kernels = cuda::CudaKernels::Create(
        backend, {.cublas_workspace_bytes = options.cuda_cublas_workspace_bytes});
    if (!kernels.ok()) return kernels.status();
    return std::unique_ptr<Kernels>(*std::move(kernels));
#else
    return absl::FailedPreconditionError(
        "CreateKernels: the cuda kernels were not built into this binary; rebuild with "
        "--config=cuda");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("CreateKernels: no kernels for the \"",
                                                 backend->name(),
                                                 "\" backend; expected \"cpu\" or \"cuda\""));
}

absl::StatusOr<std::unique_ptr<KernelWorkspaces>> CreateKernelWorkspaces(
    Backend* backend, int cpu_threads, const KernelsOptions& options) {
  if (backend == nullptr) {
    return absl::InvalidArgumentError("CreateKernelWorkspaces: the backend is null");
  }
  if (backend->name() == "cpu") {
    if (cpu_threads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateKernelWorkspaces: cpu_threads must be >= 1, got ", cpu_threads));
    }
    return std::unique_ptr<KernelWorkspaces>(new CpuKernelWorkspaces(cpu_threads));
  }
  if (backend->name() == "cuda") {
#if PS_WITH_CUDA
    // The size CudaKernels::Create resolves for the same options.
    absl::StatusOr<int64_t> cublas_bytes = cuda::CudaKernels::CublasWorkspaceBytes(
        backend->device().index, options.cuda_cublas_workspace_bytes);
    if (!cublas_bytes.ok()) return cublas_bytes.status();
    return std::unique_ptr<KernelWorkspaces>(new CudaKernelWorkspaces(*cublas_bytes));
#else
    return absl::FailedPreconditionError(
        "CreateKernelWorkspaces: the cuda kernels were not built into this binary; rebuild with "
        "--config=cuda");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("CreateKernelWorkspaces: no kernels for the \"",
                                                 backend->name(),
                                                 "\" backend; expected \"cpu\" or \"cuda\""));
}

}  // namespace ps
