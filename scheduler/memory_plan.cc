#include "scheduler/memory_plan.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "scheduler/disk_tier.h"

namespace ps {
namespace {

// An upstream that hands out addresses and never memory: the CachingAllocator never touches what
// it manages, so replaying a profile through it costs nothing but its bookkeeping.
class VirtualUpstream final : public MemoryResource {
 public:
  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    if (bytes <= 0) return absl::InvalidArgumentError("VirtualUpstream: bytes <= 0");
    const uintptr_t address = next_;
    next_ += static_cast<uintptr_t>(AlignUp(bytes, 4096));
    return reinterpret_cast<void*>(address);
  }
  absl::Status Deallocate(void*, int64_t) override { return absl::OkStatus(); }
  Device device() const override { return Device::Accelerator(0); }
  std::string name() const override { return "memory_plan(virtual)"; }

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
};

// Replays events through a CachingAllocator, one moment per access.
class Replayer {
 public:
  explicit Replayer(CachingAllocator* allocator) : allocator_(allocator) {}

  struct Moment {
    Stage stage = Stage::kForward;
    int64_t op = -1;
    int64_t now = 0;
    int64_t peak = 0;
    int64_t reserved = 0;
    int64_t stranded = 0;
  };

  // Replays `events`; moments go to `out` (nullptr: dropped). `where` names the pass in errors.
  absl::Status Run(const std::vector<ActivationEvent>& events, int64_t num_ops, const char* where,
                   std::vector<Moment>* out) {
    std::vector<Moment> moments;
    for (size_t i = 0; i < events.size(); ++i) {
      const ActivationEvent& e = events[i];
      switch (e.kind) {
        case ActivationEvent::Kind::kAlloc: {
          if (e.bytes <= 0 || live_.contains(e.buffer)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "MemoryPlanOptions.profile.", where, "[", i, "]: allocation of buffer ", e.buffer,
                " (", e.bytes, " bytes) is empty or the buffer is live"));
          }
          ASSIGN_OR_RETURN(void* p, allocator_->Allocate(e.bytes));
          live_[e.buffer] = {p, e.bytes};
          break;
        }
        case ActivationEvent::Kind::kFree: {
          auto it = live_.find(e.buffer);
          if (it == live_.end()) {
            return absl::InvalidArgumentError(absl::StrCat("MemoryPlanOptions.profile.", where, "[",
                                                           i, "]: free of buffer ", e.buffer,
                                                           ", which is not live"));
          }
          RETURN_IF_ERROR(allocator_->Deallocate(it->second.first, it->second.second));
          live_.erase(it);
          break;
        }
        case ActivationEvent::Kind::kAccess: {
          if (e.op < 0 || e.op >= num_ops) {
            return absl::InvalidArgumentError(absl::StrCat("MemoryPlanOptions.profile.", where, "[",
                                                           i, "]: access of operator ", e.op,
                                                           " (the model has ", num_ops, ")"));
          }
          const CachingAllocatorStats s = allocator_->stats();
          moments.push_back({.stage = e.stage,
                             .op = e.op,
                             .now = s.in_use_bytes,
                             .peak = s.in_use_bytes,
                             .reserved = s.reserved_bytes,
                             .stranded = s.cached_bytes - s.free_segment_bytes});
          break;
        }
        case ActivationEvent::Kind::kRelease:
          break;
      }
      if (e.kind == ActivationEvent::Kind::kAlloc) {
        const CachingAllocatorStats s = allocator_->stats();
        max_stranded_ = std::max(max_stranded_, s.cached_bytes - s.free_segment_bytes);
        if (!moments.empty()) {
          Moment& m = moments.back();
          m.peak = std::max(m.peak, s.in_use_bytes);
          m.reserved = std::max(m.reserved, s.reserved_bytes);
          m.stranded = std::max(m.stranded, s.cached_bytes - s.free_segment_bytes);
        }
      }
    }
    if (!live_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("MemoryPlanOptions.profile.", where, ": ",
                                                     live_.size(),
                                                     " buffers are still live at its end"));
    }
    if (out != nullptr) *out = std::move(moments);
    return absl::OkStatus();
  }

  int64_t max_stranded() const { return max_stranded_; }

 private:
  CachingAllocator* const allocator_;
  absl::flat_hash_map<int64_t, std::pair<void*, int64_t>> live_;
  int64_t max_stranded_ = 0;
};

absl::Status CheckOptions(const MemoryPlanOptions& o) {
  if (o.ops.empty()) return absl::InvalidArgumentError("MemoryPlanOptions.ops is empty");
  const std::pair<const char*, int64_t> positive[] = {
      {"chunk_elems", o.chunk_elems},
      {"tensor_alignment_elems", o.tensor_alignment_elems},
      {"world_size", o.world_size},
      {"accelerator_bytes", o.accelerator_bytes},
      {"gradient_accumulation_steps", o.gradient_accumulation_steps}};
  for (const auto& [field, value] : positive) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MemoryPlanOptions.", field, " must be positive, got ", value));
    }
  }
  const std::pair<const char*, int64_t> non_negative[] = {
      {"comm_buffer_bytes", o.comm_buffer_bytes},
      {"device_comm_staging_bytes", o.device_comm_staging_bytes},
      {"slack_margin_bytes", o.slack_margin_bytes},
      {"overlap_snapshot_bytes", o.overlap_snapshot_bytes},
      {"host_available_bytes", o.host_available_bytes},
      {"host_resident_bytes", o.host_resident_bytes},
      {"host_overhead_bytes", o.host_overhead_bytes},
      {"host_workspace_bytes", o.host_workspace_bytes},
      {"adam_margin_bytes", o.adam_margin_bytes}};
  for (const auto& [field, value] : non_negative) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MemoryPlanOptions.", field, " must be >= 0, got ", value));
    }
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("MemoryPlanOptions.rank ", o.rank, " is outside [0, ", o.world_size, ")"));
  }
  if (!(o.slack_peak_fraction >= 0 && o.slack_peak_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MemoryPlanOptions.slack_peak_fraction must be in [0, 1), got ", o.slack_peak_fraction));
  }
  if (o.host_cap_bytes.has_value() && *o.host_cap_bytes <= 0) {
    return absl::InvalidArgumentError("MemoryPlanOptions.host_cap_bytes must be positive");
  }
  if (o.disk.has_value() && (o.disk->host_budget_bytes < 0 || o.disk->read_ahead < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("MemoryPlanOptions.disk: host_budget_bytes (",
                                                   o.disk->host_budget_bytes, ") and read_ahead (",
                                                   o.disk->read_ahead, ") must be >= 0"));
  }
  if (o.disk.has_value() &&
      (o.disk->frozen_host_budget_bytes < 0 || o.disk->frozen_read_ahead < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MemoryPlanOptions.disk: frozen_host_budget_bytes (", o.disk->frozen_host_budget_bytes,
        ") and frozen_read_ahead (", o.disk->frozen_read_ahead, ") must be >= 0"));
  }
  return absl::OkStatus();
}

// --- The plan's steps (PlanMemory reads as their outline) -----------------------------------

// The chunk layout of the model, and the plan's layout numbers.
absl::StatusOr<ChunkLayout> LayOut(const MemoryPlanOptions& o, MemoryPlan& plan) {
  ChunkLayoutOptions layout_options;
  layout_options.capacity_elems = o.chunk_elems;
  layout_options.world_size = o.world_size;
  layout_options.tensor_alignment_elems = o.tensor_alignment_elems;
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build(layout_options, o.ops));
  plan.chunk_elems = o.chunk_elems;
  plan.num_chunks = layout.num_chunks();
  plan.num_data_chunks = layout.num_data_chunks();
  plan.param_chunk_bytes = o.chunk_elems * SizeOf(o.compute_dtype);
  plan.state_chunk_bytes = o.chunk_elems * static_cast<int64_t>(sizeof(float));
  for (const OperatorSpec& op : o.ops) plan.parameters += OperatorNumElems(op);
  return layout;
}

// The profile replayed in the run's order: one evaluation, the warm-up iteration, a steady one.
struct Replay {
  std::vector<Replayer::Moment> evaluation, warmup, steady;
  int64_t max_stranded_bytes = 0;
};

absl::StatusOr<Replay> ReplayProfile(const MemoryPlanOptions& o, MemoryPlan& plan) {
  VirtualUpstream upstream;
  ASSIGN_OR_RETURN(std::unique_ptr<CachingAllocator> allocator,
                   CachingAllocator::Create(&upstream, [&] {
                     CachingAllocatorOptions scratch = o.scratch;
                     scratch.tracker = nullptr;
                     scratch.event_backend = nullptr;
                     return scratch;
                   }()));
  // The collectives' device staging lives from before the first pass to the end of the run.
  plan.device_comm_staging_bytes = o.device_comm_staging_bytes;
  if (o.device_comm_staging_bytes > 0) {
    ASSIGN_OR_RETURN(void* staging, allocator->Allocate(o.device_comm_staging_bytes));
    (void)staging;  // never freed: the virtual upstream backs nothing
  }
  Replayer replayer(allocator.get());
  const int64_t num_ops = static_cast<int64_t>(o.ops.size());
  Replay r;
  RETURN_IF_ERROR(replayer.Run(o.profile.evaluation, num_ops, "evaluation", &r.evaluation));
  RETURN_IF_ERROR(replayer.Run(o.profile.iteration, num_ops, "iteration", &r.warmup));
  RETURN_IF_ERROR(replayer.Run(o.profile.iteration, num_ops, "iteration", &r.steady));
  if (r.steady.empty()) {
    return absl::InvalidArgumentError("MemoryPlanOptions.profile.iteration accesses no operator");
  }
  r.max_stranded_bytes = replayer.max_stranded();
  return r;
}

// Working set per operator: its ZeRO group's param chunks (0 for an operator without tensors).
absl::StatusOr<std::vector<int64_t>> WorkingSets(const MemoryPlanOptions& o,
                                                 const ChunkLayout& layout, MemoryPlan& plan) {
  std::vector<int64_t> working_set(o.ops.size(), 0);
  for (size_t i = 0; i < o.ops.size(); ++i) {
    ASSIGN_OR_RETURN(OperatorId id, layout.FindOperator(o.ops[i].name));
    if (!layout.op(id).placed()) continue;
    working_set[i] = o.world_size * plan.param_chunk_bytes;
    plan.largest_working_set_bytes = std::max(plan.largest_working_set_bytes, working_set[i]);
  }
  return working_set;
}

// The accelerator's floor: the lower bound and where it is set, the activation peaks, the slack,
// the tide margin, the minimum budget and whether the budget fits, the steady moments and the
// warm-up share. Returns the bytes the manager keeps reserved (slack and communication buffers).
int64_t PlanAcceleratorFloor(const MemoryPlanOptions& o, const Replay& replay,
                             const std::vector<int64_t>& working_set, MemoryPlan& plan) {
  plan.stranded_bytes = replay.max_stranded_bytes;
  const auto consider = [&](const std::vector<Replayer::Moment>& moments, bool evaluation_pass) {
    for (const Replayer::Moment& m : moments) {
      const int64_t need = working_set[m.op] + std::max(m.peak, m.now);
      if (need > plan.lower_bound_bytes) {
        plan.lower_bound_bytes = need;
        plan.lower_bound_at = absl::StrCat(
            o.ops[m.op].name, " (", evaluation_pass ? "evaluation" : StageName(m.stage), ")");
      }
      plan.activation_peak_bytes = std::max(plan.activation_peak_bytes, m.peak);
      if (evaluation_pass) {
        plan.evaluation_peak_bytes = std::max(plan.evaluation_peak_bytes, m.peak);
      }
    }
  };
  consider(replay.evaluation, true);
  consider(replay.warmup, false);
  consider(replay.steady, false);
  // The manager reserves the slack; the tide margin is room the plan keeps (not reserved) for a
  // tide that runs above the profile's.
  plan.slack_bytes = plan.stranded_bytes + o.slack_margin_bytes;
  plan.tide_margin_bytes =
      static_cast<int64_t>(o.slack_peak_fraction * static_cast<double>(plan.activation_peak_bytes));
  const int64_t reserved = plan.slack_bytes + o.comm_buffer_bytes;
  plan.min_accelerator_bytes = plan.lower_bound_bytes + reserved + plan.tide_margin_bytes;
  plan.fits_accelerator = o.accelerator_bytes >= plan.min_accelerator_bytes;
  for (const Replayer::Moment& m : replay.steady) {
    plan.moments.push_back({.stage = m.stage,
                            .op = m.op,
                            .working_set_bytes = working_set[m.op],
                            .nonmodel_now_bytes = m.now,
                            .nonmodel_peak_bytes = m.peak,
                            .scratch_reserved_bytes = m.reserved,
                            .stranded_bytes = m.stranded});
  }
  // The warm-up share: what the budget leaves beside the highest peak and the reserve.
  const double budget = static_cast<double>(o.accelerator_bytes);
  plan.warmup_chunk_fraction =
      std::clamp(static_cast<double>(o.accelerator_bytes - plan.activation_peak_bytes - reserved -
                                     plan.tide_margin_bytes) /
                     budget,
                 0.01, 1.0);
  return reserved;
}

// What this rank holds of the model: its param chunks (ZeRO: the ones it keeps), the chunk indices
// whose optimizer state it owns, and ZeRO's gathered remote param chunks (two groups at once).
struct RankShare {
  int64_t param_bytes = 0;
  int64_t owned_data_chunks = 0;
  int64_t gathered_bytes = 0;
  // Frozen param chunks this rank holds (a LoRA base).
  int64_t frozen_param_chunks = 0;
};

RankShare RankShareOf(const MemoryPlanOptions& o, const ChunkLayout& layout,
                      const MemoryPlan& plan) {
  RankShare share;
  for (int64_t c = 0; c < layout.num_chunks(); ++c) {
    if (layout.HoldsPayload(ChunkType::kParam, c, o.rank)) {
      share.param_bytes += plan.param_chunk_bytes;
      if (!layout.chunk_trainable(c)) ++share.frozen_param_chunks;
    }
    if (layout.HoldsPayload(ChunkType::kMaster, c, o.rank)) ++share.owned_data_chunks;
  }
  share.gathered_bytes = o.world_size > 1 ? 2 * (o.world_size - 1) * plan.param_chunk_bytes : 0;
  return share;
}

// The optimizer state the ADAM placement keeps on the accelerator and the predicted accelerator
// peak at the budget.
absl::Status PlanAcceleratorPeak(const MemoryPlanOptions& o, const ChunkLayout& layout,
                                 const std::vector<Replayer::Moment>& steady,
                                 const std::vector<int64_t>& working_set, int64_t reserved,
                                 const RankShare& share, MemoryPlan& plan) {
  // The ADAM placement (ResidencyPlanner::PlanAdam over the trace the warm-up records): the room
  // left at every moment once every param chunk the iteration uses is resident, in units of an
  // index's three optimizer-state chunks, holds that many of the owned indices' state for the
  // whole run. It is small beside a full model's chunks (rarely any fits), but a LoRA run's
  // trainable state is a few adapter chunks, which a budget that holds the frozen base places.
  int64_t highest_peak = 0;
  for (const Replayer::Moment& m : steady) highest_peak = std::max(highest_peak, m.peak);
  absl::flat_hash_set<int64_t> used_chunks;
  for (const Replayer::Moment& m : steady) {
    ASSIGN_OR_RETURN(OperatorId id, layout.FindOperator(o.ops[m.op].name));
    const OperatorInfo& info = layout.op(id);
    if (!info.placed()) continue;
    for (int64_t c : layout.ChunksInGroup(layout.group_of(info.chunk_index))) {
      used_chunks.insert(c);
    }
  }
  const int64_t min_chunkable = std::max<int64_t>(0, o.accelerator_bytes - highest_peak - reserved);
  const int64_t adam_room = min_chunkable -
                            static_cast<int64_t>(used_chunks.size()) * plan.param_chunk_bytes -
                            o.adam_margin_bytes;
  plan.accelerator_state_indices =
      adam_room > 0 ? std::min(share.owned_data_chunks, adam_room / (3 * plan.state_chunk_bytes))
                    : 0;
  plan.accelerator_state_bytes = 3 * plan.accelerator_state_indices * plan.state_chunk_bytes;
  // At every moment: the resident chunks the planner allows (max(target, working set), at most
  // every chunk this rank can usefully hold) plus the activations then.
  const int64_t usable_chunk_bytes =
      share.param_bytes + share.gathered_bytes + plan.accelerator_state_bytes;
  for (size_t i = 0; i < steady.size(); ++i) {
    const Replayer::Moment& m = steady[i];
    const Replayer::Moment& next = steady[(i + 1) % steady.size()];
    const int64_t tide = std::max(m.peak, next.peak);
    const int64_t chunkable = std::max<int64_t>(0, o.accelerator_bytes - tide - reserved);
    const int64_t chunks = std::min(usable_chunk_bytes, std::max(working_set[m.op], chunkable));
    plan.predicted_accelerator_peak_bytes =
        std::max(plan.predicted_accelerator_peak_bytes, chunks + m.peak);
  }
  plan.predicted_accelerator_peak_bytes =
      std::min(plan.predicted_accelerator_peak_bytes, o.accelerator_bytes);
  return absl::OkStatus();
}

// Bytes of the owned optimizer-state chunks' pages that are written: each up to its last tensor
// (only the optimizer writes them, tensor by tensor; the tail's pages are never faulted in), for
// one of the three state types.
int64_t StateTouchedBytes(const MemoryPlanOptions& o, const ChunkLayout& layout,
                          const MemoryPlan& plan) {
  int64_t touched = 0;
  for (int64_t c = 0; c < layout.num_chunks(); ++c) {
    if (!layout.HoldsPayload(ChunkType::kMaster, c, o.rank)) continue;
    touched += std::min(
        plan.state_chunk_bytes,
        AlignUp(layout.end_elems(c) * static_cast<int64_t>(sizeof(float)), kHostPageBytes));
  }
  return touched;
}

// The disk tier: the swap's slots, the optimizer state host RAM holds (at most the budget), how
// the budget splits, the traffic of one optimizer step; host model data then counts the budget
// instead of the whole state. Returns the state bytes written in host RAM (whole blocks: reads
// from disk fill whole payloads, and the pool's blocks serve every chunk in turn).
int64_t PlanDiskTier(const MemoryPlanOptions& o, const RankShare& share, MemoryPlan& plan) {
  const int64_t all_state_bytes = 3 * share.owned_data_chunks * plan.state_chunk_bytes;
  plan.disk_tier = true;
  plan.disk_bytes =
      3 * share.owned_data_chunks * AlignUp(plan.state_chunk_bytes, kDiskSlotAlignBytes);
  plan.disk_host_bytes = std::min(o.disk->host_budget_bytes, all_state_bytes);
  plan.disk_min_host_bytes = DiskTierMinHostBytes(plan.state_chunk_bytes, share.owned_data_chunks);
  const DiskTierSplit split =
      SplitDiskTierBudget(std::max(o.disk->host_budget_bytes, plan.disk_min_host_bytes),
                          plan.state_chunk_bytes, share.owned_data_chunks, o.disk->read_ahead);
  plan.disk_kept_indices = split.kept;
  plan.disk_streamed_indices = share.owned_data_chunks - split.kept;
  plan.disk_read_ahead = split.read_ahead;
  const int64_t streamed_state_bytes = plan.disk_streamed_indices * plan.state_chunk_bytes;
  plan.disk_write_bytes_per_step = 3 * streamed_state_bytes;
  plan.disk_read_bytes_per_step =
      3 * streamed_state_bytes + (o.gradient_accumulation_steps - 1) * streamed_state_bytes;
  plan.host_model_data_bytes += plan.disk_host_bytes - all_state_bytes;
  // A RAM-backed swap directory: every slot is host memory too (written whole).
  if (o.disk->in_host_memory) plan.host_swap_bytes = plan.disk_bytes;
  return plan.disk_host_bytes;
}

// Frozen params on disk: their slots, the host bytes they may hold (min(budget, all)), the reads
// of a step; host model data then counts those instead of every frozen param block. Returns the
// frozen param bytes the host does not hold.
int64_t PlanFrozenOnDisk(const MemoryPlanOptions& o, const RankShare& share, MemoryPlan& plan) {
  const int64_t all_frozen_bytes = share.frozen_param_chunks * plan.param_chunk_bytes;
  plan.disk_tier = true;
  plan.disk_frozen_chunks = share.frozen_param_chunks;
  plan.disk_frozen_bytes =
      share.frozen_param_chunks * AlignUp(plan.param_chunk_bytes, kDiskSlotAlignBytes);
  plan.disk_bytes += plan.disk_frozen_bytes;
  plan.disk_frozen_min_host_bytes =
      DiskTierFrozenMinHostBytes(plan.param_chunk_bytes, share.frozen_param_chunks);
  plan.disk_frozen_host_budget_bytes = o.disk->frozen_host_budget_bytes > 0
                                           ? o.disk->frozen_host_budget_bytes
                                           : plan.disk_frozen_min_host_bytes;
  plan.disk_frozen_host_bytes = std::min(plan.disk_frozen_host_budget_bytes, all_frozen_bytes);
  if (plan.disk_frozen_host_bytes < all_frozen_bytes) {
    plan.disk_frozen_read_bytes_per_step =
        2 * static_cast<int64_t>(o.gradient_accumulation_steps) * all_frozen_bytes;
  }
  plan.disk_read_bytes_per_step += plan.disk_frozen_read_bytes_per_step;
  if (o.disk->in_host_memory) plan.host_swap_bytes += plan.disk_frozen_bytes;
  const int64_t off_host = all_frozen_bytes - plan.disk_frozen_host_bytes;
  plan.host_model_data_bytes -= off_host;
  return off_host;
}

// The emulated accelerator's memory as host memory: its chunk blocks and segments at their peak.
int64_t EmulatedAcceleratorHostBytes(const MemoryPlanOptions& o,
                                     const std::vector<Replayer::Moment>& steady,
                                     const MemoryPlan& plan) {
  int64_t held = 0;
  for (const Replayer::Moment& m : steady) held = std::max(held, m.reserved);
  return std::min<int64_t>(o.accelerator_bytes, plan.predicted_accelerator_peak_bytes -
                                                    plan.activation_peak_bytes +
                                                    std::max(held, plan.activation_peak_bytes));
}

// The host side (see the file comment): model data, the accumulator, the emulated accelerator,
// the disk tier; the safe bound, the expected peak, and whether it fits.
void PlanHost(const MemoryPlanOptions& o, const ChunkLayout& layout,
              const std::vector<Replayer::Moment>& steady, const RankShare& share,
              MemoryPlan& plan) {
  plan.rank_model_data_bytes =
      share.param_bytes + 3 * share.owned_data_chunks * plan.state_chunk_bytes;
  plan.host_model_data_bytes = plan.rank_model_data_bytes + share.gathered_bytes;
  // Pages written: a param chunk's whole block (copies between devices move whole payloads), the
  // state chunks' up to their last tensor.
  int64_t host_state_touched_bytes = 3 * StateTouchedBytes(o, layout, plan);
  if (o.disk.has_value() && o.disk->optimizer_state) {
    host_state_touched_bytes = PlanDiskTier(o, share, plan);
  }
  int64_t frozen_off_host_bytes = 0;
  if (o.disk.has_value() && o.disk->frozen_params) {
    frozen_off_host_bytes = PlanFrozenOnDisk(o, share, plan);
  }
  if (o.gradient_accumulation_steps > 1) {
    plan.host_accumulator_bytes = share.owned_data_chunks * plan.state_chunk_bytes;
  }
  // The snapshot holds at most the owned chunks' tensors: old master, moments (f32) and gradient.
  plan.host_overlap_snapshot_bytes =
      std::min<int64_t>(o.overlap_snapshot_bytes,
                        share.owned_data_chunks * o.chunk_elems *
                            (3 * static_cast<int64_t>(sizeof(float)) + SizeOf(o.compute_dtype)));
  if (o.accelerator_in_host_memory) {
    plan.host_accelerator_bytes = EmulatedAcceleratorHostBytes(o, steady, plan);
  }
  plan.host_peak_bytes = o.host_resident_bytes + plan.host_model_data_bytes +
                         plan.host_accumulator_bytes + plan.host_overlap_snapshot_bytes +
                         plan.host_accelerator_bytes + plan.host_swap_bytes +
                         o.host_overhead_bytes + o.host_workspace_bytes;
  plan.host_needed_bytes = plan.host_peak_bytes - o.host_resident_bytes;
  plan.host_model_data_touched_bytes =
      share.param_bytes - frozen_off_host_bytes + host_state_touched_bytes + share.gathered_bytes;
  plan.host_expected_peak_bytes =
      o.host_resident_bytes + plan.host_model_data_touched_bytes + plan.host_accumulator_bytes +
      plan.host_overlap_snapshot_bytes + plan.host_accelerator_bytes + plan.host_swap_bytes +
      std::min(o.host_overhead_bytes, kExpectedHostOverheadBytes) + o.host_workspace_bytes;
  plan.fits_host = true;
  if (o.host_available_bytes > 0 && plan.host_needed_bytes > o.host_available_bytes) {
    plan.fits_host = false;
  }
  if (o.host_cap_bytes.has_value() &&
      plan.host_model_data_bytes + plan.host_accumulator_bytes > *o.host_cap_bytes) {
    plan.fits_host = false;
  }
  if (plan.disk_tier && o.disk->host_budget_bytes < plan.disk_min_host_bytes) {
    plan.fits_host = false;
  }
  if (plan.disk_tier && o.disk->frozen_params && o.disk->frozen_host_budget_bytes > 0 &&
      o.disk->frozen_host_budget_bytes < plan.disk_frozen_min_host_bytes) {
    plan.fits_host = false;
  }
}

}  // namespace

CachingAllocatorOptions ScratchOptionsForBudget(int64_t accelerator_bytes) {
  int64_t segment = 64 * kKiB;
  while (segment < 2 * kMiB && segment * 2 * 64 <= accelerator_bytes) segment *= 2;
  CachingAllocatorOptions o;
  o.small_request_max_bytes = segment / 2;
  o.small_segment_bytes = segment;
  o.large_segment_round_bytes = segment;
  return o;
}

absl::StatusOr<MemoryPlan> PlanMemory(const MemoryPlanOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  MemoryPlan plan;
  ASSIGN_OR_RETURN(const ChunkLayout layout, LayOut(o, plan));
  ASSIGN_OR_RETURN(const Replay replay, ReplayProfile(o, plan));
  ASSIGN_OR_RETURN(const std::vector<int64_t> working_set, WorkingSets(o, layout, plan));
  const int64_t reserved = PlanAcceleratorFloor(o, replay, working_set, plan);
  const RankShare share = RankShareOf(o, layout, plan);
  RETURN_IF_ERROR(
      PlanAcceleratorPeak(o, layout, replay.steady, working_set, reserved, share, plan));
  PlanHost(o, layout, replay.steady, share, plan);
  return plan;
}

double DiskSeconds(double read_bytes, double write_bytes, double read_bytes_per_s,
                   double write_bytes_per_s) {
  if (!(read_bytes_per_s > 0) || !(write_bytes_per_s > 0)) return 0;
  return read_bytes / read_bytes_per_s + write_bytes / write_bytes_per_s;
}

double DiskStepSeconds(const MemoryPlan& plan, double read_bytes_per_s, double write_bytes_per_s) {
  if (!plan.disk_tier) return 0;
  return DiskSeconds(static_cast<double>(plan.disk_read_bytes_per_step),
                     static_cast<double>(plan.disk_write_bytes_per_step), read_bytes_per_s,
                     write_bytes_per_s);
}

std::string MemoryPlan::Summary() const {
  std::string s = absl::StrCat("parameters ", parameters, ", chunks of ", chunk_elems,
                               " elements: ", num_chunks, " per type (", num_data_chunks,
                               " with data); param chunk ", FormatBytes(param_chunk_bytes),
                               ", state chunk ", FormatBytes(state_chunk_bytes), "\n");
  absl::StrAppend(
      &s, "accelerator: lower bound ", FormatBytes(lower_bound_bytes), " at ", lower_bound_at,
      " (working set up to ", FormatBytes(largest_working_set_bytes), ", activations peak ",
      FormatBytes(activation_peak_bytes), ", evaluation ", FormatBytes(evaluation_peak_bytes),
      device_comm_staging_bytes > 0
          ? absl::StrCat(", collectives' device staging ", FormatBytes(device_comm_staging_bytes),
                         " included")
          : std::string(),
      "); slack ", FormatBytes(slack_bytes), " (", FormatBytes(stranded_bytes),
      " stranded in segments); tide margin ", FormatBytes(tide_margin_bytes), "; minimum ",
      FormatBytes(min_accelerator_bytes), "; predicted peak ",
      FormatBytes(predicted_accelerator_peak_bytes),
      accelerator_state_indices > 0
          ? absl::StrCat(" (optimizer state of ", accelerator_state_indices,
                         " chunk indices kept there, ", FormatBytes(accelerator_state_bytes), ")")
          : std::string(),
      "; warm-up chunk share ", absl::StrFormat("%.3f", warmup_chunk_fraction), "\n");
  absl::StrAppend(&s, "host: model data ", FormatBytes(host_model_data_bytes), " (this rank ",
                  FormatBytes(rank_model_data_bytes), ")");
  if (host_overlap_snapshot_bytes > 0) {
    absl::StrAppend(&s, ", overlap snapshot ", FormatBytes(host_overlap_snapshot_bytes));
  }
  if (host_accumulator_bytes > 0) {
    absl::StrAppend(&s, ", gradient accumulator ", FormatBytes(host_accumulator_bytes));
  }
  if (host_accelerator_bytes > 0) {
    absl::StrAppend(&s, ", emulated accelerator ", FormatBytes(host_accelerator_bytes));
  }
  if (host_swap_bytes > 0) {
    absl::StrAppend(&s, ", the disk tier's swap files in RAM (tmpfs) ",
                    FormatBytes(host_swap_bytes));
  }
  absl::StrAppend(&s, "; predicted peak ", FormatBytes(host_peak_bytes), " (",
                  FormatBytes(host_needed_bytes), " more than now), expected ",
                  FormatBytes(host_expected_peak_bytes), " (model data pages written ",
                  FormatBytes(host_model_data_touched_bytes), ")");
  if (disk_tier) {
    absl::StrAppend(
        &s, "\ndisk: ", FormatBytes(disk_bytes), " of swap slots",
        host_swap_bytes > 0 ? " on a RAM-backed filesystem (counted as host memory, not disk)" : "",
        "; optimizer state in ", "host RAM ", FormatBytes(disk_host_bytes), " (minimum ",
        FormatBytes(disk_min_host_bytes), "), ", disk_kept_indices, " indices kept, ",
        disk_streamed_indices, " streamed, read-ahead ", disk_read_ahead, "; per step up to ",
        FormatBytes(disk_read_bytes_per_step), " read, ", FormatBytes(disk_write_bytes_per_step),
        " written");
    if (disk_frozen_chunks > 0) {
      absl::StrAppend(&s, "; frozen params: ", disk_frozen_chunks, " chunks (",
                      FormatBytes(disk_frozen_bytes), ") in host RAM ",
                      FormatBytes(disk_frozen_host_bytes), " (budget ",
                      FormatBytes(disk_frozen_host_budget_bytes), ", minimum ",
                      FormatBytes(disk_frozen_min_host_bytes), "), written once, per step up to ",
                      FormatBytes(disk_frozen_read_bytes_per_step), " read");
    }
  }
  return s;
}

}  // namespace ps
