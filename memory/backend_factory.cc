#include "memory/backend_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "memory/cpu_backend.h"

#if PS_WITH_CUDA
#include "memory/cuda/cuda_backend.h"
#endif

namespace ps {

bool CudaBackendCompiledIn() {
#if PS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.kind == "cpu") {
    return CreateCpuBackend(CpuBackendOptions{
        .device_index = options.device_index,
        .capacity_bytes = options.capacity_bytes,
        .copy_bandwidth_bytes_per_s = options.copy_bandwidth_bytes_per_s,
    });
  }
  if (options.kind == "cuda") {
#if PS_WITH_CUDA
    if (options.copy_bandwidth_bytes_per_s != 0) {
      return absl::InvalidArgumentError(
          "copy bandwidth emulation applies to the cpu backend only; remove it for cuda");
    }
    return CreateCudaBackend(CudaBackendOptions{
        .device_index = options.device_index,
        .capacity_bytes = options.capacity_bytes,
        .margin_bytes = options.cuda_margin_bytes,
    });
#else
    return absl::FailedPreconditionError(
        "the cuda backend was requested, but this binary was built without CUDA support; rebuild "
        "with --config=cuda (`bazel build --config=cuda ...`), or use the cpu backend");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown accelerator backend \"", options.kind,
                                                 "\": expected \"cpu\" or \"cuda\""));
}

}  // namespace ps
