// Prefetching and write-behind really overlap copies with compute: on the emulated accelerator with
// a capped link (every chunk copy takes as long as an operator's compute), a training iteration
// with them takes measurably less wall time than without. Timing-sensitive: runs alone
// ("exclusive") and asserts a generous ratio on the fastest of several steady iterations.
#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/training_harness.h"

namespace ps {
namespace {

constexpr int64_t kChunkElems = 64 * 1024;  // 256 KiB f32 chunks
constexpr int64_t kChunkBytes = kChunkElems * 4;
constexpr int kOps = 8;  // one chunk each
// 2 ms per chunk copy in each direction, and 2 ms of compute per operator.
constexpr double kBandwidthBytesPerS = kChunkBytes / 2e-3;
constexpr absl::Duration kCompute = absl::Milliseconds(2);

// Forward over 8 chunks with room for 3, backward writing gradients, the optimizer on the host.
struct Timing {
  absl::Duration fastest;
  ChunkManagerCounters steady;
};

Timing RunTraining(bool overlap) {
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
  config.copy_bandwidth_bytes_per_s = kBandwidthBytesPerS;
  config.compute = kCompute;
  config.verify = false;
  config.options.warmup_chunk_fraction = 0.5;
  config.options.prefetch = overlap;
  config.options.write_behind = overlap;
  Timing t;
  absl::StatusOr<std::unique_ptr<TrainingHarness>> h = TrainingHarness::Create(model, config);
  EXPECT_OK(h);
  if (!h.ok()) return t;
  EXPECT_OK((*h)->Initialize());
  constexpr int kIterations = 5;
  for (int it = 0; it < kIterations; ++it) EXPECT_OK((*h)->RunIteration(program));
  const std::vector<absl::Duration>& times = (*h)->iteration_times();
  t.fastest = *std::min_element(times.begin() + 2, times.end());  // steady iterations
  t.steady = (*h)->manager().iteration_counters().back();
  return t;
}

TEST(ChunkManagerTiming, PrefetchAndWriteBehindOverlapCopiesWithCompute) {
  const Timing without = RunTraining(false);
  const Timing with = RunTraining(true);
  std::cout << "steady iteration without overlap: " << without.fastest << " ("
            << without.steady.DebugString() << ")\nwith prefetch and write-behind: " << with.fastest
            << " (" << with.steady.DebugString() << ")\n";
  // The same bytes move either way...
  EXPECT_EQ(with.steady.Total().moved_bytes(), without.steady.Total().moved_bytes());
  EXPECT_GT(with.steady.prefetches, 0);
  EXPECT_GT(with.steady.write_behinds, 0);
  // ...but with the copies hidden behind compute. Without overlap an operator that loads waits
  // for its copy (2 ms) and then computes (2 ms); with it, mostly just computes.
  EXPECT_LT(absl::FDivDuration(with.fastest, without.fastest), 0.85);
}

}  // namespace
}  // namespace ps
