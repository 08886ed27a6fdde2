#include "trainer/profiler.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "chunk/chunk_type.h"
#include "scheduler/chunk_events.h"
#include "scheduler/metronome.h"
#include "trainer/io/trace_writer.h"

namespace ps {

TraceProfiler::TraceProfiler(TraceWriter* writer)
    : writer_(writer),
      operators_(writer->Track("operators")),
      optimizer_(writer->Track("optimizer")),
      h2d_(writer->Track("copies h2d")),
      d2h_(writer->Track("copies d2h")) {}

void TraceProfiler::OnChunkMove(const ChunkMoveEvent& e) {
  if (!writer_->enabled()) return;
  const std::string chunk = e.chunk.ToString();
  const absl::string_view kind = ChunkMoveKindName(e.kind);
  switch (e.kind) {
    case ChunkMoveKind::kLoad:
    case ChunkMoveKind::kPrefetch:
      writer_->Complete(h2d_, absl::StrCat(kind, " ", chunk), StageName(e.stage), e.start_ns,
                        e.end_ns - e.start_ns,
                        {{"bytes", e.bytes}, {"moment", e.moment}, {"chunk", chunk}});
      break;
    case ChunkMoveKind::kWriteBack:
    case ChunkMoveKind::kWriteBehind:
      writer_->Complete(d2h_, absl::StrCat(kind, " ", chunk), StageName(e.stage), e.start_ns,
                        e.end_ns - e.start_ns,
                        {{"bytes", e.bytes}, {"moment", e.moment}, {"chunk", chunk}});
      break;
    case ChunkMoveKind::kCleanEviction:
      writer_->Instant(d2h_, absl::StrCat("drop ", chunk), e.start_ns, InstantScope::kThread,
                       {{"moment", e.moment}});
      break;
    case ChunkMoveKind::kAllocation:
      writer_->Instant(h2d_, absl::StrCat("allocate ", chunk), e.start_ns, InstantScope::kThread,
                       {{"moment", e.moment}});
      break;
  }
}

void TraceProfiler::OnAccess(const ChunkAccessEvent& e) {
  if (!writer_->enabled()) return;
  open_[{std::string(e.name), e.chunk_index}] = Open{e.request_ns, e.ready_ns};
  writer_->Counter("accelerator memory", e.ready_ns,
                   {{"model_data", e.accelerator_model_bytes},
                    {"non_model", e.accelerator_non_model_bytes}});
}

void TraceProfiler::OnRelease(absl::string_view name, int64_t chunk_index, Stage stage,
                              int64_t now_ns) {
  if (!writer_->enabled()) return;
  auto it = open_.find(std::pair<std::string, int64_t>(std::string(name), chunk_index));
  if (it == open_.end()) return;
  const Open o = it->second;
  open_.erase(it);
  const TrackId track = stage == Stage::kAdam ? optimizer_ : operators_;
  const std::string label =
      chunk_index >= 0 ? absl::StrCat(name, " chunk ", chunk_index) : std::string(name);
  writer_->Complete(track, label, StageName(stage), o.request_ns, now_ns - o.request_ns);
  if (o.ready_ns > o.request_ns) {
    writer_->Complete(track, "wait for chunks", "wait", o.request_ns, o.ready_ns - o.request_ns);
  }
}

}  // namespace ps
