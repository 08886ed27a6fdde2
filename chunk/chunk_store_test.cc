#include "chunk/chunk_store.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "chunk/testing/test_memory_resources.h"
#include "chunk/testing/transformer_operators.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/dtype.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

ChunkLayout TinyGptLayout(int world_size, int64_t capacity_elems = 40'000) {
  absl::StatusOr<ChunkLayout> layout =
      ChunkLayout::Build({.capacity_elems = capacity_elems, .world_size = world_size},
                         chunk_testing::TransformerOperators(chunk_testing::kTinyShape));
  CHECK(layout.ok()) << layout.status();
  return *std::move(layout);
}

TEST(ChunkStore, RejectsBadRankAndUnplacedTensors) {
  EXPECT_THAT(ChunkStore::Create(TinyGptLayout(2), {.rank = 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "rank 2"));
  EXPECT_THAT(ChunkStore::Create(TinyGptLayout(2), {.rank = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ChunkLayout layout = TinyGptLayout(1);
  ASSERT_OK(layout.AddOperator(OperatorSpec{"extra", {{"extra.weight", {3}}}}).status());
  EXPECT_THAT(ChunkStore::Create(std::move(layout), {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "'extra.weight'"));
}

TEST(ChunkStore, FourTypesHoldTheSameTensorsAtTheSameOffsets) {
  for (int world : {1, 2, 3}) {
    ASSERT_OK_AND_ASSIGN(auto store,
                         ChunkStore::Create(TinyGptLayout(world), {.compute_dtype = DType::kBF16}));
    const ChunkLayout& layout = store->layout();
    ASSERT_GT(layout.num_data_chunks(), 2);
    for (int64_t i = 0; i < store->num_chunks(); ++i) {
      const std::vector<TensorId> ids = layout.TensorsInChunk(i);
      for (ChunkType type : kAllChunkTypes) {
        const Chunk& chunk = store->chunk(type, i);
        EXPECT_EQ(chunk.id(), (ChunkId{type, i}));
        EXPECT_EQ(chunk.dtype(), ChunkDType(type, DType::kBF16));
        EXPECT_EQ(chunk.capacity_elems(), layout.capacity_elems());
        EXPECT_EQ(chunk.owner_rank(), layout.owner_of(i));
        EXPECT_EQ(chunk.is_padding(), layout.is_padding(i));
        EXPECT_EQ(chunk.state(), ChunkState::kReleased);
        ASSERT_EQ(chunk.num_tensors(), static_cast<int>(ids.size()));
        for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
          const TensorInfo& t = layout.tensor(ids[slot]);
          EXPECT_EQ(chunk.tensor(slot).id, t.id);
          EXPECT_EQ(chunk.tensor(slot).name, t.name);
          EXPECT_EQ(chunk.tensor(slot).offset_elems, t.offset_elems);
          EXPECT_EQ(chunk.tensor(slot).numel, t.numel);
          ASSERT_OK_AND_ASSIGN(ChunkStore::Location loc, store->Locate(t.id));
          EXPECT_EQ(loc.chunk_index, i);
          EXPECT_EQ(loc.slot, slot);
        }
      }
    }
  }
}

TEST(ChunkStore, ModelDataIs14BytesPerParamWithHalfPrecisionAnd16WithF32) {
  const int64_t params =
      ModelNumElems(chunk_testing::TransformerOperators(chunk_testing::kTinyShape));
  for (DType compute : {DType::kF16, DType::kBF16, DType::kF32}) {
    TestHostResource host;
    ASSERT_OK_AND_ASSIGN(auto store,
                         ChunkStore::Create(TinyGptLayout(1), {.compute_dtype = compute}));
    int64_t view_bytes = 0;
    for (ChunkType type : kAllChunkTypes) {
      for (int64_t i = 0; i < store->num_chunks(); ++i) {
        ASSERT_OK(store->chunk(type, i).AllocatePayload(host));
      }
      for (TensorId id = 0; id < store->layout().num_tensor_ids(); ++id) {
        ASSERT_OK_AND_ASSIGN(TensorView view, store->View(type, id));
        view_bytes += view.bytes();
      }
    }
    const int64_t per_param = ModelDataBytesPerParam(compute);
    EXPECT_EQ(per_param, compute == DType::kF32 ? 16 : 14);
    // Exactly per_param bytes of tensor data per parameter...
    EXPECT_EQ(view_bytes, per_param * params);
    // ...and per_param bytes of payload per element of chunk capacity.
    EXPECT_EQ(host.allocated_bytes(),
              per_param * store->num_chunks() * store->layout().capacity_elems());
    EXPECT_EQ(host.allocated_bytes(), store->layout().TotalModelDataBytes(compute));
    EXPECT_EQ(store->PayloadBytesOn(Device::Host()), host.allocated_bytes());
    EXPECT_EQ(store->PayloadBytesOn(Device::Accelerator(0)), 0);
    store.reset();
    EXPECT_EQ(host.allocated_bytes(), 0);
  }
}

TEST(ChunkStore, OnlyOwnedChunksGetOptimizerStatePayloads) {
  const int world = 3;
  ChunkLayout layout = TinyGptLayout(world, 25'000);  // 7 data chunks + 2 padding
  ASSERT_GT(layout.num_padding_chunks(), 0) << layout.DebugString();
  for (int rank = 0; rank < world; ++rank) {
    TestHostResource host;
    ASSERT_OK_AND_ASSIGN(auto store, ChunkStore::Create(layout, {.rank = rank}));
    int64_t expected_bytes = 0;
    for (int64_t i = 0; i < store->num_chunks(); ++i) {
      for (ChunkType type : kAllChunkTypes) {
        const bool holds = layout.HoldsPayload(type, i, rank);
        const absl::Status s = store->chunk(type, i).AllocatePayload(host);
        if (type == ChunkType::kParam || holds) {
          // Param chunks of other ranks are gathered, so they can be allocated anywhere.
          EXPECT_OK(s) << type << " " << i;
        } else {
          EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition)) << type << " " << i;
        }
        if (holds) expected_bytes += layout.ChunkBytes(type, DType::kF16);
      }
    }
    // Without the transient remote param chunks, exactly what the layout says the rank holds.
    int64_t remote_param_bytes = 0;
    for (int64_t i = 0; i < store->num_chunks(); ++i) {
      if (layout.owner_of(i) != rank)
        remote_param_bytes += layout.ChunkBytes(ChunkType::kParam, DType::kF16);
    }
    EXPECT_EQ(host.allocated_bytes() - remote_param_bytes, expected_bytes);
    EXPECT_EQ(expected_bytes, layout.RankModelDataBytes(DType::kF16, rank));
  }
}

TEST(ChunkStore, OperatorStateChangesAreAllOrNothing) {
  TestHostResource host;  // outlives the store's chunks
  ASSERT_OK_AND_ASSIGN(auto store, ChunkStore::Create(TinyGptLayout(1), {}));
  ASSERT_OK_AND_ASSIGN(OperatorId fc, store->layout().FindOperator("h.1.mlp.c_fc"));
  const OperatorInfo& op = store->layout().op(fc);
  ASSERT_EQ(op.tensors.size(), 2u);
  const TensorId weight = op.tensors[0];
  const TensorId bias = op.tensors[1];
  Chunk& chunk = store->chunk(ChunkType::kParam, op.chunk_index);

  // RELEASED: no tensor may enter COMPUTE.
  EXPECT_THAT(store->SetOperatorState(ChunkType::kParam, fc, TensorState::kCompute),
              StatusIs(absl::StatusCode::kFailedPrecondition, "RELEASED"));
  ASSERT_OK(chunk.AllocatePayload(host));

  // The bias alone goes to COMPUTE; the operator-wide COMPUTE then fails on it and changes nothing.
  ASSERT_OK(store->SetTensorState(ChunkType::kParam, bias, TensorState::kCompute));
  std::memset(chunk.payload(), 0x7F, chunk.capacity_bytes());  // what compute wrote
  EXPECT_THAT(store->SetOperatorState(ChunkType::kParam, fc, TensorState::kCompute),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("COMPUTE -> COMPUTE for tensor 'h.1.mlp.c_fc.bias'")));
  EXPECT_THAT(store->tensor_state(ChunkType::kParam, weight), IsOkAndHolds(TensorState::kFree));
  ASSERT_OK(store->SetTensorState(ChunkType::kParam, bias, TensorState::kHold));

  ASSERT_OK(store->SetOperatorState(ChunkType::kParam, fc, TensorState::kCompute));
  EXPECT_THAT(store->tensor_state(ChunkType::kParam, weight), IsOkAndHolds(TensorState::kCompute));
  EXPECT_THAT(store->tensor_state(ChunkType::kParam, bias), IsOkAndHolds(TensorState::kCompute));
  EXPECT_EQ(chunk.tensor_count(TensorState::kCompute), 2);
  // The weight came from FREE: zero-filled. The bias came from HOLD: kept.
  ASSERT_OK_AND_ASSIGN(TensorView w, store->View(ChunkType::kParam, weight));
  ASSERT_OK_AND_ASSIGN(TensorView b, store->View(ChunkType::kParam, bias));
  EXPECT_EQ(w.numel, 64 * 256);
  EXPECT_EQ(b.numel, 256);
  const auto* wb = static_cast<const uint8_t*>(w.data);
  const auto* bb = static_cast<const uint8_t*>(b.data);
  for (int64_t i = 0; i < w.bytes(); ++i) ASSERT_EQ(wb[i], 0) << i;
  for (int64_t i = 0; i < b.bytes(); ++i) ASSERT_EQ(bb[i], 0x7F) << i;
  ASSERT_OK(store->SetOperatorState(ChunkType::kParam, fc, TensorState::kHoldAfterFwd));
  EXPECT_EQ(chunk.tensor_count(TensorState::kHoldAfterFwd), 2);

  EXPECT_THAT(store->SetOperatorState(ChunkType::kParam, 10'000, TensorState::kHold),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store->Locate(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store->tensor_state(ChunkType::kMaster, 1'000'000),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ChunkStore, AcceleratorOperatorAccessNeedsAStreamForTheZeroFill) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 16 * kMiB}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  TestDeviceResource device(*backend);
  ASSERT_OK_AND_ASSIGN(auto store, ChunkStore::Create(TinyGptLayout(1), {}));
  ASSERT_OK_AND_ASSIGN(OperatorId ln, store->layout().FindOperator("ln_f"));
  Chunk& chunk = store->chunk(ChunkType::kParam, store->layout().op(ln).chunk_index);
  ASSERT_OK(chunk.AllocatePayload(device));
  EXPECT_THAT(store->SetOperatorState(ChunkType::kParam, ln, TensorState::kCompute),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs a stream"));
  EXPECT_EQ(chunk.tensor_count(TensorState::kCompute), 0);
  ASSERT_OK(store->SetOperatorState(ChunkType::kParam, ln, TensorState::kCompute, stream.get()));
  ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(store->PayloadBytesOn(backend->device()), chunk.capacity_bytes());
}

}  // namespace
}  // namespace ps
