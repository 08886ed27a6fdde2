// AccessSchedule: when each chunk is used during one training iteration, as recorded in the
// warm-up iteration, and the next-use query OPT eviction is built on.
//
// A *moment* is one step of the metronome (an operator's pre-forward, pre-backward, or the start
// of the optimizer step); an iteration has `total_moments` of them, numbered 0..total-1, and every
// iteration after the warm-up repeats the same sequence. A chunk key is any stable integer naming a
// chunk (the scheduler uses its dense chunk key; see scheduler/chunk_manager.h).
//
// NextUse(chunk, now) is the first recorded moment strictly after `now`; when the chunk is not used
// again this iteration, its first use in the next one (total + first moment): accesses wrap into
// the next iteration, which is what lets OPT keep a chunk that the next forward needs early.
// A chunk never recorded gets kNever.
//
// Thread safety: thread-compatible (built once, then read).
#ifndef PATRICKSTAR_SCHEDULER_ACCESS_SCHEDULE_H_
#define PATRICKSTAR_SCHEDULER_ACCESS_SCHEDULE_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace ps {

class AccessSchedule {
 public:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  AccessSchedule() = default;

  // Records that `chunk` is used at `moment`. Moments must be recorded in non-decreasing order
  // (InvalidArgument otherwise); a repeated (chunk, moment) pair is recorded once.
  [[nodiscard]] absl::Status Record(int64_t chunk, int64_t moment);

  // Closes the recording: the iteration had `total_moments` moments. InvalidArgument if a
  // recorded moment is >= total_moments.
  [[nodiscard]] absl::Status Finish(int64_t total_moments);

  bool finished() const { return total_moments_ > 0; }
  int64_t total_moments() const { return total_moments_; }

  // REQUIRES: finished(). See the file comment.
  int64_t NextUse(int64_t chunk, int64_t now) const;

  // The moments at which `chunk` is used (empty if never).
  const std::vector<int64_t>& UsesOf(int64_t chunk) const;

  // Every (moment, chunk) access in order, as recorded.
  const std::vector<std::pair<int64_t, int64_t>>& sequence() const { return sequence_; }

 private:
  absl::flat_hash_map<int64_t, std::vector<int64_t>> uses_;
  std::vector<std::pair<int64_t, int64_t>> sequence_;  // (moment, chunk)
  int64_t last_moment_ = 0;
  int64_t total_moments_ = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_ACCESS_SCHEDULE_H_
