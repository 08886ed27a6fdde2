// How much of a GPU a run may cap: the device's free memory minus what the CUDA runtime, cuBLAS
// and NCCL take later, outside any cap. CUDA-free, so the arithmetic is tested on any machine;
// memory/cuda/cuda_backend.cc applies it to cudaMemGetInfo's numbers.
//
// The margins are estimates from the libraries' documented behaviour, not yet measured on a GPU:
//  - kCudaRuntimeMarginBytes: kernel modules the runtime loads lazily on first launch (ours and
//    cuBLAS/cuBLASLt's, typically 100-400 MiB with CUDA_MODULE_LOADING=LAZY, the default), the
//    cuBLAS handle's own allocations, and device-side printf/malloc heaps. The CUDA context itself
//    is already out of cudaMemGetInfo's free bytes when the backend asks.
//  - kNcclMarginBytes: NCCL's per-peer, per-channel buffers (NCCL_BUFFSIZE, 4 MiB by default, for
//    send and receive on up to 32 channels), allocated at ncclCommInitRank or, with lazy
//    connection setup, at the first collective; a few hundred MiB on one node.
#ifndef PATRICKSTAR_MEMORY_CUDA_CAPACITY_H_
#define PATRICKSTAR_MEMORY_CUDA_CAPACITY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "base/units.h"

namespace ps {

inline constexpr int64_t kCudaRuntimeMarginBytes = 1 * kGiB;
inline constexpr int64_t kNcclMarginBytes = 1 * kGiB;

// The margin of a run: the runtime's, plus NCCL's when `nccl` (a device communicator of more than
// one rank).
inline int64_t CudaMarginBytes(bool nccl) {
  return kCudaRuntimeMarginBytes + (nccl ? kNcclMarginBytes : 0);
}

// The cap of cuda device `device_index` given its `free_bytes` and `total_bytes` (cudaMemGetInfo)
// and `margin_bytes`: `requested_bytes`, or free - margin when it is 0. InvalidArgument when the
// request is negative or above free - margin (naming the numbers and the fix), and when nothing is
// left after the margin.
absl::StatusOr<int64_t> CudaCapacityFromFree(int64_t requested_bytes, int64_t free_bytes,
                                             int64_t total_bytes, int64_t margin_bytes,
                                             int device_index);

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CUDA_CAPACITY_H_
