// ZeroGroups on one rank with scripted collectives (the real ones, over threads, are in
// zero_test): group keys and padding, the all-gather (zero-filled owner tensors, remote bytes in,
// every tensor HOLD), when a group has finished its backward (a tied operator needs all its
// backward releases), the reduce-scatter into this rank's chunk, and freeing the remote payloads.
#include "scheduler/zero_groups.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/tensor_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "scheduler/chunk_counters.h"
#include "scheduler/collective_hooks.h"
#include "scheduler/metronome.h"
#include "scheduler/residency.h"

namespace ps {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kChunkElems = 256;

// Rank `rank` of 2: all-gather writes 5 + r into every remote payload r; reduce-scatter halves
// this rank's payload (the mean with a rank holding zeros).
class ScriptedCollectives final : public CollectiveHooks {
 public:
  explicit ScriptedCollectives(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return 2; }
  absl::Status AllGatherGroup(int64_t group, absl::Span<void* const> payloads, int64_t count,
                              DType dtype) override {
    calls.push_back(absl::StrCat("gather ", group));
    for (int r = 0; r < 2; ++r) {
      if (r == rank_ || payloads[r] == nullptr) continue;
      auto* p = static_cast<float*>(payloads[r]);
      for (int64_t i = 0; i < count; ++i) p[i] = 5.0f + r;
    }
    return absl::OkStatus();
  }
  absl::Status ReduceScatterGroup(int64_t group, absl::Span<void* const> payloads, int64_t count,
                                  DType dtype) override {
    calls.push_back(absl::StrCat("reduce ", group));
    auto* p = static_cast<float*>(payloads[rank_]);
    for (int64_t i = 0; i < count; ++i) p[i] *= 0.5f;
    return fail ? absl::UnavailableError("peer gone") : absl::OkStatus();
  }
  std::vector<std::string> calls;
  bool fail = false;

 private:
  const int rank_;
};

// Operators a, b (one chunk each) and c, d (sharing the third chunk): three data chunks, one
// padding chunk, two groups {0, 1} and {2, 3}.
class ZeroGroupsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    rank_ = GetParam();
    collectives_ = std::make_unique<ScriptedCollectives>(rank_);
    ASSERT_OK_AND_ASSIGN(backend_, CreateCpuBackend({.capacity_bytes = 64 * kChunkElems * 4}));
    DeviceMemoryOptions memory;
    memory.chunk_block_bytes = kChunkElems * 4;
    ASSERT_OK_AND_ASSIGN(accel_, CreateAcceleratorMemory(backend_.get(), memory));
    ASSERT_OK_AND_ASSIGN(host_, CreateHostMemory(backend_.get(), memory));
    const std::vector<OperatorSpec> ops = {{"a", {{"a.w", {kChunkElems}}}},
                                           {"b", {{"b.w", {kChunkElems}}}},
                                           {"c", {{"c.w", {kChunkElems / 2}}}},
                                           {"d", {{"d.w", {kChunkElems / 2}}}}};
    ASSERT_OK_AND_ASSIGN(ChunkLayout layout,
                         ChunkLayout::Build({.capacity_elems = kChunkElems, .world_size = 2}, ops));
    ASSERT_OK_AND_ASSIGN(store_, ChunkStore::Create(std::move(layout),
                                                    {.compute_dtype = DType::kF32, .rank = rank_}));
    ASSERT_OK_AND_ASSIGN(
        engine_, ResidencyEngine::Create(store_.get(), backend_.get(), accel_.get(), host_.get(),
                                         {}, &counters_));
    groups_ =
        std::make_unique<ZeroGroups>(store_.get(), engine_.get(), collectives_.get(), &counters_);
  }

  // Every tensor of operator `op` through COMPUTE to `to`.
  void UseOperator(OperatorId op, TensorState to) {
    ASSERT_OK(store_->SetOperatorState(ChunkType::kParam, op, TensorState::kCompute,
                                       &engine_->load_stream()));
    ASSERT_OK(engine_->SyncLoadStream());
    ASSERT_OK(store_->SetOperatorState(ChunkType::kParam, op, to));
  }
  const float* Payload(int64_t key) {
    return static_cast<const float*>(engine_->chunk(key).payload());
  }

  int rank_ = 0;
  ChunkManagerCounters counters_;
  std::unique_ptr<ScriptedCollectives> collectives_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceMemory> accel_;
  std::unique_ptr<DeviceMemory> host_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<ResidencyEngine> engine_;
  std::unique_ptr<ZeroGroups> groups_;
};

TEST_P(ZeroGroupsTest, KeysSkipPadding) {
  EXPECT_EQ(groups_->num_groups(), 2);
  EXPECT_EQ(groups_->world_size(), 2);
  EXPECT_EQ(groups_->rank(), rank_);
  EXPECT_THAT(groups_->Keys(0), ElementsAre(0, 1));
  EXPECT_THAT(groups_->Keys(1), ElementsAre(2));  // chunk 3 is padding
  EXPECT_EQ(groups_->OwnKey(0), rank_);
  EXPECT_EQ(groups_->OwnKey(1), rank_ == 0 ? 2 : -1);
  EXPECT_EQ(groups_->GroupOf(2), 1);
}

TEST_P(ZeroGroupsTest, GatherReduceFree) {
  const int remote = 1 - rank_;
  ASSERT_OK(engine_->Load(groups_->Keys(0), {Stage::kForward, 0}, false));
  ASSERT_OK(engine_->WaitForCopies(groups_->Keys(0)));
  ASSERT_OK(groups_->Gather(0));
  EXPECT_TRUE(groups_->gathered(0));
  EXPECT_FALSE(groups_->gathered(1));
  EXPECT_EQ(counters_.all_gathers, 1);
  EXPECT_EQ(counters_.all_gather_bytes, kChunkElems * 4);
  // The owner's never-written tensor was zero-filled; the remote one holds the owner's bytes.
  EXPECT_EQ(Payload(rank_)[7], 0.0f);
  EXPECT_EQ(Payload(remote)[7], 5.0f + remote);
  EXPECT_TRUE(groups_->AllIn(0, TensorState::kHold));

  // Forward, then backward: operator a (chunk 0) is tied — used twice in forward — so the group
  // finishes only after its second backward release.
  groups_->BeginIteration();
  groups_->NoteAccess(0, 0, Stage::kForward, true);
  groups_->NoteAccess(1, 0, Stage::kForward, true);
  groups_->NoteAccess(0, 0, Stage::kForward, true);
  EXPECT_FALSE(groups_->backward_touched(0));
  for (OperatorId op : {0, 1}) UseOperator(op, TensorState::kHoldAfterBwd);
  groups_->NoteAccess(1, 0, Stage::kBackward, false);
  groups_->NoteBackwardRelease(1);
  groups_->NoteAccess(0, 0, Stage::kBackward, false);
  groups_->NoteBackwardRelease(0);
  EXPECT_TRUE(groups_->backward_touched(0));
  EXPECT_TRUE(groups_->AllIn(0, TensorState::kHoldAfterBwd));
  EXPECT_FALSE(groups_->FinishedBackward(0));
  groups_->NoteBackwardRelease(0);
  EXPECT_TRUE(groups_->FinishedBackward(0));

  const bool clean_before = engine_->chunk(rank_).backing_valid();
  EXPECT_FALSE(clean_before);  // allocated on the device: never clean
  ASSERT_OK(groups_->ReduceScatter(0));
  EXPECT_EQ(counters_.reduce_scatters, 1);
  EXPECT_EQ(counters_.reduce_scatter_bytes, kChunkElems * 4);
  EXPECT_FALSE(groups_->backward_touched(0));
  ASSERT_OK(groups_->Free(0));
  EXPECT_FALSE(groups_->gathered(0));
  EXPECT_EQ(counters_.remote_releases, 1);
  EXPECT_FALSE(engine_->chunk(remote).has_payload());
  EXPECT_FALSE(engine_->resident(remote));
  EXPECT_TRUE(engine_->chunk(rank_).has_payload());
  EXPECT_THAT(collectives_->calls, ElementsAre("gather 0", "reduce 0"));
}

TEST_P(ZeroGroupsTest, CollectiveErrorsNameTheGroupAndRankAndUnpin) {
  ASSERT_OK(engine_->Load(groups_->Keys(0), {Stage::kForward, 0}, false));
  ASSERT_OK(engine_->WaitForCopies(groups_->Keys(0)));
  ASSERT_OK(groups_->Gather(0));
  collectives_->fail = true;
  EXPECT_THAT(groups_->ReduceScatter(0),
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::AllOf(::testing::HasSubstr("chunk group 0"),
                                        ::testing::HasSubstr(absl::StrCat("rank ", rank_, " of 2")),
                                        ::testing::HasSubstr("peer gone"))));
  EXPECT_FALSE(engine_->chunk(0).pinned());
  EXPECT_FALSE(engine_->chunk(1).pinned());
  // A group without payloads cannot be gathered (the owner cannot zero-fill, or the remote chunk
  // has nowhere to receive).
  EXPECT_FALSE(groups_->Gather(1).ok());
  EXPECT_FALSE(groups_->gathered(1));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroGroupsTest, ::testing::Values(0, 1));

}  // namespace
}  // namespace ps
