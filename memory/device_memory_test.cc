#include "memory/device_memory.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<Backend> MakeCpuBackend(int64_t capacity_bytes) {
  CpuBackendOptions options;
  options.capacity_bytes = capacity_bytes;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(options);
  EXPECT_OK(backend);
  return std::move(backend).value();
}

DeviceMemoryOptions ChunkBytes(int64_t chunk_block_bytes) {
  DeviceMemoryOptions options;
  options.chunk_block_bytes = chunk_block_bytes;
  return options;
}

TEST(DeviceMemoryTest, AcceleratorMemoryIsAssembledOverTheBackend) {
  auto backend = MakeCpuBackend(16 * kMiB);
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), ChunkBytes(kMiB)));
  EXPECT_EQ(memory->device(), Device::Accelerator(0));
  EXPECT_EQ(memory->chunk_block_bytes(), kMiB);
  EXPECT_EQ(memory->capacity_bytes(), 16 * kMiB);
  EXPECT_EQ(memory->chunk_pool()->device(), Device::Accelerator(0));
  EXPECT_EQ(memory->scratch()->device(), Device::Accelerator(0));
  EXPECT_EQ(memory->tracker()->device(), Device::Accelerator(0));
  EXPECT_EQ(memory->upstream()->name(), "backend_device_resource(accelerator:0)");

  ASSERT_OK_AND_ASSIGN(void* block, memory->chunk_pool()->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* activation, memory->scratch()->Allocate(100 * kKiB));
  EXPECT_EQ(backend->allocated_bytes(), kMiB + 2 * kMiB);  // one block, one small segment
  const MemoryTrackerSnapshot usage = memory->tracker()->Snapshot();
  EXPECT_EQ(usage.model_bytes, kMiB);
  EXPECT_EQ(usage.non_model_bytes, 100 * kKiB);

  const std::string debug = memory->DebugString();
  EXPECT_THAT(debug, AllOf(HasSubstr("accelerator:0"), HasSubstr("16.00 MiB"),
                           HasSubstr("1 in use, 0 cached"), HasSubstr("non-model 100.00 KiB")));

  ASSERT_OK(memory->chunk_pool()->DeallocateBlock(block));
  ASSERT_OK(memory->scratch()->Deallocate(activation, 100 * kKiB));
  // Cached, not in use: the tracker sees nothing, the device still holds it until released.
  EXPECT_EQ(memory->tracker()->total_bytes(), 0);
  EXPECT_EQ(backend->allocated_bytes(), 3 * kMiB);
  EXPECT_EQ(memory->ReleaseCached(), 3 * kMiB);
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

TEST(DeviceMemoryTest, InvalidOptionsAreInvalidArgumentNamingTheField) {
  auto backend = MakeCpuBackend(8 * kMiB);
  EXPECT_THAT(CreateAcceleratorMemory(nullptr, ChunkBytes(kMiB)),
              StatusIs(absl::StatusCode::kInvalidArgument, "backend"));
  EXPECT_THAT(CreateAcceleratorMemory(backend.get(), ChunkBytes(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_block_bytes"));
  DeviceMemoryOptions options = ChunkBytes(kMiB);
  options.max_chunk_blocks = 0;
  EXPECT_THAT(CreateAcceleratorMemory(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_chunk_blocks"));
  options = ChunkBytes(kMiB);
  options.capacity_bytes = -1;
  EXPECT_THAT(CreateAcceleratorMemory(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, "capacity_bytes"));
  options.capacity_bytes = 9 * kMiB;
  EXPECT_THAT(CreateAcceleratorMemory(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("capacity_bytes"), HasSubstr("8.00 MiB"))));
  EXPECT_THAT(CreateAcceleratorMemory(backend.get(), ChunkBytes(9 * kMiB)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("chunk_block_bytes"), HasSubstr("does not fit"))));
  options = ChunkBytes(kMiB);
  options.scratch.round_bytes = 100;
  EXPECT_THAT(CreateAcceleratorMemory(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("DeviceMemoryOptions.scratch"), HasSubstr("round_bytes"))));
  EXPECT_THAT(CreateHostMemory(nullptr, ChunkBytes(kMiB)),
              StatusIs(absl::StatusCode::kInvalidArgument, "pinned"));
  options = ChunkBytes(2 * kMiB);
  options.pinned = false;
  options.capacity_bytes = kMiB;
  EXPECT_THAT(CreateHostMemory(nullptr, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_block_bytes"));
}

TEST(DeviceMemoryTest, HostMemoryPinnedOrPageable) {
  auto backend = MakeCpuBackend(kMiB);
  DeviceMemoryOptions options = ChunkBytes(256 * kKiB);
  ASSERT_OK_AND_ASSIGN(auto pinned, CreateHostMemory(backend.get(), options));
  EXPECT_EQ(pinned->device(), Device::Host());
  EXPECT_EQ(pinned->upstream()->name(), "pinned_host_resource(host)");
  EXPECT_EQ(pinned->capacity_bytes(), std::nullopt);
  ASSERT_OK_AND_ASSIGN(void* block, pinned->chunk_pool()->AllocateBlock());
  std::memset(block, 7, 256 * kKiB);
  EXPECT_EQ(backend->allocated_bytes(), 0);
  ASSERT_OK(pinned->chunk_pool()->DeallocateBlock(block));

  options.pinned = false;
  options.capacity_bytes = kMiB;
  ASSERT_OK_AND_ASSIGN(auto pageable, CreateHostMemory(nullptr, options));
  EXPECT_EQ(pageable->upstream()->name(), "host_resource(host)");
  EXPECT_EQ(pageable->capacity_bytes(), kMiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(void* b, pageable->chunk_pool()->AllocateBlock());
    blocks.push_back(b);
  }
  EXPECT_THAT(pageable->chunk_pool()->AllocateBlock(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host"), HasSubstr("1.00 MiB capacity"))));
  for (void* b : blocks) ASSERT_OK(pageable->chunk_pool()->DeallocateBlock(b));
}

// The two pools share one capped device: each gets the memory the other has cached.
TEST(DeviceMemoryTest, PoolsTakeWhatTheOtherHasCachedUnderPressure) {
  auto backend = MakeCpuBackend(8 * kMiB);
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), ChunkBytes(kMiB)));
  ChunkBlockPool* pool = memory->chunk_pool();
  CachingAllocator* scratch = memory->scratch();

  // Forward pass: activations take 6 MiB of segments, then are freed; the segments stay cached.
  std::vector<void*> activations;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(void* a, scratch->Allocate(2 * kMiB));
    activations.push_back(a);
  }
  for (void* a : activations) ASSERT_OK(scratch->Deallocate(a, 2 * kMiB));
  EXPECT_EQ(scratch->stats().reserved_bytes, 6 * kMiB);

  // The chunk pool now needs the whole device: the caching allocator's cache is reclaimed.
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
    blocks.push_back(b);
  }
  EXPECT_EQ(scratch->stats().reserved_bytes, 0);
  EXPECT_GE(memory->upstream()->stats().reclaim_rounds, 1);
  EXPECT_EQ(memory->tracker()->current_bytes(MemoryKind::kModelData), 8 * kMiB);

  // Chunks are evicted (blocks cached), and the next activation peak gets their memory back.
  for (void* b : blocks) ASSERT_OK(pool->DeallocateBlock(b));
  EXPECT_EQ(pool->stats().cached_blocks, 8);
  ASSERT_OK_AND_ASSIGN(void* big, scratch->Allocate(6 * kMiB));
  EXPECT_EQ(pool->stats().cached_blocks, 0);
  EXPECT_EQ(backend->allocated_bytes(), 6 * kMiB);

  // A request that cannot fit even after both caches are empty is ResourceExhausted, and the
  // message says what each pool released.
  ASSERT_OK_AND_ASSIGN(void* b0, pool->AllocateBlock());
  ASSERT_OK(pool->DeallocateBlock(b0));  // one block cached
  EXPECT_THAT(scratch->Allocate(3 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("accelerator:0"), HasSubstr("3.00 MiB"),
                             HasSubstr("8.00 MiB capacity"),
                             HasSubstr("chunk_block_pool(accelerator:0) 1.00 MiB"),
                             HasSubstr("caching_allocator(accelerator:0) 0 B"))));
  EXPECT_EQ(memory->tracker()->current_bytes(MemoryKind::kNonModelData), 6 * kMiB);
  ASSERT_OK(scratch->Deallocate(big, 6 * kMiB));
}

// How the scheduler reads the tide: the peak of non-model data between two moments.
TEST(DeviceMemoryTest, TrackerShowsTheNonModelTideBetweenMoments) {
  auto backend = MakeCpuBackend(64 * kMiB);
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), ChunkBytes(kMiB)));
  MemoryTracker* tracker = memory->tracker();
  ASSERT_OK_AND_ASSIGN(void* chunk, memory->chunk_pool()->AllocateBlock());
  std::vector<std::pair<void*, int64_t>> activations;
  std::vector<int64_t> peaks;
  (void)tracker->SnapshotAndResetPeaks();
  // Forward: each operator leaves an activation and uses a temporary workspace.
  for (int op = 1; op <= 4; ++op) {
    ASSERT_OK_AND_ASSIGN(void* workspace, memory->scratch()->Allocate(op * 512 * kKiB));
    ASSERT_OK_AND_ASSIGN(void* activation, memory->scratch()->Allocate(256 * kKiB));
    activations.emplace_back(activation, 256 * kKiB);
    ASSERT_OK(memory->scratch()->Deallocate(workspace, op * 512 * kKiB));
    peaks.push_back(tracker->SnapshotAndResetPeaks().peak_non_model_bytes);
  }
  // Backward: activations are freed in reverse.
  while (!activations.empty()) {
    ASSERT_OK(memory->scratch()->Deallocate(activations.back().first, activations.back().second));
    activations.pop_back();
    peaks.push_back(tracker->SnapshotAndResetPeaks().peak_non_model_bytes);
  }
  // Each forward moment's peak is the activations so far plus that operator's workspace (large
  // workspaces are whole 2 MiB-multiple blocks when their tail is too small to split).
  const int64_t kA = 256 * kKiB;
  EXPECT_EQ(peaks[0], kA + 512 * kKiB);
  EXPECT_EQ(peaks[1], 2 * kA + 1024 * kKiB);
  EXPECT_EQ(peaks[2], 3 * kA + 2 * kMiB);
  EXPECT_EQ(peaks[3], 4 * kA + 2 * kMiB);
  // A backward moment's peak is what was live at its start.
  EXPECT_EQ(peaks[4], 4 * kA);
  EXPECT_EQ(peaks[7], kA);
  EXPECT_EQ(tracker->current_bytes(MemoryKind::kNonModelData), 0);
  EXPECT_EQ(tracker->peak_bytes(MemoryKind::kModelData), kMiB);
  ASSERT_OK(memory->chunk_pool()->DeallocateBlock(chunk));
}

// Both pools hammered from several threads on a device too small for all of them at once: every
// reclaim crosses from one pool into the other (lock order is checked under --config=tsan).
TEST(DeviceMemoryTest, ConcurrentPoolsOnASmallDevice) {
  constexpr int kThreads = 4;
  constexpr int64_t kBlockBytes = 64 * kKiB;
  auto backend = MakeCpuBackend(2 * kMiB);
  DeviceMemoryOptions options = ChunkBytes(kBlockBytes);
  options.scratch.small_segment_bytes = 256 * kKiB;
  options.scratch.small_request_max_bytes = 64 * kKiB;
  options.scratch.large_segment_round_bytes = 128 * kKiB;
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), options));
  std::vector<int> errors(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(7 * t + 1);
      std::vector<void*> blocks;
      std::vector<std::pair<void*, int64_t>> buffers;
      for (int i = 0; i < 300; ++i) {
        const int op = static_cast<int>(rng() % 4);
        if (op == 0 && blocks.size() < 4) {
          absl::StatusOr<void*> b = memory->chunk_pool()->AllocateBlock();
          if (b.ok()) {
            blocks.push_back(*b);
          } else if (!absl::IsResourceExhausted(b.status())) {
            ++errors[t];
          }
        } else if (op == 1 && buffers.size() < 4) {
          const int64_t bytes = 1 + static_cast<int64_t>(rng() % (200 * kKiB));
          absl::StatusOr<void*> p = memory->scratch()->Allocate(bytes);
          if (p.ok()) {
            buffers.emplace_back(*p, bytes);
          } else if (!absl::IsResourceExhausted(p.status())) {
            ++errors[t];
          }
        } else if (op == 2 && !blocks.empty()) {
          if (!memory->chunk_pool()->DeallocateBlock(blocks.back()).ok()) ++errors[t];
          blocks.pop_back();
        } else if (op == 3 && !buffers.empty()) {
          if (!memory->scratch()->Deallocate(buffers.back().first, buffers.back().second).ok()) {
            ++errors[t];
          }
          buffers.pop_back();
        }
        if (i % 64 == 0) (void)memory->stats();
      }
      for (void* b : blocks) {
        if (!memory->chunk_pool()->DeallocateBlock(b).ok()) ++errors[t];
      }
      for (const auto& [p, bytes] : buffers) {
        if (!memory->scratch()->Deallocate(p, bytes).ok()) ++errors[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], 0) << "thread " << t;
  EXPECT_EQ(memory->tracker()->total_bytes(), 0);
  EXPECT_LE(memory->tracker()->Snapshot().peak_total_bytes, 2 * kMiB);
  memory->ReleaseCached();
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

TEST(DeviceMemoryTest, ChunkPoolsPerBlockSizeGiveA16BitChunkA16BitBlock) {
  // f32 state chunks of 1 MiB and bf16 param chunks of 512 KiB (the same element capacity).
  auto backend = MakeCpuBackend(16 * kMiB);
  DeviceMemoryOptions options = ChunkBytes(kMiB);
  options.more_chunk_block_bytes = {kMiB / 2};
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), options));
  ASSERT_EQ(memory->chunk_pools().size(), 2u);
  EXPECT_EQ(memory->chunk_pools()[0]->block_bytes(), kMiB / 2);
  EXPECT_EQ(memory->chunk_pools()[1]->block_bytes(), kMiB);
  EXPECT_EQ(memory->chunk_pool()->block_bytes(), kMiB);
  EXPECT_EQ(memory->chunk_pool_for(kMiB / 2)->block_bytes(), kMiB / 2);
  EXPECT_EQ(memory->chunk_pool_for(100)->block_bytes(), kMiB / 2);
  EXPECT_EQ(memory->chunk_pool_for(kMiB / 2 + 1)->block_bytes(), kMiB);
  EXPECT_EQ(memory->chunk_pool_for(kMiB + 1), nullptr);

  ASSERT_OK_AND_ASSIGN(void* half, memory->chunk_pool_for(kMiB / 2)->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* full, memory->chunk_pool_for(kMiB)->AllocateBlock());
  EXPECT_EQ(backend->allocated_bytes(), kMiB + kMiB / 2);
  EXPECT_EQ(memory->tracker()->Snapshot().model_bytes, kMiB + kMiB / 2);
  const DeviceMemoryStats stats = memory->stats();
  ASSERT_EQ(stats.chunk_pools.size(), 2u);
  EXPECT_EQ(stats.chunk_pools[0].blocks_in_use, 1);
  EXPECT_EQ(stats.chunk_pools[1].blocks_in_use, 1);
  EXPECT_THAT(memory->DebugString(), AllOf(HasSubstr("chunk blocks of 512.00 KiB: 1 in use"),
                                           HasSubstr("chunk blocks of 1.00 MiB: 1 in use")));
  ASSERT_OK(memory->chunk_pool_for(kMiB / 2)->DeallocateBlock(half));
  ASSERT_OK(memory->chunk_pool_for(kMiB)->DeallocateBlock(full));
  // Both pools' caches go back to the device.
  EXPECT_EQ(memory->ReleaseCached(), kMiB + kMiB / 2);
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

TEST(DeviceMemoryTest, ChunkPoolsUnderPressureGiveTheirCachesToEachOther) {
  // 2 MiB: a cached 512 KiB block must go back for the 1 MiB pool to get its second block.
  auto backend = MakeCpuBackend(2 * kMiB);
  DeviceMemoryOptions options = ChunkBytes(kMiB);
  options.more_chunk_block_bytes = {kMiB / 2};
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), options));
  ChunkBlockPool* small = memory->chunk_pool_for(kMiB / 2);
  ASSERT_OK_AND_ASSIGN(void* a, small->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, small->AllocateBlock());
  ASSERT_OK(small->DeallocateBlock(a));
  ASSERT_OK(small->DeallocateBlock(b));
  ASSERT_OK_AND_ASSIGN(void* c, memory->chunk_pool()->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* d, memory->chunk_pool()->AllocateBlock());
  EXPECT_EQ(backend->allocated_bytes(), 2 * kMiB);
  EXPECT_EQ(small->stats().cached_blocks, 0);
  ASSERT_OK(memory->chunk_pool()->DeallocateBlock(c));
  ASSERT_OK(memory->chunk_pool()->DeallocateBlock(d));
}

TEST(DeviceMemoryTest, MoreChunkBlockBytesAreCheckedNamingTheField) {
  auto backend = MakeCpuBackend(8 * kMiB);
  for (const std::vector<int64_t>& more :
       std::vector<std::vector<int64_t>>{{0}, {-4}, {kMiB}, {kKiB, kKiB}, {16 * kMiB}}) {
    DeviceMemoryOptions options = ChunkBytes(kMiB);
    options.more_chunk_block_bytes = more;
    EXPECT_THAT(CreateAcceleratorMemory(backend.get(), options),
                StatusIs(absl::StatusCode::kInvalidArgument, "more_chunk_block_bytes"));
  }
}

TEST(DeviceMemoryTest, DestructionReturnsEverythingToTheBackend) {
  auto backend = MakeCpuBackend(16 * kMiB);
  {
    ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(backend.get(), ChunkBytes(kMiB)));
    ASSERT_OK_AND_ASSIGN(void* block, memory->chunk_pool()->AllocateBlock());
    ASSERT_OK(memory->chunk_pool()->DeallocateBlock(block));
    ASSERT_OK(memory->scratch()->Allocate(3 * kMiB).status());  // leaked by the caller
  }
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

}  // namespace
}  // namespace ps
