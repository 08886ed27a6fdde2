// Start-up phases of a run (issue #38, "start in seconds"), each timed alone:
//  1. seeded initialization: FillNormal (model/parameter_init.h) against the scalar formula (a
//     copy below; a vectorized FillNormal was reverted after an AddressSanitizer/UBSan failure, so
//     both are scalar today: the comparison is the place to measure a faster one), one thread;
//  2. (--hf_dir) reading a Hugging Face directory as LoadHfCheckpoint does (ReadAsF32 of every
//     parameter, one thread, then in halves on two threads), against read(2) of its files, both
//     from the page cache (run twice: the first pass warms it); --write_hf=PRESET first writes
//     the preset as a bf16 directory there (values: a cheap pattern, not a model);
//  3. first touch of fresh chunk memory (memory/internal/page_allocation.h's mappings): (a) 4 KiB
//     pages touched by one thread, (b) with madvise(MADV_HUGEPAGE), (c) populated by all threads,
//     (d) both; GiB/s and the system time they cost (getrusage, every thread).
//
//   bazel build -c opt //benchmarks:init_benchmark
//   bazel-bin/benchmarks/init_benchmark --elements=16777216 --touch_gib=2 --threads=2
//   bazel-bin/benchmarks/init_benchmark --write_hf=qwen2.5-0.5b --hf_dir=/tmp/q05 --touch_gib=0
//
// /sys/kernel/mm/transparent_hugepage/enabled decides (b): "always" gives huge pages without the
// madvise, "never" none with it; the line is printed first.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <algorithm>
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
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/safetensors_index.h"
#include "model/parameter_init.h"

ABSL_FLAG(int64_t, elements, int64_t{1} << 24, "elements FillNormal draws");
ABSL_FLAG(double, touch_gib, 2.0, "GiB of fresh mappings each touch mode faults in");
ABSL_FLAG(int, threads, 2, "threads that populate in modes (c) and (d)");
ABSL_FLAG(std::string, hf_dir, "", "a Hugging Face directory to read (phase 2)");
ABSL_FLAG(std::string, write_hf, "", "a preset written as bf16 to --hf_dir first");

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

// Phase 2: LoadHfCheckpoint's reads against read(2) of the same files.
void HfPhase(const std::string& dir) {
  if (const std::string preset = absl::GetFlag(FLAGS_write_hf); !preset.empty()) {
    absl::StatusOr<ModelConfig> config = ModelPreset(preset);
    if (!config.ok()) {
      std::printf("--write_hf: %s\n", std::string(config.status().message()).c_str());
      return;
    }
    const double t0 = Now();
    const absl::Status s = WriteHfCheckpoint(
        dir, *config, DType::kBF16,
        ConvertingFill(
            [](const TensorSpec&, int64_t first, absl::Span<float> dst) {
              for (size_t i = 0; i < dst.size(); ++i) {
                dst[i] = 0.02f * static_cast<float>((first + static_cast<int64_t>(i)) % 97 - 48) / 48;
              }
              return absl::OkStatus();
            },
            DType::kBF16));
    std::printf("wrote %s as bf16 to %s in %.1f s: %s\n", preset.c_str(), dir.c_str(), Now() - t0,
                s.ok() ? "ok" : std::string(s.message()).c_str());
    if (!s.ok()) return;
  }
  absl::StatusOr<HfCheckpoint> checkpoint = HfCheckpoint::Open(dir);
  if (!checkpoint.ok()) {
    std::printf("--hf_dir: %s\n", std::string(checkpoint.status().message()).c_str());
    return;
  }
  for (int pass = 0; pass < 2; ++pass) {
    // read(2) of every file, 8 MiB at a time.
    int64_t file_bytes = 0;
    double t0 = Now();
    std::vector<char> buffer(8 << 20);
    for (const SafetensorsFile& file : checkpoint->weights().shards()) {
      const int fd = open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      for (ssize_t got; (got = read(fd, buffer.data(), buffer.size())) > 0;) file_bytes += got;
      close(fd);
    }
    const double read_s = Now() - t0;
    // ReadAsF32 of every parameter: one thread, then two halves on two threads.
    int64_t bytes = 0, max_numel = 0;
    for (const TensorSpec& t : checkpoint->parameters()) {
      const SafetensorsTensorInfo* info = checkpoint->Find(t.name);
      if (info == nullptr) continue;
      bytes += info->size_bytes();
      max_numel = std::max(max_numel, info->num_elements);
    }
    auto load = [&](int threads) {
      std::vector<std::thread> pool;
      for (int k = 0; k < threads; ++k) {
        pool.emplace_back([&, k] {
          std::vector<float> out(static_cast<size_t>(max_numel / threads + 1));
          for (const TensorSpec& t : checkpoint->parameters()) {
            const SafetensorsTensorInfo* info = checkpoint->Find(t.name);
            if (info == nullptr) continue;
            const int64_t n = info->num_elements;
            const int64_t first = n * k / threads, last = n * (k + 1) / threads;
            const absl::Status s = checkpoint->ReadAsF32(
                t.name, first, absl::MakeSpan(out).subspan(0, static_cast<size_t>(last - first)));
            if (!s.ok()) std::printf("%s\n", std::string(s.message()).c_str());
          }
        });
      }
      for (std::thread& t : pool) t.join();
    };
    t0 = Now();
    load(1);
    const double one_s = Now() - t0;
    t0 = Now();
    load(2);
    const double two_s = Now() - t0;
    std::printf("hf pass %d: read(2) %.2f GiB at %.2f GiB/s; ReadAsF32 %.2f GiB: 1 thread %.2f "
                "GiB/s, 2 threads %.2f GiB/s\n",
                pass, static_cast<double>(file_bytes) / (1 << 30),
                static_cast<double>(file_bytes) / read_s / (1 << 30),
                static_cast<double>(bytes) / (1 << 30),
                static_cast<double>(bytes) / one_s / (1 << 30),
                static_cast<double>(bytes) / two_s / (1 << 30));
  }
}

int Main() {
  if (const std::string dir = absl::GetFlag(FLAGS_hf_dir); !dir.empty()) HfPhase(dir);
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
  std::printf("FillNormal %lld elements, 1 thread: scalar copy %.2f ns/elem, FillNormal %.2f ns/elem "
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
  if (bytes == 0) return a == b ? 0 : 1;
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
