// Randomized operation sequences over a set of chunks (tcmalloc's huge_cache_fuzz style): random
// tensor-state transitions, payload allocations, releases, moves, pins and unpins, each checked
// against a reference model — whether it should succeed and with which code — and after every
// step the per-state counts, the derived chunk state, the payload's device and the data of every
// tensor that holds data are compared with the model. A move of a COMPUTE or pinned chunk must fail
// and leave the payload where it was. Backing copies (copy keeping the source, write-back, clean
// revert, discard, writes through views) are modelled too: a revert must succeed exactly when the
// backing copy is valid, and must then give back the data the payload held.
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/units.h"
#include "chunk/chunk.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "chunk/testing/test_memory_resources.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"
#include "memory/dtype.h"

namespace ps {
namespace {

constexpr int kHost = 0;
constexpr int kDevice = 1;
constexpr int kNone = -1;
// Room for about a third of the chunks on the device, so moves and allocations run out.
constexpr int64_t kDeviceCapacityBytes = 600;

// What the test believes about one chunk.
struct RefChunk {
  std::vector<TensorState> states;
  int where = kNone;    // kNone: no payload
  int backing = kNone;  // where the backing copy is; kNone: none
  bool backing_valid = false;
  int pins = 0;
  bool may_allocate = true;
  // Expected bytes of each tensor that holds data (not FREE).
  std::vector<std::vector<uint8_t>> data;
};

// The derivation rule, restated independently of DeriveChunkState.
ChunkState ExpectedState(const RefChunk& ref) {
  if (ref.where == kNone) return ChunkState::kReleased;
  for (auto [tensor, chunk] : {std::pair{TensorState::kCompute, ChunkState::kCompute},
                               std::pair{TensorState::kHold, ChunkState::kHold},
                               std::pair{TensorState::kHoldAfterFwd, ChunkState::kHoldAfterFwd},
                               std::pair{TensorState::kHoldAfterBwd, ChunkState::kHoldAfterBwd}}) {
    for (TensorState s : ref.states) {
      if (s == tensor) return chunk;
    }
  }
  return ChunkState::kFree;
}

bool HasCompute(const RefChunk& ref) {
  for (TensorState s : ref.states) {
    if (s == TensorState::kCompute) return true;
  }
  return false;
}

// How often each path ran, summed over every sequence of a test.
struct Stats {
  int transitions = 0;
  int illegal_transitions = 0;
  int zero_fills_on_device = 0;
  int allocations = 0;
  int releases = 0;
  int moves_to_device = 0;
  int moves_to_host = 0;
  int refused_moves_compute_or_pinned = 0;
  int out_of_memory = 0;
  int copies_keeping_backing = 0;
  int write_backs = 0;
  int reverts = 0;
  int refused_reverts = 0;
};

// Prints `stats` and expects every path to have run. The thresholds apply to the sum over a test's
// sequences, not to each: over 800 sequences of 8000 steps (PS_TEST_SEED 0..199, 4 streams each)
// one sequence alone fell to 0 clean reverts, 3 moves to device and 3 write-backs (144 of the 800
// had <= 10 reverts), while the sum of 4 stayed at least 4.2 standard deviations above every
// threshold (the closest: reverts, mean 62.7, sd 12.5, minimum 32 against 10). A path that no
// longer runs at all still fails.
void ExpectEveryPathRan(const Stats& stats) {
  std::cout << "transitions " << stats.transitions << ", illegal " << stats.illegal_transitions
            << ", device zero-fills " << stats.zero_fills_on_device << ", allocations "
            << stats.allocations << ", releases " << stats.releases << ", moves to device "
            << stats.moves_to_device << ", moves to host " << stats.moves_to_host
            << ", refused moves (COMPUTE/pinned) " << stats.refused_moves_compute_or_pinned
            << ", out of memory " << stats.out_of_memory << ", copies keeping the source "
            << stats.copies_keeping_backing << ", write-backs " << stats.write_backs
            << ", clean reverts " << stats.reverts << ", refused (stale) reverts "
            << stats.refused_reverts << "\n";
  // The sequences together really exercised every path.
  EXPECT_GT(stats.transitions, 200);
  EXPECT_GT(stats.illegal_transitions, 200);
  EXPECT_GT(stats.zero_fills_on_device, 5);
  EXPECT_GT(stats.allocations, 20);
  EXPECT_GT(stats.releases, 20);
  EXPECT_GT(stats.moves_to_device, 10);
  EXPECT_GT(stats.moves_to_host, 10);
  EXPECT_GT(stats.refused_moves_compute_or_pinned, 10);
  EXPECT_GT(stats.out_of_memory, 5);
  EXPECT_GT(stats.copies_keeping_backing, 10);
  EXPECT_GT(stats.write_backs, 5);
  EXPECT_GT(stats.reverts, 10);
  EXPECT_GT(stats.refused_reverts, 5);
}

class RandomOps {
 public:
  // Counts what the sequence exercised into *stats, which must outlive this.
  RandomOps(uint64_t seed, Stats* stats) : rng_(seed), stats_(*stats) {}

  void Run(int steps) {
    ASSERT_OK_AND_ASSIGN(backend_, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
    ASSERT_OK_AND_ASSIGN(stream_, backend_->CreateStream());
    device_ = std::make_unique<TestDeviceResource>(*backend_, kDeviceCapacityBytes);
    ASSERT_NO_FATAL_FAILURE(MakeChunks());
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      ASSERT_NO_FATAL_FAILURE(Step());
      ASSERT_NO_FATAL_FAILURE(CheckAll(/*data=*/step % 64 == 0));
    }
    for (auto& c : chunks_) c.reset();  // gives payloads back before the resources go
    EXPECT_EQ(host_.allocated_bytes(), 0);
    EXPECT_EQ(device_->allocated_bytes(), 0);
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  void MakeChunks() {
    const ChunkType types[] = {ChunkType::kParam, ChunkType::kMaster, ChunkType::kMomentum,
                               ChunkType::kVariance};
    for (int i = 0; i < 7; ++i) {
      ChunkSpec spec;
      spec.id = ChunkId{types[i % 4], i};
      spec.dtype = ChunkDType(spec.id.type, i % 2 == 0 ? DType::kF16 : DType::kBF16);
      spec.capacity_elems = Uniform(40, 100);
      // Chunk 5 is another rank's optimizer state, chunk 6 a padding one: never allocatable.
      spec.owner_rank = i == 5 ? 1 : 0;
      spec.is_padding = i == 6;
      const int64_t n = i == 3 ? 0 : Uniform(1, 5);
      int64_t offset = 0;
      for (int64_t t = 0; t < n && offset < spec.capacity_elems; ++t) {
        offset += Uniform(0, 3);  // gaps
        const int64_t numel = Uniform(1, 10);
        if (offset + numel > spec.capacity_elems) break;
        spec.tensors.push_back({i * 100 + t, absl::StrCat("c", i, ".t", t), offset, numel});
        offset += numel;
      }
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Chunk> chunk, Chunk::Create(spec));
      RefChunk ref;
      ref.states.assign(chunk->num_tensors(), TensorState::kFree);
      ref.data.resize(chunk->num_tensors());
      ref.may_allocate = !(IsOptimizerState(spec.id.type) && (i == 5 || i == 6));
      chunks_.push_back(std::move(chunk));
      refs_.push_back(std::move(ref));
    }
  }

  MemoryResource& Resource(int where) {
    return where == kHost ? static_cast<MemoryResource&>(host_) : *device_;
  }

  int64_t DeviceBytesInUse() const {
    int64_t bytes = 0;
    for (size_t i = 0; i < chunks_.size(); ++i) {
      if (refs_[i].where == kDevice) bytes += chunks_[i]->capacity_bytes();
      if (refs_[i].backing == kDevice) bytes += chunks_[i]->capacity_bytes();
    }
    return bytes;
  }

  bool Fits(const Chunk& chunk, int where) const {
    return where == kHost || DeviceBytesInUse() + chunk.capacity_bytes() <= kDeviceCapacityBytes;
  }

  // Copies between a host buffer and a tensor's view, wherever the payload is.
  void WriteView(const TensorView& view, const std::vector<uint8_t>& bytes) {
    if (view.device.is_host()) {
      std::memcpy(view.data, bytes.data(), bytes.size());
    } else {
      ASSERT_OK(
          stream_->MemcpyAsync(view.data, bytes.data(), view.bytes(), CopyKind::kHostToDevice));
      ASSERT_OK(stream_->Synchronize());
    }
  }
  std::vector<uint8_t> ReadView(const TensorView& view) {
    std::vector<uint8_t> bytes(view.bytes());
    if (view.device.is_host()) {
      std::memcpy(bytes.data(), view.data, bytes.size());
    } else {
      EXPECT_OK(
          stream_->MemcpyAsync(bytes.data(), view.data, view.bytes(), CopyKind::kDeviceToHost));
      EXPECT_OK(stream_->Synchronize());
    }
    return bytes;
  }

  void Step() {
    const size_t c = Uniform(0, chunks_.size() - 1);
    Chunk& chunk = *chunks_[c];
    RefChunk& ref = refs_[c];
    const int64_t op = Uniform(0, 159);
    if (op >= 100) {
      ASSERT_NO_FATAL_FAILURE(BackingStep(c, op - 100));
    } else if (op < 45) {
      if (chunk.num_tensors() == 0) return;
      const int slot = static_cast<int>(Uniform(0, chunk.num_tensors() - 1));
      const TensorState from = ref.states[slot];
      // Mostly legal targets, so the walk keeps moving; the rest uniformly (mostly illegal).
      TensorState to = kAllTensorStates[Uniform(0, kNumTensorStates - 1)];
      if (Uniform(0, 9) < 6) {
        std::vector<TensorState> legal;
        for (TensorState t : kAllTensorStates) {
          if (IsLegalTransition(from, t)) legal.push_back(t);
        }
        to = legal[Uniform(0, legal.size() - 1)];
      }
      const bool with_stream = Uniform(0, 9) != 0;
      absl::StatusCode expected = absl::StatusCode::kOk;
      if (!IsLegalTransition(from, to) || (to != TensorState::kFree && ref.where == kNone)) {
        expected = absl::StatusCode::kFailedPrecondition;
      } else if (from == TensorState::kFree && to == TensorState::kCompute &&
                 ref.where == kDevice && !with_stream) {
        expected = absl::StatusCode::kInvalidArgument;
      }
      const absl::Status s = chunk.SetTensorState(slot, to, with_stream ? stream_.get() : nullptr);
      ASSERT_EQ(s.code(), expected) << s << " for " << from << " -> " << to;
      if (!s.ok()) {
        stats_.illegal_transitions += expected == absl::StatusCode::kFailedPrecondition ? 1 : 0;
        return;
      }
      ++stats_.transitions;
      if (from == TensorState::kFree && to == TensorState::kCompute && ref.where == kDevice) {
        ++stats_.zero_fills_on_device;
      }
      ref.states[slot] = to;
      if (from == TensorState::kFree) ref.backing_valid = false;  // new bytes in the payload
      if (to == TensorState::kFree) {
        ref.data[slot].clear();
      } else if (from == TensorState::kFree) {
        ASSERT_OK_AND_ASSIGN(TensorView view, chunk.View(slot));
        if (to == TensorState::kCompute) {
          // The view was zero-filled; then the "operator" writes its own data.
          ASSERT_EQ(ReadView(view), std::vector<uint8_t>(view.bytes(), 0));
        }
        std::vector<uint8_t> bytes(view.bytes());
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(Uniform(0, 255));
        ASSERT_NO_FATAL_FAILURE(WriteView(view, bytes));
        ref.data[slot] = std::move(bytes);
      }
    } else if (op < 58) {
      const int where = static_cast<int>(Uniform(kHost, kDevice));
      absl::StatusCode expected = absl::StatusCode::kOk;
      if (ref.where != kNone || !ref.may_allocate) {
        expected = absl::StatusCode::kFailedPrecondition;
      } else if (!Fits(chunk, where)) {
        expected = absl::StatusCode::kResourceExhausted;
      }
      const absl::Status s = chunk.AllocatePayload(Resource(where));
      ASSERT_EQ(s.code(), expected) << s;
      stats_.out_of_memory += expected == absl::StatusCode::kResourceExhausted ? 1 : 0;
      if (s.ok()) {
        ref.where = where;
        ++stats_.allocations;
      }
    } else if (op < 66) {
      const bool ok = ref.where != kNone && !HasCompute(ref) && ref.pins == 0;
      void* before = chunk.payload();
      const absl::Status s = chunk.ReleasePayload();
      ASSERT_EQ(s.ok(), ok) << s;
      if (!ok) {
        ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
        ASSERT_EQ(chunk.payload(), before);
        return;
      }
      ++stats_.releases;
      ref.where = kNone;
      ref.backing = kNone;
      ref.backing_valid = false;
      ref.states.assign(ref.states.size(), TensorState::kFree);
      for (auto& d : ref.data) d.clear();
    } else if (op < 90) {
      const int where = static_cast<int>(Uniform(kHost, kDevice));
      absl::StatusCode expected = absl::StatusCode::kOk;
      if (ref.where == kNone || HasCompute(ref) || ref.pins > 0) {
        expected = absl::StatusCode::kFailedPrecondition;
      } else if (where != ref.where && where != ref.backing && !Fits(chunk, where)) {
        expected = absl::StatusCode::kResourceExhausted;
      }
      void* before = chunk.payload();
      const absl::Status s = chunk.MoveTo(Resource(where), *stream_);
      ASSERT_EQ(s.code(), expected) << s;
      stats_.out_of_memory += expected == absl::StatusCode::kResourceExhausted ? 1 : 0;
      if (ref.where != kNone && (HasCompute(ref) || ref.pins > 0)) {
        ++stats_.refused_moves_compute_or_pinned;
      }
      if (!s.ok()) {
        // In particular: no COMPUTE or pinned chunk was moved.
        ASSERT_EQ(chunk.payload(), before);
        if (ref.where != kNone) {
          ASSERT_EQ(chunk.device(), Resource(ref.where).device());
        }
        return;
      }
      if (where != ref.where) {
        ++(where == kDevice ? stats_.moves_to_device : stats_.moves_to_host);
        // The backing copy is reused on the destination, given back elsewhere.
        ref.backing = kNone;
        ref.backing_valid = false;
      }
      ref.where = where;
      ASSERT_NO_FATAL_FAILURE(CheckData(c));
    } else if (op < 95 && ref.pins < 2) {
      chunk.Pin();
      ++ref.pins;
    } else {
      const absl::Status s = chunk.Unpin();
      ASSERT_EQ(s.ok(), ref.pins > 0) << s;
      if (s.ok()) --ref.pins;
    }
  }

  // The backing-copy operations: 0-15 copy keeping the source, 16-25 write back, 26-45 revert,
  // 46-49 discard, 50-59 write new data through a view.
  void BackingStep(size_t c, int64_t op) {
    if (op >= 50) {
      // Writes go mostly to chunks with a backing copy, where they matter.
      std::vector<size_t> with_backing;
      for (size_t i = 0; i < refs_.size(); ++i) {
        if (refs_[i].backing != kNone) with_backing.push_back(i);
      }
      if (!with_backing.empty() && Uniform(0, 3) != 0) {
        c = with_backing[Uniform(0, with_backing.size() - 1)];
      }
    }
    Chunk& chunk = *chunks_[c];
    RefChunk& ref = refs_[c];
    const bool movable = ref.where != kNone && !HasCompute(ref) && ref.pins == 0;
    if (op < 16) {
      const int where = ref.where == kHost ? kDevice : kHost;
      absl::StatusCode expected = absl::StatusCode::kOk;
      if (!movable || ref.backing != kNone) {
        expected = absl::StatusCode::kFailedPrecondition;
      } else if (!Fits(chunk, where)) {
        expected = absl::StatusCode::kResourceExhausted;
      }
      void* before = chunk.payload();
      const absl::Status s = chunk.CopyToKeepingBacking(Resource(where), *stream_);
      ASSERT_EQ(s.code(), expected) << s;
      stats_.out_of_memory += expected == absl::StatusCode::kResourceExhausted ? 1 : 0;
      if (!s.ok()) {
        ASSERT_EQ(chunk.payload(), before);
        return;
      }
      ASSERT_OK(stream_->Synchronize());
      ++stats_.copies_keeping_backing;
      ref.backing = ref.where;
      ref.backing_valid = true;
      ref.where = where;
      ASSERT_EQ(chunk.backing(), before);
      ASSERT_NO_FATAL_FAILURE(CheckData(c));
    } else if (op < 26) {
      // Without a backing copy, one is allocated on the other side (half the time).
      const int other = ref.where == kHost ? kDevice : kHost;
      const bool give = Uniform(0, 1) == 1;
      absl::StatusCode expected = absl::StatusCode::kOk;
      if (!movable) {
        expected = absl::StatusCode::kFailedPrecondition;
      } else if (ref.backing == kNone && !give) {
        expected = absl::StatusCode::kFailedPrecondition;
      } else if (ref.backing == kNone && !Fits(chunk, other)) {
        expected = absl::StatusCode::kResourceExhausted;
      }
      const absl::Status s = chunk.WriteBackAsync(*stream_, give ? &Resource(other) : nullptr);
      ASSERT_EQ(s.code(), expected) << s;
      if (!s.ok()) return;
      ASSERT_OK(stream_->Synchronize());
      stats_.write_backs += ref.backing_valid ? 0 : 1;
      if (ref.backing == kNone) ref.backing = other;
      ref.backing_valid = true;
    } else if (op < 46) {
      const bool ok = movable && ref.backing != kNone && ref.backing_valid;
      void* backing = chunk.backing();
      const absl::Status s = chunk.RevertToBacking();
      ASSERT_EQ(s.ok(), ok) << s;
      if (!s.ok()) {
        ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
        stats_.refused_reverts += (movable && ref.backing != kNone) ? 1 : 0;
        return;
      }
      ++stats_.reverts;
      ASSERT_EQ(chunk.payload(), backing);
      ref.where = ref.backing;
      ref.backing = kNone;
      ref.backing_valid = false;
      ASSERT_NO_FATAL_FAILURE(CheckData(c));  // the backing copy had exactly the payload's data
    } else if (op < 50) {
      const absl::Status s = chunk.DiscardBacking();
      ASSERT_EQ(s.ok(), ref.backing != kNone) << s;
      ref.backing = kNone;
      ref.backing_valid = false;
    } else {
      // A kernel writes a tensor that holds data: the owner marks the payload written.
      std::vector<int> holding;
      for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
        if (ref.states[slot] != TensorState::kFree) holding.push_back(slot);
      }
      if (holding.empty()) return;
      const int slot = holding[Uniform(0, holding.size() - 1)];
      ASSERT_OK_AND_ASSIGN(TensorView view, chunk.View(slot));
      std::vector<uint8_t> bytes(view.bytes());
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(Uniform(0, 255));
      chunk.MarkPayloadWritten();
      ASSERT_NO_FATAL_FAILURE(WriteView(view, bytes));
      ref.data[slot] = std::move(bytes);
      ref.backing_valid = false;
      if (movable && ref.backing != kNone) {
        // The backing copy is stale now: reverting to it would lose the write.
        ASSERT_THAT(chunk.RevertToBacking(),
                    StatusIs(absl::StatusCode::kFailedPrecondition, "write it back first"));
        ++stats_.refused_reverts;
      }
    }
  }

  void CheckData(size_t c) {
    const Chunk& chunk = *chunks_[c];
    const RefChunk& ref = refs_[c];
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (ref.states[slot] == TensorState::kFree) continue;
      ASSERT_OK_AND_ASSIGN(TensorView view, chunk.View(slot));
      ASSERT_EQ(ReadView(view), ref.data[slot]) << chunk.id() << " slot " << slot;
    }
  }

  void CheckAll(bool data) {
    int64_t host_bytes = 0;
    int64_t device_bytes = 0;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const Chunk& chunk = *chunks_[c];
      const RefChunk& ref = refs_[c];
      TensorStateCounts counts{};
      for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
        ASSERT_EQ(chunk.tensor_state(slot), ref.states[slot]) << chunk.id() << " slot " << slot;
        ++counts[static_cast<int>(ref.states[slot])];
      }
      ASSERT_EQ(chunk.tensor_counts(), counts) << chunk.id();
      for (TensorState s : kAllTensorStates) {
        ASSERT_EQ(chunk.tensor_count(s), counts[static_cast<int>(s)]);
      }
      ASSERT_EQ(chunk.state(), ExpectedState(ref)) << chunk.id();
      ASSERT_EQ(chunk.has_payload(), ref.where != kNone) << chunk.id();
      ASSERT_EQ(chunk.pin_count(), ref.pins);
      ASSERT_EQ(chunk.movable(), ref.where != kNone && !HasCompute(ref) && ref.pins == 0);
      ASSERT_EQ(chunk.has_backing(), ref.backing != kNone) << chunk.id();
      ASSERT_EQ(chunk.backing_valid(), ref.backing != kNone && ref.backing_valid) << chunk.id();
      if (ref.backing != kNone) {
        ASSERT_NE(ref.where, kNone) << chunk.id() << ": a backing copy without a payload";
        ASSERT_EQ(chunk.backing_resource(), &Resource(ref.backing));
        (ref.backing == kHost ? host_bytes : device_bytes) += chunk.capacity_bytes();
      }
      if (ref.where != kNone) {
        ASSERT_EQ(chunk.device(), Resource(ref.where).device()) << chunk.id();
        ASSERT_EQ(chunk.payload_resource(), &Resource(ref.where));
        (ref.where == kHost ? host_bytes : device_bytes) += chunk.capacity_bytes();
      } else {
        // Without a payload nothing can hold data.
        ASSERT_EQ(counts[static_cast<int>(TensorState::kFree)], chunk.num_tensors());
      }
      if (data) {
        ASSERT_NO_FATAL_FAILURE(CheckData(c));
      }
    }
    ASSERT_EQ(host_.allocated_bytes(), host_bytes);
    ASSERT_EQ(device_->allocated_bytes(), device_bytes);
  }

  TestRng rng_;
  Stats& stats_;
  TestHostResource host_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<TestDeviceResource> device_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<RefChunk> refs_;
};

TEST(ChunkRandomOps, MatchesReferenceModel) {
  Stats stats;
  for (uint64_t seed : {1u, 7u, 42u, 1234u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    RandomOps ops(seed, &stats);
    ASSERT_NO_FATAL_FAILURE(ops.Run(8000));
  }
  SCOPED_TRACE(absl::StrCat("streams 1, 7, 42, 1234 with ", kTestSeedEnvVar, "=", TestSeed()));
  ExpectEveryPathRan(stats);
}

}  // namespace
}  // namespace ps
