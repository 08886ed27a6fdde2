#include "scheduler/tide_trace.h"

#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/metronome.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(Metronome, CountsMomentsAndLearnsTheWarmupLength) {
  Metronome m;
  EXPECT_TRUE(m.is_warmup());
  EXPECT_EQ(m.moment(), -1);
  EXPECT_FALSE(m.in_trace());
  EXPECT_EQ(m.Tick(Stage::kForward), 0);
  EXPECT_EQ(m.Tick(Stage::kForward), 1);
  EXPECT_EQ(m.Tick(Stage::kBackward), 2);
  EXPECT_EQ(m.stage(), Stage::kBackward);
  EXPECT_EQ(m.Tick(Stage::kAdam), 3);
  EXPECT_FALSE(m.in_trace());  // nothing known during the warm-up
  EXPECT_EQ(m.EndIteration(), 4);
  EXPECT_FALSE(m.is_warmup());
  EXPECT_EQ(m.iteration(), 1);
  EXPECT_EQ(m.total_moments(), 4);
  EXPECT_THAT(m.warmup_stages(),
              ElementsAre(Stage::kForward, Stage::kForward, Stage::kBackward, Stage::kAdam));
  EXPECT_EQ(m.NextMoment(2), 3);
  EXPECT_EQ(m.NextMoment(3), 0);  // wraps into the next iteration

  for (int i = 0; i < 4; ++i) {
    m.Tick(Stage::kForward);
    EXPECT_TRUE(m.in_trace());
  }
  m.Tick(Stage::kForward);  // a fifth moment: off the trace
  EXPECT_FALSE(m.in_trace());
  EXPECT_EQ(m.EndIteration(), 5);
  EXPECT_EQ(m.total_moments(), 4);  // the warm-up's count stays
  EXPECT_THAT(m.warmup_stages().size(), 4u);
}

TEST(Metronome, StageNames) {
  EXPECT_EQ(StageName(Stage::kForward), "FWD");
  EXPECT_EQ(StageName(Stage::kBackward), "BWD");
  EXPECT_EQ(StageName(Stage::kAdam), "ADAM");
}

// A tide that rises in forward and falls in backward, as activations do.
TideTrace RisingAndFallingTide() {
  TideTrace t;
  const std::vector<std::pair<Stage, int64_t>> peaks = {
      {Stage::kForward, 10},  {Stage::kForward, 30},  {Stage::kForward, 60},
      {Stage::kBackward, 50}, {Stage::kBackward, 20}, {Stage::kAdam, 5}};
  for (size_t m = 0; m < peaks.size(); ++m) {
    EXPECT_OK(t.RecordMoment(m, {peaks[m].first, peaks[m].second, /*host=*/100 + int64_t(m)}));
  }
  return t;
}

TEST(TideTrace, ChunkableMemoryLeavesRoomForThisAndTheNextMoment) {
  TideTrace t = RisingAndFallingTide();
  ASSERT_OK(t.RecordAccess(/*chunk_key=*/0, 0));
  ASSERT_OK(t.RecordAccess(1, 1));
  ASSERT_OK(t.RecordAccess(2, 2));
  ASSERT_OK(t.RecordAccess(2, 3));
  ASSERT_OK(t.RecordAccess(0, 4));
  ASSERT_OK(t.RecordAccess(1, 4));
  ASSERT_OK(t.Finish(6));
  EXPECT_TRUE(t.finished());
  constexpr int64_t kBudget = 100;
  // budget - max(peak[m], peak[m+1]) - reserved.
  EXPECT_EQ(t.ChunkableBytes(0, kBudget, 0), 100 - 30);
  EXPECT_EQ(t.ChunkableBytes(1, kBudget, 0), 100 - 60);  // the next moment's tide is higher
  EXPECT_EQ(t.ChunkableBytes(2, kBudget, 0), 100 - 60);
  EXPECT_EQ(t.ChunkableBytes(3, kBudget, 0), 100 - 50);
  EXPECT_EQ(t.ChunkableBytes(4, kBudget, 4), 100 - 20 - 4);
  EXPECT_EQ(t.ChunkableBytes(5, kBudget, 0), 100 - 10);  // wraps to moment 0
  EXPECT_EQ(t.ChunkableBytes(2, 50, 0), 0);              // clamped
  EXPECT_EQ(t.AcceleratorTideBytes(1), 60);
  EXPECT_EQ(t.MaxAcceleratorPeakBytes(Stage::kForward), 60);
  EXPECT_EQ(t.MaxAcceleratorPeakBytes(Stage::kBackward), 50);
  EXPECT_EQ(t.MaxAcceleratorPeakBytes(Stage::kAdam), 5);
  EXPECT_EQ(t.MaxAcceleratorPeakBytes(), 60);
  EXPECT_EQ(t.MaxHostPeakBytes(Stage::kAdam), 105);
  EXPECT_EQ(t.sample(3).stage, Stage::kBackward);
  EXPECT_THAT(t.ChunksAt(4), ElementsAre(0, 1));
  EXPECT_THAT(t.ChunksAt(5), IsEmpty());
  EXPECT_THAT(t.ChunksAt(99), IsEmpty());
  EXPECT_EQ(t.schedule().NextUse(2, 3), 6 + 2);
  EXPECT_EQ(t.NextMoment(5), 0);
}

TEST(TideTrace, RejectsOutOfOrderAndIncompleteRecordings) {
  TideTrace t;
  EXPECT_THAT(t.RecordMoment(1, {}), StatusIs(absl::StatusCode::kInvalidArgument, "next moment"));
  ASSERT_OK(t.RecordMoment(0, {Stage::kForward, 1, 1}));
  EXPECT_THAT(t.RecordMoment(1, {Stage::kForward, -1, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  ASSERT_OK(t.RecordAccess(3, 0));
  EXPECT_THAT(t.Finish(2), StatusIs(absl::StatusCode::kInvalidArgument, "1 were recorded"));
  ASSERT_OK(t.RecordMoment(1, {Stage::kBackward, 2, 2}));
  ASSERT_OK(t.Finish(2));
  EXPECT_THAT(t.RecordMoment(2, {}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(t.RecordAccess(3, 1), StatusIs(absl::StatusCode::kFailedPrecondition));
  TideTrace empty;
  EXPECT_THAT(empty.Finish(0), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ps
