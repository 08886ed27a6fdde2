// Timing behaviour of the emulated accelerator: the link bandwidth cap, one link per direction,
// and copies overlapping compute. Only properties that no load on the machine can break are
// asserted: lower bounds (a capped copy never finishes early; two copies in one direction take
// both their link times) and orderings (a copy completes while compute is blocked; a short copy
// completes while a long one in the other direction is still running). How close the overlap
// comes to the link's limit is measured by //benchmarks:cpu_backend_link_benchmark.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"

namespace ps {
namespace {

// A copy over an emulated link takes at least bytes / bandwidth.
TEST(CpuBackendTiming, BandwidthCapMakesCopiesTakeLinkTime) {
  constexpr double kBandwidth = 100e6;   // 100 MB/s
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

// Two streams copying in the same direction share one link: both link times pass.
TEST(CpuBackendTiming, SameDirectionSharesTheLink) {
  constexpr double kBandwidth = 100e6;
  constexpr int64_t kBytes = 5'000'000;  // 50 ms each
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = kBandwidth}));
  ASSERT_OK_AND_ASSIGN(void* d1, backend->AllocateDevice(kBytes));
  ASSERT_OK_AND_ASSIGN(void* d2, backend->AllocateDevice(kBytes));
  std::vector<uint8_t> h1(kBytes, 1), h2(kBytes, 2);
  ASSERT_OK_AND_ASSIGN(auto s1, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto s2, backend->CreateStream());
  const absl::Time start = absl::Now();
  ASSERT_OK(s1->MemcpyAsync(d1, h1.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(s2->MemcpyAsync(d2, h2.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(s1->Synchronize());
  ASSERT_OK(s2->Synchronize());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(98));
  EXPECT_OK(backend->FreeDevice(d1));
  EXPECT_OK(backend->FreeDevice(d2));
}

// Opposite directions have a link each, as a PCIe GPU's two copy engines do: a 1 KB
// device-to-host copy completes while a 2-second host-to-device copy still holds its link (were
// the link shared, it would wait for it).
TEST(CpuBackendTiming, OppositeDirectionsDoNotWaitForEachOther) {
  constexpr double kBandwidth = 1e6;         // 1 MB/s
  constexpr int64_t kLongBytes = 2'000'000;  // 2 s on the link
  constexpr int64_t kShortBytes = 1'000;     // 1 ms
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = kBandwidth}));
  ASSERT_OK_AND_ASSIGN(void* d1, backend->AllocateDevice(kLongBytes));
  ASSERT_OK_AND_ASSIGN(void* d2, backend->AllocateDevice(kShortBytes));
  std::vector<uint8_t> h1(kLongBytes, 1), h2(kShortBytes, 2);
  ASSERT_OK_AND_ASSIGN(auto up, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto down, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto up_done, backend->CreateEvent());
  std::atomic<bool> up_started{false};
  ASSERT_OK(up->LaunchHostFunc([&up_started] { up_started = true; }));
  ASSERT_OK(up->MemcpyAsync(d1, h1.data(), kLongBytes, CopyKind::kHostToDevice));
  ASSERT_OK(up->RecordEvent(up_done.get()));
  while (!up_started) absl::SleepFor(absl::Microseconds(100));
  absl::SleepFor(absl::Milliseconds(20));  // the long copy holds its link by now
  ASSERT_OK(down->MemcpyAsync(h2.data(), d2, kShortBytes, CopyKind::kDeviceToHost));
  ASSERT_OK(down->Synchronize());
  EXPECT_FALSE(up_done->Query()) << "the device-to-host copy waited for the host-to-device link";
  ASSERT_OK(up->Synchronize());
  EXPECT_OK(backend->FreeDevice(d1));
  EXPECT_OK(backend->FreeDevice(d2));
}

// A copy on a copy stream runs while a compute stream is busy: the compute stream's work waits for
// the copy to complete, which could never happen if copies queued behind compute.
TEST(CpuBackendTiming, CopiesOverlapCompute) {
  constexpr int64_t kBytes = 1'000'000;
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = 100e6}));
  ASSERT_OK_AND_ASSIGN(void* d, backend->AllocateDevice(kBytes));
  std::vector<uint8_t> host(kBytes, 3);
  ASSERT_OK_AND_ASSIGN(auto compute, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto copy, backend->CreateStream());
  std::atomic<bool> copied{false};
  std::atomic<bool> saw_copy{false};
  ASSERT_OK(compute->LaunchHostFunc([&] {
    // "Compute" that lasts until the copy is done (bounded, so a broken backend fails the test
    // instead of hanging it).
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!copied && absl::Now() < give_up) absl::SleepFor(absl::Microseconds(200));
    saw_copy = copied.load();
  }));
  ASSERT_OK(copy->MemcpyAsync(d, host.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(copy->LaunchHostFunc([&copied] { copied = true; }));
  ASSERT_OK(compute->Synchronize());
  ASSERT_OK(copy->Synchronize());
  EXPECT_TRUE(saw_copy);
  EXPECT_OK(backend->FreeDevice(d));
}

// A stop request must not wait out a slow link: once the interrupt fires, a copy that would take
// ~17 minutes on a 1 KB/s link completes (with the right bytes) and later copies run at host
// speed. The copy is first seen still running (a capped copy never finishes early), then the
// interrupt ends it; the bound on the wait is generous (the copy would take 1000 s without it).
TEST(CpuBackendTiming, AnInterruptEndsTheLinkEmulation) {
  constexpr int64_t kBytes = 1'000'000;
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB,
                                                       .copy_bandwidth_bytes_per_s = 1000}));
  std::atomic<bool> stop{false};
  std::atomic<int> polls{0};
  ASSERT_OK(SetCpuLinkInterrupt(*backend, [&] {
    polls.fetch_add(1);
    return stop.load();
  }));
  ASSERT_OK_AND_ASSIGN(void* d, backend->AllocateDevice(kBytes));
  std::vector<uint8_t> host(kBytes);
  for (int64_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> back(kBytes, 0);
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(auto event, backend->CreateEvent());
  ASSERT_OK(stream->MemcpyAsync(d, host.data(), kBytes, CopyKind::kHostToDevice));
  ASSERT_OK(stream->RecordEvent(event.get()));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(event->Query()) << "the link time had not passed";
  EXPECT_GT(polls.load(), 0) << "the sleeping copy polls the interrupt";
  const absl::Time start = absl::Now();
  stop.store(true);
  ASSERT_OK(stream->Synchronize());
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  // Later copies, either direction, at host speed.
  const absl::Time again = absl::Now();
  ASSERT_OK(stream->MemcpyAsync(back.data(), d, kBytes, CopyKind::kDeviceToHost));
  ASSERT_OK(stream->Synchronize());
  EXPECT_LT(absl::Now() - again, absl::Seconds(60));
  EXPECT_EQ(back, host);
  EXPECT_OK(backend->FreeDevice(d));
}

TEST(CpuBackendTiming, BandwidthMustBeFinite) {
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THAT(CreateCpuBackend({.capacity_bytes = kMiB, .copy_bandwidth_bytes_per_s = bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("bandwidth")));
  }
}

}  // namespace
}  // namespace ps
