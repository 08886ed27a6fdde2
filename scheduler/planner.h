// ResidencyPlanner: the ChunkManager's decisions that are arithmetic over plain data — how many
// bytes of chunks may be resident on the accelerator at each moment, whether an access fits and
// how much it must evict, whether a prefetch may run and what it may evict, which chunk indices
// the optimizer step updates on the accelerator, and whether a chunk is used on the accelerator
// again in the iteration.
//
// Inputs are numbers (PlannerOptions), the learned TideTrace (scheduler/tide_trace.h: the
// non-model peak of every moment and the access schedule, in dense chunk keys,
// scheduler/chunk_keys.h) and, per question, the bytes the caller sees now. The planner holds no
// chunk, stream or memory, so it answers the same for a TideTrace recorded in a warm-up and for
// one predicted before anything is allocated (a pre-flight memory plan).
//
// Limits at moment m. Chunks on the accelerator are counted at what they cost there: one block of
// the accelerator's chunk pool for their size (ChunkCostBytes: a 16-bit param chunk costs half
// an f32 optimizer-state chunk of the same capacity). With the trace known and m on it:
//   target(m) = ChunkableBytes(m) = budget - max(peak[m], peak[next(m)]) - reserved
//     (evicting down to target(m) at moment m is the proactive eviction: whatever stays resident
//     already leaves room for the next moment's tide)
//   hard(m)   = budget - max(peak[m], non-model bytes now) - reserved
// and target is at most hard. Off the trace (warm-up, untracked accesses, moments beyond the
// warm-up's):
//   target = warmup_chunk_fraction * budget, hard = budget - non-model bytes now - reserved.
// An access whose working set (its chunks plus those that cannot move) exceeds target may still
// run if it fits under hard; beyond hard it cannot run.
//
// Prefetch after moment m (on the trace, not across iterations, not into ADAM): the chunks of
// moment m+1 may be loaded as long as the resident bytes stay under target(m). When that needs
// evictions, only as many bytes as the demand access at m+1 would evict itself (its limit is
// max(ChunkableBytes(m+1), its own chunks)), chosen as at m+1 — so prefetching changes when bytes
// move, never how many.
//
// ADAM placement: optimizer state goes on the accelerator only where it can stay for the whole
// iteration: the room left at every moment of the trace (min over m of ChunkableBytes(m)) once
// every param chunk the iteration uses there is resident, minus adam_margin_bytes, in units of
// three chunks (master, momentum, variance). Placing state that merely fits while activations are
// gone would have it evicted (dirty, 12 bytes/param back) when the next forward's tide rises and
// loaded again (12 bytes/param) at the next step: 24 bytes/param of traffic per iteration against
// 4 for updating on the host. The indices whose param chunk is used last in the iteration (still
// resident when the step starts) come first.
//
// Thread safety: thread-compatible; const methods are pure.
#ifndef PATRICKSTAR_SCHEDULER_PLANNER_H_
#define PATRICKSTAR_SCHEDULER_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/chunk_keys.h"
#include "scheduler/tide_trace.h"

namespace ps {

struct PlannerOptions {
  // Accelerator bytes the plan may use (> 0).
  int64_t budget_bytes = 0;
  // Bytes kept free beside the tide: communication buffers and allocator slack (>= 0).
  int64_t reserved_bytes = 0;
  // Share of the budget chunks may take off the trace, in (0, 1].
  double warmup_chunk_fraction = 0.2;
  // Accelerator bytes one resident optimizer-state chunk (master, momentum, variance: f32) costs,
  // and a param chunk unless param_chunk_cost_bytes is set (> 0).
  int64_t chunk_cost_bytes = 0;
  // Accelerator bytes one resident param chunk costs (its compute dtype's block); 0: as
  // chunk_cost_bytes (>= 0).
  int64_t param_chunk_cost_bytes = 0;
  // ADAM placement: bytes kept free beside the param chunks and the placed optimizer state (>= 0).
  int64_t adam_margin_bytes = 0;
  // Chunks per type, for the dense keys of the trace (>= 0).
  int64_t num_chunks = 0;
};

// The limits of one moment (see the file comment).
struct MomentLimits {
  int64_t target_bytes = 0;
  int64_t hard_bytes = 0;
  // The non-model bytes the limits leave room for: max(peak[m], peak[next(m)]) on the trace, the
  // current non-model bytes off it. For messages.
  int64_t tide_bytes = 0;
  // Whether the limits come from the trace.
  bool known = false;
};

// What making an access's chunks resident takes.
struct AccessPlan {
  MomentLimits limits;
  // The access's own chunks plus the resident chunks that cannot move (not among its own).
  int64_t own_bytes = 0;
  int64_t working_set_bytes = 0;
  // working_set_bytes <= limits.hard_bytes.
  bool fits = false;
  // What the resident bytes are kept under at this moment: max(target, working set).
  int64_t limit_bytes = 0;
  // Resident bytes to evict before loading the missing chunks (0 if none).
  int64_t evict_bytes = 0;
};

// What a prefetch may do.
struct PrefetchPlan {
  // False: leave the chunks to the demand access.
  bool allowed = false;
  // Bytes to evict first (chosen as the access at the prefetched moment would choose them); 0 if
  // the chunks fit as they are.
  int64_t evict_bytes = 0;
};

// Which chunk indices the optimizer step updates on the accelerator.
struct AdamPlacement {
  // Ascending.
  std::vector<int64_t> accelerator_chunks;
  // Accelerator bytes found for optimizer state that stays resident (see the file comment).
  int64_t available_bytes = 0;

  bool OnAccelerator(int64_t chunk_index) const;
};

class ResidencyPlanner {
 public:
  // InvalidArgument naming the PlannerOptions field for a value outside its range.
  static absl::StatusOr<ResidencyPlanner> Create(const PlannerOptions& options);

  const PlannerOptions& options() const { return options_; }
  ChunkKeys keys() const { return ChunkKeys(options_.num_chunks); }
  // What one resident chunk of `type` (of dense key `key`) costs on the accelerator.
  int64_t ChunkCostBytes(ChunkType type) const;
  int64_t KeyCostBytes(int64_t key) const { return ChunkCostBytes(keys().IdOf(key).type); }

  // The learned trace, from now on. REQUIRES: trace->finished(); it outlives the planner (or the
  // next SetTrace).
  void SetTrace(const TideTrace* trace);
  // Null until SetTrace.
  const TideTrace* trace() const { return trace_; }
  // Whether `moment` is a moment of the learned trace.
  bool OnTrace(int64_t moment) const;

  // target(m) on the trace. REQUIRES: OnTrace(moment).
  int64_t ChunkableBytes(int64_t moment) const;
  // The limits at `moment` (-1: untracked) when `nonmodel_now_bytes` of non-model data are in use
  // on the accelerator and `unplanned_bytes` (>= 0) more are held beyond the tide and the reserve
  // (free space stranded in the activation allocator's segments beyond the planned slack, which no
  // chunk can use): the target shrinks by them, so the access evicts for them in order rather
  // than the pressure reclaimer in an emergency (the hard limit, whether the access can run at
  // all, does not: the pressure reclaimer stays the backstop).
  MomentLimits LimitsAt(int64_t moment, int64_t nonmodel_now_bytes,
                        int64_t unplanned_bytes = 0) const;
  // An access at `moment` of chunks costing `own_bytes`, `missing_bytes` of them not resident,
  // while other resident chunks costing `stuck_bytes` cannot move and `resident_bytes` are
  // resident (all in accelerator cost, ChunkCostBytes).
  AccessPlan PlanAccess(int64_t moment, int64_t nonmodel_now_bytes, int64_t resident_bytes,
                        int64_t own_bytes, int64_t stuck_bytes, int64_t missing_bytes,
                        int64_t unplanned_bytes = 0) const;

  // The moment whose chunks a prefetch after `moment` would load: moment + 1 when both are on
  // the trace and it is not an ADAM moment; -1 otherwise.
  int64_t PrefetchMoment(int64_t moment) const;
  // A prefetch after `moment` of chunks costing `missing_bytes` (of the PrefetchMoment's accesses,
  // whose chunks cost `next_access_bytes` in all). REQUIRES: PrefetchMoment(moment) >= 0.
  PrefetchPlan PlanPrefetch(int64_t moment, int64_t nonmodel_now_bytes, int64_t resident_bytes,
                            int64_t missing_bytes, int64_t next_access_bytes,
                            int64_t unplanned_bytes = 0) const;

  // The ADAM placement over the chunk indices whose optimizer state this rank holds
  // (`state_indices`, any order). REQUIRES: a trace.
  AdamPlacement PlanAdam(absl::Span<const int64_t> state_indices) const;

  // Whether chunk `key` is accessed on the accelerator after `moment` in the same iteration.
  // REQUIRES: OnTrace(moment).
  bool UsedLaterInIteration(int64_t key, int64_t moment) const;

 private:
  explicit ResidencyPlanner(const PlannerOptions& options) : options_(options) {}

  PlannerOptions options_;
  const TideTrace* trace_ = nullptr;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_PLANNER_H_
