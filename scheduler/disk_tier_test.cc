#include "scheduler/disk_tier.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "disk/testing/memory_chunk_swap.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "scheduler/chunk_counters.h"
#include "scheduler/chunk_keys.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/training_harness.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kChunkElems = 256;
constexpr int64_t kBlock = kChunkElems * 4;  // f32 chunks: every type's block
constexpr int64_t kChunks = 12;              // one operator per chunk
constexpr int64_t kIndexBytes = 3 * kBlock;  // master + momentum + variance of one index

HarnessModel Model() {
  HarnessModel model;
  model.chunk_elems = kChunkElems;
  model.op_numels.assign(kChunks, 200);
  return model;
}

HarnessConfig Config(ChunkSwap* swap, int64_t budget, int64_t read_ahead) {
  HarnessConfig config;
  config.cap_bytes = 24 * kBlock;
  if (swap != nullptr) {
    config.options.disk =
        DiskTierOptions{.swap = swap, .host_budget_bytes = budget, .read_ahead = read_ahead};
  }
  return config;
}

// The bytes of the tensors of chunk (type, index), which must be on the host.
std::vector<uint8_t> TensorBytes(const ChunkStore& store, ChunkType type, int64_t index) {
  const Chunk& chunk = store.chunk(type, index);
  std::vector<uint8_t> out;
  for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
    const TensorView view = chunk.View(slot).value();
    EXPECT_TRUE(view.device.is_host());
    const uint8_t* p = static_cast<const uint8_t*>(view.data);
    out.insert(out.end(), p, p + view.bytes());
  }
  return out;
}

void FillTensors(ChunkStore& store, ChunkType type, int64_t index, TestRng& rng) {
  Chunk& chunk = store.chunk(type, index);
  for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
    const TensorView view = chunk.View(slot).value();
    uint8_t* p = static_cast<uint8_t*>(view.data);
    for (int64_t b = 0; b < view.bytes(); ++b) p[b] = static_cast<uint8_t>(rng());
  }
}

// Every chunk of every type, read through the manager on the host (untracked).
std::vector<std::vector<uint8_t>> ReadAll(ChunkManager& manager, ChunkStore& store) {
  std::vector<std::vector<uint8_t>> out;
  for (int64_t i = 0; i < kChunks; ++i) {
    for (ChunkType type : kAllChunkTypes) {
      EXPECT_OK(manager.AccessChunks(i, {type}, Device::Host(), AccessMode::kRead));
      out.push_back(TensorBytes(store, type, i));
      EXPECT_OK(manager.ReleaseChunks(i, {type}));
    }
  }
  return out;
}

TEST(DiskTierBudget, MinimumAndSplit) {
  EXPECT_EQ(DiskTierMinHostBytes(kBlock, kChunks), 2 * kIndexBytes);
  EXPECT_EQ(DiskTierMinHostBytes(kBlock, 1), kIndexBytes);
  EXPECT_EQ(DiskTierMinHostBytes(kBlock, 0), 0);
  // The minimum: a window of the access and one written behind, no room to read ahead.
  DiskTierSplit s = SplitDiskTierBudget(2 * kIndexBytes, kBlock, kChunks, 2);
  EXPECT_EQ(s.kept, 0);
  EXPECT_EQ(s.window, 2);
  EXPECT_EQ(s.read_ahead, 0);
  s = SplitDiskTierBudget(3 * kIndexBytes + kBlock, kBlock, kChunks, 2);
  EXPECT_EQ(s.kept, 0);
  EXPECT_EQ(s.window, 3);
  EXPECT_EQ(s.read_ahead, 1);
  // 10 indices fit: a window of 2 + 2, the other 6 kept.
  s = SplitDiskTierBudget(10 * kIndexBytes, kBlock, kChunks, 2);
  EXPECT_EQ(s.kept, 6);
  EXPECT_EQ(s.window, 4);
  EXPECT_EQ(s.read_ahead, 2);
  // Everything fits: all kept, nothing streamed.
  s = SplitDiskTierBudget(kChunks * kIndexBytes, kBlock, kChunks, 2);
  EXPECT_EQ(s.kept, kChunks);
  EXPECT_EQ(s.window, 0);
}

TEST(DiskTier, RefusesBudgetBelowMinimum) {
  MemoryChunkSwap swap;
  const int64_t min = 2 * kIndexBytes;
  EXPECT_THAT(
      TrainingHarness::Create(Model(), Config(&swap, min - 1, 1)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(absl::StrCat(min - 1, " bytes")),
                     HasSubstr(absl::StrCat(min, " bytes")), HasSubstr("host_budget_bytes"))));
  MemoryChunkSwap swap2;
  EXPECT_OK(TrainingHarness::Create(Model(), Config(&swap2, min, 1)).status());
  EXPECT_THAT(TrainingHarness::Create(Model(), Config(nullptr, 0, 0)).status(), IsOk());
}

// Random budgets x read-ahead windows x access patterns: after every call the tier's host bytes
// stay under the budget, and every chunk holds exactly the bytes last written into it.
TEST(DiskTier, RandomAccessesStayUnderBudgetAndKeepBytes) {
  TestRng rng(1);
  const std::vector<ChunkType> kState = {ChunkType::kMaster, ChunkType::kMomentum,
                                         ChunkType::kVariance};
  for (int64_t budget : {2 * kIndexBytes, 2 * kIndexBytes + kBlock, 3 * kIndexBytes + 2 * kBlock,
                         5 * kIndexBytes, 9 * kIndexBytes, kChunks * kIndexBytes}) {
    for (int64_t read_ahead : {0, 1, 3}) {
      for (bool cyclic : {true, false}) {
        SCOPED_TRACE(absl::StrCat("budget ", budget, " read-ahead ", read_ahead,
                                  cyclic ? " cyclic" : " random"));
        MemoryChunkSwap swap;
        ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                             TrainingHarness::Create(Model(), Config(&swap, budget, read_ahead)));
        ChunkManager& m = h->manager();
        const DiskTier& tier = *m.disk_tier();
        // Cyclic runs start from written chunks; random ones from FREE tensors (zero-filled).
        if (cyclic) {
          ASSERT_OK(h->Initialize());
        }
        EXPECT_LE(tier.host_bytes(), budget);
        std::vector<std::vector<uint8_t>> ref(kNumChunkTypes * kChunks);
        for (int64_t i = 0; i < kChunks; ++i) {
          ASSERT_OK(m.AccessChunks(i, kState, Device::Host(), AccessMode::kRead));
          for (ChunkType t : kState)
            ref[static_cast<int>(t) * kChunks + i] = TensorBytes(h->store(), t, i);
          ASSERT_OK(m.ReleaseChunks(i, kState));
          ASSERT_LE(tier.host_bytes(), budget);
        }
        for (int step = 0; step < 150; ++step) {
          int64_t index;
          std::vector<ChunkType> types;
          std::vector<AccessMode> modes;
          if (cyclic) {
            index = step % kChunks;
            const int pass = (step / kChunks) % 3;  // update, restore, gradients
            types = {ChunkType::kParam};
            modes = {pass == 2 ? AccessMode::kRead : AccessMode::kReadWrite};
            if (pass == 0) {
              for (ChunkType t : kState) {
                types.push_back(t);
                modes.push_back(AccessMode::kReadWrite);
              }
            } else if (pass == 1) {
              types.push_back(ChunkType::kMaster);
              modes.push_back(AccessMode::kRead);
            }
          } else {
            index = absl::Uniform<int64_t>(rng, 0, kChunks);
            for (ChunkType t : kAllChunkTypes) {
              if (absl::Bernoulli(rng, 0.6)) {
                types.push_back(t);
                modes.push_back(absl::Bernoulli(rng, 0.5) ? AccessMode::kRead
                                                          : AccessMode::kReadWrite);
              }
            }
            if (types.empty()) {
              types.push_back(ChunkType::kMomentum);
              modes.push_back(AccessMode::kReadWrite);
            }
          }
          SCOPED_TRACE(absl::StrCat("step ", step, " index ", index));
          ASSERT_OK(m.AccessChunks(index, types, Device::Host(), modes));
          ASSERT_LE(tier.host_bytes(), budget);
          for (size_t k = 0; k < types.size(); ++k) {
            if (types[k] == ChunkType::kParam) continue;
            std::vector<uint8_t>& expected = ref[static_cast<int>(types[k]) * kChunks + index];
            ASSERT_EQ(TensorBytes(h->store(), types[k], index), expected)
                << ChunkId{types[k], index}.ToString();
            if (modes[k] == AccessMode::kReadWrite) {
              FillTensors(h->store(), types[k], index, rng);
              expected = TensorBytes(h->store(), types[k], index);
            }
          }
          ASSERT_OK(m.ReleaseChunks(index, types));
          ASSERT_LE(tier.host_bytes(), budget);
        }
        EXPECT_LE(m.counters().disk_peak_host_bytes, budget);
        if (budget < kChunks * kIndexBytes) {
          EXPECT_GT(m.counters().disk_reads, 0);
        }
      }
    }
  }
}

// The update pass writes its streamed chunks back; the restore pass (master read only) and a
// read-only pass write nothing.
TEST(DiskTier, CleanChunksAreNeverWritten) {
  MemoryChunkSwap swap;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                       TrainingHarness::Create(Model(), Config(&swap, 2 * kIndexBytes, 0)));
  ASSERT_OK(h->Initialize());
  ChunkManager& m = h->manager();
  const std::vector<ChunkType> update = {ChunkType::kParam, ChunkType::kMaster,
                                         ChunkType::kMomentum, ChunkType::kVariance};
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i = 0; i < kChunks; ++i) {
      ASSERT_OK(m.AccessChunks(i, update, Device::Host(), AccessMode::kReadWrite));
      ASSERT_OK(m.ReleaseChunks(i, update));
    }
  }
  const ChunkManagerCounters before = m.counters();
  EXPECT_GT(before.disk_writes, 0);
  EXPECT_GT(before.disk_write_behinds, 0);
  const std::vector<ChunkType> restore = {ChunkType::kParam, ChunkType::kMaster};
  const std::vector<AccessMode> restore_modes = {AccessMode::kReadWrite, AccessMode::kRead};
  for (int64_t i = 0; i < kChunks; ++i) {
    ASSERT_OK(m.AccessChunks(i, restore, Device::Host(), restore_modes));
    ASSERT_OK(m.ReleaseChunks(i, restore));
  }
  for (int64_t i = 0; i < kChunks; ++i) {
    ASSERT_OK(m.AccessChunks(i, update, Device::Host(), AccessMode::kRead));
    ASSERT_OK(m.ReleaseChunks(i, update));
  }
  const ChunkManagerCounters after = m.counters();
  EXPECT_EQ(after.disk_writes, before.disk_writes);
  EXPECT_EQ(swap.counters().writes, before.disk_writes);
  EXPECT_GT(after.disk_reads, before.disk_reads);
  EXPECT_GT(after.disk_drops, before.disk_drops);
}

// With room beyond the minimum, reads of the next indices start while an index is accessed.
TEST(DiskTier, ReadAheadOverlapsAndHits) {
  MemoryChunkSwap swap;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                       TrainingHarness::Create(Model(), Config(&swap, 5 * kIndexBytes, 2)));
  ASSERT_OK(h->Initialize());
  ChunkManager& m = h->manager();
  EXPECT_EQ(m.disk_tier()->split().read_ahead, 2);
  EXPECT_EQ(m.disk_tier()->split().kept, 1);
  for (int pass = 0; pass < 3; ++pass) {
    for (int64_t i = 0; i < kChunks; ++i) {
      ASSERT_OK(m.AccessChunks(i, kAllChunkTypes, Device::Host(), AccessMode::kReadWrite));
      ASSERT_OK(m.ReleaseChunks(i, kAllChunkTypes));
    }
  }
  const ChunkManagerCounters c = m.counters();
  EXPECT_GT(swap.max_in_flight(), 1);
  EXPECT_GT(c.disk_read_aheads, 0);
  EXPECT_GT(c.disk_read_ahead_hits, 0);
  EXPECT_LE(c.disk_read_ahead_hits, c.disk_read_aheads);
  EXPECT_LE(c.disk_peak_host_bytes, 5 * kIndexBytes);
}

// A failed read names the chunk; the call is no moment, and the manager goes on (the chunk reads
// fine once the fault is gone) and is destroyed cleanly.
TEST(DiskTier, ReadFaultNamesChunkAndManagerStaysUsable) {
  MemoryChunkSwap swap;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                       TrainingHarness::Create(Model(), Config(&swap, 2 * kIndexBytes, 0)));
  ASSERT_OK(h->Initialize());
  ChunkManager& m = h->manager();
  const std::vector<std::vector<uint8_t>> before = ReadAll(m, h->store());
  const int64_t index = 5;
  const int64_t key = m.ChunkKey({ChunkType::kMomentum, index});
  ASSERT_TRUE(m.disk_tier()->spilled(key));
  swap.FailNextRead(key, absl::DataLossError("CRC-32C mismatch in slot momentum#5 at offset 0"));
  ASSERT_OK(m.BeginIteration());
  const int64_t moment = m.metronome().moment();
  EXPECT_THAT(m.AccessChunks(index, kAllChunkTypes, Device::Host(), AccessMode::kReadWrite),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("loading momentum#5 from disk: "), HasSubstr("CRC-32C"))));
  EXPECT_EQ(m.metronome().moment(), moment);
  EXPECT_TRUE(m.disk_tier()->spilled(key));
  ASSERT_OK(m.AccessChunks(index, kAllChunkTypes, Device::Host(), AccessMode::kRead));
  ASSERT_OK(m.ReleaseChunks(index, kAllChunkTypes));
  ASSERT_OK(m.EndIteration());
  EXPECT_EQ(ReadAll(m, h->store()), before);
  // Destroyed with chunks spilled and nothing in flight.
  h->DestroyManager();
}

// Training a small store several iterations (forward, backward, the optimizer on the placement's
// devices) with every optimizer-state chunk streamed through the minimum budget gives the same
// bytes as without the tier; the harness checks every tensor it reads on the way.
TEST(DiskTier, TrainingWithAndWithoutTierGivesSameBytes) {
  HarnessProgram program;
  for (OperatorId op = 0; op < kChunks; ++op) program.steps.push_back({.op = op});
  for (OperatorId op = kChunks - 1; op >= 0; --op) {
    program.steps.push_back({.op = op, .stage = Stage::kBackward, .write = true});
  }
  program.adam = true;
  program.adam_on_accelerator = true;
  std::vector<std::vector<uint8_t>> bytes[2];
  ChunkManagerCounters counters[2];
  for (int with_tier = 0; with_tier < 2; ++with_tier) {
    SCOPED_TRACE(with_tier ? "with the disk tier" : "without");
    MemoryChunkSwap swap;
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<TrainingHarness> h,
        TrainingHarness::Create(Model(), Config(with_tier ? &swap : nullptr, 2 * kIndexBytes, 1)));
    ASSERT_OK(h->Initialize());
    for (int it = 0; it < 4; ++it) ASSERT_OK(h->RunIteration(program));
    EXPECT_GT(h->verified_tensors(), 0);
    // The ADAM placement keeps some optimizer state on the accelerator: loaded from disk once,
    // then living there with no host copy.
    int64_t placed = 0;
    for (int64_t i = 0; i < kChunks; ++i) {
      const Chunk& master = h->store().chunk(ChunkType::kMaster, i);
      if (master.has_payload() && master.device().is_accelerator()) {
        ++placed;
        if (with_tier) {
          EXPECT_FALSE(master.has_backing()) << master.DebugString();
        }
      }
    }
    EXPECT_GT(placed, 0);
    EXPECT_LT(placed, kChunks);
    counters[with_tier] = h->manager().counters();
    bytes[with_tier] = ReadAll(h->manager(), h->store());
    if (with_tier) {
      EXPECT_GT(counters[1].disk_reads, 0);
      EXPECT_GT(counters[1].disk_writes, 0);
      EXPECT_LE(counters[1].disk_peak_host_bytes, 2 * kIndexBytes);
      for (const ChunkManagerCounters& c : h->manager().iteration_counters()) {
        EXPECT_LE(c.disk_peak_host_bytes, 2 * kIndexBytes);
      }
    }
  }
  EXPECT_EQ(bytes[0], bytes[1]);
  // Without the tier, nothing of it is counted.
  EXPECT_EQ(counters[0].disk_reads + counters[0].disk_writes + counters[0].disk_peak_host_bytes, 0);
}

// ZeRO: a rank backs only the optimizer state it owns (its share of the chunks), and its
// minimum counts only those.
TEST(DiskTier, BacksOnlyTheRanksOwnState) {
  std::vector<OperatorSpec> ops;
  for (int i = 0; i < 8; ++i)
    ops.push_back({absl::StrCat("op", i), {{absl::StrCat("w", i), {200}}}});
  ASSERT_OK_AND_ASSIGN(ChunkLayout layout,
                       ChunkLayout::Build({.capacity_elems = kChunkElems, .world_size = 2}, ops));
  DeviceMemoryOptions host_options;
  host_options.chunk_block_bytes = kBlock;
  host_options.pinned = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMemory> host, CreateHostMemory(nullptr, host_options));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChunkStore> store,
      ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kF32, .rank = 1}));
  const ChunkLayout& l = store->layout();
  int64_t owned = 0;
  for (int64_t i = 0; i < store->num_chunks(); ++i) {
    owned += l.HoldsPayload(ChunkType::kMaster, i, 1) ? 1 : 0;
  }
  ASSERT_GT(owned, 1);
  ASSERT_LT(owned, store->num_chunks());
  MemoryChunkSwap swap;
  ChunkManagerCounters counters;
  EXPECT_THAT(DiskTier::Create(store.get(), host.get(),
                               {.swap = &swap, .host_budget_bytes = 2 * kIndexBytes - 1}, &counters,
                               kSteadyClock)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  MemoryChunkSwap swap2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DiskTier> tier,
                       DiskTier::Create(store.get(), host.get(),
                                        {.swap = &swap2, .host_budget_bytes = 2 * kIndexBytes},
                                        &counters, kSteadyClock));
  EXPECT_EQ(tier->min_host_bytes(), 2 * kIndexBytes);
  const ChunkKeys keys(store->num_chunks());
  for (int64_t i = 0; i < store->num_chunks(); ++i) {
    for (ChunkType type : kAllChunkTypes) {
      const int64_t key = keys.Key(type, i);
      const bool backed = type != ChunkType::kParam && l.HoldsPayload(type, i, 1);
      EXPECT_EQ(tier->backed(key), backed) << ChunkId{type, i}.ToString();
      EXPECT_EQ(swap2.slot_bytes(key), backed ? kBlock : 0) << ChunkId{type, i}.ToString();
    }
  }
  EXPECT_EQ(tier->host_bytes(), 0);
}

}  // namespace
}  // namespace ps
