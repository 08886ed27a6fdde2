// System time and page faults of training on the emulated accelerator (issue #24), with the cpu
// backend's cache of freed device blocks on and off (PS_CPU_DEVICE_CACHE_BYTES=0, see
// memory/cpu_backend.h), at the plan's minimum accelerator cap of a preset (or --cap).
//
//   bazel build -c opt //benchmarks:page_fault_benchmark
//   bazel-bin/benchmarks/page_fault_benchmark --preset=gpt2-medium --dtype=bf16
//   bazel-bin/benchmarks/page_fault_benchmark --preset=1B --dtype=bf16      # ~15 GiB of host RAM
//
// Each run is one Trainer (the trainer's defaults with --model: synthetic data, activation
// checkpointing, auto chunk size, 2 threads) in a child process (fork), so the runs do not share
// pages. The numbers are the trainer's own (TrainSummary): getrusage over the training steps
// (every thread; validation excluded), against the steps' wall time. The first step includes the
// first touch of every block (the warm-up), which no cache avoids. Goal: system time under 10% of
// the step time with the cache on. One table row per run on stdout.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "trainer/config.h"
#include "trainer/config_overrides.h"
#include "trainer/config_validate.h"
#include "trainer/plan_options.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, preset, "gpt2-medium", "GPT preset");
ABSL_FLAG(std::string, dtype, "bf16", "f32 or bf16");
ABSL_FLAG(int64_t, micro_batch_size, 1, "sequences per step");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, steps, 3, "training steps per run");
ABSL_FLAG(std::string, cap, "", "accelerator cap (e.g. 200MiB); default: the plan's minimum");
ABSL_FLAG(std::string, modes, "off,on", "cache modes to run, in order: off, on");

namespace ps {
namespace {

struct Result {
  bool ok = false;
  double steps_wall_s = 0, user_s = 0, system_s = 0;
  int64_t minor_faults = 0, major_faults = 0, allocations = 0, reuses = 0;
  char error[512] = {};
};

absl::StatusOr<TrainConfig> MakeConfig(int64_t cap_bytes) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.model = absl::GetFlag(FLAGS_preset);
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.accelerator_memory = absl::StrCat(cap_bytes);
  RETURN_IF_ERROR(ApplyOverrides(o, &c));
  c.bf16 = absl::GetFlag(FLAGS_dtype) == "bf16";
  c.threads = 2;
  RETURN_IF_ERROR(ValidateTrainConfig(c));
  return c;
}

// The plan's minimum cap, planned at that cap (segments depend on it) as the trainer plans it
// (trainer/plan_options.h), rounded up to 1 MiB.
absl::StatusOr<int64_t> PlanMinimum(TrainConfig c) {
  PlanContext context;
  ASSIGN_OR_RETURN(context.model, PlanModelFromConfig(c));
  context.threads = c.threads;
  int64_t cap = 4 * kGiB;
  for (int i = 0; i < 4; ++i) {
    c.accelerator.memory_bytes = cap;
    ASSIGN_OR_RETURN(const RunPlan run, PlanRunFromConfig(c, context));
    const int64_t min = AlignUp(run.plan.plan.min_accelerator_bytes, kMiB);
    if (i > 0 && min <= cap) return cap;
    cap = min;
  }
  return cap;
}

Result Run(int64_t cap_bytes, bool cache) {
  Result result;
  int fds[2];
  if (pipe(fds) != 0) {
    std::snprintf(result.error, sizeof(result.error), "pipe failed");
    return result;
  }
  std::cout.flush();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Result r;
    if (cache) {
      unsetenv("PS_CPU_DEVICE_CACHE_BYTES");
    } else {
      setenv("PS_CPU_DEVICE_CACHE_BYTES", "0", 1);
    }
    absl::Status status;
    absl::StatusOr<TrainConfig> config = MakeConfig(cap_bytes);
    if (!config.ok()) {
      status = config.status();
    } else {
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
      status = trainer.status();
      if (status.ok()) status = (*trainer)->Run();
      if (status.ok()) {
        const TrainSummary& s = (*trainer)->summary();
        r.steps_wall_s = s.steps_wall_s;
        r.user_s = s.steps_user_s;
        r.system_s = s.steps_system_s;
        r.minor_faults = s.steps_minor_faults;
        r.major_faults = s.steps_major_faults;
        r.allocations = s.accelerator_allocations;
        r.reuses = s.accelerator_cache_hits;
      }
    }
    r.ok = status.ok();
    if (!status.ok()) {
      std::snprintf(r.error, sizeof(r.error), "%s", std::string(status.message()).c_str());
    }
    (void)!write(fds[1], &r, sizeof(r));
    _exit(0);
  }
  close(fds[1]);
  const ssize_t n = read(fds[0], &result, sizeof(result));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (n != static_cast<ssize_t>(sizeof(result))) {
    result = Result{};
    std::snprintf(result.error, sizeof(result.error), "the run's process died (status %d)",
                  wstatus);
  }
  return result;
}

int Main() {
  absl::StatusOr<TrainConfig> probe = MakeConfig(4 * kGiB);
  if (!probe.ok()) {
    std::cerr << probe.status() << "\n";
    return 2;
  }
  int64_t cap = 0;
  if (const std::string flag = absl::GetFlag(FLAGS_cap); !flag.empty()) {
    absl::StatusOr<int64_t> parsed = ParseBytes(flag);
    if (!parsed.ok()) {
      std::cerr << "--cap: " << parsed.status() << "\n";
      return 2;
    }
    cap = *parsed;
  } else {
    absl::StatusOr<int64_t> min = PlanMinimum(*probe);
    if (!min.ok()) {
      std::cerr << min.status() << "\n";
      return 1;
    }
    cap = *min;
  }
  std::cout << absl::StrFormat("%s %s, micro batch %d x seq %d, %d steps, accelerator cap %s\n\n",
                               absl::GetFlag(FLAGS_preset), absl::GetFlag(FLAGS_dtype),
                               absl::GetFlag(FLAGS_micro_batch_size), absl::GetFlag(FLAGS_seq_len),
                               absl::GetFlag(FLAGS_steps), FormatBytes(cap));
  std::cout << "| device block cache | steps (s) | user (s) | system (s) | system / step time | "
               "minor faults | major | device allocations reusing a cached block |\n"
               "|---|---|---|---|---|---|---|---|\n";
  int failures = 0;
  for (const char* mode_name : {"off", "on"}) {
    const std::string mode = mode_name;
    if (absl::GetFlag(FLAGS_modes).find(mode) == std::string::npos) continue;
    const Result r = Run(cap, mode == "on");
    if (!r.ok) {
      std::cout << "| " << mode << " | failed: " << r.error << " |\n";
      ++failures;
      continue;
    }
    std::cout << absl::StrFormat("| %s | %.1f | %.1f | %.1f | %.1f%% | %d | %d | %d of %d |\n",
                                 mode, r.steps_wall_s, r.user_s, r.system_s,
                                 100 * r.system_s / std::max(r.steps_wall_s, 1e-9), r.minor_faults,
                                 r.major_faults, r.reuses, r.allocations);
    std::cout.flush();
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
