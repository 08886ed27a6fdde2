// Timing behaviour of the emulated accelerator: the link bandwidth cap, one link per direction,
// and copies overlapping compute. Run alone (tag "exclusive") so a loaded machine cannot skew it;
// the bounds are generous and each asserts a property of the design, not a speed.
#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"

namespace ps {
namespace {

// A copy over an emulated link takes at least bytes / bandwidth.
TEST(CpuBackendTiming, BandwidthCapMakesCopiesTakeLinkTime) {
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
TEST(CpuBackendTiming, SameDirectionSharesTheLinkOppositeDirectionsOverlap) {
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
TEST(CpuBackendTiming, CopiesOverlapCompute) {
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

}  // namespace
}  // namespace ps
