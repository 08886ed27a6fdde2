#include "base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int64_t task) { runs[task].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << "task " << i << " of " << n;
    }
  }
}

TEST(ThreadPoolTest, UsesSeveralThreads) {
  ThreadPool pool(3);
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  pool.ParallelFor(64, [&](int64_t) {
    const int now = inside.fetch_add(1) + 1;
    int seen = max_inside.load();
    while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    inside.fetch_sub(1);
  });
  EXPECT_GE(max_inside.load(), 2);
}

// Results written by tasks are visible to the caller after ParallelFor returns (TSan checks the
// happens-before edges), across many back-to-back jobs.
TEST(ThreadPoolTest, ManyJobsPublishResults) {
  ThreadPool pool(4);
  std::vector<int64_t> out(257);
  for (int job = 0; job < 200; ++job) {
    pool.ParallelFor(static_cast<int64_t>(out.size()),
                     [&](int64_t task) { out[task] = task * job; });
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int64_t>(i) * job);
  }
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int job = 0; job < 20; ++job) {
        pool.ParallelFor(50, [&](int64_t task) { total.fetch_add(task); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t{3} * 20 * (49 * 50 / 2));
}

}  // namespace
}  // namespace ps
