#include "memory/memory_tracker.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr MemoryKind kModel = MemoryKind::kModelData;
constexpr MemoryKind kNonModel = MemoryKind::kNonModelData;

TEST(MemoryTrackerTest, StartsEmpty) {
  MemoryTracker tracker(Device::Accelerator(3));
  EXPECT_EQ(tracker.device(), Device::Accelerator(3));
  const MemoryTrackerSnapshot s = tracker.Snapshot();
  EXPECT_EQ(s.device, Device::Accelerator(3));
  EXPECT_EQ(s.model_bytes, 0);
  EXPECT_EQ(s.non_model_bytes, 0);
  EXPECT_EQ(s.total_bytes, 0);
  EXPECT_EQ(s.peak_model_bytes, 0);
  EXPECT_EQ(s.peak_non_model_bytes, 0);
  EXPECT_EQ(s.peak_total_bytes, 0);
}

TEST(MemoryTrackerTest, KindsAreSeparateAndTotalPeakIsItsOwn) {
  MemoryTracker tracker(Device::Host());
  tracker.Add(kModel, 100);
  tracker.Add(kNonModel, 50);
  EXPECT_EQ(tracker.current_bytes(kModel), 100);
  EXPECT_EQ(tracker.current_bytes(kNonModel), 50);
  EXPECT_EQ(tracker.total_bytes(), 150);
  EXPECT_EQ(tracker.peak_total_bytes(), 150);

  // Model data falls, then non-model data rises: the kinds peak at different times, so the
  // total's peak (170) is below the sum of the kinds' peaks (100 + 120).
  tracker.Subtract(kModel, 50);
  tracker.Add(kNonModel, 70);
  EXPECT_EQ(tracker.peak_bytes(kModel), 100);
  EXPECT_EQ(tracker.peak_bytes(kNonModel), 120);
  EXPECT_EQ(tracker.total_bytes(), 170);
  EXPECT_EQ(tracker.peak_total_bytes(), 170);
}

TEST(MemoryTrackerTest, ResetPeaksSetsPeaksToCurrentNotZero) {
  MemoryTracker tracker(Device::Accelerator(0));
  tracker.Add(kNonModel, 1000);
  tracker.Subtract(kNonModel, 600);
  tracker.Add(kModel, 10);
  EXPECT_EQ(tracker.peak_bytes(kNonModel), 1000);
  tracker.ResetPeaks();
  EXPECT_EQ(tracker.peak_bytes(kNonModel), 400);
  EXPECT_EQ(tracker.peak_bytes(kModel), 10);
  EXPECT_EQ(tracker.peak_total_bytes(), 410);
  // The next interval's peak is what happens in it.
  tracker.Add(kNonModel, 50);
  tracker.Subtract(kNonModel, 450);
  EXPECT_EQ(tracker.peak_bytes(kNonModel), 450);
  EXPECT_EQ(tracker.current_bytes(kNonModel), 0);
}

TEST(MemoryTrackerTest, SnapshotAndResetPeaksReturnsTheEndedInterval) {
  MemoryTracker tracker(Device::Accelerator(0));
  tracker.Add(kNonModel, 300);
  tracker.Subtract(kNonModel, 200);
  const MemoryTrackerSnapshot first = tracker.SnapshotAndResetPeaks();
  EXPECT_EQ(first.peak_non_model_bytes, 300);
  EXPECT_EQ(first.non_model_bytes, 100);
  const MemoryTrackerSnapshot second = tracker.Snapshot();
  EXPECT_EQ(second.peak_non_model_bytes, 100);
  EXPECT_EQ(second.peak_total_bytes, 100);
}

TEST(MemoryTrackerTest, DebugStringNamesDeviceAndAmounts) {
  MemoryTracker tracker(Device::Accelerator(1));
  tracker.Add(kModel, 2 * 1024 * 1024);
  const std::string s = tracker.Snapshot().DebugString();
  EXPECT_NE(s.find("accelerator:1"), std::string::npos) << s;
  EXPECT_NE(s.find("2.00 MiB"), std::string::npos) << s;
}

TEST(MemoryTrackerTest, KindNames) {
  EXPECT_EQ(MemoryKindName(kModel), "model_data");
  EXPECT_EQ(MemoryKindName(kNonModel), "non_model_data");
}

// Replays a random sequence of adds, subtracts and both kinds of resets against a plain model and
// compares every value after every step: the scheduler's peaks and the interval peaks are
// independent.
TEST(MemoryTrackerTest, RandomSequenceMatchesModel) {
  MemoryTracker tracker(Device::Accelerator(0));
  std::mt19937 rng(1234);
  int64_t cur[2] = {0, 0};
  int64_t peak[2] = {0, 0};
  int64_t peak_total = 0;
  int64_t ipeak[2] = {0, 0};
  int64_t ipeak_total = 0;
  int interval_checks = 0;
  for (int step = 0; step < 5000; ++step) {
    const int k = static_cast<int>(rng() % 2);
    const MemoryKind kind = static_cast<MemoryKind>(k);
    const int op = static_cast<int>(rng() % 11);
    if (op < 5) {
      const int64_t bytes = static_cast<int64_t>(rng() % 10000);
      tracker.Add(kind, bytes);
      cur[k] += bytes;
    } else if (op < 9) {
      const int64_t bytes = cur[k] == 0 ? 0 : static_cast<int64_t>(rng() % (cur[k] + 1));
      tracker.Subtract(kind, bytes);
      cur[k] -= bytes;
    } else if (op == 9) {
      tracker.ResetPeaks();
      peak[0] = cur[0];
      peak[1] = cur[1];
      peak_total = cur[0] + cur[1];
    } else {
      const MemoryTrackerSnapshot s = tracker.SnapshotAndResetIntervalPeaks();
      ASSERT_EQ(s.peak_model_bytes, ipeak[0]) << "step " << step;
      ASSERT_EQ(s.peak_non_model_bytes, ipeak[1]) << "step " << step;
      ASSERT_EQ(s.peak_total_bytes, ipeak_total) << "step " << step;
      ASSERT_EQ(s.model_bytes, cur[0]) << "step " << step;
      ipeak[0] = cur[0];
      ipeak[1] = cur[1];
      ipeak_total = cur[0] + cur[1];
      ++interval_checks;
    }
    peak[k] = std::max(peak[k], cur[k]);
    peak_total = std::max(peak_total, cur[0] + cur[1]);
    ipeak[k] = std::max(ipeak[k], cur[k]);
    ipeak_total = std::max(ipeak_total, cur[0] + cur[1]);
    const MemoryTrackerSnapshot s = tracker.Snapshot();
    ASSERT_EQ(s.model_bytes, cur[0]) << "step " << step;
    ASSERT_EQ(s.non_model_bytes, cur[1]) << "step " << step;
    ASSERT_EQ(s.total_bytes, cur[0] + cur[1]) << "step " << step;
    ASSERT_EQ(s.peak_model_bytes, peak[0]) << "step " << step;
    ASSERT_EQ(s.peak_non_model_bytes, peak[1]) << "step " << step;
    ASSERT_EQ(s.peak_total_bytes, peak_total) << "step " << step;
  }
  EXPECT_GT(interval_checks, 100);
}

TEST(MemoryTrackerTest, ConcurrentAddsAndSubtractsBalance) {
  MemoryTracker tracker(Device::Accelerator(0));
  constexpr int kThreads = 4;
  constexpr int kIters = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&tracker, t] {
      const MemoryKind kind = t % 2 == 0 ? kModel : kNonModel;
      for (int i = 0; i < kIters; ++i) {
        tracker.Add(kind, 64);
        if (i % 100 == 0) (void)tracker.SnapshotAndResetPeaks();
        tracker.Subtract(kind, 64);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const MemoryTrackerSnapshot s = tracker.Snapshot();
  EXPECT_EQ(s.total_bytes, 0);
  EXPECT_LE(s.peak_total_bytes, kThreads * 64);
}

TEST(MemoryTrackerDeathTest, SubtractingMoreThanHeldNamesDeviceAndNumbers) {
  MemoryTracker tracker(Device::Accelerator(2));
  tracker.Add(kNonModel, 100);
  EXPECT_DEATH(tracker.Subtract(kNonModel, 101),
               "accelerator:2.*subtracting 101 bytes of non_model_data but only 100");
}

TEST(MemoryTrackerDeathTest, NegativeAddIsABug) {
  MemoryTracker tracker(Device::Host());
  EXPECT_DEATH(tracker.Add(kModel, -1), "negative");
}

}  // namespace
}  // namespace ps
