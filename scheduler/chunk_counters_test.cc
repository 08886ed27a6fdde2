// The counters' arithmetic is derived from their fields: random values through +=, Minus, Total
// and ==, checked against per-field arithmetic on the flat view and on named fields.
#include "scheduler/chunk_counters.h"

#include <cstdint>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

template <typename T>
T Random(std::mt19937_64& rng) {
  typename FlatCounters<T>::Array a;
  for (int64_t& v : a) v = static_cast<int64_t>(rng() % 1'000'000'007) - 500'000'000;
  return FlatCounters<T>::From(a);
}

TEST(ChunkCounters, EveryFieldTakesPartInTheArithmetic) {
  // The fields counted by reading the structs in chunk_counters.h, not derived from them: a
  // field added there must be added here, after checking that the arithmetic and DebugString
  // cover it. TransferCounters: loads, load_bytes, write_backs, write_back_bytes,
  // clean_evictions, allocations. ChunkManagerCounters: by_stage (3 stages of 6), prefetches,
  // prefetch_hits, write_behinds, pressure_reclaims, pressure_evictions,
  // frozen_writeback_bytes, stall_ns, compute_wait_ns, stream_ordered_waits, all_gathers,
  // all_gather_bytes, reduce_scatters, reduce_scatter_bytes, remote_releases, comm_ns (15
  // scalars); the disk tier's disk_reads,
  // disk_read_bytes, disk_writes, disk_write_bytes, disk_read_aheads, disk_read_ahead_hits,
  // disk_write_behinds, disk_drops, disk_read_wait_ns, disk_write_wait_ns, disk_peak_host_bytes
  // (11 scalars).
  EXPECT_EQ(FlatCounters<TransferCounters>::kFields, 6u);
  EXPECT_EQ(FlatCounters<ChunkManagerCounters>::kFields, 3u * 6u + 15u + 11u);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    const ChunkManagerCounters a = Random<ChunkManagerCounters>(rng);
    const ChunkManagerCounters b = Random<ChunkManagerCounters>(rng);
    const auto fa = FlatCounters<ChunkManagerCounters>::Of(a);
    const auto fb = FlatCounters<ChunkManagerCounters>::Of(b);
    const auto diff = FlatCounters<ChunkManagerCounters>::Of(a.Minus(b));
    ChunkManagerCounters sum = a;
    sum += b;
    const auto fsum = FlatCounters<ChunkManagerCounters>::Of(sum);
    for (size_t i = 0; i < fa.size(); ++i) {
      EXPECT_EQ(diff[i], fa[i] - fb[i]) << "field " << i;
      EXPECT_EQ(fsum[i], fa[i] + fb[i]) << "field " << i;
    }
    EXPECT_EQ(sum.Minus(b), a);
    EXPECT_EQ(a.Minus(a), ChunkManagerCounters());
    // Named fields, so a reordering of the struct cannot hide behind the flat view.
    EXPECT_EQ(a.Minus(b).pressure_evictions, a.pressure_evictions - b.pressure_evictions);
    EXPECT_EQ(a.Minus(b).comm_ns, a.comm_ns - b.comm_ns);
    EXPECT_EQ(a.Minus(b).disk_write_wait_ns, a.disk_write_wait_ns - b.disk_write_wait_ns);
    EXPECT_EQ(
        a.Minus(b).stage(Stage::kBackward).write_back_bytes,
        a.stage(Stage::kBackward).write_back_bytes - b.stage(Stage::kBackward).write_back_bytes);
    TransferCounters t = a.stage(Stage::kForward);
    t += a.stage(Stage::kAdam);
    EXPECT_EQ(t.clean_evictions,
              a.stage(Stage::kForward).clean_evictions + a.stage(Stage::kAdam).clean_evictions);
    TransferCounters total;
    for (Stage s : {Stage::kForward, Stage::kBackward, Stage::kAdam}) {
      total.loads += a.stage(s).loads;
      total.allocations += a.stage(s).allocations;
    }
    EXPECT_EQ(a.Total().loads, total.loads);
    EXPECT_EQ(a.Total().allocations, total.allocations);
    EXPECT_EQ(a.Total().moved_bytes(), a.Total().load_bytes + a.Total().write_back_bytes);
  }
}

TEST(ChunkCounters, DebugStringNamesTheTrafficAndZeroOnlyWhenUsed) {
  ChunkManagerCounters c;
  c.stage(Stage::kBackward).write_backs = 3;
  c.stage(Stage::kBackward).write_back_bytes = 3 << 20;
  c.pressure_evictions = 2;
  EXPECT_THAT(c.DebugString(), HasSubstr("BWD: 0 loads (0 B), 3 write-backs (3.00 MiB)"));
  EXPECT_THAT(c.DebugString(), HasSubstr("2 evictions under pressure"));
  EXPECT_THAT(c.DebugString(), HasSubstr("frozen write-back 0 B"));
  EXPECT_THAT(c.DebugString(), ::testing::Not(HasSubstr("ZeRO")));
  c.all_gathers = 1;
  EXPECT_THAT(c.DebugString(), HasSubstr("ZeRO: 1 all-gathers"));
  EXPECT_THAT(c.DebugString(), ::testing::Not(HasSubstr("disk")));
  c.disk_reads = 4;
  c.disk_read_bytes = 4 << 20;
  c.disk_read_aheads = 3;
  c.disk_read_ahead_hits = 2;
  EXPECT_THAT(c.DebugString(), HasSubstr("disk: 4 reads (4.00 MiB, 2 of 3 read-aheads used)"));
}

}  // namespace
}  // namespace ps
