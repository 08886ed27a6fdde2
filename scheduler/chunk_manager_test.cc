#include "scheduler/chunk_manager.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/operator_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/caching_allocator.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "scheduler/replay.h"
#include "scheduler/testing/training_harness.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kChunkElems = 1024;  // 4 KiB chunks (f32)
constexpr int64_t kChunkBytes = kChunkElems * 4;

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A random model and a training program over it: forward in order, keeping a random activation
// per operator; backward in reverse, writing gradients and freeing the activations (with
// `recompute`, each operator's backward is preceded by a forward access, as activation
// checkpointing recomputes); then Adam.
struct RandomTraining {
  HarnessModel model;
  HarnessProgram program;
  // The highest non-model bytes in use at any point of the program.
  int64_t peak_nonmodel_bytes = 0;
  int64_t largest_allocation_bytes = 0;
};

RandomTraining MakeRandomTraining(std::mt19937_64& rng, bool recompute = false) {
  RandomTraining t;
  t.model.chunk_elems = kChunkElems;
  const int num_ops = static_cast<int>(Uniform(rng, 5, 12));
  for (int i = 0; i < num_ops; ++i) {
    t.model.op_numels.push_back(Uniform(rng, kChunkElems / 8, kChunkElems));
  }
  auto bytes = [&](int64_t max_blocks) { return 512 * Uniform(rng, 0, max_blocks); };
  std::vector<int64_t> act(num_ops), fwd_temp(num_ops), bwd_temp(num_ops);
  for (int i = 0; i < num_ops; ++i) {
    act[i] = bytes(2 * kChunkBytes / 512);
    fwd_temp[i] = bytes(kChunkBytes / 512);
    bwd_temp[i] = bytes(kChunkBytes / 512);
  }
  int64_t kept = 0;
  for (int i = 0; i < num_ops; ++i) {
    kept += act[i];
    t.peak_nonmodel_bytes = std::max(t.peak_nonmodel_bytes, kept + fwd_temp[i]);
    t.program.steps.push_back(
        {.op = i, .stage = Stage::kForward, .keep_bytes = act[i], .temp_bytes = fwd_temp[i]});
  }
  for (int i = num_ops - 1; i >= 0; --i) {
    if (recompute) {
      t.peak_nonmodel_bytes = std::max(t.peak_nonmodel_bytes, kept + fwd_temp[i]);
      t.program.steps.push_back({.op = i, .stage = Stage::kForward, .temp_bytes = fwd_temp[i]});
    }
    t.peak_nonmodel_bytes = std::max(t.peak_nonmodel_bytes, kept + bwd_temp[i]);
    kept -= act[i];
    t.program.steps.push_back({.op = i,
                               .stage = Stage::kBackward,
                               .temp_bytes = bwd_temp[i],
                               .free_kept_of = i,
                               .write = true});
  }
  for (int i = 0; i < num_ops; ++i) {
    t.largest_allocation_bytes =
        std::max({t.largest_allocation_bytes, act[i], fwd_temp[i], bwd_temp[i]});
  }
  t.program.adam = true;
  return t;
}

// A cap that leaves room for `room_chunks` chunks beside the peak tide and the slack. The warm-up
// share is conservative, as it is meant to be: half that room (at least one chunk).
HarnessConfig TightConfig(const RandomTraining& t, int64_t room_chunks) {
  HarnessConfig c;
  c.options.nonmodel_slack_bytes = 2 * t.largest_allocation_bytes;
  // The caching allocator may hand out up to 512 bytes more than asked per live allocation (an
  // unsplit tail), which the tracker counts: at most every operator's activation plus one
  // workspace are live at once.
  const int64_t tails_bytes = 512 * static_cast<int64_t>(t.model.op_numels.size() + 1);
  c.cap_bytes = t.peak_nonmodel_bytes + tails_bytes + c.options.nonmodel_slack_bytes +
                room_chunks * kChunkBytes;
  const int64_t warmup_chunks = std::max<int64_t>(1, room_chunks / 2);
  c.options.warmup_chunk_fraction =
      (static_cast<double>(warmup_chunks * kChunkBytes) + 0.5) / static_cast<double>(c.cap_bytes);
  return c;
}

// Room for every chunk the model has, so hybrid Adam can keep optimizer state on the device.
int64_t RoomyChunks(const RandomTraining& t) {
  return 4 * static_cast<int64_t>(t.model.op_numels.size()) + 2;
}

// Master/momentum/variance chunks resident on the accelerator.
int64_t PlacedStateChunks(TrainingHarness& h) {
  int64_t n = 0;
  for (int64_t key : h.manager().ResidentChunkKeys()) {
    n += h.manager().ChunkIdOfKey(key).type != ChunkType::kParam ? 1 : 0;
  }
  return n;
}

// --- The main randomized test --------------------------------------------------------------------

// Random models, random activation tides, tight caps: for every step of five iterations the
// device never holds more than its cap (the emulated accelerator enforces the cap, so any
// over-commit would fail an allocation, and every failure fails the test), the resident chunks
// stay under the chunkable memory, and every access finds exactly the bytes last written, however
// often the chunks moved.
TEST(ChunkManager, RandomTrainingNeverExceedsTheCapAndKeepsEveryByte) {
  std::mt19937_64 rng(20240611);
  ChunkManagerCounters all;
  int64_t placed_state_chunks = 0;
  for (int trial = 0; trial < 100; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng, /*recompute=*/trial % 3 == 1);
    // Mostly tight; one trial in five roomy enough for hybrid Adam to keep state on the device.
    const int64_t room = trial % 5 == 4 ? RoomyChunks(t) : Uniform(rng, 1, 6);
    HarnessConfig config = TightConfig(t, room);
    config.options.policy = trial % 3 == 2 ? "lru" : "opt";
    config.options.prefetch = trial % 2 == 0;
    t.program.adam_on_accelerator = trial % 4 != 3;
    ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
    ASSERT_OK(h->Initialize());
    for (int it = 0; it < 5; ++it) {
      ASSERT_OK(h->RunIteration(t.program)) << "room " << room << " chunks";
    }
    all += h->manager().counters();
    placed_state_chunks += PlacedStateChunks(*h);
    EXPECT_LE(h->backend().counters().peak_device_allocated_bytes, config.cap_bytes);
    EXPECT_GT(h->verified_tensors(), 0);
  }
  std::cout << all.DebugString()
            << "; optimizer-state chunks kept on the device at the end: " << placed_state_chunks
            << "\n";
  // The sequences really exercised every path.
  EXPECT_GT(all.stage(Stage::kForward).clean_evictions, 50);
  EXPECT_GT(all.stage(Stage::kBackward).write_backs, 20);
  EXPECT_GT(all.stage(Stage::kAdam).write_backs, 50);
  EXPECT_GT(all.stage(Stage::kAdam).loads, 5);
  EXPECT_GT(all.prefetches, 50);
  EXPECT_GT(placed_state_chunks, 5);
}

// Frozen operators (a LoRA base): random models whose operators are frozen at random, run for
// several iterations under tight caps, with and without clean eviction, prefetching and
// recompute. The harness checks every tensor's bytes at every access, so a frozen parameter
// reads version 1 (its initial bytes) in every pass of every iteration: bit-identical. No frozen
// chunk is ever written back or written behind, trainable chunks still are, a frozen operator's
// tensors are HOLD after its backward (the next forward accesses them with no optimizer step),
// and the optimizer never touches a frozen chunk.
TEST(ChunkManager, FrozenChunksAreReadOnlyAndNeverWrittenBack) {
  std::mt19937_64 rng(2028);
  ChunkManagerCounters all;
  int64_t frozen_checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng, /*recompute=*/trial % 3 == 1);
    const int num_ops = static_cast<int>(t.model.op_numels.size());
    for (int i = 0; i < num_ops; ++i) {
      // Mostly a frozen prefix (a base model, then its adapters), sometimes a random mix.
      const bool frozen = trial % 2 == 0 ? i < num_ops * 2 / 3 : Uniform(rng, 0, 1) == 1;
      if (frozen) t.model.frozen_ops.push_back(i);
    }
    for (HarnessStep& step : t.program.steps) {
      if (std::find(t.model.frozen_ops.begin(), t.model.frozen_ops.end(), step.op) !=
          t.model.frozen_ops.end()) {
        step.write = false;  // backward computes only the input gradient
      }
    }
    HarnessConfig config = TightConfig(t, Uniform(rng, 1, 4));
    config.options.clean_eviction = trial % 4 != 3;
    config.options.prefetch = trial % 2 == 0;
    ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
    const ChunkLayout& layout = h->store().layout();
    ASSERT_OK(layout.Validate());
    for (OperatorId op : t.model.frozen_ops) {
      const int64_t c = layout.op(op).chunk_index;
      ASSERT_FALSE(layout.chunk_trainable(c));
      EXPECT_FALSE(layout.HoldsPayload(ChunkType::kMaster, c, 0));
    }
    ASSERT_OK(h->Initialize());
    std::vector<std::vector<uint8_t>> initial;
    for (OperatorId op : t.model.frozen_ops) {
      initial.push_back(h->ExpectedBytes(ChunkType::kParam, layout.op(op).tensors[0]));
    }
    for (int it = 0; it < 4; ++it) {
      ASSERT_OK(h->RunIteration(t.program));
      for (OperatorId op : t.model.frozen_ops) {
        ASSERT_OK_AND_ASSIGN(TensorState state,
                             h->store().tensor_state(ChunkType::kParam, layout.op(op).tensors[0]));
        EXPECT_EQ(state, TensorState::kHold) << layout.op(op).name << " after iteration " << it;
      }
    }
    for (size_t k = 0; k < t.model.frozen_ops.size(); ++k) {
      // What the harness verified at every access: still the initial bytes.
      EXPECT_EQ(h->ExpectedBytes(ChunkType::kParam, layout.op(t.model.frozen_ops[k]).tensors[0]),
                initial[k]);
      ++frozen_checked;
    }
    const ChunkManagerCounters c = h->manager().counters();
    EXPECT_EQ(c.frozen_writeback_bytes, 0) << c.DebugString();
    EXPECT_LE(h->backend().counters().peak_device_allocated_bytes, config.cap_bytes);
    all += c;
  }
  std::cout << all.DebugString() << "\n";
  EXPECT_GT(frozen_checked, 40);
  EXPECT_EQ(all.frozen_writeback_bytes, 0);
  // Trainable chunks are still written back, frozen ones dropped clean.
  EXPECT_GT(all.stage(Stage::kBackward).write_backs, 10);
  EXPECT_GT(
      all.stage(Stage::kForward).clean_evictions + all.stage(Stage::kBackward).clean_evictions, 50);
}

// A frozen chunk made dirty by an optimizer-style write on the accelerator is written back when
// evicted (its bytes must not be lost), and frozen_writeback_bytes counts it.
TEST(ChunkManager, FrozenWritebackIsCountedIfItEverHappens) {
  RandomTraining t;
  t.model.chunk_elems = kChunkElems;
  t.model.op_numels = {kChunkElems, kChunkElems, kChunkElems};
  t.model.frozen_ops = {0};
  HarnessConfig config;
  config.cap_bytes = 64 * kChunkBytes;
  config.options.device_budget_bytes = kChunkBytes;
  config.options.warmup_chunk_fraction = 1.0;
  config.options.nonmodel_slack_bytes = 0;
  config.options.comm_buffer_bytes = 0;
  ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
  ASSERT_OK(h->Initialize());
  ChunkManager& m = h->manager();
  const Device accel = m.accelerator_device();
  ASSERT_OK(m.AccessChunks(0, {ChunkType::kParam}, accel, AccessMode::kReadWrite));
  ASSERT_OK(m.ReleaseChunks(0, {ChunkType::kParam}));
  // Optimizer state of a frozen chunk does not exist.
  EXPECT_THAT(m.AccessChunks(0, {ChunkType::kMaster}, Device::Host(), AccessMode::kRead),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Room for one chunk: a trainable operator's access pushes chunk 0 out, a write-back, counted.
  ASSERT_OK(m.Access(1, Stage::kForward));
  ASSERT_OK(m.Release(1, Stage::kForward));
  EXPECT_EQ(m.counters().frozen_writeback_bytes, kChunkBytes) << m.counters().DebugString();
}

// The warm-up learns; the second iteration moves no more bytes than the warm-up (apart from the
// one-time load of the optimizer state hybrid Adam keeps on the device), and from the third on
// every iteration moves exactly the same bytes in every stage.
TEST(ChunkManager, WarmupThenSteadyState) {
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 16; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng, /*recompute=*/trial % 5 == 2);
    HarnessConfig config = TightConfig(t, trial % 4 == 3 ? RoomyChunks(t) : Uniform(rng, 1, 5));
    t.program.adam_on_accelerator = trial % 2 == 1;
    config.options.prefetch = trial % 3 != 0;
    ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
    ASSERT_OK(h->Initialize());
    constexpr int kIterations = 6;
    for (int it = 0; it < kIterations; ++it) ASSERT_OK(h->RunIteration(t.program));
    const std::vector<ChunkManagerCounters>& per = h->manager().iteration_counters();
    ASSERT_EQ(per.size(), kIterations);
    EXPECT_LE(per[1].Total().moved_bytes() - per[1].stage(Stage::kAdam).load_bytes,
              per[0].Total().moved_bytes())
        << "warm-up: " << per[0].DebugString() << "\nsecond: " << per[1].DebugString();
    if (!t.program.adam_on_accelerator) {
      EXPECT_EQ(per[1].stage(Stage::kAdam).load_bytes, 0);
    }
    for (int it = 3; it < kIterations; ++it) {
      for (Stage s : {Stage::kForward, Stage::kBackward, Stage::kAdam}) {
        EXPECT_EQ(per[it].stage(s), per[2].stage(s))
            << "iteration " << it << " " << StageName(s) << ": " << per[it].DebugString()
            << "\nthird: " << per[2].DebugString();
      }
    }
  }
}

// Hybrid Adam: with room for every param chunk and some optimizer state, the placement keeps that
// state on the device for good — from the third iteration on the optimizer step loads nothing —
// and the steady state moves fewer bytes than updating everything on the host.
TEST(ChunkManager, HybridAdamKeepsPlacedStateOnTheDevice) {
  std::mt19937_64 rng(5150);
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng);
    const int64_t params = static_cast<int64_t>(t.model.op_numels.size());  // >= param chunks
    const int64_t extra = Uniform(rng, 3, 9);  // room for 1-3 state triples beyond the params
    int64_t steady[2] = {0, 0};
    for (bool hybrid : {false, true}) {
      HarnessConfig config = TightConfig(t, params + extra);
      t.program.adam_on_accelerator = hybrid;
      ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
      ASSERT_OK(h->Initialize());
      for (int it = 0; it < 4; ++it) ASSERT_OK(h->RunIteration(t.program));
      const std::vector<ChunkManagerCounters>& per = h->manager().iteration_counters();
      steady[hybrid] = per[3].Total().moved_bytes();
      if (!hybrid) continue;
      const int64_t placed = PlacedStateChunks(*h);
      EXPECT_GT(placed, 0);
      EXPECT_EQ(placed % 3, 0);
      EXPECT_EQ(per[1].stage(Stage::kAdam).loads, placed);  // loaded once, after the warm-up
      for (int it = 2; it < 4; ++it) {
        EXPECT_EQ(per[it].stage(Stage::kAdam).loads, 0) << per[it].DebugString();
        EXPECT_EQ(per[it].stage(Stage::kForward).write_backs, 0) << per[it].DebugString();
      }
    }
    EXPECT_LT(steady[true], steady[false]);
  }
}

// Prefetching only changes when bytes move: loads, write-backs and clean evictions of every stage
// of every iteration are the same with and without it.
TEST(ChunkManager, PrefetchChangesTimingNotTraffic) {
  std::mt19937_64 rng(4242);
  int64_t prefetches = 0;
  int64_t hits = 0;
  for (int trial = 0; trial < 8; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng, /*recompute=*/trial % 2 == 1);
    const int64_t room = Uniform(rng, 1, 5);
    std::vector<ChunkManagerCounters> runs[2];
    for (bool prefetch : {false, true}) {
      HarnessConfig config = TightConfig(t, room);
      config.options.prefetch = prefetch;
      ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
      ASSERT_OK(h->Initialize());
      for (int it = 0; it < 4; ++it) ASSERT_OK(h->RunIteration(t.program));
      runs[prefetch] = h->manager().iteration_counters();
      if (prefetch) {
        prefetches += h->manager().counters().prefetches;
        hits += h->manager().counters().prefetch_hits;
      }
    }
    for (int it = 0; it < 4; ++it) {
      EXPECT_EQ(runs[0][it].by_stage, runs[1][it].by_stage)
          << "iteration " << it << "\nwithout: " << runs[0][it].DebugString()
          << "\nwith:    " << runs[1][it].DebugString();
    }
  }
  std::cout << prefetches << " prefetches, " << hits << " hits\n";
  EXPECT_GT(prefetches, 10);
  EXPECT_EQ(hits, prefetches) << "every prefetched chunk is the next access's";
}

// Records what a listener is told (from the calling thread and the copy streams).
class RecordingListener final : public ChunkEventListener {
 public:
  void OnChunkMove(const ChunkMoveEvent& e) override {
    MutexLock lock(&mu_);
    moves_.push_back(e);
  }
  void OnAccess(const ChunkAccessEvent& e) override {
    MutexLock lock(&mu_);
    ++accesses_;
    if (e.ready_ns < e.request_ns) ++bad_times_;
    if (e.resident_bytes != e.accelerator_model_bytes) ++bad_bytes_;
    open_.push_back(std::string(e.name));
  }
  void OnRelease(absl::string_view name, int64_t, Stage, int64_t) override {
    MutexLock lock(&mu_);
    ++releases_;
    if (open_.empty() || open_.back() != name) ++unmatched_;
    if (!open_.empty()) open_.pop_back();
  }
  std::vector<ChunkMoveEvent> moves() {
    MutexLock lock(&mu_);
    return moves_;
  }
  int64_t accesses_ = 0, releases_ = 0, bad_times_ = 0, bad_bytes_ = 0, unmatched_ = 0;

 private:
  Mutex mu_;
  std::vector<ChunkMoveEvent> moves_;
  std::vector<std::string> open_;
};

// A listener sees every move the counters count, timed on the copy streams, and every access with
// its release; and listening changes nothing the manager does.
TEST(ChunkManager, ListenerSeesEveryMoveAndChangesNothing) {
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng, /*recompute=*/trial % 2 == 1);
    const int64_t room = Uniform(rng, 1, 4);
    std::vector<ChunkManagerCounters> runs[2];
    RecordingListener listener;
    for (bool listen : {false, true}) {
      HarnessConfig config = TightConfig(t, room);
      if (listen) config.options.listener = &listener;
      ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
      ASSERT_OK(h->Initialize());
      for (int it = 0; it < 3; ++it) ASSERT_OK(h->RunIteration(t.program));
      runs[listen] = h->manager().iteration_counters();
      if (!listen) continue;
      // Copies are reported when the stream ran them; write-behinds may still be in flight after
      // EndIteration, and the manager's destructor waits for them.
      const TransferCounters counted = h->manager().counters().Total();
      h.reset();
      TransferCounters seen;
      for (const ChunkMoveEvent& e : listener.moves()) {
        EXPECT_LE(e.start_ns, e.end_ns);
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
      EXPECT_GT(seen.loads, 0);
      EXPECT_GT(listener.accesses_, 0);
      EXPECT_EQ(listener.accesses_, listener.releases_);
      EXPECT_EQ(listener.unmatched_, 0);
      EXPECT_EQ(listener.bad_times_, 0);
      EXPECT_EQ(listener.bad_bytes_, 0);
    }
    for (int it = 0; it < 3; ++it) {
      EXPECT_EQ(runs[0][it].by_stage, runs[1][it].by_stage) << "iteration " << it;
    }
  }
}

// Clean eviction: parameters are only read in forward, so a forward pass evicts without a single
// write-back (recomputation in the backward pass counts as backward); with clean eviction off
// every eviction is a copy back.
TEST(ChunkManager, CleanEvictionCutsForwardWriteBacksToZero) {
  std::mt19937_64 rng(99);
  int64_t forward_evictions = 0;
  for (int trial = 0; trial < 8; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    RandomTraining t = MakeRandomTraining(rng, /*recompute=*/trial % 2 == 1);
    t.program.adam_on_accelerator = false;  // CPU Adam: params come back to the host updated
    const int64_t room = Uniform(rng, 1, 3);
    TransferCounters forward[2];
    for (bool clean : {false, true}) {
      HarnessConfig config = TightConfig(t, room);
      config.options.clean_eviction = clean;
      ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(t.model, config));
      ASSERT_OK(h->Initialize());
      for (int it = 0; it < 3; ++it) ASSERT_OK(h->RunIteration(t.program));
      forward[clean] = h->manager().iteration_counters()[2].stage(Stage::kForward);
    }
    EXPECT_EQ(forward[true].write_backs, 0);
    EXPECT_EQ(forward[true].write_back_bytes, 0);
    EXPECT_EQ(forward[false].write_backs, forward[true].clean_evictions);
    EXPECT_EQ(forward[false].loads, forward[true].loads);
    forward_evictions += forward[true].clean_evictions;
  }
  EXPECT_GT(forward_evictions, 5);
}

// --- OPT is optimal
// --------------------------------------------------------------------------------

// Random access sequences of whole-chunk operators under a random tide: after the warm-up, the
// bytes the manager loads over three iterations equal the minimum an exhaustive search finds for
// the same capacities from the same starting residency — with and without prefetch.
TEST(ChunkManager, OptLoadsTheExhaustiveMinimum) {
  std::mt19937_64 rng(31337);
  int lru_worse = 0;
  for (int trial = 0; trial < 100; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const int num_ops = static_cast<int>(Uniform(rng, 3, 8));
    HarnessModel model{.chunk_elems = kChunkElems,
                       .op_numels = std::vector<int64_t>(num_ops, kChunkElems)};
    HarnessProgram program;
    const int length = static_cast<int>(Uniform(rng, 4, 12));
    int64_t max_temp = 0;
    for (int s = 0; s < length; ++s) {
      const int64_t temp = 512 * Uniform(rng, 0, 3 * kChunkBytes / 512);
      max_temp = std::max(max_temp, temp);
      program.steps.push_back({.op = Uniform(rng, 0, num_ops - 1), .temp_bytes = temp});
    }
    HarnessConfig config;
    config.options.nonmodel_slack_bytes = 2 * max_temp;
    config.cap_bytes =
        max_temp + config.options.nonmodel_slack_bytes + Uniform(rng, 1, 4) * kChunkBytes;
    config.options.warmup_chunk_fraction = 0.01;
    constexpr int kIterations = 3;
    for (const char* policy : {"opt", "opt+prefetch", "lru"}) {
      SCOPED_TRACE(policy);
      config.options.policy = std::string(policy) == "lru" ? "lru" : "opt";
      config.options.prefetch = std::string(policy) == "opt+prefetch";
      ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(model, config));
      ASSERT_OK(h->Initialize());
      ASSERT_OK(h->RunIteration(program));  // warm-up
      const std::vector<int64_t> initial = h->manager().ResidentChunkKeys();
      // The same steps as the exhaustive search sees them: one chunk each, the capacity the
      // manager plans with at that moment.
      std::vector<ReplayStep> steps;
      for (int64_t m = 0; m < h->manager().tide().total_moments(); ++m) {
        const int64_t chunk = h->store().layout().op(program.steps[m].op).chunk_index;
        steps.push_back({{chunk}, h->manager().ChunkableBytes(m) / kChunkBytes});
        ASSERT_GE(steps.back().capacity_chunks, 1);
      }
      for (int it = 0; it < kIterations; ++it) ASSERT_OK(h->RunIteration(program));
      int64_t loads = 0;
      int64_t load_bytes = 0;
      for (int it = 1; it <= kIterations; ++it) {
        loads += h->manager().iteration_counters()[it].Total().loads;
        load_bytes += h->manager().iteration_counters()[it].Total().load_bytes;
      }
      ASSERT_OK_AND_ASSIGN(int64_t minimum, MinimumLoads(steps, kIterations, initial));
      EXPECT_EQ(load_bytes, loads * kChunkBytes);
      if (config.options.policy == "opt") {
        EXPECT_EQ(loads, minimum);
      } else {
        EXPECT_GE(loads, minimum);
        lru_worse += loads > minimum ? 1 : 0;
      }
    }
  }
  EXPECT_GT(lru_worse, 0) << "no trace separates LRU from OPT: the test has no power";
}

// PatrickStar's two-chunk case (unitest/test_eviction_policy.py) through the manager: operator 0
// (chunk 0) at moment 0, operator 1 (chunk 1) at moment 1, and room for one chunk. In the steady
// state, the access at moment 0 evicts chunk 1 and the one at moment 1 evicts chunk 0, so when
// both are candidates OPT picks chunk 0 at moment 0 and chunk 1 at moment 1 (checked on the policy
// the manager holds).
TEST(ChunkManager, PatrickStarTwoChunkCase) {
  HarnessModel model{.chunk_elems = kChunkElems, .op_numels = {kChunkElems, kChunkElems}};
  HarnessProgram program;
  program.steps = {{.op = 0}, {.op = 1}};
  HarnessConfig config;
  config.cap_bytes = kChunkBytes;
  config.options.warmup_chunk_fraction = 1.0;
  ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(model, config));
  ASSERT_OK(h->Initialize());
  for (int it = 0; it < 3; ++it) ASSERT_OK(h->RunIteration(program));
  const ChunkManagerCounters steady = h->manager().iteration_counters()[2];
  EXPECT_EQ(steady.stage(Stage::kForward).loads, 2);
  EXPECT_EQ(steady.stage(Stage::kForward).clean_evictions, 2);
  EXPECT_EQ(steady.stage(Stage::kForward).write_backs, 0);
  auto& policy = const_cast<EvictionPolicy&>(h->manager().policy());
  const std::vector<EvictionCandidate> both = {{0, kChunkBytes}, {1, kChunkBytes}};
  EXPECT_THAT(policy.ChooseVictims(both, kChunkBytes, 0), ::testing::ElementsAre(0));
  EXPECT_THAT(policy.ChooseVictims(both, kChunkBytes, 1), ::testing::ElementsAre(1));
}

// --- Errors and API misuse
// -------------------------------------------------------------------------

class ChunkManagerApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HarnessConfig config;
    config.cap_bytes = 4 * kChunkBytes;
    config.options.warmup_chunk_fraction = 0.5;
    ASSERT_OK_AND_ASSIGN(
        h_, TrainingHarness::Create({.chunk_elems = kChunkElems,
                                     .op_numels = {kChunkElems / 2, kChunkElems / 2, kChunkElems}},
                                    config));
    ASSERT_OK(h_->Initialize());
  }

  std::unique_ptr<TrainingHarness> h_;
};

TEST_F(ChunkManagerApiTest, OperatorThatCannotFitIsResourceExhaustedWithAdvice) {
  ChunkManager& m = h_->manager();
  // Activations take all but half a chunk: the operator's 4 KiB chunk cannot fit.
  ASSERT_OK_AND_ASSIGN(void* act, h_->accelerator().scratch()->Allocate(3 * kChunkBytes + 2048));
  EXPECT_THAT(
      m.Access(2, Stage::kForward),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("operator 'op2' (FWD)"), HasSubstr("needs 4.00 KiB"),
                     HasSubstr("16.00 KiB device budget"), HasSubstr("smaller chunk size"),
                     HasSubstr("activation checkpointing"), HasSubstr("more device memory"))));
  EXPECT_EQ(m.resident_bytes(), 0);
  ASSERT_OK(h_->accelerator().scratch()->Deallocate(act, 3 * kChunkBytes + 2048));
  ASSERT_OK(m.Access(2, Stage::kForward));  // fits once the activations are gone
  ASSERT_OK(m.Release(2, Stage::kForward));
}

// A failed access is no moment: the metronome does not advance, the warm-up learns only the
// moments that happened, and a later iteration whose access failed once and then succeeded stays
// on the learned trace.
TEST_F(ChunkManagerApiTest, FailedAccessIsNoMoment) {
  ChunkManager& m = h_->manager();
  CachingAllocator& scratch = *h_->accelerator().scratch();
  const int64_t act_bytes = 3 * kChunkBytes + 2048;  // leaves less than the 4 KiB chunk of op2
  for (int iteration = 0; iteration < 3; ++iteration) {
    SCOPED_TRACE(absl::StrCat("iteration ", iteration));
    ASSERT_OK(m.BeginIteration());
    ASSERT_OK_AND_ASSIGN(void* act, scratch.Allocate(act_bytes));
    EXPECT_THAT(m.Access(2, Stage::kForward), StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(
        m.AccessChunks(1, {ChunkType::kMaster}, m.accelerator_device(), AccessMode::kReadWrite),
        StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_EQ(m.metronome().moment(), -1);
    ASSERT_OK(scratch.Deallocate(act, act_bytes));
    ASSERT_OK(m.Access(2, Stage::kForward));
    EXPECT_EQ(m.metronome().moment(), 0);
    ASSERT_OK(m.Release(2, Stage::kForward));
    ASSERT_OK(m.Access(0, Stage::kForward));
    EXPECT_EQ(m.metronome().moment(), 1);
    EXPECT_EQ(m.metronome().in_trace(), iteration > 0);
    ASSERT_OK(m.Release(0, Stage::kForward));
    ASSERT_OK(m.EndIteration());
    EXPECT_EQ(m.tide().total_moments(), 2);
  }
  EXPECT_EQ(m.metronome().iteration(), 3);
  EXPECT_EQ(m.tide().ChunksAt(0), std::vector<int64_t>{m.ChunkKey({ChunkType::kParam, 1})});
}

// An allocation that does not fit beside the resident chunks makes the manager evict them (the
// reclaimer), unless that is switched off; chunks in use stay.
TEST_F(ChunkManagerApiTest, MemoryPressureEvictsChunksThatMayMove) {
  ChunkManager& m = h_->manager();
  ASSERT_OK(m.Access(0, Stage::kForward));  // chunk 0
  ASSERT_OK(m.Access(2, Stage::kForward));  // chunk 1
  ASSERT_OK(m.Release(0, Stage::kForward));
  EXPECT_EQ(m.resident_bytes(), 2 * kChunkBytes);
  // Room for 2.5 chunks of activations only if chunk 0 leaves; chunk 1 is in COMPUTE.
  const int64_t bytes = 2 * kChunkBytes + 2048;
  ASSERT_OK_AND_ASSIGN(void* act, h_->accelerator().scratch()->Allocate(bytes));
  EXPECT_EQ(m.resident_bytes(), kChunkBytes);
  EXPECT_EQ(m.counters().pressure_reclaims, 1);
  EXPECT_EQ(m.counters().pressure_evictions, 1);
  ASSERT_OK(m.Release(2, Stage::kForward));
  ASSERT_OK(h_->accelerator().scratch()->Deallocate(act, bytes));
  // Nothing more may move: the next allocation that does not fit fails as before.
  ASSERT_OK(m.Access(2, Stage::kForward));
  EXPECT_THAT(h_->accelerator().scratch()->Allocate(4 * kChunkBytes),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("chunk_manager")));
  ASSERT_OK(m.Release(2, Stage::kForward));
  ASSERT_OK(m.Access(0, Stage::kForward));  // loads chunk 0 again: its bytes are intact
  ASSERT_OK(m.Release(0, Stage::kForward));
}

// Backward's kernels run on the compute stream after the host has moved on (a GPU, or the emulated
// accelerator's asynchronous kernels). The optimizer step must not read a gradient before the
// kernel that writes it has run: BeginAdam waits for the compute stream up to the last Release.
// Here the compute stream is stalled, so the queued "backward kernel" runs only once the host
// waits for the backend; an optimizer step that read the chunk without that wait would see the old
// bytes every time, not once in a thousand runs (issue 13's BeginAdam race).
TEST_F(ChunkManagerApiTest, OptimizerStepWaitsForGradientsBackwardStillHasQueued) {
  ChunkManager& m = h_->manager();
  ASSERT_OK(m.BeginIteration());
  ASSERT_OK(m.Access(2, Stage::kBackward));  // op2: the whole of chunk 1
  ASSERT_OK_AND_ASSIGN(const TensorView view, h_->store().View(ChunkType::kParam, 2));
  ASSERT_EQ(view.device, m.accelerator_device());
  float* grad = static_cast<float*>(view.data);
  const int64_t n = view.numel;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuStreamStall> stall, StallCpuStream(h_->compute_stream()));
  ASSERT_OK(h_->compute_stream().LaunchHostFunc([grad, n] {
    for (int64_t i = 0; i < n; ++i) grad[i] = 0.5f + static_cast<float>(i);
  }));
  ASSERT_OK(m.Release(2, Stage::kBackward));
  ASSERT_TRUE(stall->active());  // the host ran ahead: the gradient is not written yet

  ASSERT_OK(m.BeginAdam().status());
  // The optimizer takes the chunk where it is (the accelerator: no move, so no copy waits).
  ASSERT_OK(m.AccessChunks(1, {ChunkType::kParam}, m.accelerator_device(), AccessMode::kRead));
  ASSERT_OK_AND_ASSIGN(const TensorView now, h_->store().View(ChunkType::kParam, 2));
  ASSERT_EQ(now.data, view.data);
  const float* read = static_cast<const float*>(now.data);
  int64_t stale = 0;
  for (int64_t i = 0; i < n; ++i) stale += read[i] != 0.5f + static_cast<float>(i) ? 1 : 0;
  EXPECT_EQ(stale, 0) << "the optimizer read " << stale << " of " << n
                      << " gradients before backward's queued kernel wrote them";
  EXPECT_FALSE(stall->active());
  stall->Release();
  ASSERT_OK(m.ReleaseChunks(1, {ChunkType::kParam}));
  ASSERT_OK(m.EndIteration());
}

TEST(ChunkManagerPressure, SwitchedOffTheAllocationFails) {
  HarnessConfig config;
  config.cap_bytes = 4 * kChunkBytes;
  config.options.warmup_chunk_fraction = 0.5;
  config.options.evict_under_pressure = false;
  ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(
                                   {.chunk_elems = kChunkElems,
                                    .op_numels = {kChunkElems / 2, kChunkElems / 2, kChunkElems}},
                                   config));
  ASSERT_OK(h->Initialize());
  ChunkManager& m = h->manager();
  ASSERT_OK(m.Access(0, Stage::kForward));
  ASSERT_OK(m.Access(2, Stage::kForward));
  ASSERT_OK(m.Release(0, Stage::kForward));
  EXPECT_THAT(h->accelerator().scratch()->Allocate(2 * kChunkBytes + 2048),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(m.counters().pressure_reclaims, 0);
  ASSERT_OK(m.Release(2, Stage::kForward));
}

TEST_F(ChunkManagerApiTest, MisuseIsRejected) {
  ChunkManager& m = h_->manager();
  EXPECT_THAT(m.Access(99, Stage::kForward),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown operator id 99"));
  EXPECT_THAT(m.Access(-1, Stage::kForward), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(m.Access(0, Stage::kAdam), StatusIs(absl::StatusCode::kInvalidArgument, "BeginAdam"));
  EXPECT_THAT(m.Release(0, Stage::kForward),
              StatusIs(absl::StatusCode::kFailedPrecondition, "without a matching Access"));
  EXPECT_THAT(m.EndIteration(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(m.BeginIteration());
  EXPECT_THAT(m.BeginIteration(), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A warm-up without a moment ends without learning: the next iteration is the warm-up again.
  ASSERT_OK(m.EndIteration());
  EXPECT_TRUE(m.is_warmup());
  EXPECT_FALSE(m.in_iteration());
  EXPECT_EQ(m.metronome().iteration(), 0);
  EXPECT_TRUE(m.iteration_counters().empty());
  ASSERT_OK(m.BeginIteration());
  ASSERT_OK(m.Access(0, Stage::kForward));
  EXPECT_THAT(m.Access(0, Stage::kForward),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already accessed"));
  EXPECT_THAT(m.Release(0, Stage::kBackward),
              StatusIs(absl::StatusCode::kFailedPrecondition, "accessed in FWD"));
  EXPECT_THAT(m.EndIteration(), StatusIs(absl::StatusCode::kFailedPrecondition, "op0"));
  EXPECT_THAT(m.BeginAdam(), StatusIs(absl::StatusCode::kFailedPrecondition, "op0"));
  // Operator 1 shares chunk 0 with operator 0: the optimizer cannot take it while it computes.
  EXPECT_THAT(m.AccessChunks(0, {ChunkType::kParam}, Device::Host(), AccessMode::kRead),
              StatusIs(absl::StatusCode::kFailedPrecondition, "COMPUTE"));
  ASSERT_OK(m.Access(1, Stage::kForward));  // a second operator of the same chunk
  ASSERT_OK(m.Release(0, Stage::kForward));
  ASSERT_OK(m.Release(1, Stage::kForward));
  EXPECT_THAT(m.AccessChunks(7, {ChunkType::kParam}, Device::Host(), AccessMode::kRead),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside"));
  EXPECT_THAT(m.AccessChunks(0, {}, Device::Host(), AccessMode::kRead),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(m.AccessChunks(0, {ChunkType::kMaster, ChunkType::kMaster}, Device::Host(),
                             AccessMode::kRead),
              StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
  EXPECT_THAT(m.AccessChunks(0, {ChunkType::kMaster}, Device::Accelerator(3), AccessMode::kRead),
              StatusIs(absl::StatusCode::kInvalidArgument, "accelerator:3"));
  EXPECT_THAT(m.ReleaseChunks(0, {ChunkType::kMaster}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "without a matching AccessChunks"));
  ASSERT_OK(m.AccessChunks(0, {ChunkType::kMaster}, Device::Host(), AccessMode::kRead));
  EXPECT_THAT(m.AccessChunks(0, {ChunkType::kMaster}, Device::Host(), AccessMode::kRead),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already in COMPUTE"));
  EXPECT_THAT(m.EndIteration(), StatusIs(absl::StatusCode::kFailedPrecondition, "master#0"));
  ASSERT_OK(m.ReleaseChunks(0, {ChunkType::kMaster}));
  ASSERT_OK(m.EndIteration());
  EXPECT_FALSE(m.is_warmup());
}

TEST_F(ChunkManagerApiTest, UntrackedAccessesLeaveTheScheduleAlone) {
  ChunkManager& m = h_->manager();
  ASSERT_OK(m.Access(2, Stage::kForward));  // outside any iteration
  ASSERT_OK(m.Release(2, Stage::kForward));
  EXPECT_EQ(m.metronome().moment(), -1);
  EXPECT_TRUE(m.is_warmup());
  EXPECT_EQ(m.resident_bytes(), kChunkBytes);
  EXPECT_EQ(m.counters().stage(Stage::kForward).loads, 1);
}

// Collectives that count calls and move nothing.
class CountingCollectives final : public CollectiveHooks {
 public:
  explicit CountingCollectives(int world) : world_(world) {}
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  absl::Status AllGatherGroup(int64_t, absl::Span<void* const>, int64_t, DType) override {
    ++calls;
    return absl::OkStatus();
  }
  absl::Status ReduceScatterGroup(int64_t, absl::Span<void* const>, int64_t, DType) override {
    ++calls;
    return absl::OkStatus();
  }
  int calls = 0;

 private:
  const int world_;
};

// With world size 1 there is nothing to gather or reduce: collectives of a world of one are
// accepted and never called.
TEST(ChunkManagerWorldOfOne, NeverCallsCollectives) {
  CountingCollectives collectives(1);
  HarnessConfig config;
  config.cap_bytes = 64 * kChunkBytes;
  config.options.collectives = &collectives;
  HarnessModel model;
  model.chunk_elems = kChunkElems;
  model.op_numels = {kChunkElems, kChunkElems / 2, kChunkElems};
  ASSERT_OK_AND_ASSIGN(auto h, TrainingHarness::Create(model, config));
  ASSERT_OK(h->Initialize());
  HarnessProgram program;
  for (OperatorId op = 0; op < 3; ++op) program.steps.push_back({.op = op});
  for (OperatorId op = 2; op >= 0; --op) {
    program.steps.push_back({.op = op, .stage = Stage::kBackward, .write = true});
  }
  program.adam = true;
  ASSERT_OK(h->RunIteration(program));
  ASSERT_OK(h->RunIteration(program));
  EXPECT_EQ(collectives.calls, 0);
  EXPECT_EQ(h->manager().counters().all_gathers, 0);
  EXPECT_OK(h->manager().ReleaseRemoteChunks());
}

TEST(ChunkManagerCreate, RejectsBadArgumentsAndOptions) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Backend> backend,
                       CreateCpuBackend({.capacity_bytes = 64 * kChunkBytes}));
  auto options = [](int64_t block_bytes, bool pinned) {
    DeviceMemoryOptions o;
    o.chunk_block_bytes = block_bytes;
    o.pinned = pinned;
    return o;
  };
  ASSERT_OK_AND_ASSIGN(auto accel,
                       CreateAcceleratorMemory(backend.get(), options(kChunkBytes, true)));
  ASSERT_OK_AND_ASSIGN(auto host, CreateHostMemory(nullptr, options(kChunkBytes, false)));
  ASSERT_OK_AND_ASSIGN(auto small_host, CreateHostMemory(nullptr, options(kChunkBytes / 2, false)));
  auto make_store = [](int world) {
    std::vector<OperatorSpec> ops = {{"a", {{"a.w", {kChunkElems}}}}};
    auto layout = ChunkLayout::Build({.capacity_elems = kChunkElems, .world_size = world}, ops);
    EXPECT_OK(layout);
    auto store = ChunkStore::Create(*std::move(layout), {.compute_dtype = DType::kF32});
    EXPECT_OK(store);
    return *std::move(store);
  };
  auto store = make_store(1);
  EXPECT_THAT(ChunkManager::Create(nullptr, backend.get(), accel.get(), host.get()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), host.get(), host.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "backend drives"));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), accel.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "not the host"));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), small_host.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_block_bytes"));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(),
                                   {.warmup_chunk_fraction = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "warmup_chunk_fraction"));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(),
                                   {.device_budget_bytes = 65 * kChunkBytes}),
              StatusIs(absl::StatusCode::kInvalidArgument, "device_budget_bytes"));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(),
                                   {.comm_buffer_bytes = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "comm_buffer_bytes"));
  EXPECT_THAT(
      ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(), {.policy = "fifo"}),
      StatusIs(absl::StatusCode::kInvalidArgument, "fifo"));
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(),
                                   {.policy = "static", .static_param_chunks = {5}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "static_param_chunks"));
  auto zero_store = make_store(2);
  EXPECT_THAT(ChunkManager::Create(zero_store.get(), backend.get(), accel.get(), host.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "collectives is not set"));
  CountingCollectives world_of_two(2);
  EXPECT_THAT(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get(),
                                   {.collectives = &world_of_two}),
              StatusIs(absl::StatusCode::kInvalidArgument, "a world of 2"));
  EXPECT_OK(ChunkManager::Create(store.get(), backend.get(), accel.get(), host.get()));
}

}  // namespace
}  // namespace ps
