// The emulated accelerator: a Backend whose device memory is host RAM under a hard cap.
//
// It exists so that every layer above memory/ runs, and is tested, on machines without a GPU, and
// it is a supported runtime for CPU-only training — not a test double:
//  - Device memory: aligned host allocations, at most `capacity_bytes` in total (requests rounded
//    up to kAllocationAlignment). Over the cap is ResourceExhausted; nothing is over-committed.
//    Every live allocation is registered, so copies and memsets into device memory are checked
//    against it at enqueue time (InvalidArgument for a range outside any live allocation).
//  - Streams: each stream is a worker thread running its queue in order. A copy on a copy stream
//    really overlaps computation on a compute stream, as a DMA engine would.
//  - Link emulation: with `copy_bandwidth_bytes_per_s > 0`, every host<->device copy takes at
//    least bytes / bandwidth seconds, and copies in one direction share that direction's link
//    (like the one copy engine per direction of a PCIe GPU), so two concurrent host-to-device
//    copies take as long as their sum. Device-to-device and host-to-host copies are not capped.
//
// Thread safety: thread-safe.
#ifndef PATRICKSTAR_MEMORY_CPU_BACKEND_H_
#define PATRICKSTAR_MEMORY_CPU_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "memory/backend.h"

namespace ps {

struct CpuBackendOptions {
  // Accelerator index reported by device().
  int device_index = 0;
  // Hard cap on device memory. Must be > 0.
  int64_t capacity_bytes = 0;
  // Emulated host<->device link bandwidth per direction; 0 means unlimited (plain memcpy speed).
  double copy_bandwidth_bytes_per_s = 0;
};

// Returns InvalidArgument for a non-positive capacity or a negative bandwidth.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CPU_BACKEND_H_
