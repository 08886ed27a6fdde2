// The pre-flight memory plan: before a run allocates anything, predict from the model's operators
// and its activation profile (scheduler/activation_profile.h) what the accelerator and the host
// will need, so that a run that cannot fit is refused up front instead of failing mid-run, and
// so that the allocator's segments, the non-model slack and the warm-up share are sized to the
// run.
//
// How. The profile's allocations are replayed through a real CachingAllocator (the run's options)
// over a virtual address space — the allocator never touches the memory it manages — so the plan
// sees exactly what the accelerator's MemoryTracker will count (requests rounded, tails kept with
// their blocks) and what the segments strand: free space inside segments still in use, which the
// device cannot give to chunks (fully free segments it can: the pools reclaim them). Replayed in
// the run's order — one evaluation (the trainer evaluates before training), then two training
// iterations (the warm-up and a steady one) — the steady iteration gives the predicted tide: per
// moment (every operator access) the non-model bytes at the access and their peak until the next
// moment, as the ChunkManager's warm-up records them. (The optimizer's moments hold no
// activations and add nothing to the accelerator's floor: Adam runs where each chunk is.)
//
// Accelerator. An access at moment m fits the ResidencyPlanner's hard limit iff
//   working_set(m) + max(peak[m], non-model at the access) + reserved <= budget
// where working_set is the operator's param chunk at its pool's block size (its ZeRO group's N
// chunks for world size N) and reserved = comm_buffer_bytes + slack, and slack covers the most
// bytes the segments ever strand. So
//   lower_bound            = max over moments (iteration and evaluation) of
//                            working_set + max(peak, now)     (the physical floor: one operator's
//                                                              working set plus the activations
//                                                              live at that moment)
//   min_accelerator_bytes  = lower_bound + slack + tide margin + comm_buffer_bytes
// The warm-up share of the budget (off-trace accesses may keep that much resident) is set so that
// it plus the highest non-model peak plus the reserve fit the budget: the warm-up never needs the
// pressure reclaimer. The predicted accelerator peak is what the budget will hold at its fullest:
// at every moment the resident chunks the planner allows (max(target, working set), at most every
// chunk the iteration uses plus the optimizer state the ADAM placement keeps) plus the segments
// held then, and never more than the budget. "The optimizer state the ADAM placement keeps" is
// ResidencyPlanner::PlanAdam's: the room left at every moment (budget - highest non-model peak -
// reserved) once every param chunk the iteration uses is resident, less adam_margin_bytes, in
// units of one index's three f32 state chunks, at most the indices this rank owns; that state
// stays on the accelerator for the whole run, beside the param chunks. A full model rarely has
// such room; a LoRA run (a frozen base without state, a few adapter chunks with it) often does.
//
// Host. The rank's model data in per-dtype chunk blocks (every param chunk keeps its host copy
// while on the accelerator, so all of it is resident on the host throughout), the gathered remote
// param chunks of ZeRO (two groups at once), with gradient accumulation (k > 1) an f32 accumulator
// for the parameters the rank owns (4/N bytes per parameter), the emulated accelerator's memory
// when it is host RAM (the cpu backend: its predicted peak), the disk tier's swap slots when its
// directory is RAM-backed (tmpfs), the process as it is now, what the run allocates beside the
// pools, and checkpoint/export buffers. It fits when the part not yet resident
// is at most what the OS can still give (memory/host_memory_info.h). That is the safe bound (every
// block resident, the budgeted overhead). The expected peak is what the process really holds (its
// VmHWM, within 1% for gpt2 and gpt2-medium in f32 and bf16): only pages that are written are
// resident, and a param chunk's block is written whole (copies move whole payloads) while an
// optimizer-state chunk is written up to its last tensor (the optimizer writes tensor by tensor;
// the padding tail is never touched), plus the measured overhead kExpectedHostOverheadBytes
// (the emulated accelerator and the chunk blocks are mapped from the OS, so freed memory leaves).
//
// Disk tier (MemoryPlanOptions::disk, scheduler/disk_tier.h). The optimizer state this rank owns
// lives in swap slots on disk; the host holds at most the tier's budget of it: the host side
// counts min(budget, all owned optimizer state) instead of every state chunk (pages written: whole
// blocks, since reads from disk fill whole payloads). The plan adds the disk bytes (one slot per
// owned state chunk, each rounded up to kDiskSlotAlignBytes), the tier's minimum host bytes
// (DiskTierMinHostBytes; a budget below it does not fit the host), how the budget splits into
// kept and streamed indices (SplitDiskTierBudget), and the disk traffic of one optimizer step:
// the update pass reads and writes the master, momentum and variance chunks of every streamed
// index; with gradient accumulation (k > 1) the restore pass after each of micro-batches 1..k-1
// reads every streamed master (and writes nothing: the master is only read). That is an upper
// bound: chunks the window still holds from the previous pass are hits. DiskStepSeconds turns it
// into the time the disk alone needs per step at a measured bandwidth.
//
// Frozen params on disk (MemoryPlanOptions::DiskTier::frozen_params; DiskTierOptions::
// frozen_params). Every frozen param chunk this rank holds (a LoRA/QLoRA base) gets a slot too
// (rounded up to kDiskSlotAlignBytes), and the host counts min(budget, all frozen param blocks)
// of them instead of all (the tier's hard invariant: frozen host payloads and host backing copies
// never exceed the budget; whole blocks, written by the reads). A budget of 0 plans the least
// one (DiskTierFrozenMinHostBytes: one param block), which disk_frozen_host_budget_bytes reports;
// a positive budget below it does not fit the host. Each frozen chunk is written once per run
// (not per step); when they do not all fit, a step reads each of them up to once per forward and
// once per backward of every micro-batch (an estimate, disk_frozen_read_bytes_per_step, counted
// in disk_read_bytes_per_step). With optimizer_state false the optimizer state is not on disk
// (counted whole on the host, as without the tier).
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_SCHEDULER_MEMORY_PLAN_H_
#define PATRICKSTAR_SCHEDULER_MEMORY_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chunk/operator_spec.h"
#include "memory/caching_allocator.h"
#include "memory/dtype.h"
#include "scheduler/activation_profile.h"
#include "scheduler/metronome.h"

namespace ps {

struct MemoryPlanOptions {
  // The model: its operators in layout order, the chunk size its layout uses, its profile.
  std::vector<OperatorSpec> ops;
  ActivationProfile profile;
  int64_t chunk_elems = 0;
  int64_t tensor_alignment_elems = 1;
  DType compute_dtype = DType::kF32;
  int world_size = 1;
  int rank = 0;

  // The accelerator budget of the run (> 0).
  int64_t accelerator_bytes = 0;
  // The run's scratch allocator options (their tracker and event backend are ignored).
  CachingAllocatorOptions scratch;
  // Bytes kept free for communication buffers (ChunkManagerOptions::comm_buffer_bytes).
  int64_t comm_buffer_bytes = 0;
  // Accelerator bytes the ZeRO collectives hold in the scratch allocator for the whole run: for a
  // communicator that needs device memory (nccl), CommCollectives::DeviceStagingBytes (the
  // reduce-scatter staging and the scalar word, scheduler/comm_collectives.h); 0 for host
  // communicators (local, mpi), whose staging is host memory. The replay allocates it before
  // anything else, as the run does, so the tide, the lower bound, the stranded bytes and the
  // peaks include it exactly as the ChunkManager will measure it (its tide counts the scratch
  // allocator's bytes; no extra reserve is needed).
  int64_t device_comm_staging_bytes = 0;
  // Extra slack beyond the stranded bytes the replay measures (>= 0).
  int64_t slack_margin_bytes = 0;
  // Room kept in the minimum (not reserved by the manager) for a tide above the profile's: this
  // fraction of the highest activation peak, in [0, 1).
  double slack_peak_fraction = 0;
  // Bytes the ADAM placement keeps free beside the param chunks and the state it places
  // (ChunkManagerOptions::adam_margin_bytes, >= 0).
  int64_t adam_margin_bytes = 0;
  // Micro-batches per optimizer step (>= 1); > 1 adds the owner's f32 gradient accumulator.
  int gradient_accumulation_steps = 1;
  // optimizer.overlap's rollback snapshot (docs/pipeline.md): its budget,
  // HybridAdamOptions::overlap_snapshot_bytes; 0 when the overlap is off (>= 0). The plan counts
  // min(budget, (12 + compute dtype width) bytes per element of the owned chunks' capacity): the
  // snapshot grows chunk by chunk up to the budget and never holds more than the owned chunks.
  int64_t overlap_snapshot_bytes = 0;

  // Host: what the OS can still give this process (0: not checked), the process's resident bytes
  // now, what the run will allocate beside the chunk pools (thread stacks, BLAS buffers, the data
  // loader), checkpoint/export buffers, the configured cap on the host pools (if any).
  int64_t host_available_bytes = 0;
  int64_t host_resident_bytes = 0;
  int64_t host_overhead_bytes = 0;
  int64_t host_workspace_bytes = 0;
  std::optional<int64_t> host_cap_bytes;
  // The emulated accelerator (cpu backend): its memory is host memory.
  bool accelerator_in_host_memory = false;

  // The disk tier (see the file comment); unset: no disk tier, and the plan is as without it.
  struct DiskTier {
    // DiskTierOptions::host_budget_bytes and read_ahead (scheduler/disk_tier.h).
    int64_t host_budget_bytes = 0;
    int64_t read_ahead = 2;
    // The swap directory is on a RAM-backed filesystem (tmpfs, ramfs: disk/disk_probe.h
    // IsRamBacked): its slots are host memory too, counted in the host peaks (host_swap_bytes).
    bool in_host_memory = false;
    // DiskTierOptions::optimizer_state, frozen_params, frozen_host_budget_bytes (0: the least)
    // and frozen_read_ahead (see the file comment).
    bool optimizer_state = true;
    bool frozen_params = false;
    int64_t frozen_host_budget_bytes = 0;
    int64_t frozen_read_ahead = 2;
  };
  std::optional<DiskTier> disk;
};

// One moment of the predicted iteration.
struct PlannedMoment {
  Stage stage = Stage::kForward;
  // The operator accessed (an index into MemoryPlanOptions::ops); -1 for ADAM moments.
  int64_t op = -1;
  int64_t working_set_bytes = 0;
  // Non-model bytes when the access is made, and their peak until the next moment.
  int64_t nonmodel_now_bytes = 0;
  int64_t nonmodel_peak_bytes = 0;
  // Segment bytes held, and stranded (free inside segments in use), at their highest.
  int64_t scratch_reserved_bytes = 0;
  int64_t stranded_bytes = 0;
};

struct MemoryPlan {
  // --- Layout.
  int64_t chunk_elems = 0;
  int64_t num_chunks = 0;  // per type, padding included
  int64_t num_data_chunks = 0;
  int64_t param_chunk_bytes = 0;  // one param chunk's block (compute dtype)
  int64_t state_chunk_bytes = 0;  // one master/momentum/variance chunk's block (f32)
  int64_t rank_model_data_bytes = 0;
  int64_t parameters = 0;

  // --- Accelerator.
  std::vector<PlannedMoment> moments;  // the steady iteration's
  int64_t activation_peak_bytes = 0;   // highest non-model peak, iteration and evaluation
  int64_t evaluation_peak_bytes = 0;   // the evaluation pass's
  int64_t largest_working_set_bytes = 0;
  int64_t lower_bound_bytes = 0;          // see the file comment
  std::string lower_bound_at;             // "h.3.mlp.c_fc (BWD)": the moment that sets it
  int64_t stranded_bytes = 0;             // most bytes the segments strand at once
  int64_t slack_bytes = 0;                // stranded + margin: ChunkManager's nonmodel slack
  int64_t tide_margin_bytes = 0;          // slack_peak_fraction x the activation peak
  int64_t min_accelerator_bytes = 0;      // lower bound + slack + tide margin + communication
  int64_t device_comm_staging_bytes = 0;  // inside the tide (see MemoryPlanOptions)
  double warmup_chunk_fraction = 0.2;     // for accelerator_bytes
  // Owned chunk indices whose optimizer state the ADAM placement keeps on the accelerator at
  // accelerator_bytes, and those state chunks' bytes (see the file comment).
  int64_t accelerator_state_indices = 0;
  int64_t accelerator_state_bytes = 0;
  int64_t predicted_accelerator_peak_bytes = 0;  // at accelerator_bytes
  bool fits_accelerator = false;

  // --- Host.
  int64_t host_model_data_bytes = 0;   // this rank's chunk blocks (and ZeRO's gathered ones)
  int64_t host_accumulator_bytes = 0;  // gradient accumulation's f32 accumulator (k > 1)
  int64_t host_overlap_snapshot_bytes = 0;  // optimizer.overlap's rollback snapshot
  int64_t host_accelerator_bytes = 0;  // the emulated accelerator's share
  int64_t host_swap_bytes = 0;         // the disk tier's slots when they are in RAM (tmpfs)
  int64_t host_peak_bytes = 0;         // the whole process at its peak: the safe bound
  int64_t host_needed_bytes = 0;       // host_peak - what is resident now: what the OS must give
  // What the process is expected to really hold at its peak (its VmHWM): the pages of model data
  // that are written (see the file comment) and the measured overhead instead of the budgeted
  // one. Not a bound: fits_host is decided on host_needed_bytes.
  int64_t host_model_data_touched_bytes = 0;
  int64_t host_expected_peak_bytes = 0;
  bool fits_host = true;

  // --- Disk tier (all zero without it; see the file comment).
  bool disk_tier = false;
  int64_t disk_bytes = 0;                 // the swap's slots, each rounded up to 4096
  int64_t disk_host_bytes = 0;            // host bytes of optimizer state: min(budget, all of it)
  int64_t disk_min_host_bytes = 0;        // the least budget the tier accepts
  int64_t disk_kept_indices = 0;          // owned indices whose state stays in host RAM
  int64_t disk_streamed_indices = 0;      // owned indices whose state streams through the window
  int64_t disk_read_ahead = 0;            // indices read ahead, as the budget allows
  int64_t disk_read_bytes_per_step = 0;   // per optimizer step (upper bound)
  int64_t disk_write_bytes_per_step = 0;  // per optimizer step
  // Frozen params on disk (see the file comment; all zero without frozen_params).
  int64_t disk_frozen_chunks = 0;               // frozen param chunks with a slot
  int64_t disk_frozen_bytes = 0;                // their slots (inside disk_bytes)
  int64_t disk_frozen_host_budget_bytes = 0;    // the budget planned with (0 asked: the least)
  int64_t disk_frozen_host_bytes = 0;           // host bytes of them: min(budget, all)
  int64_t disk_frozen_min_host_bytes = 0;       // the least budget the tier accepts
  int64_t disk_frozen_read_bytes_per_step = 0;  // estimate (inside disk_read_bytes_per_step)

  bool fits() const { return fits_accelerator && fits_host; }
  // A few lines for people.
  std::string Summary() const;
};

// Host page size the expected peak rounds written ranges to.
inline constexpr int64_t kHostPageBytes = 4096;
// What a training process holds beside the model data, the emulated accelerator and what was
// resident before the run (libraries' pages faulted in while running, the heap, thread stacks and
// arenas, BLAS buffers), measured (capacity_benchmark, VmHWM against smaps): 20 MiB for gpt2
// f32 and bf16 at their plan minimum. The expected peak counts min(host_overhead_bytes, this);
// the safe bound counts host_overhead_bytes.
inline constexpr int64_t kExpectedHostOverheadBytes = 24 << 20;

// The alignment of a swap slot (direct I/O).
inline constexpr int64_t kDiskSlotAlignBytes = 4096;

// Seconds a disk needs for `read_bytes` at `read_bytes_per_s` and `write_bytes` at
// `write_bytes_per_s`, one after the other (a disk serving one direction at a time). 0 unless both
// rates are positive.
double DiskSeconds(double read_bytes, double write_bytes, double read_bytes_per_s,
                   double write_bytes_per_s);

// The time the disk alone needs per optimizer step: DiskSeconds of the plan's disk reads and
// writes per step. 0 without the disk tier.
double DiskStepSeconds(const MemoryPlan& plan, double read_bytes_per_s, double write_bytes_per_s);

// The scratch allocator's options for an accelerator budget: segments of a 64th of the budget as a
// power of two, 64 KiB..2 MiB (PyTorch's 2 MiB from a 128 MiB budget up), so that the free tails
// the segments strand stay small beside the budget.
CachingAllocatorOptions ScratchOptionsForBudget(int64_t accelerator_bytes);

// The plan (see the file comment). InvalidArgument for bad options (naming the field), an
// operator the chunk size cannot hold, or a profile that is inconsistent (a free of an unknown
// buffer, an access of an unknown operator, a release without its access).
absl::StatusOr<MemoryPlan> PlanMemory(const MemoryPlanOptions& options);

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_MEMORY_PLAN_H_
