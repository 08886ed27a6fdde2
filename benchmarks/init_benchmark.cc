// Start-up phases of a run (issue #38, "start in seconds"), each timed alone:
//  1. seeded initialization: FillNormal (model/parameter_init.h, vectorized) against the scalar
//     formula it replaced (a copy below), one thread, elements/s;
//  2. first touch of fresh chunk memory (memory/internal/page_allocation.h's mappings): (a) 4 KiB
//     pages touched by one thread, (b) with madvise(MADV_HUGEPAGE), (c) populated by all threads,
//     (d) both; GiB/s and the system time they cost (getrusage, every thread).
//
//   bazel build -c opt //benchmarks:init_benchmark
//   bazel-bin/benchmarks/init_benchmark --elements=16777216 --touch_gib=2 --threads=2
//
// /sys/kernel/mm/transparent_hugepage/enabled decides (b): "always" gives huge pages without the
// madvise, "never" none with it; the line is printed first.
#include <sys/mman.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numbers>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/types/span.h"
#include "base/splitmix64.h"
#include "model/parameter_init.h"

ABSL_FLAG(int64_t, elements, int64_t{1} << 24, "elements FillNormal draws");
ABSL_FLAG(double, touch_gib, 2.0, "GiB of fresh mappings each touch mode faults in");
ABSL_FLAG(int, threads, 2, "threads that populate in modes (c) and (d)");

namespace ps {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double SystemSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_stime.tv_usec);
}

// The scalar FillNormal before the vectorized one (commit 050e37f).
void ScalarFillNormal(uint64_t seed, uint64_t stream, double std, absl::Span<float> out) {
  std::mt19937_64 gen(SplitMix64(seed ^ SplitMix64(stream).Next()).Next());
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  for (size_t i = 0; i + 1 < out.size(); i += 2) {
    const double u1 = static_cast<double>((gen() >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(gen() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
    out[i + 1] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
  }
}

void Touch(char* p, size_t bytes, int threads) {
  const size_t page = 4096;
  std::vector<std::thread> pool;
  const size_t per = (bytes / page + threads - 1) / threads * page;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const size_t begin = static_cast<size_t>(t) * per;
      const size_t end = std::min(bytes, begin + per);
      for (size_t o = begin; o < end; o += page) p[o] = 1;
    });
  }
  for (std::thread& t : pool) t.join();
}

void TouchMode(const char* name, size_t bytes, bool huge, int threads) {
  const double sys0 = SystemSeconds();
  const double t0 = Now();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::printf("%s: mmap failed\n", name);
    return;
  }
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  Touch(static_cast<char*>(p), bytes, threads);
  const double seconds = Now() - t0;
  const double sys = SystemSeconds() - sys0;
  munmap(p, bytes);
  std::printf("touch %-28s %6.2f GiB/s  %6.3f s wall  %6.3f s system\n", name,
              static_cast<double>(bytes) / seconds / (1 << 30), seconds, sys);
}

int Main() {
  {
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    std::getline(thp, line);
    std::printf("transparent_hugepage/enabled: %s\n", line.c_str());
  }
  const int64_t n = absl::GetFlag(FLAGS_elements);
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  double t0 = Now();
  ScalarFillNormal(7, 3, 0.02, absl::MakeSpan(a));
  const double scalar_s = Now() - t0;
  t0 = Now();
  FillNormal(7, 3, 0.02, 0, absl::MakeSpan(b));
  const double vector_s = Now() - t0;
  std::printf("FillNormal %lld elements, 1 thread: scalar %.2f ns/elem, vectorized %.2f ns/elem "
              "(%.1fx), %s\n",
              static_cast<long long>(n), scalar_s * 1e9 / static_cast<double>(n),
              vector_s * 1e9 / static_cast<double>(n), scalar_s / vector_s,
              a == b ? "bit-identical" : "DIFFERENT");
  t0 = Now();
  FillNormal(7, 3, 0.02, n - 2, absl::MakeSpan(b).subspan(0, 2));
  std::printf("FillNormal skip-ahead of %lld draws: %.2f ns/draw\n", static_cast<long long>(n),
              (Now() - t0) * 1e9 / static_cast<double>(n));
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_touch_gib) * (1 << 30));
  const int threads = absl::GetFlag(FLAGS_threads);
  TouchMode("(a) 4k pages, 1 thread", bytes, false, 1);
  TouchMode("(b) MADV_HUGEPAGE, 1 thread", bytes, true, 1);
  TouchMode("(c) 4k pages, all threads", bytes, false, threads);
  TouchMode("(d) MADV_HUGEPAGE, all threads", bytes, true, threads);
  return a == b ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
