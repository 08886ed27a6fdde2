// The emulated accelerator's link (memory/cpu_backend.h) against its own limit, measured in the
// same run: with a bandwidth cap B, a copy of N bytes cannot finish faster than N / B, two copies
// in one direction share one link (2N / B), two in opposite directions have a link each (N / B
// for both), and a copy on a copy stream overlaps a compute stream's work (max(compute, N / B)).
// Each row reports the wall time and limit / time: 1 is perfect, and the engine's thread hand-offs
// and the memcpy itself are what keeps it below.
//
//   bazel run //benchmarks:cpu_backend_link_benchmark [-- --repeats=5]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/check.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"

ABSL_FLAG(int, repeats, 5, "runs of each case; the fastest is reported");

namespace ps {
namespace {

constexpr double kBandwidth = 200e6;   // 200 MB/s
constexpr int64_t kBytes = 8'000'000;  // 40 ms on the link

enum class Case { kOneCopy, kSameDirection, kOppositeDirections, kCopyAndCompute };

double RunOnce(Backend& backend, Case c) {
  auto d1 = backend.AllocateDevice(kBytes);
  auto d2 = backend.AllocateDevice(kBytes);
  PS_CHECK_OK(d1.status());
  PS_CHECK_OK(d2.status());
  std::vector<uint8_t> h1(kBytes, 1), h2(kBytes, 2);
  auto s1 = backend.CreateStream();
  auto s2 = backend.CreateStream();
  PS_CHECK_OK(s1.status());
  PS_CHECK_OK(s2.status());
  const absl::Time start = absl::Now();
  switch (c) {
    case Case::kOneCopy:
      PS_CHECK_OK((*s1)->MemcpyAsync(*d1, h1.data(), kBytes, CopyKind::kHostToDevice));
      break;
    case Case::kSameDirection:
      PS_CHECK_OK((*s1)->MemcpyAsync(*d1, h1.data(), kBytes, CopyKind::kHostToDevice));
      PS_CHECK_OK((*s2)->MemcpyAsync(*d2, h2.data(), kBytes, CopyKind::kHostToDevice));
      break;
    case Case::kOppositeDirections:
      PS_CHECK_OK((*s1)->MemcpyAsync(*d1, h1.data(), kBytes, CopyKind::kHostToDevice));
      PS_CHECK_OK((*s2)->MemcpyAsync(h2.data(), *d2, kBytes, CopyKind::kDeviceToHost));
      break;
    case Case::kCopyAndCompute:
      PS_CHECK_OK((*s1)->LaunchHostFunc([] { absl::SleepFor(absl::Milliseconds(40)); }));
      PS_CHECK_OK((*s2)->MemcpyAsync(*d2, h2.data(), kBytes, CopyKind::kHostToDevice));
      break;
  }
  PS_CHECK_OK((*s1)->Synchronize());
  PS_CHECK_OK((*s2)->Synchronize());
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  PS_CHECK_OK(backend.FreeDevice(*d1));
  PS_CHECK_OK(backend.FreeDevice(*d2));
  return ms;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  auto backend = ps::CreateCpuBackend(
      {.capacity_bytes = 64 * ps::kMiB, .copy_bandwidth_bytes_per_s = ps::kBandwidth});
  PS_CHECK_OK(backend.status());
  const double link_ms = 1e3 * static_cast<double>(ps::kBytes) / ps::kBandwidth;
  struct Row {
    const char* name;
    ps::Case c;
    double limit_ms;
  };
  const Row rows[] = {
      {"one 8 MB copy", ps::Case::kOneCopy, link_ms},
      {"two copies, same direction", ps::Case::kSameDirection, 2 * link_ms},
      {"two copies, opposite directions", ps::Case::kOppositeDirections, link_ms},
      {"copy beside 40 ms of compute", ps::Case::kCopyAndCompute, std::max(40.0, link_ms)},
  };
  std::printf("link %.0f MB/s; %-32s %9s %9s %9s\n", ps::kBandwidth / 1e6, "case", "best ms",
              "limit ms", "fraction");
  for (const Row& row : rows) {
    double best = 1e300;
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeats)); ++i) {
      best = std::min(best, ps::RunOnce(**backend, row.c));
    }
    std::printf("%-49s %9.1f %9.1f %9.2f\n", row.name, best, row.limit_ms, row.limit_ms / best);
  }
  return 0;
}
