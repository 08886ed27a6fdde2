// Runs the MemoryResource conformance suite against every implementation in memory/.
#include "memory/testing/memory_resource_conformance.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/chunk_block_pool.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/memory_tracker.h"
#include "memory/resources.h"

namespace ps {
namespace {

using Factory = std::function<absl::StatusOr<std::unique_ptr<ResourceUnderTest>>()>;

MemoryResourceConformanceParam Param(std::string name, int64_t max_request_bytes,
                                     std::optional<int64_t> capacity_bytes, Factory factory) {
  MemoryResourceConformanceParam param;
  param.name = std::move(name);
  param.max_request_bytes = max_request_bytes;
  param.capacity_bytes = capacity_bytes;
  param.factory = std::move(factory);
  return param;
}

absl::StatusOr<Backend*> OwnCpuBackend(ResourceUnderTest* r, int64_t capacity_bytes) {
  CpuBackendOptions options;
  options.capacity_bytes = capacity_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCpuBackend(options));
  return r->Own(std::move(backend));
}

// Keeps a reclaimer registered with a resource while it lives.
class ReclaimerRegistration {
 public:
  ReclaimerRegistration(ProviderResource* resource, Reclaimer* reclaimer, std::string name)
      : resource_(resource), reclaimer_(reclaimer) {
    resource_->AddReclaimer(reclaimer_, std::move(name));
  }
  ReclaimerRegistration(const ReclaimerRegistration&) = delete;
  ReclaimerRegistration& operator=(const ReclaimerRegistration&) = delete;
  ~ReclaimerRegistration() { resource_->RemoveReclaimer(reclaimer_); }

 private:
  ProviderResource* const resource_;
  Reclaimer* const reclaimer_;
};

// --- Providers ----------------------------------------------------------------------------------

MemoryResourceConformanceParam Host() {
  return Param("Host", 4 * kMiB, std::nullopt,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 r->set_resource(r->Own(std::make_unique<HostResource>()));
                 return r;
               });
}

MemoryResourceConformanceParam HostCapped() {
  return Param("HostCapped", 2 * kMiB, 8 * kMiB,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 r->set_resource(r->Own(std::make_unique<HostResource>(8 * kMiB)));
                 return r;
               });
}

MemoryResourceConformanceParam BackendDevice() {
  return Param("BackendDevice", 4 * kMiB, 32 * kMiB,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 ASSIGN_OR_RETURN(Backend * backend, OwnCpuBackend(r.get(), 32 * kMiB));
                 r->set_resource(r->Own(std::make_unique<BackendDeviceResource>(backend)));
                 return r;
               });
}

MemoryResourceConformanceParam BackendDeviceBudget() {
  return Param(
      "BackendDeviceBudget", 2 * kMiB, 8 * kMiB,
      []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
        auto r = std::make_unique<ResourceUnderTest>();
        ASSIGN_OR_RETURN(Backend * backend, OwnCpuBackend(r.get(), 32 * kMiB));
        r->set_resource(r->Own(std::make_unique<BackendDeviceResource>(backend, 8 * kMiB)));
        return r;
      });
}

MemoryResourceConformanceParam PinnedHost() {
  return Param("PinnedHost", 4 * kMiB, std::nullopt,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 ASSIGN_OR_RETURN(Backend * backend, OwnCpuBackend(r.get(), kMiB));
                 r->set_resource(r->Own(std::make_unique<PinnedHostResource>(backend)));
                 return r;
               });
}

MemoryResourceConformanceParam PinnedHostCapped() {
  return Param("PinnedHostCapped", 2 * kMiB, 8 * kMiB,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 ASSIGN_OR_RETURN(Backend * backend, OwnCpuBackend(r.get(), kMiB));
                 r->set_resource(r->Own(std::make_unique<PinnedHostResource>(backend, 8 * kMiB)));
                 return r;
               });
}

// --- Adaptors and pools -------------------------------------------------------------------------

MemoryResourceConformanceParam Tracking() {
  return Param("TrackingOverCappedHost", 2 * kMiB, 8 * kMiB,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 auto* host = r->Own(std::make_unique<HostResource>(8 * kMiB));
                 auto* tracker = r->Own(std::make_unique<MemoryTracker>(Device::Host()));
                 r->set_resource(r->Own(
                     std::make_unique<TrackingResource>(host, tracker, MemoryKind::kNonModelData)));
                 return r;
               });
}

MemoryResourceConformanceParam ChunkPool(std::string name, int64_t block_bytes,
                                         std::optional<int64_t> host_cap_bytes,
                                         std::optional<int64_t> max_blocks) {
  std::optional<int64_t> capacity_bytes = host_cap_bytes;
  if (max_blocks.has_value()) capacity_bytes = *max_blocks * block_bytes;
  MemoryResourceConformanceParam param =
      Param(std::move(name), block_bytes, capacity_bytes,
            [=]() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
              auto r = std::make_unique<ResourceUnderTest>();
              auto* host = r->Own(std::make_unique<HostResource>(host_cap_bytes));
              ChunkBlockPoolOptions options;
              options.block_bytes = block_bytes;
              options.max_blocks = max_blocks;
              ASSIGN_OR_RETURN(std::unique_ptr<ChunkBlockPool> pool,
                               ChunkBlockPool::Create(host, options));
              r->set_resource(r->Own(std::move(pool)));
              return r;
            });
  param.granularity_bytes = block_bytes;
  return param;
}

MemoryResourceConformanceParam CachingOverHost(std::string name, CachingAllocatorOptions options,
                                               int64_t max_request_bytes,
                                               std::optional<int64_t> host_cap_bytes) {
  return Param(std::move(name), max_request_bytes, host_cap_bytes,
               [=]() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 auto* host = r->Own(std::make_unique<HostResource>(host_cap_bytes));
                 ASSIGN_OR_RETURN(std::unique_ptr<CachingAllocator> allocator,
                                  CachingAllocator::Create(host, options));
                 r->set_resource(r->Own(std::move(allocator)));
                 return r;
               });
}

CachingAllocatorOptions TinyCachingOptions() {
  CachingAllocatorOptions options;
  options.round_bytes = 256;
  options.small_request_max_bytes = 4 * kKiB;
  options.small_segment_bytes = 8 * kKiB;
  options.large_segment_round_bytes = 8 * kKiB;
  return options;
}

MemoryResourceConformanceParam CachingOverCappedDevice() {
  return Param("CachingAllocatorOverCappedDevice", 4 * kMiB, 16 * kMiB,
               []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
                 auto r = std::make_unique<ResourceUnderTest>();
                 ASSIGN_OR_RETURN(Backend * backend, OwnCpuBackend(r.get(), 16 * kMiB));
                 auto* device = r->Own(std::make_unique<BackendDeviceResource>(backend));
                 ASSIGN_OR_RETURN(std::unique_ptr<CachingAllocator> allocator,
                                  CachingAllocator::Create(device));
                 CachingAllocator* raw = r->Own(std::move(allocator));
                 // Owned after the allocator, so it unregisters before the allocator goes.
                 r->Own(std::make_unique<ReclaimerRegistration>(device, raw, raw->name()));
                 r->set_resource(raw);
                 return r;
               });
}

// --- DeviceMemory's pools -----------------------------------------------------------------------

enum class Pool { kChunks, kScratch };

MemoryResourceConformanceParam AcceleratorMemory(std::string name, Pool pool,
                                                 int64_t max_request_bytes) {
  constexpr int64_t kCapacity = 8 * kMiB;
  constexpr int64_t kBlockBytes = 256 * kKiB;
  MemoryResourceConformanceParam param = Param(
      std::move(name), max_request_bytes, kCapacity,
      [=]() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
        auto r = std::make_unique<ResourceUnderTest>();
        ASSIGN_OR_RETURN(Backend * backend, OwnCpuBackend(r.get(), kCapacity));
        DeviceMemoryOptions options;
        options.chunk_block_bytes = kBlockBytes;
        ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> memory,
                         CreateAcceleratorMemory(backend, options));
        DeviceMemory* raw = r->Own(std::move(memory));
        r->set_resource(pool == Pool::kChunks ? static_cast<MemoryResource*>(raw->chunk_pool())
                                              : static_cast<MemoryResource*>(raw->scratch()));
        return r;
      });
  if (pool == Pool::kChunks) param.granularity_bytes = kBlockBytes;
  return param;
}

MemoryResourceConformanceParam HostMemory(std::string name, Pool pool, bool pinned,
                                          std::optional<int64_t> capacity_bytes,
                                          int64_t max_request_bytes) {
  constexpr int64_t kBlockBytes = 128 * kKiB;
  MemoryResourceConformanceParam param = Param(
      std::move(name), max_request_bytes, capacity_bytes,
      [=]() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
        auto r = std::make_unique<ResourceUnderTest>();
        Backend* backend = nullptr;
        if (pinned) {
          ASSIGN_OR_RETURN(backend, OwnCpuBackend(r.get(), kMiB));
        }
        DeviceMemoryOptions options;
        options.chunk_block_bytes = kBlockBytes;
        options.pinned = pinned;
        options.capacity_bytes = capacity_bytes;
        ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> memory, CreateHostMemory(backend, options));
        DeviceMemory* raw = r->Own(std::move(memory));
        r->set_resource(pool == Pool::kChunks ? static_cast<MemoryResource*>(raw->chunk_pool())
                                              : static_cast<MemoryResource*>(raw->scratch()));
        return r;
      });
  if (pool == Pool::kChunks) param.granularity_bytes = kBlockBytes;
  return param;
}

INSTANTIATE_TEST_SUITE_P(Providers, MemoryResourceConformanceTest,
                         ::testing::Values(Host(), HostCapped(), BackendDevice(),
                                           BackendDeviceBudget(), PinnedHost(), PinnedHostCapped()),
                         MemoryResourceConformanceParamName);

INSTANTIATE_TEST_SUITE_P(
    Pools, MemoryResourceConformanceTest,
    ::testing::Values(Tracking(),
                      ChunkPool("ChunkBlockPool", 64 * kKiB, std::nullopt, std::nullopt),
                      ChunkPool("ChunkBlockPoolMaxBlocks", 64 * kKiB, std::nullopt, 32),
                      ChunkPool("ChunkBlockPoolOverCappedHost", 64 * kKiB, kMiB, std::nullopt),
                      CachingOverHost("CachingAllocatorOverHost", CachingAllocatorOptions{},
                                      8 * kMiB, std::nullopt),
                      CachingOverHost("CachingAllocatorTinyOverCappedHost", TinyCachingOptions(),
                                      32 * kKiB, 256 * kKiB),
                      CachingOverCappedDevice()),
    MemoryResourceConformanceParamName);

INSTANTIATE_TEST_SUITE_P(
    DeviceMemoryPools, MemoryResourceConformanceTest,
    ::testing::Values(AcceleratorMemory("AcceleratorChunkPool", Pool::kChunks, 256 * kKiB),
                      AcceleratorMemory("AcceleratorScratch", Pool::kScratch, 2 * kMiB),
                      HostMemory("PinnedHostChunkPool", Pool::kChunks, /*pinned=*/true, 4 * kMiB,
                                 128 * kKiB),
                      HostMemory("PageableHostScratch", Pool::kScratch, /*pinned=*/false,
                                 std::nullopt, 4 * kMiB)),
    MemoryResourceConformanceParamName);

}  // namespace
}  // namespace ps
