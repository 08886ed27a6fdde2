#include "memory/cpu_backend.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/sanitizers.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
#include "memory/host_memory_info.h"
#include "memory/testing/backend_conformance.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(
    Cpu, BackendConformanceTest,
    ::testing::Values(
        BackendFactory{"cpu", [] { return CreateCpuBackend({.capacity_bytes = 256 * kMiB}); }},
        BackendFactory{"cpu_bandwidth_capped",
                       [] {
                         return CreateCpuBackend({.device_index = 1,
                                                  .capacity_bytes = 128 * kMiB,
                                                  .copy_bandwidth_bytes_per_s = 20e9});
                       }},
        BackendFactory{"cpu_via_factory",
                       [] { return CreateBackend({.kind = "cpu", .capacity_bytes = 64 * kMiB}); }},
        // Every stream holds its work until the host waits: the Backend contract still holds.
        BackendFactory{"cpu_stalled_until_host_waits",
                       [] {
                         return CreateCpuBackend({.capacity_bytes = 128 * kMiB,
                                                  .stall_streams_until_host_waits = true});
                       }}),
    BackendFactoryName);

TEST(CpuBackend, RejectsBadOptions) {
  EXPECT_THAT(CreateCpuBackend({}), StatusIs(absl::StatusCode::kInvalidArgument, "capacity_bytes"));
  EXPECT_THAT(CreateCpuBackend({.capacity_bytes = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateCpuBackend({.capacity_bytes = kMiB, .copy_bandwidth_bytes_per_s = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "bandwidth"));
  EXPECT_THAT(CreateCpuBackend({.device_index = -1, .capacity_bytes = kMiB}),
              StatusIs(absl::StatusCode::kInvalidArgument, "device_index"));
}

TEST(CpuBackend, FactoryExplainsUnknownAndUnbuiltBackends) {
  EXPECT_THAT(CreateBackend({.kind = "tpu", .capacity_bytes = kMiB}),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"cpu\" or \"cuda\""));
  if (!CudaBackendCompiledIn()) {
    EXPECT_THAT(CreateBackend({.kind = "cuda"}),
                StatusIs(absl::StatusCode::kFailedPrecondition, "--config=cuda"));
  }
}

TEST(CpuBackend, OutOfMemoryMessageNamesDeviceRequestCapAndUse) {
  ASSERT_OK_AND_ASSIGN(auto backend,
                       CreateCpuBackend({.device_index = 3, .capacity_bytes = 4 * kMiB}));
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(3 * kMiB));
  absl::StatusOr<void*> over = backend->AllocateDevice(2 * kMiB);
  EXPECT_THAT(over.status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("accelerator:3"), HasSubstr("2.00 MiB"),
                                        HasSubstr("3.00 MiB"), HasSubstr("4.00 MiB"))));
  EXPECT_EQ(backend->allocated_bytes(), 3 * kMiB);
  EXPECT_OK(backend->FreeDevice(p));
}

TEST(CpuBackend, StreamMayOutliveBackend) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  std::atomic<bool> ran{false};
  backend.reset();
  ASSERT_OK(stream->LaunchHostFunc([&] { ran = true; }));
  ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(ran.load());
}

TEST(CpuBackend, EventRecordedOnTwoStreamsTracksTheLatestRecording) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto slow, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto fast, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto event, backend->CreateEvent());
  std::atomic<bool> release{false};
  ASSERT_OK(slow->LaunchHostFunc([&] {
    while (!release.load()) absl::SleepFor(absl::Milliseconds(1));
  }));
  ASSERT_OK(slow->RecordEvent(event.get()));  // generation 1: blocked
  ASSERT_OK(fast->RecordEvent(event.get()));  // generation 2: completes at once
  ASSERT_OK(fast->Synchronize());
  // The event reflects its latest recording, which is done.
  EXPECT_TRUE(event->Query());
  release.store(true);
  ASSERT_OK(slow->Synchronize());
}

// --- Asynchronous errors ------------------------------------------------------------------------

TEST(CpuBackend, CheckedHostFuncErrorsSurfaceAtSynchronizeAndStick) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto before, backend->CreateEvent());
  ASSERT_OK_AND_ASSIGN(auto after, backend->CreateEvent());
  std::atomic<int> ran{0};
  ASSERT_OK(LaunchCheckedHostFunc(*stream, [&] {
    ++ran;
    return absl::OkStatus();
  }));
  ASSERT_OK(stream->RecordEvent(before.get()));
  // Enqueuing succeeds: the failure happens later, on the stream's thread.
  ASSERT_OK(LaunchCheckedHostFunc(*stream, [&] {
    ++ran;
    return absl::InvalidArgumentError("token 70000 at index 3 is outside the vocabulary");
  }));
  ASSERT_OK(LaunchCheckedHostFunc(*stream, [&] {
    ++ran;
    return absl::InternalError("a second failure is not reported over the first");
  }));
  ASSERT_OK(stream->LaunchHostFunc([&] { ++ran; }));
  ASSERT_OK(stream->RecordEvent(after.get()));
  EXPECT_THAT(stream->Synchronize(), StatusIs(absl::StatusCode::kInvalidArgument, "token 70000"));
  EXPECT_EQ(ran.load(), 4);  // later work still ran
  EXPECT_OK(before->Synchronize());
  EXPECT_THAT(after->Synchronize(), StatusIs(absl::StatusCode::kInvalidArgument, "token 70000"));
  // Sticky: the stream keeps reporting it.
  EXPECT_THAT(stream->Synchronize(), StatusIs(absl::StatusCode::kInvalidArgument));
  // Other streams are unaffected.
  ASSERT_OK_AND_ASSIGN(auto other, backend->CreateStream());
  ASSERT_OK(other->RecordEvent(after.get()));
  EXPECT_OK(other->Synchronize());
  EXPECT_OK(after->Synchronize());
}

class ForeignStream final : public Stream {
 public:
  absl::Status MemcpyAsync(void*, const void*, int64_t, CopyKind) override {
    return absl::OkStatus();
  }
  absl::Status MemsetAsync(void*, int, int64_t) override { return absl::OkStatus(); }
  absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&>) override { return absl::OkStatus(); }
  absl::Status RecordEvent(Event*) override { return absl::OkStatus(); }
  absl::Status WaitEvent(Event*) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  void* native_handle() override { return this; }
};

TEST(CpuBackend, HooksRefuseStreamsOfOtherBackends) {
  ForeignStream foreign;
  EXPECT_THAT(LaunchCheckedHostFunc(foreign, [] { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "cpu backend"));
  EXPECT_THAT(StallCpuStream(foreign), StatusIs(absl::StatusCode::kInvalidArgument, "cpu backend"));
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  EXPECT_THAT(LaunchCheckedHostFunc(*stream, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
}

TEST(CpuBackend, CheckCpuDeviceRangeAcceptsOnlyLiveDeviceMemory) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(1000));  // rounded to 1024
  auto* bytes = static_cast<char*>(p);
  EXPECT_OK(CheckCpuDeviceRange(*backend, p, 1024, "x"));
  EXPECT_OK(CheckCpuDeviceRange(*backend, bytes + 1000, 24, "x"));
  EXPECT_OK(CheckCpuDeviceRange(*backend, bytes + 1024, 0, "x"));
  EXPECT_THAT(CheckCpuDeviceRange(*backend, bytes + 1000, 25, "LayerNormForward x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "LayerNormForward x"));
  std::vector<float> host(16);
  EXPECT_THAT(CheckCpuDeviceRange(*backend, host.data(), 64, "w"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not inside device memory"));
  EXPECT_THAT(CheckCpuDeviceRange(*backend, p, -1, "w"),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  ASSERT_OK(backend->FreeDevice(p));
  EXPECT_THAT(CheckCpuDeviceRange(*backend, p, 4, "freed"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// --- The cache of freed device blocks -----------------------------------------------------------

constexpr bool kSanitized = kAsan || kTsan;

CpuBackendMemoryStats MemoryStats(const Backend& backend) {
  absl::StatusOr<CpuBackendMemoryStats> stats = GetCpuBackendMemoryStats(backend);
  EXPECT_OK(stats);
  return stats.ok() ? *stats : CpuBackendMemoryStats{};
}

TEST(CpuBackendCache, FreedBlocksAreReusedWithoutMappingAgain) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 8 * kMiB}));
  ASSERT_OK_AND_ASSIGN(void* a, backend->AllocateDevice(kMiB));
  ASSERT_OK(backend->FreeDevice(a));
  CpuBackendMemoryStats s = MemoryStats(*backend);
  EXPECT_EQ(s.cached_bytes, kMiB);
  EXPECT_EQ(s.mapped_bytes, kMiB);
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_EQ(backend->allocated_bytes(), 0);
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK_AND_ASSIGN(void* b, backend->AllocateDevice(kMiB - 100));  // the same rounded size
    EXPECT_EQ(b, a);
    ASSERT_OK(backend->FreeDevice(b));
  }
  s = MemoryStats(*backend);
  EXPECT_EQ(s.allocations, 11);
  EXPECT_EQ(s.cache_hits, 10);
  EXPECT_EQ(s.blocks_mapped, 1);
  EXPECT_EQ(s.blocks_unmapped, 0);
  EXPECT_EQ(s.peak_mapped_bytes, kMiB);
  // Another size: the cached block is grown (or, under AddressSanitizer, unmapped for a new one:
  // 2 MiB live after a 1 MiB peak leaves no room to keep it).
  ASSERT_OK_AND_ASSIGN(void* c, backend->AllocateDevice(2 * kMiB));
  s = MemoryStats(*backend);
  EXPECT_EQ(s.blocks_mapped, kAsan ? 2 : 1);
  EXPECT_EQ(s.grow_reuses, kAsan ? 0 : 1);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.mapped_bytes, 2 * kMiB);
  ASSERT_OK(backend->FreeDevice(c));
  // Explicit release.
  EXPECT_THAT(ReleaseCpuDeviceCache(*backend), IsOkAndHolds(2 * kMiB));
  s = MemoryStats(*backend);
  EXPECT_EQ(s.mapped_bytes, 0);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(s.explicit_releases, 1);
}

// A request of another size reuses mapped pages too: the front of a larger cached block (the
// rest stays cached, still refused as a copy target), or a smaller one grown in place.
TEST(CpuBackendCache, OtherSizesSplitALargerBlockOrGrowASmallerOne) {
  if (kAsan) GTEST_SKIP() << "under AddressSanitizer blocks come from the heap: exact sizes only";
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 16 * kMiB}));
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(4 * kMiB));
  std::memset(p, 0x5a, 4 * kMiB);
  ASSERT_OK(backend->FreeDevice(p));
  ASSERT_OK_AND_ASSIGN(void* front, backend->AllocateDevice(kMiB));
  EXPECT_EQ(front, p);
  EXPECT_EQ(static_cast<unsigned char*>(front)[kMiB - 1], 0x5a) << "the same pages";
  CpuBackendMemoryStats s = MemoryStats(*backend);
  EXPECT_EQ(s.split_reuses, 1);
  EXPECT_EQ(s.cached_bytes, 3 * kMiB);
  EXPECT_EQ(s.mapped_bytes, 4 * kMiB);
  char* rest = static_cast<char*>(p) + kMiB;
  EXPECT_THAT(CheckCpuDeviceRange(*backend, rest, 1, "rest"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckCpuDeviceRange(*backend, front, kMiB + 1, "front"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(void* back, backend->AllocateDevice(3 * kMiB));
  EXPECT_EQ(back, rest);
  EXPECT_EQ(MemoryStats(*backend).cache_hits, 1);
  ASSERT_OK(backend->FreeDevice(front));
  ASSERT_OK(backend->FreeDevice(back));
  // 6 MiB: the 3 MiB block grows; the 1 MiB one is unmapped (mapped stays <= the 6 MiB peak).
  ASSERT_OK_AND_ASSIGN(void* grown, backend->AllocateDevice(6 * kMiB));
  s = MemoryStats(*backend);
  EXPECT_EQ(s.grow_reuses, 1);
  EXPECT_EQ(s.blocks_mapped, 1);
  EXPECT_EQ(static_cast<unsigned char*>(grown)[3 * kMiB - 1], 0x5a) << "kept its pages";
  EXPECT_EQ(static_cast<unsigned char*>(grown)[6 * kMiB - 1], 0) << "a new tail";
  EXPECT_EQ(s.mapped_bytes, 6 * kMiB);
  EXPECT_EQ(s.cached_bytes, 0) << "mapped <= the highest live total (6 MiB now)";
  EXPECT_OK(CheckCpuDeviceRange(*backend, grown, 6 * kMiB, "grown"));
  ASSERT_OK(backend->FreeDevice(grown));
}

TEST(CpuBackendCache, MaxCachedBytesBoundsTheCacheAndZeroTurnsItOff) {
  EXPECT_THAT(CreateCpuBackend({.capacity_bytes = kMiB, .max_cached_bytes = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_cached_bytes"));
  ASSERT_OK_AND_ASSIGN(auto off,
                       CreateCpuBackend({.capacity_bytes = 8 * kMiB, .max_cached_bytes = 0}));
  ASSERT_OK_AND_ASSIGN(void* a, off->AllocateDevice(kMiB));
  ASSERT_OK(off->FreeDevice(a));
  EXPECT_EQ(MemoryStats(*off).mapped_bytes, 0);
  EXPECT_EQ(MemoryStats(*off).blocks_unmapped, 1);

  ASSERT_OK_AND_ASSIGN(
      auto small, CreateCpuBackend({.capacity_bytes = 8 * kMiB, .max_cached_bytes = 3 * kMiB}));
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(void* p, small->AllocateDevice(kMiB));
    blocks.push_back(p);
  }
  for (void* p : blocks) ASSERT_OK(small->FreeDevice(p));
  EXPECT_EQ(MemoryStats(*small).cached_bytes, 3 * kMiB);
  EXPECT_EQ(MemoryStats(*small).mapped_bytes, 3 * kMiB);
  EXPECT_THAT(GetCpuBackendMemoryStats(*small), IsOk());
}

// The cap counts live bytes: whatever is cached, every request succeeds or fails exactly as on a
// backend without a cache, with the same bytes in use, and the cache never holds the host memory
// above the highest live total.
TEST(CpuBackendCache, CapIsEnforcedIdenticallyWithAWarmCache) {
  constexpr int64_t kCap = 6 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto cached, CreateCpuBackend({.capacity_bytes = kCap}));
  ASSERT_OK_AND_ASSIGN(auto plain,
                       CreateCpuBackend({.capacity_bytes = kCap, .max_cached_bytes = 0}));
  // A warm cache first: the whole cap allocated and freed.
  {
    std::vector<void*> all;
    for (int i = 0; i < 6; ++i) {
      ASSERT_OK_AND_ASSIGN(void* p, cached->AllocateDevice(kMiB));
      all.push_back(p);
    }
    for (void* p : all) ASSERT_OK(cached->FreeDevice(p));
    ASSERT_EQ(MemoryStats(*cached).cached_bytes, kCap);
  }
  std::mt19937 rng(7);
  const int64_t sizes[] = {64 * kKiB, 256 * kKiB, kMiB, 2 * kMiB, 3 * kMiB, 5 * kMiB};
  std::vector<std::pair<void*, void*>> live;  // (cached backend's, plain backend's)
  for (int step = 0; step < 400; ++step) {
    if (!live.empty() && rng() % 2 == 0) {
      const size_t i = rng() % live.size();
      ASSERT_OK(cached->FreeDevice(live[i].first));
      ASSERT_OK(plain->FreeDevice(live[i].second));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const int64_t bytes = sizes[rng() % std::size(sizes)];
      absl::StatusOr<void*> a = cached->AllocateDevice(bytes);
      absl::StatusOr<void*> b = plain->AllocateDevice(bytes);
      ASSERT_EQ(a.ok(), b.ok()) << "step " << step << ", " << bytes << " bytes: " << a.status()
                                << " vs " << b.status();
      if (a.ok()) {
        live.emplace_back(*a, *b);
      } else {
        EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
      }
    }
    ASSERT_EQ(cached->allocated_bytes(), plain->allocated_bytes()) << "step " << step;
    const CpuBackendMemoryStats s = MemoryStats(*cached);
    ASSERT_EQ(s.mapped_bytes, s.live_bytes + s.cached_bytes);
    ASSERT_LE(s.mapped_bytes, s.peak_live_bytes);
    ASSERT_LE(s.peak_mapped_bytes, kCap);
  }
  EXPECT_GT(MemoryStats(*cached).cache_hits, 50);
  for (auto [a, b] : live) {
    ASSERT_OK(cached->FreeDevice(a));
    ASSERT_OK(plain->FreeDevice(b));
  }
}

TEST(CpuBackendCache, ACachedBlockIsRefusedAsACopyTargetUntilAllocatedAgain) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 4 * kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  std::vector<char> host(kMiB, 7);
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(kMiB));
  ASSERT_OK(backend->FreeDevice(p));
  ASSERT_EQ(MemoryStats(*backend).cached_blocks, 1);
  EXPECT_THAT(stream->MemcpyAsync(p, host.data(), kMiB, CopyKind::kHostToDevice),
              StatusIs(absl::StatusCode::kInvalidArgument, "destination"));
  EXPECT_THAT(stream->MemcpyAsync(host.data(), p, 64, CopyKind::kDeviceToHost),
              StatusIs(absl::StatusCode::kInvalidArgument, "source"));
  EXPECT_THAT(stream->MemsetAsync(p, 0, 64), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckCpuDeviceRange(*backend, p, 4, "freed"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(backend->FreeDevice(p), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(void* again, backend->AllocateDevice(kMiB));
  ASSERT_EQ(again, p);
  EXPECT_OK(stream->MemcpyAsync(again, host.data(), kMiB, CopyKind::kHostToDevice));
  EXPECT_OK(stream->Synchronize());
  EXPECT_EQ(static_cast<char*>(again)[kMiB - 1], 7);
  ASSERT_OK(backend->FreeDevice(again));
}

TEST(CpuBackendCache, UseAfterFreeOfACachedBlockIsReportedUnderAddressSanitizer) {
  if (!kAsan) GTEST_SKIP() << "AddressSanitizer only";
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 4 * kMiB}));
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(kMiB));
  ASSERT_OK(backend->FreeDevice(p));
  ASSERT_EQ(MemoryStats(*backend).cached_blocks, 1);
  volatile char* bytes = static_cast<char*>(p);
  EXPECT_DEATH(bytes[100] = 1, "use-after-poison");
}

TEST(CpuBackendCache, TheCacheIsEmptiedWhenTheHostRunsLow) {
  auto available = std::make_shared<std::atomic<int64_t>>(int64_t{64} << 30);
  std::atomic<int> probes{0};
  ASSERT_OK_AND_ASSIGN(auto backend,
                       CreateCpuBackend({.capacity_bytes = 8 * kMiB,
                                         .host_low_memory_bytes = 100 * kMiB,
                                         .host_memory_check_interval = absl::ZeroDuration(),
                                         .host_available_bytes = [available, &probes] {
                                           probes.fetch_add(1);
                                           return available->load();
                                         }}));
  ASSERT_OK_AND_ASSIGN(void* a, backend->AllocateDevice(kMiB));
  ASSERT_OK_AND_ASSIGN(void* b, backend->AllocateDevice(2 * kMiB));
  ASSERT_OK(backend->FreeDevice(a));
  EXPECT_EQ(MemoryStats(*backend).cached_bytes, kMiB);  // plenty available: kept
  EXPECT_EQ(probes.load(), 1);
  available->store(-1);  // unknown: kept
  ASSERT_OK_AND_ASSIGN(void* c, backend->AllocateDevice(kMiB));
  ASSERT_OK(backend->FreeDevice(c));
  EXPECT_EQ(MemoryStats(*backend).cached_bytes, kMiB);
  EXPECT_EQ(probes.load(), 2);
  available->store(50 * kMiB);  // below the 100 MiB mark: everything cached goes
  ASSERT_OK(backend->FreeDevice(b));
  const CpuBackendMemoryStats s = MemoryStats(*backend);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.mapped_bytes, 0);
  EXPECT_EQ(s.pressure_releases, 1);
  EXPECT_EQ(s.blocks_unmapped, 2);
}

TEST(CpuBackendCache, CachedPagesLeaveTheProcessOnReleaseAndAtDestruction) {
  if (kSanitized) GTEST_SKIP() << "resident sizes are checked without sanitizers only";
  constexpr int64_t kBytes = 64 * kMiB;
  auto resident = [] {
    absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo();
    EXPECT_OK(info);
    return info.ok() ? info->process_resident_bytes : 0;
  };
  for (bool destroy : {false, true}) {
    const int64_t before = resident();
    ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kBytes}));
    ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(kBytes));
    std::memset(p, 1, kBytes);
    ASSERT_OK(backend->FreeDevice(p));
    EXPECT_GE(resident() - before, kBytes - 8 * kMiB) << "a cached block stays resident";
    if (destroy) {
      backend.reset();
    } else {
      ASSERT_THAT(ReleaseCpuDeviceCache(*backend), IsOkAndHolds(kBytes));
    }
    EXPECT_LT(resident() - before, 8 * kMiB) << (destroy ? "destroyed" : "released");
  }
}

// Several threads allocate and free through one backend: no block is ever handed out twice, and
// the accounting adds up afterwards.
TEST(CpuBackendCache, ConcurrentAllocateAndFreeFromSeveralThreads) {
  constexpr int64_t kCap = 6 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kCap}));
  constexpr int kThreads = 4;
  std::atomic<int64_t> exhausted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&backend, &exhausted, t] {
      std::mt19937 rng(100 + t);
      const int64_t sizes[] = {64 * kKiB, 128 * kKiB, 512 * kKiB, kMiB};
      for (int i = 0; i < 150; ++i) {
        const int64_t bytes = sizes[rng() % std::size(sizes)];
        absl::StatusOr<void*> p = backend->AllocateDevice(bytes);
        if (!p.ok()) {
          EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          exhausted.fetch_add(1);
          continue;
        }
        auto* data = static_cast<unsigned char*>(*p);
        std::memset(data, t + 1, static_cast<size_t>(bytes));
        std::this_thread::yield();
        EXPECT_EQ(data[0], t + 1);
        EXPECT_EQ(data[bytes - 1], t + 1);
        EXPECT_OK(backend->FreeDevice(*p));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const CpuBackendMemoryStats s = MemoryStats(*backend);
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_EQ(s.mapped_bytes, s.cached_bytes);
  EXPECT_EQ(s.allocations, s.reuses() + s.blocks_mapped);
  EXPECT_EQ(s.allocations + exhausted.load(), kThreads * 150);
  EXPECT_GT(s.cache_hits, 0);
  EXPECT_LE(s.peak_mapped_bytes, kCap);
}

// --- Making the host run ahead ------------------------------------------------------------------

TEST(CpuBackend, StalledWorkWaitsForTheHostToWait) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto event, backend->CreateEvent());
  std::atomic<int> ran{0};
  ASSERT_OK(stream->LaunchHostFunc([&] { ++ran; }));  // before the stall: not held
  ASSERT_OK(stream->Synchronize());
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*stream));
  EXPECT_TRUE(stall->active());
  EXPECT_THAT(StallCpuStream(*stream), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(stream->LaunchHostFunc([&] { ++ran; }));
  ASSERT_OK(stream->RecordEvent(event.get()));
  // Held, however long the host takes, and polling is not waiting.
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(event->Query());
  EXPECT_EQ(ran.load(), 1);
  // The host waits: the stall ends.
  ASSERT_OK(event->Synchronize());
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(stall->active());
  // Work enqueued after the stall ended is not held.
  absl::Notification third;
  ASSERT_OK(stream->LaunchHostFunc([&] { third.Notify(); }));
  EXPECT_TRUE(third.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // The stream may be stalled again.
  ASSERT_OK_AND_ASSIGN(auto again, StallCpuStream(*stream));
  EXPECT_TRUE(again->active());
}

TEST(CpuBackend, ReleaseEndsAStallWithoutAHostWait) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*stream));
  absl::Notification ran;
  ASSERT_OK(stream->LaunchHostFunc([&] { ran.Notify(); }));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(ran.HasBeenNotified());
  stall->Release();
  EXPECT_FALSE(stall->active());
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  stall->Release();  // idempotent
}

TEST(CpuBackend, AHostWaitOnAnyStreamEndsTheStall) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stalled, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto other, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto event, backend->CreateEvent());
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*stalled));
  std::atomic<bool> produced{false};
  ASSERT_OK(stalled->LaunchHostFunc([&] { produced = true; }));
  ASSERT_OK(stalled->RecordEvent(event.get()));
  // `other` waits on the stalled work on the device side; the host then waits for `other`. Were
  // the stall kept, this would deadlock.
  ASSERT_OK(other->WaitEvent(event.get()));
  std::atomic<bool> consumer_saw{false};
  ASSERT_OK(other->LaunchHostFunc([&] { consumer_saw = produced.load(); }));
  ASSERT_OK(other->Synchronize());
  EXPECT_TRUE(consumer_saw.load());
  EXPECT_FALSE(stall->active());
}

// The pattern that exposes a missing cross-stream wait (e.g. an optimizer stream reading
// gradients a compute stream still writes): with the producer stalled, the reader that does not
// wait reads the old value every time; the one that waits on an event reads the new one.
TEST(CpuBackend, AStallMakesAMissingCrossStreamWaitDeterministic) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto compute, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto reader, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto done, backend->CreateEvent());
  ASSERT_OK_AND_ASSIGN(void* grad, backend->AllocateDevice(sizeof(float)));
  auto* g = static_cast<float*>(grad);
  for (bool reader_waits : {false, true}) {
    ASSERT_OK(compute->MemsetAsync(grad, 0, sizeof(float)));
    ASSERT_OK(compute->Synchronize());
    ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*compute));
    ASSERT_OK(compute->LaunchHostFunc([g] { *g = 42.0f; }));  // "backward" writes the gradient
    ASSERT_OK(compute->RecordEvent(done.get()));
    if (reader_waits) {
      ASSERT_OK(reader->WaitEvent(done.get()));
    }
    float seen = -1;
    std::promise<void> read;
    std::future<void> read_done = read.get_future();
    ASSERT_OK(reader->LaunchHostFunc([g, &seen, &read] {  // "Adam" reads it
      seen = *g;
      read.set_value();
    }));
    if (reader_waits) {
      // The host wait ends the stall; the reader runs after the write.
      ASSERT_OK(reader->Synchronize());
    } else {
      // No host wait on any stream (one would end the stall and race the write): the reader runs
      // while the producer is still held.
      read_done.wait();
    }
    EXPECT_EQ(seen, reader_waits ? 42.0f : 0.0f) << "reader_waits=" << reader_waits;
    ASSERT_OK(reader->Synchronize());
    ASSERT_OK(compute->Synchronize());
  }
  ASSERT_OK(backend->FreeDevice(grad));
}

TEST(CpuBackend, StallAllModeHoldsEveryStreamUntilTheHostWaits) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB,
                                                       .stall_streams_until_host_waits = true}));
  ASSERT_OK_AND_ASSIGN(auto a, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto b, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(256));
  auto* value = static_cast<int*>(p);
  *value = 1;
  // A kernel reads `value`; the host then overwrites it without waiting (the bug). The kernel
  // reads the host's new value every time, not only when the scheduler happens to interleave.
  std::atomic<int> read{0};
  ASSERT_OK(a->LaunchHostFunc([&read, value] { read = *value; }));
  ASSERT_OK(b->LaunchHostFunc([] {}));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(read.load(), 0);
  *value = 2;
  ASSERT_OK(b->Synchronize());  // a host wait on another stream releases `a` too
  ASSERT_OK(a->Synchronize());
  EXPECT_EQ(read.load(), 2);
  ASSERT_OK(backend->FreeDevice(p));
}

TEST(CpuBackend, StallMayOutliveItsStreamAndBackend) {
  std::unique_ptr<CpuStreamStall> stall;
  std::atomic<bool> ran{false};
  {
    ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
    ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
    ASSERT_OK_AND_ASSIGN(stall, StallCpuStream(*stream));
    ASSERT_OK(stream->LaunchHostFunc([&] { ran = true; }));
    // Destroying the stream drains it (a host wait).
  }
  EXPECT_TRUE(ran.load());
  EXPECT_FALSE(stall->active());
  stall->Release();
}

}  // namespace
}  // namespace ps
