#include "memory/device_memory.h"

#include <utility>

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

  memory->upstream_->AddReclaimer(memory->chunk_pool_.get(), memory->chunk_pool_->name());
  memory->upstream_->AddReclaimer(memory->scratch_.get(), memory->scratch_->name());
  return memory;
}

DeviceMemory::~DeviceMemory() {
  if (upstream_ == nullptr) return;
  if (chunk_pool_ != nullptr) upstream_->RemoveReclaimer(chunk_pool_.get());
  if (scratch_ != nullptr) upstream_->RemoveReclaimer(scratch_.get());
  // Members go in reverse order: scratch_, chunk_pool_ (returning their memory), upstream_,
  // tracker_.
}

int64_t DeviceMemory::ReleaseCached() {
  return chunk_pool_->ReleaseCached() + scratch_->ReleaseCached();
}

DeviceMemoryStats DeviceMemory::stats() const {
  DeviceMemoryStats stats;
  stats.device = device_;
  stats.capacity_bytes = capacity_bytes();
  stats.usage = tracker_->Snapshot();
  stats.upstream = upstream_->stats();
  stats.chunk_pool = chunk_pool_->stats();
  stats.scratch = scratch_->stats();
  return stats;
}

std::string DeviceMemory::DebugString() const {
  const DeviceMemoryStats s = stats();
  return absl::StrCat(
      device_.ToString(), " memory (", upstream_->name(),
      "): ", FormatBytes(s.upstream.in_use_bytes), " taken of ",
      s.capacity_bytes.has_value() ? FormatBytes(*s.capacity_bytes) : std::string("unlimited"),
      " (peak ", FormatBytes(s.upstream.peak_in_use_bytes), ")\n  in use: ", s.usage.DebugString(),
      "\n  chunk blocks of ", FormatBytes(s.chunk_pool.block_bytes), ": ",
      s.chunk_pool.blocks_in_use, " in use, ", s.chunk_pool.cached_blocks, " cached, peak ",
      s.chunk_pool.peak_blocks_in_use,
      chunk_pool_->max_blocks().has_value() ? absl::StrCat(", limit ", *chunk_pool_->max_blocks())
                                            : std::string(),
      "\n  scratch: ", s.scratch.DebugString());
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
