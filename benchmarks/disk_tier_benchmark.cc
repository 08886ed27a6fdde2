// The disk tier (issue #27) against its physical limit, in one run:
//  1. the disk's own sequential direct-I/O write and read bandwidth under the swap directory, at
//     the configured aio block size and queue depth, through the swap's engine
//     (disk/disk_probe.h MeasureDiskBandwidth; --disk_probe bytes; the write includes an
//     fdatasync; earlier cached writes are flushed first, untimed), and a mixed probe: reads of one
//     file and writes of another at once, no fdatasync, as the tier issues them. Both are measured
//     before and after the run (other processes share the disk) and the mean is the yardstick;
//  2. a training run with the optimizer state on disk (zero_optimization.offload_optimizer
//     device "nvme", a small --host_budget so most of the state streams), in a child process
//     (fork) so that the child's peak resident set (VmHWM) is the run's host peak, and, over the
//     steady steps (all but the warm-up):
//     - the state I/O bandwidth (disk bytes read + written over the time of the optimizer phases)
//       and the fraction of the disk it uses: the time the disk needs for those bytes at the
//       measured rates (reads / R + writes / W: the disk serving one direction at a time) over the
//       optimizer phase's time, and the state I/O over the mixed probe's rate (goal >= 0.80);
//     - the step time against max(compute, disk traffic at the measured rates) (goal <= 1.15x),
//       and against compute + disk (nothing overlapped), with where the step's time goes
//       (compute, waits for chunk copies, the optimizer and, inside it, the waits for the disk);
//     - the host peak the plan predicts (its safe bound host_peak_bytes and its expected peak
//       host_expected_peak_bytes) against the child's VmHWM (goal: expected within 5%);
//     - the disk bytes the plan predicts (the swap's slots, reads and writes per step) against the
//       swap file's size and the tier's per-step counters.
//
//   bazel run -c opt //benchmarks:disk_tier_benchmark -- --model=gpt2-medium --dtype=bf16
//       --steps=3 --host_budget=256MiB
//
// --overlap runs with optimizer.overlap (docs/pipeline.md): the updates move into backward, so
// optimizer_s shrinks and compute_s grows; compare step_s with a run without it (and with
// --gradient_clipping=1e-9, clipping on every step: the overlap must be no slower).
//
// The plan is the trainer's (model/gpt_activation_profile.h PlanGptRun with the disk tier), built
// in the parent with the options the trainer builds it with and the child's resident set before
// Trainer::Create. The swap directory is a fresh "patrickstar-disk-bench-XXXXXX" under
// --nvme_path (default $TMPDIR, else /tmp; it must be on the disk to measure, not tmpfs), removed
// at the end with everything in it (killed by SIGINT/SIGTERM, the benchmark and its training child
// remove their files, but the empty directory stays). Prints a table per step, a summary table with
// the goals, and one machine-readable line "disk_tier_benchmark: key=value ...". A progress line
// per step and the trainer's summary go to stderr.
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "benchmarks/internal/child_run.h"
#include "disk/disk_probe.h"
#include "disk/io_engine.h"
#include "disk/swap_dir.h"
#include "disk/swap_options.h"
#include "memory/dtype.h"
#include "memory/host_memory_info.h"
#include "model/gpt_activation_profile.h"
#include "model/model_config.h"
#include "scheduler/memory_plan.h"
#include "trainer/config.h"
#include "trainer/config_overrides.h"
#include "trainer/config_validate.h"
#include "trainer/plan_options.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, model, "gpt2-medium",
          "model preset (GPT-2's or the Llama family's, as the trainer's --model)");
ABSL_FLAG(std::string, dtype, "bf16", "compute dtype: f32 or bf16");
ABSL_FLAG(int64_t, micro_batch_size, 1, "sequences per step");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, steps, 3, "training steps: the warm-up, then steady ones (>= 2)");
ABSL_FLAG(std::string, host_budget, "256MiB",
          "host bytes of optimizer state the disk tier may hold "
          "(zero_optimization.offload_optimizer.host_budget), or \"auto\"");
ABSL_FLAG(int64_t, buffer_count, 4,
          "chunk indices read ahead (zero_optimization.offload_optimizer.buffer_count)");
ABSL_FLAG(std::string, nvme_path, "",
          "the directory under which the swap directory is made (default $TMPDIR, else /tmp)");
ABSL_FLAG(std::string, accelerator_memory, "256MiB", "the emulated accelerator's memory cap");
ABSL_FLAG(std::string, disk_probe, "1GiB", "bytes written and read to measure the disk");
ABSL_FLAG(std::string, aio_block_size, "1MiB", "aio.block_size (probe and run)");
ABSL_FLAG(int, aio_queue_depth, 8, "aio.queue_depth (probe and run)");
ABSL_FLAG(int, threads, 2, "the model's threads");
ABSL_FLAG(bool, overlap, false,
          "optimizer.overlap (docs/pipeline.md): each chunk's Adam update inside backward, read "
          "ahead in backward order; compare the step time against a run without it");
ABSL_FLAG(double, gradient_clipping, 0,
          "gradient_clipping (0: off); a tiny value engages clipping on every step, the case "
          "where optimizer.overlap must be no slower than off");

namespace ps {
namespace {

constexpr int kMaxSteps = 64;

struct StepRecord {
  bool warmup = false;
  double step_ms = 0, compute_ms = 0, copy_wait_ms = 0, optimizer_ms = 0, disk_wait_ms = 0;
  int64_t disk_read_bytes = 0, disk_write_bytes = 0;
};

// What the child sends back (plain bytes through a pipe).
struct RunResult {
  bool ok = false;
  int64_t host_baseline_bytes = 0;   // the child's resident set before Trainer::Create
  int64_t host_peak_bytes = 0;       // its VmHWM at the end
  int64_t swap_file_bytes = 0;       // the swap file's size after the last step
  int64_t swap_allocated_bytes = 0;  // its blocks on disk (st_blocks x 512)
  int64_t disk_reads = 0, disk_writes = 0, disk_read_bytes = 0, disk_write_bytes = 0;
  int64_t disk_read_ahead_hits = 0, disk_peak_host_bytes = 0;
  double disk_read_wait_s = 0, disk_write_wait_s = 0;
  double trainer_disk_read_bytes_per_s = 0, trainer_disk_write_bytes_per_s = 0;
  double seconds = 0;
  int steps = 0;
  StepRecord step[kMaxSteps];
  char engine[128] = {};
  char error[1024] = {};
};

int64_t BytesFlagOrDie(const char* name, const std::string& text) {
  absl::StatusOr<int64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) {
    std::cerr << "--" << name << "=" << text << ": " << bytes.status().message() << "\n";
    std::exit(2);
  }
  return *bytes;
}

int64_t HostBudgetBytes() {
  const std::string b = absl::GetFlag(FLAGS_host_budget);
  return b == "auto" ? 0 : BytesFlagOrDie("host_budget", b);
}

absl::StatusOr<TrainConfig> MakeConfig(const std::string& swap_dir) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.model = absl::GetFlag(FLAGS_model);
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.accelerator_memory = absl::GetFlag(FLAGS_accelerator_memory);
  o.nvme_path = swap_dir;
  RETURN_IF_ERROR(ApplyOverrides(o, &c));
  c.bf16 = absl::GetFlag(FLAGS_dtype) == "bf16";
  c.threads = absl::GetFlag(FLAGS_threads);
  c.optimizer.overlap = absl::GetFlag(FLAGS_overlap);
  c.gradient_clipping = absl::GetFlag(FLAGS_gradient_clipping);
  OffloadOptimizerConfig& offload = c.zero_optimization.offload_optimizer;
  offload.buffer_count = absl::GetFlag(FLAGS_buffer_count);
  offload.host_budget_bytes = HostBudgetBytes();
  c.aio.block_size_bytes = BytesFlagOrDie("aio_block_size", absl::GetFlag(FLAGS_aio_block_size));
  c.aio.queue_depth = absl::GetFlag(FLAGS_aio_queue_depth);
  RETURN_IF_ERROR(ValidateTrainConfig(c));
  return c;
}

// The trainer's run in a child process.
RunResult Train(const std::string& swap_dir) {
  const pid_t parent = getpid();
  return benchmarks_internal::RunInChild<RunResult>([&](RunResult& r) {
    // Dies with the benchmark (SIGTERM: the swap's handler removes its files, disk/swap_dir.h).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    const absl::Time start = absl::Now();
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      r.host_baseline_bytes = info->process_resident_bytes;
    }
    absl::Status status;
    absl::StatusOr<TrainConfig> config = MakeConfig(swap_dir);
    if (!config.ok()) {
      status = config.status();
    } else {
      TrainerEnvironment env;
      env.out = &std::cerr;  // progress lines and the summary, apart from the table
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, env);
      status = trainer.status();
      if (status.ok()) status = (*trainer)->Run();
      if (status.ok()) {
        // The swap file, before the trainer's destructor removes it.
        struct stat st;
        const std::string swap_path = absl::StrCat(swap_dir, "/patrickstar-swap-rank0.bin");
        if (stat(swap_path.c_str(), &st) == 0) {
          r.swap_file_bytes = st.st_size;
          r.swap_allocated_bytes = static_cast<int64_t>(st.st_blocks) * 512;
        }
        const TrainSummary& s = (*trainer)->summary();
        r.disk_reads = s.disk_reads;
        r.disk_writes = s.disk_writes;
        r.disk_read_bytes = s.disk_read_bytes;
        r.disk_write_bytes = s.disk_write_bytes;
        r.disk_read_ahead_hits = s.disk_read_ahead_hits;
        r.disk_peak_host_bytes = s.disk_peak_host_bytes;
        r.disk_read_wait_s = s.disk_read_wait_s;
        r.disk_write_wait_s = s.disk_write_wait_s;
        r.trainer_disk_read_bytes_per_s = s.disk_measured_read_bytes_per_s;
        r.trainer_disk_write_bytes_per_s = s.disk_measured_write_bytes_per_s;
        std::snprintf(r.engine, sizeof(r.engine), "%s", s.disk_engine.c_str());
        const std::vector<StepMetrics>& h = (*trainer)->history();
        r.steps = static_cast<int>(std::min<size_t>(h.size(), kMaxSteps));
        for (int i = 0; i < r.steps; ++i) {
          StepRecord& out = r.step[i];
          out.warmup = h[i].warmup;
          out.step_ms = h[i].step_ms;
          out.compute_ms = h[i].compute_ms;
          out.copy_wait_ms = h[i].copy_wait_ms;
          out.optimizer_ms = h[i].optimizer_ms;
          out.disk_wait_ms = h[i].disk_wait_ms;
          out.disk_read_bytes = h[i].disk_read_bytes;
          out.disk_write_bytes = h[i].disk_write_bytes;
        }
      }
    }
    r.ok = status.ok();
    if (!status.ok()) {
      std::snprintf(r.error, sizeof(r.error), "%s", std::string(status.message()).c_str());
    }
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      r.host_peak_bytes = info->process_peak_resident_bytes;
    }
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  });
}

// The trainer's plan (trainer/plan_options.h) for this run, as the trainer reads this machine,
// with the child's baseline resident set.
absl::StatusOr<GptRunPlan> PlanFor(const TrainConfig& c, int64_t baseline_bytes) {
  PlanContext context;
  ASSIGN_OR_RETURN(context.model, PlanModelFromConfig(c));
  context.threads = c.threads;
  RETURN_IF_ERROR(ReadPlanMachine(c, context));
  context.host_resident_bytes = baseline_bytes;
  ASSIGN_OR_RETURN(RunPlan run, PlanRunFromConfig(c, context));
  return std::move(run.plan);
}

// Removes what a run may have left in `dir` (its files are all "patrickstar-*"), then `dir`.
void RemoveSwapDir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      if (absl::StartsWith(e->d_name, "patrickstar-")) names.push_back(e->d_name);
    }
    closedir(d);
    for (const std::string& name : names) unlink(absl::StrCat(dir, "/", name).c_str());
  }
  if (rmdir(dir.c_str()) != 0) {
    std::cerr << "warning: could not remove " << dir << ": " << std::strerror(errno) << "\n";
  }
}

// Reads and writes at once, as the tier does when it reads ahead beside its writes behind: one
// engine, queue_depth requests in flight, alternately a read of a file written before and a write
// of another, `bytes` each, sequential, in blocks of options.block_size; no fdatasync in the timed
// part (the tier never syncs its scratch files), one after it. Returns (read + written bytes) per
// second. Files are named "patrickstar-mixed-*" in options.dir and removed.
absl::StatusOr<double> MeasureMixedBandwidth(const FileChunkSwapOptions& options, int64_t bytes) {
  const int64_t block = options.block_size;
  const int64_t blocks = (bytes + block - 1) / block;
  ASSIGN_OR_RETURN(OpenedIoEngine engine,
                   OpenIoEngine(IoEngineOptions{.kind = options.engine,
                                                .queue_depth = options.queue_depth,
                                                .thread_count = options.thread_count}));
  const std::string base = absl::StrCat(options.dir, "/patrickstar-mixed-", getpid());
  // Removed on SIGINT/SIGTERM too, as the swap's own files (disk/swap_dir.h).
  const int read_handle = RegisterFileForSignalCleanup(base + "-read.bin");
  const int write_handle = RegisterFileForSignalCleanup(base + "-write.bin");
  absl::Cleanup unregister = [&] {
    UnregisterFileForSignalCleanup(read_handle);
    UnregisterFileForSignalCleanup(write_handle);
  };
  ASSIGN_OR_RETURN(SwapFile src, CreateSwapFile(base + "-read.bin", options.dir, options.direct,
                                                /*refuse_direct_for_test=*/false));
  absl::StatusOr<SwapFile> dst_or =
      CreateSwapFile(base + "-write.bin", options.dir, options.direct, false);
  if (!dst_or.ok()) {
    CloseSwapFile(src);
    unlink(src.path.c_str());
    return dst_or.status();
  }
  SwapFile dst = *std::move(dst_or);
  const int depth = options.queue_depth;
  char* buffers = static_cast<char*>(
      std::aligned_alloc(kDirectIoAlignment, static_cast<size_t>(depth * block)));
  const auto cleanup = [&] {
    std::free(buffers);
    CloseSwapFile(src);
    CloseSwapFile(dst);
    unlink(src.path.c_str());
    unlink(dst.path.c_str());
  };
  if (buffers == nullptr) {
    cleanup();
    return absl::ResourceExhaustedError("mixed probe: cannot allocate its buffers");
  }
  std::memset(buffers, 0x5a, static_cast<size_t>(depth * block));
  if (engine.engine->Allocate(src.fd, 0, blocks * block) != 0 ||
      engine.engine->Allocate(dst.fd, 0, blocks * block) != 0) {
    cleanup();
    return absl::ResourceExhaustedError(absl::StrCat("mixed probe: cannot allocate 2 x ",
                                                     blocks * block, " bytes in ", options.dir));
  }
  // Requests: phase 0 writes the source; phase 1 reads it and writes the destination at once.
  // A request's tag is its buffer slot.
  const auto pass = [&](bool mixed, double* seconds) -> absl::Status {
    std::vector<int> free_slots;
    for (int i = depth - 1; i >= 0; --i) free_slots.push_back(i);
    int64_t next_read = 0, next_write = 0, in_flight = 0;
    const int64_t reads = mixed ? blocks : 0;
    bool read_turn = true;
    std::vector<IoCompletion> done;
    const absl::Time start = absl::Now();
    while (next_read < reads || next_write < blocks || in_flight > 0) {
      std::vector<IoRequest> batch;
      while (!free_slots.empty() && (next_read < reads || next_write < blocks)) {
        const int slot = free_slots.back();
        free_slots.pop_back();
        const bool read = next_read < reads && (read_turn || next_write >= blocks);
        read_turn = !read_turn;
        IoRequest r;
        r.fd = read ? (src.direct ? src.fd : src.buffered_fd)
                    : (mixed ? (dst.direct ? dst.fd : dst.buffered_fd)
                             : (src.direct ? src.fd : src.buffered_fd));
        r.offset = (read ? next_read++ : next_write++) * block;
        r.buffer = buffers + slot * block;
        r.bytes = block;
        r.write = !read;
        r.tag = static_cast<uint64_t>(slot);
        batch.push_back(r);
      }
      if (!batch.empty()) {
        RETURN_IF_ERROR(engine.engine->Submit(batch));
        in_flight += static_cast<int64_t>(batch.size());
      }
      done.clear();
      RETURN_IF_ERROR(engine.engine->Reap(1, &done));
      for (const IoCompletion& c : done) {
        if (c.result != block) {
          return absl::DataLossError(absl::StrCat("mixed probe: a request under ", options.dir,
                                                  " returned ", c.result, " of ", block));
        }
        free_slots.push_back(static_cast<int>(c.tag));
        --in_flight;
      }
    }
    *seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  };
  double seconds = 0;
  absl::Status status = pass(/*mixed=*/false, &seconds);
  if (status.ok() && fdatasync(src.fd) != 0) {
    status = absl::InternalError(absl::StrCat("mixed probe: fdatasync ", src.path));
  }
  if (status.ok()) status = pass(/*mixed=*/true, &seconds);
  // Untimed: leave the disk's write cache clean, or the next measurement's flush pays for it.
  if (status.ok() && fdatasync(dst.fd) != 0) {
    status = absl::InternalError(absl::StrCat("mixed probe: fdatasync ", dst.path));
  }
  cleanup();
  if (!status.ok()) return status;
  return 2.0 * static_cast<double>(blocks * block) / std::max(seconds, 1e-9);
}

// `text` as one token of the key=value line (spaces and '=' become '_').
std::string Token(std::string text) {
  for (char& ch : text) {
    if (ch == ' ' || ch == '=' || ch == '\t') ch = '_';
  }
  return text;
}

std::string MiBs(double bytes_per_s) { return absl::StrFormat("%.1f MiB/s", bytes_per_s / kMiB); }
std::string GiB(int64_t bytes) { return absl::StrFormat("%.3f GiB", bytes / double(kGiB)); }
std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / double(kMiB)); }

int Main() {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2 || steps > kMaxSteps) {
    std::cerr << "--steps must be in [2, " << kMaxSteps << "] (the warm-up, then steady steps)\n";
    return 2;
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "f32" && dtype != "bf16") {
    std::cerr << "--dtype must be f32 or bf16, got " << dtype << "\n";
    return 2;
  }
  std::string base = absl::GetFlag(FLAGS_nvme_path);
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string templ = absl::StrCat(base, "/patrickstar-disk-bench-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    std::cerr << "cannot create a directory under " << base
              << " (--nvme_path): " << std::strerror(errno) << "\n";
    return 2;
  }
  const std::string swap_dir = templ;
  const int rc = [&]() -> int {
    absl::StatusOr<std::string> fs = FilesystemName(swap_dir);
    absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(swap_dir);
    absl::StatusOr<HostMemoryInfo> host = ReadHostMemoryInfo();
    std::cout << "swap directory " << swap_dir << " on "
              << (fs.ok() ? *fs : std::string(fs.status().message())) << ", "
              << (free_bytes.ok() ? FormatBytes(*free_bytes) : std::string("?")) << " free\n";
    if (host.ok()) std::cout << "host: " << host->DebugString() << "\n";

    // 1. The disk alone.
    FileChunkSwapOptions swap;
    swap.dir = swap_dir;
    swap.block_size = BytesFlagOrDie("aio_block_size", absl::GetFlag(FLAGS_aio_block_size));
    swap.queue_depth = absl::GetFlag(FLAGS_aio_queue_depth);
    const int64_t probe_bytes = BytesFlagOrDie("disk_probe", absl::GetFlag(FLAGS_disk_probe));
    const auto measure = [&](const char* when) -> absl::StatusOr<DiskBandwidth> {
      // Writes still cached from before (the run's: the tier never syncs its scratch) would be
      // flushed by the probe's fdatasync and counted against the disk: flush them first.
      sync();
      absl::StatusOr<DiskBandwidth> bw = MeasureDiskBandwidth(swap_dir, swap, probe_bytes);
      if (bw.ok()) {
        std::cout << absl::StrFormat(
            "disk alone %s: %s sequential, %s blocks, queue depth %d, engine %s, %s: write %s "
            "(fdatasync included), read %s, one block alone %.2f ms\n",
            when, FormatBytes(probe_bytes), FormatBytes(swap.block_size), swap.queue_depth,
            bw->engine, bw->direct ? std::string("O_DIRECT") : bw->note,
            MiBs(bw->write_bytes_per_s), MiBs(bw->read_bytes_per_s), bw->block_latency_ns * 1e-6);
        std::cout.flush();
      }
      return bw;
    };
    const auto measure_mixed = [&](const char* when) -> absl::StatusOr<double> {
      absl::StatusOr<double> m = MeasureMixedBandwidth(swap, probe_bytes);
      if (m.ok()) {
        std::cout << absl::StrFormat(
            "disk alone %s, reading and writing at once (%s each, no fdatasync, as the tier): "
            "%s read + written\n",
            when, FormatBytes(probe_bytes), MiBs(*m));
        std::cout.flush();
      }
      return m;
    };
    absl::StatusOr<DiskBandwidth> bw = measure("before the run");
    if (!bw.ok()) {
      std::cerr << "measuring the disk: " << bw.status() << "\n";
      return 1;
    }
    absl::StatusOr<double> mixed = measure_mixed("before the run");
    if (!mixed.ok()) {
      std::cerr << "measuring the disk: " << mixed.status() << "\n";
      return 1;
    }

    // 2. Training with the optimizer state on disk.
    absl::StatusOr<TrainConfig> config = MakeConfig(swap_dir);
    if (!config.ok()) {
      std::cerr << "config: " << config.status() << "\n";
      return 2;
    }
    std::cout << absl::StrFormat(
        "training %s %s, micro batch %d x %d tokens, %d steps (1 warm-up), accelerator cap %s, "
        "host budget %s, buffer_count %d, %d threads\n",
        absl::GetFlag(FLAGS_model), dtype, absl::GetFlag(FLAGS_micro_batch_size),
        absl::GetFlag(FLAGS_seq_len), steps, absl::GetFlag(FLAGS_accelerator_memory),
        absl::GetFlag(FLAGS_host_budget), absl::GetFlag(FLAGS_buffer_count),
        absl::GetFlag(FLAGS_threads));
    std::cout.flush();
    const RunResult run = Train(swap_dir);
    if (!run.ok) {
      std::cerr << "training failed: " << run.error << "\n";
      return 1;
    }
    // The disk again after the run (other processes share it): the rates below are the mean.
    absl::StatusOr<DiskBandwidth> bw_after = measure("after the run");
    if (!bw_after.ok()) {
      std::cerr << "measuring the disk: " << bw_after.status() << "\n";
      return 1;
    }
    absl::StatusOr<double> mixed_after = measure_mixed("after the run");
    if (!mixed_after.ok()) {
      std::cerr << "measuring the disk: " << mixed_after.status() << "\n";
      return 1;
    }
    const double M = (*mixed + *mixed_after) / 2;
    const double R = (bw->read_bytes_per_s + bw_after->read_bytes_per_s) / 2;
    const double W = (bw->write_bytes_per_s + bw_after->write_bytes_per_s) / 2;
    absl::StatusOr<GptRunPlan> planned = PlanFor(*config, run.host_baseline_bytes);
    if (!planned.ok()) {
      std::cerr << "plan: " << planned.status() << "\n";
      return 1;
    }
    const MemoryPlan& plan = planned->plan;

    // Per step.
    std::cout << "\n| step | step s | compute s | copy wait s | optimizer s | disk wait s | "
                 "disk read | disk written | disk at measured rates s | state I/O (in optimizer) "
                 "| fraction of disk | step / max(compute, disk) |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    StepRecord steady;
    int steady_steps = 0;
    for (int i = 0; i < run.steps; ++i) {
      const StepRecord& s = run.step[i];
      const double disk_s = DiskSeconds(s.disk_read_bytes, s.disk_write_bytes, R, W);
      const double opt_s = s.optimizer_ms * 1e-3;
      std::cout << absl::StrFormat(
          "| %d%s | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %.2f | %s | %.2f | %.2f |\n",
          i + 1, s.warmup ? " (warm-up)" : "", s.step_ms * 1e-3, s.compute_ms * 1e-3,
          s.copy_wait_ms * 1e-3, opt_s, s.disk_wait_ms * 1e-3, GiB(s.disk_read_bytes),
          GiB(s.disk_write_bytes), disk_s,
          MiBs((s.disk_read_bytes + s.disk_write_bytes) / std::max(opt_s, 1e-9)),
          disk_s / std::max(opt_s, 1e-9),
          s.step_ms * 1e-3 / std::max({s.compute_ms * 1e-3, disk_s, 1e-9}));
      if (s.warmup) continue;
      ++steady_steps;
      steady.step_ms += s.step_ms;
      steady.compute_ms += s.compute_ms;
      steady.copy_wait_ms += s.copy_wait_ms;
      steady.optimizer_ms += s.optimizer_ms;
      steady.disk_wait_ms += s.disk_wait_ms;
      steady.disk_read_bytes += s.disk_read_bytes;
      steady.disk_write_bytes += s.disk_write_bytes;
    }
    if (steady_steps == 0) {
      std::cerr << "no steady step to measure\n";
      return 1;
    }
    const double n = steady_steps;
    const double step_s = steady.step_ms * 1e-3 / n;
    const double compute_s = steady.compute_ms * 1e-3 / n;
    const double copy_wait_s = steady.copy_wait_ms * 1e-3 / n;
    const double optimizer_s = steady.optimizer_ms * 1e-3 / n;
    const double disk_wait_s = steady.disk_wait_ms * 1e-3 / n;
    const double read_b = steady.disk_read_bytes / n, write_b = steady.disk_write_bytes / n;
    const double disk_s = DiskSeconds(read_b, write_b, R, W);
    const double io_bytes_per_s = (read_b + write_b) / optimizer_s;
    const double disk_fraction = disk_s / optimizer_s;
    // The same if the disk served reads and writes at once, each at its own rate.
    const double duplex_fraction = std::max(read_b / R, write_b / W) / optimizer_s;
    // Against the disk reading and writing at once (the mixed probe).
    const double mixed_fraction = io_bytes_per_s / M;
    const double mixed_disk_s = (read_b + write_b) / M;
    const double mixed_step_ratio = step_s / std::max(compute_s, mixed_disk_s);
    const double bound_s = std::max(compute_s, disk_s);
    const double step_ratio = step_s / bound_s;
    // Against nothing overlapped: compute, then the disk.
    const double serial_ratio = step_s / (compute_s + disk_s);
    const double plan_disk_s = DiskStepSeconds(plan, R, W);
    const double host_expected_ratio = double(plan.host_expected_peak_bytes) / run.host_peak_bytes;
    const double host_bound_ratio = double(plan.host_peak_bytes) / run.host_peak_bytes;

    std::cout << absl::StrFormat(
        "\nsteady steps (mean of %d):\n"
        "| quantity | value | goal |\n|---|---|---|\n"
        "| disk alone: write / read (%s) | %s / %s | |\n"
        "| state I/O in the optimizer phase: (read + written) / optimizer time | %s | |\n"
        "| fraction of the disk: (read/R + written/W) / optimizer time | %.2f | >= 0.80 %s |\n"
        "| the same if reads and writes overlapped: max(read/R, written/W) / optimizer time | "
        "%.2f | |\n"
        "| disk alone reading and writing at once (mixed probe) | %s | |\n"
        "| fraction of the mixed probe: state I/O / mixed | %.2f | >= 0.80 %s |\n"
        "| step time | %.2f s | |\n"
        "| max(compute %.2f s, disk at measured rates %.2f s) | %.2f s | |\n"
        "| step / max(compute, disk) | %.2fx | <= 1.15x %s |\n"
        "| step / (compute + disk), nothing overlapped | %.2fx | |\n"
        "| step / max(compute, (read + written) / mixed = %.2f s) | %.2fx | <= 1.15x %s |\n"
        "| where the step goes: compute / copy waits / optimizer (disk waits) / rest | %.2f / "
        "%.2f / %.2f (%.2f) / %.2f s | |\n"
        "| host peak: plan bound / plan expected / measured VmHWM | %s / %s / %s | |\n"
        "| plan expected / measured | %.3f (%+.1f%%) | within 5%% %s |\n"
        "| plan bound / measured | %.3f | >= 1 %s |\n"
        "| tier host peak / budget | %s / %s | <= 1 %s |\n"
        "| swap: plan slots / file size / allocated | %s / %s / %s | |\n"
        "| disk read per step: plan (upper bound) / measured | %s / %s | |\n"
        "| disk written per step: plan / measured | %s / %s | |\n"
        "| disk time per step the plan implies at the measured rates | %.2f s | |\n"
        "| run: disk reads / writes / read-ahead hits; read / write waits | %d / %d / %d; %.2f / "
        "%.2f s | |\n"
        "| trainer's own probe at start (256 MiB): write / read | %s / %s | |\n",
        steady_steps, bw->direct ? "O_DIRECT" : "buffered", MiBs(W), MiBs(R), MiBs(io_bytes_per_s),
        disk_fraction, disk_fraction >= 0.80 ? "met" : "NOT met", duplex_fraction, MiBs(M),
        mixed_fraction, mixed_fraction >= 0.80 ? "met" : "NOT met", step_s, compute_s, disk_s,
        bound_s, step_ratio, step_ratio <= 1.15 ? "met" : "NOT met", serial_ratio, mixed_disk_s,
        mixed_step_ratio, mixed_step_ratio <= 1.15 ? "met" : "NOT met", compute_s, copy_wait_s,
        optimizer_s, disk_wait_s, step_s - compute_s - copy_wait_s - optimizer_s,
        MiB(plan.host_peak_bytes), MiB(plan.host_expected_peak_bytes), MiB(run.host_peak_bytes),
        host_expected_ratio, 100 * (host_expected_ratio - 1),
        std::abs(host_expected_ratio - 1) <= 0.05 ? "met" : "NOT met", host_bound_ratio,
        host_bound_ratio >= 1 ? "met" : "NOT met", MiB(run.disk_peak_host_bytes),
        MiB(planned->disk_host_budget_bytes),
        run.disk_peak_host_bytes <= planned->disk_host_budget_bytes ? "met" : "NOT met",
        GiB(plan.disk_bytes), GiB(run.swap_file_bytes), GiB(run.swap_allocated_bytes),
        GiB(plan.disk_read_bytes_per_step), GiB(static_cast<int64_t>(read_b)),
        GiB(plan.disk_write_bytes_per_step), GiB(static_cast<int64_t>(write_b)), plan_disk_s,
        run.disk_reads, run.disk_writes, run.disk_read_ahead_hits, run.disk_read_wait_s,
        run.disk_write_wait_s, MiBs(run.trainer_disk_write_bytes_per_s),
        MiBs(run.trainer_disk_read_bytes_per_s));
    std::cout << absl::StrFormat(
        "disk_tier_benchmark: model=%s dtype=%s steps=%d overlap=%d gradient_clipping=%g "
        "filesystem=%s engine=%s direct=%d "
        "block_size=%d queue_depth=%d disk_write_bytes_per_s=%.0f disk_read_bytes_per_s=%.0f "
        "step_s=%.3f compute_s=%.3f copy_wait_s=%.3f optimizer_s=%.3f disk_wait_s=%.3f "
        "disk_read_bytes_per_step=%.0f disk_write_bytes_per_step=%.0f disk_s=%.3f "
        "state_io_bytes_per_s=%.0f disk_fraction=%.3f duplex_fraction=%.3f step_over_bound=%.3f "
        "step_over_serial=%.3f mixed_bytes_per_s=%.0f mixed_fraction=%.3f "
        "step_over_mixed_bound=%.3f "
        "plan_host_peak_bytes=%d plan_host_expected_peak_bytes=%d host_vmhwm_bytes=%d "
        "host_expected_over_measured=%.4f plan_disk_bytes=%d swap_file_bytes=%d "
        "plan_disk_read_bytes_per_step=%d plan_disk_write_bytes_per_step=%d "
        "tier_host_peak_bytes=%d host_budget_bytes=%d run_s=%.1f\n",
        absl::GetFlag(FLAGS_model), dtype, steps, absl::GetFlag(FLAGS_overlap) ? 1 : 0,
        absl::GetFlag(FLAGS_gradient_clipping), Token(fs.ok() ? *fs : "?"), Token(bw->engine),
        bw->direct ? 1 : 0, swap.block_size, swap.queue_depth, W, R, step_s, compute_s, copy_wait_s,
        optimizer_s, disk_wait_s, read_b, write_b, disk_s, io_bytes_per_s, disk_fraction,
        duplex_fraction, step_ratio, serial_ratio, M, mixed_fraction, mixed_step_ratio,
        plan.host_peak_bytes, plan.host_expected_peak_bytes, run.host_peak_bytes,
        host_expected_ratio, plan.disk_bytes, run.swap_file_bytes, plan.disk_read_bytes_per_step,
        plan.disk_write_bytes_per_step, run.disk_peak_host_bytes, planned->disk_host_budget_bytes,
        run.seconds);
    return 0;
  }();
  RemoveSwapDir(swap_dir);
  return rc;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
