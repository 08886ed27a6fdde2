#include "scheduler/chunk_events.h"

#include "absl/strings/string_view.h"

namespace ps {

absl::string_view ChunkMoveKindName(ChunkMoveKind kind) {
  switch (kind) {
    case ChunkMoveKind::kLoad:
      return "load";
    case ChunkMoveKind::kPrefetch:
      return "prefetch";
    case ChunkMoveKind::kWriteBack:
      return "write_back";
    case ChunkMoveKind::kWriteBehind:
      return "write_behind";
    case ChunkMoveKind::kCleanEviction:
      return "clean_eviction";
    case ChunkMoveKind::kAllocation:
      return "allocation";
  }
  return "unknown";
}

}  // namespace ps
