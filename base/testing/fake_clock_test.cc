#include "base/testing/fake_clock.h"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(FakeClock, MovesOnlyWhenAdvancedWithoutAStep) {
  FakeClock fake(500);
  const MonotonicClock clock = fake.clock();
  EXPECT_EQ(clock.now_ns(), 500);
  EXPECT_EQ(clock.now_ns(), 500);
  fake.Advance(25);
  EXPECT_EQ(clock.now_ns(), 525);
  EXPECT_EQ(fake.time_ns(), 525);
  EXPECT_EQ(fake.reads(), 3);
}

TEST(FakeClock, EachReadingStepsTheTime) {
  FakeClock fake(-100, 7);
  const MonotonicClock clock = fake.clock();
  EXPECT_EQ(clock.now_ns(), -100);
  EXPECT_EQ(clock.now_ns(), -93);
  fake.Advance(1000);
  EXPECT_EQ(clock.now_ns(), 914);
  EXPECT_EQ(fake.time_ns(), 921);
  EXPECT_EQ(fake.reads(), 3);
}

TEST(FakeClock, ANewFakeStartsAfresh) {
  {
    FakeClock fake(10, 1);
    fake.clock().now_ns();
  }
  FakeClock fake(0, 0);
  EXPECT_EQ(fake.reads(), 0);
  EXPECT_EQ(fake.clock().now_ns(), 0);
}

// Concurrent readers with a step each get a time of their own: no two readings are equal, and
// together they are exactly the times of the readings in some order.
TEST(FakeClock, ConcurrentReadingsAreDistinct) {
  constexpr int kThreads = 4, kReadsEach = 1000;
  FakeClock fake(0, 3);
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const MonotonicClock clock = fake.clock();
      for (int i = 0; i < kReadsEach; ++i) seen[t].push_back(clock.now_ns());
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<int64_t> all;
  for (const std::vector<int64_t>& s : seen) {
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));  // monotonic on each thread
    all.insert(all.end(), s.begin(), s.end());
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), size_t{kThreads * kReadsEach});
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], 3 * static_cast<int64_t>(i));
  EXPECT_EQ(fake.reads(), kThreads * kReadsEach);
}

}  // namespace
}  // namespace ps
