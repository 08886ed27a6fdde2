// Prints the pre-flight memory plan of a training run, exactly as the trainer plans it: the same
// conversion of the config (trainer/plan_options.h PlanRunFromConfig, the trainer's own), so the
// chunk size, the accelerator budget and its reserve, the host workspaces of the exports and
// checkpoints, the disk tier and every other number are the trainer's. It prints the chunk size,
// the accelerator's lower bound and minimum, the slack, the predicted accelerator and host peaks —
// and whether the run fits, with the message the trainer would refuse it with.
//
//   bazel run //tools:plan -- --model=1B --dtype=bf16 --micro_batch_size=1 --seq_len=64
//       --accelerator_memory=512MiB
//   bazel run //tools:plan -- --config=run.json --world_size=2 --rank=1
//
// --config=FILE plans a trainer config file (the trainer's --config); the flags below that name a
// config key then override it only when given. Without --config, the trainer's default config
// with every such flag at its default here (gpt2, f32, micro batch 1, ...).
//
// --accelerator=cuda plans a GPU run from any machine (no GPU needed): the CUDA kernels'
// workspaces (cuBLAS's in every GEMM, --cuda_compute_capability picking NVIDIA's default size),
// the accelerator reserve the trainer keeps (CudaAdam's device bytes; with --world_size > 1 the
// nccl collectives' device staging and export tile), the GPU's memory apart from the host's, and
// with --cuda_usable_memory the budget the trainer takes from a GPU with that much usable memory.
//
// --nvme_path=DIR (the trainer's flag: zero_optimization.offload_optimizer.device "nvme") plans
// the disk tier as the trainer does: the directory checked as the trainer checks it, the swap's
// bytes against its free space (statvfs), a RAM-backed directory (tmpfs) counted as host memory
// and said so, the host budget of optimizer state (--host_budget, or the trainer's automatic
// one), and — unless --measure_disk=false — the disk's sequential direct I/O bandwidth measured
// there through the swap's engine (--disk_probe bytes at --aio_block_size and --aio_queue_depth),
// which turns the plan's per-step disk traffic into the time the disk alone needs per step.
// A --config with zero_optimization.offload_param.device "nvme" (a LoRA/QLoRA base on disk) plans
// the frozen base's chunks in the same swap under its max_in_cpu budget (auto as the trainer picks
// it), printed as the trainer's console prints it ("disk tier: the frozen base's ...").
//
// --lora_r=R (with --lora_target_modules, --lora_alpha; the trainer's flags: the lora section)
// plans a LoRA fine-tune: the base frozen in param-only chunks of the compute dtype (2 bytes per
// parameter in bf16/f16), the adapters A [r, in] and B [out, r] with their full training state.
// With --load_in_4bit (the trainer's flag: quantization.load_in_4bit) the base's block linears
// take their 4-bit blobs' bytes instead (QLoRA; model/quant4_config.h), printed as the trainer's
// console prints them ("base: N linear weights in 4-bit nf4 ...").
//
// The last line before the verdict, "plan_numbers: key=value ...", holds every number of the plan
// (tools/plan_test compares them with the trainer's pre-flight).
//
// Exit status as the trainer's: 0 the run fits (the plan on stdout); 1 it does not (the plan on
// stdout, the refusal on stderr); 2 a flag that cannot be parsed or is given empty ("--model="),
// or an invalid config, model or option.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/flag_presence.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "disk/disk_probe.h"
#include "disk/swap_options.h"
#include "memory/dtype.h"
#include "memory/host_memory_info.h"
#include "model/gpt_activation_profile.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "model/quant4_config.h"
#include "scheduler/memory_plan.h"
#include "scheduler/metronome.h"
#include "trainer/config.h"
#include "trainer/config_overrides.h"
#include "trainer/config_parse.h"
#include "trainer/config_validate.h"
#include "trainer/plan_options.h"

ABSL_FLAG(std::string, config, "",
          "a trainer config file (JSON, the trainer's --config): the run planned; the flags that "
          "name a config key override it only when given");
ABSL_FLAG(std::string, model, "gpt2",
          "model preset: GPT-2's (tiny, gpt2, gpt2-medium, ..., 1B, ..., 18B) or the Llama "
          "family's (llama-3.2-1b, llama-3-8b, llama-2-7b, tinyllama-1.1b, qwen2.5-0.5b, "
          "qwen2.5-1.5b, qwen2.5-3b, mistral-7b-v0.3, llama-tiny)");
ABSL_FLAG(std::string, dtype, "f32", "compute dtype: f32, bf16 or f16");
ABSL_FLAG(int64_t, micro_batch_size, 1, "sequences per micro batch (>= 1)");
ABSL_FLAG(int64_t, seq_len, 0, "tokens per sequence (0: the model's n_positions)");
ABSL_FLAG(int, world_size, 1, "data-parallel ranks (ZeRO)");
ABSL_FLAG(int, rank, 0, "the rank planned, in [0, --world_size) (ZeRO shards differ by rank)");
ABSL_FLAG(int, gradient_accumulation_steps, 1, "micro batches per optimizer step (>= 1)");
ABSL_FLAG(bool, activation_checkpointing, false, "recompute each block in backward");
ABSL_FLAG(int, threads, 2, "model threads (the attention workspace scales with them)");
ABSL_FLAG(std::string, chunk_size, "auto", "elements per chunk, or \"auto\"");
ABSL_FLAG(std::string, accelerator_memory, "auto",
          "accelerator budget (\"512MiB\"), or \"auto\": max(4 GiB, the plan's minimum)");
ABSL_FLAG(std::string, host_memory, "", "cap on the host pools (accelerator.host_memory); none");
ABSL_FLAG(std::string, host_available, "auto",
          "host memory the OS can still give: \"auto\" (MemAvailable / cgroup), a byte quantity, "
          "or \"0\" (unchecked)");
ABSL_FLAG(bool, moments, false, "print every moment of the steady iteration");
ABSL_FLAG(std::string, accelerator, "cpu",
          "cpu (the emulated accelerator) or cuda (a GPU run, planned without a GPU)");
ABSL_FLAG(std::string, nvme_path, "",
          "the disk tier's directory (the trainer's --nvme_path): plans the optimizer state on "
          "disk");
ABSL_FLAG(std::string, host_budget, "auto",
          "--nvme_path: host bytes of optimizer state the disk tier may hold "
          "(zero_optimization.offload_optimizer.host_budget), or \"auto\"");
ABSL_FLAG(int64_t, buffer_count, 4,
          "--nvme_path: chunk indices read ahead (offload_optimizer.buffer_count)");
ABSL_FLAG(bool, measure_disk, true,
          "--nvme_path: measure the disk's sequential bandwidth there (writes and reads "
          "--disk_probe bytes)");
ABSL_FLAG(std::string, disk_probe, "256MiB", "--measure_disk: bytes written and read");
ABSL_FLAG(std::string, aio_block_size, "1MiB", "--measure_disk: aio.block_size");
ABSL_FLAG(int, aio_queue_depth, 8, "--measure_disk: aio.queue_depth");
ABSL_FLAG(int64_t, lora_r, 0,
          "LoRA rank (lora.r): > 0 plans a LoRA fine-tune (frozen base, trainable adapters); 0: "
          "full training");
ABSL_FLAG(double, lora_alpha, 8, "--lora_r: lora.lora_alpha (the scale is lora_alpha / r)");
ABSL_FLAG(std::string, lora_target_modules, "",
          "--lora_r: lora.target_modules, comma-separated (q_proj,k_proj,v_proj,o_proj; GPT-2 "
          "c_attn,c_proj,c_fc; or all-linear)");
ABSL_FLAG(bool, load_in_4bit, false,
          "--lora_r: QLoRA, the frozen base's block linears in 4 bits (quantization.load_in_4bit, "
          "the trainer's flag; the config's other quantization keys, else bitsandbytes' "
          "defaults: fp4, no double quant)");
ABSL_FLAG(std::string, export, "",
          "checkpoint.export: the file or directory exported at the end (planned: its host "
          "workspace)");
ABSL_FLAG(std::string, export_merged, "",
          "--lora_r: checkpoint.export_merged (the trainer's flag): a merged model directory");
ABSL_FLAG(std::string, save_dir, "",
          "checkpoint.dir (the trainer's --save_dir): checkpoints are written (planned: their "
          "staging buffer)");
ABSL_FLAG(std::string, cuda_usable_memory, "0",
          "--accelerator=cuda: the GPU memory the trainer's probe would find usable (free minus "
          "the margin), a byte quantity; 0: unknown (the budget is then the plan's)");
ABSL_FLAG(int, cuda_compute_capability, 9,
          "--accelerator=cuda: the GPU's compute capability major (9: Hopper, 32 MiB cuBLAS "
          "workspace; 8 and below: 4 MiB)");

namespace ps {
namespace {

absl::StatusOr<int64_t> BytesFlag(const char* flag, const std::string& text) {
  absl::StatusOr<int64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", text, ": ", bytes.status().message()));
  }
  return bytes;
}

// The run planned: --config's file (or the trainer's default config) with the flags applied —
// those the trainer has through its own ApplyOverrides, the rest onto their keys.
absl::StatusOr<TrainConfig> ConfigFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_config);
  TrainConfig c;
  if (path.empty()) {
    c = DefaultTrainConfig();
  } else {
    ASSIGN_OR_RETURN(c, LoadTrainConfig(path));
  }
  // Without a file every flag applies (at its default here); with one, the flags given.
  const auto use = [&](const char* name) { return path.empty() || FlagGiven(name); };
  ConfigOverrides o;
  if (use("model")) o.model = absl::GetFlag(FLAGS_model);
  if (use("micro_batch_size")) o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  if (use("seq_len")) o.seq_len = absl::GetFlag(FLAGS_seq_len);
  if (use("gradient_accumulation_steps")) {
    o.gradient_accumulation_steps = absl::GetFlag(FLAGS_gradient_accumulation_steps);
  }
  if (use("chunk_size")) o.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  const std::string memory = absl::GetFlag(FLAGS_accelerator_memory);
  if (use("accelerator_memory") && memory != "auto") o.accelerator_memory = memory;
  if (use("accelerator")) o.accelerator = absl::GetFlag(FLAGS_accelerator);
  if (FlagGiven("nvme_path")) o.nvme_path = absl::GetFlag(FLAGS_nvme_path);
  if (FlagGiven("save_dir")) o.save_dir = absl::GetFlag(FLAGS_save_dir);
  if (FlagGiven("export_merged")) o.export_merged = absl::GetFlag(FLAGS_export_merged);
  const bool lora = absl::GetFlag(FLAGS_lora_r) != 0;
  if (FlagGiven("lora_r") || (path.empty() && lora)) o.lora_r = absl::GetFlag(FLAGS_lora_r);
  if (FlagGiven("lora_alpha") || (path.empty() && lora)) {
    o.lora_alpha = absl::GetFlag(FLAGS_lora_alpha);
  }
  if (FlagGiven("lora_target_modules")) {
    o.lora_target_modules = absl::GetFlag(FLAGS_lora_target_modules);
  }
  if (use("load_in_4bit")) o.load_in_4bit = absl::GetFlag(FLAGS_load_in_4bit);
  RETURN_IF_ERROR(ApplyOverrides(o, &c));
  if (use("accelerator_memory") && memory == "auto") c.accelerator.memory_bytes = 0;
  if (use("dtype")) {
    absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype=", absl::GetFlag(FLAGS_dtype), ": ", dtype.status().message()));
    }
    c.bf16 = *dtype == DType::kBF16;
    c.fp16.enabled = *dtype == DType::kF16;
  }
  if (use("activation_checkpointing")) {
    c.model.activation_checkpointing = absl::GetFlag(FLAGS_activation_checkpointing);
  }
  if (use("threads")) c.threads = absl::GetFlag(FLAGS_threads);
  if (use("host_memory")) {
    c.accelerator.host_memory_bytes = 0;
    if (const std::string h = absl::GetFlag(FLAGS_host_memory); !h.empty()) {
      ASSIGN_OR_RETURN(c.accelerator.host_memory_bytes, BytesFlag("host_memory", h));
    }
  }
  OffloadOptimizerConfig& offload = c.zero_optimization.offload_optimizer;
  if (use("host_budget")) {
    offload.host_budget_bytes = 0;
    if (const std::string b = absl::GetFlag(FLAGS_host_budget); b != "auto") {
      ASSIGN_OR_RETURN(offload.host_budget_bytes, BytesFlag("host_budget", b));
    }
  }
  if (use("buffer_count")) offload.buffer_count = absl::GetFlag(FLAGS_buffer_count);
  if (FlagGiven("export")) c.checkpoint.export_path = absl::GetFlag(FLAGS_export);
  return c;
}

// What only a run knows, as the trainer finds it (trainer/run_wiring.cc, trainer/run_plan.cc),
// from the flags and this machine.
absl::StatusOr<PlanContext> ContextFromFlags(const TrainConfig& c) {
  PlanContext context;
  ASSIGN_OR_RETURN(context.model, PlanModelFromConfig(c));
  context.world = absl::GetFlag(FLAGS_world_size);
  context.rank = absl::GetFlag(FLAGS_rank);
  if (context.world < 1 || context.rank < 0 || context.rank >= context.world) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size=", context.world,
                                                   " --rank=", context.rank,
                                                   ": need world_size >= 1 and rank in [0, "
                                                   "world_size)"));
  }
  const bool cuda = c.accelerator.kind == AcceleratorKind::kCuda;
  // A GPU run of several ranks trains over nccl (a host communicator is refused there), whose
  // collectives stage in device memory; the emulated accelerator's ranks use host communicators.
  context.device_communicator = cuda && context.world > 1;
  context.threads = c.threads > 0
                        ? c.threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (cuda) {
    const int cc = absl::GetFlag(FLAGS_cuda_compute_capability);
    if (cc < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cuda_compute_capability must be >= 1, got ", cc));
    }
    context.kernel_workspaces = std::make_shared<const CudaKernelWorkspaces>(
        CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(cc));
    ASSIGN_OR_RETURN(context.cuda_usable_bytes,
                     BytesFlag("cuda_usable_memory", absl::GetFlag(FLAGS_cuda_usable_memory)));
    std::cout << "kernels: cuda, cuBLAS workspace "
              << FormatBytes(CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(cc))
              << " per GEMM (compute capability " << cc << ")\n";
  } else {
    context.kernel_workspaces = std::make_shared<const CpuKernelWorkspaces>(context.threads);
  }
  RETURN_IF_ERROR(ReadPlanMachine(c, context));
  if (const std::string h = absl::GetFlag(FLAGS_host_available); h == "auto") {
    if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
      std::cout << "host: " << info->DebugString() << "\n";
    }
  } else {
    ASSIGN_OR_RETURN(context.host_available_bytes, BytesFlag("host_available", h));
  }
  return context;
}

// The disk under nvme_path measured through the swap's engine (--measure_disk).
absl::StatusOr<DiskBandwidth> MeasureDisk(const std::string& dir) {
  FileChunkSwapOptions swap;
  swap.dir = dir;
  ASSIGN_OR_RETURN(swap.block_size,
                   BytesFlag("aio_block_size", absl::GetFlag(FLAGS_aio_block_size)));
  swap.queue_depth = absl::GetFlag(FLAGS_aio_queue_depth);
  ASSIGN_OR_RETURN(const int64_t probe, BytesFlag("disk_probe", absl::GetFlag(FLAGS_disk_probe)));
  return MeasureDiskBandwidth(dir, swap, probe);
}

// Every number of the plan, as key=value (tools/plan_test reads them).
std::string PlanNumbers(const RunPlan& run) {
  const MemoryPlan& p = run.plan.plan;
  const GptRunPlanOptions& o = run.options;
  const Quant4Totals q4 =
      Quant4BaseTotals(*o.model_config, o.model.lora, o.model.quant4, o.compute_dtype);
  return absl::StrFormat(
      "chunk_elems=%d num_chunks=%d num_data_chunks=%d parameters=%d param_chunk_bytes=%d "
      "state_chunk_bytes=%d rank_model_data_bytes=%d accelerator_bytes=%d "
      "reserve_adam_bytes=%d reserve_comm_staging_bytes=%d reserve_export_tile_bytes=%d "
      "comm_buffer_bytes=%d activation_peak_bytes=%d evaluation_peak_bytes=%d "
      "largest_working_set_bytes=%d lower_bound_bytes=%d stranded_bytes=%d slack_bytes=%d "
      "tide_margin_bytes=%d min_accelerator_bytes=%d warmup_chunk_fraction=%.17g "
      "accelerator_state_indices=%d accelerator_state_bytes=%d "
      "predicted_accelerator_peak_bytes=%d fits_accelerator=%d host_model_data_bytes=%d "
      "host_accumulator_bytes=%d host_overlap_snapshot_bytes=%d host_accelerator_bytes=%d host_swap_bytes=%d "
      "host_overhead_bytes=%d host_workspace_bytes=%d host_peak_bytes=%d host_needed_bytes=%d "
      "host_model_data_touched_bytes=%d host_expected_peak_bytes=%d fits_host=%d disk_tier=%d "
      "disk_bytes=%d disk_host_bytes=%d disk_min_host_bytes=%d disk_kept_indices=%d "
      "disk_streamed_indices=%d disk_read_ahead=%d disk_read_bytes_per_step=%d "
      "disk_write_bytes_per_step=%d disk_host_budget_bytes=%d disk_frozen_chunks=%d "
      "disk_frozen_bytes=%d disk_frozen_host_budget_bytes=%d disk_frozen_host_bytes=%d "
      "disk_frozen_min_host_bytes=%d disk_frozen_read_bytes_per_step=%d vocab_block_rows=%d "
      "quant4_weights=%d quant4_values=%d quant4_stored_bytes=%d",
      p.chunk_elems, p.num_chunks, p.num_data_chunks, p.parameters, p.param_chunk_bytes,
      p.state_chunk_bytes, p.rank_model_data_bytes, run.plan.accelerator_bytes,
      run.reserve.adam_bytes, run.reserve.comm_staging_bytes, run.reserve.export_tile_bytes,
      o.comm_buffer_bytes, p.activation_peak_bytes, p.evaluation_peak_bytes,
      p.largest_working_set_bytes, p.lower_bound_bytes, p.stranded_bytes, p.slack_bytes,
      p.tide_margin_bytes, p.min_accelerator_bytes, p.warmup_chunk_fraction,
      p.accelerator_state_indices, p.accelerator_state_bytes, p.predicted_accelerator_peak_bytes,
      p.fits_accelerator, p.host_model_data_bytes, p.host_accumulator_bytes,
      p.host_overlap_snapshot_bytes,
      p.host_accelerator_bytes, p.host_swap_bytes, o.host_overhead_bytes, o.host_workspace_bytes,
      p.host_peak_bytes, p.host_needed_bytes, p.host_model_data_touched_bytes,
      p.host_expected_peak_bytes, p.fits_host, p.disk_tier, p.disk_bytes, p.disk_host_bytes,
      p.disk_min_host_bytes, p.disk_kept_indices, p.disk_streamed_indices, p.disk_read_ahead,
      p.disk_read_bytes_per_step, p.disk_write_bytes_per_step, run.plan.disk_host_budget_bytes,
      p.disk_frozen_chunks, p.disk_frozen_bytes, p.disk_frozen_host_budget_bytes,
      p.disk_frozen_host_bytes, p.disk_frozen_min_host_bytes, p.disk_frozen_read_bytes_per_step,
      run.plan.vocab.vocab_block_rows, q4.weights, q4.values, q4.stored_bytes);
}

void PrintPlan(const TrainConfig& c, const RunPlan& run,
               const std::optional<DiskBandwidth>& disk_bandwidth) {
  const GptRunPlanOptions& o = run.options;
  const MemoryPlan& p = run.plan.plan;
  if (p.disk_tier) {
    std::cout << absl::StrFormat(
        "disk tier: swap under %s: %s (%s free there)%s\n", o.disk->dir,
        FormatBytes(p.disk_bytes), FormatBytes(o.disk->free_bytes),
        o.disk->optimizer_state
            ? absl::StrCat("; host budget ", FormatBytes(run.plan.disk_host_budget_bytes),
                           " of optimizer state")
            : std::string());
    if (o.disk->frozen_params) {
      std::cout << FrozenOnDiskLine(c.zero_optimization, o.compute_dtype, p) << "\n";
    }
    if (const std::string note = RamBackedSwapNote(run); !note.empty()) std::cout << note << "\n";
    if (disk_bandwidth.has_value()) {
      const DiskBandwidth& bw = *disk_bandwidth;
      const double disk_s = DiskStepSeconds(p, bw.read_bytes_per_s, bw.write_bytes_per_s);
      std::cout << absl::StrFormat(
          "disk measured (%s, %s): write %s/s, read %s/s, %.2f ms per block; the disk alone "
          "needs %.1f s per optimizer step\n",
          bw.engine, bw.direct ? std::string("O_DIRECT") : bw.note,
          FormatBytes(static_cast<int64_t>(bw.write_bytes_per_s)),
          FormatBytes(static_cast<int64_t>(bw.read_bytes_per_s)), bw.block_latency_ns * 1e-6,
          disk_s);
    }
  }
  std::cout << absl::StrFormat(
      "model %s (%d parameters), %s, micro batch %d x %d tokens, world size %d, rank %d\n",
      o.config.name, p.parameters, DTypeName(o.compute_dtype), o.model.batch, o.model.seq_len,
      o.world_size, o.rank);
  if (o.model.lora.has_value()) {
    const LoraConfig& lora = *o.model.lora;
    int64_t adapter_elems = 0;
    for (const TensorSpec& t : PeftAdapterTensors(*o.model_config, lora)) {
      adapter_elems += t.numel();
    }
    std::cout << absl::StrFormat(
        "LoRA: r %d, lora_alpha %g, targets %s: %d trainable adapter parameters (%.4f%%), the "
        "base's %d frozen in param-only chunks (%d bytes each)\n",
        lora.r, lora.lora_alpha, absl::StrJoin(lora.target_modules, ","), adapter_elems,
        100.0 * static_cast<double>(adapter_elems) /
            static_cast<double>(adapter_elems + ModelParameterCount(*o.model_config)),
        ModelParameterCount(*o.model_config), SizeOf(o.compute_dtype));
    if (o.model.quant4.has_value()) {
      std::cout << Quant4BaseLine(*o.model_config, lora, *o.model.quant4, o.compute_dtype)
                << "\n";
    }
  }
  std::cout << "accelerator " << AcceleratorKindName(c.accelerator.kind) << ", budget "
            << FormatBytes(run.plan.accelerator_bytes) << " (" << run.plan.chunk_note
            << "), reserved beside chunks and activations "
            << FormatBytes(run.reserve.total_bytes()) << "\n"
            << p.Summary() << "\n";
  if (absl::GetFlag(FLAGS_moments)) {
    for (size_t i = 0; i < p.moments.size(); ++i) {
      const PlannedMoment& m = p.moments[i];
      std::cout << absl::StrFormat("%5d %-4s ws %10d now %10d peak %10d reserved %10d\n", i,
                                   StageName(m.stage), m.working_set_bytes, m.nonmodel_now_bytes,
                                   m.nonmodel_peak_bytes, m.scratch_reserved_bytes);
    }
  }
  std::cout << "plan_numbers: " << PlanNumbers(run) << "\n";
}

int Run() {
  const auto fail2 = [](const absl::Status& s) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  };
  // An empty value ("--model=", an unset shell variable) is refused, never "not given".
  if (absl::Status s = RefuseEmptyFlags(__FILE__); !s.ok()) return fail2(s);
  absl::StatusOr<TrainConfig> config = ConfigFromFlags();
  if (!config.ok()) return fail2(config.status());
  // As the trainer checks its config before the plan (the swap directory included).
  if (absl::Status s = ValidateTrainConfig(*config, absl::GetFlag(FLAGS_world_size)); !s.ok()) {
    return fail2(s);
  }
  absl::StatusOr<PlanContext> context = ContextFromFlags(*config);
  if (!context.ok()) return fail2(context.status());
  absl::StatusOr<RunPlan> run = PlanRunFromConfig(*config, *context);
  if (!run.ok()) return fail2(run.status());
  std::optional<DiskBandwidth> disk_bandwidth;
  if (run->plan.plan.disk_tier && absl::GetFlag(FLAGS_measure_disk)) {
    absl::StatusOr<DiskBandwidth> measured = MeasureDisk(run->options.disk->dir);
    if (!measured.ok()) return fail2(measured.status());
    disk_bandwidth = *measured;
  }
  PrintPlan(*config, *run, disk_bandwidth);
  // The trainer's refusal, the accelerator included.
  if (absl::Status fits = CheckRunPlan(*run, /*enforce_accelerator=*/true); !fits.ok()) {
    std::cerr << "error: " << fits.message() << "\n";
    return 1;
  }
  std::cout << "fits\n";
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints the pre-flight memory plan of a training run, exactly as the trainer plans it.");
  absl::ParseCommandLine(argc, argv);
  return ps::Run();
}
