// Bulk dtype conversion throughput (memory/convert.h) against a plain scalar loop over the
// dtype_math.h functions, and against memcpy as the bandwidth reference.
//
// Bytes/s counts bytes read plus bytes written (f32 -> f16 of n elements moves 6n bytes). The
// reference is a memcpy moving the same read+written bytes (a copy of (in + out) / 2 bytes),
// measured in the same process on buffers of the same size right before each conversion run;
// `of_memcpy` is the conversion's bandwidth as a fraction of it. Two sizes: 64M elements (hundreds
// of MB, streaming from memory or, on CPUs with a huge L3, partly from L3) and 64K elements (fits
// in L2).
//
// Times are CPU time of this (single) thread, not wall time, so that other processes on a shared
// machine do not skew the rates or the fraction; on an idle machine the two agree for these
// single-threaded loops.
//
//   bazel run //benchmarks:convert_benchmark -- --benchmark_min_time=0.2
#include <time.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "memory/convert.h"
#include "memory/dtype_math.h"

namespace ps {
namespace {

constexpr int64_t kSmallElems = int64_t{1} << 16;
constexpr int64_t kLargeElems = int64_t{1} << 26;

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Shared inputs per length, built once: f32 values like model weights and gradients (mostly
// small normals, a few large and tiny ones) and their f16 / bf16 encodings.
struct Inputs {
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  std::vector<uint16_t> bf16;
};

const Inputs& GetInputs(int64_t n) {
  static auto* cache = new std::map<int64_t, Inputs>();
  auto [it, inserted] = cache->try_emplace(n);
  if (inserted) {
    Inputs& in = it->second;
    in.f32.resize(static_cast<size_t>(n));
    uint32_t state = 12345;
    for (float& f : in.f32) {
      state = state * 1664525u + 1013904223u;  // LCG: cheap, deterministic
      const float unit = static_cast<float>(state >> 8) * (1.0f / 16777216.0f) - 0.5f;
      const int scale = static_cast<int>(state & 15) - 12;  // 2^-12 .. 2^3
      f = unit * static_cast<float>(1 << (scale + 12)) / 4096.0f;
    }
    in.f16.resize(static_cast<size_t>(n));
    in.bf16.resize(static_cast<size_t>(n));
    ConvertF32ToF16(in.f32.data(), in.f16.data(), n);
    ConvertF32ToBF16(in.f32.data(), in.bf16.data(), n);
  }
  return it->second;
}

// memcpy bandwidth in read+written bytes per second for a copy of `copy_bytes`: repeated copies
// for >= 50 ms of CPU time (and >= 3 copies). The buffers are kept per size and were faulted in
// by a first copy.
double MemcpyBytesPerSecond(size_t copy_bytes) {
  static auto* buffers = new std::map<size_t, std::pair<std::vector<char>, std::vector<char>>>();
  auto [it, inserted] = buffers->try_emplace(copy_bytes);
  std::vector<char>& src = it->second.first;
  std::vector<char>& dst = it->second.second;
  if (inserted) {
    src.assign(copy_bytes, 1);
    dst.assign(copy_bytes, 0);
    std::memcpy(dst.data(), src.data(), copy_bytes);
  }
  int64_t reps = 0;
  const double start = ThreadCpuSeconds();
  double elapsed = 0;
  while (elapsed < 0.05 || reps < 3) {
    std::memcpy(dst.data(), src.data(), copy_bytes);
    benchmark::ClobberMemory();
    ++reps;
    elapsed = ThreadCpuSeconds() - start;
  }
  return 2.0 * static_cast<double>(copy_bytes) * static_cast<double>(reps) / elapsed;
}

// Runs `convert` over the benchmark loop and reports bytes/s and the fraction of memcpy's.
template <typename Src, typename Dst, typename Fn>
void RunConversion(benchmark::State& state, const std::vector<Src>& src, Fn convert,
                   const std::string& label) {
  const int64_t n = state.range(0);
  std::vector<Dst> dst(static_cast<size_t>(n));
  convert(src.data(), dst.data(), n);  // Warm-up: faults dst in.
  const int64_t bytes_per_iter = n * static_cast<int64_t>(sizeof(Src) + sizeof(Dst));
  const double memcpy_rate = MemcpyBytesPerSecond(static_cast<size_t>(bytes_per_iter / 2));
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    convert(src.data(), dst.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double elapsed = ThreadCpuSeconds() - start;
  const double rate =
      static_cast<double>(bytes_per_iter) * static_cast<double>(state.iterations()) / elapsed;
  state.SetBytesProcessed(bytes_per_iter * state.iterations());
  state.counters["of_memcpy"] = rate / memcpy_rate;
  state.counters["memcpy_bytes_per_second"] =
      benchmark::Counter(memcpy_rate, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  state.SetLabel(label);
}

// --- Highway bulk conversions -------------------------------------------------------------------

void BM_F32ToF16(benchmark::State& state) {
  RunConversion<float, uint16_t>(state, GetInputs(state.range(0)).f32, ConvertF32ToF16,
                                 ConvertTargetName());
}
void BM_F16ToF32(benchmark::State& state) {
  RunConversion<uint16_t, float>(state, GetInputs(state.range(0)).f16, ConvertF16ToF32,
                                 ConvertTargetName());
}
void BM_F32ToBF16(benchmark::State& state) {
  RunConversion<float, uint16_t>(state, GetInputs(state.range(0)).f32, ConvertF32ToBF16,
                                 ConvertTargetName());
}
void BM_BF16ToF32(benchmark::State& state) {
  RunConversion<uint16_t, float>(state, GetInputs(state.range(0)).bf16, ConvertBF16ToF32,
                                 ConvertTargetName());
}

// --- Plain scalar loops over dtype_math.h -------------------------------------------------------

void ScalarF32ToF16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalfBits(src[i]);
}
void ScalarF16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
}
void ScalarF32ToBF16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Bits(src[i]);
}
void ScalarBF16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(src[i]);
}

void BM_ScalarF32ToF16(benchmark::State& state) {
  RunConversion<float, uint16_t>(state, GetInputs(state.range(0)).f32, ScalarF32ToF16, "scalar");
}
void BM_ScalarF16ToF32(benchmark::State& state) {
  RunConversion<uint16_t, float>(state, GetInputs(state.range(0)).f16, ScalarF16ToF32, "scalar");
}
void BM_ScalarF32ToBF16(benchmark::State& state) {
  RunConversion<float, uint16_t>(state, GetInputs(state.range(0)).f32, ScalarF32ToBF16, "scalar");
}
void BM_ScalarBF16ToF32(benchmark::State& state) {
  RunConversion<uint16_t, float>(state, GetInputs(state.range(0)).bf16, ScalarBF16ToF32, "scalar");
}

// --- The reference itself, as a row of the table: memcpy moving the same bytes as a 32 <-> 16
// bit conversion of range(0) elements (3 bytes copied per element = 6 bytes of traffic).

void BM_Memcpy(benchmark::State& state) {
  const size_t copy_bytes = static_cast<size_t>(state.range(0)) * 3;
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  std::memcpy(dst.data(), src.data(), copy_bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), copy_bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(2 * copy_bytes) * state.iterations());
}

#define PS_CONVERT_BENCHMARK(fn) \
  BENCHMARK(fn)->Arg(kSmallElems)->Arg(kLargeElems)->Unit(benchmark::kMicrosecond)

PS_CONVERT_BENCHMARK(BM_Memcpy);
PS_CONVERT_BENCHMARK(BM_F32ToF16);
PS_CONVERT_BENCHMARK(BM_ScalarF32ToF16);
PS_CONVERT_BENCHMARK(BM_F16ToF32);
PS_CONVERT_BENCHMARK(BM_ScalarF16ToF32);
PS_CONVERT_BENCHMARK(BM_F32ToBF16);
PS_CONVERT_BENCHMARK(BM_ScalarF32ToBF16);
PS_CONVERT_BENCHMARK(BM_BF16ToF32);
PS_CONVERT_BENCHMARK(BM_ScalarBF16ToF32);

}  // namespace
}  // namespace ps
