#include "trainer/plan_options.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "disk/disk_probe.h"
#include "glog/logging.h"
#include "memory/host_memory_info.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/hf_config.h"
#include "model/kernels/nf4.h"
#include "model/peft_adapter.h"
#include "model/quant4_import.h"
#include "nlohmann/json.hpp"
#include "optimizer/cuda_adam_footprint.h"
#include "optimizer/hybrid_adam.h"
#include "scheduler/comm_collectives.h"
#include "trainer/config_validate.h"
#include "trainer/data/example_file.h"

namespace ps {
namespace {

// Host bytes the run's checkpoints and exports hold beside the pools.
int64_t HostWorkspaceBytes(const TrainConfig& config, const ModelConfig& model,
                           const std::optional<LoraConfig>& lora) {
  const CheckpointConfig& checkpoint = config.checkpoint;
  int64_t bytes = 0;
  if (lora.has_value()) {
    // LoRA: the PEFT export holds the adapters as f32 (and their safetensors image); the merged
    // export streams the model piece by piece (two pieces of HfExportOptions::max_piece_bytes:
    // the merged f32 values and their converted bytes). Never the whole base as f32.
    if (!checkpoint.export_path.empty()) {
      int64_t adapter_elems = 0;
      for (const TensorSpec& t : PeftAdapterTensors(model, *lora)) adapter_elems += t.numel();
      bytes += 2 * adapter_elems * static_cast<int64_t>(sizeof(float));
    }
    if (!checkpoint.export_merged.empty()) bytes += 2 * HfExportOptions{}.max_piece_bytes;
  } else if (!checkpoint.export_path.empty()) {
    // Export gathers every tensor as f32 at the end.
    bytes = ModelParameterCount(model) * static_cast<int64_t>(sizeof(float));
  }
  // Checkpoints and the exports read accelerator payloads through the model's pinned staging
  // buffer (model/gpt_model.h, GptModelOptions::payload_staging_bytes).
  if (!checkpoint.export_path.empty() || !checkpoint.export_merged.empty() ||
      !checkpoint.dir.empty()) {
    bytes += kPayloadStagingBytes;
  }
  return bytes;
}

// The reserve of `config` in `context` at `chunk_elems`.
AcceleratorReserve ReserveFor(const TrainConfig& config, const PlanContext& context,
                              int64_t chunk_elems) {
  return PlanAcceleratorReserve(config.accelerator.kind, context.device_communicator, context.world,
                                chunk_elems, ComputeDType(config.precision()),
                                /*exports=*/!config.checkpoint.export_path.empty());
}

}  // namespace

AcceleratorReserve PlanAcceleratorReserve(AcceleratorKind kind, bool device_communicator, int world,
                                          int64_t chunk_elems, DType dtype, bool exports) {
  AcceleratorReserve r;
  if (kind == AcceleratorKind::kCuda) r.adam_bytes = kCudaAdamDeviceBytes;
  if (device_communicator && world > 1) {
    r.comm_staging_bytes = CommCollectives::DeviceStagingBytes(world, chunk_elems, dtype);
    // A tensor (or row block) lies inside one chunk: no tile needs more than one chunk of f32.
    if (exports) {
      r.export_tile_bytes =
          std::min(kExportTileBytes, chunk_elems * static_cast<int64_t>(sizeof(float)));
    }
  }
  return r;
}

int64_t DefaultAcceleratorBudget(AcceleratorKind kind, int64_t configured_bytes,
                                 int64_t cuda_usable_bytes, int world) {
  if (configured_bytes > 0) return configured_bytes;
  if (kind == AcceleratorKind::kCuda && world == 1 && cuda_usable_bytes > 0) {
    return cuda_usable_bytes;
  }
  return 0;
}

bool DataNeedsTokenMetadata(const TrainConfig& config) {
  for (const std::string& path : {config.data.train_path, config.data.val_path}) {
    if (path.empty()) continue;
    const absl::StatusOr<DataFileKind> kind = SniffDataFile(path);
    if (kind.ok() && *kind == DataFileKind::kExamples) return true;
  }
  return false;
}

absl::Status ReadPlanMachine(const TrainConfig& config, PlanContext& context) {
  context.token_metadata = DataNeedsTokenMetadata(config);
  // What the OS can still give (MemAvailable, or the memory cgroup's limit if lower); unreadable
  // /proc: unchecked.
  if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
    context.host_available_bytes = info->available_bytes();
  } else {
    context.host_available_bytes = 0;
    LOG(WARNING) << "host memory not checked: " << info.status();
  }
  const ZeroOptimizationConfig& zero = config.zero_optimization;
  if (!UsesDiskTier(zero)) return absl::OkStatus();
  const std::string& dir = DiskTierDir(zero);
  const auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(DiskTierDirKey(zero), ": ", s.message()));
  };
  absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(dir);
  if (!free_bytes.ok()) return named(free_bytes.status());
  absl::StatusOr<bool> in_ram = IsRamBacked(dir);
  if (!in_ram.ok()) return named(in_ram.status());
  context.disk_free_bytes = *free_bytes;
  context.disk_in_host_memory = *in_ram;
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> PlanModelFromConfig(const TrainConfig& config) {
  const std::string& init_from = config.checkpoint.init_from;
  std::error_code ec;
  if (!init_from.empty() && std::filesystem::is_directory(init_from, ec)) {
    absl::StatusOr<ModelConfig> model =
        ReadHfConfig((std::filesystem::path(init_from) / std::string(kHfConfigFileName)).string());
    if (!model.ok()) {
      return absl::Status(
          model.status().code(),
          absl::StrCat("checkpoint.init_from (--init_from): ", model.status().message()));
    }
    return model;
  }
  return ResolveTrainModel(config.model);
}

absl::StatusOr<GptRunPlanOptions> PlanOptionsFromConfig(const TrainConfig& config,
                                                        const PlanContext& context) {
  if (context.world < 1 || context.rank < 0 || context.rank >= context.world ||
      context.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlanContext: world ", context.world, ", rank ", context.rank, " and threads ",
                     context.threads, ": need world >= 1, 0 <= rank < world and threads >= 1"));
  }
  GptRunPlanOptions o;
  o.config = GptConfigView(context.model);
  o.model_config = context.model;
  o.model.batch = config.train_micro_batch_size_per_gpu;
  o.model.seq_len = ResolveSeqLen(config, o.config);
  o.model.activation_checkpointing = config.model.activation_checkpointing;
  o.model.threads = context.threads;
  o.model.token_metadata = context.token_metadata;
  // LoRA: the plan lays out the frozen base (param chunks only) and the adapters (full state).
  if (config.lora.has_value()) o.model.lora = ToLoraConfig(*config.lora);
  // QLoRA: the 4-bit weights at their blobs' size (the plan validates it against the model).
  // (Or the 4-bit storage of a pre-quantized checkpoint.init_from, as the trainer adopts it.)
  ASSIGN_OR_RETURN(const std::optional<Quant4Config> dir_quant4, PrequantizedInitFrom(config));
  o.model.quant4 = RunQuant4(config, dir_quant4);
  o.kernel_workspaces = context.kernel_workspaces;
  o.compute_dtype = ComputeDType(config.precision());
  o.world_size = context.world;
  o.rank = context.rank;
  o.gradient_accumulation_steps = static_cast<int>(config.gradient_accumulation_steps);
  // optimizer.overlap's rollback snapshot, at its budget (HybridAdam speculates only when an
  // optimizer step is one micro-batch: with accumulation the snapshot is never allocated).
  o.overlap_snapshot_bytes = config.optimizer.overlap && config.gradient_accumulation_steps == 1
                                 ? HybridAdamOptions{}.overlap_snapshot_bytes
                                 : 0;
  o.chunk_elems = config.chunk.size_elems;
  const AcceleratorKind kind = config.accelerator.kind;
  o.accelerator_bytes = DefaultAcceleratorBudget(kind, config.accelerator.memory_bytes,
                                                 context.cuda_usable_bytes, context.world);
  if (config.accelerator.host_memory_bytes > 0) {
    o.host_cap_bytes = config.accelerator.host_memory_bytes;
  }
  o.host_available_bytes = context.host_available_bytes;
  o.host_resident_bytes = context.host_resident_bytes;
  o.host_overhead_bytes = kRunHostOverheadBytes;
  o.host_workspace_bytes = HostWorkspaceBytes(config, context.model, o.model.lora);
  // The emulated accelerator's memory is host memory; a GPU's is not.
  o.accelerator_in_host_memory = kind == AcceleratorKind::kCpu;
  // What the run holds on the accelerator beside chunks and activations (trainer.h), reserved.
  o.comm_buffer_bytes = ReserveFor(config, context, o.chunk_elems).total_bytes();
  // The disk tier: the optimizer state this rank owns in swap files under nvme_path, host memory
  // holding the budget of it (the plan picks it when host_budget is auto); a RAM-backed nvme_path
  // is host memory too.
  // With offload_param "nvme" the frozen base's param chunks get slots in the same swap, host
  // memory holding max_in_cpu elements of them (auto, 0: the plan picks the budget).
  const OffloadOptimizerConfig& offload = config.zero_optimization.offload_optimizer;
  const OffloadParamConfig& param = config.zero_optimization.offload_param;
  if (UsesDiskTier(config.zero_optimization)) {
    GptRunPlanOptions::DiskTier disk;
    disk.dir = DiskTierDir(config.zero_optimization);
    disk.optimizer_state = offload.device == OffloadDevice::kNvme;
    if (disk.optimizer_state) {
      disk.read_ahead = offload.buffer_count;
      disk.host_budget_bytes = offload.host_budget_bytes;
    }
    disk.free_bytes = context.disk_free_bytes;
    disk.in_host_memory = context.disk_in_host_memory;
    disk.frozen_params = param.device == OffloadDevice::kNvme;
    if (disk.frozen_params) {
      disk.frozen_read_ahead = param.buffer_count;
      disk.frozen_host_budget_bytes = FrozenHostBudgetBytes(param, o.compute_dtype);
    }
    o.disk = std::move(disk);
  }
  return o;
}

int64_t FrozenHostBudgetBytes(const OffloadParamConfig& param, DType dtype) {
  return param.max_in_cpu * SizeOf(dtype);
}


absl::StatusOr<RunPlan> PlanRunFromConfig(const TrainConfig& config, const PlanContext& context) {
  RunPlan run;
  ASSIGN_OR_RETURN(run.options, PlanOptionsFromConfig(config, context));
  run.reserve = ReserveFor(config, context, run.options.chunk_elems);
  absl::StatusOr<GptRunPlan> plan = PlanGptRun(run.options);
  if (plan.ok() && context.device_communicator && run.options.chunk_elems == 0) {
    // chunk.size "auto": the collectives' staging is sized by the chunk the search picked; plan
    // that chunk size again with its staging reserved.
    const std::string note = plan->chunk_note;
    run.options.chunk_elems = plan->plan.chunk_elems;
    run.reserve = ReserveFor(config, context, run.options.chunk_elems);
    run.options.comm_buffer_bytes = run.reserve.total_bytes();
    plan = PlanGptRun(run.options);
    if (plan.ok()) plan->chunk_note = note;
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("memory plan: ", plan.status().message()));
  }
  run.plan = *std::move(plan);
  return run;
}

absl::Status CheckRunPlan(const RunPlan& run, bool enforce_accelerator) {
  // An explicit frozen host budget below the tier's least: the key to change, not the machine.
  const MemoryPlan& p = run.plan.plan;
  if (p.disk_tier && run.options.disk.has_value() && run.options.disk->frozen_params &&
      run.options.disk->frozen_host_budget_bytes > 0 &&
      run.options.disk->frozen_host_budget_bytes < p.disk_frozen_min_host_bytes) {
    const int64_t elem = SizeOf(run.options.compute_dtype);
    return absl::ResourceExhaustedError(absl::StrCat(
        "zero_optimization.offload_param.max_in_cpu (",
        run.options.disk->frozen_host_budget_bytes / elem, " parameter elements, ",
        FormatBytes(run.options.disk->frozen_host_budget_bytes),
        ") is below the disk tier's least host budget for the frozen base, one param chunk: ",
        p.disk_frozen_min_host_bytes / elem, " elements (", FormatBytes(p.disk_frozen_min_host_bytes),
        "). Set max_in_cpu to at least that, or \"auto\". Nothing was allocated"));
  }
  // (Host memory is always enforced: a run the OS would kill is never started.)
  if (enforce_accelerator || !run.plan.plan.fits_host) {
    RETURN_IF_ERROR(CheckGptRunFits(run.options, run.plan));
  }
  // The swap files must fit their disk, whatever else is enforced.
  return CheckGptRunDisk(run.options, run.plan);
}

std::string RamBackedSwapNote(const RunPlan& run) {
  const MemoryPlan& p = run.plan.plan;
  if (p.host_swap_bytes <= 0 || !run.options.disk.has_value()) return std::string();
  return absl::StrCat("disk tier: ", run.options.disk->dir,
                      " (zero_optimization.offload_optimizer.nvme_path) is on a RAM-backed "
                      "filesystem (tmpfs): its ",
                      FormatBytes(p.host_swap_bytes),
                      " of swap files are host memory, counted as such by the plan, not as disk");
}

absl::StatusOr<std::optional<Quant4Config>> PrequantizedInitFrom(const TrainConfig& config) {
  const std::string& init_from = config.checkpoint.init_from;
  std::error_code ec;
  if (init_from.empty() || !std::filesystem::is_directory(init_from, ec)) {
    return std::optional<Quant4Config>();
  }
  const std::string path =
      (std::filesystem::path(init_from) / std::string(kHfConfigFileName)).string();
  const auto named = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.init_from (--init_from): ", s.message()));
  };
  // (PlanModelFromConfig and HfCheckpoint::Open read the same file with their own checks.)
  std::ifstream in(path, std::ios::binary);
  if (!in) return named(absl::NotFoundError(absl::StrCat("cannot open ", path)));
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return named(absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object")));
  }
  absl::StatusOr<std::optional<Quant4Config>> q = Quant4ConfigFromHfConfig(json, path);
  if (!q.ok()) return named(q.status());
  return *std::move(q);
}

std::optional<Quant4Config> RunQuant4(const TrainConfig& config,
                                      const std::optional<Quant4Config>& dir_quant4) {
  if (config.quantization.load_in_4bit) return ToQuant4Config(config.quantization);
  if (!config.lora.has_value() || !dir_quant4.has_value()) return std::nullopt;
  Quant4Config q = *dir_quant4;
  q.compute_dtype = config.quantization.compute_dtype;
  return q;
}

std::string PrequantizedBaseLine(const std::string& dir, const Quant4Config& dir_quant4, bool lora,
                                 DType dtype) {
  return absl::StrCat("base: pre-quantized in ", dir, " (", Quant4TypeName(dir_quant4.quant_type),
                      dir_quant4.double_quant ? ", double quant" : "", "): ",
                      lora ? std::string("loaded as it is")
                           : absl::StrCat("loaded dequantized to ", DTypeName(dtype),
                                          " (no lora section: a full fine-tune)"));
}

std::string FrozenOnDiskLine(const ZeroOptimizationConfig& zero, DType dtype,
                             const MemoryPlan& p) {
  const OffloadParamConfig& param = zero.offload_param;
  const int64_t elem = SizeOf(dtype);
  return absl::StrFormat(
      "disk tier: the frozen base's %d param chunks are on disk under %s (%s of slots, written "
      "once); host budget %s (max_in_cpu %s: %d elements; the least %s, one param chunk) of "
      "them, read-ahead %d; per step up to %s read",
      p.disk_frozen_chunks, DiskTierDir(zero), FormatBytes(p.disk_frozen_bytes),
      FormatBytes(p.disk_frozen_host_budget_bytes),
      param.max_in_cpu > 0 ? absl::StrCat(param.max_in_cpu) : std::string("auto"),
      p.disk_frozen_host_budget_bytes / elem, FormatBytes(p.disk_frozen_min_host_bytes),
      param.buffer_count, FormatBytes(p.disk_frozen_read_bytes_per_step));
}

Quant4Totals Quant4BaseTotals(const ModelConfig& model, const std::optional<LoraConfig>& lora,
                              const std::optional<Quant4Config>& quant4, DType dtype) {
  if (!quant4.has_value() || !lora.has_value()) return Quant4Totals{};
  return Quant4TotalsOf(Quant4Weights(model, *lora, *quant4), dtype);
}

std::string Quant4BaseLine(const ModelConfig& model, const LoraConfig& lora,
                           const Quant4Config& quant4, DType dtype) {
  const Quant4Totals q = Quant4TotalsOf(Quant4Weights(model, lora, quant4), dtype);
  return absl::StrFormat(
      "base: %d linear weights in 4-bit %s%s: %d parameters in %s, %.4f bytes per parameter (%d "
      "in %s unquantized), computed in %s%s",
      q.weights, Quant4TypeName(quant4.quant_type), quant4.double_quant ? " (double quant)" : "",
      q.values, FormatBytes(q.stored_bytes),
      q.values > 0 ? static_cast<double>(q.stored_bytes) / static_cast<double>(q.values) : 0.0,
      SizeOf(dtype), DTypeName(dtype), DTypeName(quant4.compute_dtype),
      quant4.skip_modules.empty()
          ? std::string()
          : absl::StrCat("; kept at full width: ", absl::StrJoin(quant4.skip_modules, ",")));
}

}  // namespace ps
