// Prints the pre-flight memory plan of a run of any preset (GPT-2 or the Llama family)
// (scheduler/memory_plan.h, built by model/gpt_activation_profile.h's PlanGptRun, exactly as the
// trainer builds it before it allocates anything): the chunk size, the accelerator's lower bound
// and minimum, the slack, the predicted accelerator and host peaks — and whether the run fits, with
// the message the trainer would refuse it with.
//
//   bazel run //tools:plan -- --model=1B --dtype=bf16 --micro_batch_size=1 --seq_len=64
//       --accelerator_memory=512MiB
//
// --accelerator=cuda plans a GPU run from any machine (no GPU needed): the CUDA kernels'
// workspaces (cuBLAS's in every GEMM, --cuda_compute_capability picking NVIDIA's default size),
// CudaAdam's device bytes reserved, and the GPU's memory apart from the host's.
//
// --nvme_path=DIR (the trainer's flag: zero_optimization.offload_optimizer.device "nvme") plans
// the disk tier as the trainer does: the directory checked as the trainer checks it, the swap's
// bytes against its free space (statvfs), the host budget of optimizer state (--host_budget, or
// the trainer's automatic one), and — unless --measure_disk=false — the disk's sequential direct
// I/O bandwidth measured there through the swap's engine (--disk_probe bytes at --aio_block_size
// and --aio_queue_depth), which turns the plan's per-step disk traffic into the time the disk
// alone needs per step.
//
// --lora_r=R (with --lora_target_modules, --lora_alpha; the trainer's flags: the lora section)
// plans a LoRA fine-tune: the base frozen in param-only chunks of the compute dtype (2 bytes per
// parameter in bf16/f16), the adapters A [r, in] and B [out, r] with their full training state.
//
// Exit status as the trainer's: 0 the run fits (the plan on stdout); 1 it does not (the plan on
// stdout, the refusal on stderr); 2 a flag that cannot be parsed or an invalid model/option.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "disk/disk_probe.h"
#include "disk/swap_options.h"
#include "memory/dtype.h"
#include "memory/host_memory_info.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "scheduler/memory_plan.h"
#include "scheduler/metronome.h"
#include "trainer/config.h"
#include "trainer/config_schema.h"
#include "trainer/config_validate.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, model, "gpt2",
          "model preset: GPT-2's (tiny, gpt2, gpt2-medium, ..., 1B, ..., 18B) or the Llama "
          "family's (llama-3.2-1b, llama-3-8b, llama-2-7b, tinyllama-1.1b, qwen2.5-0.5b, "
          "qwen2.5-1.5b, qwen2.5-3b, mistral-7b-v0.3, llama-tiny)");
ABSL_FLAG(std::string, dtype, "f32", "compute dtype: f32, bf16 or f16");
ABSL_FLAG(int64_t, micro_batch_size, 1, "sequences per micro batch (>= 1)");
ABSL_FLAG(int64_t, seq_len, 0, "tokens per sequence (0: the model's n_positions)");
ABSL_FLAG(int, world_size, 1, "data-parallel ranks (ZeRO)");
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

int Run() {
  const auto fail2 = [](const absl::Status& s) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  };
  GptRunPlanOptions o;
  // Any architecture, as the trainer plans it (model_config; config is its GPT-2 view).
  absl::StatusOr<ModelConfig> model = ModelPreset(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return fail2(model.status());
  o.model_config = *model;
  o.config = GptConfigView(*model);
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return fail2(dtype.status());
  o.compute_dtype = *dtype;
  o.model.batch = absl::GetFlag(FLAGS_micro_batch_size);
  o.model.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.model.activation_checkpointing = absl::GetFlag(FLAGS_activation_checkpointing);
  o.model.threads = absl::GetFlag(FLAGS_threads);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.gradient_accumulation_steps = absl::GetFlag(FLAGS_gradient_accumulation_steps);
  if (o.model.batch < 1 || o.model.seq_len < 0 || o.model.seq_len > o.config.max_seq_len ||
      o.world_size < 1 || o.gradient_accumulation_steps < 1 || o.model.threads < 1) {
    return fail2(absl::InvalidArgumentError(absl::StrCat(
        "--micro_batch_size, --world_size, --gradient_accumulation_steps and --threads must be "
        ">= 1 and --seq_len in [0, ",
        o.config.max_seq_len, "]")));
  }
  if (const int64_t r = absl::GetFlag(FLAGS_lora_r); r != 0) {
    // As the trainer's --lora_* flags (trainer/config_overrides.h) and its check against the
    // model (ValidateLoraConfig, whose messages name the lora key).
    LoraConfig lora;
    lora.r = r;
    lora.lora_alpha = absl::GetFlag(FLAGS_lora_alpha);
    lora.target_modules = ParseLoraModuleList(absl::GetFlag(FLAGS_lora_target_modules));
    if (absl::Status s = ValidateLoraConfig(*o.model_config, lora); !s.ok()) {
      return fail2(absl::Status(
          s.code(),
          absl::StrCat("--lora_r / --lora_alpha / --lora_target_modules: ", s.message())));
    }
    o.model.lora = lora;
  } else if (!absl::GetFlag(FLAGS_lora_target_modules).empty()) {
    return fail2(absl::InvalidArgumentError(
        "--lora_target_modules needs --lora_r (the adapters' rank, >= 1)"));
  }
  const std::string chunk = absl::GetFlag(FLAGS_chunk_size);
  if (chunk != "auto" && (!absl::SimpleAtoi(chunk, &o.chunk_elems) || o.chunk_elems <= 0)) {
    return fail2(absl::InvalidArgumentError(
        absl::StrCat("--chunk_size=", chunk, ": an integer > 0 or \"auto\"")));
  }
  if (const std::string a = absl::GetFlag(FLAGS_accelerator_memory); a != "auto") {
    absl::StatusOr<int64_t> bytes = BytesFlag("accelerator_memory", a);
    if (!bytes.ok()) return fail2(bytes.status());
    o.accelerator_bytes = *bytes;
  }
  if (const std::string h = absl::GetFlag(FLAGS_host_memory); !h.empty()) {
    absl::StatusOr<int64_t> bytes = BytesFlag("host_memory", h);
    if (!bytes.ok()) return fail2(bytes.status());
    o.host_cap_bytes = *bytes;
  }
  if (const std::string h = absl::GetFlag(FLAGS_host_available); h == "auto") {
    absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo();
    if (info.ok()) {
      o.host_available_bytes = info->available_bytes();
      std::cout << "host: " << info->DebugString() << "\n";
    }
  } else {
    absl::StatusOr<int64_t> bytes = BytesFlag("host_available", h);
    if (!bytes.ok()) return fail2(bytes.status());
    o.host_available_bytes = *bytes;
  }
  o.host_overhead_bytes = 256 * kMiB;  // as the trainer
  if (const std::string a = absl::GetFlag(FLAGS_accelerator); a == "cuda") {
    // As the trainer plans --accelerator=cuda (trainer.cc: PlanAcceleratorReserve and the
    // workspaces of CreateKernelWorkspaces for the GPU).
    const int cc = absl::GetFlag(FLAGS_cuda_compute_capability);
    if (cc < 1) {
      return fail2(absl::InvalidArgumentError(
          absl::StrCat("--cuda_compute_capability must be >= 1, got ", cc)));
    }
    o.kernel_workspaces = std::make_shared<const CudaKernelWorkspaces>(
        CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(cc));
    o.accelerator_in_host_memory = false;
    // A host communicator (the plan tool models no NCCL run) and no export.
    o.comm_buffer_bytes = PlanAcceleratorReserve(AcceleratorKind::kCuda, false, o.world_size,
                                                 o.chunk_elems, o.compute_dtype, false)
                              .total_bytes();
    std::cout << "kernels: cuda, cuBLAS workspace "
              << FormatBytes(CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(cc))
              << " per GEMM (compute capability " << cc << ")\n";
  } else if (a != "cpu") {
    return fail2(absl::InvalidArgumentError(
        absl::StrCat("--accelerator must be cpu or cuda, got \"", a, "\"")));
  }
  std::optional<DiskBandwidth> disk_bandwidth;
  if (const std::string nvme = absl::GetFlag(FLAGS_nvme_path); !nvme.empty()) {
    // As the trainer's --nvme_path (trainer/config_overrides.h) and its check of the directory.
    TrainConfig disk;
    disk.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
    disk.zero_optimization.offload_optimizer.nvme_path = nvme;
    if (absl::Status s = CheckNvmePath(disk); !s.ok()) return fail2(s);
    GptRunPlanOptions::DiskTier tier;
    tier.dir = nvme;
    tier.read_ahead = absl::GetFlag(FLAGS_buffer_count);
    if (tier.read_ahead < 1) {
      return fail2(absl::InvalidArgumentError(
          absl::StrCat("--buffer_count must be >= 1, got ", tier.read_ahead)));
    }
    if (const std::string b = absl::GetFlag(FLAGS_host_budget); b != "auto") {
      absl::StatusOr<int64_t> bytes = BytesFlag("host_budget", b);
      if (!bytes.ok()) return fail2(bytes.status());
      tier.host_budget_bytes = *bytes;
    }
    absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(nvme);
    if (!free_bytes.ok()) return fail2(free_bytes.status());
    tier.free_bytes = *free_bytes;
    o.disk = tier;
    if (absl::GetFlag(FLAGS_measure_disk)) {
      FileChunkSwapOptions swap;
      swap.dir = nvme;
      absl::StatusOr<int64_t> block =
          BytesFlag("aio_block_size", absl::GetFlag(FLAGS_aio_block_size));
      if (!block.ok()) return fail2(block.status());
      swap.block_size = *block;
      swap.queue_depth = absl::GetFlag(FLAGS_aio_queue_depth);
      absl::StatusOr<int64_t> probe = BytesFlag("disk_probe", absl::GetFlag(FLAGS_disk_probe));
      if (!probe.ok()) return fail2(probe.status());
      absl::StatusOr<DiskBandwidth> measured = MeasureDiskBandwidth(nvme, swap, *probe);
      if (!measured.ok()) return fail2(measured.status());
      disk_bandwidth = *measured;
    }
  }
  absl::StatusOr<GptRunPlan> run = PlanGptRun(o);
  if (!run.ok()) return fail2(run.status());
  const MemoryPlan& p = run->plan;
  if (p.disk_tier) {
    std::cout << absl::StrFormat(
        "disk tier: swap under %s: %s (%s free there); host budget %s of optimizer state\n",
        o.disk->dir, FormatBytes(p.disk_bytes), FormatBytes(o.disk->free_bytes),
        FormatBytes(run->disk_host_budget_bytes));
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
      "model %s (%d parameters), %s, micro batch %d x %d tokens, world size %d\n", o.config.name,
      p.parameters, DTypeName(o.compute_dtype), o.model.batch,
      o.model.seq_len == 0 ? o.config.max_seq_len : o.model.seq_len, o.world_size);
  if (o.model.lora.has_value()) {
    const LoraConfig& lora = *o.model.lora;
    int64_t adapter_elems = 0;
    for (const TensorSpec& t : PeftAdapterTensors(*o.model_config, lora))
      adapter_elems += t.numel();
    std::cout << absl::StrFormat(
        "LoRA: r %d, lora_alpha %g, targets %s: %d trainable adapter parameters (%.4f%%), the "
        "base's %d frozen in param-only chunks (%d bytes each)\n",
        lora.r, lora.lora_alpha, absl::StrJoin(lora.target_modules, ","), adapter_elems,
        100.0 * static_cast<double>(adapter_elems) /
            static_cast<double>(adapter_elems + ModelParameterCount(*o.model_config)),
        ModelParameterCount(*o.model_config), SizeOf(o.compute_dtype));
  }
  std::cout << "accelerator budget " << FormatBytes(run->accelerator_bytes) << " ("
            << run->chunk_note << ")\n"
            << p.Summary() << "\n";
  std::cout << absl::StrFormat(
      "lower_bound_bytes=%d min_accelerator_bytes=%d predicted_accelerator_peak_bytes=%d "
      "host_model_data_bytes=%d host_needed_bytes=%d chunk_elems=%d%s\n",
      p.lower_bound_bytes, p.min_accelerator_bytes, p.predicted_accelerator_peak_bytes,
      p.host_model_data_bytes, p.host_needed_bytes, p.chunk_elems,
      p.disk_tier ? absl::StrFormat(" disk_bytes=%d disk_host_bytes=%d disk_read_bytes_per_step=%d "
                                    "disk_write_bytes_per_step=%d",
                                    p.disk_bytes, p.disk_host_bytes, p.disk_read_bytes_per_step,
                                    p.disk_write_bytes_per_step)
                  : std::string());
  if (absl::GetFlag(FLAGS_moments)) {
    for (size_t i = 0; i < p.moments.size(); ++i) {
      const PlannedMoment& m = p.moments[i];
      std::cout << absl::StrFormat("%5d %-4s ws %10d now %10d peak %10d reserved %10d\n", i,
                                   StageName(m.stage), m.working_set_bytes, m.nonmodel_now_bytes,
                                   m.nonmodel_peak_bytes, m.scratch_reserved_bytes);
    }
  }
  if (absl::Status fits = CheckGptRunFits(o, *run); !fits.ok()) {
    std::cerr << "error: " << fits.message() << "\n";
    return 1;
  }
  std::cout << "fits\n";
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Prints the pre-flight memory plan of a GPT training run.");
  absl::ParseCommandLine(argc, argv);
  return ps::Run();
}
