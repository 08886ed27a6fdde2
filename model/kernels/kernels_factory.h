// CreateKernels: the Kernels implementation (model/kernels/kernels.h) that runs on a backend —
// CpuKernels on the emulated accelerator ("cpu"), CudaKernels on a GPU ("cuda", --config=cuda).
// The model and the trainer call this once, next to CreateBackend, and use only the interface.
#ifndef PATRICKSTAR_MODEL_KERNELS_KERNELS_FACTORY_H_
#define PATRICKSTAR_MODEL_KERNELS_KERNELS_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "memory/backend.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels.h"

namespace ps {

struct KernelsOptions {
  // cpu backend: the pool every kernel's ParallelFor runs on (see cpu_kernels.h for the rules);
  // null runs each kernel on its stream's worker thread alone. Not owned; must outlive the work.
  ThreadPool* cpu_pool = nullptr;
  // cuda backend: the cuBLAS workspace each GEMM asks its caller for; 0 = NVIDIA's recommendation
  // for the GPU (see cuda/cuda_kernels.h).
  int64_t cuda_cublas_workspace_bytes = 0;
};

// `backend` must outlive the result. InvalidArgument for a null backend or an unknown backend
// name; FailedPrecondition for a cuda backend in a binary built without --config=cuda (which
// cannot normally happen: such a binary cannot create one); the errors of the implementation's
// Create otherwise.
absl::StatusOr<std::unique_ptr<Kernels>> CreateKernels(Backend* backend,
                                                       const KernelsOptions& options = {});

// The workspace sizes (kernel_workspaces.h) that CreateKernels(backend, options) gives kernels
// for, without creating them (no cuBLAS handle): what the pre-flight plan replays. cpu:
// CpuKernelWorkspaces for `cpu_threads` threads (the pool the kernels will run on; >= 1). cuda:
// CudaKernelWorkspaces with options.cuda_cublas_workspace_bytes, or when 0 the GPU's default (its
// compute capability, asked of the device). Errors as CreateKernels, and InvalidArgument for
// cpu_threads < 1.
absl::StatusOr<std::unique_ptr<KernelWorkspaces>> CreateKernelWorkspaces(
    Backend* backend, int cpu_threads, const KernelsOptions& options = {});

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_KERNELS_FACTORY_H_
