// TideTrace: what the warm-up iteration learned about one iteration — the non-model "tide" and
// the chunk access sequence.
//
// For every moment m (scheduler/metronome.h) the trace holds the peak non-model bytes (activations,
// workspaces: MemoryTracker's kNonModelData) reached on the accelerator and on the host from the
// start of moment m until the start of moment m+1 — the scheduler reads them with
// MemoryTracker::SnapshotAndResetPeaks() at every tick — and the moments at which each chunk is
// accessed (an AccessSchedule, keyed by the scheduler's dense chunk keys).
//
// Chunkable memory. Chunks resident on the accelerator during moment m must leave room for the
// non-model peak of that moment and, because whatever stays resident is still there when the next
// moment's tide comes in, of the next one:
//
//   ChunkableBytes(m) = budget - max(peak[m], peak[next(m)]) - reserved
//
// where `reserved` covers what the tide does not measure (communication buffers, allocator slack)
// and next() wraps from the last moment to moment 0 of the next iteration. Clamped at 0.
// This is PatrickStar's formula (core/memtracer/memtracer.py) over interval peaks rather than
// instantaneous samples, so a short activation spike between two moments is not missed.
//
// Thread safety: thread-compatible (recorded once, then read).
#ifndef PATRICKSTAR_SCHEDULER_TIDE_TRACE_H_
#define PATRICKSTAR_SCHEDULER_TIDE_TRACE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/access_schedule.h"
#include "scheduler/metronome.h"

namespace ps {

struct TideSample {
  Stage stage = Stage::kForward;
  // Peak non-model bytes from the start of this moment until the start of the next.
  int64_t accelerator_peak_bytes = 0;
  int64_t host_peak_bytes = 0;
};

class TideTrace {
 public:
  TideTrace() = default;

  // Records the tide of moment `moment`. Moments are recorded in order: InvalidArgument unless
  // `moment` == num_recorded(); FailedPrecondition after Finish(); InvalidArgument for negative
  // bytes.
  [[nodiscard]] absl::Status RecordMoment(int64_t moment, const TideSample& sample);

  // Records that chunk `chunk_key` is accessed at `moment` (AccessSchedule::Record's rules).
  [[nodiscard]] absl::Status RecordAccess(int64_t chunk_key, int64_t moment);

  // Closes the trace. InvalidArgument unless exactly `total_moments` (> 0) moments were recorded
  // or an access was recorded at a moment >= total_moments.
  [[nodiscard]] absl::Status Finish(int64_t total_moments);

  bool finished() const { return schedule_.finished(); }
  int64_t num_recorded() const { return static_cast<int64_t>(samples_.size()); }
  int64_t total_moments() const { return schedule_.total_moments(); }

  // REQUIRES: 0 <= moment < num_recorded().
  const TideSample& sample(int64_t moment) const;
  // REQUIRES: finished() and 0 <= moment < total_moments().
  int64_t NextMoment(int64_t moment) const;
  // max(peak[m], peak[next(m)]) on the accelerator. REQUIRES: finished(), 0 <= m < total.
  int64_t AcceleratorTideBytes(int64_t moment) const;
  // See the file comment. REQUIRES: finished(), 0 <= m < total.
  int64_t ChunkableBytes(int64_t moment, int64_t budget_bytes, int64_t reserved_bytes) const;
  // Highest accelerator (host) peak over the moments of `stage`; 0 if it has none.
  int64_t MaxAcceleratorPeakBytes(Stage stage) const;
  int64_t MaxHostPeakBytes(Stage stage) const;
  // Highest accelerator peak over every moment.
  int64_t MaxAcceleratorPeakBytes() const;

  // The access schedule (finished with the trace).
  const AccessSchedule& schedule() const { return schedule_; }
  // Chunk keys accessed at `moment`, in recording order. Empty for a moment without accesses or
  // outside the trace.
  const std::vector<int64_t>& ChunksAt(int64_t moment) const;

 private:
  std::vector<TideSample> samples_;
  AccessSchedule schedule_;
  std::vector<std::vector<int64_t>> chunks_at_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_TIDE_TRACE_H_
