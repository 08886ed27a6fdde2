// The cuda Backend: one GPU's memory under a cap, pinned host memory, CUDA streams and events.
//
// Built only under --config=cuda. Device allocations are registered (as in the cpu backend) so
// that copies and frees are checked before they reach the driver and misuse is InvalidArgument,
// not a crash or a sticky CUDA error. Streams are non-blocking streams (they do not synchronize
// with the legacy default stream); events are created with timing disabled (cheapest). Host
// functions run through cudaLaunchHostFunc.
//
// Thread safety: thread-safe; every call makes `device_index` current on the calling thread first.
#ifndef PATRICKSTAR_MEMORY_CUDA_CUDA_BACKEND_H_
#define PATRICKSTAR_MEMORY_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "memory/backend.h"
#include "memory/cuda_capacity.h"

namespace ps {

struct CudaBackendOptions {
  int device_index = 0;
  // Cap on device memory handed out; 0 = the device's free memory minus margin_bytes.
  int64_t capacity_bytes = 0;
  // Free device memory kept out of the cap for the CUDA runtime, cuBLAS and NCCL, which allocate
  // outside it (memory/cuda_capacity.h).
  int64_t margin_bytes = kCudaRuntimeMarginBytes;
};

// Unavailable when no usable GPU exists (no device, or no driver): "no CUDA device is available
// (cudaGetDeviceCount: ...)"; InvalidArgument for a device index out of range or a capacity above
// the device's free memory minus margin_bytes (CudaCapacityFromFree).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

// Number of CUDA devices usable by this process (0 when there is no driver or GPU).
int CudaDeviceCount();

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CUDA_CUDA_BACKEND_H_
