// Metronome: the clock of a training iteration, counted in *moments*.
//
// A moment is one step of the schedule the scheduler learns: each operator's pre-forward and
// pre-backward access, the start of the optimizer step, and each chunk access of the optimizer
// step (finer than PatrickStar, which has one ADAM moment, so that OPT also knows the order in
// which the optimizer visits chunks). Every moment belongs to a stage: FWD, BWD or ADAM.
//
// The first iteration is the warm-up: the metronome records the stage of each of its moments and,
// at its end, how many there were. Every later iteration is expected to repeat the warm-up's
// sequence of moments; NextMoment() wraps from the last moment of an iteration to moment 0 of the
// next. A later iteration with more moments than the warm-up is *off the trace* from the first
// extra moment on (in_trace() is false); the scheduler then falls back to its warm-up rules.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_SCHEDULER_METRONOME_H_
#define PATRICKSTAR_SCHEDULER_METRONOME_H_

#include <cstdint>
#include <ostream>
#include <vector>

#include "absl/strings/string_view.h"

namespace ps {

enum class Stage : uint8_t { kForward = 0, kBackward = 1, kAdam = 2 };

inline constexpr int kNumStages = 3;

// "FWD", "BWD", "ADAM".
absl::string_view StageName(Stage stage);
std::ostream& operator<<(std::ostream& os, Stage stage);

class Metronome {
 public:
  Metronome() = default;

  // Starts the next moment, of `stage`, and returns its index in the iteration.
  int64_t Tick(Stage stage);

  // Ends the iteration and returns how many moments it had. The warm-up's count becomes
  // total_moments().
  int64_t EndIteration();

  // The current moment; -1 before the iteration's first Tick.
  int64_t moment() const { return moment_; }
  // Stage of the current moment. REQUIRES: moment() >= 0.
  Stage stage() const { return stage_; }
  // Completed iterations (0 during the warm-up).
  int64_t iteration() const { return iteration_; }
  bool is_warmup() const { return iteration_ == 0; }
  // Moments of the warm-up; 0 until it ended.
  int64_t total_moments() const { return total_moments_; }
  // Whether the current moment is one the warm-up had. False during the warm-up.
  bool in_trace() const { return !is_warmup() && moment_ >= 0 && moment_ < total_moments_; }
  // The moment after `moment`, wrapping into the next iteration. REQUIRES: !is_warmup().
  int64_t NextMoment(int64_t moment) const;
  // The warm-up's stage of each moment (complete once the warm-up ended).
  const std::vector<Stage>& warmup_stages() const { return warmup_stages_; }

 private:
  int64_t moment_ = -1;
  Stage stage_ = Stage::kForward;
  int64_t iteration_ = 0;
  int64_t total_moments_ = 0;
  std::vector<Stage> warmup_stages_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_METRONOME_H_
