#include "memory/cpu_backend.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

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
        BackendFactory{"cpu",
                       [] { return CreateCpuBackend({.capacity_bytes = 256 * kMiB}); }},
        BackendFactory{"cpu_bandwidth_capped",
                       [] {
                         return CreateCpuBackend({.device_index = 1,
                                                  .capacity_bytes = 128 * kMiB,
                                                  .copy_bandwidth_bytes_per_s = 20e9});
                       }},
        BackendFactory{"cpu_via_factory",
                       [] {
                         return CreateBackend({.kind = "cpu", .capacity_bytes = 64 * kMiB});
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

// A copy over an emulated link takes at least bytes / bandwidth.
TEST(CpuBackend, BandwidthCapMakesCopiesTakeLinkTime) {
  constexpr double kBandwidth = 100e6;  // 100 MB/s
  constexpr int64_t kBytes = 8'000'000;  // 80 ms on the link
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = kBandwidth}));
  ASSERT_OK_AND_ASSIGN(void* d, backend->AllocateDevice(kBytes));
  std::vector<uint8_t> host(kBytes, 1);
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  const absl::Time start = absl::Now();
  ASSERT_OK(stream->MemcpyAsync(d, host.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(stream->Synchronize());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(78));
  EXPECT_OK(backend->FreeDevice(d));
}

// Two streams copying in the same direction share one link (serialized); opposite directions have
// a link each (overlap), as a PCIe GPU's two copy engines do.
TEST(CpuBackend, SameDirectionSharesTheLinkOppositeDirectionsOverlap) {
  constexpr double kBandwidth = 100e6;
  constexpr int64_t kBytes = 5'000'000;  // 50 ms each
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = kBandwidth}));
  ASSERT_OK_AND_ASSIGN(void* d1, backend->AllocateDevice(kBytes));
  ASSERT_OK_AND_ASSIGN(void* d2, backend->AllocateDevice(kBytes));
  std::vector<uint8_t> h1(kBytes, 1), h2(kBytes, 2);
  ASSERT_OK_AND_ASSIGN(auto s1, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto s2, backend->CreateStream());

  absl::Time start = absl::Now();
  ASSERT_OK(s1->MemcpyAsync(d1, h1.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(s2->MemcpyAsync(d2, h2.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(s1->Synchronize());
  ASSERT_OK(s2->Synchronize());
  const absl::Duration same_direction = absl::Now() - start;
  EXPECT_GE(same_direction, absl::Milliseconds(98));

  start = absl::Now();
  ASSERT_OK(s1->MemcpyAsync(d1, h1.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(s2->MemcpyAsync(h2.data(), d2, kBytes, CopyKind::kDeviceToHost));
  ASSERT_OK(s1->Synchronize());
  ASSERT_OK(s2->Synchronize());
  const absl::Duration opposite = absl::Now() - start;
  // Generous: overlapped directions finish well before the serialized 100 ms.
  EXPECT_LT(opposite, absl::Milliseconds(95)) << "same direction took " << same_direction;
  EXPECT_OK(backend->FreeDevice(d1));
  EXPECT_OK(backend->FreeDevice(d2));
}

// A copy on a copy stream runs while a compute stream is busy: the copy engine is its own thread.
TEST(CpuBackend, CopiesOverlapCompute) {
  constexpr double kBandwidth = 100e6;
  constexpr int64_t kBytes = 6'000'000;  // 60 ms
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = kBandwidth}));
  ASSERT_OK_AND_ASSIGN(void* d, backend->AllocateDevice(kBytes));
  std::vector<uint8_t> host(kBytes, 3);
  ASSERT_OK_AND_ASSIGN(auto compute, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto copy, backend->CreateStream());
  const absl::Time start = absl::Now();
  ASSERT_OK(compute->LaunchHostFunc([] { absl::SleepFor(absl::Milliseconds(60)); }));
  ASSERT_OK(copy->MemcpyAsync(d, host.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(compute->Synchronize());
  ASSERT_OK(copy->Synchronize());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(110));
  EXPECT_OK(backend->FreeDevice(d));
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

}  // namespace
}  // namespace ps
