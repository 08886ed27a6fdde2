#include "chunk/tensor_state.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace ps {
namespace {

using S = TensorState;

// The legal transitions, written out independently of the table in the header.
const std::set<std::pair<S, S>>& Legal() {
  static const auto* legal = new std::set<std::pair<S, S>>{
      {S::kFree, S::kCompute},
      {S::kFree, S::kHold},
      {S::kCompute, S::kHold},
      {S::kCompute, S::kHoldAfterFwd},
      {S::kCompute, S::kHoldAfterBwd},
      {S::kHold, S::kCompute},
      {S::kHold, S::kFree},
      {S::kHoldAfterFwd, S::kCompute},
      {S::kHoldAfterFwd, S::kHold},
      {S::kHoldAfterFwd, S::kFree},
      {S::kHoldAfterBwd, S::kCompute},
      {S::kHoldAfterBwd, S::kHold},
      {S::kHoldAfterBwd, S::kFree},
  };
  return *legal;
}

TEST(TensorState, EveryPairIsLegalExactlyWhenListed) {
  int legal_in_table = 0;
  for (S from : kAllTensorStates) {
    for (S to : kAllTensorStates) {
      const bool expected = Legal().count({from, to}) > 0;
      EXPECT_EQ(IsLegalTransition(from, to), expected) << from << " -> " << to;
      legal_in_table += IsLegalTransition(from, to) ? 1 : 0;
    }
  }
  // The "yes" cells of the header comment's table, counted by hand (2 + 3 + 2 + 3 + 3): the
  // constexpr table holds exactly that many legal pairs, and so does the list above.
  EXPECT_EQ(Legal().size(), 13u);
  EXPECT_EQ(legal_in_table, 13);
}

TEST(TensorState, NoSelfTransitions) {
  for (S s : kAllTensorStates) EXPECT_FALSE(IsLegalTransition(s, s)) << s;
}

TEST(TensorState, ComputeIsLeftOnlyForAHoldState) {
  EXPECT_FALSE(IsLegalTransition(S::kCompute, S::kFree));
  for (S to : {S::kHold, S::kHoldAfterFwd, S::kHoldAfterBwd}) {
    EXPECT_TRUE(IsLegalTransition(S::kCompute, to));
  }
}

TEST(TensorState, Names) {
  EXPECT_EQ(TensorStateName(S::kFree), "FREE");
  EXPECT_EQ(TensorStateName(S::kCompute), "COMPUTE");
  EXPECT_EQ(TensorStateName(S::kHold), "HOLD");
  EXPECT_EQ(TensorStateName(S::kHoldAfterFwd), "HOLD_AFTER_FWD");
  EXPECT_EQ(TensorStateName(S::kHoldAfterBwd), "HOLD_AFTER_BWD");
  EXPECT_EQ(ChunkStateName(ChunkState::kReleased), "RELEASED");
  EXPECT_EQ(LegalTargetsString(S::kFree), "COMPUTE, HOLD");
  EXPECT_EQ(LegalTargetsString(S::kHoldAfterFwd), "FREE, COMPUTE, HOLD");
}

TensorStateCounts Counts(int64_t free, int64_t compute, int64_t hold, int64_t fwd, int64_t bwd) {
  return TensorStateCounts{free, compute, hold, fwd, bwd};
}

TEST(TensorState, ChunkStateDerivationFollowsThePriorityOrder) {
  EXPECT_EQ(DeriveChunkState(false, Counts(3, 0, 0, 0, 0)), ChunkState::kReleased);
  EXPECT_EQ(DeriveChunkState(false, Counts(0, 0, 0, 0, 0)), ChunkState::kReleased);
  EXPECT_EQ(DeriveChunkState(true, Counts(0, 0, 0, 0, 0)), ChunkState::kFree);
  EXPECT_EQ(DeriveChunkState(true, Counts(5, 0, 0, 0, 0)), ChunkState::kFree);
  EXPECT_EQ(DeriveChunkState(true, Counts(1, 1, 1, 1, 1)), ChunkState::kCompute);
  EXPECT_EQ(DeriveChunkState(true, Counts(1, 0, 1, 1, 1)), ChunkState::kHold);
  EXPECT_EQ(DeriveChunkState(true, Counts(1, 0, 0, 1, 1)), ChunkState::kHoldAfterFwd);
  EXPECT_EQ(DeriveChunkState(true, Counts(1, 0, 0, 0, 1)), ChunkState::kHoldAfterBwd);
  EXPECT_EQ(DeriveChunkState(true, Counts(0, 2, 0, 0, 0)), ChunkState::kCompute);
}

}  // namespace
}  // namespace ps
