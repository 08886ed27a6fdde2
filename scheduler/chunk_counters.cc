#include "scheduler/chunk_counters.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/units.h"

namespace ps {

TransferCounters& TransferCounters::operator+=(const TransferCounters& o) {
  *this = FlatCounters<TransferCounters>::Combine(*this, o, 1);
  return *this;
}

TransferCounters ChunkManagerCounters::Total() const {
  TransferCounters total;
  for (const TransferCounters& s : by_stage) total += s;
  return total;
}

ChunkManagerCounters ChunkManagerCounters::Minus(const ChunkManagerCounters& earlier) const {
  return FlatCounters<ChunkManagerCounters>::Combine(*this, earlier, -1);
}

ChunkManagerCounters& ChunkManagerCounters::operator+=(const ChunkManagerCounters& o) {
  *this = FlatCounters<ChunkManagerCounters>::Combine(*this, o, 1);
  return *this;
}

std::string ChunkManagerCounters::DebugString() const {
  std::string out;
  for (Stage s : {Stage::kForward, Stage::kBackward, Stage::kAdam}) {
    const TransferCounters& c = stage(s);
    absl::StrAppend(&out, StageName(s), ": ", c.loads, " loads (", FormatBytes(c.load_bytes), "), ",
                    c.write_backs, " write-backs (", FormatBytes(c.write_back_bytes), "), ",
                    c.clean_evictions, " clean evictions, ", c.allocations, " allocations; ");
  }
  absl::StrAppend(&out, prefetches, " prefetches, ", prefetch_hits, " prefetch hits, ",
                  write_behinds, " write-behinds, ", pressure_evictions,
                  " evictions under pressure, stall ", absl::StrFormat("%.3f ms", stall_ns / 1e6),
                  ", compute wait ", absl::StrFormat("%.3f ms", compute_wait_ns / 1e6),
                  ", frozen write-back ", FormatBytes(frozen_writeback_bytes));
  if (all_gathers > 0 || reduce_scatters > 0) {
    absl::StrAppend(&out, "; ZeRO: ", all_gathers, " all-gathers (", FormatBytes(all_gather_bytes),
                    " in), ", reduce_scatters, " reduce-scatters (",
                    FormatBytes(reduce_scatter_bytes), " out), ", remote_releases,
                    " remote payloads freed, ", absl::StrFormat("%.3f ms", comm_ns / 1e6),
                    " in collectives");
  }
  if (disk_reads > 0 || disk_writes > 0 || disk_peak_host_bytes > 0) {
    absl::StrAppend(&out, "; disk: ", disk_reads, " reads (", FormatBytes(disk_read_bytes), ", ",
                    disk_read_ahead_hits, " of ", disk_read_aheads, " read-aheads used), ",
                    disk_writes, " writes (", FormatBytes(disk_write_bytes), ", ",
                    disk_write_behinds, " behind), ", disk_drops, " clean drops, read wait ",
                    absl::StrFormat("%.3f ms", disk_read_wait_ns / 1e6), ", write wait ",
                    absl::StrFormat("%.3f ms", disk_write_wait_ns / 1e6), ", host peak ",
                    FormatBytes(disk_peak_host_bytes));
  }
  return out;
}

}  // namespace ps
