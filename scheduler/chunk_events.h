// ChunkEventListener: what the ChunkManager reports as it works, for profilers and progress
// output (the trainer turns these into Chrome trace spans and counters). Reporting is optional
// (ChunkManagerOptions::listener) and changes nothing the manager does: no extra waits, the same
// bytes moved at the same moments.
//
// Copies are timed where they run. For a chunk copy the manager enqueues a host function on the
// copy stream right before the copy (it notes the start time) and one right after (it reports
// the event), so start_ns..end_ns is when the copy stream actually ran the copy, not when it was
// issued; OnChunkMove for copies therefore runs on a copy stream's thread (for CUDA streams, in a
// cudaLaunchHostFunc callback: it must not call CUDA). Moves without a copy (clean evictions,
// fresh allocations) are reported on the calling thread with start_ns == end_ns.
//
// Thread safety: OnChunkMove may be called from the manager's copy-stream threads concurrently
// with the calling thread's OnAccess / OnRelease; implementations synchronize.
#ifndef PATRICKSTAR_SCHEDULER_CHUNK_EVENTS_H_
#define PATRICKSTAR_SCHEDULER_CHUNK_EVENTS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "chunk/chunk_type.h"
#include "scheduler/metronome.h"

namespace ps {

enum class ChunkMoveKind : uint8_t {
  // Host to accelerator, on demand (the access waits for it).
  kLoad = 0,
  // Host to accelerator ahead of the access that needs it.
  kPrefetch = 1,
  // Accelerator to host because the chunk is evicted (or moved for the optimizer) dirty.
  kWriteBack = 2,
  // Accelerator to host started early, at the chunk's last accelerator use of the iteration.
  kWriteBehind = 3,
  // The accelerator copy of a clean chunk dropped: no bytes move.
  kCleanEviction = 4,
  // A released chunk given a fresh accelerator payload: no bytes move.
  kAllocation = 5,
};
// "load", "prefetch", "write_back", "write_behind", "clean_eviction", "allocation".
absl::string_view ChunkMoveKindName(ChunkMoveKind kind);
// True for the kinds that copy bytes.
inline bool IsCopy(ChunkMoveKind kind) {
  return kind == ChunkMoveKind::kLoad || kind == ChunkMoveKind::kPrefetch ||
         kind == ChunkMoveKind::kWriteBack || kind == ChunkMoveKind::kWriteBehind;
}

struct ChunkMoveEvent {
  ChunkMoveKind kind = ChunkMoveKind::kLoad;
  ChunkId chunk;
  // Bytes copied (the chunk's capacity); 0 for kinds that copy nothing.
  int64_t bytes = 0;
  // The pass whose access caused the move, and its moment (-1 outside an iteration).
  Stage stage = Stage::kForward;
  int64_t moment = -1;
  // See the file comment. Clock: ChunkManagerOptions::clock.
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// One access that made chunks resident: an operator's (Access) or the optimizer's (AccessChunks).
struct ChunkAccessEvent {
  // The operator's name, or "adam" for AccessChunks. Valid during the call only.
  absl::string_view name;
  // For AccessChunks: the chunk index; -1 for operators.
  int64_t chunk_index = -1;
  Stage stage = Stage::kForward;
  int64_t moment = -1;
  bool warmup = false;
  // When the access was requested and when its chunks were resident (the difference is the
  // time the caller waited for copies and evictions).
  int64_t request_ns = 0;
  int64_t ready_ns = 0;
  // Right after the access: accelerator bytes of resident chunks (the scheduler's view) and the
  // accelerator's model and non-model bytes in use (its MemoryTracker; the tide).
  int64_t resident_bytes = 0;
  int64_t accelerator_model_bytes = 0;
  int64_t accelerator_non_model_bytes = 0;
};

class ChunkEventListener {
 public:
  virtual ~ChunkEventListener() = default;
  virtual void OnChunkMove(const ChunkMoveEvent& event) = 0;
  virtual void OnAccess(const ChunkAccessEvent& event) = 0;
  // The matching Release / ReleaseChunks (same name and chunk_index as the access).
  virtual void OnRelease(absl::string_view name, int64_t chunk_index, Stage stage,
                         int64_t now_ns) = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_CHUNK_EVENTS_H_
