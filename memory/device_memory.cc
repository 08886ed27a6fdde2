#include "memory/device_memory.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"

namespace ps {
namespace {

// Checks the options every device shares.
absl::Status ValidateCommon(const DeviceMemoryOptions& options) {
  if (options.chunk_block_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMemoryOptions.chunk_block_bytes must be positive (the bytes of one chunk "
        "payload), got ",
        options.chunk_block_bytes));
  }
  if (options.max_chunk_blocks.has_value() && *options.max_chunk_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceMemoryOptions.max_chunk_blocks must be positive when set, got ",
                     *options.max_chunk_blocks));
  }
  for (size_t i = 0; i < options.more_chunk_block_bytes.size(); ++i) {
    const int64_t bytes = options.more_chunk_block_bytes[i];
    bool repeated = bytes == options.chunk_block_bytes;
    for (size_t j = 0; j < i; ++j) repeated |= options.more_chunk_block_bytes[j] == bytes;
    if (bytes <= 0 || repeated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeviceMemoryOptions.more_chunk_block_bytes[", i, "] = ", bytes,
          " must be positive and differ from chunk_block_bytes (", options.chunk_block_bytes,
          ") and from the other entries (one pool per block size)"));
    }
  }
  if (options.capacity_bytes.has_value() && *options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceMemoryOptions.capacity_bytes must be positive when set, got ",
                     *options.capacity_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMemory>> DeviceMemory::Assemble(
    std::unique_ptr<ProviderResource> upstream, Backend* backend,
    const DeviceMemoryOptions& options) {
  const std::optional<int64_t> capacity_bytes = upstream->effective_capacity_bytes();
  if (capacity_bytes.has_value() && options.chunk_block_bytes > *capacity_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMemoryOptions.chunk_block_bytes = ", FormatBytes(options.chunk_block_bytes),
        " does not fit in the ", FormatBytes(*capacity_bytes), " capacity of ",
        upstream->device().ToString(), "; use smaller chunks or a larger capacity_bytes"));
  }
  auto memory = std::unique_ptr<DeviceMemory>(new DeviceMemory(upstream->device()));
  memory->tracker_ = std::make_unique<MemoryTracker>(upstream->device());
  memory->upstream_ = std::move(upstream);

  ChunkBlockPoolOptions pool_options;
  pool_options.block_bytes = options.chunk_block_bytes;
  pool_options.max_blocks = options.max_chunk_blocks;
  pool_options.tracker = memory->tracker_.get();
  pool_options.tracked_kind = MemoryKind::kModelData;
  ASSIGN_OR_RETURN(memory->chunk_pool_,
                   ChunkBlockPool::Create(memory->upstream_.get(), pool_options));
  for (int64_t bytes : options.more_chunk_block_bytes) {
    if (capacity_bytes.has_value() && bytes > *capacity_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceMemoryOptions.more_chunk_block_bytes: ", FormatBytes(bytes),
                       " does not fit in the ", FormatBytes(*capacity_bytes), " capacity of ",
                       memory->upstream_->device().ToString()));
    }
    pool_options.block_bytes = bytes;
    ASSIGN_OR_RETURN(std::unique_ptr<ChunkBlockPool> pool,
                     ChunkBlockPool::Create(memory->upstream_.get(), pool_options));
    memory->more_chunk_pools_.push_back(std::move(pool));
  }

  CachingAllocatorOptions scratch_options = options.scratch;
  scratch_options.tracker = memory->tracker_.get();
  scratch_options.tracked_kind = MemoryKind::kNonModelData;
  scratch_options.event_backend = backend;
  absl::StatusOr<std::unique_ptr<CachingAllocator>> scratch =
      CachingAllocator::Create(memory->upstream_.get(), scratch_options);
  if (!scratch.ok()) {
    return absl::Status(scratch.status().code(),
                        absl::StrCat("DeviceMemoryOptions.scratch: ", scratch.status().message()));
  }
  memory->scratch_ = *std::move(scratch);

  for (ChunkBlockPool* pool : memory->chunk_pools()) {
    memory->upstream_->AddReclaimer(
        pool, memory->more_chunk_pools_.empty()
                  ? pool->name()
                  : absl::StrCat(pool->name(), "[", FormatBytes(pool->block_bytes()), " blocks]"));
  }
  memory->upstream_->AddReclaimer(memory->scratch_.get(), memory->scratch_->name());
  return memory;
}

DeviceMemory::~DeviceMemory() {
  if (upstream_ == nullptr) return;
  if (chunk_pool_ != nullptr) {
    for (ChunkBlockPool* pool : chunk_pools()) upstream_->RemoveReclaimer(pool);
  }
  if (scratch_ != nullptr) upstream_->RemoveReclaimer(scratch_.get());
  // Members go in reverse order: scratch_, the pools (returning their memory), upstream_,
  // tracker_.
}

std::vector<ChunkBlockPool*> DeviceMemory::chunk_pools() const {
  std::vector<ChunkBlockPool*> pools = {chunk_pool_.get()};
  for (const auto& pool : more_chunk_pools_) pools.push_back(pool.get());
  std::sort(pools.begin(), pools.end(), [](const ChunkBlockPool* a, const ChunkBlockPool* b) {
    return a->block_bytes() < b->block_bytes();
  });
  return pools;
}

ChunkBlockPool* DeviceMemory::chunk_pool_for(int64_t bytes) const {
  ChunkBlockPool* best = nullptr;
  for (ChunkBlockPool* pool : chunk_pools()) {
    if (pool->block_bytes() >= bytes &&
        (best == nullptr || pool->block_bytes() < best->block_bytes())) {
      best = pool;
    }
  }
  return best;
}

int64_t DeviceMemory::ReleaseCached() {
  int64_t released = 0;
  for (ChunkBlockPool* pool : chunk_pools()) released += pool->ReleaseCached();
  return released + scratch_->ReleaseCached();
}

DeviceMemoryStats DeviceMemory::stats() const {
  DeviceMemoryStats stats;
  stats.device = device_;
  stats.capacity_bytes = capacity_bytes();
  stats.usage = tracker_->Snapshot();
  stats.upstream = upstream_->stats();
  stats.chunk_pool = chunk_pool_->stats();
  for (ChunkBlockPool* pool : chunk_pools()) stats.chunk_pools.push_back(pool->stats());
  stats.scratch = scratch_->stats();
  return stats;
}

std::string DeviceMemory::DebugString() const {
  const DeviceMemoryStats s = stats();
  std::string pools;
  for (const ChunkBlockPoolStats& p : s.chunk_pools) {
    absl::StrAppend(
        &pools, "\n  chunk blocks of ", FormatBytes(p.block_bytes), ": ", p.blocks_in_use,
        " in use, ", p.cached_blocks, " cached, peak ", p.peak_blocks_in_use,
        chunk_pool_->max_blocks().has_value() ? absl::StrCat(", limit ", *chunk_pool_->max_blocks())
                                              : std::string());
  }
  return absl::StrCat(
      device_.ToString(), " memory (", upstream_->name(),
      "): ", FormatBytes(s.upstream.in_use_bytes), " taken of ",
      s.capacity_bytes.has_value() ? FormatBytes(*s.capacity_bytes) : std::string("unlimited"),
      " (peak ", FormatBytes(s.upstream.peak_in_use_bytes), ")\n  in use: ", s.usage.DebugString(),
      pools, "\n  scratch: ", s.scratch.DebugString());
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateAcceleratorMemory(
    Backend* backend, const DeviceMemoryOptions& options) {
  if (backend == nullptr) {
    return absl::InvalidArgumentError("CreateAcceleratorMemory: the backend is null");
  }
  RETURN_IF_ERROR(ValidateCommon(options));
  if (options.capacity_bytes.has_value() && *options.capacity_bytes > backend->capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMemoryOptions.capacity_bytes = ", FormatBytes(*options.capacity_bytes),
        " is more than ", backend->device().ToString(), " has (",
        FormatBytes(backend->capacity_bytes()), "); leave it unset to use the whole device"));
  }
  return DeviceMemory::Assemble(
      std::make_unique<BackendDeviceResource>(backend, options.capacity_bytes), backend, options);
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateHostMemory(Backend* backend,
                                                               const DeviceMemoryOptions& options) {
  RETURN_IF_ERROR(ValidateCommon(options));
  if (options.pinned) {
    if (backend == nullptr) {
      return absl::InvalidArgumentError(
          "DeviceMemoryOptions.pinned is true but no backend was given to allocate pinned "
          "memory; pass the backend or set pinned = false");
    }
    return DeviceMemory::Assemble(
        std::make_unique<PinnedHostResource>(backend, options.capacity_bytes), backend, options);
  }
  return DeviceMemory::Assemble(std::make_unique<HostResource>(options.capacity_bytes), backend,
                                options);
}

}  // namespace ps
