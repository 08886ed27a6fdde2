// ResidencyEngine on the emulated accelerator: loads keep a backing copy and evict clean without a
// copy, dirty chunks are written back with their bytes, released chunks are allocated, write-behind
// makes a later eviction clean, prefetch hits are counted once, stuck chunks are never victims,
// and eviction under memory pressure counts only the chunks it really evicted. A listener sees
// every move the counters count; stalls and events are timed on the injected clock.
#include "scheduler/residency.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/testing/fake_clock.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
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
#include "scheduler/chunk_counters.h"
#include "scheduler/chunk_events.h"
#include "scheduler/metronome.h"

namespace ps {
namespace {

constexpr int64_t kChunkElems = 1024;  // one f32 tensor per chunk: 4 KiB chunks
constexpr int64_t kChunkBytes = kChunkElems * 4;
constexpr int kChunks = 4;

class RecordingListener final : public ChunkEventListener {
 public:
  void OnChunkMove(const ChunkMoveEvent& e) override {
    MutexLock lock(&mu_);
    moves_.push_back(e);
  }
  void OnAccess(const ChunkAccessEvent&) override {}
  void OnRelease(absl::string_view, int64_t, Stage, int64_t) override {}
  std::vector<ChunkMoveEvent> moves() {
    MutexLock lock(&mu_);
    return moves_;
  }

 private:
  Mutex mu_;
  std::vector<ChunkMoveEvent> moves_;
};

// kChunks param chunks with one tensor each (f32), their payloads on the host holding `Fill(i)`.
class ResidencyTest : public ::testing::Test {
 protected:
  void Build(ResidencyOptions options, std::optional<int64_t> host_blocks = std::nullopt) {
    ASSERT_OK_AND_ASSIGN(backend_, CreateCpuBackend({.capacity_bytes = 16 * kChunkBytes}));
    DeviceMemoryOptions memory;
    memory.chunk_block_bytes = kChunkBytes;
    ASSERT_OK_AND_ASSIGN(accel_, CreateAcceleratorMemory(backend_.get(), memory));
    memory.max_chunk_blocks = host_blocks;
    ASSERT_OK_AND_ASSIGN(host_, CreateHostMemory(backend_.get(), memory));
    std::vector<OperatorSpec> ops;
    for (int i = 0; i < kChunks; ++i) {
      ops.push_back({absl::StrCat("op", i), {{absl::StrCat("w", i), {kChunkElems}}}});
    }
    ASSERT_OK_AND_ASSIGN(ChunkLayout layout,
                         ChunkLayout::Build({.capacity_elems = kChunkElems}, ops));
    ASSERT_OK_AND_ASSIGN(store_,
                         ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kF32}));
    ASSERT_OK_AND_ASSIGN(
        engine_, ResidencyEngine::Create(store_.get(), backend_.get(), accel_.get(), host_.get(),
                                         options, &counters_));
  }

  // Gives chunk i a host payload holding i + 1 in every element (its tensor HOLD).
  void PutOnHost(int64_t i) {
    Chunk& c = engine_->chunk(i);
    ASSERT_OK(c.AllocatePayload(*host_->chunk_pool()));
    ASSERT_OK(c.SetTensorState(0, TensorState::kHold));
    Fill(i, static_cast<float>(i + 1));
  }
  void Fill(int64_t i, float v) {
    ASSERT_OK_AND_ASSIGN(TensorView view, engine_->chunk(i).View(0));
    auto* data = static_cast<float*>(view.data);
    for (int64_t e = 0; e < view.numel; ++e) data[e] = v;
  }
  // Every element of chunk i's payload equals v.
  bool Holds(int64_t i, float v) {
    absl::StatusOr<TensorView> view = engine_->chunk(i).View(0);
    if (!view.ok()) return false;
    const auto* data = static_cast<const float*>(view->data);
    for (int64_t e = 0; e < view->numel; ++e) {
      if (data[e] != v) return false;
    }
    return true;
  }
  bool OnHost(int64_t i) { return engine_->chunk(i).device().is_host(); }

  ChunkManagerCounters counters_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceMemory> accel_;
  std::unique_ptr<DeviceMemory> host_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<ResidencyEngine> engine_;
};

constexpr MoveContext kFwd{Stage::kForward, 3};
constexpr MoveContext kBwd{Stage::kBackward, 7};

TEST_F(ResidencyTest, LoadsKeepABackingCopySoCleanEvictionsCopyNothing) {
  Build({});
  PutOnHost(0);
  PutOnHost(1);
  ASSERT_OK(engine_->Load({0, 1}, kFwd, /*prefetch=*/false));
  EXPECT_TRUE(engine_->resident(0));
  EXPECT_EQ(engine_->resident_bytes(), 2 * kChunkBytes);
  EXPECT_EQ(engine_->chunk_cost_bytes(ChunkType::kParam), kChunkBytes);
  ASSERT_OK(engine_->WaitForCopies({0, 1}));
  EXPECT_FALSE(engine_->in_flight(0));
  EXPECT_FALSE(OnHost(0));
  EXPECT_TRUE(Holds(0, 1.0f));
  EXPECT_TRUE(engine_->chunk(0).backing_valid());
  EXPECT_EQ(counters_.stage(Stage::kForward).loads, 2);
  EXPECT_EQ(counters_.stage(Stage::kForward).load_bytes, 2 * kChunkBytes);
  // Chunk 1 is written on the device: its eviction writes back, chunk 0's drops the copy.
  engine_->chunk(1).MarkPayloadWritten();
  Fill(1, 42.0f);
  int64_t evicted = 0;
  ASSERT_OK(engine_->Evict({0, 1}, kBwd, &evicted));
  EXPECT_EQ(evicted, 2);
  EXPECT_EQ(engine_->resident_bytes(), 0);
  EXPECT_TRUE(OnHost(0) && OnHost(1));
  EXPECT_TRUE(Holds(0, 1.0f));
  EXPECT_TRUE(Holds(1, 42.0f));
  const TransferCounters& bwd = counters_.stage(Stage::kBackward);
  EXPECT_EQ(bwd.clean_evictions, 1);
  EXPECT_EQ(bwd.write_backs, 1);
  EXPECT_EQ(bwd.write_back_bytes, kChunkBytes);
  EXPECT_EQ(counters_.Total().loads, 2);
}

TEST_F(ResidencyTest, ReleasedChunksAreAllocatedAndWrittenBackOnEviction) {
  Build({});
  ASSERT_OK(engine_->Load({2}, kFwd, false));
  EXPECT_EQ(counters_.stage(Stage::kForward).allocations, 1);
  EXPECT_EQ(counters_.stage(Stage::kForward).loads, 0);
  EXPECT_FALSE(engine_->in_flight(2));
  ASSERT_OK(engine_->chunk(2).SetTensorState(0, TensorState::kHold));
  Fill(2, 7.0f);
  ASSERT_OK(engine_->MoveToHost(2, kFwd));
  EXPECT_TRUE(OnHost(2));
  EXPECT_TRUE(Holds(2, 7.0f));
  EXPECT_EQ(counters_.stage(Stage::kForward).write_backs, 1);
  // Moving a released chunk to the host gives it a host payload; one on the host stays.
  ASSERT_OK(engine_->MoveToHost(3, kFwd));
  EXPECT_TRUE(OnHost(3));
  ASSERT_OK(engine_->MoveToHost(3, kFwd));
  EXPECT_EQ(counters_.Total().write_backs, 1);
}

TEST_F(ResidencyTest, WithoutCleanEvictionEveryEvictionIsACopy) {
  Build({.clean_eviction = false});
  PutOnHost(0);
  ASSERT_OK(engine_->Load({0}, kFwd, false));
  ASSERT_OK(engine_->WaitForCopies({0}));
  EXPECT_FALSE(engine_->chunk(0).has_backing());
  ASSERT_OK(engine_->Evict({0}, kFwd));
  EXPECT_EQ(counters_.stage(Stage::kForward).write_backs, 1);
  EXPECT_EQ(counters_.stage(Stage::kForward).clean_evictions, 0);
  EXPECT_TRUE(Holds(0, 1.0f));
}

TEST_F(ResidencyTest, WriteBehindMakesTheLaterEvictionClean) {
  Build({});
  PutOnHost(0);
  ASSERT_OK(engine_->Load({0}, kFwd, false));
  ASSERT_OK(engine_->WaitForCopies({0}));
  // Clean: nothing to write.
  EXPECT_THAT(engine_->StartWriteBehind(0, kBwd), IsOkAndHolds(false));
  engine_->chunk(0).MarkPayloadWritten();
  Fill(0, 9.0f);
  EXPECT_THAT(engine_->StartWriteBehind(0, kBwd), IsOkAndHolds(true));
  EXPECT_THAT(engine_->StartWriteBehind(0, kBwd), IsOkAndHolds(false));  // already in flight
  EXPECT_EQ(counters_.write_behinds, 1);
  EXPECT_EQ(counters_.stage(Stage::kBackward).write_backs, 1);
  ASSERT_OK(engine_->Evict({0}, kBwd));  // waits for the write-behind, then drops
  EXPECT_EQ(counters_.stage(Stage::kBackward).clean_evictions, 1);
  EXPECT_EQ(counters_.stage(Stage::kBackward).write_backs, 1);
  EXPECT_TRUE(Holds(0, 9.0f));
  // Not resident: nothing to write behind.
  EXPECT_THAT(engine_->StartWriteBehind(0, kBwd), IsOkAndHolds(false));
}

TEST_F(ResidencyTest, PrefetchHitsAreCountedOnce) {
  Build({});
  PutOnHost(0);
  PutOnHost(1);
  ASSERT_OK(engine_->Load({0}, kFwd, /*prefetch=*/true));
  ASSERT_OK(engine_->Load({1}, kFwd, /*prefetch=*/false));
  EXPECT_EQ(counters_.prefetches, 1);
  engine_->NoteAccessed(0);
  engine_->NoteAccessed(0);
  engine_->NoteAccessed(1);
  EXPECT_EQ(counters_.prefetch_hits, 1);
  EXPECT_TRUE(engine_->CopiesDone(0) || engine_->in_flight(0));
  ASSERT_OK(engine_->WaitForCopies({0, 1}));
  EXPECT_TRUE(engine_->CopiesDone(0));
}

// bf16 params and f32 state, each in a pool of its own size: a param chunk costs (and takes) a
// 16-bit block on both devices, a master chunk an f32 one.
TEST(ResidencyPerDtypeTest, SixteenBitParamChunksTakeSixteenBitBlocks) {
  ChunkManagerCounters counters;
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = 16 * kChunkBytes}));
  DeviceMemoryOptions memory;
  memory.chunk_block_bytes = kChunkBytes;
  memory.more_chunk_block_bytes = {kChunkBytes / 2};
  ASSERT_OK_AND_ASSIGN(auto accel, CreateAcceleratorMemory(backend.get(), memory));
  ASSERT_OK_AND_ASSIGN(auto host, CreateHostMemory(backend.get(), memory));
  ASSERT_OK_AND_ASSIGN(
      ChunkLayout layout,
      ChunkLayout::Build({.capacity_elems = kChunkElems},
                         std::vector<OperatorSpec>{{"op", {{"w", {kChunkElems}}}}}));
  ASSERT_OK_AND_ASSIGN(auto store,
                       ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kBF16}));
  ASSERT_OK_AND_ASSIGN(auto engine, ResidencyEngine::Create(store.get(), backend.get(), accel.get(),
                                                            host.get(), {}, &counters));
  EXPECT_EQ(engine->chunk_cost_bytes(ChunkType::kParam), kChunkBytes / 2);
  EXPECT_EQ(engine->chunk_cost_bytes(ChunkType::kMaster), kChunkBytes);
  const ChunkKeys keys = engine->keys();
  const int64_t param = keys.Key(ChunkType::kParam, 0), master = keys.Key(ChunkType::kMaster, 0);
  ASSERT_OK(engine->MoveToHost(param, kFwd));
  ASSERT_OK(engine->MoveToHost(master, kFwd));
  EXPECT_EQ(host->tracker()->Snapshot().model_bytes, kChunkBytes / 2 + kChunkBytes);
  for (int64_t key : {param, master}) {
    ASSERT_OK(engine->chunk(key).SetTensorState(0, TensorState::kHold));
  }
  ASSERT_OK(engine->Load({param, master}, kFwd, false));
  ASSERT_OK(engine->WaitForCopies({param, master}));
  EXPECT_EQ(engine->resident_bytes(), kChunkBytes / 2 + kChunkBytes);
  EXPECT_EQ(accel->tracker()->Snapshot().model_bytes, kChunkBytes / 2 + kChunkBytes);
  EXPECT_EQ(accel->chunk_pool_for(kChunkBytes / 2)->stats().blocks_in_use, 1);
  EXPECT_EQ(accel->chunk_pool()->stats().blocks_in_use, 1);
  ASSERT_OK(engine->Evict({param, master}, kFwd));
  EXPECT_EQ(engine->resident_bytes(), 0);

  // A device without a pool large enough for the f32 chunks is refused up front.
  DeviceMemoryOptions small;
  small.chunk_block_bytes = kChunkBytes / 2;
  ASSERT_OK_AND_ASSIGN(auto small_accel, CreateAcceleratorMemory(backend.get(), small));
  EXPECT_THAT(ResidencyEngine::Create(store.get(), backend.get(), small_accel.get(), host.get(), {},
                                      &counters)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "master chunk needs"));
}

TEST_F(ResidencyTest, StuckChunksAreCountedAndNeverReclaimed) {
  Build({});
  for (int64_t i = 0; i < 3; ++i) PutOnHost(i);
  ASSERT_OK(engine_->Load({0, 1, 2}, kFwd, false));
  ASSERT_OK(engine_->WaitForCopies({0, 1, 2}));
  ASSERT_OK(engine_->chunk(0).SetTensorState(0, TensorState::kCompute));
  engine_->chunk(1).Pin();
  EXPECT_EQ(engine_->StuckBytes({}), 2 * kChunkBytes);
  EXPECT_EQ(engine_->StuckBytes({0}), kChunkBytes);
  // Pressure: only chunk 2 may move (and is not kept).
  const int64_t released = engine_->ReclaimUnderPressure({}, kFwd);
  EXPECT_GE(released, kChunkBytes);
  EXPECT_EQ(counters_.pressure_reclaims, 1);
  EXPECT_EQ(counters_.pressure_evictions, 1);
  EXPECT_THAT(engine_->ResidentKeys(), ::testing::ElementsAre(0, 1));
  // Nothing may move now: no reclaim is counted.
  EXPECT_EQ(engine_->ReclaimUnderPressure({}, kFwd), 0);
  EXPECT_EQ(counters_.pressure_reclaims, 1);
  ASSERT_OK(engine_->chunk(1).Unpin());
  ASSERT_OK(engine_->chunk(0).SetTensorState(0, TensorState::kHold));
  // Kept chunks stay.
  engine_->ReclaimUnderPressure({0}, kFwd);
  EXPECT_THAT(engine_->ResidentKeys(), ::testing::ElementsAre(0));
  EXPECT_EQ(counters_.pressure_evictions, 2);
}

// A reclaim whose eviction fails (the write-back of a dirty chunk finds no host block) evicts
// nothing and counts nothing: the counters say what happened, not what was attempted.
TEST_F(ResidencyTest, FailedPressureEvictionCountsNothing) {
  Build({}, /*host_blocks=*/1);
  PutOnHost(0);  // takes the host's only chunk block
  ASSERT_OK(engine_->Load({0}, kFwd, false));
  ASSERT_OK(engine_->Load({1}, kFwd, false));  // allocated on the device, no host copy: dirty
  ASSERT_OK(engine_->WaitForCopies({0, 1}));
  ASSERT_OK(engine_->chunk(1).SetTensorState(0, TensorState::kHold));
  engine_->ReclaimUnderPressure({}, kFwd);
  EXPECT_EQ(counters_.pressure_reclaims, 0);
  EXPECT_EQ(counters_.pressure_evictions, 0);
  EXPECT_THAT(engine_->ResidentKeys(), ::testing::ElementsAre(0, 1));
  int64_t evicted = 0;
  EXPECT_THAT(engine_->Evict({0, 1}, kFwd, &evicted),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(evicted, 0);
  // The clean one alone can go.
  ASSERT_OK(engine_->Evict({0}, kFwd, &evicted));
  EXPECT_EQ(evicted, 1);
}

TEST_F(ResidencyTest, ReleasedPayloadsLeaveTheResidentSet) {
  Build({});
  PutOnHost(0);
  ASSERT_OK(engine_->Load({0}, kFwd, /*prefetch=*/true));
  ASSERT_OK(engine_->ReleasePayload(0));
  EXPECT_FALSE(engine_->resident(0));
  EXPECT_EQ(engine_->resident_bytes(), 0);
  EXPECT_FALSE(engine_->chunk(0).has_payload());
  PutOnHost(0);
  ASSERT_OK(engine_->Load({0}, kFwd, false));
  engine_->NoteAccessed(0);
  EXPECT_EQ(counters_.prefetch_hits, 0);  // the prefetched copy was released before its access
}

TEST_F(ResidencyTest, ListenerSeesEveryMoveTheCountersCount) {
  RecordingListener listener;
  Build({.listener = &listener});
  for (int64_t i = 0; i < 3; ++i) PutOnHost(i);
  ASSERT_OK(engine_->Load({0, 1}, kFwd, false));
  ASSERT_OK(engine_->Load({2}, kFwd, true));
  ASSERT_OK(engine_->Load({3}, kBwd, false));  // allocation
  ASSERT_OK(engine_->WaitForCopies({0, 1, 2}));
  engine_->chunk(1).MarkPayloadWritten();
  ASSERT_OK_AND_ASSIGN(bool started, engine_->StartWriteBehind(1, kBwd));
  EXPECT_TRUE(started);
  engine_->chunk(2).MarkPayloadWritten();
  ASSERT_OK(engine_->Evict({0, 1, 2}, kBwd));
  const TransferCounters counted = counters_.Total();
  engine_.reset();  // waits for the streams: every copy reported
  TransferCounters seen;
  int kinds[6] = {};
  for (const ChunkMoveEvent& e : listener.moves()) {
    EXPECT_LE(e.start_ns, e.end_ns);
    EXPECT_TRUE(e.moment == kFwd.moment || e.moment == kBwd.moment);
    ++kinds[static_cast<int>(e.kind)];
    switch (e.kind) {
      case ChunkMoveKind::kLoad:
      case ChunkMoveKind::kPrefetch:
        ++seen.loads;
        seen.load_bytes += e.bytes;
        break;
      case ChunkMoveKind::kWriteBack:
      case ChunkMoveKind::kWriteBehind:
        ++seen.write_backs;
        seen.write_back_bytes += e.bytes;
        break;
      case ChunkMoveKind::kCleanEviction:
        ++seen.clean_evictions;
        break;
      case ChunkMoveKind::kAllocation:
        ++seen.allocations;
        break;
    }
  }
  EXPECT_EQ(seen, counted);
  EXPECT_EQ(kinds[static_cast<int>(ChunkMoveKind::kLoad)], 2);
  EXPECT_EQ(kinds[static_cast<int>(ChunkMoveKind::kPrefetch)], 1);
  EXPECT_EQ(kinds[static_cast<int>(ChunkMoveKind::kWriteBehind)], 1);
  EXPECT_EQ(kinds[static_cast<int>(ChunkMoveKind::kWriteBack)], 1);      // chunk 2
  EXPECT_EQ(kinds[static_cast<int>(ChunkMoveKind::kCleanEviction)], 2);  // 0, and 1 after it
  EXPECT_EQ(kinds[static_cast<int>(ChunkMoveKind::kAllocation)], 1);
}

// Stalls and every event (copies timed on the streams' threads included) read the injected
// clock: with a fake that starts at 7 and steps 1000 ns per reading, every time reported is one of
// its readings, and the stall of the write-back's wait is a whole number of steps.
TEST_F(ResidencyTest, StallsAndEventsAreTimedOnTheInjectedClock) {
  constexpr int64_t kStartNs = 7, kStepNs = 1000;
  FakeClock fake(kStartNs, kStepNs);
  RecordingListener listener;
  Build({.clock = fake.clock(), .listener = &listener});
  for (int64_t i = 0; i < 2; ++i) PutOnHost(i);
  ASSERT_OK(engine_->Load({0, 1}, kFwd, false));
  ASSERT_OK(engine_->WaitForCopies({0, 1}));
  engine_->chunk(1).MarkPayloadWritten();
  ASSERT_OK(engine_->Evict({0, 1}, kBwd));  // waits for chunk 1's write-back: a stall
  engine_.reset();                          // waits for the streams: every copy reported
  const int64_t end_ns = fake.time_ns();
  auto is_reading = [&](int64_t t) {
    return t >= kStartNs && t < end_ns && (t - kStartNs) % kStepNs == 0;
  };
  const std::vector<ChunkMoveEvent> moves = listener.moves();
  EXPECT_EQ(moves.size(), 4u);  // 2 loads, a write-back, a clean eviction
  for (const ChunkMoveEvent& e : moves) {
    EXPECT_TRUE(is_reading(e.start_ns)) << e.start_ns;
    EXPECT_TRUE(is_reading(e.end_ns)) << e.end_ns;
  }
  EXPECT_GT(counters_.stall_ns, 0);
  EXPECT_EQ(counters_.stall_ns % kStepNs, 0) << counters_.stall_ns;
}

}  // namespace
}  // namespace ps
