// MonotonicClock: the source of time for the durations and timestamps the library measures
// (chunk copy waits, collectives and chunk events in scheduler/, a training step's phases in
// trainer/), injected so that one clock serves all of them and tests can replace it with a fake
// (base/testing/fake_clock.h). A plain function pointer, as tcmalloc/internal/clock.h's Clock:
// reading it costs one indirect call, copying it is free, and it owns nothing.
//
// Monotonic: readings never decrease and do not jump when the wall clock is set, so differences
// of two readings are durations. A single reading means nothing (its origin is arbitrary; for the
// steady clock, typically the boot): timestamps taken from one clock may only be compared with
// each other. Dates a person reads (file names, logs) come from the wall clock (absl::Now), never
// from here.
//
// Thread safety: now_ns may be called from any thread at any time (chunk copies are timed on the
// copy streams' threads); both the steady clock and the fake are.
#ifndef PATRICKSTAR_BASE_CLOCK_H_
#define PATRICKSTAR_BASE_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace ps {

struct MonotonicClock {
  // Nanoseconds since an arbitrary origin fixed for the process; never decreases.
  int64_t (*now_ns)();
};

// std::chrono::steady_clock, in nanoseconds.
inline int64_t SteadyClockNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The default clock of everything that takes a MonotonicClock.
inline constexpr MonotonicClock kSteadyClock = {&SteadyClockNowNs};

}  // namespace ps

#endif  // PATRICKSTAR_BASE_CLOCK_H_
