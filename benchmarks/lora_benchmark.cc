// LoRA over chunks (issue #28): a 7B-class LoRA fine-tune on this machine under a 1 GiB
// accelerator cap, where a full fine-tune of the same model cannot run, with the plan's peaks
// against the measured ones and the step against its physical limits, in one run:
//  1. the plans (model/gpt_activation_profile.h PlanGptRun, through the trainer's own conversion
//     of the config, trainer/plan_options.h PlanRunFromConfig): the LoRA run's
//     (GptModelOptions::lora: a frozen base in param-only chunks of the compute dtype, the adapters
//     with their full training state) — its host peak (the safe bound host_peak_bytes and the
//     expected host_expected_peak_bytes) and its accelerator peak — and a FULL fine-tune's of the
//     same model and shape: its host need against this machine's memory (memory/host_memory_info.h)
//     and, when it does not fit, the plan's own refusal (CheckGptRunFits);
//  2. the LoRA training run (trainer/trainer.h Trainer; model --model, a seeded random base unless
//     --init_from names a Hugging Face directory, lora r --lora_r, lora_alpha --lora_alpha on
//     --lora_target_modules, --dtype, micro batch --micro_batch_size x --seq_len, activation
//     checkpointing, --steps steps of which the first is the scheduler's warm-up, the emulated
//     accelerator capped at --accelerator_memory) in a child process (fork) so that the child's
//     peak resident set (VmHWM) is the run's host peak: per step the time and where it goes
//     (compute, waits for chunk copies, the optimizer), the chunk bytes loaded and written back,
//     the accelerator's peak (the trainer's MemoryTracker: model + non-model bytes at once), and
//     over the run the bytes of frozen (base) chunks ever copied back to the host (must be 0);
//  3. the yardsticks, measured in the same run after the training child ended (so the probes'
//     threads and buffers are not in the child's resident set): the link — the emulated
//     accelerator's host -> device copy rate (the cpu backend's own MemcpyAsync of --link_probe
//     bytes, unthrottled: a host memcpy through the copy engine the run uses) — and the GEMM rate
//     of the compute dtype (kernels_internal::Gemm / GemmBf16 on the run's thread count, the
//     kernels the model's products use). The step's physical minimum on the link: each pass over
//     the base (the forward, then the backward with its recompute, which uses each block's chunks
//     right after the recompute) must load every base byte the accelerator cannot keep, so at
//     least 2 x max(0, base param bytes - cap) per step; against the measured loaded bytes and the
//     probe's rate. The step's useful FLOPs (model/model_config.h ModelTrainingFlops with the
//     frozen base's backward computing input gradients only: linear and head 4 of the 6 FLOPs per
//     weight and token, attention all of it, plus the adapters' 2 r (in + out) forward and
//     6 r (in + out) forward and backward per token) over the compute time, against the probe
//     (the mean of a GEMM probe right before the training child and one right after it);
//  4. (issue #38, --gemm_breakdown, Llama architecture) every GEMM of the step alone at its shape
//     — the base projections' forward and dX, the LoRA rank-r side GEMMs, the LM head's tiles —
//     with its fraction of the probe (benchmarks/internal/gemm_breakdown.h), and the skinny-GEMM
//     grid against the former 64-row grid in alternating calls of the same run.
//
//   bazel run -c opt //benchmarks:lora_benchmark -- --model=llama-2-7b --steps=2
//       (the headline: about 17 GiB of host memory, the plan's bound, and minutes per step on a
//       few cores; the defaults are the shape: bf16, r 16, lora_alpha 32, q/k/v/o_proj,
//       1 x 128 tokens, a 1 GiB accelerator cap)
//   bazel run -c opt //benchmarks:lora_benchmark -- --model=llama-2-7b --steps=2 --load_in_4bit
//       (QLoRA, issue #37: the base's block linears in 4 bits, nf4 with double quantization by
//       default — --bnb_4bit_quant_type, --bnb_4bit_use_double_quant, --bnb_4bit_compute_dtype —
//       and the bytes per base parameter printed)
//   bazel run -c opt //benchmarks:lora_benchmark -- --model=llama-2-7b --plan_only
//   bazel run -c opt //benchmarks:lora_benchmark -- --model=llama-2-7b --layers=2 --steps=3
//       (the 7B widths, vocabulary and LM head with 2 layers: ~2.4 GiB of host memory)
//   bazel run -c opt //benchmarks:lora_benchmark -- --model=llama-2-7b --gemm_breakdown_only
//   bazel run -c opt //benchmarks:lora_benchmark -- --model=gpt2
//       --lora_target_modules=c_attn,c_proj --accelerator_memory=128MiB    (small shapes)
//
// --plan_only prints the plans (1.) and exits: no training, no probes (cheap for 7B). Prints the
// tables on stdout and one machine-readable line "lora_benchmark: key=value ..."; the trainer's
// progress lines and summary go to stderr. Exit status 0 when the LoRA run trained, 1 when it
// failed (the error on stderr), 2 for bad flags.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "benchmarks/internal/child_run.h"
#include "benchmarks/internal/gemm_breakdown.h"
#include "chunk/operator_spec.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/dtype.h"
#include "memory/host_memory_info.h"
#include "model/gpt_activation_profile.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "scheduler/memory_plan.h"
#include "trainer/config.h"
#include "trainer/config_overrides.h"
#include "trainer/config_validate.h"
#include "trainer/plan_options.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, model, "llama-2-7b",
          "model preset (as the trainer's --model); ignored with --init_from");
ABSL_FLAG(std::string, init_from, "",
          "a Hugging Face model directory for the base (its config.json decides the model); "
          "empty: a seeded random base");
ABSL_FLAG(std::string, train_data, "",
          "an llm.c .bin token file (data.train); empty: the trainer's built-in synthetic corpus "
          "(byte-level: needs a vocabulary of at least 256)");
ABSL_FLAG(std::string, dtype, "bf16", "compute dtype: bf16 or f32");
ABSL_FLAG(int64_t, micro_batch_size, 1, "sequences per step");
ABSL_FLAG(int64_t, seq_len, 128, "tokens per sequence");
ABSL_FLAG(int64_t, steps, 2, "training steps: the warm-up, then steady ones (>= 2)");
ABSL_FLAG(std::string, accelerator_memory, "1GiB", "the emulated accelerator's memory cap");
ABSL_FLAG(std::string, chunk_size, "auto", "chunk.size: elements or \"auto\"");
ABSL_FLAG(int64_t, lora_r, 16, "lora.r");
ABSL_FLAG(double, lora_alpha, 32, "lora.lora_alpha");
ABSL_FLAG(double, lora_dropout, 0, "lora.lora_dropout");
ABSL_FLAG(std::string, lora_target_modules, "q_proj,k_proj,v_proj,o_proj",
          "lora.target_modules, comma-separated (GPT-2: c_attn, c_proj, c_fc)");
ABSL_FLAG(bool, activation_checkpointing, true, "model.activation_checkpointing");
ABSL_FLAG(bool, load_in_4bit, false,
          "QLoRA: quantization.load_in_4bit (the base's block linears in 4 bits)");
ABSL_FLAG(std::string, bnb_4bit_quant_type, "nf4",
          "quantization.bnb_4bit_quant_type with --load_in_4bit (QLoRA's recipe: nf4)");
ABSL_FLAG(bool, bnb_4bit_use_double_quant, true,
          "quantization.bnb_4bit_use_double_quant with --load_in_4bit (QLoRA's recipe: true)");
ABSL_FLAG(std::string, bnb_4bit_compute_dtype, "float32",
          "quantization.bnb_4bit_compute_dtype with --load_in_4bit: float32, bfloat16, float16");
ABSL_FLAG(int, threads, 0, "the model's threads (0: one per hardware thread, as the trainer)");
ABSL_FLAG(std::string, link_probe, "256MiB", "bytes of the host -> accelerator copy probe");
ABSL_FLAG(bool, plan_only, false, "print the plans and exit (no training, no probes)");
ABSL_FLAG(int64_t, layers, 0,
          "keep only this many layers of the preset (0: all): the real widths, vocabulary and "
          "attention shape with fewer layers, e.g. a llama-2-7b step that fits a small machine");
ABSL_FLAG(bool, gemm_breakdown, true,
          "after the run: time each GEMM of the step (base projections, LoRA side GEMMs, LM head "
          "tiles) alone at its shape, against the GEMM probe (benchmarks/internal/"
          "gemm_breakdown.h); Llama architecture only");
ABSL_FLAG(bool, gemm_breakdown_only, false,
          "print the plans and the GEMM breakdown (with its probes) and exit: no training");

namespace ps {
namespace {

constexpr int kMaxSteps = 64;

struct StepRecord {
  bool warmup = false;
  double loss = 0;
  double step_ms = 0, compute_ms = 0, copy_wait_ms = 0, optimizer_ms = 0;
  int64_t loaded_bytes = 0, written_back_bytes = 0, evictions = 0, pressure_reclaims = 0;
  int64_t accelerator_peak_total_bytes = 0;
};

// What the child sends back (plain bytes through a pipe).
struct RunResult {
  bool ok = false;
  int64_t host_baseline_bytes = 0;  // the child's resident set before Trainer::Create
  int64_t host_created_bytes = 0;   // after Trainer::Create (base initialized or loaded)
  int64_t host_peak_bytes = 0;      // its VmHWM at the end
  int64_t accelerator_peak_total_bytes = 0;
  int64_t accelerator_peak_model_bytes = 0;
  int64_t accelerator_peak_non_model_bytes = 0;
  int64_t loaded_bytes = 0, written_back_bytes = 0, frozen_writeback_bytes = 0;
  int64_t loads = 0, write_backs = 0, clean_evictions = 0, prefetch_hits = 0, prefetches = 0;
  int64_t pressure_reclaims = 0, rank_model_data_bytes = 0;
  // The trainer's own pre-flight plan, to check that the benchmark plans the same run.
  int64_t trainer_plan_accelerator_peak_bytes = 0, trainer_plan_host_peak_bytes = 0;
  double create_s = 0, seconds = 0;
  int steps = 0;
  StepRecord step[kMaxSteps];
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

int Threads() {
  const int t = absl::GetFlag(FLAGS_threads);
  return t > 0 ? t : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// The run's TrainConfig: the trainer's defaults (synthetic data, seed 0) with the flags, through
// the trainer's own override plumbing. `lora` false: the same run as a full fine-tune.
absl::StatusOr<TrainConfig> MakeConfig(bool lora) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  if (absl::GetFlag(FLAGS_init_from).empty()) {
    o.model = absl::GetFlag(FLAGS_model);
  } else {
    o.init_from = absl::GetFlag(FLAGS_init_from);
  }
  if (!absl::GetFlag(FLAGS_train_data).empty()) o.train_data = absl::GetFlag(FLAGS_train_data);
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.accelerator_memory = absl::GetFlag(FLAGS_accelerator_memory);
  o.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  if (lora) {
    o.lora_r = absl::GetFlag(FLAGS_lora_r);
    o.lora_alpha = absl::GetFlag(FLAGS_lora_alpha);
    o.lora_dropout = absl::GetFlag(FLAGS_lora_dropout);
    o.lora_target_modules = absl::GetFlag(FLAGS_lora_target_modules);
  }
  RETURN_IF_ERROR(ApplyOverrides(o, &c));
  if (absl::GetFlag(FLAGS_layers) > 0) c.model.num_layers = absl::GetFlag(FLAGS_layers);
  c.bf16 = absl::GetFlag(FLAGS_dtype) == "bf16";
  if (lora && absl::GetFlag(FLAGS_load_in_4bit)) {
    c.quantization.load_in_4bit = true;
    ASSIGN_OR_RETURN(c.quantization.quant_type,
                     ParseQuant4Type(absl::GetFlag(FLAGS_bnb_4bit_quant_type)));
    c.quantization.double_quant = absl::GetFlag(FLAGS_bnb_4bit_use_double_quant);
    const std::string compute = absl::GetFlag(FLAGS_bnb_4bit_compute_dtype);
    if (compute == "float32") {
      c.quantization.compute_dtype = DType::kF32;
    } else if (compute == "bfloat16") {
      c.quantization.compute_dtype = DType::kBF16;
    } else if (compute == "float16") {
      c.quantization.compute_dtype = DType::kF16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--bnb_4bit_compute_dtype must be float32, bfloat16 or float16, got ", compute));
    }
  }
  c.threads = Threads();
  c.model.activation_checkpointing = absl::GetFlag(FLAGS_activation_checkpointing);
  // Only training steps are measured: no validation passes (each a forward over the base).
  c.data.eval_every = 0;
  RETURN_IF_ERROR(ValidateTrainConfig(c));
  return c;
}

// The trainer's pre-flight plan context (trainer/plan_options.h) of `c` on this machine, one
// rank, with `resident_bytes` already resident.
absl::StatusOr<PlanContext> BenchContext(const TrainConfig& c, const ModelConfig& model,
                                         int64_t resident_bytes) {
  PlanContext context;
  context.model = model;
  context.threads = c.threads;
  RETURN_IF_ERROR(ReadPlanMachine(c, context));
  context.host_resident_bytes = resident_bytes;
  return context;
}

// The trainer's run in a child process.
RunResult Train(const TrainConfig& config) {
  return benchmarks_internal::RunInChild<RunResult>([&](RunResult& r) {
    const absl::Time start = absl::Now();
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      r.host_baseline_bytes = info->process_resident_bytes;
    }
    TrainerEnvironment env;
    env.out = &std::cerr;  // progress lines and the summary, apart from the tables
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, env);
    absl::Status status = trainer.status();
    r.create_s = absl::ToDoubleSeconds(absl::Now() - start);
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      r.host_created_bytes = info->process_resident_bytes;
    }
    if (status.ok()) status = (*trainer)->Run();
    if (status.ok()) {
      const TrainSummary& s = (*trainer)->summary();
      r.accelerator_peak_total_bytes = s.accelerator_peak_total_bytes;
      r.accelerator_peak_model_bytes = s.accelerator_peak_model_bytes;
      r.accelerator_peak_non_model_bytes = s.accelerator_peak_non_model_bytes;
      r.loaded_bytes = s.loaded_bytes;
      r.written_back_bytes = s.written_back_bytes;
      r.frozen_writeback_bytes = s.frozen_writeback_bytes;
      r.loads = s.loads;
      r.write_backs = s.write_backs;
      r.clean_evictions = s.clean_evictions;
      r.prefetches = s.prefetches;
      r.prefetch_hits = s.prefetch_hits;
      r.pressure_reclaims = s.pressure_reclaims;
      r.rank_model_data_bytes = s.rank_model_data_bytes;
      r.trainer_plan_accelerator_peak_bytes = s.planned_accelerator_peak_bytes;
      r.trainer_plan_host_peak_bytes = s.planned_host_peak_bytes;
      const std::vector<StepMetrics>& h = (*trainer)->history();
      r.steps = static_cast<int>(std::min<size_t>(h.size(), kMaxSteps));
      for (int i = 0; i < r.steps; ++i) {
        StepRecord& out = r.step[i];
        out.warmup = h[i].warmup;
        out.loss = h[i].loss;
        out.step_ms = h[i].step_ms;
        out.compute_ms = h[i].compute_ms;
        out.copy_wait_ms = h[i].copy_wait_ms;
        out.optimizer_ms = h[i].optimizer_ms;
        out.loaded_bytes = h[i].loaded_bytes;
        out.written_back_bytes = h[i].written_back_bytes;
        out.evictions = h[i].evictions;
        out.pressure_reclaims = h[i].pressure_reclaims;
        out.accelerator_peak_total_bytes = h[i].accelerator_peak_total_bytes;
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

// --- Yardsticks ---------------------------------------------------------------------------------

// Host -> accelerator bytes per second through the emulated accelerator's copy engine (the cpu
// backend, unthrottled, as the run's): best of 5 copies of `bytes`.
absl::StatusOr<double> MeasureLinkBytesPerS(int64_t bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   CreateCpuBackend({.capacity_bytes = bytes, .max_cached_bytes = 0}));
  ASSIGN_OR_RETURN(void* device, backend->AllocateDevice(bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend->CreateStream());
  std::vector<uint8_t> host(static_cast<size_t>(bytes), 1);
  double best = 1e30;
  absl::Status status;
  for (int i = 0; i < 6 && status.ok(); ++i) {  // the first touches the pages: not counted
    const absl::Time t0 = absl::Now();
    status = stream->MemcpyAsync(device, host.data(), bytes, CopyKind::kHostToDevice);
    if (status.ok()) status = stream->Synchronize();
    if (i > 0) best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
  }
  stream.reset();
  const absl::Status freed = backend->FreeDevice(device);
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(freed);
  return static_cast<double>(bytes) / best;
}

// FLOP/s of a square n^3 product of the compute dtype's GEMM on `pool`, best of `reps`.
double GemmFlopsPerS(DType dtype, int64_t n, int reps, ThreadPool* pool) {
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    b[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
  }
  std::vector<uint16_t> a16, b16;
  if (dtype == DType::kBF16) {
    a16.resize(a.size());
    b16.resize(b.size());
    kernels_internal::RoundToBf16(a.data(), a16.data(), n * n, pool);
    kernels_internal::RoundToBf16(b.data(), b16.data(), n * n, pool);
  }
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // the first warms up: not counted
    const absl::Time t0 = absl::Now();
    if (dtype == DType::kBF16) {
      const absl::Status s = kernels_internal::GemmBf16({.m = n,
                                                         .n = n,
                                                         .k = n,
                                                         .a = a16.data(),
                                                         .lda = n,
                                                         .b = b16.data(),
                                                         .ldb = n,
                                                         .c = c.data(),
                                                         .ldc = n},
                                                        pool);
      if (!s.ok()) {
        std::cerr << "bf16 GEMM probe: " << s << "\n";
        return 0;
      }
    } else {
      kernels_internal::Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                             n, pool);
    }
    if (r > 0) best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}

// The GEMM breakdown (benchmarks/internal/gemm_breakdown.h) of the LoRA step's shapes, against the
// mean of `probe_before` and a probe right after it; Llama architecture only. Returns the GEMMs'
// seconds per step (0 when skipped).
double GemmBreakdown(const ModelConfig& model, const LoraConfig& lora, DType dtype,
                     bool activation_checkpointing, double probe_before) {
  if (model.architecture() == ModelArchitecture::kGpt2) {
    std::cout << "\n(GEMM breakdown: Llama architecture only; skipped)\n";
    return 0;
  }
  ThreadPool pool(Threads());
  benchmarks_internal::GemmBreakdownShape shape;
  shape.rows = absl::GetFlag(FLAGS_micro_batch_size) * absl::GetFlag(FLAGS_seq_len);
  shape.hidden = model.hidden_size;
  shape.q_dim = model.q_size();
  shape.kv_dim = model.kv_size();
  shape.intermediate = model.intermediate_size;
  shape.vocab = model.vocab_size;
  shape.layers = model.num_layers;
  shape.bf16 = dtype == DType::kBF16;
  shape.frozen_base = true;
  shape.activation_checkpointing = activation_checkpointing;
  shape.lora_rank = lora.r;
  shape.lora_targets = lora.target_modules;
  const std::vector<benchmarks_internal::GemmBreakdownRow> rows =
      benchmarks_internal::TimeLlamaGemms(shape, 2, &pool);
  const double probe_after =
      std::max(GemmFlopsPerS(dtype, 1024, 3, &pool), GemmFlopsPerS(dtype, 2048, 2, &pool));
  std::cout.flush();
  const double sum = benchmarks_internal::PrintGemmBreakdown(
      rows, 0.5 * (probe_before + probe_after),
      absl::StrFormat("%s GEMM: the mean of the probes before (%.1f) and after (%.1f GFLOP/s)",
                      dtype == DType::kBF16 ? "bf16" : "f32", probe_before / 1e9,
                      probe_after / 1e9));
  benchmarks_internal::PrintSkinnyGridAb(shape, 3, &pool);
  std::fflush(stdout);
  return sum;
}

// --- Counting -----------------------------------------------------------------------------------

struct ParamCounts {
  int64_t frozen_elems = 0, trainable_elems = 0;
};

ParamCounts CountParams(const std::vector<OperatorSpec>& ops) {
  ParamCounts p;
  for (const OperatorSpec& op : ops) {
    int64_t n = 0;
    for (const TensorSpec& t : op.tensors) n += t.numel();
    (op.trainable ? p.trainable_elems : p.frozen_elems) += n;
  }
  return p;
}

// Useful FLOPs of one LoRA step (see the file comment): the frozen base's backward computes only
// input gradients (4 of ModelTrainingFlops' 6 FLOPs per weight and token of the linear layers and
// the head), attention in full, the adapters 6 r (in + out) per token; recompute not counted.
double LoraStepFlops(const ModelConfig& model, const LoraConfig& lora, int64_t batch,
                     int64_t seq_len) {
  const ModelFlops f = ModelTrainingFlops(model, batch, seq_len);
  double adapters = 0;
  for (const LoraTarget& t : LoraTargets(model, lora)) {
    adapters += 6.0 * static_cast<double>(lora.r) * static_cast<double>(t.in + t.out);
  }
  return (f.linear + f.head) * 4.0 / 6.0 + f.attention +
         adapters * static_cast<double>(batch * seq_len);
}

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", bytes / double(kGiB)); }
std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / double(kMiB)); }
std::string GBs(double bytes_per_s) { return absl::StrFormat("%.2f GB/s", bytes_per_s / 1e9); }
double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// A plan and whether the trainer would accept it: PlanGptRun's error (e.g. the model data alone
// exceeds what the OS can give), else CheckGptRunFits'.
struct PlanOutcome {
  absl::StatusOr<GptRunPlan> plan;
  absl::Status fits;
};

PlanOutcome Plan(const TrainConfig& config, const absl::StatusOr<PlanContext>& context) {
  if (!context.ok()) return PlanOutcome{context.status(), context.status()};
  absl::StatusOr<RunPlan> run = PlanRunFromConfig(config, *context);
  if (!run.ok()) return PlanOutcome{run.status(), run.status()};
  return PlanOutcome{run->plan, CheckRunPlan(*run, /*enforce_accelerator=*/true)};
}

// One plan's row of the plan table (none when it could not be planned).
void PrintPlanRow(const char* name, const PlanOutcome& p) {
  if (!p.plan.ok()) {
    std::cout << "| " << name << " | not planned (below) | | | | | | | REFUSED |\n";
    return;
  }
  const MemoryPlan& m = p.plan->plan;
  std::cout << absl::StrFormat("| %s | %d (%s) | %d x %s | %s | %s | %s | %s | %s | %s |\n", name,
                               m.chunk_elems, p.plan->chunk_note, m.num_chunks,
                               MiB(m.param_chunk_bytes), GiB(m.rank_model_data_bytes),
                               GiB(m.host_peak_bytes), GiB(m.host_expected_peak_bytes),
                               MiB(m.predicted_accelerator_peak_bytes),
                               MiB(m.min_accelerator_bytes), p.fits.ok() ? "fits" : "REFUSED");
}

// One plan's verdict against this machine, with the plan's own refusal when it refuses.
void PrintPlanLine(const char* name, const PlanOutcome& p, const ModelConfig& model,
                   int64_t host_total, int64_t host_available) {
  std::string numbers;
  if (p.plan.ok()) {
    const MemoryPlan& m = p.plan->plan;
    numbers = absl::StrFormat(
        "host %s bound / %s expected (model data %s: %.2f B per parameter) against %s RAM, %s "
        "available; ",
        GiB(m.host_peak_bytes), GiB(m.host_expected_peak_bytes), GiB(m.rank_model_data_bytes),
        Ratio(m.rank_model_data_bytes, ModelParameterCount(model)), GiB(host_total),
        GiB(host_available));
  }
  std::cout << name << " plan: " << numbers
            << (p.fits.ok() ? std::string("fits") : absl::StrCat("refused: ", p.fits.message()))
            << "\n";
}

int Main() {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2 || steps > kMaxSteps) {
    std::cerr << "--steps must be in [2, " << kMaxSteps << "] (the warm-up, then steady steps)\n";
    return 2;
  }
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  if (dtype_name != "f32" && dtype_name != "bf16") {
    std::cerr << "--dtype must be f32 or bf16, got " << dtype_name << "\n";
    return 2;
  }
  absl::StatusOr<TrainConfig> lora_config = MakeConfig(/*lora=*/true);
  absl::StatusOr<TrainConfig> full_config = MakeConfig(/*lora=*/false);
  if (!lora_config.ok() || !full_config.ok()) {
    std::cerr << "config: " << (lora_config.ok() ? full_config.status() : lora_config.status())
              << "\n";
    return 2;
  }
  absl::StatusOr<ModelConfig> model = PlanModelFromConfig(*lora_config);
  if (!model.ok()) {
    std::cerr << "model: " << model.status() << "\n";
    return 2;
  }
  const LoraConfig lora = ToLoraConfig(*lora_config->lora);
  if (absl::Status s = ValidateLoraConfig(*model, lora); !s.ok()) {
    std::cerr << "lora: " << s.message() << "\n";
    return 2;
  }
  const DType dtype = ComputeDType(lora_config->precision());
  const int64_t cap = lora_config->accelerator.memory_bytes;
  const ParamCounts params = CountParams(LoraModelOperators(*model, lora));
  const std::optional<Quant4Config> quant4 = ToQuant4Config(lora_config->quantization);
  if (quant4.has_value()) {
    if (absl::Status s = ValidateQuant4Config(*model, &lora, *quant4); !s.ok()) {
      std::cerr << "quantization: " << s.message() << "\n";
      return 2;
    }
  }
  // The 4-bit weights take their blobs' bytes; the rest of the base its compute dtype's.
  const Quant4Totals q4 = Quant4BaseTotals(*model, lora, quant4, dtype);
  const int64_t base_param_bytes = (params.frozen_elems - q4.values) * SizeOf(dtype) +
                                   q4.stored_bytes;
  absl::StatusOr<HostMemoryInfo> host = ReadHostMemoryInfo();
  const int64_t host_total = host.ok() ? host->mem_total_bytes : 0;
  const int64_t host_available = host.ok() ? host->available_bytes() : 0;
  const int64_t resident = host.ok() ? host->process_resident_bytes : 0;

  std::cout << absl::StrFormat(
      "%s fine-tune of %s (%s), %s, r %d, lora_alpha %g, targets %s, micro batch %d x %d "
      "tokens, activation checkpointing %s, accelerator cap %s (emulated), %d threads\n",
      quant4.has_value() ? "QLoRA" : "LoRA", model->name,
      absl::GetFlag(FLAGS_init_from).empty() ? "seeded random base"
                                             : "base from " + absl::GetFlag(FLAGS_init_from),
      dtype_name, lora.r, lora.lora_alpha, absl::StrJoin(lora.target_modules, ","),
      absl::GetFlag(FLAGS_micro_batch_size), absl::GetFlag(FLAGS_seq_len),
      lora_config->model.activation_checkpointing ? "on" : "off", FormatBytes(cap), Threads());
  if (host.ok()) {
    std::cout << "host: " << FormatBytes(host_total) << " RAM; " << host->DebugString() << "\n";
  }
  std::cout << absl::StrFormat(
      "parameters: base (frozen) %d = %s in %s, adapters (trainable) %d = %.3f%% of the base\n",
      params.frozen_elems, GiB(base_param_bytes),
      quant4.has_value() ? absl::StrCat(dtype_name, " and 4 bits") : dtype_name,
      params.trainable_elems, 100.0 * Ratio(params.trainable_elems, params.frozen_elems));
  if (quant4.has_value()) {
    std::cout << Quant4BaseLine(*model, lora, *quant4, dtype) << "\n"
              << absl::StrFormat(
                     "bytes per base parameter: %.4f (the whole frozen base: 4-bit linears, and "
                     "embeddings, norms and LM head in %s)\n",
                     Ratio(base_param_bytes, params.frozen_elems), dtype_name);
  }

  // 1. The plans, with this process's resident set (the child starts as a copy of it).
  const PlanOutcome lora_plan = Plan(*lora_config, BenchContext(*lora_config, *model, resident));
  const PlanOutcome full_plan = Plan(*full_config, BenchContext(*full_config, *model, resident));
  std::cout << "\nplans (model/gpt_activation_profile.h PlanGptRun, as the trainer plans):\n"
               "| run | chunk elems | chunks x param chunk | model data | host peak (bound) | "
               "host peak (expected) | accelerator peak | accelerator minimum | verdict |\n"
               "|---|---|---|---|---|---|---|---|---|\n";
  PrintPlanRow("LoRA", lora_plan);
  PrintPlanRow("full fine-tune", full_plan);
  PrintPlanLine("LoRA", lora_plan, *model, host_total, host_available);
  PrintPlanLine("full fine-tune", full_plan, *model, host_total, host_available);
  const int64_t min_link_bytes = 2 * std::max<int64_t>(0, base_param_bytes - cap);
  std::cout << absl::StrFormat(
      "link minimum per step: 2 passes x (base params %s, unpadded - cap %s) = %s host -> "
      "accelerator\n",
      GiB(base_param_bytes), GiB(cap), GiB(min_link_bytes));
  std::cout.flush();
  const auto plan_bytes = [](const PlanOutcome& p, int64_t MemoryPlan::*field) -> int64_t {
    return p.plan.ok() ? p.plan->plan.*field : 0;
  };
  const std::string plan_line = absl::StrFormat(
      "model=%s dtype=%s r=%d alpha=%g targets=%s batch=%d seq_len=%d cap_bytes=%d "
      "base_params=%d adapter_params=%d quant4=%s quant4_values=%d quant4_stored_bytes=%d "
      "base_bytes=%d host_total_bytes=%d host_available_bytes=%d "
      "lora_plan_host_peak_bytes=%d lora_plan_host_expected_peak_bytes=%d "
      "lora_plan_accelerator_peak_bytes=%d lora_plan_fits=%d full_plan_host_peak_bytes=%d "
      "full_plan_fits=%d min_link_bytes_per_step=%d",
      model->name, dtype_name, lora.r, lora.lora_alpha, absl::StrJoin(lora.target_modules, ","),
      absl::GetFlag(FLAGS_micro_batch_size), absl::GetFlag(FLAGS_seq_len), cap, params.frozen_elems,
      params.trainable_elems,
      quant4.has_value() ? absl::StrCat(Quant4TypeName(quant4->quant_type),
                                        quant4->double_quant ? "+dq" : "")
                         : "none",
      q4.values, q4.stored_bytes, base_param_bytes, host_total, host_available,
      plan_bytes(lora_plan, &MemoryPlan::host_peak_bytes),
      plan_bytes(lora_plan, &MemoryPlan::host_expected_peak_bytes),
      plan_bytes(lora_plan, &MemoryPlan::predicted_accelerator_peak_bytes),
      lora_plan.fits.ok() ? 1 : 0, plan_bytes(full_plan, &MemoryPlan::host_peak_bytes),
      full_plan.fits.ok() ? 1 : 0, min_link_bytes);
  if (absl::GetFlag(FLAGS_plan_only)) {
    std::cout << "lora_benchmark: plan_only=1 " << plan_line << "\n";
    return lora_plan.fits.ok() ? 0 : 1;
  }
  if (absl::GetFlag(FLAGS_gemm_breakdown_only)) {
    ThreadPool pool(Threads());
    const double probe =
        std::max(GemmFlopsPerS(dtype, 1024, 3, &pool), GemmFlopsPerS(dtype, 2048, 2, &pool));
    GemmBreakdown(*model, lora, dtype, lora_config->model.activation_checkpointing, probe);
    return 0;
  }
  if (!lora_plan.fits.ok()) {
    std::cerr << "the LoRA run does not fit (the trainer would refuse it): "
              << lora_plan.fits.message() << "\n";
    return 1;
  }

  // 2. The LoRA run.
  std::cout << absl::StrFormat("\ntraining %d steps (1 warm-up) in a child process...\n", steps);
  std::cout.flush();
  // The GEMM probe right before the run too (its buffers and threads gone before the fork): on a
  // machine shared with other work the rate swings between minutes, and a probe taken only after
  // the run measured 19-89 GFLOP/s (bf16 fallback, Zen 3) around steps that ran at 11-24.
  double gemm_before = 0;
  {
    ThreadPool pool(Threads());
    gemm_before =
        std::max(GemmFlopsPerS(dtype, 1024, 3, &pool), GemmFlopsPerS(dtype, 2048, 2, &pool));
  }
  const RunResult run = Train(*lora_config);
  if (!run.ok) {
    std::cerr << "training failed: " << run.error << "\n";
    return 1;
  }

  // 3. The yardsticks, now that the child is gone.
  absl::StatusOr<double> link =
      MeasureLinkBytesPerS(BytesFlagOrDie("link_probe", absl::GetFlag(FLAGS_link_probe)));
  if (!link.ok()) {
    std::cerr << "link probe: " << link.status() << "\n";
    return 1;
  }
  double gemm_after = 0;
  {
    ThreadPool pool(Threads());
    gemm_after =
        std::max(GemmFlopsPerS(dtype, 1024, 3, &pool), GemmFlopsPerS(dtype, 2048, 2, &pool));
  }
  // The yardstick: the mean of the probes right before and right after the run.
  const double gemm = 0.5 * (gemm_before + gemm_after);
  // Where the step's GEMM time goes: each GEMM alone at the step's shape, against the probe.
  const double gemm_sum_s =
      absl::GetFlag(FLAGS_gemm_breakdown) && !quant4.has_value()
          ? GemmBreakdown(*model, lora, dtype, lora_config->model.activation_checkpointing,
                          gemm_after)
          : 0;
  // The LoRA plan again with the child's own resident set before Trainer::Create, as the trainer
  // planned it.
  const PlanOutcome planned =
      Plan(*lora_config, BenchContext(*lora_config, *model, run.host_baseline_bytes));
  if (!planned.plan.ok()) {
    std::cerr << "LoRA plan: " << planned.plan.status() << "\n";
    return 1;
  }
  const MemoryPlan& plan = planned.plan->plan;

  std::cout << "\n| step | loss | step s | compute s | copy wait s | optimizer s | rest s | "
               "loaded | written back | evictions | pressure reclaims | accelerator peak |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  StepRecord steady;
  int steady_steps = 0;
  for (int i = 0; i < run.steps; ++i) {
    const StepRecord& s = run.step[i];
    std::cout << absl::StrFormat(
        "| %d%s | %.4f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %d | %d | %s |\n", i + 1,
        s.warmup ? " (warm-up)" : "", s.loss, s.step_ms * 1e-3, s.compute_ms * 1e-3,
        s.copy_wait_ms * 1e-3, s.optimizer_ms * 1e-3,
        (s.step_ms - s.compute_ms - s.copy_wait_ms - s.optimizer_ms) * 1e-3, GiB(s.loaded_bytes),
        MiB(s.written_back_bytes), s.evictions, s.pressure_reclaims,
        MiB(s.accelerator_peak_total_bytes));
    if (s.warmup) continue;
    ++steady_steps;
    steady.step_ms += s.step_ms;
    steady.compute_ms += s.compute_ms;
    steady.copy_wait_ms += s.copy_wait_ms;
    steady.optimizer_ms += s.optimizer_ms;
    steady.loaded_bytes += s.loaded_bytes;
    steady.written_back_bytes += s.written_back_bytes;
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
  const double loaded = steady.loaded_bytes / n;
  const double written = steady.written_back_bytes / n;
  const double min_link_s = min_link_bytes / *link;
  const double loaded_link_s = loaded / *link;
  const double flops = LoraStepFlops(*model, lora, absl::GetFlag(FLAGS_micro_batch_size),
                                     absl::GetFlag(FLAGS_seq_len));
  const double flop_rate = flops / std::max(compute_s, 1e-9);
  const double host_expected_ratio = Ratio(run.host_peak_bytes, plan.host_expected_peak_bytes);
  const double host_bound_ratio = Ratio(run.host_peak_bytes, plan.host_peak_bytes);
  const double acc_ratio =
      Ratio(run.accelerator_peak_total_bytes, plan.predicted_accelerator_peak_bytes);
  const bool frozen_clean = run.frozen_writeback_bytes == 0;
  // The step cannot beat the link's minimum nor the useful FLOPs at the GEMM probe's rate.
  const double gemm_s = Ratio(flops, gemm);
  const double bound_s = std::max(min_link_s, gemm_s);

  std::cout << absl::StrFormat(
      "\nsteady steps (mean of %d):\n"
      "| quantity | value |\n|---|---|\n"
      "| host peak: measured VmHWM / plan expected / plan bound | %s / %s / %s |\n"
      "| host measured / expected; measured / bound | %.3f; %.3f (bound %s) |\n"
      "| host resident before Trainer::Create / after it (%.1f s) | %s / %s |\n"
      "| accelerator peak: measured / plan | %s / %s = %.3f |\n"
      "| the trainer's own plan: accelerator peak / host bound (at its own resident set) | %s / "
      "%s |\n"
      "| accelerator peak measured: model + non-model at once (model / non-model peaks) | %s "
      "(%s / %s) |\n"
      "| step time | %.2f s |\n"
      "| where it goes: compute / copy waits / optimizer / rest | %.2f / %.2f / %.2f / %.2f s |\n"
      "| chunk bytes loaded per step (measured) / link minimum | %s / %s = %.2fx |\n"
      "| chunk bytes written back per step | %s |\n"
      "| link probe (cpu backend host -> accelerator, %s) | %s |\n"
      "| link time per step: minimum bytes / measured loaded bytes, at the probe's rate | %.2f / "
      "%.2f s |\n"
      "| step / link minimum time | %.2fx |\n"
      "| step lower bound: max(link minimum %.2f s, useful FLOPs at the GEMM probe's rate %.2f s) "
      "| %.2f s; step / bound %.2fx |\n"
      "| useful FLOPs per step / rate over compute | %.3g / %.1f GFLOP/s |\n"
      "| the step's GEMMs timed alone (breakdown above) / compute | %.2f s / %.3f |\n"
      "| %s GEMM probe (n = 1024, 2048, %d threads; mean of before %.1f and after %.1f) / "
      "fraction | %.1f GFLOP/s / %.3f |\n"
      "| frozen (base) chunk bytes written back, whole run | %d (%s) |\n"
      "| run: loads / write-backs / clean evictions / prefetches (hits) / pressure reclaims | "
      "%d / %d / %d / %d (%d) / %d |\n",
      steady_steps, MiB(run.host_peak_bytes), MiB(plan.host_expected_peak_bytes),
      MiB(plan.host_peak_bytes), host_expected_ratio, host_bound_ratio,
      host_bound_ratio <= 1 ? "held" : "EXCEEDED", run.create_s, MiB(run.host_baseline_bytes),
      MiB(run.host_created_bytes), MiB(run.accelerator_peak_total_bytes),
      MiB(plan.predicted_accelerator_peak_bytes), acc_ratio,
      MiB(run.trainer_plan_accelerator_peak_bytes), MiB(run.trainer_plan_host_peak_bytes),
      MiB(run.accelerator_peak_total_bytes), MiB(run.accelerator_peak_model_bytes),
      MiB(run.accelerator_peak_non_model_bytes), step_s, compute_s, copy_wait_s, optimizer_s,
      step_s - compute_s - copy_wait_s - optimizer_s, GiB(static_cast<int64_t>(loaded)),
      GiB(min_link_bytes), Ratio(loaded, min_link_bytes), MiB(static_cast<int64_t>(written)),
      absl::GetFlag(FLAGS_link_probe), GBs(*link), min_link_s, loaded_link_s,
      Ratio(step_s, min_link_s), min_link_s, gemm_s, bound_s, Ratio(step_s, bound_s), flops,
      flop_rate / 1e9, gemm_sum_s, Ratio(gemm_sum_s, compute_s), dtype_name, Threads(),
      gemm_before / 1e9, gemm_after / 1e9, gemm / 1e9, Ratio(flop_rate, gemm),
      run.frozen_writeback_bytes, frozen_clean ? "0: frozen means frozen" : "NOT 0", run.loads,
      run.write_backs, run.clean_evictions, run.prefetches, run.prefetch_hits,
      run.pressure_reclaims);

  const bool trained_here = run.host_peak_bytes <= host_total && run.ok;
  std::cout << absl::StrFormat(
      "\nheadline: a %s fine-tune of %s (r %d on %s, %s) trained %d steps here at %.1f s per "
      "step, host peak %s of %s RAM, accelerator peak %s under a %s cap; a full fine-tune %s "
      "(plan: %s).\n",
      quant4.has_value() ? "QLoRA (4-bit base)" : "LoRA", model->name, lora.r, absl::StrJoin(lora.target_modules, ","), dtype_name, run.steps, step_s,
      GiB(run.host_peak_bytes), GiB(host_total), MiB(run.accelerator_peak_total_bytes),
      FormatBytes(cap), full_plan.fits.ok() ? "would also fit here" : "cannot run here",
      full_plan.plan.ok() ? absl::StrCat(GiB(full_plan.plan->plan.host_peak_bytes), " host")
                          : std::string("refused before any layout, see above"));
  std::cout << absl::StrFormat(
      "lora_benchmark: plan_only=0 %s steps=%d trained=%d step_s=%.3f compute_s=%.3f "
      "copy_wait_s=%.3f optimizer_s=%.3f host_vmhwm_bytes=%d host_baseline_bytes=%d "
      "plan_host_peak_bytes=%d plan_host_expected_peak_bytes=%d host_measured_over_expected=%.4f "
      "accelerator_peak_bytes=%d plan_accelerator_peak_bytes=%d "
      "accelerator_measured_over_plan=%.4f loaded_bytes_per_step=%.0f "
      "written_back_bytes_per_step=%.0f frozen_writeback_bytes=%d link_bytes_per_s=%.0f "
      "link_min_s=%.3f step_over_link_min=%.3f gemm_bound_s=%.3f step_over_bound=%.3f "
      "useful_flops=%.4g gemm_flops_per_s=%.4g gemm_before_flops_per_s=%.4g "
      "gemm_after_flops_per_s=%.4g "
      "flops_fraction=%.4f gemm_breakdown_s=%.3f run_s=%.1f\n",
      plan_line, run.steps, trained_here ? 1 : 0, step_s, compute_s, copy_wait_s, optimizer_s,
      run.host_peak_bytes, run.host_baseline_bytes, plan.host_peak_bytes,
      plan.host_expected_peak_bytes, host_expected_ratio, run.accelerator_peak_total_bytes,
      plan.predicted_accelerator_peak_bytes, acc_ratio, loaded, written, run.frozen_writeback_bytes,
      *link, min_link_s, Ratio(step_s, min_link_s), gemm_s, Ratio(step_s, bound_s), flops, gemm,
      gemm_before, gemm_after, Ratio(flop_rate, gemm), gemm_sum_s, run.seconds);
  return frozen_clean ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
