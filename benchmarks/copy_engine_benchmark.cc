// Copy-engine bandwidth of the emulated accelerator (cpu backend) against plain memcpy.
//
// The emulated device is host RAM, so the physical limit of a host<->device copy here is memcpy's
// bandwidth on this machine. Each copy benchmark reports bytes/s and `of_memcpy`, its fraction of
// the memcpy bandwidth measured for the same size in this same run. The overhead the copy engine
// adds over memcpy is its queueing and thread hand-off per operation, visible at small sizes.
//
//   bazel run //benchmarks:copy_engine_benchmark -- --benchmark_min_time=0.2
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "base/check.h"
#include "base/units.h"
#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"

namespace ps {
namespace {

// memcpy bandwidth (bytes/s) for `bytes`, measured once per size: best of several repetitions.
double MemcpyBandwidth(int64_t bytes) {
  static std::map<int64_t, double>* cache = new std::map<int64_t, double>();
  if (auto it = cache->find(bytes); it != cache->end()) return it->second;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // fault pages in
  const int reps = static_cast<int>(std::max<int64_t>(3, (int64_t{1} << 30) / bytes));
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      std::memcpy(dst.data(), src.data(), bytes);
      benchmark::ClobberMemory();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) * reps / s);
  }
  (*cache)[bytes] = best;
  return best;
}

// Sets `of_memcpy`: this benchmark's bandwidth over memcpy's for `bytes_per_op`-sized copies.
void ReportFractionOfMemcpy(benchmark::State& state, int64_t bytes_per_op, int64_t ops,
                            std::chrono::steady_clock::time_point start) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double achieved = static_cast<double>(bytes_per_op) * static_cast<double>(ops) / seconds;
  state.counters["of_memcpy"] = achieved / MemcpyBandwidth(bytes_per_op);
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void CopyEngine(benchmark::State& state, CopyKind kind) {
  const int64_t bytes = state.range(0);
  auto backend = CreateCpuBackend({.capacity_bytes = 4 * bytes + kMiB});
  CHECK(backend.ok()) << backend.status();
  auto device = (*backend)->AllocateDevice(bytes);
  auto device2 = (*backend)->AllocateDevice(bytes);
  auto host = (*backend)->AllocatePinnedHost(bytes);
  CHECK(device.ok() && device2.ok() && host.ok());
  std::memset(*host, 1, bytes);
  std::memset(*device, 2, bytes);
  std::memset(*device2, 3, bytes);
  auto stream = (*backend)->CreateStream();
  CHECK(stream.ok());
  void* dst = kind == CopyKind::kHostToDevice ? *device : (kind == CopyKind::kDeviceToHost ? *host : *device2);
  const void* src = kind == CopyKind::kHostToDevice ? *host : *device;
  MemcpyBandwidth(bytes);  // measure the reference outside the timed loop
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    PS_CHECK_OK((*stream)->MemcpyAsync(dst, src, bytes, kind));
    PS_CHECK_OK((*stream)->Synchronize());
  }
  ReportFractionOfMemcpy(state, bytes, state.iterations(), start);
  state.SetBytesProcessed(state.iterations() * bytes);
  PS_CHECK_OK((*backend)->FreeDevice(*device));
  PS_CHECK_OK((*backend)->FreeDevice(*device2));
  PS_CHECK_OK((*backend)->FreePinnedHost(*host));
}

// Many small copies queued back to back, one synchronize: the engine's per-operation overhead
// amortized as a real prefetch queue would see it.
void BM_CopyEngineQueued(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  constexpr int kQueued = 64;
  auto backend = CreateCpuBackend({.capacity_bytes = 2 * bytes + kMiB});
  CHECK(backend.ok());
  auto device = (*backend)->AllocateDevice(bytes);
  auto host = (*backend)->AllocatePinnedHost(bytes);
  CHECK(device.ok() && host.ok());
  std::memset(*host, 1, bytes);
  auto stream = (*backend)->CreateStream();
  CHECK(stream.ok());
  MemcpyBandwidth(bytes);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (int i = 0; i < kQueued; ++i) {
      PS_CHECK_OK((*stream)->MemcpyAsync(*device, *host, bytes, CopyKind::kHostToDevice));
    }
    PS_CHECK_OK((*stream)->Synchronize());
  }
  ReportFractionOfMemcpy(state, bytes, state.iterations() * kQueued, start);
  state.SetBytesProcessed(state.iterations() * bytes * kQueued);
  PS_CHECK_OK((*backend)->FreeDevice(*device));
  PS_CHECK_OK((*backend)->FreePinnedHost(*host));
}

void BM_CopyEngineHostToDevice(benchmark::State& state) { CopyEngine(state, CopyKind::kHostToDevice); }
void BM_CopyEngineDeviceToHost(benchmark::State& state) { CopyEngine(state, CopyKind::kDeviceToHost); }
void BM_CopyEngineDeviceToDevice(benchmark::State& state) {
  CopyEngine(state, CopyKind::kDeviceToDevice);
}

#define PS_COPY_SIZES ->Arg(64 * 1024)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->UseRealTime()
BENCHMARK(BM_Memcpy) PS_COPY_SIZES;
BENCHMARK(BM_CopyEngineHostToDevice) PS_COPY_SIZES;
BENCHMARK(BM_CopyEngineDeviceToHost) PS_COPY_SIZES;
BENCHMARK(BM_CopyEngineDeviceToDevice) PS_COPY_SIZES;
BENCHMARK(BM_CopyEngineQueued)->Arg(64 * 1024)->Arg(1 << 20)->UseRealTime();

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
