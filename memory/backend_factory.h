// CreateBackend: the one place that turns a backend name from a config or flag into a Backend.
#ifndef PATRICKSTAR_MEMORY_BACKEND_FACTORY_H_
#define PATRICKSTAR_MEMORY_BACKEND_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "memory/backend.h"
#include "memory/cuda_capacity.h"

namespace ps {

struct BackendOptions {
  // "cpu" (the emulated accelerator) or "cuda".
  std::string kind = "cpu";
  int device_index = 0;
  // Memory cap in bytes. Required (> 0) for cpu. For cuda, 0 means the device's free memory
  // minus cuda_margin_bytes; a larger value than that is InvalidArgument (memory/cuda_capacity.h).
  int64_t capacity_bytes = 0;
  // cuda only: free device memory kept out of the cap for the CUDA runtime, cuBLAS and NCCL
  // (CudaMarginBytes(true) for a run with a multi-rank nccl communicator).
  int64_t cuda_margin_bytes = kCudaRuntimeMarginBytes;
  // cpu only: emulated host<->device bandwidth per direction, bytes/s; 0 = unlimited.
  double copy_bandwidth_bytes_per_s = 0;
};

// InvalidArgument for an unknown kind or bad options; FailedPrecondition for "cuda" in a binary
// built without --config=cuda ("... built without CUDA support; rebuild with --config=cuda ...");
// Unavailable when CUDA is built in but no GPU can be used ("no CUDA device is available
// (cudaGetDeviceCount: <the runtime's error>) ...").
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// True if this binary was built with the CUDA backend (--config=cuda).
bool CudaBackendCompiledIn();

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_BACKEND_FACTORY_H_
