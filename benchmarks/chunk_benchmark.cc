// chunk/ benchmarks:
//  - the layout of a 10B-parameter GPT: time and heap to build it (metadata only: it must cost
//    kilobytes, not the ~134 GiB of model data it describes), and the chunk-size search over it;
//  - tensor-state transitions per second (single tensors, and whole operators via ChunkStore);
//  - chunk moves host <-> emulated accelerator in bytes/s, as a fraction of plain memcpy
//    bandwidth measured in the same run.
// Heap use is measured by replacing the global operator new/delete in this binary.
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "absl/status/statusor.h"
#include "base/units.h"
#include "benchmark/benchmark.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_size_search.h"
#include "chunk/chunk_store.h"
#include "chunk/tensor_state.h"
#include "chunk/testing/test_memory_resources.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"

// --- Heap accounting ----------------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
std::atomic<int64_t> g_allocations{0};

void* TrackedAlloc(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) std::abort();
  const int64_t live = g_live_bytes.fetch_add(malloc_usable_size(p), std::memory_order_relaxed) +
                       static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void TrackedFree(void* p) {
  if (p == nullptr) return;
  g_live_bytes.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
  std::free(p);
}
}  // namespace

void* operator new(size_t n) { return TrackedAlloc(n); }
void* operator new[](size_t n) { return TrackedAlloc(n); }
void operator delete(void* p) noexcept { TrackedFree(p); }
void operator delete[](void* p) noexcept { TrackedFree(p); }
void operator delete(void* p, size_t) noexcept { TrackedFree(p); }
void operator delete[](void* p, size_t) noexcept { TrackedFree(p); }

namespace ps {
namespace {

// Peak heap growth while `fn` runs, in bytes.
template <typename Fn>
int64_t PeakHeapGrowth(Fn&& fn) {
  const int64_t start = g_live_bytes.load();
  g_peak_bytes.store(start);
  fn();
  return g_peak_bytes.load() - start;
}

std::vector<OperatorSpec> Ops(const char* preset) {
  absl::StatusOr<GptConfig> config = GptPreset(preset);
  CHECK(config.ok()) << config.status();
  return GptOperators(*config);
}

// The 10B layout at the chunk size the search picks for it (321 Mi elements).
constexpr int64_t k10BChunkElems = 321 * kMiB;

void BM_Layout10B(benchmark::State& state) {
  int64_t peak_bytes = 0;
  int64_t chunks = 0;
  int64_t params = 0;
  for (auto _ : state) {
    peak_bytes = PeakHeapGrowth([&] {
      const std::vector<OperatorSpec> ops = Ops("10B");
      absl::StatusOr<ChunkLayout> layout =
          ChunkLayout::Build({.capacity_elems = k10BChunkElems}, ops);
      CHECK(layout.ok()) << layout.status();
      chunks = layout->num_chunks();
      params = layout->placed_elems();
      benchmark::DoNotOptimize(*layout);
    });
  }
  // Metadata only: a layout that allocated anything near model size would be a bug.
  if (peak_bytes > 64 * kMiB) state.SkipWithError("the layout allocated more than 64 MiB");
  state.counters["params"] = static_cast<double>(params);
  state.counters["chunks"] = static_cast<double>(chunks);
  state.counters["peak_heap_bytes"] = static_cast<double>(peak_bytes);
  // What the layout describes: model data at 14 bytes per chunk element.
  state.counters["model_data_bytes"] = static_cast<double>(chunks * k10BChunkElems * 14);
  state.counters["heap_per_model_byte"] =
      static_cast<double>(peak_bytes) / static_cast<double>(chunks * k10BChunkElems * 14);
}
BENCHMARK(BM_Layout10B)->Unit(benchmark::kMillisecond);

// Runtime chunks over the 10B layout (all RELEASED): still metadata only.
void BM_ChunkStore10B(benchmark::State& state) {
  const std::vector<OperatorSpec> ops = Ops("10B");
  int64_t peak_bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<ChunkLayout> layout =
        ChunkLayout::Build({.capacity_elems = k10BChunkElems}, ops);
    CHECK(layout.ok());
    peak_bytes = PeakHeapGrowth([&] {
      absl::StatusOr<std::unique_ptr<ChunkStore>> store =
          ChunkStore::Create(*std::move(layout), {});
      CHECK(store.ok()) << store.status();
      benchmark::DoNotOptimize(store->get());
    });
  }
  state.counters["peak_heap_bytes"] = static_cast<double>(peak_bytes);
}
BENCHMARK(BM_ChunkStore10B)->Unit(benchmark::kMillisecond);

void BM_ChunkSizeSearch10B(benchmark::State& state) {
  const std::vector<OperatorSpec> ops = Ops("10B");
  const ChunkSizeSearchOptions options{.world_size = static_cast<int>(state.range(0)),
                                       .accelerator_memory_bytes = 80 * kGiB,
                                       .host_memory_bytes = 240 * kGiB};
  int64_t candidates = 0;
  for (auto _ : state) {
    absl::StatusOr<ChunkSizeSearchResult> result = SearchChunkSize(ops, options);
    CHECK(result.ok()) << result.status();
    candidates = static_cast<int64_t>(result->candidates.size());
  }
  state.counters["candidates"] = static_cast<double>(candidates);
  state.SetItemsProcessed(state.iterations() * candidates);  // candidates evaluated per second
}
BENCHMARK(BM_ChunkSizeSearch10B)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond);

// One tensor at a time through a full iteration's cycle:
// HOLD -> COMPUTE -> HOLD_AFTER_FWD -> COMPUTE -> HOLD_AFTER_BWD -> HOLD (5 transitions).
void BM_TensorStateTransitions(benchmark::State& state) {
  const int num_tensors = 64;
  ChunkSpec spec;
  spec.id = ChunkId{ChunkType::kParam, 0};
  spec.dtype = DType::kF16;
  spec.capacity_elems = num_tensors * 1024;
  for (int i = 0; i < num_tensors; ++i) {
    spec.tensors.push_back({i, "t", i * 1024, 1024});
  }
  absl::StatusOr<std::unique_ptr<Chunk>> chunk = Chunk::Create(spec);
  CHECK(chunk.ok());
  TestHostResource host;
  CHECK((*chunk)->AllocatePayload(host).ok());
  for (int i = 0; i < num_tensors; ++i) {
    CHECK((*chunk)->SetTensorState(i, TensorState::kHold).ok());
  }
  const TensorState cycle[] = {TensorState::kCompute, TensorState::kHoldAfterFwd,
                               TensorState::kCompute, TensorState::kHoldAfterBwd,
                               TensorState::kHold};
  for (auto _ : state) {
    for (int i = 0; i < num_tensors; ++i) {
      for (TensorState to : cycle) {
        absl::Status s = (*chunk)->SetTensorState(i, to);
        if (!s.ok()) state.SkipWithError("transition failed");
      }
    }
    benchmark::DoNotOptimize((*chunk)->state());
  }
  state.SetItemsProcessed(state.iterations() * num_tensors * 5);
  CHECK((*chunk)->ReleasePayload().ok());
}
BENCHMARK(BM_TensorStateTransitions);

// Operator-level access/release through ChunkStore over the gpt2 layout (payloads on the host):
// every operator COMPUTE -> HOLD_AFTER_FWD -> COMPUTE -> HOLD_AFTER_BWD -> HOLD.
void BM_OperatorTransitions(benchmark::State& state) {
  TestHostResource host;
  absl::StatusOr<ChunkLayout> layout =
      ChunkLayout::Build({.capacity_elems = 40 * kMiB}, Ops("gpt2"));
  CHECK(layout.ok());
  absl::StatusOr<std::unique_ptr<ChunkStore>> store = ChunkStore::Create(*std::move(layout), {});
  CHECK(store.ok());
  ChunkStore& s = **store;
  for (int64_t i = 0; i < s.num_chunks(); ++i) {
    CHECK(s.chunk(ChunkType::kParam, i).AllocatePayload(host).ok());
  }
  const int64_t num_ops = s.layout().num_operator_ids();
  for (OperatorId op = 0; op < num_ops; ++op) {
    CHECK(s.SetOperatorState(ChunkType::kParam, op, TensorState::kHold).ok());
  }
  const TensorState cycle[] = {TensorState::kCompute, TensorState::kHoldAfterFwd,
                               TensorState::kCompute, TensorState::kHoldAfterBwd,
                               TensorState::kHold};
  for (auto _ : state) {
    for (OperatorId op = 0; op < num_ops; ++op) {
      for (TensorState to : cycle) {
        if (!s.SetOperatorState(ChunkType::kParam, op, to).ok()) {
          state.SkipWithError("transition failed");
        }
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * s.layout().num_tensor_ids() * 5);
  state.counters["operators"] = static_cast<double>(num_ops);
}
BENCHMARK(BM_OperatorTransitions);

// Plain memcpy of the same size: the physical limit for the emulated accelerator's copies.
double MemcpyBytesPerSecond(int64_t bytes) {
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 2);
  const int reps = 8;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    std::memcpy((i % 2 ? a : b).data(), (i % 2 ? b : a).data(), bytes);
    benchmark::ClobberMemory();
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return reps * static_cast<double>(bytes) / elapsed.count();
}

void BM_ChunkMoveHostAccelerator(benchmark::State& state) {
  const int64_t chunk_elems = state.range(0);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateCpuBackend({.capacity_bytes = 4 * chunk_elems * 2 + kMiB});
  CHECK(backend.ok());
  absl::StatusOr<std::unique_ptr<Stream>> stream = (*backend)->CreateStream();
  CHECK(stream.ok());
  TestHostResource host;
  TestDeviceResource device(**backend);
  ChunkSpec spec;
  spec.id = ChunkId{ChunkType::kParam, 0};
  spec.dtype = DType::kF16;
  spec.capacity_elems = chunk_elems;
  absl::StatusOr<std::unique_ptr<Chunk>> chunk = Chunk::Create(spec);
  CHECK(chunk.ok());
  CHECK((*chunk)->AllocatePayload(host).ok());
  std::memset((*chunk)->payload(), 1, (*chunk)->capacity_bytes());
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!(*chunk)->MoveTo(device, **stream).ok() || !(*chunk)->MoveTo(host, **stream).ok()) {
      state.SkipWithError("move failed");
    }
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  const int64_t bytes = 2 * (*chunk)->capacity_bytes();
  state.SetBytesProcessed(state.iterations() * bytes);
  // Each move allocates its destination from a malloc-backed test resource, so fresh pages are
  // faulted in on every copy; memcpy between warm buffers is the ceiling.
  const double memcpy_bw = MemcpyBytesPerSecond((*chunk)->capacity_bytes());
  state.counters["memcpy_bytes_per_second"] = memcpy_bw;
  state.counters["fraction_of_memcpy"] =
      static_cast<double>(state.iterations() * bytes) / elapsed.count() / memcpy_bw;
  CHECK((*chunk)->ReleasePayload().ok());
}
BENCHMARK(BM_ChunkMoveHostAccelerator)
    ->Arg(4 * kMiB)
    ->Arg(32 * kMiB)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ps
