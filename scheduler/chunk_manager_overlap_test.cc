// Prefetching and write-behind move the same bytes as demand loading, only earlier: a training
// iteration over a model three times the accelerator's room, with and without them, moves exactly
// the same bytes per stage in the steady state, and with them the copies really are issued ahead
// (prefetches, write-behinds, prefetch hits). How much wall time that saves on a capped link is
// //benchmarks:chunk_overlap_benchmark's measurement, not an assertion here.
#include <vector>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/training_harness.h"

namespace ps {
namespace {

constexpr int64_t kChunkElems = 16 * 1024;  // 64 KiB f32 chunks
constexpr int64_t kChunkBytes = kChunkElems * 4;
constexpr int kOps = 8;  // one chunk each

// Forward over 8 chunks with room for 3, backward writing gradients, the optimizer on the host.
std::vector<ChunkManagerCounters> RunTraining(bool overlap) {
  HarnessModel model{.chunk_elems = kChunkElems,
                     .op_numels = std::vector<int64_t>(kOps, kChunkElems)};
  HarnessProgram program;
  for (int i = 0; i < kOps; ++i) program.steps.push_back({.op = i, .stage = Stage::kForward});
  for (int i = kOps - 1; i >= 0; --i) {
    program.steps.push_back({.op = i, .stage = Stage::kBackward, .write = true});
  }
  program.adam = true;
  program.adam_on_accelerator = false;
  HarnessConfig config;
  config.cap_bytes = 3 * kChunkBytes;
  config.options.warmup_chunk_fraction = 0.5;
  config.options.prefetch = overlap;
  config.options.write_behind = overlap;
  absl::StatusOr<std::unique_ptr<TrainingHarness>> h = TrainingHarness::Create(model, config);
  EXPECT_OK(h);
  if (!h.ok()) return {};
  EXPECT_OK((*h)->Initialize());
  for (int it = 0; it < 4; ++it) EXPECT_OK((*h)->RunIteration(program));
  EXPECT_GT((*h)->verified_tensors(), 0);
  return (*h)->manager().iteration_counters();
}

TEST(ChunkManagerOverlap, PrefetchAndWriteBehindMoveTheSameBytesEarlier) {
  const std::vector<ChunkManagerCounters> without = RunTraining(false);
  const std::vector<ChunkManagerCounters> with = RunTraining(true);
  ASSERT_EQ(without.size(), 4u);
  ASSERT_EQ(with.size(), 4u);
  for (int it = 2; it < 4; ++it) {  // the steady state
    SCOPED_TRACE(it);
    for (Stage s : {Stage::kForward, Stage::kBackward, Stage::kAdam}) {
      EXPECT_EQ(with[it].stage(s).load_bytes, without[it].stage(s).load_bytes) << StageName(s);
    }
    EXPECT_EQ(with[it].Total().moved_bytes(), without[it].Total().moved_bytes());
    EXPECT_EQ(without[it].prefetches, 0);
    EXPECT_EQ(without[it].write_behinds, 0);
    EXPECT_GT(with[it].prefetches, 0);
    EXPECT_EQ(with[it].prefetch_hits, with[it].prefetches);
    EXPECT_GT(with[it].write_behinds, 0);
    // Write-behind makes backward's evictions clean: no demand write-back waits in BWD.
    EXPECT_EQ(with[it].stage(Stage::kBackward).write_backs, with[it].write_behinds);
  }
}

}  // namespace
}  // namespace ps
