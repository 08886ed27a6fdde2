// GptActivationProfile: GptModel's activation profile (scheduler/activation_profile.h) — every
// scratch allocation, free and operator access of one ForwardBackward and one Evaluate, in
// program order, with the bytes GptModel requests — for a config, batch, sequence length,
// activation checkpointing, compute dtype, thread count, kernel tiles and wte split. The memory
// plan (scheduler/memory_plan.h) replays it to predict the tide before a run allocates anything.
//
// One source of truth. The profile is GptModel's own program (model/transformer_program.h) run
// over a recording context: the same buffers, sizes, order of allocation, access and release, and
// order of frees, because it is the same code; the kernels are not run. Their workspaces are asked
// of a KernelWorkspaces (model/kernels/kernel_workspaces.h): the sizes of the implementation the
// run will use — the CPU's on the emulated accelerator, CUDA's (cuBLAS's workspace in every GEMM)
// on a GPU — which are the sizes that implementation's Kernels answer the model with.
// trainer/activation_profile_match_test runs GptModel's warm-up on the emulated accelerator for
// random shapes, dtypes, splits and checkpointing and requires the recorded tide to equal the
// replayed profile's at every moment.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_GPT_ACTIVATION_PROFILE_H_
#define PATRICKSTAR_MODEL_GPT_ACTIVATION_PROFILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/model_config.h"
#include "scheduler/activation_profile.h"
#include "scheduler/memory_plan.h"

namespace ps {

// The operators a layout is built from and the profile over them.
struct GptMemoryModel {
  std::vector<OperatorSpec> ops;
  ActivationProfile profile;
};

// `workspaces`: the kernel workspace sizes of the run's Kernels (CreateKernelWorkspaces, or the
// model's kernels' workspaces()); null: CpuKernelWorkspaces(options.threads), what the model's
// own CPU kernels ask for.
// REQUIRES: a valid config, options GptModel::Create accepts (seq_len resolved: 0 means
// max_seq_len; threads = the model's ThreadPool size) and a wte split whose blocks start on
// multiples of options.ce_vocab_tile.
GptMemoryModel GptActivationProfile(const GptConfig& config, const GptModelOptions& options,
                                    DType compute_dtype, const VocabLayoutOptions& layout,
                                    const KernelWorkspaces* workspaces = nullptr);
// The same for any architecture (ModelOperators(config, layout) and GptModel's Create(ModelConfig)
// path; for a GPT-2 config identical to GptActivationProfile of its GptConfig). With options.lora
// (both functions) the operators are LoraModelOperators(config, *options.lora, layout) — a frozen
// base, whose backward allocates no weight gradients, and the adapters, whose buffers (h, dropout
// copies, their gradients and workspaces) the profile records. REQUIRES then:
// ValidateLoraConfig(config, *options.lora) is OK.
GptMemoryModel ModelActivationProfile(const ModelConfig& config, const GptModelOptions& options,
                                      DType compute_dtype, const VocabLayoutOptions& layout,
                                      const KernelWorkspaces* workspaces = nullptr);

// The GptConfig view of a ModelConfig's common dimensions (vocab, max_position_embeddings,
// hidden, layers, heads): what the vocabulary row-block helpers of model/gpt_config.h read.
GptConfig GptConfigView(const ModelConfig& config);

// The smallest chunk that holds every operator once the vocabulary matrices are split in blocks
// of `row_quantum` rows (GptMinChunkElems for GPT-2). REQUIRES: a valid config.
int64_t ModelMinChunkElems(const ModelConfig& config, int64_t row_quantum);

// --- The pre-flight plan of a GPT run -------------------------------------------------------
//
// PlanGptRun lays the model out (wte split in row blocks sized to the chunk), builds its profile
// and runs PlanMemory (scheduler/memory_plan.h). With chunk_elems 0 ("auto") it scans chunk sizes
// from the smallest that holds every operator (GptMinChunkElems) to twice that, in steps of
// 1/8 of it rounded down to a power of two (at least 1 Ki elements; about 9 candidates), and picks
// the one that fits the accelerator with the least model data of all ranks (padding waste), ties
// to the smaller — the same choice on every rank (nothing rank-local decides it); when none fits,
// the one that needs the least accelerator memory (the refusal then names its numbers). With
// accelerator_bytes 0 ("auto") the budget is max(4 GiB, the plan's minimum).

struct GptRunPlanOptions {
  GptConfig config;
  // When set, the model planned (any architecture; `config` is then ignored).
  std::optional<ModelConfig> model_config;
  // batch, seq_len (0: max_seq_len), activation_checkpointing, threads, the kernel tiles and the
  // LoRA configuration (model.lora: the layout is LoraModelOperators', its frozen base chunks
  // param-only in every byte count; checked with ValidateLoraConfig).
  GptModelOptions model;
  // The kernel workspace sizes of the implementation the run computes with
  // (CreateKernelWorkspaces for its backend: CUDA's add cuBLAS's workspace to every GEMM); null:
  // the CPU kernels' for model.threads (the emulated accelerator).
  std::shared_ptr<const KernelWorkspaces> kernel_workspaces;
  DType compute_dtype = DType::kF32;
  int world_size = 1;
  int rank = 0;
  int gradient_accumulation_steps = 1;
  // As MemoryPlanOptions (optimizer.overlap's rollback snapshot budget; 0 when the overlap is off).
  int64_t overlap_snapshot_bytes = 0;
  // 0: auto (see above).
  int64_t chunk_elems = 0;
  int64_t accelerator_bytes = 0;
  int64_t comm_buffer_bytes = 0;
  // As MemoryPlanOptions.
  std::optional<int64_t> host_cap_bytes;
  int64_t host_available_bytes = 0;
  int64_t host_resident_bytes = 0;
  int64_t host_overhead_bytes = 0;
  int64_t host_workspace_bytes = 0;
  bool accelerator_in_host_memory = true;

  // The disk tier (zero_optimization.offload_optimizer.device "nvme"); unset: none. The optimizer
  // state this rank owns gets swap slots under `dir`; host memory holds at most a budget of it.
  struct DiskTier {
    // nvme_path, for messages.
    std::string dir;
    // What the filesystem of `dir` can still take (statvfs); 0: not checked.
    int64_t free_bytes = 0;
    // Chunk indices read ahead of the optimizer (offload_optimizer.buffer_count), >= 1.
    int64_t read_ahead = 4;
    // Host bytes of optimizer state the tier may hold. 0: auto — what the host limit
    // (accelerator.host_memory, else what the OS can give less kDiskTierHostMarginBytes or 1/20 of
    // it, whichever is more) leaves beside everything else the plan counts, at most all of it and
    // at least the tier's minimum (a budget at the minimum that still does not fit is refused).
    int64_t host_budget_bytes = 0;
    // `dir` is on a RAM-backed filesystem (tmpfs: disk/disk_probe.h IsRamBacked): the swap's
    // bytes are host memory, counted as such (MemoryPlan::host_swap_bytes), never as disk alone.
    bool in_host_memory = false;
    // The optimizer state is on disk (offload_optimizer "nvme"); false when only the frozen
    // params are (offload_param "nvme" alone): the state is then counted whole on the host.
    bool optimizer_state = true;
    // zero_optimization.offload_param.device "nvme" (scheduler/disk_tier.h, "Frozen param
    // chunks"): the frozen param chunks this rank holds (a LoRA/QLoRA base) get swap slots too,
    // and host memory holds at most frozen_host_budget_bytes of them (0: auto — what the host
    // limit leaves beside everything else, as host_budget_bytes' auto, at most all of them and
    // at least the tier's least, one param chunk; MemoryPlan::disk_frozen_host_budget_bytes is
    // the budget planned with), reading ahead frozen_read_ahead of them in the access order.
    bool frozen_params = false;
    int64_t frozen_host_budget_bytes = 0;
    int64_t frozen_read_ahead = 4;
  };
  std::optional<DiskTier> disk;
};

// What the disk tier's automatic host budget leaves free of what the OS can give.
inline constexpr int64_t kDiskTierHostMarginBytes = int64_t{512} << 20;

struct GptRunPlan {
  MemoryPlan plan;
  VocabLayoutOptions vocab;
  int64_t accelerator_bytes = 0;
  // The scratch allocator's options for that budget (ScratchOptionsForBudget).
  CachingAllocatorOptions scratch;
  // "chunk.size \"auto\": 9 candidates searched" or "chunk.size".
  std::string chunk_note;
  // The disk tier's host budget the plan chose (DiskTier::host_budget_bytes, or the automatic
  // one); 0 without the tier. The ChunkManager's DiskTierOptions::host_budget_bytes.
  int64_t disk_host_budget_bytes = 0;
};

// InvalidArgument for an invalid config or options (naming the field), a chunk_elems below
// GptMinChunkElems.
absl::StatusOr<GptRunPlan> PlanGptRun(const GptRunPlanOptions& options);

// OK when `plan` fits; otherwise ResourceExhausted with one message for a person: what does not
// fit, by how much, and the smallest accelerator memory (--accelerator_memory), the host memory,
// or the largest micro batch (--micro_batch_size) that would fit. Re-plans smaller batches, so it
// takes the options `plan` came from.
absl::Status CheckGptRunFits(const GptRunPlanOptions& options, const GptRunPlan& plan);

// OK unless the plan's disk tier needs more swap bytes than options.disk->free_bytes (when
// checked): then ResourceExhausted naming the directory (nvme_path) and both numbers. Checked
// first by CheckGptRunFits; a run with the tier checks it even where the rest of the plan is not
// enforced.
absl::Status CheckGptRunDisk(const GptRunPlanOptions& options, const GptRunPlan& plan);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_GPT_ACTIVATION_PROFILE_H_
