#include "memory/chunk_block_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_tracker.h"
#include "memory/resources.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kBlockBytes = 64 * kKiB;

std::unique_ptr<ChunkBlockPool> MakePool(MemoryResource* upstream, ChunkBlockPoolOptions options) {
  absl::StatusOr<std::unique_ptr<ChunkBlockPool>> pool = ChunkBlockPool::Create(upstream, options);
  EXPECT_OK(pool);
  return std::move(pool).value();
}

ChunkBlockPoolOptions Blocks(int64_t block_bytes) {
  ChunkBlockPoolOptions options;
  options.block_bytes = block_bytes;
  return options;
}

TEST(ChunkBlockPoolTest, CreateRejectsBadOptionsNamingThem) {
  HostResource host;
  EXPECT_THAT(ChunkBlockPool::Create(nullptr, Blocks(kBlockBytes)),
              StatusIs(absl::StatusCode::kInvalidArgument, "upstream"));
  EXPECT_THAT(ChunkBlockPool::Create(&host, Blocks(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, "block_bytes"));
  ChunkBlockPoolOptions options = Blocks(kBlockBytes);
  options.max_blocks = 0;
  EXPECT_THAT(ChunkBlockPool::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_blocks"));
  options = Blocks(kBlockBytes);
  options.max_cached_blocks = -1;
  EXPECT_THAT(ChunkBlockPool::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_cached_blocks"));
  MemoryTracker accelerator_tracker(Device::Accelerator(0));
  options = Blocks(kBlockBytes);
  options.tracker = &accelerator_tracker;
  EXPECT_THAT(ChunkBlockPool::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "tracker"));
}

TEST(ChunkBlockPoolTest, FreedBlocksAreReusedMostRecentFirst) {
  HostResource host;
  auto pool = MakePool(&host, Blocks(kBlockBytes));
  EXPECT_EQ(pool->block_bytes(), kBlockBytes);
  EXPECT_EQ(pool->device(), Device::Host());
  EXPECT_EQ(pool->name(), "chunk_block_pool(host)");
  ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
  EXPECT_NE(a, b);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kAllocationAlignment, 0u);
  ASSERT_OK(pool->DeallocateBlock(a));
  ASSERT_OK(pool->DeallocateBlock(b));
  EXPECT_EQ(pool->stats().cached_blocks, 2);
  EXPECT_EQ(host.stats().live_allocations, 2);  // cached blocks stay with the pool
  EXPECT_THAT(pool->AllocateBlock(), IsOkAndHolds(b));
  EXPECT_THAT(pool->AllocateBlock(), IsOkAndHolds(a));
  const ChunkBlockPoolStats stats = pool->stats();
  EXPECT_EQ(stats.upstream_allocations, 2);
  EXPECT_EQ(stats.cache_hits, 2);
  EXPECT_EQ(stats.block_allocations, 4);
  EXPECT_EQ(stats.blocks_in_use, 2);
  EXPECT_EQ(stats.in_use_bytes(), 2 * kBlockBytes);
  ASSERT_OK(pool->DeallocateBlock(a));
  ASSERT_OK(pool->DeallocateBlock(b));
}

TEST(ChunkBlockPoolTest, MaxBlocksIsResourceExhaustedNamingTheLimit) {
  HostResource host;
  ChunkBlockPoolOptions options = Blocks(kBlockBytes);
  options.max_blocks = 2;
  auto pool = MakePool(&host, options);
  ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
  EXPECT_THAT(pool->AllocateBlock(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host"), HasSubstr("max_blocks = 2"), HasSubstr("64.00 KiB"),
                             HasSubstr("128.00 KiB"))));
  ASSERT_OK(pool->DeallocateBlock(a));
  EXPECT_THAT(pool->AllocateBlock(), IsOkAndHolds(a));
  ASSERT_OK(pool->DeallocateBlock(a));
  ASSERT_OK(pool->DeallocateBlock(b));
}

TEST(ChunkBlockPoolTest, UpstreamExhaustionNamesThePoolAndCarriesTheReason) {
  HostResource host(3 * kBlockBytes);
  auto pool = MakePool(&host, Blocks(kBlockBytes));
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(void* block, pool->AllocateBlock());
    blocks.push_back(block);
  }
  EXPECT_THAT(pool->AllocateBlock(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("chunk_block_pool(host)"), HasSubstr("3 blocks are in use"),
                             HasSubstr("192.00 KiB capacity"))));
  for (void* block : blocks) ASSERT_OK(pool->DeallocateBlock(block));
}

TEST(ChunkBlockPoolTest, MaxCachedBlocksSendsTheRestUpstream) {
  HostResource host;
  ChunkBlockPoolOptions options = Blocks(kBlockBytes);
  options.max_cached_blocks = 1;
  auto pool = MakePool(&host, options);
  ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
  ASSERT_OK(pool->DeallocateBlock(a));
  ASSERT_OK(pool->DeallocateBlock(b));
  EXPECT_EQ(pool->stats().cached_blocks, 1);
  EXPECT_EQ(pool->stats().upstream_deallocations, 1);
  EXPECT_EQ(host.stats().live_allocations, 1);
}

TEST(ChunkBlockPoolTest, MemoryResourceInterfaceServesUpToOneBlock) {
  HostResource host;
  auto pool = MakePool(&host, Blocks(kBlockBytes));
  EXPECT_THAT(pool->Allocate(kBlockBytes + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "caching allocator"));
  EXPECT_THAT(pool->Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(void* small, pool->Allocate(100));
  EXPECT_EQ(pool->stats().blocks_in_use, 1);
  EXPECT_THAT(pool->Deallocate(small, kBlockBytes + 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(pool->stats().blocks_in_use, 1);
  ASSERT_OK(pool->Deallocate(small, 100));
  EXPECT_EQ(pool->stats().blocks_in_use, 0);
}

TEST(ChunkBlockPoolTest, BadFreesAreInvalidArgumentAndChangeNothing) {
  HostResource host;
  auto pool = MakePool(&host, Blocks(kBlockBytes));
  ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
  ASSERT_OK(pool->DeallocateBlock(b));
  const ChunkBlockPoolStats before = pool->stats();
  int on_stack = 0;
  EXPECT_THAT(pool->DeallocateBlock(&on_stack),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a block in use"));
  EXPECT_THAT(pool->DeallocateBlock(b), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(pool->DeallocateBlock(static_cast<char*>(a) + 256),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const ChunkBlockPoolStats after = pool->stats();
  EXPECT_EQ(after.blocks_in_use, before.blocks_in_use);
  EXPECT_EQ(after.cached_blocks, before.cached_blocks);
  ASSERT_OK(pool->DeallocateBlock(a));
}

TEST(ChunkBlockPoolTest, ReleaseCachedReturnsCachedBlocksOnly) {
  HostResource host;
  auto pool = MakePool(&host, Blocks(kBlockBytes));
  ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* c, pool->AllocateBlock());
  ASSERT_OK(pool->DeallocateBlock(a));
  ASSERT_OK(pool->DeallocateBlock(b));
  EXPECT_EQ(pool->ReleaseCached(), 2 * kBlockBytes);
  EXPECT_EQ(pool->ReleaseCached(), 0);
  EXPECT_EQ(host.in_use_bytes(), kBlockBytes);
  EXPECT_EQ(pool->stats().blocks_in_use, 1);
  EXPECT_EQ(pool->stats().cached_blocks, 0);
  ASSERT_OK(pool->DeallocateBlock(c));
}

TEST(ChunkBlockPoolTest, TrackerSeesBlocksInUseNotCachedOnes) {
  HostResource host;
  MemoryTracker tracker(Device::Host());
  ChunkBlockPoolOptions options = Blocks(kBlockBytes);
  options.tracker = &tracker;
  auto pool = MakePool(&host, options);
  ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
  ASSERT_OK_AND_ASSIGN(void* b, pool->AllocateBlock());
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kModelData), 2 * kBlockBytes);
  ASSERT_OK(pool->DeallocateBlock(a));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kModelData), kBlockBytes);
  EXPECT_EQ(tracker.peak_bytes(MemoryKind::kModelData), 2 * kBlockBytes);
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 0);
  ASSERT_OK(pool->DeallocateBlock(b));
  EXPECT_EQ(tracker.total_bytes(), 0);
}

TEST(ChunkBlockPoolTest, DestructionReturnsEverythingUpstream) {
  HostResource host;
  MemoryTracker tracker(Device::Host());
  {
    ChunkBlockPoolOptions options = Blocks(kBlockBytes);
    options.tracker = &tracker;
    auto pool = MakePool(&host, options);
    ASSERT_OK_AND_ASSIGN(void* a, pool->AllocateBlock());
    ASSERT_OK(pool->AllocateBlock().status());  // still in use at destruction
    ASSERT_OK(pool->DeallocateBlock(a));
  }
  EXPECT_EQ(host.in_use_bytes(), 0);
  EXPECT_EQ(tracker.total_bytes(), 0);
}

// Two pools share one capped upstream; the second gets the blocks the first has cached.
TEST(ChunkBlockPoolTest, ReclaimingUpstreamTakesAnotherPoolsCache) {
  HostResource host(4 * kBlockBytes);
  auto first = MakePool(&host, Blocks(kBlockBytes));
  auto second = MakePool(&host, Blocks(kBlockBytes));
  host.AddReclaimer(first.get(), first->name());
  host.AddReclaimer(second.get(), second->name());
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(void* block, first->AllocateBlock());
    blocks.push_back(block);
  }
  for (void* block : blocks) ASSERT_OK(first->DeallocateBlock(block));
  EXPECT_EQ(first->stats().cached_blocks, 4);
  ASSERT_OK_AND_ASSIGN(void* taken, second->AllocateBlock());
  EXPECT_EQ(first->stats().cached_blocks, 0);
  EXPECT_EQ(host.stats().reclaim_rounds, 1);
  EXPECT_EQ(host.stats().reclaimed_bytes, 4 * kBlockBytes);
  ASSERT_OK(second->DeallocateBlock(taken));
  host.RemoveReclaimer(first.get());
  host.RemoveReclaimer(second.get());
}

// Random allocate / free / release / reset sequences against a model of the pool; every counter,
// the tracker and the upstream are compared after every step, and blocks served from the cache must
// be exactly the ones the model predicts (most recently freed first).
TEST(ChunkBlockPoolTest, RandomSequenceMatchesModel) {
  constexpr int64_t kBytes = 4 * kKiB;
  constexpr int64_t kUpstreamBlocks = 12;
  HostResource host(kUpstreamBlocks * kBytes);
  MemoryTracker tracker(Device::Host());
  ChunkBlockPoolOptions options = Blocks(kBytes);
  options.max_blocks = 10;
  options.max_cached_blocks = 4;
  options.tracker = &tracker;
  auto pool = MakePool(&host, options);

  std::vector<void*> in_use;
  std::vector<void*> cache;  // most recently freed last
  ChunkBlockPoolStats model;
  model.block_bytes = kBytes;
  std::mt19937 rng(42);
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 50) {
      absl::StatusOr<void*> block = pool->AllocateBlock();
      if (!cache.empty()) {
        ASSERT_THAT(block, IsOkAndHolds(cache.back())) << "step " << step;
        cache.pop_back();
        ++model.cache_hits;
      } else if (static_cast<int64_t>(in_use.size()) >= *options.max_blocks) {
        ASSERT_THAT(block, StatusIs(absl::StatusCode::kResourceExhausted)) << "step " << step;
      } else {
        ASSERT_OK(block) << "step " << step;
        ASSERT_EQ(std::count(in_use.begin(), in_use.end(), *block), 0);
        ++model.upstream_allocations;
      }
      if (block.ok()) {
        std::memset(*block, step & 0xff, kBytes);
        in_use.push_back(*block);
        ++model.block_allocations;
      }
    } else if (op < 90) {
      if (in_use.empty()) continue;
      const size_t i = rng() % in_use.size();
      void* block = in_use[i];
      in_use.erase(in_use.begin() + static_cast<std::ptrdiff_t>(i));
      ASSERT_OK(pool->DeallocateBlock(block)) << "step " << step;
      ASSERT_THAT(pool->DeallocateBlock(block), StatusIs(absl::StatusCode::kInvalidArgument));
      if (static_cast<int64_t>(cache.size()) < *options.max_cached_blocks) {
        cache.push_back(block);
      } else {
        ++model.upstream_deallocations;
      }
    } else if (op < 95) {
      ASSERT_EQ(pool->ReleaseCached(), static_cast<int64_t>(cache.size()) * kBytes);
      model.upstream_deallocations += static_cast<int64_t>(cache.size());
      cache.clear();
    } else {
      pool->ResetPeakStats();
      model.peak_blocks_in_use = static_cast<int64_t>(in_use.size());
    }
    model.blocks_in_use = static_cast<int64_t>(in_use.size());
    model.cached_blocks = static_cast<int64_t>(cache.size());
    model.peak_blocks_in_use = std::max(model.peak_blocks_in_use, model.blocks_in_use);

    const ChunkBlockPoolStats stats = pool->stats();
    ASSERT_EQ(stats.blocks_in_use, model.blocks_in_use) << "step " << step;
    ASSERT_EQ(stats.cached_blocks, model.cached_blocks) << "step " << step;
    ASSERT_EQ(stats.peak_blocks_in_use, model.peak_blocks_in_use) << "step " << step;
    ASSERT_EQ(stats.block_allocations, model.block_allocations) << "step " << step;
    ASSERT_EQ(stats.cache_hits, model.cache_hits) << "step " << step;
    ASSERT_EQ(stats.upstream_allocations, model.upstream_allocations) << "step " << step;
    ASSERT_EQ(stats.upstream_deallocations, model.upstream_deallocations) << "step " << step;
    ASSERT_EQ(tracker.current_bytes(MemoryKind::kModelData), model.blocks_in_use * kBytes);
    ASSERT_EQ(host.in_use_bytes(), (model.blocks_in_use + model.cached_blocks) * kBytes);
  }
  for (void* block : in_use) ASSERT_OK(pool->DeallocateBlock(block));
}

TEST(ChunkBlockPoolTest, ConcurrentUseKeepsBlocksPrivate) {
  constexpr int kThreads = 4;
  constexpr int kIters = 2000;
  constexpr int64_t kBytes = 4 * kKiB;
  HostResource host;
  MemoryTracker tracker(Device::Host());
  ChunkBlockPoolOptions options = Blocks(kBytes);
  options.max_blocks = 3 * kThreads;
  options.tracker = &tracker;
  auto pool = MakePool(&host, options);
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<void*> mine;
      for (int i = 0; i < kIters; ++i) {
        if (mine.size() < 3 && rng() % 2 == 0) {
          absl::StatusOr<void*> block = pool->AllocateBlock();
          if (!block.ok()) {
            ++failures[t];
            continue;
          }
          std::memset(*block, t, kBytes);
          mine.push_back(*block);
        } else if (!mine.empty()) {
          void* block = mine.back();
          mine.pop_back();
          const auto* bytes = static_cast<const unsigned char*>(block);
          if (bytes[0] != t || bytes[kBytes - 1] != t) ++failures[t];
          if (!pool->DeallocateBlock(block).ok()) ++failures[t];
        }
        if (i % 50 == 0) pool->ReleaseCached();
      }
      for (void* block : mine) {
        if (!pool->DeallocateBlock(block).ok()) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  const ChunkBlockPoolStats stats = pool->stats();
  EXPECT_EQ(stats.blocks_in_use, 0);
  EXPECT_LE(stats.peak_blocks_in_use, 3 * kThreads);
  EXPECT_EQ(tracker.total_bytes(), 0);
  EXPECT_EQ(host.in_use_bytes(), stats.cached_bytes());
}

}  // namespace
}  // namespace ps
