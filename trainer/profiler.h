// TraceProfiler: turns what the ChunkManager reports (scheduler/chunk_events.h) into a Chrome
// trace (trainer/io/trace_writer.h), so that a run can be read in Perfetto or chrome://tracing:
//   track "operators"       a box per operator access, from the request to the release, in
//                           forward and backward (category "FWD"/"BWD"), with a nested "wait"
//                           box while the access waited for its chunks;
//   track "optimizer"       a box per chunk index the optimizer updates (category "ADAM");
//   track "copies h2d"      a box per chunk load or prefetch, when the copy stream ran it;
//   track "copies d2h"      a box per write-back or write-behind; ticks for clean evictions;
//   counter "accelerator memory"  model data and non-model bytes at every access: the tide.
// The trainer adds its own boxes (steps, evaluation, checkpoints) and marks the warm-up iteration.
//
// Thread safety: the ChunkEventListener methods may be called concurrently (copy streams and
// the training thread), as the listener contract requires; the writer is thread-safe and the
// profiler's own state is touched by the training thread only (OnAccess/OnRelease).
#ifndef PATRICKSTAR_TRAINER_PROFILER_H_
#define PATRICKSTAR_TRAINER_PROFILER_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "scheduler/chunk_events.h"
#include "trainer/io/trace_writer.h"

namespace ps {

class TraceProfiler final : public ChunkEventListener {
 public:
  // `writer` is not owned and must outlive the profiler.
  explicit TraceProfiler(TraceWriter* writer);

  void OnChunkMove(const ChunkMoveEvent& event) override;
  void OnAccess(const ChunkAccessEvent& event) override;
  void OnRelease(absl::string_view name, int64_t chunk_index, Stage stage,
                 int64_t now_ns) override;

  TraceWriter* writer() const { return writer_; }

 private:
  struct Open {
    int64_t request_ns = 0;
    int64_t ready_ns = 0;
  };

  TraceWriter* const writer_;
  const TrackId operators_;
  const TrackId optimizer_;
  const TrackId h2d_;
  const TrackId d2h_;
  // Accesses not yet released, by (name, chunk index). Training thread only.
  absl::flat_hash_map<std::pair<std::string, int64_t>, Open> open_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_PROFILER_H_
