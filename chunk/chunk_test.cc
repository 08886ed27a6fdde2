#include "chunk/chunk.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "chunk/testing/test_memory_resources.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/dtype.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::HasSubstr;

// Three tensors: a@[0,4) b@[4,10) c@[12,16) of a 16-element chunk.
ChunkSpec Spec(ChunkType type = ChunkType::kParam, DType dtype = DType::kF16, int owner = 0,
               int local = 0, bool padding = false) {
  ChunkSpec spec;
  spec.id = ChunkId{type, 3};
  spec.dtype = dtype;
  spec.capacity_elems = 16;
  spec.owner_rank = owner;
  spec.local_rank = local;
  spec.is_padding = padding;
  spec.tensors = {{10, "a", 0, 4}, {11, "b", 4, 6}, {12, "c", 12, 4}};
  return spec;
}

std::unique_ptr<Chunk> MakeChunk(ChunkSpec spec = Spec()) {
  absl::StatusOr<std::unique_ptr<Chunk>> chunk = Chunk::Create(std::move(spec));
  EXPECT_OK(chunk);
  return chunk.ok() ? *std::move(chunk) : nullptr;
}

class ChunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
    ASSERT_OK_AND_ASSIGN(stream_, backend_->CreateStream());
    device_ = std::make_unique<TestDeviceResource>(*backend_);
  }

  // Reads a payload's bytes wherever it is.
  std::vector<uint8_t> ReadPayload(const Chunk& chunk) {
    std::vector<uint8_t> bytes(chunk.capacity_bytes());
    if (chunk.device().is_host()) {
      std::memcpy(bytes.data(), chunk.payload(), bytes.size());
    } else {
      EXPECT_OK(stream_->MemcpyAsync(bytes.data(), chunk.payload(), chunk.capacity_bytes(),
                                     CopyKind::kDeviceToHost));
      EXPECT_OK(stream_->Synchronize());
    }
    return bytes;
  }

  TestHostResource host_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<TestDeviceResource> device_;
};

TEST(CopyKindBetween, AllCombinations) {
  EXPECT_THAT(CopyKindBetween(Device::Host(), Device::Host()), IsOkAndHolds(CopyKind::kHostToHost));
  EXPECT_THAT(CopyKindBetween(Device::Host(), Device::Accelerator(1)),
              IsOkAndHolds(CopyKind::kHostToDevice));
  EXPECT_THAT(CopyKindBetween(Device::Accelerator(1), Device::Host()),
              IsOkAndHolds(CopyKind::kDeviceToHost));
  EXPECT_THAT(CopyKindBetween(Device::Accelerator(1), Device::Accelerator(1)),
              IsOkAndHolds(CopyKind::kDeviceToDevice));
  EXPECT_THAT(CopyKindBetween(Device::Accelerator(0), Device::Accelerator(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "two accelerators"));
}

TEST(ChunkCreate, RejectsInconsistentSpecs) {
  ChunkSpec spec = Spec();
  spec.capacity_elems = 0;
  EXPECT_THAT(Chunk::Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "capacity"));
  spec = Spec();
  spec.tensors[1].offset_elems = 3;  // overlaps a
  EXPECT_THAT(Chunk::Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "'b'"));
  spec = Spec();
  spec.tensors[2].numel = 5;  // beyond 16
  EXPECT_THAT(Chunk::Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "'c'"));
  spec = Spec();
  spec.tensors[2].id = 10;
  EXPECT_THAT(Chunk::Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
}

TEST_F(ChunkTest, NewChunkIsReleasedAndAllocationMakesItFree) {
  auto chunk = MakeChunk();
  EXPECT_EQ(chunk->state(), ChunkState::kReleased);
  EXPECT_FALSE(chunk->has_payload());
  EXPECT_EQ(chunk->tensor_count(TensorState::kFree), 3);
  EXPECT_EQ(chunk->capacity_bytes(), 32);
  ASSERT_OK(chunk->AllocatePayload(host_));
  EXPECT_EQ(chunk->state(), ChunkState::kFree);
  EXPECT_EQ(chunk->device(), Device::Host());
  EXPECT_EQ(host_.allocated_bytes(), 32);
  EXPECT_THAT(chunk->AllocatePayload(host_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already has a payload"));
  ASSERT_OK(chunk->ReleasePayload());
  EXPECT_EQ(chunk->state(), ChunkState::kReleased);
  EXPECT_EQ(host_.allocated_bytes(), 0);
}

TEST_F(ChunkTest, ChunkWithoutTensorsIsFreeOnceAllocated) {
  ChunkSpec spec = Spec();
  spec.tensors.clear();
  auto chunk = MakeChunk(spec);
  EXPECT_EQ(chunk->state(), ChunkState::kReleased);
  ASSERT_OK(chunk->AllocatePayload(host_));
  EXPECT_EQ(chunk->state(), ChunkState::kFree);
}

TEST_F(ChunkTest, FreeToComputeZeroFillsOnlyTheTensorOnHost) {
  auto chunk = MakeChunk();
  ASSERT_OK(chunk->AllocatePayload(host_));
  std::memset(chunk->payload(), 0xAB, chunk->capacity_bytes());
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kCompute));  // b: bytes [8, 20)
  const auto* bytes = static_cast<const uint8_t*>(chunk->payload());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bytes[i], (i >= 8 && i < 20) ? 0 : 0xAB) << i;
  // HOLD -> COMPUTE keeps the data.
  std::memset(chunk->payload(), 0x11, chunk->capacity_bytes());
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kHold));
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kCompute));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bytes[i], 0x11) << i;
}

TEST_F(ChunkTest, FreeToComputeZeroFillsOnTheAcceleratorThroughTheStream) {
  auto chunk = MakeChunk(Spec(ChunkType::kMaster, DType::kF32));  // 64 bytes
  ASSERT_OK(chunk->AllocatePayload(*device_));
  std::vector<uint8_t> pattern(chunk->capacity_bytes(), 0xCD);
  ASSERT_OK(stream_->MemcpyAsync(chunk->payload(), pattern.data(), pattern.size(),
                                 CopyKind::kHostToDevice));
  EXPECT_THAT(chunk->SetTensorState(2, TensorState::kCompute),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs a stream"));
  EXPECT_EQ(chunk->tensor_state(2), TensorState::kFree);
  ASSERT_OK(chunk->SetTensorState(2, TensorState::kCompute, stream_.get()));  // c: [48, 64)
  const std::vector<uint8_t> bytes = ReadPayload(*chunk);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(bytes[i], i >= 48 ? 0 : 0xCD) << i;
  ASSERT_OK(chunk->SetTensorState(2, TensorState::kHold));
}

TEST_F(ChunkTest, IllegalTransitionNamesTensorChunkAndStates) {
  auto chunk = MakeChunk();
  ASSERT_OK(chunk->AllocatePayload(host_));
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kCompute));
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kHoldAfterFwd));
  EXPECT_THAT(chunk->SetTensorState(1, TensorState::kHoldAfterBwd),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("HOLD_AFTER_FWD -> HOLD_AFTER_BWD"), HasSubstr("'b'"),
                             HasSubstr("param#3"), HasSubstr("FREE, COMPUTE, HOLD"))));
  EXPECT_EQ(chunk->tensor_state(1), TensorState::kHoldAfterFwd);
  EXPECT_EQ(chunk->tensor_count(TensorState::kHoldAfterFwd), 1);
  EXPECT_THAT(chunk->SetTensorState(0, TensorState::kFree),
              StatusIs(absl::StatusCode::kFailedPrecondition, "FREE -> FREE"));
  EXPECT_THAT(chunk->SetTensorState(7, TensorState::kHold),
              StatusIs(absl::StatusCode::kInvalidArgument, "slot 7"));
}

// Every (from, to) pair on a real chunk: accepted exactly when the table says so; rejected ones
// are FailedPrecondition naming both states and change nothing.
TEST_F(ChunkTest, EveryLegalTransitionIsAcceptedAndEveryIllegalOneRejected) {
  // A legal path from FREE to each state.
  const std::vector<std::vector<TensorState>> paths = {
      {},
      {TensorState::kCompute},
      {TensorState::kHold},
      {TensorState::kCompute, TensorState::kHoldAfterFwd},
      {TensorState::kCompute, TensorState::kHoldAfterBwd},
  };
  int accepted = 0;
  for (TensorState from : kAllTensorStates) {
    for (TensorState to : kAllTensorStates) {
      SCOPED_TRACE(::testing::Message() << from << " -> " << to);
      auto chunk = MakeChunk();
      ASSERT_OK(chunk->AllocatePayload(host_));
      for (TensorState step : paths[static_cast<int>(from)]) {
        ASSERT_OK(chunk->SetTensorState(0, step));
      }
      ASSERT_EQ(chunk->tensor_state(0), from);
      const absl::Status s = chunk->SetTensorState(0, to);
      if (IsLegalTransition(from, to)) {
        EXPECT_OK(s);
        EXPECT_EQ(chunk->tensor_state(0), to);
        ++accepted;
      } else {
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                                absl::StrCat(TensorStateName(from), " -> ", TensorStateName(to),
                                             " for tensor 'a'")));
        EXPECT_EQ(chunk->tensor_state(0), from);
      }
      TensorStateCounts expected = {2, 0, 0, 0, 0};  // b and c stay FREE
      ++expected[static_cast<int>(chunk->tensor_state(0))];
      EXPECT_EQ(chunk->tensor_counts(), expected);
    }
  }
  EXPECT_EQ(accepted, 13);
}

TEST_F(ChunkTest, NoDataWithoutPayload) {
  auto chunk = MakeChunk();
  EXPECT_THAT(chunk->SetTensorState(0, TensorState::kCompute),
              StatusIs(absl::StatusCode::kFailedPrecondition, "RELEASED"));
  EXPECT_THAT(chunk->SetTensorState(0, TensorState::kHold),
              StatusIs(absl::StatusCode::kFailedPrecondition, "RELEASED"));
  EXPECT_THAT(chunk->View(0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(chunk->PayloadView(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(chunk->tensor_count(TensorState::kFree), 3);
}

TEST_F(ChunkTest, DerivedStateFollowsTheCounts) {
  auto chunk = MakeChunk();
  ASSERT_OK(chunk->AllocatePayload(host_));
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kCompute));
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kHold));
  EXPECT_EQ(chunk->state(), ChunkState::kCompute);
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kHoldAfterBwd));
  EXPECT_EQ(chunk->state(), ChunkState::kHold);
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kCompute));
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kHoldAfterFwd));
  EXPECT_EQ(chunk->state(), ChunkState::kHoldAfterFwd);
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kFree));
  EXPECT_EQ(chunk->state(), ChunkState::kHoldAfterBwd);
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kFree));
  EXPECT_EQ(chunk->state(), ChunkState::kFree);
  const TensorStateCounts expected = {3, 0, 0, 0, 0};
  EXPECT_EQ(chunk->tensor_counts(), expected);
}

TEST_F(ChunkTest, MovesPreserveDataAndUseTheRightCopyKind) {
  auto chunk = MakeChunk(Spec(ChunkType::kMomentum, DType::kF32));
  ASSERT_OK(chunk->AllocatePayload(host_));
  auto* data = static_cast<uint8_t*>(chunk->payload());
  for (int i = 0; i < chunk->capacity_bytes(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  const std::vector<uint8_t> expected(data, data + chunk->capacity_bytes());
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kHold));

  ASSERT_OK(chunk->MoveTo(*device_, *stream_));
  EXPECT_EQ(chunk->device(), backend_->device());
  EXPECT_EQ(host_.allocated_bytes(), 0);
  EXPECT_EQ(device_->allocated_bytes(), 64);
  EXPECT_EQ(backend_->counters().host_to_device_bytes, 64);
  EXPECT_EQ(ReadPayload(*chunk), expected);
  EXPECT_EQ(chunk->tensor_state(0), TensorState::kHold);
  ASSERT_OK_AND_ASSIGN(TensorView view, chunk->View(1));
  EXPECT_EQ(view.data, static_cast<char*>(chunk->payload()) + 16);
  EXPECT_EQ(view.numel, 6);
  EXPECT_EQ(view.bytes(), 24);
  EXPECT_EQ(view.device, backend_->device());

  ASSERT_OK(chunk->MoveTo(*device_, *stream_));  // already there: no-op
  EXPECT_EQ(backend_->counters().host_to_device_bytes, 64);

  const int64_t read_back_bytes = backend_->counters().device_to_host_bytes;  // ReadPayload's
  ASSERT_OK(chunk->MoveTo(host_, *stream_));
  EXPECT_EQ(backend_->counters().device_to_host_bytes, read_back_bytes + 64);
  EXPECT_EQ(chunk->device(), Device::Host());
  EXPECT_EQ(device_->allocated_bytes(), 0);
  EXPECT_EQ(ReadPayload(*chunk), expected);

  TestHostResource other_host;
  ASSERT_OK(chunk->MoveTo(other_host, *stream_));  // host to host
  EXPECT_EQ(ReadPayload(*chunk), expected);
  ASSERT_OK(chunk->ReleasePayload());
  EXPECT_EQ(other_host.allocated_bytes(), 0);
}

TEST_F(ChunkTest, ComputeAndPinnedChunksNeitherMoveNorRelease) {
  auto chunk = MakeChunk();
  ASSERT_OK(chunk->AllocatePayload(host_));
  ASSERT_OK(chunk->SetTensorState(2, TensorState::kCompute));
  EXPECT_FALSE(chunk->movable());
  EXPECT_THAT(chunk->MoveTo(*device_, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "COMPUTE"));
  EXPECT_THAT(chunk->ReleasePayload(), StatusIs(absl::StatusCode::kFailedPrecondition, "COMPUTE"));
  EXPECT_EQ(chunk->device(), Device::Host());
  ASSERT_OK(chunk->SetTensorState(2, TensorState::kHoldAfterFwd));
  EXPECT_TRUE(chunk->movable());

  chunk->Pin();
  chunk->Pin();
  EXPECT_FALSE(chunk->movable());
  EXPECT_THAT(chunk->MoveTo(*device_, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "pinned (2 pins)"));
  EXPECT_THAT(chunk->ReleasePayload(), StatusIs(absl::StatusCode::kFailedPrecondition, "pinned"));
  ASSERT_OK(chunk->Unpin());
  EXPECT_TRUE(chunk->pinned());
  ASSERT_OK(chunk->Unpin());
  EXPECT_THAT(chunk->Unpin(), StatusIs(absl::StatusCode::kFailedPrecondition, "not pinned"));
  EXPECT_EQ(device_->total_allocations(), 0);

  // Releasing drops the held data: every tensor is FREE again.
  ASSERT_OK(chunk->ReleasePayload());
  EXPECT_EQ(chunk->tensor_count(TensorState::kFree), 3);
  EXPECT_EQ(chunk->tensor_state(2), TensorState::kFree);
  EXPECT_THAT(chunk->ReleasePayload(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no payload"));
  EXPECT_THAT(chunk->MoveTo(host_, *stream_), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(ChunkTest, OnlyTheOwnerHoldsOptimizerState) {
  for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
    auto remote = MakeChunk(Spec(type, DType::kF32, /*owner=*/1, /*local=*/0));
    EXPECT_THAT(remote->AllocatePayload(host_),
                StatusIs(absl::StatusCode::kFailedPrecondition, "owned by rank 1"));
    auto padding = MakeChunk(Spec(type, DType::kF32, 0, 0, /*padding=*/true));
    EXPECT_THAT(padding->AllocatePayload(host_),
                StatusIs(absl::StatusCode::kFailedPrecondition, "padding"));
    auto local = MakeChunk(Spec(type, DType::kF32, 1, 1));
    EXPECT_OK(local->AllocatePayload(host_));
  }
  // Param chunks of other ranks are gathered here, so they may be allocated.
  auto remote_param = MakeChunk(Spec(ChunkType::kParam, DType::kF16, 1, 0, true));
  EXPECT_FALSE(remote_param->is_local());
  EXPECT_OK(remote_param->AllocatePayload(host_));
}

TEST_F(ChunkTest, OutOfMemoryLeavesTheChunkUnchanged) {
  TestHostResource small_host(/*capacity_bytes=*/40);
  auto a = MakeChunk();
  auto b = MakeChunk();
  ASSERT_OK(a->AllocatePayload(small_host));
  EXPECT_THAT(b->AllocatePayload(small_host),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("param#3"), HasSubstr("out of memory"))));
  EXPECT_EQ(b->state(), ChunkState::kReleased);

  TestDeviceResource small_device(*backend_, /*capacity_bytes=*/40);
  ASSERT_OK(b->AllocatePayload(small_device));
  std::memset(a->payload(), 0x5A, a->capacity_bytes());
  ASSERT_OK(a->SetTensorState(0, TensorState::kHold));
  EXPECT_THAT(a->MoveTo(small_device, *stream_),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("moving chunk param#3"), HasSubstr("accelerator:0"))));
  EXPECT_EQ(a->device(), Device::Host());
  EXPECT_EQ(a->payload_resource(), &small_host);
  EXPECT_THAT(ReadPayload(*a), Each(0x5A));
  EXPECT_EQ(a->tensor_state(0), TensorState::kHold);
  ASSERT_OK(b->ReleasePayload());
  ASSERT_OK(a->MoveTo(small_device, *stream_));
  EXPECT_THAT(ReadPayload(*a), Each(0x5A));
  ASSERT_OK(a->ReleasePayload());
}

TEST_F(ChunkTest, DestructionGivesThePayloadBack) {
  {
    auto chunk = MakeChunk();
    ASSERT_OK(chunk->AllocatePayload(*device_));
    EXPECT_EQ(device_->allocated_bytes(), 32);
  }
  EXPECT_EQ(device_->allocated_bytes(), 0);
  EXPECT_EQ(backend_->allocated_bytes(), 0);
}

// --- Backing copy -------------------------------------------------------------------------------

// Loading keeps the host buffer; an unchanged chunk is evicted by dropping the device copy, with
// no device-to-host traffic at all.
TEST_F(ChunkTest, CleanChunkIsEvictedWithoutACopy) {
  auto chunk = MakeChunk(Spec(ChunkType::kMaster, DType::kF32));
  ASSERT_OK(chunk->AllocatePayload(host_));
  auto* data = static_cast<uint8_t*>(chunk->payload());
  for (int i = 0; i < chunk->capacity_bytes(); ++i) data[i] = static_cast<uint8_t>(3 * i + 5);
  const std::vector<uint8_t> expected(data, data + chunk->capacity_bytes());
  void* host_buffer = chunk->payload();
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kHold));

  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  ASSERT_OK(stream_->Synchronize());
  EXPECT_EQ(chunk->device(), backend_->device());
  EXPECT_TRUE(chunk->has_backing());
  EXPECT_TRUE(chunk->backing_valid());
  EXPECT_EQ(chunk->backing(), host_buffer);
  EXPECT_EQ(chunk->backing_device(), Device::Host());
  EXPECT_EQ(host_.allocated_bytes(), 64);
  EXPECT_EQ(device_->allocated_bytes(), 64);
  EXPECT_EQ(backend_->counters().host_to_device_bytes, 64);
  EXPECT_EQ(ReadPayload(*chunk), expected);
  EXPECT_THAT(chunk->DebugString(), HasSubstr("backing on host (clean)"));

  // A read-only use: COMPUTE and back does not change the bytes.
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kCompute));
  EXPECT_THAT(chunk->RevertToBacking(), StatusIs(absl::StatusCode::kFailedPrecondition, "COMPUTE"));
  ASSERT_OK(chunk->SetTensorState(1, TensorState::kHoldAfterFwd));

  const int64_t d2h_before = backend_->counters().device_to_host_bytes;
  ASSERT_OK(chunk->RevertToBacking());
  EXPECT_EQ(backend_->counters().device_to_host_bytes, d2h_before);  // no copy back
  EXPECT_EQ(chunk->payload(), host_buffer);
  EXPECT_FALSE(chunk->has_backing());
  EXPECT_EQ(device_->allocated_bytes(), 0);
  EXPECT_EQ(host_.allocated_bytes(), 64);
  EXPECT_EQ(ReadPayload(*chunk), expected);
  EXPECT_EQ(chunk->tensor_state(1), TensorState::kHoldAfterFwd);
  EXPECT_THAT(chunk->RevertToBacking(), StatusIs(absl::StatusCode::kFailedPrecondition, "none"));
}

TEST_F(ChunkTest, WrittenChunkIsWrittenBackIntoItsBackingCopy) {
  auto chunk = MakeChunk(Spec(ChunkType::kParam, DType::kF16));
  ASSERT_OK(chunk->AllocatePayload(host_));
  std::memset(chunk->payload(), 0x11, chunk->capacity_bytes());
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kHold));
  void* host_buffer = chunk->payload();
  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kCompute));
  chunk->MarkPayloadWritten();
  ASSERT_OK(stream_->MemsetAsync(chunk->payload(), 0x22, chunk->capacity_bytes()));
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kHoldAfterBwd));
  EXPECT_TRUE(chunk->has_backing());
  EXPECT_FALSE(chunk->backing_valid());
  EXPECT_THAT(chunk->DebugString(), HasSubstr("(stale)"));
  EXPECT_THAT(chunk->RevertToBacking(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "write it back first"));

  ASSERT_OK(chunk->WriteBackAsync(*stream_));
  ASSERT_OK(stream_->Synchronize());
  EXPECT_TRUE(chunk->backing_valid());
  EXPECT_EQ(host_.total_allocations(), 1);  // the existing buffer was reused
  const int64_t d2h = backend_->counters().device_to_host_bytes;
  ASSERT_OK(chunk->WriteBackAsync(*stream_));  // already valid: no-op
  ASSERT_OK(stream_->Synchronize());
  EXPECT_EQ(backend_->counters().device_to_host_bytes, d2h);
  ASSERT_OK(chunk->RevertToBacking());
  EXPECT_EQ(chunk->payload(), host_buffer);
  EXPECT_THAT(ReadPayload(*chunk), Each(0x22));
}

TEST_F(ChunkTest, WriteBackAllocatesABackingCopyWhenThereIsNone) {
  auto chunk = MakeChunk();
  ASSERT_OK(chunk->AllocatePayload(*device_));
  ASSERT_OK(chunk->SetTensorState(2, TensorState::kCompute, stream_.get()));  // zero-fills
  ASSERT_OK(chunk->SetTensorState(2, TensorState::kHoldAfterFwd));
  EXPECT_THAT(chunk->WriteBackAsync(*stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no backing copy"));
  EXPECT_THAT(chunk->WriteBackAsync(*stream_, device_.get()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  TestHostResource tiny_host(/*capacity_bytes=*/8);
  EXPECT_THAT(chunk->WriteBackAsync(*stream_, &tiny_host),
              StatusIs(absl::StatusCode::kResourceExhausted, "backing copy of chunk param#3"));
  EXPECT_FALSE(chunk->has_backing());
  ASSERT_OK(chunk->WriteBackAsync(*stream_, &host_));
  ASSERT_OK(stream_->Synchronize());
  EXPECT_TRUE(chunk->backing_valid());
  ASSERT_OK(chunk->RevertToBacking());
  EXPECT_EQ(chunk->device(), Device::Host());
  ASSERT_OK_AND_ASSIGN(TensorView view, chunk->View(2));
  EXPECT_EQ(std::vector<uint8_t>(static_cast<uint8_t*>(view.data),
                                 static_cast<uint8_t*>(view.data) + view.bytes()),
            std::vector<uint8_t>(view.bytes(), 0));
  EXPECT_EQ(device_->allocated_bytes(), 0);
}

TEST_F(ChunkTest, NewDataInvalidatesTheBackingCopy) {
  for (TensorState to : {TensorState::kCompute, TensorState::kHold}) {
    auto chunk = MakeChunk();
    ASSERT_OK(chunk->AllocatePayload(host_));
    ASSERT_OK(chunk->SetTensorState(0, TensorState::kHold));
    ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
    ASSERT_OK(stream_->Synchronize());
    EXPECT_TRUE(chunk->backing_valid());
    ASSERT_OK(chunk->SetTensorState(1, to, stream_.get()));  // FREE -> *: the bytes change
    EXPECT_FALSE(chunk->backing_valid()) << to;
    ASSERT_OK(stream_->Synchronize());
  }
}

// An asynchronous move: copy, wait, then give the source back.
TEST_F(ChunkTest, AsynchronousMoveFreesTheSourceOnlyWhenAsked) {
  auto chunk = MakeChunk(Spec(ChunkType::kMomentum, DType::kF32));
  ASSERT_OK(chunk->AllocatePayload(*device_));
  ASSERT_OK(stream_->MemsetAsync(chunk->payload(), 0x7C, chunk->capacity_bytes()));
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kHold));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Event> done, backend_->CreateEvent());
  ASSERT_OK(chunk->CopyToKeepingBacking(host_, *stream_));
  ASSERT_OK(stream_->RecordEvent(done.get()));
  EXPECT_EQ(device_->allocated_bytes(), 64);  // the source stays until the copy is known done
  ASSERT_OK(done->Synchronize());
  ASSERT_OK(chunk->DiscardBacking());
  EXPECT_EQ(device_->allocated_bytes(), 0);
  EXPECT_EQ(chunk->device(), Device::Host());
  EXPECT_THAT(ReadPayload(*chunk), Each(0x7C));
  EXPECT_THAT(chunk->DiscardBacking(), StatusIs(absl::StatusCode::kFailedPrecondition, "none"));
}

TEST_F(ChunkTest, BackingCopyRefusals) {
  auto chunk = MakeChunk();
  EXPECT_THAT(chunk->CopyToKeepingBacking(*device_, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no payload"));
  ASSERT_OK(chunk->AllocatePayload(host_));
  EXPECT_THAT(chunk->CopyToKeepingBacking(host_, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already there"));
  chunk->Pin();
  EXPECT_THAT(chunk->CopyToKeepingBacking(*device_, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "pinned"));
  ASSERT_OK(chunk->Unpin());
  TestDeviceResource small_device(*backend_, /*capacity_bytes=*/8);
  EXPECT_THAT(chunk->CopyToKeepingBacking(small_device, *stream_),
              StatusIs(absl::StatusCode::kResourceExhausted, "copying chunk param#3"));
  EXPECT_FALSE(chunk->has_backing());
  EXPECT_EQ(chunk->device(), Device::Host());
  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  EXPECT_THAT(chunk->CopyToKeepingBacking(host_, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already has a backing copy"));
  ASSERT_OK(stream_->Synchronize());
  chunk->Pin();
  EXPECT_THAT(chunk->RevertToBacking(), StatusIs(absl::StatusCode::kFailedPrecondition, "pinned"));
  EXPECT_THAT(chunk->WriteBackAsync(*stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "pinned"));
  ASSERT_OK(chunk->Unpin());
}

// MoveTo reuses a backing copy on the destination; release and destruction give it back.
TEST_F(ChunkTest, MoveReleaseAndDestructionHandleTheBackingCopy) {
  auto chunk = MakeChunk();
  ASSERT_OK(chunk->AllocatePayload(host_));
  std::memset(chunk->payload(), 0x33, chunk->capacity_bytes());
  ASSERT_OK(chunk->SetTensorState(0, TensorState::kHold));
  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  ASSERT_OK(stream_->Synchronize());
  const int64_t d2h = backend_->counters().device_to_host_bytes;
  ASSERT_OK(chunk->MoveTo(host_, *stream_));  // clean: reverts, no copy
  EXPECT_EQ(backend_->counters().device_to_host_bytes, d2h);
  EXPECT_EQ(host_.total_allocations(), 1);
  EXPECT_EQ(device_->allocated_bytes(), 0);

  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  chunk->MarkPayloadWritten();
  ASSERT_OK(stream_->MemsetAsync(chunk->payload(), 0x44, chunk->capacity_bytes()));
  ASSERT_OK(chunk->MoveTo(host_, *stream_));  // stale: written back into the same buffer
  EXPECT_EQ(backend_->counters().device_to_host_bytes, d2h + 32);
  EXPECT_EQ(host_.total_allocations(), 1);
  EXPECT_THAT(ReadPayload(*chunk), Each(0x44));

  // A move elsewhere gives the backing copy back.
  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  ASSERT_OK(stream_->Synchronize());
  TestHostResource other_host;
  ASSERT_OK(chunk->MoveTo(other_host, *stream_));
  EXPECT_FALSE(chunk->has_backing());
  EXPECT_EQ(host_.allocated_bytes(), 0);
  EXPECT_EQ(device_->allocated_bytes(), 0);
  EXPECT_THAT(ReadPayload(*chunk), Each(0x44));
  ASSERT_OK(chunk->ReleasePayload());

  ASSERT_OK(chunk->AllocatePayload(host_));
  ASSERT_OK(chunk->CopyToKeepingBacking(*device_, *stream_));
  ASSERT_OK(stream_->Synchronize());
  ASSERT_OK(chunk->ReleasePayload());
  EXPECT_EQ(host_.allocated_bytes(), 0);
  EXPECT_EQ(device_->allocated_bytes(), 0);

  {
    auto other = MakeChunk();
    ASSERT_OK(other->AllocatePayload(host_));
    ASSERT_OK(other->CopyToKeepingBacking(*device_, *stream_));
    ASSERT_OK(stream_->Synchronize());
  }
  EXPECT_EQ(host_.allocated_bytes(), 0);
  EXPECT_EQ(device_->allocated_bytes(), 0);
}

TEST_F(ChunkTest, FindSlotAndDebugString) {
  auto chunk = MakeChunk();
  EXPECT_THAT(chunk->FindSlot(11), IsOkAndHolds(1));
  EXPECT_THAT(chunk->FindSlot(99), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(chunk->tensor(2).name, "c");
  EXPECT_THAT(chunk->DebugString(), AllOf(HasSubstr("param#3"), HasSubstr("RELEASED")));
  ASSERT_OK(chunk->AllocatePayload(host_));
  chunk->Pin();
  EXPECT_THAT(chunk->DebugString(),
              AllOf(HasSubstr("FREE"), HasSubstr("on host"), HasSubstr("pinned 1")));
  ASSERT_OK(chunk->Unpin());
}

}  // namespace
}  // namespace ps
