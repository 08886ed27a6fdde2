// The one way from a training config to its pre-flight memory plan (model/gpt_activation_profile.h
// PlanGptRun). The trainer (trainer/run_plan.h), tools/plan, the benchmarks and the tests all
// plan through PlanRunFromConfig, so that "planned as the trainer plans" is true by construction:
// nothing else builds GptRunPlanOptions from a TrainConfig.
//
// What the config alone cannot say is the PlanContext: the resolved model (a preset, or a Hugging
// Face directory's config.json), the world and this rank, the threads, the kernels' workspace
// sizes, and the machine (the GPU's usable memory, what the OS can still give, the swap
// directory's free space and whether it is RAM-backed). ReadPlanMachine reads the machine's part
// as the trainer does; tests and tools may inject it instead (a GPU run planned without a GPU).
//
// Thread safety: value types and pure functions, except ReadPlanMachine (reads /proc and statfs).
#ifndef PATRICKSTAR_TRAINER_PLAN_OPTIONS_H_
#define PATRICKSTAR_TRAINER_PLAN_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "scheduler/memory_plan.h"
#include "trainer/config.h"

namespace ps {

// What a run allocates on the host beside the chunk pools and the buffers the plan counts one by
// one: the data loader's corpus, thread stacks, BLAS buffers (GptRunPlanOptions::
// host_overhead_bytes). The plan's safe bound counts all of it; its expected peak the measured
// kExpectedHostOverheadBytes (scheduler/memory_plan.h).
inline constexpr int64_t kRunHostOverheadBytes = int64_t{256} << 20;

// Most bytes of the device tile the export broadcasts through with a device-memory communicator
// (at most one chunk of f32: see PlanAcceleratorReserve).
inline constexpr int64_t kExportTileBytes = int64_t{4} << 20;

// Accelerator bytes a run holds beside the chunks and the activations (trainer/trainer.h), which
// the plan reserves (GptRunPlanOptions::comm_buffer_bytes).
struct AcceleratorReserve {
  // CudaAdam's staging tile and workspace (cuda only), from the backend beside the DeviceMemory.
  int64_t adam_bytes = 0;
  // The ZeRO collectives' device staging (device-memory communicator, world > 1), from the
  // accelerator's scratch for the whole run (CommCollectives::DeviceStagingBytes).
  int64_t comm_staging_bytes = 0;
  // The export's broadcast tile (device-memory communicator, world > 1, checkpoint.export set):
  // min(kExportTileBytes, one chunk of f32), from the scratch at the end; the ChunkManager keeps
  // it free (comm_buffer_bytes).
  int64_t export_tile_bytes = 0;
  int64_t total_bytes() const { return adam_bytes + comm_staging_bytes + export_tile_bytes; }
};

// The reserve of a run on `kind` with a communicator of `world` ranks (device_communicator: it
// takes device memory only), chunks of `chunk_elems` elements of `dtype`, exporting or not.
// REQUIRES: world >= 1, chunk_elems >= 0.
AcceleratorReserve PlanAcceleratorReserve(AcceleratorKind kind, bool device_communicator, int world,
                                          int64_t chunk_elems, DType dtype, bool exports);

// The accelerator budget the memory plan starts from: accelerator.memory (`configured_bytes`) when
// set; unset, on cuda in a world of one, the GPU (`cuda_usable_bytes`: its free memory minus the
// margin of memory/cuda_capacity.h), not a 4 GiB guess; otherwise 0 (the plan's minimum). With
// several ranks the budget picks the chunk size, which every rank must share, and free memory is
// rank-local: cuda with world > 1 keeps the plan's minimum unless accelerator.memory is set.
int64_t DefaultAcceleratorBudget(AcceleratorKind kind, int64_t configured_bytes,
                                 int64_t cuda_usable_bytes, int world);

// What the plan needs beyond the config.
struct PlanContext {
  // The model the run trains, resolved (trainer/model_resolution.h; PlanModelFromConfig).
  ModelConfig model;
  // The data-parallel world and this rank; whether its communicator takes device memory only
  // (nccl: the collectives stage in the accelerator's scratch).
  int world = 1;
  int rank = 0;
  bool device_communicator = false;
  // The model's threads (config.threads, or one per hardware thread when it is 0), >= 1.
  int threads = 1;
  // The workspace sizes of the run's kernels (CreateKernelWorkspaces for its backend); null: the
  // CPU kernels' for `threads`.
  std::shared_ptr<const KernelWorkspaces> kernel_workspaces;
  // --- The machine (ReadPlanMachine, or injected).
  // cuda: the GPU's free memory minus the margin (DefaultAcceleratorBudget); 0 elsewhere.
  int64_t cuda_usable_bytes = 0;
  // What the OS can still give the process (MemAvailable, or the memory cgroup's limit if lower);
  // 0: not checked.
  int64_t host_available_bytes = 0;
  // The process's resident bytes now (the trainer plans with 0: the plan's host needs are beyond
  // what is resident; a benchmark's child passes its baseline to compare the peaks).
  int64_t host_resident_bytes = 0;
  // The disk tier (offload_optimizer or offload_param device "nvme"): the free bytes of the swap
  // directory's filesystem (0:
  // not checked), and whether it is RAM-backed (tmpfs: disk/disk_probe.h IsRamBacked), when
  // its swap is counted as host memory.
  int64_t disk_free_bytes = 0;
  bool disk_in_host_memory = false;
  // --- The data (ReadPlanMachine: DataNeedsTokenMetadata, or injected).
  // Whether data.train or data.val is an example file, whose packed rows carry positions and
  // key_start: 8 bytes per token more on the accelerator (GptModelOptions::token_metadata).
  bool token_metadata = false;
};

// Whether data.train or data.val is an example file (trainer/data/example_file.h SniffDataFile);
// false without data files (the synthetic corpus). A file that cannot be sniffed counts as none:
// the run reports it when it opens its data.
bool DataNeedsTokenMetadata(const TrainConfig& config);

// Reads the machine's part of `context` as the trainer does: host_available_bytes
// (ReadHostMemoryInfo; unreadable: 0, with a warning in the log), token_metadata
// (DataNeedsTokenMetadata: the data files' headers), and with the disk tier the
// free bytes of nvme_path and whether it is RAM-backed. Errors: the filesystem's (NotFound,
// PermissionDenied, ...), prefixed with the swap directory's key (DiskTierDirKey:
// "zero_optimization.offload_optimizer.nvme_path (--nvme_path): ", or offload_param's when only
// the frozen base is on disk).
[[nodiscard]] absl::Status ReadPlanMachine(const TrainConfig& config, PlanContext& context);

// The model a config describes as the trainer resolves it: the config.json of checkpoint.init_from
// when it names a directory (a Hugging Face model), else the model section (ResolveTrainModel).
// Without the trainer's checks of the section against the directory (trainer/model_resolution.h).
absl::StatusOr<ModelConfig> PlanModelFromConfig(const TrainConfig& config);

// The plan options of `config` in `context`, for chunks of config.chunk.size (0: auto) with that
// chunk size's accelerator reserve. Every derived value is here: batch, sequence length
// (ResolveSeqLen), compute dtype, accumulation, the LoRA configuration (ToLoraConfig), the
// accelerator budget (DefaultAcceleratorBudget), the host cap, kRunHostOverheadBytes, the
// export/checkpoint host workspaces, whether the accelerator's memory is host memory (the
// emulated one), the reserve (PlanAcceleratorReserve) and the disk tier.
// REQUIRES: context.world >= 1, 0 <= context.rank < world, context.threads >= 1.
absl::StatusOr<GptRunPlanOptions> PlanOptionsFromConfig(const TrainConfig& config,
                                                        const PlanContext& context);

// The frozen host budget of offload_param "nvme" (DiskTierOptions::frozen_host_budget_bytes):
// max_in_cpu x the param chunks' element size (`dtype`, the compute dtype); 0 when max_in_cpu is
// auto (PlanRunFromConfig then picks it: MemoryPlan::disk_frozen_host_budget_bytes).
int64_t FrozenHostBudgetBytes(const OffloadParamConfig& param, DType dtype);

// A planned run: the options planned with, the accelerator reserve they hold, and the plan.
struct RunPlan {
  GptRunPlanOptions options;
  AcceleratorReserve reserve;
  GptRunPlan plan;
};

// PlanGptRun of PlanOptionsFromConfig; with offload_param "nvme" and max_in_cpu auto, the
// frozen host budget (run.options.disk->frozen_host_budget_bytes) set to what the host limit
// (accelerator.host_memory, else what the OS can give less kDiskTierHostMarginBytes or 1/20)
// leaves beside the rest of the plan, at most every frozen chunk and at least the tier's least
// (one param chunk); with a device-memory communicator and chunk.size "auto",
// planned again at the chunk size the search picked with that size's collectives staging
// reserved (the staging is sized by the chunk). Errors: PlanGptRun's, prefixed "memory plan: ".
// Whether the run fits is CheckRunPlan's.
absl::StatusOr<RunPlan> PlanRunFromConfig(const TrainConfig& config, const PlanContext& context);

// The trainer's refusal of a planned run: an explicit offload_param.max_in_cpu below the disk
// tier's least frozen budget (ResourceExhausted naming the key, in elements and bytes), the swap
// must fit its disk (always), host memory must
// fit (always: a run the OS would kill is never started), the accelerator when
// `enforce_accelerator` (TrainerEnvironment::enforce_memory_plan). The messages of
// CheckGptRunDisk / CheckGptRunFits.
[[nodiscard]] absl::Status CheckRunPlan(const RunPlan& plan, bool enforce_accelerator);

// One line for people when the swap directory is RAM-backed ("" otherwise): that the swap files
// take host memory, and how much.
std::string RamBackedSwapNote(const RunPlan& plan);

// The quantization_config of the config.json of checkpoint.init_from when it names a directory
// saved pre-quantized (model/quant4_import.h Quant4ConfigFromHfConfig: its storage, compute
// dtype as the file says); nullopt for a directory without one, a file, or no init_from. Errors:
// config.json's, prefixed with "checkpoint.init_from (--init_from): ".
absl::StatusOr<std::optional<Quant4Config>> PrequantizedInitFrom(const TrainConfig& config);

// The 4-bit base a run trains (GptModelOptions::quant4): the quantization section when
// load_in_4bit (ToQuant4Config); else, with a lora section and checkpoint.init_from saved
// pre-quantized (`dir_quant4`: its quantization_config, PrequantizedInitFrom or
// HfCheckpoint::quant4()), the directory's storage — quant type, double quant, skip modules —
// computing in the section's bnb_4bit_compute_dtype (float32 unless set): the base loads as it
// is; else nullopt (without lora a pre-quantized directory loads dequantized: a full
// fine-tune). A section that differs from the directory is left as it is (the model's load
// refuses it, naming the directory's format).
std::optional<Quant4Config> RunQuant4(const TrainConfig& config,
                                      const std::optional<Quant4Config>& dir_quant4);

// The console's line for checkpoint.init_from saved pre-quantized (`dir_quant4`), e.g. "base:
// pre-quantized in /m (nf4, double quant): loaded as it is" with a lora section, else "...:
// loaded dequantized to bf16 (no lora section: a full fine-tune)".
std::string PrequantizedBaseLine(const std::string& dir, const Quant4Config& dir_quant4, bool lora,
                                 DType dtype);

// The line the trainer's console and tools/plan print for offload_param.device "nvme", e.g.
// "disk tier: the frozen base's 12 param chunks are on disk under /ssd/swap (1.5 MiB of slots,
// written once); host budget 256 KiB (max_in_cpu 65536 elements; the least 128 KiB, one param
// chunk) of them, read-ahead 5; per step up to 3.0 MiB read". REQUIRES: `plan` planned
// offload_param "nvme" (disk_frozen_* set).
std::string FrozenOnDiskLine(const ZeroOptimizationConfig& zero, DType dtype,
                             const MemoryPlan& plan);

// QLoRA's 4-bit base: the weights stored in 4 bits (Quant4Weights), the values they hold and the
// bytes their blobs take in chunks of the compute dtype (Quant4TotalsOf). All zero without one.
Quant4Totals Quant4BaseTotals(const ModelConfig& model, const std::optional<LoraConfig>& lora,
                              const std::optional<Quant4Config>& quant4, DType dtype);

// The line the trainer's console and tools/plan print for a 4-bit base, e.g. "base: 196 linear
// weights in 4-bit nf4 (double quant): 1234567890 parameters in 0.60 GiB, 0.5159 bytes per
// parameter (4 in f32 unquantized)". REQUIRES: ValidateQuant4Config(model, &lora, quant4) is OK.
std::string Quant4BaseLine(const ModelConfig& model, const LoraConfig& lora,
                           const Quant4Config& quant4, DType dtype);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_PLAN_OPTIONS_H_
