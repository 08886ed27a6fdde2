// Stream-ordered frees of the CachingAllocator (DeallocateOnStream) on the emulated accelerator:
// a freed block is reused at once by its own stream and by nothing else while work enqueued before
// the free may still touch it, the accounting moves at the free, pressure waits for the streams,
// and a randomized
// sequence of allocations, kernels, frees, stalls and waits keeps every invariant after every step.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "base/mutex.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/memory_tracker.h"
#include "memory/resources.h"

namespace ps {
namespace {

// Scaled-down sizes (as caching_allocator_test.cc) so a few thousand steps split, merge and fill
// segments constantly.
CachingAllocatorOptions TinyOptions(Backend* backend, MemoryTracker* tracker) {
  CachingAllocatorOptions options;
  options.round_bytes = 256;
  options.small_request_max_bytes = 4 * kKiB;
  options.small_segment_bytes = 8 * kKiB;
  options.large_segment_round_bytes = 8 * kKiB;
  options.tracker = tracker;
  options.event_backend = backend;
  return options;
}

struct Fixture {
  explicit Fixture(int64_t capacity_bytes = 4 * kMiB, std::optional<int64_t> budget = {}) {
    backend = CreateCpuBackend({.capacity_bytes = capacity_bytes}).value();
    upstream = std::make_unique<BackendDeviceResource>(backend.get(), budget);
    tracker = std::make_unique<MemoryTracker>(backend->device());
    allocator =
        CachingAllocator::Create(upstream.get(), TinyOptions(backend.get(), tracker.get())).value();
    stream = backend->CreateStream().value();
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<BackendDeviceResource> upstream;
  std::unique_ptr<MemoryTracker> tracker;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<Stream> stream;
};

// A block freed on a stream is free at once for that stream (stream order runs its next user after
// the kernel that still reads it), and the accounting moves at the free; another stream gets it
// only behind a stream-side wait for the free, the host (which never waits for it unless memory
// ran out) only after the stream passed it.
TEST(CachingAllocatorStreamTest, FreedBlockIsReusedAtOnceOnItsStreamAndByOthersAfterTheFree) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> other, f.backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(void* p, f.allocator->Allocate(1000));  // a 1 KiB block
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*f.stream));
  std::atomic<bool> kernel_ran{false};
  ASSERT_OK(f.stream->LaunchHostFunc([&kernel_ran, p] {
    std::memset(p, 7, 1000);  // a kernel still using the block
    kernel_ran = true;
  }));
  ASSERT_OK(f.allocator->DeallocateOnStream(p, 1000, *f.stream));

  CachingAllocatorStats stats = f.allocator->stats();
  EXPECT_EQ(stats.pending_frees, 1);
  EXPECT_EQ(stats.pending_free_bytes, 1024);
  EXPECT_EQ(stats.in_use_bytes, 0);  // counted at the free, as the program sees it
  EXPECT_EQ(stats.live_allocations, 0);
  EXPECT_EQ(stats.requested_bytes, 0);
  EXPECT_EQ(f.tracker->current_bytes(MemoryKind::kNonModelData), 0);
  // A second free of the freed pointer is a double free.
  EXPECT_THAT(f.allocator->Deallocate(p, 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f.allocator->DeallocateOnStream(p, 1000, *f.stream),
              StatusIs(absl::StatusCode::kInvalidArgument, "freed already"));

  // The same stream takes it back at once, with no wait: its next kernel runs after the first.
  ASSERT_OK_AND_ASSIGN(void* q, f.allocator->AllocateOnStream(1000, *f.stream));
  EXPECT_EQ(q, p);
  EXPECT_TRUE(stall->active());  // no host wait
  EXPECT_FALSE(kernel_ran.load());
  EXPECT_EQ(f.allocator->stats().pending_free_waits, 0);
  EXPECT_EQ(f.tracker->current_bytes(MemoryKind::kNonModelData), 1024);
  ASSERT_OK(f.allocator->DeallocateOnStream(q, 1000, *f.stream));

  // Another stream gets the same best fit, but its work waits for the free on the stream.
  ASSERT_OK_AND_ASSIGN(void* r, f.allocator->AllocateOnStream(1000, *other));
  EXPECT_EQ(r, p);
  EXPECT_TRUE(stall->active());  // a stream-side wait, not a host wait
  std::atomic<bool> saw_kernel{false};
  ASSERT_OK(other->LaunchHostFunc([&] { saw_kernel = kernel_ran.load(); }));
  EXPECT_EQ(f.allocator->stats().pending_free_waits, 1);
  stall->Release();
  ASSERT_OK(other->Synchronize());
  EXPECT_TRUE(saw_kernel.load());

  // And the host (plain Allocate) only after the stream passed the free: until then it gets
  // another block, at once.
  ASSERT_OK_AND_ASSIGN(auto stall2, StallCpuStream(*other));
  std::atomic<bool> second_ran{false};
  ASSERT_OK(other->LaunchHostFunc([&second_ran] { second_ran = true; }));
  ASSERT_OK(f.allocator->DeallocateOnStream(r, 1000, *other));
  EXPECT_EQ(f.allocator->ProcessPendingFrees(), 1024 + 1024);  // the first stream's two frees
  ASSERT_OK_AND_ASSIGN(void* h, f.allocator->Allocate(1000));
  // Not from p's segment, whose only free block (all of it) the free guards: a new segment.
  EXPECT_FALSE(h >= p && static_cast<char*>(h) < static_cast<char*>(p) + 8 * kKiB);
  EXPECT_EQ(f.allocator->stats().segments, 2);
  EXPECT_TRUE(stall2->active());
  EXPECT_FALSE(second_ran.load());
  stall2->Release();
  ASSERT_OK(other->Synchronize());
  EXPECT_EQ(f.allocator->ProcessPendingFrees(), 1024);
  // Now the host may have p's segment: the first 4 KiB fits the rest of h's segment, the second
  // only p's.
  ASSERT_OK_AND_ASSIGN(void* h1, f.allocator->Allocate(4 * kKiB));
  ASSERT_OK_AND_ASSIGN(void* h2, f.allocator->Allocate(4 * kKiB));
  EXPECT_NE(h1, p);
  EXPECT_EQ(h2, p);
  EXPECT_EQ(f.allocator->stats().segments, 2);
  stats = f.allocator->stats();
  EXPECT_EQ(stats.pending_frees, 0);
  EXPECT_EQ(stats.stream_ordered_frees, 3);
  EXPECT_EQ(stats.in_use_bytes, 1024 + 8 * kKiB);
  EXPECT_OK(f.allocator->Deallocate(h, 1000));
  EXPECT_OK(f.allocator->Deallocate(h1, 4 * kKiB));
  EXPECT_OK(f.allocator->Deallocate(h2, 4 * kKiB));
}

// Frees on a stream merge with their neighbours as plain frees do, so one stream's program gets the
// same blocks, and the same statistics, as with Allocate and Deallocate (what the memory plan
// replays), however far the stream has got.
TEST(CachingAllocatorStreamTest, OneStreamsProgramGetsTheBlocksOfThePlainProgram) {
  Fixture plain;
  Fixture ordered;
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*ordered.stream));
  ASSERT_OK(ordered.stream->LaunchHostFunc([] {}));
  std::mt19937 rng(11);
  std::vector<std::pair<std::pair<void*, void*>, int64_t>> live;
  for (int step = 0; step < 400; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const int64_t bytes = 1 + static_cast<int64_t>(rng() % (20 * kKiB));
      ASSERT_OK_AND_ASSIGN(void* a, plain.allocator->Allocate(bytes));
      ASSERT_OK_AND_ASSIGN(void* b, ordered.allocator->AllocateOnStream(bytes, *ordered.stream));
      live.push_back({{a, b}, bytes});
    } else {
      const size_t k = rng() % live.size();
      ASSERT_OK(plain.allocator->Deallocate(live[k].first.first, live[k].second));
      ASSERT_OK(ordered.allocator->DeallocateOnStream(live[k].first.second, live[k].second,
                                                      *ordered.stream));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const CachingAllocatorStats a = plain.allocator->stats();
    const CachingAllocatorStats b = ordered.allocator->stats();
    ASSERT_EQ(a.in_use_bytes, b.in_use_bytes) << "step " << step;
    ASSERT_EQ(a.reserved_bytes, b.reserved_bytes) << "step " << step;
    ASSERT_EQ(a.free_segment_bytes, b.free_segment_bytes) << "step " << step;
    ASSERT_EQ(a.largest_free_block_bytes, b.largest_free_block_bytes) << "step " << step;
    ASSERT_EQ(a.free_blocks, b.free_blocks) << "step " << step;
    ASSERT_EQ(plain.tracker->current_bytes(MemoryKind::kNonModelData),
              ordered.tracker->current_bytes(MemoryKind::kNonModelData));
  }
  EXPECT_TRUE(stall->active());  // the ordered program never waited for its stream
  EXPECT_EQ(ordered.allocator->stats().pending_free_waits, 0);
  for (auto& [ptrs, bytes] : live) {
    ASSERT_OK(plain.allocator->Deallocate(ptrs.first, bytes));
    ASSERT_OK(ordered.allocator->DeallocateOnStream(ptrs.second, bytes, *ordered.stream));
  }
}

TEST(CachingAllocatorStreamTest, AllocateProcessesFinishedFreesWithoutAnExplicitCall) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(void* p, f.allocator->Allocate(300));
  ASSERT_OK(f.allocator->DeallocateOnStream(p, 300, *f.stream));
  ASSERT_OK(f.stream->Synchronize());
  ASSERT_OK_AND_ASSIGN(void* q, f.allocator->Allocate(300));
  EXPECT_EQ(q, p);
  EXPECT_EQ(f.allocator->stats().pending_frees, 0);
  EXPECT_OK(f.allocator->Deallocate(q, 300));
}

// The events of stream-ordered frees are pooled: however many frees, the allocator creates only as
// many events as frees are pending at once. A stalled stream holds every free pending (one event
// each); once it passed them, the next frees record the same events again.
TEST(CachingAllocatorStreamTest, EventsCreatedStayAtTheMostFreesPendingAtOnce) {
  Fixture f;
  constexpr int kHeld = 48;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> size(1, 12 * kKiB);  // small and large, awkward sizes
  auto round = [&](Stream& stream) -> absl::Status {
    const int64_t bytes = size(rng);
    absl::StatusOr<void*> p = f.allocator->AllocateOnStream(bytes, stream);
    if (!p.ok()) return p.status();
    return f.allocator->DeallocateOnStream(*p, bytes, stream);
  };
  for (int phase = 0; phase < 3; ++phase) {
    ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*f.stream));
    for (int i = 0; i < kHeld; ++i) ASSERT_OK(round(*f.stream));
    EXPECT_TRUE(stall->active());
    EXPECT_EQ(f.allocator->stats().pending_frees, kHeld);
    // Each held free needs its own event; later phases take them all from the pool.
    EXPECT_EQ(f.allocator->stats().events_created, kHeld) << "phase " << phase;
    stall->Release();
    ASSERT_OK(f.stream->Synchronize());
    f.allocator->ProcessPendingFrees();
    EXPECT_EQ(f.allocator->stats().pending_frees, 0);
  }

  // A stream that advances on its own: the events stay at the most frees seen pending at once.
  int64_t most_pending = kHeld;
  for (int i = 0; i < 3000; ++i) {
    ASSERT_OK(round(*f.stream));
    most_pending = std::max(most_pending, f.allocator->stats().pending_frees);
  }
  ASSERT_OK(f.stream->Synchronize());
  f.allocator->ProcessPendingFrees();
  const CachingAllocatorStats stats = f.allocator->stats();
  EXPECT_EQ(stats.stream_ordered_frees, 3 * kHeld + 3000);
  EXPECT_LE(stats.events_created, most_pending);
  EXPECT_EQ(stats.pending_frees, 0);
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_EQ(f.tracker->current_bytes(MemoryKind::kNonModelData), 0);
}

// With every stream holding its work until the host waits, the frees between two host waits are
// all pending at once; blocks move between three streams (stream-side waits for the other streams'
// frees, whose events the waits take). The events created equal the most frees pending at once,
// not the number of frees, and no kernel ever saw its block touched by another stream's kernel.
TEST(CachingAllocatorStreamTest, EventsAreRecycledAcrossStreamsThatWaitForEachOther) {
  auto backend =
      CreateCpuBackend({.capacity_bytes = 4 * kMiB, .stall_streams_until_host_waits = true})
          .value();
  BackendDeviceResource upstream(backend.get());
  MemoryTracker tracker(backend->device());
  ASSERT_OK_AND_ASSIGN(auto allocator,
                       CachingAllocator::Create(&upstream, TinyOptions(backend.get(), &tracker)));
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(backend->CreateStream().value());
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> size(1, 6 * kKiB);
  std::uniform_int_distribution<int> pick(0, 2);
  std::uniform_int_distribution<int> burst(1, 12);
  std::atomic<int> violations{0};
  int64_t most_pending = 0;
  int64_t frees = 0;
  for (int round = 0; round < 200; ++round) {
    const int n = burst(rng);
    for (int i = 0; i < n; ++i) {
      Stream& stream = *streams[pick(rng)];
      const int64_t bytes = size(rng);
      ASSERT_OK_AND_ASSIGN(void* p, allocator->AllocateOnStream(bytes, stream));
      // A kernel that owns the block while it runs: it writes a stamp and finds it unchanged.
      const unsigned char stamp = static_cast<unsigned char>(round * 13 + i);
      ASSERT_OK(stream.LaunchHostFunc([p, bytes, stamp, &violations] {
        auto* bytes_p = static_cast<unsigned char*>(p);
        std::memset(bytes_p, stamp, bytes);
        std::this_thread::yield();
        for (int64_t k = 0; k < bytes; ++k) {
          if (bytes_p[k] != stamp) {
            ++violations;
            return;
          }
        }
      }));
      ASSERT_OK(allocator->DeallocateOnStream(p, bytes, stream));
      ++frees;
      most_pending = std::max(most_pending, allocator->stats().pending_frees);
    }
    ASSERT_OK(streams[pick(rng)]->Synchronize());  // a host wait: every held stream runs
  }
  for (auto& stream : streams) ASSERT_OK(stream->Synchronize());
  allocator->ProcessPendingFrees();
  const CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(stats.stream_ordered_frees, frees);
  EXPECT_GT(stats.pending_free_waits, 0);  // blocks did change streams
  EXPECT_LE(stats.events_created, most_pending);
  EXPECT_LT(stats.events_created, frees / 4);
  EXPECT_EQ(stats.pending_frees, 0);
}

// A recycled event must never mark an earlier free as passed. The event of a completed free goes
// back to the pool and is recorded again for a free of block X on a stalled stream A; the next
// free, of block Y on stream C, must get a new event — were the pooled event still handed out
// while A's free refers to it, C's record would replace A's, and once C ran, stream B would take X
// without waiting for A and the host would take the rest of X's segment while A's kernel may still
// write it.
TEST(CachingAllocatorStreamTest, ARecycledEventNeverLetsAnotherStreamOrTheHostTakeABlockEarly) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> b, f.backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> c, f.backend->CreateStream());
  // A completed free on C leaves one event in the pool.
  ASSERT_OK_AND_ASSIGN(void* p0, f.allocator->AllocateOnStream(6 * kKiB, *c));  // a large block
  ASSERT_OK(f.allocator->DeallocateOnStream(p0, 6 * kKiB, *c));
  ASSERT_OK(c->Synchronize());
  EXPECT_EQ(f.allocator->ProcessPendingFrees(), 8 * kKiB);
  EXPECT_EQ(f.allocator->stats().events_created, 1);

  // X (1 KiB of a small segment) freed on stalled A, behind a kernel still writing it: the free
  // records the pooled event.
  Stream& a = *f.stream;
  ASSERT_OK_AND_ASSIGN(void* x, f.allocator->Allocate(1000));
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(a));
  std::atomic<bool> a_kernel_ran{false};
  ASSERT_OK(a.LaunchHostFunc([x, &a_kernel_ran] {
    std::memset(x, 1, 1000);
    a_kernel_ran = true;
  }));
  ASSERT_OK(f.allocator->DeallocateOnStream(x, 1000, a));
  EXPECT_EQ(f.allocator->stats().events_created, 1);  // recycled

  // Y freed on C, which runs: the pool is empty (A's free holds its event), so a new event.
  ASSERT_OK_AND_ASSIGN(void* y, f.allocator->AllocateOnStream(6 * kKiB, *c));
  EXPECT_EQ(y, p0);
  ASSERT_OK(f.allocator->DeallocateOnStream(y, 6 * kKiB, *c));
  EXPECT_EQ(f.allocator->stats().events_created, 2);
  std::atomic<bool> c_passed{false};
  ASSERT_OK(c->LaunchHostFunc([&c_passed] { c_passed = true; }));
  while (!c_passed.load()) std::this_thread::yield();  // not a host wait: A stays stalled
  // Only C's free has passed.
  EXPECT_EQ(f.allocator->ProcessPendingFrees(), 8 * kKiB);
  EXPECT_EQ(f.allocator->stats().pending_frees, 1);

  // B gets X (the only small free block) behind a stream-side wait for A's free.
  ASSERT_OK_AND_ASSIGN(void* r, f.allocator->AllocateOnStream(1000, *b));
  EXPECT_EQ(r, x);
  EXPECT_EQ(f.allocator->stats().pending_free_waits, 1);
  std::atomic<bool> b_saw_a{false};
  ASSERT_OK(b->LaunchHostFunc([&] { b_saw_a = a_kernel_ran.load(); }));
  // The host passes over the rest of X's segment, still guarded by A: a new segment.
  ASSERT_OK_AND_ASSIGN(void* h, f.allocator->Allocate(1000));
  EXPECT_FALSE(h >= x && static_cast<char*>(h) < static_cast<char*>(x) + 8 * kKiB);
  EXPECT_TRUE(stall->active());
  EXPECT_FALSE(a_kernel_ran.load());
  stall->Release();
  ASSERT_OK(b->Synchronize());
  EXPECT_TRUE(b_saw_a.load());
  ASSERT_OK(a.Synchronize());
  EXPECT_OK(f.allocator->Deallocate(r, 1000));
  EXPECT_OK(f.allocator->Deallocate(h, 1000));
  f.allocator->ProcessPendingFrees();
  EXPECT_EQ(f.allocator->stats().pending_frees, 0);
  EXPECT_EQ(f.allocator->stats().events_created, 2);
}

// What the pool relies on, in the cpu backend: a stream wait is for the record current when
// WaitEvent was called; recording the event again elsewhere (where it completes at once) does not
// release the wait early.
TEST(CachingAllocatorStreamTest, ReRecordingAnEventDoesNotMoveAnEnqueuedWait) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> b, f.backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stream> c, f.backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> event, f.backend->CreateEvent());
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*f.stream));
  std::atomic<bool> a_ran{false};
  ASSERT_OK(f.stream->LaunchHostFunc([&a_ran] { a_ran = true; }));
  ASSERT_OK(f.stream->RecordEvent(event.get()));
  ASSERT_OK(b->WaitEvent(event.get()));
  std::atomic<int> b_state{0};  // 1: ran before A, 2: ran after A
  ASSERT_OK(b->LaunchHostFunc([&] { b_state = a_ran.load() ? 2 : 1; }));
  ASSERT_OK(c->RecordEvent(event.get()));  // replaces A's record for later users
  std::atomic<bool> c_passed{false};
  ASSERT_OK(c->LaunchHostFunc([&c_passed] { c_passed = true; }));
  while (!c_passed.load()) std::this_thread::yield();
  EXPECT_TRUE(event->Query());  // the latest record (C's) completed
  for (int i = 0; i < 100 && b_state.load() == 0; ++i) std::this_thread::yield();
  EXPECT_EQ(b_state.load(), 0);  // still waiting for A's record
  stall->Release();
  ASSERT_OK(b->Synchronize());
  EXPECT_EQ(b_state.load(), 2);
}

// Threads free and allocate on their own streams at once; blocks (and so waits for frees and the
// events they take) cross streams. Kernels never see their block touched by another, and the
// events stay bounded by the frees that can be pending at once (each stream is synchronized every
// kSyncEvery frees) plus one per thread for a wait being enqueued.
TEST(CachingAllocatorStreamTest, ConcurrentFreesRecycleEventsSafely) {
  Fixture f(16 * kMiB);
  constexpr int kThreads = 4;
  constexpr int kRounds = 400;
  constexpr int kSyncEvery = 16;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kThreads; ++i) streams.push_back(f.backend->CreateStream().value());
  std::atomic<int> violations{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Stream& stream = *streams[t];
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int64_t> size(1, 6 * kKiB);
      for (int i = 0; i < kRounds; ++i) {
        const int64_t bytes = size(rng);
        absl::StatusOr<void*> p = f.allocator->AllocateOnStream(bytes, stream);
        if (!p.ok()) {
          ++errors;
          return;
        }
        const unsigned char stamp = static_cast<unsigned char>(t * 64 + i % 64);
        absl::Status status = stream.LaunchHostFunc([p = *p, bytes, stamp, &violations] {
          auto* bytes_p = static_cast<unsigned char*>(p);
          std::memset(bytes_p, stamp, bytes);
          std::this_thread::yield();
          for (int64_t k = 0; k < bytes; ++k) {
            if (bytes_p[k] != stamp) {
              ++violations;
              return;
            }
          }
        });
        if (status.ok()) status = f.allocator->DeallocateOnStream(*p, bytes, stream);
        if (status.ok() && i % kSyncEvery == kSyncEvery - 1) status = stream.Synchronize();
        if (!status.ok()) {
          ++errors;
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (auto& stream : streams) ASSERT_OK(stream->Synchronize());
  f.allocator->ProcessPendingFrees();
  const CachingAllocatorStats stats = f.allocator->stats();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(stats.stream_ordered_frees, kThreads * kRounds);
  EXPECT_EQ(stats.pending_frees, 0);
  EXPECT_LE(stats.events_created, kThreads * (2 * kSyncEvery + 1));
  EXPECT_EQ(stats.in_use_bytes, 0);
}

class FailingRecordStream final : public Stream {
 public:
  absl::Status MemcpyAsync(void*, const void*, int64_t, CopyKind) override {
    return absl::OkStatus();
  }
  absl::Status MemsetAsync(void*, int, int64_t) override { return absl::OkStatus(); }
  absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&>) override { return absl::OkStatus(); }
  absl::Status RecordEvent(Event*) override {
    return absl::InvalidArgumentError("RecordEvent: the event was not created by this backend");
  }
  absl::Status WaitEvent(Event*) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  void* native_handle() override { return nullptr; }
};

TEST(CachingAllocatorStreamTest, ErrorsChangeNothing) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(void* p, f.allocator->Allocate(512));
  EXPECT_THAT(f.allocator->DeallocateOnStream(p, 513, *f.stream),
              StatusIs(absl::StatusCode::kInvalidArgument, "allocated with 512 bytes"));
  int on_stack = 0;
  EXPECT_THAT(f.allocator->DeallocateOnStream(&on_stack, 4, *f.stream),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a live allocation"));
  FailingRecordStream foreign;
  EXPECT_THAT(f.allocator->DeallocateOnStream(p, 512, foreign),
              StatusIs(absl::StatusCode::kInvalidArgument, "DeallocateOnStream"));
  CachingAllocatorStats stats = f.allocator->stats();
  EXPECT_EQ(stats.live_allocations, 1);
  EXPECT_EQ(stats.requested_bytes, 512);
  EXPECT_EQ(stats.pending_frees, 0);
  // Still the caller's: a plain free works.
  EXPECT_OK(f.allocator->Deallocate(p, 512));

  // Without an event backend, stream-ordered frees are refused.
  CachingAllocatorOptions options = TinyOptions(nullptr, nullptr);
  ASSERT_OK_AND_ASSIGN(auto plain, CachingAllocator::Create(f.upstream.get(), options));
  ASSERT_OK_AND_ASSIGN(void* q, plain->Allocate(100));
  EXPECT_THAT(plain->DeallocateOnStream(q, 100, *f.stream),
              StatusIs(absl::StatusCode::kFailedPrecondition, "event_backend"));
  EXPECT_OK(plain->Deallocate(q, 100));
}

TEST(CachingAllocatorStreamTest, UnderPressureAllocateWaitsForPendingFrees) {
  // Budget for exactly two 8 KiB segments.
  Fixture f(4 * kMiB, 16 * kKiB);
  ASSERT_OK_AND_ASSIGN(void* a, f.allocator->Allocate(8 * kKiB));
  ASSERT_OK_AND_ASSIGN(void* b, f.allocator->Allocate(8 * kKiB));
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*f.stream));
  std::atomic<bool> kernel_ran{false};
  ASSERT_OK(f.stream->LaunchHostFunc([&] { kernel_ran = true; }));
  ASSERT_OK(f.allocator->DeallocateOnStream(a, 8 * kKiB, *f.stream));
  // Nothing cached fits, the upstream is full: the allocator waits for the stream (a host wait,
  // which also ends the stall) and reuses the block.
  ASSERT_OK_AND_ASSIGN(void* c, f.allocator->Allocate(8 * kKiB));
  EXPECT_TRUE(kernel_ran.load());
  EXPECT_EQ(c, a);
  EXPECT_EQ(f.allocator->stats().pending_free_waits, 1);
  // With nothing pending the usual error remains.
  EXPECT_THAT(f.allocator->Allocate(8 * kKiB), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(f.allocator->Deallocate(b, 8 * kKiB));
  EXPECT_OK(f.allocator->Deallocate(c, 8 * kKiB));
}

TEST(CachingAllocatorStreamTest, ReleaseCachedWaitsForPendingFreesAndReturnsTheirSegments) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(void* p, f.allocator->Allocate(100));
  ASSERT_OK_AND_ASSIGN(void* q, f.allocator->Allocate(5000));  // a large segment of its own
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*f.stream));
  std::atomic<bool> kernel_ran{false};
  ASSERT_OK(f.stream->LaunchHostFunc([&] { kernel_ran = true; }));
  ASSERT_OK(f.allocator->DeallocateOnStream(p, 100, *f.stream));
  EXPECT_EQ(f.allocator->ProcessPendingFrees(), 0);  // never blocks
  EXPECT_EQ(f.allocator->stats().segments, 2);
  // Under pressure (the device's other pool asks), the allocator waits for the stream.
  EXPECT_EQ(f.allocator->ReleaseCached(), 8 * kKiB);
  EXPECT_TRUE(kernel_ran.load());
  EXPECT_EQ(f.allocator->stats().segments, 1);
  EXPECT_EQ(f.allocator->stats().pending_frees, 0);
  EXPECT_OK(f.allocator->Deallocate(q, 5000));
}

// Returns segments through a hook, so a test can check what the stream has done by then.
class HookedResource final : public MemoryResource {
 public:
  HookedResource(MemoryResource* upstream, std::function<void()> on_deallocate)
      : upstream_(upstream), on_deallocate_(std::move(on_deallocate)) {}
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return upstream_->Allocate(bytes); }
  absl::Status Deallocate(void* ptr, int64_t bytes) override {
    on_deallocate_();
    return upstream_->Deallocate(ptr, bytes);
  }
  Device device() const override { return upstream_->device(); }
  std::string name() const override { return "hooked"; }

 private:
  MemoryResource* const upstream_;
  std::function<void()> on_deallocate_;
};

TEST(CachingAllocatorStreamTest, DestructionWaitsForPendingFreesBeforeReturningSegments) {
  Fixture f;
  std::atomic<bool> kernel_ran{false};
  std::atomic<int> early_returns{0};
  HookedResource hooked(f.upstream.get(), [&] {
    if (!kernel_ran.load()) ++early_returns;
  });
  ASSERT_OK_AND_ASSIGN(auto allocator,
                       CachingAllocator::Create(&hooked, TinyOptions(f.backend.get(), nullptr)));
  ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(4000));
  ASSERT_OK_AND_ASSIGN(auto stall, StallCpuStream(*f.stream));
  ASSERT_OK(f.stream->LaunchHostFunc([&kernel_ran, p] {
    std::memset(p, 1, 4000);
    kernel_ran = true;
  }));
  ASSERT_OK(allocator->DeallocateOnStream(p, 4000, *f.stream));
  allocator.reset();
  EXPECT_TRUE(kernel_ran.load());
  EXPECT_EQ(early_returns.load(), 0);
}

TEST(CachingAllocatorStreamTest, DeviceMemoryScratchFreesInStreamOrder) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
  DeviceMemoryOptions options;
  options.chunk_block_bytes = kMiB;
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), options));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(void* p, memory->scratch()->Allocate(kKiB));
  ASSERT_OK(memory->scratch()->DeallocateOnStream(p, kKiB, *stream));
  ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(memory->scratch()->ProcessPendingFrees(), kKiB);
  EXPECT_EQ(memory->tracker()->current_bytes(MemoryKind::kNonModelData), 0);
  // Host memory without a backend has no events.
  options.pinned = false;
  ASSERT_OK_AND_ASSIGN(auto host, CreateHostMemory(nullptr, options));
  ASSERT_OK_AND_ASSIGN(void* h, host->scratch()->Allocate(kKiB));
  EXPECT_THAT(host->scratch()->DeallocateOnStream(h, kKiB, *stream),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(host->scratch()->Deallocate(h, kKiB));
}

// --- Randomized operation sequences
// ---------------------------------------------------------------
//
// Allocations, "kernels" on three streams that read and write blocks, stream-ordered frees (with a
// cross-stream wait when a block was used on several streams, as record_stream would), synchronous
// frees after synchronizing, stalls, releases, host waits and explicit processing. Invariants:
//  - a block handed out never overlaps a kernel that has not finished (checked at every Allocate,
//    and by every kernel, which finds its owner's id in the block when it starts);
//  - the tracker records exactly in_use_bytes; in use + cached = reserved; the live allocations
//    are the model's;
//  - half of the allocations are stream-ordered (AllocateOnStream), whose owner id the stream
//    writes: a kernel that finds another id ran on memory reused too early.

struct Kernel {
  uintptr_t begin = 0, end = 0;
  std::atomic<bool> done{false};
};

struct Allocation {
  uint64_t id = 0;
  int64_t bytes = 0;
  std::vector<int> streams_used;  // indices, in first-use order
  int last_stream = -1;
};

class StreamOrderRandomTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(StreamOrderRandomTest, NoBlockIsHandedOutUnderAQueuedKernel) {
  constexpr int kStreams = 3;
  constexpr int kSteps = 2500;
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 2 * kMiB}));
  BackendDeviceResource upstream(backend.get());
  MemoryTracker tracker(backend->device());
  ASSERT_OK_AND_ASSIGN(auto allocator,
                       CachingAllocator::Create(&upstream, TinyOptions(backend.get(), &tracker)));
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<CpuStreamStall>> stalls(kStreams);
  for (int i = 0; i < kStreams; ++i) streams.push_back(backend->CreateStream().value());
  std::vector<std::unique_ptr<Event>> events;  // kept alive to the end

  std::mt19937 rng(GetParam());
  absl::flat_hash_map<void*, Allocation> live;
  std::vector<std::shared_ptr<Kernel>> kernels;
  std::atomic<int> kernel_violations{0};
  uint64_t next_id = 1;

  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  auto random_live = [&]() -> void* {
    auto it = live.begin();
    std::advance(it, pick(static_cast<int>(live.size())));
    return it->first;
  };

  for (int step = 0; step < kSteps; ++step) {
    const int op = pick(100);
    if (op < 30 || live.empty()) {
      // Allocate: small or large, 8 bytes to 20 KiB.
      const int64_t bytes = (rng() % 4 == 0) ? 4 * kKiB + pick(16 * kKiB) : 8 + pick(3000);
      // Half of them stream-ordered: the block is for work on that stream from now on, which
      // writes the owner id (in stream order, after whatever the stream still does).
      if (pick(2) == 0) {
        const int s = pick(kStreams);
        absl::StatusOr<void*> p = allocator->AllocateOnStream(bytes, *streams[s]);
        if (!p.ok()) {
          ASSERT_THAT(p.status(), StatusIs(absl::StatusCode::kResourceExhausted));
          continue;
        }
        const uint64_t id = next_id++;
        ASSERT_OK(streams[s]->LaunchHostFunc([p = *p, id] { std::memcpy(p, &id, sizeof(id)); }));
        live[*p] = Allocation{id, bytes, {s}, s};
        continue;
      }
      absl::StatusOr<void*> p = allocator->Allocate(bytes);
      if (!p.ok()) {
        ASSERT_THAT(p.status(), StatusIs(absl::StatusCode::kResourceExhausted));
        continue;
      }
      const auto begin = reinterpret_cast<uintptr_t>(*p);
      const uintptr_t end = begin + static_cast<uintptr_t>(allocator->RoundedSize(bytes));
      for (const auto& k : kernels) {
        if (!k->done.load() && k->begin < end && begin < k->end) {
          FAIL() << "step " << step << ": block [" << begin << ", " << end
                 << ") handed out under a kernel still queued on [" << k->begin << ", " << k->end
                 << ")";
        }
      }
      const uint64_t id = next_id++;
      std::memcpy(*p, &id, sizeof(id));  // the host writes its new block at once
      live[*p] = Allocation{id, bytes, {}, -1};
    } else if (op < 55) {
      // A kernel on a random stream reads the owner id and rewrites the block.
      void* p = random_live();
      Allocation& a = live[p];
      const int s = pick(kStreams);
      // Kernels on one block are ordered, as a correct program orders them: a kernel on another
      // stream than the block's last user waits for that stream first.
      if (a.last_stream >= 0 && a.last_stream != s) {
        events.push_back(backend->CreateEvent().value());
        ASSERT_OK(streams[a.last_stream]->RecordEvent(events.back().get()));
        ASSERT_OK(streams[s]->WaitEvent(events.back().get()));
      }
      a.last_stream = s;
      auto kernel = std::make_shared<Kernel>();
      kernel->begin = reinterpret_cast<uintptr_t>(p);
      kernel->end = kernel->begin + static_cast<uintptr_t>(a.bytes);
      kernels.push_back(kernel);
      ASSERT_OK(
          streams[s]->LaunchHostFunc([kernel, p, id = a.id, bytes = a.bytes, &kernel_violations] {
            uint64_t seen;
            std::memcpy(&seen, p, sizeof(seen));
            if (seen != id) ++kernel_violations;
            auto* bytes_p = static_cast<unsigned char*>(p);
            for (int64_t i = sizeof(uint64_t); i < bytes; ++i) bytes_p[i] ^= 0x5a;
            kernel->done = true;
          }));
      if (std::find(a.streams_used.begin(), a.streams_used.end(), s) == a.streams_used.end()) {
        a.streams_used.push_back(s);
      }
    } else if (op < 72) {
      // Stream-ordered free on one of the streams that used the block (or any, if none did),
      // after that stream waits for the others.
      void* p = random_live();
      const Allocation a = live[p];
      const int s = a.streams_used.empty()
                        ? pick(kStreams)
                        : a.streams_used[pick(static_cast<int>(a.streams_used.size()))];
      for (int other : a.streams_used) {
        if (other == s) continue;
        events.push_back(backend->CreateEvent().value());
        ASSERT_OK(streams[other]->RecordEvent(events.back().get()));
        ASSERT_OK(streams[s]->WaitEvent(events.back().get()));
      }
      ASSERT_OK(allocator->DeallocateOnStream(p, a.bytes, *streams[s]));
      live.erase(p);
    } else if (op < 78) {
      // Synchronous free, after the host waited for every stream that used the block.
      void* p = random_live();
      const Allocation a = live[p];
      for (int s : a.streams_used) ASSERT_OK(streams[s]->Synchronize());
      ASSERT_OK(allocator->Deallocate(p, a.bytes));
      live.erase(p);
    } else if (op < 88) {
      // Stall or release a stream.
      const int s = pick(kStreams);
      if (stalls[s] != nullptr && stalls[s]->active()) {
        stalls[s]->Release();
      } else {
        ASSERT_OK_AND_ASSIGN(stalls[s], StallCpuStream(*streams[s]));
      }
    } else if (op < 95) {
      ASSERT_OK(streams[pick(kStreams)]->Synchronize());
    } else {
      allocator->ProcessPendingFrees();
    }

    const CachingAllocatorStats stats = allocator->stats();
    ASSERT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), stats.in_use_bytes)
        << "step " << step;
    ASSERT_GE(stats.pending_free_bytes, 0);
    ASSERT_EQ(stats.in_use_bytes + stats.cached_bytes, stats.reserved_bytes);
    ASSERT_EQ(stats.live_allocations, static_cast<int64_t>(live.size()));
    ASSERT_GE(stats.pending_frees, 0);
    if (kernels.size() > 256) {
      std::erase_if(kernels, [](const std::shared_ptr<Kernel>& k) { return k->done.load(); });
    }
  }
  for (auto& stream : streams) ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(kernel_violations.load(), 0);
  allocator->ProcessPendingFrees();
  const CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.pending_frees, 0);
  EXPECT_GT(stats.stream_ordered_frees, 100);
  for (const auto& [p, a] : live) ASSERT_OK(allocator->Deallocate(p, a.bytes));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, StreamOrderRandomTest, ::testing::Values(1u, 2u, 3u, 4u));

}  // namespace
}  // namespace ps
