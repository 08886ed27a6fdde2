// How much of the copy time prefetch and write-behind hide behind compute (scheduler/).
//
// A training iteration of the TrainingHarness on the emulated accelerator with a capped link:
// 8 operators of one 256 KiB chunk each, room for 3 chunks, every chunk copy taking 2 ms in
// either direction and every operator computing for 2 ms (a sleep), the optimizer on the host.
// For each mode (demand loading; prefetch + write-behind) it reports the fastest and median steady
// iteration and the fraction of the physical limit reached, measured in the same run: an
// iteration can be no faster than its compute nor than the busier direction of the link,
//   limit = max(compute, load bytes / bandwidth, write-back bytes / bandwidth),
// and fraction = limit / measured. Demand loading adds the copy time to the compute time; perfect
// overlap reaches 1.
//
//   bazel run //benchmarks:chunk_overlap_benchmark [-- --iterations=12]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "base/check.h"
#include "glog/logging.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/training_harness.h"

ABSL_FLAG(int, iterations, 12, "iterations per mode (the first two are not timed)");

namespace ps {
namespace {

constexpr int64_t kChunkElems = 64 * 1024;  // 256 KiB f32 chunks
constexpr int64_t kChunkBytes = kChunkElems * 4;
constexpr int kOps = 8;
constexpr double kBandwidthBytesPerS = kChunkBytes / 2e-3;  // 2 ms per chunk copy
constexpr absl::Duration kCompute = absl::Milliseconds(2);  // per operator access

struct Result {
  double fastest_ms = 0;
  double median_ms = 0;
  double limit_ms = 0;
  ChunkManagerCounters steady;
};

Result Run(bool overlap, int iterations) {
  HarnessModel model{.chunk_elems = kChunkElems,
                     .op_numels = std::vector<int64_t>(kOps, kChunkElems)};
  HarnessProgram program;
  for (int i = 0; i < kOps; ++i) program.steps.push_back({.op = i, .stage = Stage::kForward});
  for (int i = kOps - 1; i >= 0; --i) {
    program.steps.push_back({.op = i, .stage = Stage::kBackward, .write = true});
  }
  program.adam = true;
  program.adam_on_accelerator = false;
  HarnessConfig config;
  config.cap_bytes = 3 * kChunkBytes;
  config.copy_bandwidth_bytes_per_s = kBandwidthBytesPerS;
  config.compute = kCompute;
  config.verify = false;
  config.options.warmup_chunk_fraction = 0.5;
  config.options.prefetch = overlap;
  config.options.write_behind = overlap;
  auto harness = TrainingHarness::Create(model, config);
  PS_CHECK_OK(harness.status());
  TrainingHarness& h = **harness;
  PS_CHECK_OK(h.Initialize());
  for (int it = 0; it < iterations; ++it) PS_CHECK_OK(h.RunIteration(program));
  std::vector<double> ms;
  for (int it = 2; it < iterations; ++it) {
    ms.push_back(absl::ToDoubleMilliseconds(h.iteration_times()[it]));
  }
  std::sort(ms.begin(), ms.end());
  Result r;
  r.fastest_ms = ms.front();
  r.median_ms = ms[ms.size() / 2];
  r.steady = h.manager().iteration_counters().back();
  const TransferCounters t = r.steady.Total();
  const double compute_ms =
      absl::ToDoubleMilliseconds(kCompute) * static_cast<double>(program.steps.size());
  const double load_ms = 1e3 * static_cast<double>(t.load_bytes) / kBandwidthBytesPerS;
  const double store_ms = 1e3 * static_cast<double>(t.write_back_bytes) / kBandwidthBytesPerS;
  r.limit_ms = std::max({compute_ms, load_ms, store_ms});
  return r;
}

void Print(const char* name, const Result& r) {
  std::printf("%-28s %9.1f %9.1f %9.1f %9.2f   %s\n", name, r.fastest_ms, r.median_ms, r.limit_ms,
              r.limit_ms / r.fastest_ms, r.steady.DebugString().c_str());
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  const int iterations = std::max(4, absl::GetFlag(FLAGS_iterations));
  const ps::Result demand = ps::Run(false, iterations);
  const ps::Result overlap = ps::Run(true, iterations);
  std::printf("steady iteration (ms)         fastest    median     limit  fraction   traffic\n");
  ps::Print("demand loading", demand);
  ps::Print("prefetch + write-behind", overlap);
  std::printf(
      "same bytes moved: %s; time saved: %.1f%%\n",
      demand.steady.Total().moved_bytes() == overlap.steady.Total().moved_bytes() ? "yes" : "NO",
      100.0 * (1.0 - overlap.fastest_ms / demand.fastest_ms));
  return 0;
}
