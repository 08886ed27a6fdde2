#include "chunk/chunk_layout.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "chunk/testing/transformer_operators.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An operator with one tensor per size, named "<name>.<i>".
OperatorSpec Op(const std::string& name, std::vector<int64_t> sizes) {
  OperatorSpec op{name, {}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    op.tensors.push_back(TensorSpec{absl::StrCat(name, ".", i), {sizes[i]}});
  }
  return op;
}

ChunkLayout MakeLayout(int64_t capacity_elems, int world_size = 1, int64_t alignment = 1) {
  absl::StatusOr<ChunkLayout> layout = ChunkLayout::Create({.capacity_elems = capacity_elems,
                                                            .world_size = world_size,
                                                            .tensor_alignment_elems = alignment});
  CHECK(layout.ok()) << layout.status();
  return *std::move(layout);
}

int64_t OffsetOf(const ChunkLayout& layout, const std::string& tensor_name) {
  absl::StatusOr<TensorId> id = layout.FindTensor(tensor_name);
  CHECK(id.ok()) << id.status();
  return layout.tensor(*id).offset_elems;
}

TEST(ChunkLayout, RejectsBadOptions) {
  EXPECT_THAT(ChunkLayout::Create({.capacity_elems = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "capacity_elems"));
  EXPECT_THAT(ChunkLayout::Create({.capacity_elems = 10, .world_size = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "world_size"));
  EXPECT_THAT(ChunkLayout::Create({.capacity_elems = 10, .tensor_alignment_elems = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor_alignment_elems"));
}

// PatrickStar's test_append_tensor: capacity 20, sizes [10, 20, 30, 20, 7, 2] into one chunk.
TEST(ChunkLayout, FirstFitMatchesPatrickStarAppendTensor) {
  ChunkLayout layout = MakeLayout(20);
  EXPECT_EQ(layout.AddChunk(), 0);
  std::vector<bool> inserted;
  const std::vector<int64_t> sizes = {10, 20, 30, 20, 7, 2};
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(OperatorId op, layout.AddOperator(Op(absl::StrCat("p", i), {sizes[i]})));
    ASSERT_OK_AND_ASSIGN(bool placed, layout.TryPlaceOperator(op, 0));
    inserted.push_back(placed);
  }
  EXPECT_THAT(inserted, ElementsAre(true, false, false, false, true, true));
  EXPECT_EQ(OffsetOf(layout, "p0.0"), 0);
  EXPECT_EQ(OffsetOf(layout, "p4.0"), 10);
  EXPECT_EQ(OffsetOf(layout, "p5.0"), 17);
  EXPECT_EQ(layout.used_elems(0), 19);
  EXPECT_EQ(layout.num_unplaced_tensors(), 3);
  EXPECT_OK(layout.Validate());
}

// PatrickStar's test_append_tensor_list, with our deletions.
TEST(ChunkLayout, AtomicListInsertAndGapFill) {
  ChunkLayout layout = MakeLayout(20);
  layout.AddChunk();
  ASSERT_OK_AND_ASSIGN(OperatorId a, layout.AddOperator(Op("a", {7, 2})));
  ASSERT_OK_AND_ASSIGN(OperatorId b, layout.AddOperator(Op("b", {6, 5})));
  EXPECT_THAT(layout.TryPlaceOperator(a, 0), IsOkAndHolds(true));
  EXPECT_THAT(layout.TryPlaceOperator(b, 0), IsOkAndHolds(true));
  EXPECT_EQ(OffsetOf(layout, "b.0"), 9);
  EXPECT_EQ(OffsetOf(layout, "b.1"), 15);
  ASSERT_OK_AND_ASSIGN(TensorId six, layout.FindTensor("b.0"));
  ASSERT_OK(layout.RemoveTensor(six));  // a gap [9, 15)
  EXPECT_EQ(layout.op(b).numel, 5);
  EXPECT_TRUE(layout.op(b).placed());

  ASSERT_OK_AND_ASSIGN(OperatorId eight, layout.AddOperator(Op("eight", {8})));
  EXPECT_THAT(layout.TryPlaceOperator(eight, 0), IsOkAndHolds(false));
  ASSERT_OK_AND_ASSIGN(OperatorId seven, layout.AddOperator(Op("seven", {7})));
  EXPECT_THAT(layout.TryPlaceOperator(seven, 0), IsOkAndHolds(false));
  ASSERT_OK_AND_ASSIGN(OperatorId fill, layout.AddOperator(Op("fill", {1, 2, 3})));
  EXPECT_THAT(layout.TryPlaceOperator(fill, 0), IsOkAndHolds(true));
  EXPECT_EQ(OffsetOf(layout, "fill.0"), 9);
  EXPECT_EQ(OffsetOf(layout, "fill.1"), 10);
  EXPECT_EQ(OffsetOf(layout, "fill.2"), 12);
  EXPECT_EQ(layout.end_elems(0), 20);
  EXPECT_OK(layout.Validate());
}

TEST(ChunkLayout, FailedOperatorInsertRollsBack) {
  ChunkLayout layout = MakeLayout(100);
  layout.AddChunk();
  // Tensors at [0,10) [10,40) [40,50) [50,100); remove the 30 and the 50: gaps [10,40), [50,100).
  ASSERT_OK(layout.AppendOperator(Op("x", {10})).status());
  ASSERT_OK(layout.AppendOperator(Op("y", {30})).status());
  ASSERT_OK(layout.AppendOperator(Op("z", {10})).status());
  ASSERT_OK(layout.AppendOperator(Op("w", {50})).status());
  ASSERT_OK(layout.UnplaceOperator(*layout.FindOperator("y")));
  ASSERT_OK(layout.RemoveTensor(*layout.FindTensor("w.0")));
  const std::string before = layout.DebugString();
  // 25 -> gap [10,40), 40 -> [50,90), 20 does not fit anywhere any more: the whole op rolls back.
  ASSERT_OK_AND_ASSIGN(OperatorId big, layout.AddOperator(Op("big", {25, 40, 20})));
  EXPECT_THAT(layout.TryPlaceOperator(big, 0), IsOkAndHolds(false));
  EXPECT_EQ(layout.DebugString(), before);
  EXPECT_FALSE(layout.op(big).placed());
  for (TensorId id : layout.op(big).tensors) EXPECT_FALSE(layout.tensor(id).placed());
  EXPECT_EQ(layout.used_elems(0), 20);
  EXPECT_EQ(layout.placed_elems(), 20);
  EXPECT_OK(layout.Validate());
  // A smaller operator still fills the gaps.
  ASSERT_OK_AND_ASSIGN(OperatorId fits, layout.AddOperator(Op("fits", {25, 40, 5})));
  EXPECT_THAT(layout.TryPlaceOperator(fits, 0), IsOkAndHolds(true));
  EXPECT_EQ(OffsetOf(layout, "fits.0"), 10);
  EXPECT_EQ(OffsetOf(layout, "fits.1"), 50);
  EXPECT_EQ(OffsetOf(layout, "fits.2"), 35);
  EXPECT_OK(layout.Validate());
}

TEST(ChunkLayout, PlaceOperatorOpensChunksAndKeepsOperatorsWhole) {
  ChunkLayout layout = MakeLayout(40);
  // PatrickStar's test_chunk_data: p1(10)@0, p2(15)@10, p3(5)@25 in chunk 0; p5(13) in chunk 1.
  ASSERT_OK_AND_ASSIGN(OperatorId p1, layout.AppendOperator(Op("p1", {10})));
  ASSERT_OK_AND_ASSIGN(OperatorId p2, layout.AppendOperator(Op("p2", {15})));
  ASSERT_OK_AND_ASSIGN(OperatorId p3, layout.AppendOperator(Op("p3", {5})));
  EXPECT_EQ(layout.op(p1).chunk_index, 0);
  EXPECT_EQ(layout.op(p2).chunk_index, 0);
  EXPECT_EQ(layout.op(p3).chunk_index, 0);
  EXPECT_EQ(OffsetOf(layout, "p3.0"), 25);
  EXPECT_THAT(
      layout.AppendOperator(Op("p4", {100})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("operator 'p4' has 100 parameters")));
  // The failed operator was not registered: its name is free again.
  EXPECT_THAT(layout.FindOperator("p4"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(OperatorId p5, layout.AppendOperator(Op("p5", {8, 5})));
  EXPECT_EQ(layout.op(p5).chunk_index, 1);  // 13 elements do not fit the 10 left in chunk 0
  EXPECT_EQ(OffsetOf(layout, "p5.0"), 0);
  EXPECT_EQ(OffsetOf(layout, "p5.1"), 8);
  // Re-placing in the same chunk is a no-op; elsewhere it is an error.
  EXPECT_THAT(layout.TryPlaceOperator(p5, 1), IsOkAndHolds(true));
  EXPECT_THAT(layout.TryPlaceOperator(p5, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(layout.PlaceOperator(p5), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(layout.TryPlaceOperator(p5, 7), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(layout.TryPlaceOperator(99, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(layout.num_chunks(), 2);
  EXPECT_OK(layout.Validate());
}

TEST(ChunkLayout, AppendUsesOnlyTheLastChunkFirstFitBackfills) {
  for (ChunkLayout::Placement placement :
       {ChunkLayout::Placement::kAppend, ChunkLayout::Placement::kFirstFit}) {
    ChunkLayout layout = MakeLayout(10);
    ASSERT_OK(layout.AppendOperator(Op("a", {6}), placement).status());
    ASSERT_OK(layout.AppendOperator(Op("b", {6}), placement).status());  // chunk 1
    ASSERT_OK_AND_ASSIGN(OperatorId c, layout.AppendOperator(Op("c", {4}), placement));
    // Append: chunk 1 has room for 4. First fit: chunk 0 has room for 4 first.
    EXPECT_EQ(layout.op(c).chunk_index, placement == ChunkLayout::Placement::kAppend ? 1 : 0);
    ASSERT_OK_AND_ASSIGN(OperatorId d, layout.AppendOperator(Op("d", {3}), placement));
    EXPECT_EQ(layout.op(d).chunk_index, placement == ChunkLayout::Placement::kAppend ? 2 : 1);
    EXPECT_OK(layout.Validate());
  }
}

TEST(ChunkLayout, RejectsDuplicateAndInvalidSpecs) {
  ChunkLayout layout = MakeLayout(100);
  ASSERT_OK(layout.AppendOperator(Op("a", {3})).status());
  EXPECT_THAT(layout.AddOperator(Op("a", {3})),
              StatusIs(absl::StatusCode::kInvalidArgument, "operator name 'a'"));
  EXPECT_THAT(layout.AddOperator(OperatorSpec{"b", {{"a.0", {2}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor name 'a.0'"));
  EXPECT_THAT(layout.AddOperator(OperatorSpec{"b", {{"t", {2}}, {"t", {3}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
  EXPECT_THAT(layout.AddOperator(OperatorSpec{"b", {{"t", {2, 0}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "non-positive dimension"));
  EXPECT_THAT(layout.AddOperator(OperatorSpec{"b", {}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "no tensors"));
  EXPECT_EQ(layout.num_operator_ids(), 1);
  EXPECT_EQ(layout.num_tensor_ids(), 1);
  EXPECT_OK(layout.Validate());
}

TEST(ChunkLayout, RemovingAnOperatorsLastTensorUnplacesIt) {
  ChunkLayout layout = MakeLayout(10);
  ASSERT_OK_AND_ASSIGN(OperatorId a, layout.AppendOperator(Op("a", {4})));
  ASSERT_OK(layout.RemoveTensor(*layout.FindTensor("a.0")));
  EXPECT_FALSE(layout.op(a).placed());
  EXPECT_THAT(layout.PlaceOperator(a), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(layout.RemoveTensor(0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(layout.UnplaceOperator(a), StatusIs(absl::StatusCode::kFailedPrecondition));
  // The name is free again.
  ASSERT_OK(layout.AppendOperator(OperatorSpec{"again", {{"a.0", {4}}}}).status());
  EXPECT_OK(layout.Validate());
}

TEST(ChunkLayout, AlignedOffsets) {
  ChunkLayout layout = MakeLayout(256, 1, 64);
  ASSERT_OK(layout.AppendOperator(Op("a", {3, 70})).status());
  EXPECT_EQ(OffsetOf(layout, "a.0"), 0);
  EXPECT_EQ(OffsetOf(layout, "a.1"), 64);
  ASSERT_OK(layout.AppendOperator(Op("b", {64})).status());
  EXPECT_EQ(OffsetOf(layout, "b.0"), 192);
  // Chunk 0 is full up to its aligned slots: even one element opens chunk 1.
  ASSERT_OK_AND_ASSIGN(OperatorId c, layout.AppendOperator(Op("c", {1})));
  EXPECT_EQ(layout.op(c).chunk_index, 1);
  EXPECT_THAT(layout.AppendOperator(Op("d", {200, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "257 elements with alignment"));
  EXPECT_OK(layout.Validate());
}

TEST(ChunkLayout, ZeroGroupingAndPadding) {
  for (int world : {1, 2, 3, 8}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    ChunkLayout layout = MakeLayout(10, world);
    EXPECT_EQ(layout.num_chunks(), 0);
    for (int k = 1; k <= 17; ++k) {
      // Each operator of 7 elements opens a chunk of its own.
      ASSERT_OK_AND_ASSIGN(OperatorId op, layout.AppendOperator(Op(absl::StrCat("op", k), {7})));
      ASSERT_EQ(layout.op(op).chunk_index, k - 1);
      ASSERT_EQ(layout.num_data_chunks(), k);
      const int64_t expected_chunks = (k + world - 1) / world * world;
      EXPECT_EQ(layout.num_chunks(), expected_chunks);
      EXPECT_EQ(layout.num_chunks() % world, 0);
      EXPECT_EQ(layout.num_padding_chunks(), expected_chunks - k);
      EXPECT_EQ(layout.num_groups(), expected_chunks / world);
      int64_t sum_rank_bytes = 0;
      for (int rank = 0; rank < world; ++rank) {
        int64_t params = 0;
        int64_t optimizer_states = 0;
        for (int64_t i = 0; i < layout.num_chunks(); ++i) {
          params += layout.HoldsPayload(ChunkType::kParam, i, rank) ? 1 : 0;
          optimizer_states += layout.HoldsPayload(ChunkType::kMaster, i, rank) ? 1 : 0;
        }
        EXPECT_EQ(params, layout.num_chunks() / world);
        int64_t expected_os = 0;
        for (int64_t i = rank; i < k; i += world) ++expected_os;
        EXPECT_EQ(optimizer_states, expected_os);
        sum_rank_bytes += layout.RankModelDataBytes(DType::kF16, rank);
      }
      EXPECT_EQ(sum_rank_bytes, layout.TotalModelDataBytes(DType::kF16));
    }
    for (int64_t i = 0; i < layout.num_chunks(); ++i) {
      EXPECT_EQ(layout.group_of(i), i / world);
      EXPECT_EQ(layout.owner_of(i), i % world);
      EXPECT_EQ(layout.is_padding(i), i >= 17);
      for (ChunkType type : kAllChunkTypes) {
        for (int rank = 0; rank < world; ++rank) {
          const bool owner = i % world == rank;
          EXPECT_EQ(layout.HoldsPayload(type, i, rank),
                    owner && (type == ChunkType::kParam || i < 17));
        }
      }
    }
    for (int64_t g = 0; g < layout.num_groups(); ++g) {
      std::vector<int64_t> expected;
      for (int r = 0; r < world; ++r) expected.push_back(g * world + r);
      EXPECT_EQ(layout.ChunksInGroup(g), expected);
    }
    // A padding chunk index can be used directly and becomes a data chunk.
    if (layout.num_padding_chunks() > 0) {
      const int64_t pad = layout.num_chunks() - 1;
      ASSERT_OK_AND_ASSIGN(OperatorId op, layout.AddOperator(Op("late", {3})));
      EXPECT_THAT(layout.TryPlaceOperator(op, pad), IsOkAndHolds(true));
      EXPECT_EQ(layout.num_data_chunks(), pad + 1);
      EXPECT_EQ(layout.num_chunks() % world, 0);
    }
    EXPECT_OK(layout.Validate());
  }
}

// Independent of Validate(): collects every placed tensor from the public view and checks bounds,
// overlap and operator atomicity.
void CheckPlacement(const ChunkLayout& layout) {
  absl::btree_map<int64_t, std::vector<std::pair<int64_t, int64_t>>> intervals;
  int64_t placed = 0;
  for (TensorId id = 0; id < layout.num_tensor_ids(); ++id) {
    const TensorInfo& t = layout.tensor(id);
    if (!t.live || !t.placed()) continue;
    ASSERT_GE(t.offset_elems, 0) << t.name;
    ASSERT_LE(t.offset_elems + t.numel, layout.capacity_elems()) << t.name;
    ASSERT_LT(t.chunk_index, layout.num_data_chunks()) << t.name;
    ASSERT_EQ(layout.op(t.op).chunk_index, t.chunk_index) << t.name;
    intervals[t.chunk_index].push_back({t.offset_elems, t.offset_elems + t.numel});
    placed += t.numel;
  }
  for (auto& [chunk, spans] : intervals) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      ASSERT_LE(spans[i - 1].second, spans[i].first) << "overlap in chunk " << chunk;
    }
  }
  for (OperatorId op = 0; op < layout.num_operator_ids(); ++op) {
    for (TensorId id : layout.op(op).tensors) {
      ASSERT_EQ(layout.tensor(id).chunk_index, layout.op(op).chunk_index);
    }
  }
  ASSERT_EQ(placed, layout.placed_elems());
  ASSERT_EQ(layout.num_chunks() % layout.world_size(), 0);
}

TEST(ChunkLayout, RandomInsertDeleteNeverOverlaps) {
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    TestRng rng(seed);
    auto uniform = [&rng](int64_t lo, int64_t hi) {  // [lo, hi]
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    const int world = static_cast<int>(uniform(1, 4));
    const int64_t capacity = uniform(16, 200);
    const int64_t alignment = uniform(0, 2) == 0 ? uniform(2, 8) : 1;
    ChunkLayout layout = MakeLayout(capacity, world, alignment);
    int64_t next_name = 0;
    int64_t live_tensors = 0;
    for (int step = 0; step < 3000; ++step) {
      // Keep the population near 100 tensors so that every step's checks stay cheap.
      const int64_t what = live_tensors > 100 ? uniform(4, 7) : uniform(0, 9);
      if (what <= 3 || layout.num_operator_ids() == 0) {
        std::vector<int64_t> sizes(uniform(1, 3));
        live_tensors += static_cast<int64_t>(sizes.size());
        for (int64_t& s : sizes) s = uniform(1, capacity / 2);
        ASSERT_OK_AND_ASSIGN(OperatorId op,
                             layout.AddOperator(Op(absl::StrCat("o", next_name++), sizes)));
        if (uniform(0, 1) == 0 && layout.num_chunks() > 0) {
          const int64_t chunk = uniform(0, layout.num_chunks() - 1);
          const std::string before = layout.DebugString();
          ASSERT_OK_AND_ASSIGN(bool placed, layout.TryPlaceOperator(op, chunk));
          if (!placed) {
            ASSERT_EQ(layout.DebugString(), before);
          }
        } else {
          absl::StatusOr<int64_t> chunk =
              layout.PlaceOperator(op, uniform(0, 1) ? ChunkLayout::Placement::kAppend
                                                     : ChunkLayout::Placement::kFirstFit);
          // Aligned footprints can exceed the capacity even when each size is below half of it.
          if (!chunk.ok()) {
            ASSERT_EQ(chunk.status().code(), absl::StatusCode::kInvalidArgument);
          }
        }
      } else if (what <= 5) {
        const OperatorId op = uniform(0, layout.num_operator_ids() - 1);
        const bool placed = layout.op(op).placed();
        absl::Status s = layout.UnplaceOperator(op);
        ASSERT_EQ(s.ok(), placed) << s;
      } else if (what <= 7) {
        const TensorId id = uniform(0, layout.num_tensor_ids() - 1);
        const bool live = layout.tensor(id).live;
        absl::Status s = layout.RemoveTensor(id);
        ASSERT_EQ(s.ok(), live) << s;
        live_tensors -= s.ok() ? 1 : 0;
      } else if (what == 8) {
        const OperatorId op = uniform(0, layout.num_operator_ids() - 1);
        if (!layout.op(op).placed() && !layout.op(op).tensors.empty()) {
          absl::StatusOr<int64_t> chunk =
              layout.PlaceOperator(op, ChunkLayout::Placement::kFirstFit);
          if (!chunk.ok()) {
            ASSERT_EQ(chunk.status().code(), absl::StatusCode::kInvalidArgument);
          }
        }
      } else if (layout.num_data_chunks() < 40) {
        layout.AddChunk();
      }
      ASSERT_OK(layout.Validate()) << "step " << step;
      ASSERT_NO_FATAL_FAILURE(CheckPlacement(layout)) << "step " << step;
    }
  }
}

OperatorSpec FrozenOp(const std::string& name, std::vector<int64_t> sizes) {
  OperatorSpec op = Op(name, std::move(sizes));
  op.trainable = false;
  return op;
}

// Frozen and trainable operators never share a chunk: kAppend opens a new chunk when the kind
// changes (even with room left), kFirstFit skips chunks of the other kind, an emptied chunk takes
// either kind again; frozen chunks hold only a param payload.
TEST(ChunkLayout, FrozenAndTrainableOperatorsNeverShareAChunk) {
  ChunkLayout layout = MakeLayout(100);
  ASSERT_OK_AND_ASSIGN(OperatorId base0, layout.AppendOperator(FrozenOp("base0", {30})));
  ASSERT_OK_AND_ASSIGN(OperatorId base1, layout.AppendOperator(FrozenOp("base1", {30})));
  ASSERT_OK_AND_ASSIGN(OperatorId lora0, layout.AppendOperator(Op("lora0", {10})));
  EXPECT_EQ(layout.op(base0).chunk_index, 0);
  EXPECT_EQ(layout.op(base1).chunk_index, 0);
  EXPECT_EQ(layout.op(lora0).chunk_index, 1);  // 40 elements left in chunk 0, but it is frozen
  EXPECT_FALSE(layout.op(base0).trainable);
  EXPECT_FALSE(layout.chunk_trainable(0));
  EXPECT_TRUE(layout.chunk_trainable(1));
  ASSERT_OK_AND_ASSIGN(OperatorId base2, layout.AppendOperator(FrozenOp("base2", {10})));
  EXPECT_EQ(layout.op(base2).chunk_index, 2);
  // First fit skips the trainable chunk 1 and backfills the frozen chunk 0.
  ASSERT_OK_AND_ASSIGN(OperatorId base3, layout.AppendOperator(FrozenOp("base3", {35}),
                                                               ChunkLayout::Placement::kFirstFit));
  EXPECT_EQ(layout.op(base3).chunk_index, 0);
  ASSERT_OK_AND_ASSIGN(OperatorId lora1,
                       layout.AppendOperator(Op("lora1", {10}), ChunkLayout::Placement::kFirstFit));
  EXPECT_EQ(layout.op(lora1).chunk_index, 1);
  ASSERT_OK_AND_ASSIGN(bool placed,
                       layout.TryPlaceOperator(*layout.AddOperator(Op("lora2", {1})), 0));
  EXPECT_FALSE(placed);
  EXPECT_EQ(layout.frozen_elems(), 105);
  EXPECT_EQ(layout.trainable_elems(), 20);
  for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
    EXPECT_FALSE(layout.HoldsPayload(type, 0, 0));
    EXPECT_TRUE(layout.HoldsPayload(type, 1, 0));
    EXPECT_FALSE(layout.HoldsPayload(type, 2, 0));
  }
  EXPECT_TRUE(layout.HoldsPayload(ChunkType::kParam, 0, 0));
  // bf16: 3 param chunks of 2 bytes per element, optimizer state (12 bytes) for chunk 1 only.
  EXPECT_EQ(layout.TotalModelDataBytes(DType::kBF16), 3 * 100 * 2 + 100 * 12);
  EXPECT_EQ(layout.RankModelDataBytes(DType::kBF16, 0), 3 * 100 * 2 + 100 * 12);
  EXPECT_THAT(layout.DebugString(), HasSubstr("chunk 0 (group 0, owner 0, frozen)"));
  EXPECT_THAT(layout.DebugString(), HasSubstr("chunk 1 (group 1, owner 0):"));
  // Emptied, chunk 2 takes a trainable operator.
  ASSERT_OK(layout.UnplaceOperator(base2));
  EXPECT_TRUE(layout.chunk_trainable(2));
  ASSERT_OK_AND_ASSIGN(bool placed2,
                       layout.TryPlaceOperator(*layout.AddOperator(Op("lora3", {5})), 2));
  EXPECT_TRUE(placed2);
  EXPECT_TRUE(layout.chunk_trainable(2));
  ASSERT_OK(layout.Validate());
  // An aggregate-initialized spec is trainable.
  EXPECT_TRUE((OperatorSpec{"x", {{"x.w", {1}}}}).trainable);
}

// World size 2: a ZeRO group holds one kind; placement completes a group with empty chunks when
// the kind changes.
TEST(ChunkLayout, FrozenKindIsPerZeroGroup) {
  ChunkLayout layout = MakeLayout(100, /*world_size=*/2);
  ASSERT_OK_AND_ASSIGN(OperatorId base, layout.AppendOperator(FrozenOp("base", {80})));
  ASSERT_OK_AND_ASSIGN(OperatorId lora, layout.AppendOperator(Op("lora", {80})));
  EXPECT_EQ(layout.op(base).chunk_index, 0);
  EXPECT_EQ(layout.op(lora).chunk_index, 2);  // chunk 1 would share group 0 with the frozen one
  EXPECT_EQ(layout.num_data_chunks(), 3);
  EXPECT_EQ(layout.num_chunks(), 4);
  EXPECT_TRUE(layout.group_frozen(0));
  EXPECT_FALSE(layout.group_frozen(1));
  EXPECT_TRUE(layout.chunk_trainable(1));  // empty
  ASSERT_OK_AND_ASSIGN(OperatorId small, layout.AddOperator(Op("small", {5})));
  ASSERT_OK_AND_ASSIGN(bool placed, layout.TryPlaceOperator(small, 1));
  EXPECT_FALSE(placed);
  ASSERT_OK_AND_ASSIGN(int64_t chunk,
                       layout.PlaceOperator(small, ChunkLayout::Placement::kFirstFit));
  EXPECT_EQ(chunk, 2);
  ASSERT_OK(layout.Validate());
}

// Random operation sequences with frozen and trainable operators: after every step, no chunk or
// ZeRO group mixes kinds (checked from the tensors, not from the layout's own answer), the
// trainable/frozen element counts and the model-data bytes match an independent count, and
// HoldsPayload gives frozen chunks a param payload only.
TEST(ChunkLayout, RandomFrozenAndTrainableOperatorsNeverMix) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    TestRng rng(seed);
    auto uniform = [&rng](int64_t lo, int64_t hi) {  // [lo, hi]
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    const int world = static_cast<int>(uniform(1, 3));
    const int64_t capacity = uniform(16, 200);
    ChunkLayout layout = MakeLayout(capacity, world, uniform(0, 2) == 0 ? uniform(2, 8) : 1);
    int64_t next_name = 0, live_tensors = 0;
    for (int step = 0; step < 800; ++step) {
      const int64_t what = live_tensors > 100 ? uniform(4, 7) : uniform(0, 9);
      if (what <= 3 || layout.num_operator_ids() == 0) {
        std::vector<int64_t> sizes(uniform(1, 3));
        live_tensors += static_cast<int64_t>(sizes.size());
        for (int64_t& s : sizes) s = uniform(1, capacity / 2);
        OperatorSpec spec = Op(absl::StrCat("o", next_name++), sizes);
        spec.trainable = uniform(0, 2) != 0;
        ASSERT_OK_AND_ASSIGN(OperatorId op, layout.AddOperator(spec));
        ASSERT_EQ(layout.op(op).trainable, spec.trainable);
        if (uniform(0, 1) == 0 && layout.num_chunks() > 0) {
          const std::string before = layout.DebugString();
          ASSERT_OK_AND_ASSIGN(bool placed,
                               layout.TryPlaceOperator(op, uniform(0, layout.num_chunks() - 1)));
          if (!placed) {
            ASSERT_EQ(layout.DebugString(), before);
          }
        } else {
          absl::StatusOr<int64_t> chunk =
              layout.PlaceOperator(op, uniform(0, 1) ? ChunkLayout::Placement::kAppend
                                                     : ChunkLayout::Placement::kFirstFit);
          if (!chunk.ok()) {
            ASSERT_EQ(chunk.status().code(), absl::StatusCode::kInvalidArgument);
          }
        }
      } else if (what <= 5) {
        (void)layout.UnplaceOperator(uniform(0, layout.num_operator_ids() - 1));
      } else if (what <= 7) {
        const TensorId id = uniform(0, layout.num_tensor_ids() - 1);
        if (layout.RemoveTensor(id).ok()) --live_tensors;
      } else if (what == 8) {
        const OperatorId op = uniform(0, layout.num_operator_ids() - 1);
        if (!layout.op(op).placed() && !layout.op(op).tensors.empty()) {
          (void)layout.PlaceOperator(op, ChunkLayout::Placement::kFirstFit);
        }
      } else if (layout.num_data_chunks() < 40) {
        layout.AddChunk();
      }
      ASSERT_OK(layout.Validate()) << "step " << step;
      // Independent checks.
      int64_t trainable = 0, frozen = 0;
      std::vector<int> kind(static_cast<size_t>(layout.num_chunks()), -1);  // -1 empty
      for (TensorId t = 0; t < layout.num_tensor_ids(); ++t) {
        const TensorInfo& info = layout.tensor(t);
        if (!info.live || !info.placed()) continue;
        const bool tr = layout.op(info.op).trainable;
        (tr ? trainable : frozen) += info.numel;
        int& k = kind[static_cast<size_t>(info.chunk_index)];
        ASSERT_TRUE(k == -1 || k == static_cast<int>(tr))
            << "step " << step << " chunk " << info.chunk_index << " mixes kinds";
        k = static_cast<int>(tr);
      }
      ASSERT_EQ(layout.trainable_elems(), trainable);
      ASSERT_EQ(layout.frozen_elems(), frozen);
      int64_t bytes = 0;
      for (int64_t g = 0; g < layout.num_groups(); ++g) {
        int group_kind = -1;
        for (int64_t c : layout.ChunksInGroup(g)) {
          const int k = kind[static_cast<size_t>(c)];
          ASSERT_TRUE(group_kind == -1 || k == -1 || k == group_kind) << "group " << g;
          if (k != -1) group_kind = k;
          ASSERT_EQ(layout.chunk_trainable(c), k != 0);
          const bool state = !layout.is_padding(c) && k != 0;
          for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
            ASSERT_EQ(layout.HoldsPayload(type, c, layout.owner_of(c)), state);
          }
          bytes += capacity * (2 + (state ? 12 : 0));
        }
        ASSERT_EQ(layout.group_frozen(g), group_kind == 0);
      }
      ASSERT_EQ(layout.TotalModelDataBytes(DType::kBF16), bytes);
      int64_t ranks = 0;
      for (int r = 0; r < world; ++r) ranks += layout.RankModelDataBytes(DType::kBF16, r);
      ASSERT_EQ(ranks, bytes);
    }
  }
}

TEST(ChunkLayout, GptLayoutHoldsEveryParameterAndIs14BytesPerParam) {
  const std::vector<OperatorSpec> ops =
      chunk_testing::TransformerOperators(chunk_testing::kGpt2Shape);
  ASSERT_OK_AND_ASSIGN(ChunkLayout layout,
                       ChunkLayout::Build({.capacity_elems = 48 * 1024 * 1024}, ops));
  ASSERT_OK(layout.Validate());
  EXPECT_EQ(layout.placed_elems(), 124'439'808);
  EXPECT_EQ(layout.num_unplaced_tensors(), 0);
  // Operators sit in model order: chunk indices never decrease along the forward pass.
  int64_t last = 0;
  for (OperatorId op = 0; op < layout.num_operator_ids(); ++op) {
    EXPECT_GE(layout.op(op).chunk_index, last);
    last = layout.op(op).chunk_index;
  }
  for (DType compute : {DType::kF16, DType::kBF16, DType::kF32}) {
    // The bytes of every tensor's view over the four types: exactly 14 (or 16) per parameter.
    int64_t view_bytes = 0;
    for (TensorId id = 0; id < layout.num_tensor_ids(); ++id) {
      for (ChunkType type : kAllChunkTypes) {
        view_bytes += layout.tensor(id).numel * SizeOf(ChunkDType(type, compute));
      }
    }
    const int64_t per_param = compute == DType::kF32 ? 16 : 14;
    EXPECT_EQ(view_bytes, per_param * 124'439'808);
    // And the chunks themselves: per_param bytes per element of chunk capacity.
    EXPECT_EQ(layout.TotalModelDataBytes(compute),
              per_param * layout.num_chunks() * layout.capacity_elems());
    int64_t chunk_bytes = 0;
    for (ChunkType type : kAllChunkTypes) chunk_bytes += layout.ChunkBytes(type, compute);
    EXPECT_EQ(chunk_bytes, per_param * layout.capacity_elems());
  }
  EXPECT_NEAR(layout.utilization(), 124'439'808.0 / (layout.num_chunks() * layout.capacity_elems()),
              1e-12);
  ASSERT_OK_AND_ASSIGN(TensorId wte, layout.FindTensor("wte.weight"));
  EXPECT_EQ(layout.tensor(wte).offset_elems, 0);
  EXPECT_EQ(layout.tensor(wte).chunk_index, 0);
  ASSERT_OK_AND_ASSIGN(TensorId wpe, layout.FindTensor("wpe.weight"));
  EXPECT_EQ(layout.tensor(wpe).offset_elems, 50257 * 768);  // after wte
  ASSERT_OK_AND_ASSIGN(TensorId c_attn, layout.FindTensor("h.3.attn.c_attn.weight"));
  EXPECT_THAT(layout.tensor(c_attn).shape, ElementsAre(768, 2304));
}

}  // namespace
}  // namespace ps
