// Benchmarks of trainer/io: CRC-32C against memcpy (the physical limit for a checksum pass that
// reads memory once), checkpoint verification, and the cost of trace events enabled and disabled.
//
//   bazel run //benchmarks:io_benchmark -- --benchmark_min_time=0.2
//
// "of_memcpy" is the CRC's bytes/s divided by memcpy's bytes/s for the same size, measured in the
// same run (memcpy reads and writes each byte; a CRC only reads, so > 1 is possible in cache).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "benchmark/benchmark.h"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/io/trace_writer.h"

namespace ps {
namespace {

std::vector<char> RandomBuffer(size_t n) {
  std::vector<char> v(n);
  std::mt19937_64 rng(1);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// This thread's CPU time in seconds: the clock google-benchmark rates are computed with, and
// robust to other processes sharing the machine.
double ThreadCpuSeconds() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// memcpy bytes per CPU second for `size`, measured once per size for ~0.2 s.
double MemcpyBytesPerSecond(size_t size) {
  static std::map<size_t, double>* cache = new std::map<size_t, double>();
  auto it = cache->find(size);
  if (it != cache->end()) return it->second;
  std::vector<char> src = RandomBuffer(size), dst(size);
  const double start = ThreadCpuSeconds();
  size_t bytes = 0;
  double seconds = 0;
  const size_t batch = std::max<size_t>(1, (size_t{4} << 20) / size);  // amortize the clock
  while (seconds < 0.2) {
    for (size_t i = 0; i < batch; ++i) {
      std::memcpy(dst.data(), src.data(), size);
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
    bytes += batch * size;
    seconds = ThreadCpuSeconds() - start;
  }
  return (*cache)[size] = static_cast<double>(bytes) / seconds;
}

void ReportBytes(benchmark::State& state, size_t size) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
}

// `cpu_seconds`: the CPU time of the timed loop, measured by the caller.
void ReportVsMemcpy(benchmark::State& state, size_t size, double cpu_seconds) {
  ReportBytes(state, size);
  const double rate =
      static_cast<double>(state.iterations()) * static_cast<double>(size) / cpu_seconds;
  state.counters["of_memcpy"] = rate / MemcpyBytesPerSecond(size);
}

void BM_Memcpy(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0));
  std::vector<char> src = RandomBuffer(size), dst(size);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), size);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  ReportBytes(state, size);
}

template <uint32_t (*Fn)(uint32_t, const void*, size_t)>
void BM_Crc(benchmark::State& state) {
  if (Fn == &crc32c_internal::ExtendHardware && !Crc32cHardwareAvailable()) {
    state.SkipWithError("no SSE4.2 on this CPU");
    return;
  }
  const size_t size = static_cast<size_t>(state.range(0));
  std::vector<char> data = RandomBuffer(size);
  MemcpyBytesPerSecond(size);  // measured before the timed loop
  uint32_t crc = 0;
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    crc = Fn(crc, data.data(), size);
    benchmark::DoNotOptimize(crc);
  }
  ReportVsMemcpy(state, size, ThreadCpuSeconds() - start);
}

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;
BENCHMARK(BM_Memcpy)->Arg(4 * kKiB)->Arg(256 * kKiB)->Arg(64 * kMiB);
BENCHMARK(BM_Crc<&crc32c_internal::ExtendHardware>)
    ->Name("BM_Crc32cHardware")
    ->Arg(64)
    ->Arg(4 * kKiB)
    ->Arg(256 * kKiB)
    ->Arg(64 * kMiB);
BENCHMARK(BM_Crc<&crc32c_internal::ExtendSoftware>)
    ->Name("BM_Crc32cSlicingBy8")
    ->Arg(64)
    ->Arg(4 * kKiB)
    ->Arg(256 * kKiB)
    ->Arg(64 * kMiB);
BENCHMARK(BM_Crc<&crc32c_internal::ExtendBitwise>)->Name("BM_Crc32cBitwise")->Arg(4 * kKiB);

// OpenCheckpoint with checksums of a 256 MiB checkpoint in the page cache: read + CRC.
void BM_OpenCheckpointVerify(benchmark::State& state) {
  const std::string root = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                        "/io_benchmark_ckpt_", ::getpid());
  std::filesystem::remove_all(root);
  const size_t size = 256 * kMiB;
  std::string dir;
  {
    auto w = CheckpointWriter::Begin(root, 1);
    if (!w.ok()) {
      state.SkipWithError(std::string(w.status().message()).c_str());
      return;
    }
    std::vector<char> data = RandomBuffer(size);
    if (!w->WriteFile("params.bin", absl::string_view(data.data(), data.size())).ok()) {
      state.SkipWithError("cannot write");
      return;
    }
    auto committed = w->Commit({});
    if (!committed.ok()) {
      state.SkipWithError("cannot commit");
      return;
    }
    dir = *committed;
  }
  MemcpyBytesPerSecond(size);
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    auto opened = OpenCheckpoint(dir);
    if (!opened.ok()) state.SkipWithError("cannot open");
    benchmark::DoNotOptimize(opened);
  }
  ReportVsMemcpy(state, size, ThreadCpuSeconds() - start);
  std::filesystem::remove_all(root);
}
BENCHMARK(BM_OpenCheckpointVerify)->Unit(benchmark::kMillisecond);

// The cost of one trace call when tracing is off: a null writer's ScopedSpan, and a disabled
// writer's Complete with arguments.
void BM_TraceNullScopedSpan(benchmark::State& state) {
  TraceWriter* const trace = nullptr;
  for (auto _ : state) {
    ScopedSpan span(trace, 1, "forward", "model", {{"layer", 3}});
    benchmark::DoNotOptimize(&span);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceNullScopedSpan);

void BM_TraceDisabledComplete(benchmark::State& state) {
  std::unique_ptr<TraceWriter> trace = TraceWriter::CreateDisabled();
  for (auto _ : state) {
    trace->Complete(1, "forward", "model", 1, 2, {{"layer", 3}, {"bytes", int64_t{1} << 30}});
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceDisabledComplete);

// Enabled: formatting, buffering and writing (to a file in the temp directory).
void BM_TraceEnabledComplete(benchmark::State& state) {
  const std::string path = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                        "/io_benchmark_trace_", ::getpid(), ".json");
  auto trace = TraceWriter::Create(path);
  if (!trace.ok()) {
    state.SkipWithError(std::string(trace.status().message()).c_str());
    return;
  }
  const TrackId track = (*trace)->Track("main");
  int64_t t = 0;
  for (auto _ : state) {
    (*trace)->Complete(track, "forward", "model", ++t, 2,
                       {{"layer", 3}, {"bytes", int64_t{1} << 30}});
  }
  state.SetItemsProcessed(state.iterations());
  (void)(*trace)->Close();
  std::filesystem::remove(path);
}
BENCHMARK(BM_TraceEnabledComplete);

}  // namespace
}  // namespace ps
