#include "trainer/run_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "disk/disk_probe.h"
#include "glog/logging.h"
#include "memory/dtype.h"
#include "memory/host_memory_info.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "optimizer/cuda_adam_footprint.h"
#include "scheduler/comm_collectives.h"
#include "trainer/config.h"
#include "trainer/trainer.h"

namespace ps {

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

namespace trainer_internal {

absl::Status PlanMemoryOrRefuse(TrainRun& run) {
  GptRunPlanOptions o;
  o.config = run.gpt;
  o.model_config = run.model_config;
  o.model.batch = run.micro_batch;
  o.model.seq_len = run.seq_len;
  o.model.activation_checkpointing = run.config.model.activation_checkpointing;
  o.model.threads = run.threads;
  // LoRA: the plan lays out the frozen base (param chunks only) and the adapters (full state).
  o.model.lora = run.lora;
  o.kernel_workspaces = run.kernel_workspaces;
  o.compute_dtype = run.dtype;
  o.world_size = run.world;
  o.rank = run.rank;
  o.gradient_accumulation_steps = static_cast<int>(run.config.gradient_accumulation_steps);
  o.chunk_elems = run.config.chunk.size_elems;
  o.accelerator_bytes =
      DefaultAcceleratorBudget(run.config.accelerator.kind, run.config.accelerator.memory_bytes,
                               run.cuda_usable_bytes, run.world);
  if (run.config.accelerator.host_memory_bytes > 0) {
    o.host_cap_bytes = run.config.accelerator.host_memory_bytes;
  }
  // What the OS can still give (MemAvailable, or the memory cgroup's limit if lower); unreadable
  // /proc: unchecked.
  if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
    o.host_available_bytes = info->available_bytes();
  } else {
    LOG(WARNING) << "host memory not checked: " << info.status();
  }
  // Beside the pools: the data loader's corpus, thread stacks and BLAS buffers.
  o.host_overhead_bytes = 256 * kMiB;
  const CheckpointConfig& checkpoint = run.config.checkpoint;
  if (run.lora.has_value()) {
    // LoRA: the PEFT export holds the adapters as f32 (and their safetensors image); the merged
    // export streams the model piece by piece (two pieces of HfExportOptions::max_piece_bytes:
    // the merged f32 values and their converted bytes). Never the whole base as f32.
    if (!checkpoint.export_path.empty()) {
      int64_t adapter_elems = 0;
      for (const TensorSpec& t : PeftAdapterTensors(run.model_config, *run.lora)) {
        adapter_elems += t.numel();
      }
      o.host_workspace_bytes += 2 * adapter_elems * static_cast<int64_t>(sizeof(float));
    }
    if (!checkpoint.export_merged.empty()) {
      o.host_workspace_bytes += 2 * HfExportOptions{}.max_piece_bytes;
    }
  } else if (!checkpoint.export_path.empty()) {
    // Export gathers every tensor as f32 at the end.
    o.host_workspace_bytes =
        ModelParameterCount(run.model_config) * static_cast<int64_t>(sizeof(float));
  }
  // Checkpoints and the exports read accelerator payloads through the model's pinned staging
  // buffer (model/gpt_model.h, GptModelOptions::payload_staging_bytes).
  if (!checkpoint.export_path.empty() || !checkpoint.export_merged.empty() ||
      !checkpoint.dir.empty()) {
    o.host_workspace_bytes += kPayloadStagingBytes;
  }
  // The emulated accelerator's memory is host memory; a GPU's is not.
  const AcceleratorKind kind = run.config.accelerator.kind;
  o.accelerator_in_host_memory = kind == AcceleratorKind::kCpu;
  // What the run holds on the accelerator beside chunks and activations (trainer.h), reserved.
  const bool exports = !run.config.checkpoint.export_path.empty();
  run.reserve = PlanAcceleratorReserve(kind, run.DeviceCommunicator(), run.world, o.chunk_elems,
                                       run.dtype, exports);
  o.comm_buffer_bytes = run.reserve.total_bytes();
  // The disk tier: the optimizer state this rank owns in swap files under nvme_path, host memory
  // holding the budget of it (the plan picks it when host_budget is auto).
  const OffloadOptimizerConfig& offload = run.config.zero_optimization.offload_optimizer;
  if (offload.device == OffloadDevice::kNvme) {
    GptRunPlanOptions::DiskTier disk;
    disk.dir = offload.nvme_path;
    disk.read_ahead = offload.buffer_count;
    disk.host_budget_bytes = offload.host_budget_bytes;
    absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(offload.nvme_path);
    if (!free_bytes.ok()) {
      return absl::Status(
          free_bytes.status().code(),
          absl::StrCat("zero_optimization.offload_optimizer.nvme_path (--nvme_path): ",
                       free_bytes.status().message()));
    }
    disk.free_bytes = *free_bytes;
    o.disk = std::move(disk);
  }
  absl::StatusOr<GptRunPlan> plan = PlanGptRun(o);
  if (plan.ok() && run.DeviceCommunicator() && o.chunk_elems == 0) {
    // chunk.size "auto": the collectives' staging is sized by the chunk the search picked; plan
    // that chunk size again with its staging reserved.
    const std::string note = plan->chunk_note;
    o.chunk_elems = plan->plan.chunk_elems;
    run.reserve = PlanAcceleratorReserve(kind, true, run.world, o.chunk_elems, run.dtype, exports);
    o.comm_buffer_bytes = run.reserve.total_bytes();
    plan = PlanGptRun(o);
    if (plan.ok()) plan->chunk_note = note;
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("memory plan: ", plan.status().message()));
  }
  // (Host memory is always enforced: a run the OS would kill is never started.)
  if (run.env.enforce_memory_plan || !plan->plan.fits_host) {
    RETURN_IF_ERROR(CheckGptRunFits(o, *plan));
  }
  // The swap files must fit their disk, whatever else is enforced.
  RETURN_IF_ERROR(CheckGptRunDisk(o, *plan));
  run.plan = *std::move(plan);
  run.chunk_elems = run.plan.plan.chunk_elems;
  run.chunk_size_note = run.plan.chunk_note;
  return absl::OkStatus();
}

}  // namespace trainer_internal
}  // namespace ps
