#include "memory/testing/backend_conformance.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"

namespace ps {

using ::testing::HasSubstr;

void BackendConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = GetParam().create();
  if (absl::IsUnavailable(backend.status())) {
    GTEST_SKIP() << GetParam().name << " backend unavailable here: " << backend.status().message();
  }
  ASSERT_OK(backend.status());
  backend_ = std::move(backend).value();
  ASSERT_GE(backend_->capacity_bytes(), 64 * kMiB);
}

namespace {

std::vector<uint8_t> RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Device buffer freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend* backend, int64_t bytes) : backend_(backend) {
    absl::StatusOr<void*> p = backend->AllocateDevice(bytes);
    EXPECT_OK(p.status());
    if (p.ok()) ptr_ = *p;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      EXPECT_OK(backend_->FreeDevice(ptr_));
    }
  }
  void* get() const { return ptr_; }

 private:
  Backend* backend_;
  void* ptr_ = nullptr;
};

// Pinned host buffer freed at scope exit. Copies that must stay asynchronous behind a held stream
// use it: CUDA may run a pageable-memory cudaMemcpyAsync synchronously (its "API sync behavior"),
// so a pageable copy queued behind a stream the test itself releases later can deadlock.
class PinnedBuffer {
 public:
  PinnedBuffer(Backend* backend, int64_t bytes) : backend_(backend), bytes_(bytes) {
    absl::StatusOr<void*> p = backend->AllocatePinnedHost(bytes);
    EXPECT_OK(p.status());
    if (p.ok()) ptr_ = static_cast<uint8_t*>(*p);
  }
  ~PinnedBuffer() {
    if (ptr_ != nullptr) {
      EXPECT_OK(backend_->FreePinnedHost(ptr_));
    }
  }
  uint8_t* get() const { return ptr_; }
  std::vector<uint8_t> ToVector() const { return std::vector<uint8_t>(ptr_, ptr_ + bytes_); }

 private:
  Backend* backend_;
  int64_t bytes_;
  uint8_t* ptr_ = nullptr;
};

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendConformanceTest);

TEST_P(BackendConformanceTest, AllocationsAreAlignedAndAccounted) {
  EXPECT_TRUE(backend_->device().is_accelerator());
  const int64_t before = backend_->allocated_bytes();
  std::vector<void*> ptrs;
  int64_t expected = 0;
  for (int64_t bytes : {1, 255, 256, 257, 4096, 1 << 20, 3 * (1 << 20) + 7}) {
    ASSERT_OK_AND_ASSIGN(void* p, backend_->AllocateDevice(bytes));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
    expected += AlignUp(bytes, 256);
    ptrs.push_back(p);
  }
  EXPECT_EQ(backend_->allocated_bytes() - before, expected);
  EXPECT_GE(backend_->counters().peak_device_allocated_bytes, expected);
  for (void* p : ptrs) EXPECT_OK(backend_->FreeDevice(p));
  EXPECT_EQ(backend_->allocated_bytes(), before);
}

TEST_P(BackendConformanceTest, BadSizesAndPointersAreInvalidArgument) {
  EXPECT_THAT(backend_->AllocateDevice(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(backend_->AllocateDevice(-5), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(backend_->AllocatePinnedHost(0), StatusIs(absl::StatusCode::kInvalidArgument));
  int on_stack = 0;
  EXPECT_THAT(backend_->FreeDevice(&on_stack), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(backend_->FreePinnedHost(&on_stack), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(void* p, backend_->AllocateDevice(1024));
  EXPECT_OK(backend_->FreeDevice(p));
  EXPECT_THAT(backend_->FreeDevice(p), StatusIs(absl::StatusCode::kInvalidArgument, "double free"));
}

TEST_P(BackendConformanceTest, OverCapacityIsResourceExhaustedAndRecoverable) {
  const int64_t cap = backend_->capacity_bytes();
  EXPECT_THAT(backend_->AllocateDevice(cap + 256),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(backend_->device().ToString())));
  // Fill most of the device in 16 MiB steps, then over-ask, then recover after a free.
  std::vector<void*> held;
  while (backend_->capacity_bytes() - backend_->allocated_bytes() >= 16 * kMiB &&
         held.size() < 4096) {
    absl::StatusOr<void*> p = backend_->AllocateDevice(16 * kMiB);
    if (!p.ok()) {
      EXPECT_THAT(p.status(), StatusIs(absl::StatusCode::kResourceExhausted));
      break;
    }
    held.push_back(*p);
  }
  absl::StatusOr<void*> over =
      backend_->AllocateDevice(backend_->capacity_bytes() - backend_->allocated_bytes() + 256);
  EXPECT_THAT(over.status(), StatusIs(absl::StatusCode::kResourceExhausted, "requested"));
  ASSERT_FALSE(held.empty());
  EXPECT_OK(backend_->FreeDevice(held.back()));
  held.pop_back();
  ASSERT_OK_AND_ASSIGN(void* again, backend_->AllocateDevice(16 * kMiB));
  held.push_back(again);
  for (void* p : held) EXPECT_OK(backend_->FreeDevice(p));
}

TEST_P(BackendConformanceTest, CopiesRoundTripEveryDirection) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, backend_->CreateStream());
  for (int64_t bytes : {1, 3, 255, 4096, 65537, 5 * (1 << 20) + 3}) {
    const std::vector<uint8_t> src = RandomBytes(bytes, static_cast<uint32_t>(bytes));
    ASSERT_OK_AND_ASSIGN(void* pinned, backend_->AllocatePinnedHost(bytes));
    std::memcpy(pinned, src.data(), src.size());
    DeviceBuffer a(backend_.get(), bytes), b(backend_.get(), bytes);
    std::vector<uint8_t> out(static_cast<size_t>(bytes), 0), via_host(static_cast<size_t>(bytes));
    ASSERT_OK(stream->MemcpyAsync(a.get(), pinned, bytes, CopyKind::kHostToDevice));
    ASSERT_OK(stream->MemcpyAsync(b.get(), a.get(), bytes, CopyKind::kDeviceToDevice));
    ASSERT_OK(stream->MemcpyAsync(out.data(), b.get(), bytes, CopyKind::kDeviceToHost));
    ASSERT_OK(stream->MemcpyAsync(via_host.data(), pinned, bytes, CopyKind::kHostToHost));
    ASSERT_OK(stream->Synchronize());
    EXPECT_EQ(out, src) << bytes;
    EXPECT_EQ(via_host, src) << bytes;
    EXPECT_OK(backend_->FreePinnedHost(pinned));
  }
  const BackendCounters c = backend_->counters();
  EXPECT_GE(c.host_to_device_bytes, 5 * (1 << 20));
  EXPECT_GE(c.device_to_host_bytes, 5 * (1 << 20));
  EXPECT_GE(c.device_to_device_bytes, 5 * (1 << 20));
}

TEST_P(BackendConformanceTest, MemsetAndPartialRanges) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, backend_->CreateStream());
  constexpr int64_t kBytes = 10000;
  DeviceBuffer d(backend_.get(), kBytes);
  auto* base = static_cast<uint8_t*>(d.get());
  ASSERT_OK(stream->MemsetAsync(base, 0x11, kBytes));
  ASSERT_OK(stream->MemsetAsync(base + 100, 0x22, 50));
  std::vector<uint8_t> out(kBytes);
  ASSERT_OK(stream->MemcpyAsync(out.data(), base, kBytes, CopyKind::kDeviceToHost));
  ASSERT_OK(stream->Synchronize());
  for (int64_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(out[i], (i >= 100 && i < 150) ? 0x22 : 0x11) << i;
  }
}

TEST_P(BackendConformanceTest, InvalidCopiesAreRejectedAtEnqueue) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, backend_->CreateStream());
  DeviceBuffer d(backend_.get(), 4096);
  std::vector<uint8_t> host(8192);
  EXPECT_THAT(stream->MemcpyAsync(d.get(), host.data(), -1, CopyKind::kHostToDevice),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(stream->MemcpyAsync(nullptr, host.data(), 16, CopyKind::kHostToDevice),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Overruns the allocation (4096 bytes rounded to 4096).
  EXPECT_THAT(stream->MemcpyAsync(d.get(), host.data(), 4097, CopyKind::kHostToDevice),
              StatusIs(absl::StatusCode::kInvalidArgument, "not inside device memory"));
  // Host memory passed as device memory.
  EXPECT_THAT(stream->MemcpyAsync(host.data(), d.get(), 16, CopyKind::kDeviceToDevice),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(stream->MemsetAsync(host.data(), 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(stream->MemcpyAsync(d.get(), host.data(), 0, CopyKind::kHostToDevice));
  EXPECT_OK(stream->Synchronize());
}

TEST_P(BackendConformanceTest, HostFunctionsRunInStreamOrder) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> stream, backend_->CreateStream());
  Mutex mu;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(stream->LaunchHostFunc([&, i] {
      MutexLock lock(&mu);
      order.push_back(i);
    }));
  }
  ASSERT_OK(stream->Synchronize());
  MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST_P(BackendConformanceTest, EventsCaptureWorkAndOrderStreams) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> producer, backend_->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> consumer, backend_->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, backend_->CreateEvent());
  EXPECT_TRUE(event->Query());  // never recorded
  EXPECT_OK(event->Synchronize());

  constexpr int64_t kBytes = 1 << 20;
  const std::vector<uint8_t> pattern = RandomBytes(kBytes, 7);
  // Both host ends pinned: a pageable copy may block this thread until the held producer runs,
  // and only this thread releases it.
  PinnedBuffer source(backend_.get(), kBytes);
  PinnedBuffer out(backend_.get(), kBytes);
  ASSERT_NE(source.get(), nullptr);
  ASSERT_NE(out.get(), nullptr);
  std::copy(pattern.begin(), pattern.end(), source.get());
  std::fill(out.get(), out.get() + kBytes, 0);
  DeviceBuffer d(backend_.get(), kBytes);
  ASSERT_OK(consumer->MemsetAsync(d.get(), 0, kBytes));
  ASSERT_OK(consumer->Synchronize());

  std::atomic<bool> release{false};
  // The producer blocks until released, then writes the pattern. The consumer waits on the event,
  // so its read must see the pattern, however late the producer runs.
  ASSERT_OK(producer->LaunchHostFunc([&] {
    while (!release.load()) absl::SleepFor(absl::Milliseconds(1));
  }));
  ASSERT_OK(producer->MemcpyAsync(d.get(), source.get(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(producer->RecordEvent(event.get()));
  EXPECT_FALSE(event->Query());
  ASSERT_OK(consumer->WaitEvent(event.get()));
  ASSERT_OK(consumer->MemcpyAsync(out.get(), d.get(), kBytes, CopyKind::kDeviceToHost));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(event->Query());
  release.store(true);
  ASSERT_OK(consumer->Synchronize());
  EXPECT_TRUE(event->Query());
  EXPECT_EQ(out.ToVector(), pattern);
}

TEST_P(BackendConformanceTest, ReRecordingMovesTheEvent) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> s, backend_->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> e, backend_->CreateEvent());
  ASSERT_OK(s->RecordEvent(e.get()));
  ASSERT_OK(e->Synchronize());
  EXPECT_TRUE(e->Query());
  std::atomic<bool> release{false};
  ASSERT_OK(s->LaunchHostFunc([&] {
    while (!release.load()) absl::SleepFor(absl::Milliseconds(1));
  }));
  ASSERT_OK(s->RecordEvent(e.get()));
  EXPECT_FALSE(e->Query());
  release.store(true);
  EXPECT_OK(e->Synchronize());
  EXPECT_TRUE(e->Query());
}

TEST_P(BackendConformanceTest, ConcurrentStreamsKeepEachStreamsDataIntact) {
  constexpr int kStreams = 4;
  constexpr int kRounds = 25;
  constexpr int64_t kBytes = 64 * 1024;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<std::unique_ptr<Stream>> stream = backend_->CreateStream();
      if (!stream.ok()) {
        ++failures;
        return;
      }
      DeviceBuffer d(backend_.get(), kBytes);
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<uint8_t> src = RandomBytes(kBytes, static_cast<uint32_t>(t * 1000 + r));
        std::vector<uint8_t> out(kBytes);
        if (!(*stream)->MemcpyAsync(d.get(), src.data(), kBytes, CopyKind::kHostToDevice).ok() ||
            !(*stream)->MemcpyAsync(out.data(), d.get(), kBytes, CopyKind::kDeviceToHost).ok() ||
            !(*stream)->Synchronize().ok() || out != src) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(BackendConformanceTest, DestroyingAStreamFinishesItsWork) {
  std::atomic<int> ran{0};
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> s, backend_->CreateStream());
    for (int i = 0; i < 10; ++i) {
      ASSERT_OK(s->LaunchHostFunc([&] {
        absl::SleepFor(absl::Milliseconds(2));
        ++ran;
      }));
    }
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace ps
