// DeviceMemory: all the memory of one device, assembled; the object the layers above memory/ use.
//
//   accelerator:                         host:
//     BackendDeviceResource                PinnedHostResource (or HostResource)
//       (optional budget below the           (optional cap)
//        backend's capacity)
//       ├── ChunkBlockPool    model data      ├── ChunkBlockPool    model data
//       └── CachingAllocator  non-model data  └── CachingAllocator  non-model data
//                 both report to one MemoryTracker
//
//  - chunk pools: fixed-size blocks for chunk payloads, one pool per block size. A model whose
//    param chunks are 16-bit and whose optimizer-state chunks are f32 has two pools (f32-sized and
//    16-bit-sized blocks), so a 16-bit chunk occupies a 16-bit-sized block: chunk_pool_for(bytes)
//    is the pool with the smallest blocks that hold `bytes`. Every block in use is accounted as
//    model data.
//  - scratch(): the caching allocator for everything else (activations, workspaces, staging
//    buffers). Every byte in use is accounted as non-model data. It frees in stream order
//    (CachingAllocator::DeallocateOnStream) with events of the backend the memory was created
//    with; host memory created without a backend has no stream-ordered frees.
//  - tracker(): the per-device accounting the scheduler samples at every moment to learn the
//    non-model "tide" (MemoryTracker::SnapshotAndResetPeaks()).
//  - Both pools are registered as reclaimers of the bottom resource, so memory that one has cached
//    is handed to the other before anyone sees ResourceExhausted: when activations peak, chunk
//    blocks cached after an eviction go back to the device and the caching allocator gets them, and
//    when the activations are gone, the chunk pool gets the segments the caching allocator had
//    cached.
//
// Out of memory is always ResourceExhausted (never an abort) with a message that names the device,
// the request, the capacity, what is in use and what each pool had cached.
//
// Thread safety: thread-safe; the pools and the tracker may be used from any thread.
#ifndef PATRICKSTAR_MEMORY_DEVICE_MEMORY_H_
#define PATRICKSTAR_MEMORY_DEVICE_MEMORY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/chunk_block_pool.h"
#include "memory/device.h"
#include "memory/memory_tracker.h"
#include "memory/resources.h"

namespace ps {

struct DeviceMemoryOptions {
  // Bytes of the main pool's chunk payloads (chunk capacity in elements times the largest element
  // size). Required.
  int64_t chunk_block_bytes = 0;
  // Block sizes of further chunk pools, one per size: e.g. the 16-bit param chunks' bytes beside
  // the f32 main pool. Each positive and different from chunk_block_bytes and from each other.
  std::vector<int64_t> more_chunk_block_bytes;
  // Most chunk blocks held at once by each pool, in use plus cached; no limit but the memory itself
  // when unset.
  std::optional<int64_t> max_chunk_blocks;
  // Cap on all memory this device's pools take. Accelerator: a budget at most the backend's
  // capacity (unset: the whole capacity). Host: a hard cap on host memory (unset: none).
  std::optional<int64_t> capacity_bytes;
  // Host only: pinned memory from the backend (fast, asynchronous copies; needs a backend) or
  // pageable memory from the C++ heap.
  bool pinned = true;
  // Policy of the caching allocator. Its tracker and event_backend fields are ignored:
  // DeviceMemory sets them.
  CachingAllocatorOptions scratch;
};

// Everything a DeviceMemory knows, read in one call (each part consistent in itself).
struct DeviceMemoryStats {
  Device device;
  std::optional<int64_t> capacity_bytes;
  MemoryTrackerSnapshot usage;
  ProviderResourceStats upstream;
  // The main pool (chunk_pool()).
  ChunkBlockPoolStats chunk_pool;
  // Every chunk pool, by increasing block size (the main pool among them).
  std::vector<ChunkBlockPoolStats> chunk_pools;
  CachingAllocatorStats scratch;
};

class DeviceMemory {
 public:
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Returns all memory to the device. Chunk blocks and scratch allocations still in use are freed
  // too (with a warning); their owners must not use them afterwards.
  ~DeviceMemory();

  // The device this memory lives on.
  Device device() const { return device_; }
  // The main pool for chunk payloads (model data), of chunk_block_bytes() blocks. Owned by this
  // object.
  ChunkBlockPool* chunk_pool() const { return chunk_pool_.get(); }
  // The chunk pool with the smallest blocks of at least `bytes` (a chunk of `bytes` bytes takes
  // one of its blocks); null when no pool's blocks are that large. Owned by this object.
  ChunkBlockPool* chunk_pool_for(int64_t bytes) const;
  // Every chunk pool, by increasing block size.
  std::vector<ChunkBlockPool*> chunk_pools() const;
  // The caching allocator for non-model data. Owned by this object.
  CachingAllocator* scratch() const { return scratch_.get(); }
  // The accounting of this device. Owned by this object.
  MemoryTracker* tracker() const { return tracker_.get(); }
  // The bottom resource both pools draw from. Owned by this object; allocate from the pools, not
  // from this.
  ProviderResource* upstream() const { return upstream_.get(); }

  int64_t chunk_block_bytes() const { return chunk_pool_->block_bytes(); }
  // The cap the pools share (the budget, or the backend's capacity); nullopt for an uncapped host.
  std::optional<int64_t> capacity_bytes() const { return upstream_->effective_capacity_bytes(); }

  // Returns every pool's cached memory to the device; returns the bytes released.
  int64_t ReleaseCached();

  DeviceMemoryStats stats() const;
  // A few lines for logs: capacity, model / non-model use and peaks, what each pool holds.
  std::string DebugString() const;

 private:
  friend absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateAcceleratorMemory(
      Backend* backend, const DeviceMemoryOptions& options);
  friend absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateHostMemory(
      Backend* backend, const DeviceMemoryOptions& options);

  // Builds the pools over `upstream`; `backend` (may be null) provides the events of stream-ordered
  // scratch frees. Returns InvalidArgument for invalid options.
  static absl::StatusOr<std::unique_ptr<DeviceMemory>> Assemble(
      std::unique_ptr<ProviderResource> upstream, Backend* backend,
      const DeviceMemoryOptions& options);
  explicit DeviceMemory(Device device) : device_(device) {}

  const Device device_;
  // Declared in dependency order, so that members are destroyed users first.
  std::unique_ptr<MemoryTracker> tracker_;
  std::unique_ptr<ProviderResource> upstream_;
  std::unique_ptr<ChunkBlockPool> chunk_pool_;
  // The pools of more_chunk_block_bytes.
  std::vector<std::unique_ptr<ChunkBlockPool>> more_chunk_pools_;
  std::unique_ptr<CachingAllocator> scratch_;
};

// The memory of the accelerator driven by `backend` (not owned; must outlive the result).
// Returns InvalidArgument, naming the DeviceMemoryOptions field, for a null backend, a
// non-positive chunk_block_bytes, max_chunk_blocks or capacity_bytes, a capacity_bytes above the
// backend's capacity, a chunk block that cannot fit in the capacity, a repeated or non-positive
// more_chunk_block_bytes, or invalid scratch options.
absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateAcceleratorMemory(
    Backend* backend, const DeviceMemoryOptions& options);

// The host's memory: pinned memory from `backend` when options.pinned (then `backend` is required
// and must outlive the result), pageable heap memory otherwise (`backend` may be null; when given
// it must outlive the result, as it provides the events of stream-ordered scratch frees).
// Returns InvalidArgument, naming the field, for invalid options as above, or pinned without a
// backend.
absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateHostMemory(Backend* backend,
                                                               const DeviceMemoryOptions& options);

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_DEVICE_MEMORY_H_
