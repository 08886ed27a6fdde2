#include "scheduler/eviction_policy.h"

#include <random>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "scheduler/access_schedule.h"
#include "scheduler/replay.h"

namespace ps {
namespace {

using ::testing::ElementsAre;

TEST(AccessSchedule, NextUseWrapsIntoTheNextIteration) {
  AccessSchedule s;
  ASSERT_OK(s.Record(7, 1));
  ASSERT_OK(s.Record(9, 2));
  ASSERT_OK(s.Record(7, 4));
  ASSERT_OK(s.Record(7, 4));  // repeated: recorded once
  ASSERT_OK(s.Finish(6));
  EXPECT_THAT(s.UsesOf(7), ElementsAre(1, 4));
  EXPECT_EQ(s.NextUse(7, 0), 1);
  EXPECT_EQ(s.NextUse(7, 1), 4);
  EXPECT_EQ(s.NextUse(7, 4), 6 + 1);
  EXPECT_EQ(s.NextUse(9, 3), 6 + 2);
  EXPECT_EQ(s.NextUse(42, 0), AccessSchedule::kNever);
  EXPECT_EQ(s.sequence().size(), 3u);
}

TEST(AccessSchedule, RejectsBadRecordings) {
  AccessSchedule s;
  ASSERT_OK(s.Record(1, 3));
  EXPECT_THAT(s.Record(1, 2), StatusIs(absl::StatusCode::kInvalidArgument, "must not decrease"));
  EXPECT_THAT(s.Finish(3), StatusIs(absl::StatusCode::kInvalidArgument, "only 3 moments"));
  EXPECT_THAT(s.Finish(0), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(s.Finish(4));
  EXPECT_THAT(s.Record(1, 3), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// PatrickStar's unitest/test_eviction_policy.py: chunk 0 used at moment 0, chunk 1 at moment 1.
// At moment 0 the victim is chunk 0; at moment 1 it is chunk 1.
TEST(OptPolicy, PatrickStarTwoChunkCase) {
  AccessSchedule s;
  ASSERT_OK(s.Record(0, 0));
  ASSERT_OK(s.Record(1, 1));
  ASSERT_OK(s.Finish(2));
  OptPolicy opt;
  opt.SetSchedule(&s);
  const std::vector<EvictionCandidate> both = {{0, 10}, {1, 10}};
  EXPECT_THAT(opt.ChooseVictims(both, 10, /*now=*/0), ElementsAre(0));
  EXPECT_THAT(opt.ChooseVictims(both, 10, /*now=*/1), ElementsAre(1));
  EXPECT_THAT(opt.ChooseVictims(both, 11, 0), ElementsAre(0, 1));
  EXPECT_TRUE(opt.ChooseVictims(both, 0, 0).empty());
}

TEST(OptPolicy, EvictsNeverUsedChunksFirstAndActsAsLruInWarmup) {
  OptPolicy opt;
  opt.RecordUse(3, 0);
  opt.RecordUse(1, 1);
  opt.RecordUse(2, 2);
  const std::vector<EvictionCandidate> c = {{1, 1}, {2, 1}, {3, 1}};
  EXPECT_THAT(opt.ChooseVictims(c, 1, 3), ElementsAre(3));  // no schedule yet: LRU
  AccessSchedule s;
  ASSERT_OK(s.Record(1, 0));
  ASSERT_OK(s.Record(2, 1));
  ASSERT_OK(s.Finish(2));
  opt.SetSchedule(&s);
  EXPECT_THAT(opt.ChooseVictims(c, 1, 0), ElementsAre(3));  // 3 is never used again
  EXPECT_THAT(opt.ChooseVictims(c, 2, 0), ElementsAre(3, 1));
}

TEST(LruPolicy, EvictsLeastRecentlyUsed) {
  LruPolicy lru;
  lru.RecordUse(5, 0);
  lru.RecordUse(6, 1);
  lru.RecordUse(5, 2);
  EXPECT_THAT(lru.ChooseVictims({{5, 4}, {6, 4}}, 4, 3), ElementsAre(6));
  EXPECT_THAT(lru.ChooseVictims({{5, 4}, {6, 4}}, 5, 3), ElementsAre(6, 5));
}

TEST(StaticPartitionPolicy, StreamsOthersBeforeTouchingStaticChunks) {
  StaticPartitionPolicy policy({1, 2});
  policy.RecordUse(3, 0);
  policy.RecordUse(1, 1);
  policy.RecordUse(4, 2);
  policy.RecordUse(2, 3);
  const std::vector<EvictionCandidate> c = {{1, 1}, {2, 1}, {3, 1}, {4, 1}};
  EXPECT_THAT(policy.ChooseVictims(c, 2, 4), ElementsAre(3, 4));
  EXPECT_THAT(policy.ChooseVictims(c, 3, 4), ElementsAre(3, 4, 1));
}

TEST(EvictionPolicy, FactoryNamesPolicies) {
  ASSERT_OK_AND_ASSIGN(auto opt, CreateEvictionPolicy("opt"));
  EXPECT_EQ(opt->name(), "opt");
  ASSERT_OK_AND_ASSIGN(auto lru, CreateEvictionPolicy("lru"));
  EXPECT_EQ(lru->name(), "lru");
  ASSERT_OK_AND_ASSIGN(auto st, CreateEvictionPolicy("static", {1}));
  EXPECT_EQ(st->name(), "static");
  EXPECT_THAT(CreateEvictionPolicy("fifo"),
              StatusIs(absl::StatusCode::kInvalidArgument, "opt, lru"));
}

// A random trace: `steps` moments over `chunks` chunks, each step needing 1-2 chunks, capacity
// varying between the step's need and `max_capacity` (the tide).
std::vector<ReplayStep> RandomTrace(std::mt19937& rng, int steps, int chunks, int max_capacity) {
  std::vector<ReplayStep> trace;
  for (int i = 0; i < steps; ++i) {
    ReplayStep step;
    const int a = static_cast<int>(rng() % chunks);
    step.chunks.push_back(a);
    if (rng() % 3 == 0) {
      const int b = static_cast<int>(rng() % chunks);
      if (b != a) step.chunks.push_back(b);
    }
    const int need = static_cast<int>(step.chunks.size());
    step.capacity_chunks = need + static_cast<int>(rng() % (max_capacity - need + 1));
    trace.push_back(step);
  }
  return trace;
}

// OPT that knows the schedule loads exactly the minimum any demand-paging schedule could: checked
// against an exhaustive search over resident sets on many small random traces with random tides.
// Learning the schedule in a warm-up (LRU) iteration first, it can only do worse than that minimum
// in the warm-up; LRU is never better than the minimum.
TEST(OptPolicy, MatchesExhaustiveMinimumOnRandomTraces) {
  std::mt19937 rng(20240520);
  int lru_worse = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int chunks = 2 + static_cast<int>(rng() % 6);
    const int steps = 2 + static_cast<int>(rng() % 10);
    const int max_capacity = 2 + static_cast<int>(rng() % 4);
    const std::vector<ReplayStep> trace = RandomTrace(rng, steps, chunks, max_capacity);
    constexpr int kIterations = 3;
    ASSERT_OK_AND_ASSIGN(int64_t minimum, MinimumLoads(trace, kIterations));
    OptPolicy oracle;
    ASSERT_OK_AND_ASSIGN(ReplayResult best, Replay(trace, kIterations, oracle, true));
    EXPECT_EQ(best.loads, minimum) << "trial " << trial;
    OptPolicy learning;
    ASSERT_OK_AND_ASSIGN(ReplayResult learned, Replay(trace, kIterations, learning));
    EXPECT_GE(learned.loads, minimum);
    LruPolicy lru;
    ASSERT_OK_AND_ASSIGN(ReplayResult lru_result, Replay(trace, kIterations, lru));
    EXPECT_GE(lru_result.loads, minimum);
    lru_worse += lru_result.loads > minimum ? 1 : 0;
  }
  EXPECT_GT(lru_worse, 0) << "the traces never separate LRU from OPT: the test has no power";
}

TEST(Replay, RejectsStepsThatCannotFit) {
  OptPolicy opt;
  const std::vector<ReplayStep> trace = {{{0, 1, 2}, 2}};
  EXPECT_THAT(Replay(trace, 1, opt), StatusIs(absl::StatusCode::kInvalidArgument, "only 2 fit"));
  EXPECT_THAT(MinimumLoads(trace, 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Replay, SteadyStateAfterWarmupOnACyclicTrace) {
  // A forward/backward-shaped trace: chunks 0..5 up, then 5..0 down, capacity 3.
  std::vector<ReplayStep> trace;
  for (int c = 0; c < 6; ++c) trace.push_back({{c}, 3});
  for (int c = 5; c >= 0; --c) trace.push_back({{c}, 3});
  OptPolicy opt;
  ASSERT_OK_AND_ASSIGN(ReplayResult r, Replay(trace, 5, opt));
  ASSERT_EQ(r.loads_per_iteration.size(), 5u);
  EXPECT_LE(r.loads_per_iteration[1], r.loads_per_iteration[0]);
  for (int i = 3; i < 5; ++i) EXPECT_EQ(r.loads_per_iteration[i], r.loads_per_iteration[2]);
  ASSERT_OK_AND_ASSIGN(int64_t minimum, MinimumLoads(trace, 5));
  OptPolicy oracle;
  ASSERT_OK_AND_ASSIGN(ReplayResult best, Replay(trace, 5, oracle, true));
  EXPECT_EQ(best.loads, minimum);
}

}  // namespace
}  // namespace ps
