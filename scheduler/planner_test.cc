// ResidencyPlanner on TideTraces alone (no chunks, no memory): the limits of every moment on and
// off the trace, access and prefetch plans, the ADAM placement, the next-use query, and random
// traces checked against the formulas of scheduler/planner.h.
#include "scheduler/planner.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "chunk/chunk_type.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/chunk_keys.h"
#include "scheduler/metronome.h"
#include "scheduler/tide_trace.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct MomentSpec {
  Stage stage;
  int64_t peak_bytes;
  std::vector<int64_t> keys;  // dense chunk keys accessed at the moment
};

TideTrace MakeTrace(const std::vector<MomentSpec>& moments) {
  TideTrace t;
  for (size_t m = 0; m < moments.size(); ++m) {
    const int64_t moment = static_cast<int64_t>(m);
    EXPECT_OK(t.RecordMoment(moment, {moments[m].stage, moments[m].peak_bytes, 0}));
    for (int64_t key : moments[m].keys) EXPECT_OK(t.RecordAccess(key, moment));
  }
  EXPECT_OK(t.Finish(static_cast<int64_t>(moments.size())));
  return t;
}

ResidencyPlanner MakePlanner(const PlannerOptions& o) {
  absl::StatusOr<ResidencyPlanner> p = ResidencyPlanner::Create(o);
  EXPECT_OK(p);
  return *std::move(p);
}

// Four param chunks (keys 0..3 with num_chunks 4), 10-byte chunks: forward 0 1 2, backward 2 1 0,
// then the optimizer.
constexpr int64_t kCost = 10;
const std::vector<MomentSpec> kMoments = {
    {Stage::kForward, 5, {0}},   {Stage::kForward, 20, {1}},  {Stage::kForward, 40, {2}},
    {Stage::kBackward, 40, {2}}, {Stage::kBackward, 25, {1}}, {Stage::kBackward, 10, {0}},
    {Stage::kAdam, 0, {}},
};
constexpr PlannerOptions kOptions{.budget_bytes = 100,
                                  .reserved_bytes = 6,
                                  .warmup_chunk_fraction = 0.25,
                                  .chunk_cost_bytes = kCost,
                                  .adam_margin_bytes = 0,
                                  .num_chunks = 4};

TEST(ResidencyPlanner, LimitsOnTheTraceLeaveRoomForThisAndTheNextMoment) {
  const TideTrace trace = MakeTrace(kMoments);
  ResidencyPlanner p = MakePlanner(kOptions);
  EXPECT_FALSE(p.OnTrace(0));  // no trace yet
  p.SetTrace(&trace);
  EXPECT_TRUE(p.OnTrace(0));
  EXPECT_TRUE(p.OnTrace(6));
  EXPECT_FALSE(p.OnTrace(7));
  EXPECT_FALSE(p.OnTrace(-1));
  // budget - max(peak[m], peak[m+1]) - reserved.
  EXPECT_EQ(p.ChunkableBytes(0), 100 - 20 - 6);
  EXPECT_EQ(p.ChunkableBytes(1), 100 - 40 - 6);
  EXPECT_EQ(p.ChunkableBytes(6), 100 - 5 - 6);  // wraps to moment 0
  MomentLimits l = p.LimitsAt(1, /*nonmodel_now_bytes=*/0);
  EXPECT_TRUE(l.known);
  EXPECT_EQ(l.tide_bytes, 40);
  EXPECT_EQ(l.target_bytes, 100 - 40 - 6);
  EXPECT_EQ(l.hard_bytes, 100 - 20 - 6);  // this moment's own peak
  // More non-model data now than the trace says: the hard limit follows it, the target stays
  // under the hard limit.
  l = p.LimitsAt(1, 80);
  EXPECT_EQ(l.hard_bytes, 100 - 80 - 6);
  EXPECT_EQ(l.target_bytes, l.hard_bytes);
  l = p.LimitsAt(1, 200);
  EXPECT_EQ(l.hard_bytes, 0);
  EXPECT_EQ(l.target_bytes, 0);
}

// Free space stranded in the activation segments beyond the slack ("unplanned"): the target
// shrinks by it, on and off the trace, never below 0; the hard limit (whether the access can run
// at all) does not, and an access whose working set exceeds the lowered target still fits.
TEST(ResidencyPlanner, UnplannedBytesLowerTheTargetNotTheHardLimit) {
  const TideTrace trace = MakeTrace(kMoments);
  ResidencyPlanner p = MakePlanner(kOptions);
  p.SetTrace(&trace);
  for (int64_t unplanned : {int64_t{0}, int64_t{7}, int64_t{50}, int64_t{1000}}) {
    SCOPED_TRACE(unplanned);
    for (int64_t moment : {int64_t{1}, int64_t{-1}}) {
      const MomentLimits plain = p.LimitsAt(moment, 10);
      const MomentLimits l = p.LimitsAt(moment, 10, unplanned);
      EXPECT_EQ(l.hard_bytes, plain.hard_bytes);
      EXPECT_EQ(l.target_bytes, std::max<int64_t>(0, plain.target_bytes - unplanned));
    }
    const AccessPlan a = p.PlanAccess(1, 10, /*resident_bytes=*/50, /*own_bytes=*/10,
                                      /*stuck_bytes=*/0, /*missing_bytes=*/10, unplanned);
    EXPECT_TRUE(a.fits);
    EXPECT_EQ(a.limit_bytes, std::max<int64_t>(10, 100 - 40 - 6 - unplanned));
    EXPECT_EQ(a.evict_bytes, std::max<int64_t>(0, 50 + 10 - a.limit_bytes));
  }
}

TEST(ResidencyPlanner, OffTheTraceTheWarmupShareApplies) {
  const TideTrace trace = MakeTrace(kMoments);
  ResidencyPlanner p = MakePlanner(kOptions);
  for (bool with_trace : {false, true}) {
    SCOPED_TRACE(with_trace ? "trace" : "no trace");
    if (with_trace) p.SetTrace(&trace);
    for (int64_t moment : {int64_t{-1}, int64_t{7}, int64_t{100}}) {
      if (!with_trace) moment = std::max<int64_t>(moment, 0);
      const MomentLimits l = p.LimitsAt(moment, 30);
      EXPECT_FALSE(l.known);
      EXPECT_EQ(l.tide_bytes, 30);
      EXPECT_EQ(l.hard_bytes, 100 - 30 - 6);
      EXPECT_EQ(l.target_bytes, 25);  // 0.25 of the budget
    }
  }
  EXPECT_EQ(p.LimitsAt(-1, 90).target_bytes, 4);  // capped by the hard limit
}

TEST(ResidencyPlanner, AccessPlans) {
  const TideTrace trace = MakeTrace(kMoments);
  ResidencyPlanner p = MakePlanner(kOptions);
  p.SetTrace(&trace);
  // Moment 2: target 100 - 40 - 6 = 54, hard 54. Five chunks resident and one missing: the 6
  // bytes over the limit must go.
  AccessPlan a = p.PlanAccess(2, 0, /*resident_bytes=*/50, /*own_bytes=*/10, /*stuck_bytes=*/0,
                              /*missing_bytes=*/10);
  EXPECT_TRUE(a.fits);
  EXPECT_EQ(a.own_bytes, 10);
  EXPECT_EQ(a.working_set_bytes, 10);
  EXPECT_EQ(a.limit_bytes, 54);
  EXPECT_EQ(a.evict_bytes, 50 + 10 - 54);
  // A working set above the target but under the hard limit: the limit is the working set.
  a = p.PlanAccess(2, 0, 0, 20, 30, 20);
  EXPECT_TRUE(a.fits);
  EXPECT_EQ(a.working_set_bytes, 50);
  EXPECT_EQ(a.limit_bytes, 54);
  a = p.PlanAccess(2, 0, 60, 30, 30, 30);
  EXPECT_FALSE(a.fits);  // 60 > 54
  EXPECT_EQ(a.limit_bytes, 60);
  // Nothing to evict when everything fits.
  EXPECT_EQ(p.PlanAccess(0, 0, 10, 10, 0, 10).evict_bytes, 0);
}

TEST(ResidencyPlanner, PrefetchStaysInTheIterationAndEvictsOnlyWhatTheDemandAccessWould) {
  const TideTrace trace = MakeTrace(kMoments);
  ResidencyPlanner p = MakePlanner(kOptions);
  EXPECT_EQ(p.PrefetchMoment(0), -1);  // nothing known yet
  p.SetTrace(&trace);
  EXPECT_EQ(p.PrefetchMoment(0), 1);
  EXPECT_EQ(p.PrefetchMoment(4), 5);
  EXPECT_EQ(p.PrefetchMoment(5), -1);  // the next moment is ADAM
  EXPECT_EQ(p.PrefetchMoment(6), -1);  // not across iterations
  EXPECT_EQ(p.PrefetchMoment(-1), -1);
  // After moment 0 (target 74): 60 resident + 10 missing fit.
  PrefetchPlan f = p.PlanPrefetch(0, 0, 60, 10, 10);
  EXPECT_TRUE(f.allowed);
  EXPECT_EQ(f.evict_bytes, 0);
  // After moment 1 (target 54): 60 + 10 is 16 over; moment 2's own limit (54) asks the same.
  f = p.PlanPrefetch(1, 0, 60, 10, 10);
  EXPECT_TRUE(f.allowed);
  EXPECT_EQ(f.evict_bytes, 16);
  // After moment 3 (target 100 - 40 - 6 = 54) towards moment 4 (limit 100 - 25 - 6 = 69): the
  // demand access would evict only 1 of the 16 bytes now over: wait for it.
  f = p.PlanPrefetch(3, 0, 60, 10, 10);
  EXPECT_FALSE(f.allowed);
}

TEST(ResidencyPlanner, AdamPlacementKeepsStateWhereItCanStay) {
  const TideTrace trace = MakeTrace(kMoments);
  PlannerOptions o = kOptions;
  ResidencyPlanner p = MakePlanner(o);
  p.SetTrace(&trace);
  // min over moments of ChunkableBytes: 100 - 40 - 6 = 54; minus the 3 param chunks used on the
  // accelerator (30) = 24: room for no triple of 30 bytes.
  AdamPlacement a = p.PlanAdam({0, 1, 2, 3});
  EXPECT_EQ(a.available_bytes, 24);
  EXPECT_THAT(a.accelerator_chunks, IsEmpty());
  // A larger budget: 200 - 40 - 6 - 30 = 124: four triples, but only the indices given.
  o.budget_bytes = 200;
  p = MakePlanner(o);
  p.SetTrace(&trace);
  a = p.PlanAdam({0, 1, 2, 3});
  EXPECT_EQ(a.available_bytes, 124);
  EXPECT_THAT(a.accelerator_chunks, ElementsAre(0, 1, 2, 3));
  // Room for two: the param chunks used last (0 at moment 5, then 1 at moment 4) come first.
  o.adam_margin_bytes = 124 - 60;
  p = MakePlanner(o);
  p.SetTrace(&trace);
  a = p.PlanAdam({3, 2, 1, 0});
  EXPECT_EQ(a.available_bytes, 60);
  EXPECT_THAT(a.accelerator_chunks, ElementsAre(0, 1));
  EXPECT_TRUE(a.OnAccelerator(1));
  EXPECT_FALSE(a.OnAccelerator(2));
  // ZeRO: only the indices whose state this rank holds.
  a = p.PlanAdam({1, 3});
  EXPECT_THAT(a.accelerator_chunks, ElementsAre(1, 3));
  // An index never used on the accelerator comes after every used one.
  o.adam_margin_bytes = 124 - 30;
  p = MakePlanner(o);
  p.SetTrace(&trace);
  EXPECT_THAT(p.PlanAdam({2, 3}).accelerator_chunks, ElementsAre(2));
  // 16-bit param chunks cost half: 54 - 3 x 5 = 39 leaves room for one f32 triple of 30.
  o = kOptions;
  o.param_chunk_cost_bytes = kCost / 2;
  p = MakePlanner(o);
  p.SetTrace(&trace);
  EXPECT_EQ(p.ChunkCostBytes(ChunkType::kParam), 5);
  EXPECT_EQ(p.KeyCostBytes(p.keys().Key(ChunkType::kMomentum, 1)), kCost);
  a = p.PlanAdam({0, 1, 2, 3});
  EXPECT_EQ(a.available_bytes, 39);
  EXPECT_THAT(a.accelerator_chunks, ElementsAre(0));
}

TEST(ResidencyPlanner, NextUseInTheIteration) {
  const TideTrace trace = MakeTrace(kMoments);
  ResidencyPlanner p = MakePlanner(kOptions);
  p.SetTrace(&trace);
  EXPECT_TRUE(p.UsedLaterInIteration(/*key=*/2, 2));  // again at moment 3
  EXPECT_FALSE(p.UsedLaterInIteration(2, 3));         // next use in the next iteration
  EXPECT_TRUE(p.UsedLaterInIteration(0, 0));          // at moment 5
  EXPECT_FALSE(p.UsedLaterInIteration(0, 5));
  const ChunkKeys keys = p.keys();
  EXPECT_FALSE(p.UsedLaterInIteration(keys.Key(ChunkType::kMaster, 0), 0));  // never used
}

TEST(ResidencyPlanner, RejectsBadOptions) {
  const auto bad = [](PlannerOptions o) { return ResidencyPlanner::Create(o).status(); };
  PlannerOptions o = kOptions;
  o.budget_bytes = 0;
  EXPECT_THAT(bad(o), StatusIs(absl::StatusCode::kInvalidArgument, "budget_bytes"));
  o = kOptions;
  o.chunk_cost_bytes = 0;
  EXPECT_THAT(bad(o), StatusIs(absl::StatusCode::kInvalidArgument, "chunk_cost_bytes"));
  o = kOptions;
  o.warmup_chunk_fraction = 1.5;
  EXPECT_THAT(bad(o), StatusIs(absl::StatusCode::kInvalidArgument, "warmup_chunk_fraction"));
  o = kOptions;
  o.reserved_bytes = -1;
  EXPECT_THAT(bad(o), StatusIs(absl::StatusCode::kInvalidArgument, "reserved_bytes"));
  o = kOptions;
  o.param_chunk_cost_bytes = -1;
  EXPECT_THAT(bad(o), StatusIs(absl::StatusCode::kInvalidArgument, "param_chunk_cost_bytes"));
  EXPECT_OK(ResidencyPlanner::Create(kOptions).status());
}

// Random traces, budgets and states: every answer obeys the formulas and invariants of the file
// comment of scheduler/planner.h.
TEST(ResidencyPlanner, RandomTracesObeyTheFormulas) {
  std::mt19937_64 rng(20240917);
  const auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const int64_t num_chunks = uniform(1, 8);
    std::vector<MomentSpec> moments;
    const int64_t n = uniform(1, 20);
    for (int64_t m = 0; m < n; ++m) {
      const Stage stage =
          m == n - 1 ? Stage::kAdam : (m < n / 2 ? Stage::kForward : Stage::kBackward);
      MomentSpec spec{stage, uniform(0, 500), {}};
      if (stage != Stage::kAdam) spec.keys.push_back(uniform(0, num_chunks - 1));
      moments.push_back(spec);
    }
    const TideTrace trace = MakeTrace(moments);
    PlannerOptions o{.budget_bytes = uniform(1, 1000),
                     .reserved_bytes = uniform(0, 100),
                     .warmup_chunk_fraction = static_cast<double>(uniform(1, 100)) / 100,
                     .chunk_cost_bytes = uniform(1, 60),
                     .adam_margin_bytes = uniform(0, 50),
                     .num_chunks = num_chunks};
    // Half the trials with cheaper (16-bit) param chunks.
    if (uniform(0, 1) == 1) o.param_chunk_cost_bytes = uniform(1, o.chunk_cost_bytes);
    ResidencyPlanner p = MakePlanner(o);
    const int64_t pc = p.ChunkCostBytes(ChunkType::kParam);
    EXPECT_EQ(pc, o.param_chunk_cost_bytes > 0 ? o.param_chunk_cost_bytes : o.chunk_cost_bytes);
    EXPECT_EQ(p.ChunkCostBytes(ChunkType::kVariance), o.chunk_cost_bytes);
    p.SetTrace(&trace);
    int64_t min_chunkable = o.budget_bytes;
    for (int64_t m = 0; m < n; ++m) {
      const int64_t now = uniform(0, 600);
      const MomentLimits l = p.LimitsAt(m, now);
      const int64_t next_peak = moments[(m + 1) % n].peak_bytes;
      const int64_t chunkable = std::max<int64_t>(
          0, o.budget_bytes - std::max(moments[m].peak_bytes, next_peak) - o.reserved_bytes);
      EXPECT_EQ(p.ChunkableBytes(m), chunkable);
      min_chunkable = std::min(min_chunkable, chunkable);
      EXPECT_EQ(l.hard_bytes,
                std::max<int64_t>(
                    0, o.budget_bytes - std::max(moments[m].peak_bytes, now) - o.reserved_bytes));
      EXPECT_EQ(l.target_bytes, std::min(l.hard_bytes, chunkable));
      EXPECT_GE(l.target_bytes, 0);
      const int64_t resident = pc * uniform(0, 8);
      const AccessPlan a = p.PlanAccess(m, now, resident, pc * uniform(1, 3), pc * uniform(0, 2),
                                        pc * uniform(0, 3));
      EXPECT_EQ(a.fits, a.working_set_bytes <= l.hard_bytes);
      EXPECT_EQ(a.limit_bytes, std::max(l.target_bytes, a.working_set_bytes));
      EXPECT_GE(a.evict_bytes, 0);
      const int64_t next = p.PrefetchMoment(m);
      if (next >= 0) {
        EXPECT_EQ(next, m + 1);
        EXPECT_NE(moments[next].stage, Stage::kAdam);
        const int64_t missing = uniform(1, 2);
        const PrefetchPlan f = p.PlanPrefetch(m, now, resident, pc * missing, pc);
        if (f.allowed && f.evict_bytes > 0) {
          // Never more than the demand access at `next` would evict.
          const int64_t demand = resident + pc * missing - std::max(p.ChunkableBytes(next), pc);
          EXPECT_LE(f.evict_bytes, demand);
          // And exactly what keeps this moment under its target.
          EXPECT_EQ(resident + pc * missing - f.evict_bytes, l.target_bytes);
        }
      }
    }
    std::vector<int64_t> state;
    for (int64_t i = 0; i < num_chunks; ++i) {
      if (uniform(0, 3) > 0) state.push_back(i);
    }
    const AdamPlacement a = p.PlanAdam(state);
    EXPECT_TRUE(std::is_sorted(a.accelerator_chunks.begin(), a.accelerator_chunks.end()));
    for (int64_t i : a.accelerator_chunks) {
      EXPECT_TRUE(std::find(state.begin(), state.end(), i) != state.end()) << i;
    }
    EXPECT_LE(3 * o.chunk_cost_bytes * static_cast<int64_t>(a.accelerator_chunks.size()),
              a.available_bytes);
    EXPECT_LE(a.available_bytes, std::max<int64_t>(0, min_chunkable - o.adam_margin_bytes));
    // As many triples as fit, or every state index.
    EXPECT_EQ(static_cast<int64_t>(a.accelerator_chunks.size()),
              std::min<int64_t>(a.available_bytes / (3 * o.chunk_cost_bytes),
                                static_cast<int64_t>(state.size())));
  }
}

}  // namespace
}  // namespace ps
