// The accelerator memory CudaAdam (optimizer/cuda/cuda_adam.h) takes from its backend at Create,
// outside any DeviceMemory budget: numbers a memory plan needs in every build, so they live here
// rather than in the CUDA-only header (which includes this one; cuda_adam.cc checks that its
// allocations match these constants at compile time).
#ifndef PATRICKSTAR_OPTIMIZER_CUDA_ADAM_FOOTPRINT_H_
#define PATRICKSTAR_OPTIMIZER_CUDA_ADAM_FOOTPRINT_H_

#include <cstdint>

#include "base/units.h"
#include "memory/memory_resource.h"

namespace ps {

// Bytes of the device tile through which CudaAdam stages host memory the GPU cannot address.
inline constexpr int64_t kCudaAdamStagingBytes = int64_t{1} << 20;
// Bytes of CudaAdam's device workspace (the per-block gradient-statistics sums, 1024 doubles, and
// one counter) — mirrored by a pinned host buffer of the same size.
inline constexpr int64_t kCudaAdamWorkspaceBytes = 1024 * 8 + 8;
// Device bytes a CudaAdam holds from Create to destruction, as the backend counts them (each
// request rounded up to kAllocationAlignment).
inline constexpr int64_t kCudaAdamDeviceBytes =
    AlignUp(kCudaAdamStagingBytes, kAllocationAlignment) +
    AlignUp(kCudaAdamWorkspaceBytes, kAllocationAlignment);

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_CUDA_ADAM_FOOTPRINT_H_
