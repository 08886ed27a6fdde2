// Capacity: for each preset and dtype, the smallest accelerator memory that trains `steps` real
// training steps (bisection between the plan's lower bound and the smallest cap that trains, to
// within --precision), its ratio to the model data, the plan's lower bound and minimum, and the
// plan's predicted accelerator and host peaks against the measured ones (at the plan's minimum).
//
//   bazel run -c opt //benchmarks:capacity_benchmark -- --presets=gpt2,gpt2-medium
//       --dtypes=f32,bf16 --micro_batch_size=1 --seq_len=64
//
// Every probe is one Trainer run (the trainer's defaults with --model: synthetic data, activation
// checkpointing, auto chunk size) in a child process (fork), so that the child's peak resident
// set (VmHWM) is the run's host peak; probes below the plan's minimum are run with the plan's
// refusal turned off (TrainerEnvironment::enforce_memory_plan) to find the real smallest cap.
// Measured accelerator peak: the emulated accelerator's tracker (model + non-model bytes in use at
// once). Host peak: the child's VmHWM, against the plan's safe bound (every chunk block resident,
// the budgeted overhead) and its expected peak (the pages really written). Pressure reclaims: how
// often the chunk manager had to evict between accesses because the tide outgrew its slack, in
// the run at the plan's minimum (0 when the plan's slack held). A table row per configuration on
// stdout.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "memory/dtype.h"
#include "memory/host_memory_info.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "trainer/config.h"
#include "trainer/config_overrides.h"
#include "trainer/config_validate.h"
#include "trainer/plan_options.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, presets, "gpt2", "comma-separated GPT presets");
ABSL_FLAG(std::string, dtypes, "f32,bf16", "comma-separated: f32, bf16");
ABSL_FLAG(int64_t, micro_batch_size, 1, "sequences per step");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, steps, 3, "training steps per probe");
ABSL_FLAG(double, precision, 0.05, "bisection stops when hi/lo - 1 is below this");
ABSL_FLAG(bool, bisect, true, "bisect below the plan's minimum (else only verify the minimum)");
ABSL_FLAG(std::string, cap, "", "instead: one run at this cap (e.g. 1GiB), reporting its peaks");

namespace ps {
namespace {

struct Probe {
  bool ok = false;
  int64_t accelerator_peak_bytes = 0;
  int64_t host_peak_bytes = 0;      // VmHWM of the run's process
  int64_t host_baseline_bytes = 0;  // its resident set before Trainer::Create
  int64_t pressure_reclaims = 0;    // the chunk manager's evictions under memory pressure
  double seconds = 0;
  char error[512] = {};
};

absl::StatusOr<TrainConfig> MakeConfig(const std::string& preset, const std::string& dtype,
                                       int64_t cap_bytes) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.model = preset;
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.accelerator_memory = absl::StrCat(cap_bytes);
  RETURN_IF_ERROR(ApplyOverrides(o, &c));
  c.bf16 = dtype == "bf16";
  c.threads = 2;
  RETURN_IF_ERROR(ValidateTrainConfig(c));
  return c;
}

// One Trainer run in a child process.
Probe Run(const std::string& preset, const std::string& dtype, int64_t cap_bytes) {
  Probe result;
  int fds[2];
  if (pipe(fds) != 0) {
    std::snprintf(result.error, sizeof(result.error), "pipe failed");
    return result;
  }
  std::cout.flush();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Probe p;
    const absl::Time start = absl::Now();
    absl::Status status;
    absl::StatusOr<TrainConfig> config = MakeConfig(preset, dtype, cap_bytes);
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      p.host_baseline_bytes = info->process_resident_bytes;
    }
    if (!config.ok()) {
      status = config.status();
    } else {
      TrainerEnvironment env;
      env.enforce_memory_plan = false;
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, env);
      status = trainer.status();
      if (status.ok()) status = (*trainer)->Run();
      if (status.ok()) {
        p.accelerator_peak_bytes = (*trainer)->summary().accelerator_peak_total_bytes;
        p.pressure_reclaims = (*trainer)->summary().pressure_reclaims;
      }
    }
    p.ok = status.ok();
    if (!status.ok()) {
      std::snprintf(p.error, sizeof(p.error), "%s", std::string(status.message()).c_str());
    }
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      p.host_peak_bytes = info->process_peak_resident_bytes;
    }
    p.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    (void)!write(fds[1], &p, sizeof(p));
    _exit(0);
  }
  close(fds[1]);
  const ssize_t n = read(fds[0], &result, sizeof(result));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (n != static_cast<ssize_t>(sizeof(result))) {
    result = Probe{};
    std::snprintf(result.error, sizeof(result.error), "the probe process died (status %d)",
                  wstatus);
  }
  return result;
}

// The trainer's plan (trainer/plan_options.h) of `c` under `cap_bytes`, with the probe's baseline
// resident set; the host unchecked.
absl::StatusOr<GptRunPlan> PlanFor(TrainConfig c, int64_t cap_bytes, int64_t baseline_bytes) {
  PlanContext context;
  ASSIGN_OR_RETURN(context.model, PlanModelFromConfig(c));
  context.threads = c.threads;
  context.host_resident_bytes = baseline_bytes;
  c.accelerator.memory_bytes = cap_bytes;
  ASSIGN_OR_RETURN(RunPlan run, PlanRunFromConfig(c, context));
  return std::move(run.plan);
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f", bytes / double(kMiB)); }

void Report(const std::string& preset, const std::string& dtype, const GptRunPlan& plan,
            int64_t smallest, const Probe& at, int probes) {
  const MemoryPlan& p = plan.plan;
  const int64_t model_data = p.host_model_data_bytes;
  std::cout << absl::StrFormat(
      "| %s | %s | %s | %.3f | %s | %s | %.2f | %s / %s | %s / %s / %s (%+.1f%%) | %d | %d |\n",
      preset, dtype, MiB(smallest), smallest / double(model_data), MiB(p.lower_bound_bytes),
      MiB(p.min_accelerator_bytes), smallest / double(p.lower_bound_bytes),
      MiB(p.predicted_accelerator_peak_bytes), MiB(at.accelerator_peak_bytes),
      MiB(p.host_peak_bytes), MiB(p.host_expected_peak_bytes), MiB(at.host_peak_bytes),
      100.0 * (double(p.host_expected_peak_bytes) / double(at.host_peak_bytes) - 1),
      at.pressure_reclaims, probes);
  std::cout.flush();
}

int Main() {
  std::cout << "micro batch " << absl::GetFlag(FLAGS_micro_batch_size) << " x "
            << absl::GetFlag(FLAGS_seq_len) << " tokens, " << absl::GetFlag(FLAGS_steps)
            << " steps per probe, activation checkpointing (the trainer's default)\n";
  std::cout << "| preset | dtype | smallest cap that trains (MiB) | / model data | lower bound "
               "(MiB) | plan minimum (MiB) | smallest / lower bound | accel peak predicted / "
               "measured (MiB) | host peak bound / expected / measured (MiB) | pressure "
               "reclaims | probes |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n";
  const std::vector<std::string> presets = absl::StrSplit(absl::GetFlag(FLAGS_presets), ',');
  const std::vector<std::string> dtypes = absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',');
  for (const std::string& preset : presets) {
    for (const std::string& dtype : dtypes) {
      absl::StatusOr<TrainConfig> config = MakeConfig(preset, dtype, 4 * kGiB);
      if (!config.ok()) {
        std::cerr << preset << " " << dtype << ": " << config.status() << "\n";
        return 2;
      }
      if (!absl::GetFlag(FLAGS_cap).empty()) {
        absl::StatusOr<int64_t> cap = ParseBytes(absl::GetFlag(FLAGS_cap));
        if (!cap.ok()) {
          std::cerr << "--cap: " << cap.status() << "\n";
          return 2;
        }
        const Probe at = Run(preset, dtype, *cap);
        absl::StatusOr<GptRunPlan> plan = PlanFor(*config, *cap, at.host_baseline_bytes);
        if (!plan.ok()) return 1;
        std::cerr << preset << " " << dtype << " at " << FormatBytes(*cap) << ": "
                  << (at.ok ? "trains" : at.error) << " (" << at.seconds << " s)\n";
        Report(preset, dtype, *plan, *cap, at, 1);
        continue;
      }
      absl::StatusOr<GptRunPlan> first = PlanFor(*config, 4 * kGiB, 0);
      if (!first.ok()) {
        std::cerr << preset << " " << dtype << ": " << first.status() << "\n";
        continue;
      }
      // The plan's minimum as planned at that cap (the segments, and so the slack, depend on the
      // cap), rounded up to 1 MiB, must train; else 10% more, three times.
      int64_t hi = AlignUp(first->plan.min_accelerator_bytes, kMiB);
      for (int i = 0; i < 3; ++i) {
        absl::StatusOr<GptRunPlan> at = PlanFor(*config, hi, 0);
        if (!at.ok() || at->plan.min_accelerator_bytes <= hi) break;
        hi = AlignUp(at->plan.min_accelerator_bytes, kMiB);
      }
      Probe at_hi;
      int probes = 0;
      for (int i = 0; i < 4; ++i) {
        at_hi = Run(preset, dtype, hi);
        ++probes;
        std::cerr << preset << " " << dtype << " at " << FormatBytes(hi) << ": "
                  << (at_hi.ok ? "trains" : at_hi.error) << " (" << at_hi.seconds << " s)\n";
        if (at_hi.ok) break;
        hi = AlignUp(hi + hi / 10, kMiB);
      }
      if (!at_hi.ok) {
        std::cerr << preset << " " << dtype << ": does not train even at " << FormatBytes(hi)
                  << "\n";
        continue;
      }
      const Probe at_min = at_hi;
      const int64_t min_cap = hi;
      int64_t lo = first->plan.lower_bound_bytes;
      while (absl::GetFlag(FLAGS_bisect) && hi > lo * (1 + absl::GetFlag(FLAGS_precision))) {
        const int64_t mid = AlignUp(static_cast<int64_t>(std::sqrt(double(lo) * double(hi))), kMiB);
        if (mid >= hi) break;
        const Probe probe = Run(preset, dtype, mid);
        ++probes;
        std::cerr << preset << " " << dtype << " at " << FormatBytes(mid) << ": "
                  << (probe.ok ? "trains" : probe.error) << " (" << probe.seconds << " s)\n";
        (probe.ok ? hi : lo) = mid;
      }
      absl::StatusOr<GptRunPlan> plan = PlanFor(*config, min_cap, at_min.host_baseline_bytes);
      if (!plan.ok()) return 1;
      Report(preset, dtype, *plan, hi, at_min, probes);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
