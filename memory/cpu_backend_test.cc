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
