// Allocation throughput of the memory/ pools against malloc/free, in allocate+free pairs per
// second.
//
//   bazel run //benchmarks:allocator_benchmark -- --benchmark_min_time=0.2
//
// Size mixes:
//  - FixedSmall: 4 KiB pairs (a small activation or workspace),
//  - FixedLarge: 8 MiB pairs (a large activation),
//  - RandomMix:  log-uniform sizes from 256 B to 8 MiB, with 64 allocations live at once (each
//                iteration frees the oldest and allocates the next), closer to a training step.
// and chunk payloads: 64 MiB block pairs from the ChunkBlockPool against malloc.
//
// Neither the pools nor malloc touch the memory they hand out here, so this measures bookkeeping
// only (and, for malloc of large sizes, the mmap/munmap system calls the pools avoid).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/random/distributions.h"
#include "base/units.h"
#include "benchmark/benchmark.h"
#include "memory/caching_allocator.h"
#include "memory/chunk_block_pool.h"
#include "memory/resources.h"

namespace ps {
namespace {

constexpr int64_t kFixedSmallBytes = 4 * kKiB;
constexpr int64_t kFixedLargeBytes = 8 * kMiB;
constexpr int64_t kChunkBytes = 64 * kMiB;

struct Malloc {
  void* Allocate(int64_t bytes) { return std::malloc(static_cast<size_t>(bytes)); }
  void Deallocate(void* ptr, int64_t) { std::free(ptr); }
};

struct Caching {
  Caching() : allocator(CachingAllocator::Create(&host).value()) {}
  void* Allocate(int64_t bytes) {
    absl::StatusOr<void*> ptr = allocator->Allocate(bytes);
    return ptr.ok() ? *ptr : nullptr;
  }
  void Deallocate(void* ptr, int64_t bytes) {
    if (!allocator->Deallocate(ptr, bytes).ok()) std::abort();
  }
  HostResource host;
  std::unique_ptr<CachingAllocator> allocator;
};

// One allocate+free pair per iteration with `slots` allocations live: each iteration frees the
// allocation made `slots` iterations ago and makes the next one from `sizes`.
template <typename Allocator>
void RunPairs(benchmark::State& state, Allocator& allocator, const std::vector<int64_t>& sizes,
              int slots) {
  std::vector<std::pair<void*, int64_t>> live(static_cast<size_t>(slots), {nullptr, 0});
  size_t i = 0;
  for (auto _ : state) {
    auto& slot = live[i % live.size()];
    if (slot.first != nullptr) allocator.Deallocate(slot.first, slot.second);
    const int64_t bytes = sizes[i % sizes.size()];
    void* ptr = allocator.Allocate(bytes);
    if (ptr == nullptr) {
      state.SkipWithError("allocation failed");
      break;
    }
    benchmark::DoNotOptimize(ptr);
    slot = {ptr, bytes};
    ++i;
  }
  for (const auto& [ptr, bytes] : live) {
    if (ptr != nullptr) allocator.Deallocate(ptr, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

std::vector<int64_t> RandomMixSizes() {
  std::mt19937 rng(2108);
  std::vector<int64_t> sizes(4096);
  for (int64_t& bytes : sizes) bytes = absl::LogUniform<int64_t>(rng, 256, 8 * kMiB);
  return sizes;
}

template <typename Allocator>
void BM_FixedSmall(benchmark::State& state) {
  Allocator allocator;
  RunPairs(state, allocator, {kFixedSmallBytes}, 1);
}

template <typename Allocator>
void BM_FixedLarge(benchmark::State& state) {
  Allocator allocator;
  RunPairs(state, allocator, {kFixedLargeBytes}, 1);
}

template <typename Allocator>
void BM_RandomMix(benchmark::State& state) {
  Allocator allocator;
  RunPairs(state, allocator, RandomMixSizes(), 64);
}

BENCHMARK_TEMPLATE(BM_FixedSmall, Malloc);
BENCHMARK_TEMPLATE(BM_FixedSmall, Caching);
BENCHMARK_TEMPLATE(BM_FixedLarge, Malloc);
BENCHMARK_TEMPLATE(BM_FixedLarge, Caching);
BENCHMARK_TEMPLATE(BM_RandomMix, Malloc);
BENCHMARK_TEMPLATE(BM_RandomMix, Caching);

// --- Chunk payloads -----------------------------------------------------------------------------

struct Pool {
  Pool() {
    ChunkBlockPoolOptions options;
    options.block_bytes = kChunkBytes;
    pool = ChunkBlockPool::Create(&host, options).value();
  }
  void* Allocate(int64_t) {
    absl::StatusOr<void*> ptr = pool->AllocateBlock();
    return ptr.ok() ? *ptr : nullptr;
  }
  void Deallocate(void* ptr, int64_t) {
    if (!pool->DeallocateBlock(ptr).ok()) std::abort();
  }
  HostResource host;
  std::unique_ptr<ChunkBlockPool> pool;
};

// `state.range(0)` chunks live at once (1: plain pairs).
template <typename Allocator>
void BM_ChunkBlocks(benchmark::State& state) {
  Allocator allocator;
  RunPairs(state, allocator, {kChunkBytes}, static_cast<int>(state.range(0)));
}

BENCHMARK_TEMPLATE(BM_ChunkBlocks, Malloc)->Arg(1)->Arg(8);
BENCHMARK_TEMPLATE(BM_ChunkBlocks, Pool)->Arg(1)->Arg(8);

}  // namespace
}  // namespace ps
