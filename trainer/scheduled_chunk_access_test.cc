// HybridAdam driven by the scheduler: whole training iterations on the emulated accelerator
// (operators accessed in forward and backward through the ChunkManager, gradients written into
// the param chunks, then the optimizer step on the manager's ADAM placement). The step's results
// must not depend on where the placement ran each chunk: a roomy accelerator (optimizer state kept
// there after the warm-up) and a tight one (everything on the host) give bit-identical master
// weights, moments and parameters.
#include "trainer/scheduled_chunk_access.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "disk/testing/memory_chunk_swap.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "model/gpt_config.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/disk_tier.h"

namespace ps {
namespace {

constexpr int64_t kChunkElems = 32768;
constexpr ChunkType kAllTypes[] = {ChunkType::kParam, ChunkType::kMaster, ChunkType::kMomentum,
                                   ChunkType::kVariance};

struct RunResult {
  std::vector<std::vector<float>> payloads;  // per (type, chunk index), in type-major order
  int64_t accelerator_chunk_steps = 0;
  int64_t host_chunk_steps = 0;
  ChunkManagerCounters counters;
  // Disk writes (disk tier) made by a restore pass after the training.
  int64_t restore_disk_writes = 0;
};

// Trains the tiny GPT preset's parameters for `iterations` iterations with synthetic gradients on
// an emulated accelerator of `capacity_bytes`, and returns every chunk's final contents. With
// `swap`, the optimizer state goes through the disk tier at its minimum host budget.
absl::StatusOr<RunResult> Train(int64_t capacity_bytes, int iterations, ChunkSwap* swap = nullptr) {
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   CreateCpuBackend({.capacity_bytes = capacity_bytes}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> accelerator,
                   CreateAcceleratorMemory(backend.get(), memory_options));
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> host,
                   CreateHostMemory(backend.get(), memory_options));
  // The store's chunks hold blocks of those pools, so it is created after (destroyed before) them.
  ASSIGN_OR_RETURN(GptConfig config, GptPreset("tiny"));
  const std::vector<OperatorSpec> ops = GptOperators(config);
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build({.capacity_elems = kChunkElems}, ops));
  ASSIGN_OR_RETURN(std::unique_ptr<ChunkStore> store,
                   ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kF32}));
  ChunkManagerOptions manager_options;
  if (swap != nullptr) {
    manager_options.disk = DiskTierOptions{.swap = swap,
                                           .host_budget_bytes = DiskTierMinHostBytes(
                                               kChunkElems * 4, store->layout().num_data_chunks()),
                                           .read_ahead = 1};
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ChunkManager> manager,
                   ChunkManager::Create(store.get(), backend.get(), accelerator.get(), host.get(),
                                        manager_options));
  ASSIGN_OR_RETURN(std::unique_ptr<CpuAdam> cpu_adam, CpuAdam::Create({.num_threads = 2}));
  HybridAdamOptions options;
  options.groups = {ParamGroupOptions{.name = "default", .lr = 1e-2, .weight_decay = 0.01}};
  ASSIGN_OR_RETURN(std::unique_ptr<HybridAdam> adam,
                   HybridAdam::Create(store->layout(), 0, DType::kF32, options,
                                      {.host = cpu_adam.get(), .accelerator = cpu_adam.get()}));

  // Initialization (outside any iteration): parameters and their master copies.
  const ChunkLayout& l = store->layout();
  for (int64_t i = 0; i < l.num_chunks(); ++i) {
    RETURN_IF_ERROR(manager->AccessChunks(i, kAllTypes, Device::Host(), AccessMode::kReadWrite));
    for (TensorId t : l.TensorsInChunk(i)) {
      for (ChunkType type : {ChunkType::kParam, ChunkType::kMaster}) {
        ASSIGN_OR_RETURN(TensorView v, store->View(type, t));
        auto* data = static_cast<float*>(v.data);
        for (int64_t e = 0; e < v.numel; ++e) data[e] = 0.02f * std::sin(0.37f * (t * 131 + e));
      }
    }
    RETURN_IF_ERROR(manager->ReleaseChunks(i, kAllTypes));
  }

  const Device accel = backend->device();
  RunResult result;
  for (int it = 0; it < iterations; ++it) {
    RETURN_IF_ERROR(manager->BeginIteration());
    for (OperatorId op = 0; op < l.num_operator_ids(); ++op) {
      RETURN_IF_ERROR(manager->Access(op, Stage::kForward));
      RETURN_IF_ERROR(manager->Release(op, Stage::kForward));
    }
    for (OperatorId op = l.num_operator_ids() - 1; op >= 0; --op) {
      RETURN_IF_ERROR(manager->Access(op, Stage::kBackward));
      for (TensorId t : l.op(op).tensors) {
        ASSIGN_OR_RETURN(TensorView v, store->View(ChunkType::kParam, t));
        auto* grad = static_cast<float*>(v.data);  // the slot now holds the gradient
        for (int64_t e = 0; e < v.numel; ++e) grad[e] = 0.1f * std::cos(0.11f * (e + 7 * t + it));
      }
      RETURN_IF_ERROR(manager->Release(op, Stage::kBackward));
    }
    ASSIGN_OR_RETURN(AdamPlacement placement, manager->BeginAdam());
    ScheduledChunkAccess access(*manager, *store, accel, placement);
    ASSIGN_OR_RETURN(AdamStepReport report, adam->Step(access));
    if (report.skipped) return absl::InternalError("a finite step was skipped");
    result.accelerator_chunk_steps += report.accelerator_chunks;
    result.host_chunk_steps += report.host_chunks;
    RETURN_IF_ERROR(manager->EndIteration());
  }

  // A restore pass (what HybridAdam runs after an overflow): the param chunks are written, the
  // masters only read, so nothing of the optimizer state is written back.
  {
    const ChunkManagerCounters before = manager->counters();
    ScheduledChunkAccess access(*manager, *store, accel, AdamPlacement());
    for (int64_t i = 0; i < l.num_data_chunks(); ++i) {
      RETURN_IF_ERROR(access.Acquire(i, AdamChunkUse::kRestore).status());
      RETURN_IF_ERROR(access.Release(i, AdamChunkUse::kRestore));
    }
    const ChunkManagerCounters after = manager->counters().Minus(before);
    result.restore_disk_writes = after.disk_writes;
  }
  result.counters = manager->counters();

  // Read everything back on the host.
  for (ChunkType type : kAllTypes) {
    for (int64_t i = 0; i < l.num_chunks(); ++i) {
      RETURN_IF_ERROR(manager->AccessChunks(i, {&type, 1}, Device::Host(), AccessMode::kRead));
      ASSIGN_OR_RETURN(TensorView v, store->chunk(type, i).PayloadView());
      std::vector<float> copy(static_cast<size_t>(v.numel));
      // Only the tensors' elements are defined; padding between them is not compared.
      for (TensorId t : l.TensorsInChunk(i)) {
        const TensorInfo& info = l.tensor(t);
        std::memcpy(copy.data() + info.offset_elems,
                    static_cast<const float*>(v.data) + info.offset_elems, info.numel * 4);
      }
      result.payloads.push_back(std::move(copy));
      RETURN_IF_ERROR(manager->ReleaseChunks(i, {&type, 1}));
    }
  }
  return result;
}

TEST(ScheduledChunkAccess, StepResultsDoNotDependOnThePlacement) {
  constexpr int kIterations = 4;
  ASSERT_OK_AND_ASSIGN(RunResult roomy, Train(64 * kMiB, kIterations));
  ASSERT_OK_AND_ASSIGN(RunResult tight, Train(kChunkElems * 4 * 3, kIterations));
  // The roomy run kept optimizer state on the accelerator after the warm-up; the tight one could
  // not. Both paths of the adapter ran.
  EXPECT_GT(roomy.accelerator_chunk_steps, 0);
  EXPECT_EQ(tight.accelerator_chunk_steps, 0);
  EXPECT_GT(tight.host_chunk_steps, 0);
  ASSERT_EQ(roomy.payloads.size(), tight.payloads.size());
  for (size_t i = 0; i < roomy.payloads.size(); ++i) {
    ASSERT_EQ(roomy.payloads[i].size(), tight.payloads[i].size());
    EXPECT_EQ(std::memcmp(roomy.payloads[i].data(), tight.payloads[i].data(),
                          roomy.payloads[i].size() * 4),
              0)
        << "payload " << i << " differs between placements";
  }
  // And the optimizer really moved the weights: momentum is non-zero somewhere.
  const size_t chunks = roomy.payloads.size() / 4;
  bool moved = false;
  for (size_t i = 2 * chunks; i < 3 * chunks && !moved; ++i) {
    for (float m : roomy.payloads[i]) moved |= m != 0.0f;
  }
  EXPECT_TRUE(moved);
}

// The optimizer state streamed through the disk tier at its minimum host budget: the same bytes as
// all in RAM, and a restore pass writes no master to disk.
TEST(ScheduledChunkAccess, DiskTierGivesTheSameResults) {
  constexpr int kIterations = 3;
  ASSERT_OK_AND_ASSIGN(RunResult ram, Train(kChunkElems * 4 * 3, kIterations));
  MemoryChunkSwap swap;
  ASSERT_OK_AND_ASSIGN(RunResult disk, Train(kChunkElems * 4 * 3, kIterations, &swap));
  EXPECT_GT(disk.counters.disk_reads, 0);
  EXPECT_GT(disk.counters.disk_writes, 0);
  EXPECT_EQ(disk.restore_disk_writes, 0);
  EXPECT_GT(disk.counters.disk_drops, 0);
  EXPECT_EQ(ram.counters.disk_reads + ram.counters.disk_writes, 0);
  ASSERT_EQ(ram.payloads.size(), disk.payloads.size());
  for (size_t i = 0; i < ram.payloads.size(); ++i) {
    EXPECT_EQ(
        std::memcmp(ram.payloads[i].data(), disk.payloads[i].data(), ram.payloads[i].size() * 4), 0)
        << "payload " << i << " differs with the disk tier";
  }
}

}  // namespace
}  // namespace ps
