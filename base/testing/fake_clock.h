// FakeClock: a MonotonicClock (base/clock.h) for tests, whose time moves only as the test says:
// by Advance, and by a fixed step at every reading if the test asks for one. With a step, every
// interval the code under test measures between two of its readings is (readings between them) x
// step, whatever the machine's speed, so a test can check exactly that a duration came from the
// injected clock and not from another one.
//
//   FakeClock fake(/*start_ns=*/1'000'000, /*step_per_read_ns=*/1000);
//   options.clock = fake.clock();
//   ...
//   EXPECT_EQ(measured_ns, (fake.reads() - reads_before - 1) * 1000);
//
// A MonotonicClock is a plain function pointer, so the fake's time is process-wide (as the fake
// clocks of tcmalloc's tests): at most one FakeClock exists at a time, and reading its clock()
// after it is destroyed CHECK-fails.
//
// Thread safety: clock() may be read from any thread; every reading returns a distinct time when
// the step is positive. Advance and the accessors may be called from any thread.
#ifndef PATRICKSTAR_BASE_TESTING_FAKE_CLOCK_H_
#define PATRICKSTAR_BASE_TESTING_FAKE_CLOCK_H_

#include <cstdint>

#include "base/clock.h"

namespace ps {

class FakeClock {
 public:
  // Time starts at `start_ns`; each reading returns the current time and then advances it by
  // `step_per_read_ns`. REQUIRES: no other FakeClock alive, step_per_read_ns >= 0.
  explicit FakeClock(int64_t start_ns = 0, int64_t step_per_read_ns = 0);
  ~FakeClock();
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  // The clock to inject; valid while this FakeClock lives.
  MonotonicClock clock() const;
  // Moves the time forward by `ns`. REQUIRES: ns >= 0.
  void Advance(int64_t ns);
  // The time the next reading will return (not a reading: reads() is unchanged).
  int64_t time_ns() const;
  // Readings of clock() since this FakeClock was created.
  int64_t reads() const;
};

}  // namespace ps

#endif  // PATRICKSTAR_BASE_TESTING_FAKE_CLOCK_H_
