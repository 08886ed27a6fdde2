// ChunkBlockPool: a pool of equal-sized blocks for chunk payloads.
//
// Every chunk of a model has the same capacity, so every chunk payload on a device is a block of
// the same size. The pool takes blocks from an upstream MemoryResource (a device's raw memory) and
// keeps the blocks that chunks give back in a cache, so that the constant traffic of chunks moving
// between devices (evicted, fetched back, all-gathered and freed) does not turn into constant
// upstream allocation. This is PatrickStar's memory cache (core/memory_cache.py), minus its
// defects: blocks are one size by construction, so a cached block can never be handed out for a
// request of a different size, and the cache is unbounded by default and given back whole when the
// device runs short (the pool is a Reclaimer: the device resource calls ReleaseCached() before it
// reports out of memory to anyone).
//
// The pool never reads or writes block contents (they may be accelerator memory): a block comes
// back from AllocateBlock() holding whatever its previous user left in it. The pool is not
// stream-ordered: a block is reusable as soon as DeallocateBlock returns, so callers must first make
// sure no stream still uses it (synchronize, or wait on an event recorded after the last use).
//
// Accounting: with a tracker, the bytes of blocks in use (not cached ones) are recorded as
// `tracked_kind` (model data by default).
//
// Thread safety: thread-safe. The upstream is called without the pool's lock held, so an upstream
// that reclaims (ProviderResource) may call back into ReleaseCached().
#ifndef PATRICKSTAR_MEMORY_CHUNK_BLOCK_POOL_H_
#define PATRICKSTAR_MEMORY_CHUNK_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "memory/device.h"
#include "memory/memory_resource.h"
#include "memory/memory_tracker.h"

namespace ps {

struct ChunkBlockPoolOptions {
  // Size of every block. Must be > 0. Blocks are aligned to kAllocationAlignment.
  int64_t block_bytes = 0;
  // Most blocks the pool holds at once, in use plus cached; none when unset. Must be > 0 when set.
  std::optional<int64_t> max_blocks;
  // Most freed blocks kept cached; a block freed beyond this goes straight upstream. Unlimited
  // when unset. Must be >= 0 when set.
  std::optional<int64_t> max_cached_blocks;
  // Where blocks in use are recorded, if anywhere. Not owned; must outlive the pool and account
  // the upstream's device.
  MemoryTracker* tracker = nullptr;
  MemoryKind tracked_kind = MemoryKind::kModelData;
};

struct ChunkBlockPoolStats {
  int64_t block_bytes = 0;
  int64_t blocks_in_use = 0;
  int64_t cached_blocks = 0;
  // Highest blocks_in_use since construction or the last ResetPeakStats().
  int64_t peak_blocks_in_use = 0;
  // Successful AllocateBlock calls, and how many of them a cached block served.
  int64_t block_allocations = 0;
  int64_t cache_hits = 0;
  // Blocks taken from and given back to the upstream.
  int64_t upstream_allocations = 0;
  int64_t upstream_deallocations = 0;

  int64_t in_use_bytes() const { return blocks_in_use * block_bytes; }
  int64_t cached_bytes() const { return cached_blocks * block_bytes; }
};

class ChunkBlockPool final : public MemoryResource, public Reclaimer {
 public:
  // Returns InvalidArgument, naming the option, for a null upstream, a non-positive block_bytes or
  // max_blocks, a negative max_cached_blocks, or a tracker of another device. `upstream` is not
  // owned and must outlive the pool.
  static absl::StatusOr<std::unique_ptr<ChunkBlockPool>> Create(
      MemoryResource* upstream, const ChunkBlockPoolOptions& options);

  ChunkBlockPool(const ChunkBlockPool&) = delete;
  ChunkBlockPool& operator=(const ChunkBlockPool&) = delete;

  // Returns every block, cached or still in use, to the upstream (logging a warning for blocks
  // still in use: their owners now hold dangling pointers).
  ~ChunkBlockPool() override;

  // Returns a block of block_bytes() bytes: a cached one if there is one (the most recently freed),
  // otherwise a new one from the upstream. ResourceExhausted when max_blocks blocks are held, or
  // when the upstream is out of memory; the message names the device, the block size, the pool's
  // counts and the limit that was hit.
  [[nodiscard]] absl::StatusOr<void*> AllocateBlock();

  // Gives back a block from AllocateBlock(). It is cached for reuse (or returned upstream when
  // max_cached_blocks are already cached). InvalidArgument, with no state changed, for a pointer
  // that is not a block in use.
  [[nodiscard]] absl::Status DeallocateBlock(void* block);

  int64_t block_bytes() const { return block_bytes_; }
  std::optional<int64_t> max_blocks() const { return max_blocks_; }
  ChunkBlockPoolStats stats() const;
  // Sets peak_blocks_in_use to the current blocks_in_use.
  void ResetPeakStats();

  // MemoryResource. Allocate(bytes) with 0 < bytes <= block_bytes() returns a whole block;
  // larger requests are InvalidArgument (a chunk pool serves chunks only). Deallocate(ptr, bytes)
  // takes back a block; `bytes` must be in (0, block_bytes()].
  [[nodiscard]] absl::StatusOr<void*> Allocate(int64_t bytes) override;
  [[nodiscard]] absl::Status Deallocate(void* ptr, int64_t bytes) override;
  Device device() const override { return device_; }
  // "chunk_block_pool(accelerator:0)".
  std::string name() const override { return name_; }

  // Reclaimer: returns every cached block to the upstream; returns the bytes given back.
  int64_t ReleaseCached() override;

 private:
  ChunkBlockPool(MemoryResource* upstream, const ChunkBlockPoolOptions& options);

  // AllocateBlock, with the caller's request (<= block_bytes_) named in error messages.
  absl::StatusOr<void*> AllocateBlockFor(int64_t request_bytes);
  // Moves the most recently cached block into use. REQUIRES: cache_ is not empty.
  void* TakeCachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers `block` as in use.
  void MarkInUseLocked(void* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MemoryResource* const upstream_;
  const Device device_;
  const std::string name_;
  const int64_t block_bytes_;
  const std::optional<int64_t> max_blocks_;
  const std::optional<int64_t> max_cached_blocks_;
  MemoryTracker* const tracker_;
  const MemoryKind tracked_kind_;

  mutable Mutex mu_;
  absl::flat_hash_set<void*> in_use_ ABSL_GUARDED_BY(mu_);
  // Freed blocks, most recently freed last.
  std::vector<void*> cache_ ABSL_GUARDED_BY(mu_);
  // Upstream allocations in flight (counted against max_blocks).
  int64_t pending_upstream_ ABSL_GUARDED_BY(mu_) = 0;
  ChunkBlockPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CHUNK_BLOCK_POOL_H_
