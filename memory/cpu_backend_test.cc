#include "memory/cpu_backend.h"

#include <atomic>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
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
