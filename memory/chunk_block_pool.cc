#include "memory/chunk_block_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {
namespace {

std::string PointerString(const void* ptr) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkBlockPool>> ChunkBlockPool::Create(
    MemoryResource* upstream, const ChunkBlockPoolOptions& options) {
  if (upstream == nullptr) {
    return absl::InvalidArgumentError("ChunkBlockPool: the upstream resource is null");
  }
  if (options.block_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkBlockPool: block_bytes must be positive (the chunk payload size), got ",
                     options.block_bytes));
  }
  if (options.max_blocks.has_value() && *options.max_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkBlockPool: max_blocks must be positive when set, got ", *options.max_blocks));
  }
  if (options.max_cached_blocks.has_value() && *options.max_cached_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkBlockPool: max_cached_blocks must be >= 0 when set, got ",
                     *options.max_cached_blocks));
  }
  if (options.tracker != nullptr && options.tracker->device() != upstream->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkBlockPool: tracker accounts ", options.tracker->device().ToString(),
                     " but ", upstream->name(), " allocates on ", upstream->device().ToString()));
  }
  return std::unique_ptr<ChunkBlockPool>(new ChunkBlockPool(upstream, options));
}

ChunkBlockPool::ChunkBlockPool(MemoryResource* upstream, const ChunkBlockPoolOptions& options)
    : upstream_(upstream),
      device_(upstream->device()),
      name_(absl::StrCat("chunk_block_pool(", upstream->device().ToString(), ")")),
      block_bytes_(options.block_bytes),
      max_blocks_(options.max_blocks),
      max_cached_blocks_(options.max_cached_blocks),
      tracker_(options.tracker),
      tracked_kind_(options.tracked_kind) {
  stats_.block_bytes = block_bytes_;
}

ChunkBlockPool::~ChunkBlockPool() {
  std::vector<void*> blocks;
  {
    MutexLock lock(&mu_);
    if (!in_use_.empty()) {
      LOG(WARNING) << name_ << " destroyed with " << in_use_.size()
                   << " blocks still in use; returning them upstream";
      if (tracker_ != nullptr) tracker_->Subtract(tracked_kind_, stats_.in_use_bytes());
    }
    blocks.assign(in_use_.begin(), in_use_.end());
    blocks.insert(blocks.end(), cache_.begin(), cache_.end());
    in_use_.clear();
    cache_.clear();
  }
  for (void* block : blocks) {
    const absl::Status status = upstream_->Deallocate(block, block_bytes_);
    LOG_IF(ERROR, !status.ok()) << name_ << ": returning a block at destruction: " << status;
  }
}

ChunkBlockPoolStats ChunkBlockPool::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void ChunkBlockPool::ResetPeakStats() {
  MutexLock lock(&mu_);
  stats_.peak_blocks_in_use = stats_.blocks_in_use;
}

void ChunkBlockPool::MarkInUseLocked(void* block) {
  const bool inserted = in_use_.insert(block).second;
  CHECK(inserted) << name_ << ": block " << block << " handed out twice";
  ++stats_.blocks_in_use;
  ++stats_.block_allocations;
  stats_.peak_blocks_in_use = std::max(stats_.peak_blocks_in_use, stats_.blocks_in_use);
  if (tracker_ != nullptr) tracker_->Add(tracked_kind_, block_bytes_);
}

void* ChunkBlockPool::TakeCachedLocked() {
  void* block = cache_.back();
  cache_.pop_back();
  --stats_.cached_blocks;
  ++stats_.cache_hits;
  MarkInUseLocked(block);
  return block;
}

absl::StatusOr<void*> ChunkBlockPool::AllocateBlock() { return AllocateBlockFor(block_bytes_); }

absl::StatusOr<void*> ChunkBlockPool::AllocateBlockFor(int64_t request_bytes) {
  {
    MutexLock lock(&mu_);
    if (!cache_.empty()) return TakeCachedLocked();
    if (max_blocks_.has_value() && stats_.blocks_in_use + pending_upstream_ >= *max_blocks_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          device_.ToString(), ": out of memory: ", name_, " cannot allocate ",
          FormatBytes(request_bytes), " (one ", FormatBytes(block_bytes_), " block): all ",
          *max_blocks_, " blocks of its limit (max_blocks = ", *max_blocks_, ", ",
          FormatBytes(*max_blocks_ * block_bytes_),
          " capacity) are in use. Raise max_blocks "
          "(DeviceMemoryOptions.max_chunk_blocks) or keep fewer chunks on this device"));
    }
    ++pending_upstream_;
  }
  // Without the lock: the upstream may ask this pool to ReleaseCached() before it gives up.
  absl::StatusOr<void*> block = upstream_->Allocate(block_bytes_);
  MutexLock lock(&mu_);
  --pending_upstream_;
  if (!block.ok()) {
    // Another thread may have freed a block while the upstream was busy.
    if (!cache_.empty() && absl::IsResourceExhausted(block.status())) return TakeCachedLocked();
    return absl::Status(
        block.status().code(),
        absl::StrCat(name_, " cannot allocate ", FormatBytes(request_bytes), " (a new ",
                     FormatBytes(block_bytes_), " block; ", stats_.blocks_in_use,
                     " blocks are in use and none is cached): ", block.status().message()));
  }
  ++stats_.upstream_allocations;
  MarkInUseLocked(*block);
  return *block;
}

absl::Status ChunkBlockPool::DeallocateBlock(void* block) {
  {
    MutexLock lock(&mu_);
    if (in_use_.erase(block) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": DeallocateBlock(", PointerString(block),
          "): not a block in use from this pool (it belongs to another resource or was freed "
          "already)"));
    }
    --stats_.blocks_in_use;
    if (tracker_ != nullptr) tracker_->Subtract(tracked_kind_, block_bytes_);
    if (!max_cached_blocks_.has_value() ||
        static_cast<int64_t>(cache_.size()) < *max_cached_blocks_) {
      cache_.push_back(block);
      ++stats_.cached_blocks;
      return absl::OkStatus();
    }
    ++stats_.upstream_deallocations;
  }
  return upstream_->Deallocate(block, block_bytes_);
}

absl::StatusOr<void*> ChunkBlockPool::Allocate(int64_t bytes) {
  if (bytes <= 0 || bytes > block_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": cannot allocate ", bytes,
                     " bytes; this pool serves requests of 1 to ", block_bytes_,
                     " bytes (one chunk block). Allocate other buffers from the device's "
                     "caching allocator"));
  }
  return AllocateBlockFor(bytes);
}

absl::Status ChunkBlockPool::Deallocate(void* ptr, int64_t bytes) {
  if (bytes <= 0 || bytes > block_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": Deallocate(", PointerString(ptr), ", ",
                                                   bytes,
                                                   " bytes): no block of this pool "
                                                   "was allocated with that size"));
  }
  return DeallocateBlock(ptr);
}

int64_t ChunkBlockPool::ReleaseCached() {
  std::vector<void*> blocks;
  {
    MutexLock lock(&mu_);
    blocks.swap(cache_);
    stats_.cached_blocks = 0;
    stats_.upstream_deallocations += static_cast<int64_t>(blocks.size());
  }
  for (void* block : blocks) {
    const absl::Status status = upstream_->Deallocate(block, block_bytes_);
    LOG_IF(ERROR, !status.ok()) << name_ << ": returning a cached block upstream: " << status;
  }
  return static_cast<int64_t>(blocks.size()) * block_bytes_;
}

}  // namespace ps
