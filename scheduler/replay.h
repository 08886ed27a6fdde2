// Replaying a chunk access trace through an EvictionPolicy, and the exact minimum number of loads
// for the same trace, so policies can be compared with each other and with the optimum.
//
// The model is the scheduler's: every chunk has the same size; at each step (one moment) the
// operator's chunks must all be resident; the accelerator holds at most `capacity_chunks` chunks
// at that step (the tide: capacity falls while activations are high); a chunk not resident is
// loaded (one load); room is made by evicting resident chunks the step does not use, as the policy
// chooses, and only when needed (demand paging).
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_SCHEDULER_REPLAY_H_
#define PATRICKSTAR_SCHEDULER_REPLAY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/eviction_policy.h"

namespace ps {

struct ReplayStep {
  std::vector<int64_t> chunks;  // chunks the step needs resident
  int64_t capacity_chunks = 0;  // how many chunks fit on the accelerator at this step
};

struct ReplayResult {
  int64_t loads = 0;
  int64_t evictions = 0;
  std::vector<int64_t> loads_per_iteration;
};

// Replays `iterations` repetitions of `steps` (one iteration = steps.size() moments, moment i =
// step i), starting with an empty accelerator. By default the first iteration is the warm-up: the
// policy sees its uses and, after it, the finished schedule. With `schedule_known_in_advance` the
// policy gets the schedule before the first step (what an oracle would know), which is what
// comparing OPT with the exact minimum needs. InvalidArgument if a step needs more chunks than its
// capacity.
absl::StatusOr<ReplayResult> Replay(absl::Span<const ReplayStep> steps, int iterations,
                                    EvictionPolicy& policy, bool schedule_known_in_advance = false);

// The minimum number of loads any demand-paging schedule needs for `iterations` repetitions of
// `steps`, by exhaustive dynamic programming over resident sets.
// REQUIRES: every chunk key in [0, 16). Exponential in the number of chunks: for tests.
// `initially_resident` are the chunks on the accelerator before the first step (none by default;
// they may exceed the first step's capacity: evicting them is free).
absl::StatusOr<int64_t> MinimumLoads(absl::Span<const ReplayStep> steps, int iterations,
                                     absl::Span<const int64_t> initially_resident = {});

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_REPLAY_H_
