#include "base/testing/fake_clock.h"

#include <atomic>
#include <cstdint>

#include "glog/logging.h"

namespace ps {
namespace {

std::atomic<bool> fake_alive{false};
std::atomic<int64_t> fake_now_ns{0};
std::atomic<int64_t> fake_step_ns{0};
std::atomic<int64_t> fake_reads{0};

int64_t ReadFakeClock() {
  CHECK(fake_alive.load()) << "a FakeClock's clock() was read after the FakeClock was destroyed";
  fake_reads.fetch_add(1);
  return fake_now_ns.fetch_add(fake_step_ns.load());
}

}  // namespace

FakeClock::FakeClock(int64_t start_ns, int64_t step_per_read_ns) {
  CHECK_GE(step_per_read_ns, 0);
  CHECK(!fake_alive.exchange(true))
      << "only one FakeClock may exist at a time (its time is global)";
  fake_now_ns.store(start_ns);
  fake_step_ns.store(step_per_read_ns);
  fake_reads.store(0);
}

FakeClock::~FakeClock() { fake_alive.store(false); }

MonotonicClock FakeClock::clock() const { return MonotonicClock{&ReadFakeClock}; }

void FakeClock::Advance(int64_t ns) {
  CHECK_GE(ns, 0) << "a monotonic clock does not go back";
  fake_now_ns.fetch_add(ns);
}

int64_t FakeClock::time_ns() const { return fake_now_ns.load(); }

int64_t FakeClock::reads() const { return fake_reads.load(); }

}  // namespace ps
