#include "memory/resources.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"
#include "memory/memory_tracker.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAllocationAlignment == 0; }

std::unique_ptr<Backend> MakeCpuBackend(int64_t capacity_bytes, int device_index = 0) {
  CpuBackendOptions options;
  options.device_index = device_index;
  options.capacity_bytes = capacity_bytes;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(options);
  EXPECT_OK(backend);
  return std::move(backend).value();
}

// A stand-in for a pool: holds allocations of `resource` as "cached" and gives them back on
// ReleaseCached().
class FakeCache final : public Reclaimer {
 public:
  explicit FakeCache(MemoryResource* resource) : resource_(resource) {}
  ~FakeCache() override { ReleaseCached(); }

  absl::Status Fill(int64_t bytes) {
    absl::StatusOr<void*> p = resource_->Allocate(bytes);
    if (!p.ok()) return p.status();
    std::lock_guard<std::mutex> lock(mu_);
    held_.emplace_back(*p, bytes);
    return absl::OkStatus();
  }

  int64_t ReleaseCached() override {
    std::vector<std::pair<void*, int64_t>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held.swap(held_);
    }
    int64_t released_bytes = 0;
    for (const auto& [p, bytes] : held) {
      EXPECT_OK(resource_->Deallocate(p, bytes));
      released_bytes += bytes;
    }
    return released_bytes;
  }

  int64_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& held : held_) n += held.second;
    return n;
  }

 private:
  MemoryResource* const resource_;
  std::mutex mu_;
  std::vector<std::pair<void*, int64_t>> held_;
};

// --- HostResource -------------------------------------------------------------------------------

TEST(HostResourceTest, AllocatesAlignedWritableMemoryAndCountsIt) {
  HostResource host;
  EXPECT_EQ(host.device(), Device::Host());
  EXPECT_EQ(host.name(), "host_resource(host)");
  EXPECT_EQ(host.capacity_bytes(), std::nullopt);
  ASSERT_OK_AND_ASSIGN(void* a, host.Allocate(1));
  ASSERT_OK_AND_ASSIGN(void* b, host.Allocate(1000));
  EXPECT_TRUE(Aligned(a));
  EXPECT_TRUE(Aligned(b));
  std::memset(b, 0x5a, 1000);
  ProviderResourceStats stats = host.stats();
  EXPECT_EQ(stats.in_use_bytes, 256 + 1024);
  EXPECT_EQ(stats.live_allocations, 2);
  EXPECT_EQ(stats.total_allocations, 2);
  ASSERT_OK(host.Deallocate(a, 1));
  stats = host.stats();
  EXPECT_EQ(stats.in_use_bytes, 1024);
  EXPECT_EQ(stats.peak_in_use_bytes, 256 + 1024);
  host.ResetPeakStats();
  EXPECT_EQ(host.stats().peak_in_use_bytes, 1024);
  ASSERT_OK(host.Deallocate(b, 1000));
  EXPECT_EQ(host.in_use_bytes(), 0);
}

TEST(HostResourceTest, NonPositiveAndAbsurdRequests) {
  HostResource host;
  EXPECT_THAT(host.Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument, "at least 1 byte"));
  EXPECT_THAT(host.Allocate(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(host.Allocate(int64_t{1} << 62), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(HostResourceTest, BadDeallocationsAreInvalidArgumentAndChangeNothing) {
  HostResource host;
  ASSERT_OK_AND_ASSIGN(void* a, host.Allocate(512));
  ASSERT_OK_AND_ASSIGN(void* b, host.Allocate(512));
  ASSERT_OK(host.Deallocate(b, 512));
  int on_stack = 0;
  EXPECT_THAT(host.Deallocate(&on_stack, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a live allocation"));
  EXPECT_THAT(host.Deallocate(b, 512), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(host.Deallocate(a, 256),
              StatusIs(absl::StatusCode::kInvalidArgument, "allocated with 512 bytes"));
  EXPECT_EQ(host.stats().live_allocations, 1);
  EXPECT_EQ(host.in_use_bytes(), 512);
  ASSERT_OK(host.Deallocate(a, 512));
}

TEST(HostResourceTest, CapIsResourceExhaustedWithAnActionableMessage) {
  HostResource host(kMiB);
  EXPECT_EQ(host.capacity_bytes(), kMiB);
  ASSERT_OK_AND_ASSIGN(void* a, host.Allocate(768 * kKiB));
  EXPECT_THAT(host.Allocate(512 * kKiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host: out of memory"), HasSubstr("512.00 KiB"),
                             HasSubstr("768.00 KiB of its 1.00 MiB capacity is in use"),
                             HasSubstr("capacity_bytes"))));
  EXPECT_EQ(host.stats().failed_allocations, 1);
  // What fits still fits, and everything fits again after a free.
  ASSERT_OK_AND_ASSIGN(void* b, host.Allocate(256 * kKiB));
  ASSERT_OK(host.Deallocate(a, 768 * kKiB));
  ASSERT_OK_AND_ASSIGN(void* c, host.Allocate(512 * kKiB));
  ASSERT_OK(host.Deallocate(b, 256 * kKiB));
  ASSERT_OK(host.Deallocate(c, 512 * kKiB));
}

TEST(HostResourceTest, ReclaimersAreAskedBeforeGivingUp) {
  HostResource host(kMiB);
  FakeCache first(&host);
  FakeCache second(&host);
  host.AddReclaimer(&first, "first_pool");
  host.AddReclaimer(&second, "second_pool");
  ASSERT_OK(first.Fill(512 * kKiB));
  ASSERT_OK(second.Fill(256 * kKiB));
  // 768 KiB is cached by the two fakes: a 512 KiB request succeeds once the first one released
  // its 512 KiB; the second is not asked (reclaimers run in order, each only if still needed).
  ASSERT_OK_AND_ASSIGN(void* p, host.Allocate(512 * kKiB));
  ProviderResourceStats stats = host.stats();
  EXPECT_EQ(stats.reclaim_rounds, 1);
  EXPECT_EQ(stats.reclaimed_bytes, 512 * kKiB);
  EXPECT_EQ(stats.in_use_bytes, 768 * kKiB);
  EXPECT_EQ(second.cached_bytes(), 256 * kKiB);

  // When releasing is not enough, the message says what each pool gave back.
  ASSERT_OK(first.Fill(128 * kKiB));
  EXPECT_THAT(host.Allocate(768 * kKiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("768.00 KiB"), HasSubstr("first_pool 128.00 KiB"),
                             HasSubstr("second_pool 256.00 KiB"), HasSubstr("1.00 MiB capacity"))));
  ASSERT_OK(second.Fill(128 * kKiB));
  EXPECT_THAT(host.Allocate(768 * kKiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("first_pool 0 B"), HasSubstr("second_pool 128.00 KiB"))));
  host.RemoveReclaimer(&first);
  host.RemoveReclaimer(&second);
  ASSERT_OK(second.Fill(512 * kKiB));
  EXPECT_THAT(host.Allocate(512 * kKiB), StatusIs(absl::StatusCode::kResourceExhausted,
                                                  AllOf(HasSubstr("no pool holds memory cached"),
                                                        Not(HasSubstr("second_pool")))));
  ASSERT_OK(host.Deallocate(p, 512 * kKiB));
}

TEST(HostResourceTest, ConcurrentAllocationsUnderACapWithReclaiming) {
  constexpr int kThreads = 4;
  HostResource host(64 * kKiB);
  FakeCache cache(&host);
  host.AddReclaimer(&cache, "fake_cache");
  std::vector<std::thread> threads;
  std::vector<int> errors(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 300; ++i) {
        const int64_t bytes = 1 + static_cast<int64_t>(rng() % (8 * kKiB));
        if (rng() % 3 == 0) {
          const absl::Status status = cache.Fill(bytes);
          if (!status.ok() && !absl::IsResourceExhausted(status)) ++errors[t];
          continue;
        }
        absl::StatusOr<void*> p = host.Allocate(bytes);
        if (!p.ok()) {
          if (!absl::IsResourceExhausted(p.status())) ++errors[t];
          continue;
        }
        std::memset(*p, t, static_cast<size_t>(bytes));
        if (!host.Deallocate(*p, bytes).ok()) ++errors[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], 0);
  cache.ReleaseCached();
  EXPECT_EQ(host.in_use_bytes(), 0);
  EXPECT_LE(host.stats().peak_in_use_bytes, 64 * kKiB);
  host.RemoveReclaimer(&cache);
}

TEST(HostResourceDeathTest, NonPositiveCapIsABug) {
  EXPECT_DEATH(HostResource(0), "capacity_bytes must be positive");
}

// --- BackendDeviceResource ----------------------------------------------------------------------

TEST(BackendDeviceResourceTest, AllocatesBackendDeviceMemory) {
  auto backend = MakeCpuBackend(4 * kMiB, /*device_index=*/1);
  BackendDeviceResource device(backend.get());
  EXPECT_EQ(device.device(), Device::Accelerator(1));
  EXPECT_EQ(device.name(), "backend_device_resource(accelerator:1)");
  EXPECT_EQ(device.effective_capacity_bytes(), 4 * kMiB);
  ASSERT_OK_AND_ASSIGN(void* p, device.Allocate(100 * kKiB));
  EXPECT_TRUE(Aligned(p));
  EXPECT_EQ(backend->allocated_bytes(), 100 * kKiB);
  EXPECT_EQ(device.in_use_bytes(), 100 * kKiB);
  // A pointer the backend knows but this resource did not hand out is still foreign to it.
  ASSERT_OK_AND_ASSIGN(void* raw, backend->AllocateDevice(kKiB));
  EXPECT_THAT(device.Deallocate(raw, kKiB), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(backend->FreeDevice(raw));
  ASSERT_OK(device.Deallocate(p, 100 * kKiB));
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

TEST(BackendDeviceResourceTest, OutOfMemoryNamesDeviceRequestCapAndBackendUse) {
  auto backend = MakeCpuBackend(kMiB);
  BackendDeviceResource device(backend.get());
  FakeCache cache(&device);
  device.AddReclaimer(&cache, "chunk_block_pool(accelerator:0)");
  ASSERT_OK(cache.Fill(256 * kKiB));
  ASSERT_OK_AND_ASSIGN(void* p, device.Allocate(512 * kKiB));
  EXPECT_THAT(device.Allocate(768 * kKiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("accelerator:0: out of memory"), HasSubstr("768.00 KiB"),
                             HasSubstr("512.00 KiB of its 1.00 MiB capacity is in use"),
                             HasSubstr("the cpu backend has 512.00 KiB of 1.00 MiB allocated"),
                             HasSubstr("chunk_block_pool(accelerator:0) 256.00 KiB"),
                             HasSubstr("CpuBackendOptions.capacity_bytes"))));
  ASSERT_OK(device.Deallocate(p, 512 * kKiB));
  device.RemoveReclaimer(&cache);
}

TEST(BackendDeviceResourceTest, BudgetBelowTheBackendCapacity) {
  auto backend = MakeCpuBackend(4 * kMiB);
  BackendDeviceResource device(backend.get(), kMiB);
  EXPECT_EQ(device.capacity_bytes(), kMiB);
  EXPECT_EQ(device.effective_capacity_bytes(), kMiB);
  ASSERT_OK_AND_ASSIGN(void* p, device.Allocate(kMiB));
  EXPECT_THAT(device.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted,
                                           HasSubstr("1.00 MiB of its 1.00 MiB capacity")));
  EXPECT_EQ(backend->allocated_bytes(), kMiB);  // the backend was not even asked
  ASSERT_OK(device.Deallocate(p, kMiB));
}

TEST(BackendDeviceResourceTest, DestructionFreesWhatIsStillLive) {
  auto backend = MakeCpuBackend(kMiB);
  {
    BackendDeviceResource device(backend.get());
    ASSERT_OK(device.Allocate(300 * kKiB).status());
  }
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

// --- PinnedHostResource -------------------------------------------------------------------------

TEST(PinnedHostResourceTest, AllocatesPinnedHostMemoryUnderACap) {
  auto backend = MakeCpuBackend(kMiB);
  PinnedHostResource pinned(backend.get(), 2 * kMiB);
  EXPECT_EQ(pinned.device(), Device::Host());
  EXPECT_EQ(pinned.name(), "pinned_host_resource(host)");
  ASSERT_OK_AND_ASSIGN(void* p, pinned.Allocate(3 * kMiB / 2));
  EXPECT_TRUE(Aligned(p));
  std::memset(p, 1, 3 * kMiB / 2);
  EXPECT_EQ(backend->allocated_bytes(), 0);  // pinned memory is not device memory
  EXPECT_THAT(pinned.Allocate(kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host"), HasSubstr("2.00 MiB capacity"),
                             HasSubstr("pinned = false"))));
  int on_stack = 0;
  EXPECT_THAT(pinned.Deallocate(&on_stack, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(pinned.Deallocate(p, 3 * kMiB / 2));
  EXPECT_THAT(pinned.Deallocate(p, 3 * kMiB / 2), StatusIs(absl::StatusCode::kInvalidArgument));
}

// --- TrackingResource ---------------------------------------------------------------------------

TEST(TrackingResourceTest, RecordsSuccessfulCallsOnly) {
  HostResource host(kMiB);
  MemoryTracker tracker(Device::Host());
  TrackingResource tracked(&host, &tracker, MemoryKind::kNonModelData);
  EXPECT_EQ(tracked.device(), Device::Host());
  EXPECT_EQ(tracked.name(), "tracking(non_model_data, host_resource(host))");
  EXPECT_EQ(tracked.upstream(), &host);
  ASSERT_OK_AND_ASSIGN(void* a, tracked.Allocate(1000));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 1024);
  EXPECT_THAT(tracked.Allocate(kMiB), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(tracked.Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 1024);
  int on_stack = 0;
  EXPECT_THAT(tracked.Deallocate(&on_stack, 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 1024);
  ASSERT_OK(tracked.Deallocate(a, 1000));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 0);
  EXPECT_EQ(tracker.peak_bytes(MemoryKind::kNonModelData), 1024);
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kModelData), 0);
}

TEST(TrackingResourceDeathTest, TrackerOfAnotherDeviceIsABug) {
  HostResource host;
  MemoryTracker tracker(Device::Accelerator(0));
  EXPECT_DEATH(TrackingResource(&host, &tracker, MemoryKind::kModelData),
               "tracker accounts accelerator:0");
}

}  // namespace
}  // namespace ps
