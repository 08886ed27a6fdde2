// ChunkManager: the tide-aware chunk runtime — the one façade the model and the optimizer use to
// get at model data. It decides where every chunk payload lives (accelerator or host), moves
// chunks whole, and keeps model data plus the non-model "tide" under the accelerator's budget
// while moving as few bytes as possible.
//
// Using it:
//   BeginIteration();
//   for each operator, forward:   Access(op, kForward);  ...compute...  Release(op, kForward);
//   for each operator, backward:  Access(op, kBackward); ...compute...  Release(op, kBackward);
//   placement = BeginAdam();
//   for each chunk index i:       AccessChunks(i, types, device(i), kReadWrite); ...update...;
//                                 ReleaseChunks(i, types);
//   EndIteration();
// Accesses outside BeginIteration/EndIteration (initialization, checkpoints, evaluation) are
// untracked: they follow the warm-up's limits and leave the learned schedule alone.
//
// Moments and the warm-up. Every Access, BeginAdam and AccessChunks inside an iteration that
// succeeds is one moment of the Metronome (scheduler/metronome.h); a call that fails is no moment.
// The first iteration is the warm-up: at every moment the manager reads the accelerator's and the
// host's MemoryTracker (SnapshotAndResetPeaks) into a TideTrace (scheduler/tide_trace.h),
// together with the chunks each moment accesses. At the end of the warm-up the trace is finished,
// the eviction policy gets its AccessSchedule and the planner its trace. A warm-up that ended
// without a single moment (its first access failed) learned nothing: the next iteration is the
// warm-up again.
//
// The parts, each a small class with its own header and tests:
//  - ResidencyPlanner (scheduler/planner.h), pure arithmetic over the trace: the limits of every
//    moment (how much may be resident, the hard limit an access must fit), the prefetch
//    decision, the ADAM placement, and whether a chunk is used again in the iteration.
//  - ResidencyEngine (scheduler/residency.h): the copy streams, the resident set, loads, clean
//    and dirty evictions, write-behind, eviction under memory pressure.
//  - EvictionPolicy (scheduler/eviction_policy.h): which resident chunks leave (OPT by default).
//  - ZeroGroups (scheduler/zero_groups.h): ZeRO's gather / free / reduce-scatter of chunk groups
//    for world size > 1.
//  - ChunkManagerCounters (scheduler/chunk_counters.h): what moved, per pass.
// The façade keeps the protocol: the metronome and the trace, which operators and optimizer
// chunks are accessed, and the order in which the parts are asked.
//
// An access. Access(op, stage) at moment m takes the operator's param chunk (for a ZeRO group not
// gathered yet: the whole group) as its working set; the planner says whether it fits the hard
// limit of m (else ResourceExhausted naming the operator, the bytes, the budget and the tide, and
// what to change) and how many bytes must be evicted to stay under max(target(m), working set);
// the policy picks the victims among the resident chunks that may move (not COMPUTE, not pinned,
// not the access's own); the engine evicts and starts the loads. What Access then waits for
// depends on where the caller computes (see "Stream order" below): with a compute stream, nothing
// on the host; without one, the host waits for the copies (the time counts as stall) and the
// caller may use the views from the host at once. Then the chunks of m+1 are prefetched as
// the planner allows, evicting only clean chunks the policy would evict at m+1 (a prefetch whose
// victim is dirty is left to the demand access). After the warm-up, a BWD Release that ends a
// param chunk's last accelerator use of the iteration starts its write-back at once (write-behind),
// unless the ADAM placement keeps that index on the accelerator. Nothing is ever over-committed:
// the pools' hard cap is never what stops the scheduler.
//
// ADAM. BeginAdam() returns the placement the planner computed when the warm-up ended (during the
// warm-up, or off the trace, every index runs on the host); AccessChunks(i, types, device, mode)
// makes chunk i of each type resident on that device (for the host: moved back, a clean drop or a
// write-back). Placed optimizer state is loaded once, at the first optimizer step after the
// warm-up, and then never moves.
//
// The optimizer inside backward (optimizer.overlap, docs/pipeline.md). SetGradientsFinalHook
// registers a callback the BWD Release that makes a trainable param chunk's gradients final calls
// (after its write-behind started; under ZeRO after the group's reduce-scatter, for the chunk
// this rank owns). From it the optimizer may AccessChunksInBackward / ReleaseChunks that chunk:
// untracked accesses (no moment, no trace entry) after a host wait for the compute stream; with
// the disk tier their read-ahead runs in backward's (descending) order.
//
// ZeRO (world size N > 1; scheduler/zero_groups.h): an Access whose group is not gathered makes
// the group resident and all-gathers it; a FWD Release that leaves the group HOLD_AFTER_FWD
// (before the backward started, or untracked) frees its remote payloads; a BWD Release that
// finishes the group's backward makes it resident, reduce-scatters it and frees it (a frozen
// group, chunk/chunk_layout.h, is only freed: it has no gradients). BeginAdam and EndIteration
// first reduce every gathered trainable group touched by backward and free every gathered group,
// so the optimizer sees only owned chunks.
//
// Frozen chunks (a LoRA base): backward reads them like forward does, they stay clean, their
// host copy is kept (also without clean eviction), so every eviction is a drop and none is ever
// written back or written behind (ChunkManagerCounters::frozen_writeback_bytes counts it were one
// written on the accelerator by an optimizer-style access); the optimizer never accesses them.
// ReleaseRemoteChunks, called on every rank, drops gathered copies before parameters are rewritten
// outside the optimizer.
//
// Pressure. The tide is what the accelerator's MemoryTracker counts. The caching allocator holds
// activations in segments whose free tails it cannot always reuse, so the device can run out of
// memory while the tracker says there is room (nonmodel_slack_bytes is the planned margin). Every
// access and prefetch also reads how much the segments strand right now and keeps the part beyond
// the slack free as well (the planner's unplanned bytes), evicting in order at the access. When
// it happens anyway, the accelerator's bottom resource asks its reclaimers before failing; with
// evict_under_pressure the manager is one of them and the engine evicts every chunk that may move.
// Allocations made by the manager itself (inside its own calls) never trigger this.
//
// Stream order (ChunkManagerOptions::compute_stream). The caller's kernels run asynchronously on
// its compute stream; the host runs ahead. Both directions are ordered by events:
//  - Into a kernel: Access returns without waiting for its loads or zero-fills; it makes the
//    compute stream wait (Stream::WaitEvent) for them (a write-behind still writing the chunk
//    back included), so every kernel enqueued after Access sees the loaded bytes. Views may only
//    be used from the compute stream (or a stream that waits for it) until a host wait; the
//    counters' stream_ordered_waits counts the accesses whose copies were still in flight.
//  - Out of a kernel: every Release records the compute stream's position. Nothing that frees,
//    moves, overwrites or reduces a chunk a released kernel may still use happens before the
//    compute stream got there: a dirty write-back (and a write-behind) waits for it on the store
//    stream; a clean drop, an eviction under pressure, a ZeRO remote payload freed, a
//    reduce-scatter, BeginAdam (the optimizer reads the gradients) and the destructor wait for
//    it on the host, because the host acts on the payload right after (returns its block to the
//    pool, calls the collective, runs the optimizer).
//  - The host waits for copies where the host itself touches the payload: AccessChunks (the
//    optimizer runs on the calling thread, also for accelerator chunks, optimizer/hybrid_adam.h),
//    the ZeRO collectives (called from the host), evictions.
// Without a compute stream the caller computes on the host: Access waits for the copies as above.
//
// The disk tier (ChunkManagerOptions::disk, scheduler/disk_tier.h): one level below the host,
// this rank's optimizer-state chunks (master, momentum, variance) are backed by a ChunkSwap and
// kept under a host budget by the same rule as the accelerator's chunks (OPT over the known
// order). AccessChunks of such a chunk first loads it from disk (for the accelerator too: the
// existing path then copies it over); a ReleaseChunks of a changed one starts its write at once;
// reads of the next indices start ahead. Each AccessChunks is still one moment. Without the
// option nothing differs: same moments, trace, counters and bytes.
//
// Known limits: before dropping a clean chunk the host waits for the compute stream up to the last
// Release (one event for all chunks, not one per chunk); a stream-ordered drop would need the
// chunk pools to free blocks in stream order. ZeRO collectives are issued from the host after a
// host wait for the compute stream (stream-ordered collectives need a communicator that enqueues
// on the compute stream).
//
// Thread safety: thread-compatible. One thread (the training loop) calls the manager; the copy
// streams only move bytes the manager told them to.
#ifndef PATRICKSTAR_SCHEDULER_CHUNK_MANAGER_H_
#define PATRICKSTAR_SCHEDULER_CHUNK_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/memory_resource.h"
#include "scheduler/chunk_counters.h"
#include "scheduler/chunk_events.h"
#include "scheduler/chunk_keys.h"
#include "scheduler/collective_hooks.h"
#include "scheduler/disk_tier.h"
#include "scheduler/eviction_policy.h"
#include "scheduler/metronome.h"
#include "scheduler/planner.h"
#include "scheduler/residency.h"
#include "scheduler/tide_trace.h"
#include "scheduler/zero_groups.h"

namespace ps {

// What an access may do to the chunk's bytes. A kRead access leaves a clean chunk clean (its
// eviction costs no copy); kReadWrite makes it dirty.
enum class AccessMode : uint8_t { kRead = 0, kReadWrite = 1 };

struct ChunkManagerOptions {
  // Eviction policy: "opt" (default), "lru" or "static" (scheduler/eviction_policy.h).
  std::string policy = "opt";
  // For "static": the param chunk indices that stay on the accelerator.
  std::vector<int64_t> static_param_chunks = {};
  // Accelerator bytes the scheduler plans with; the accelerator pools' cap when unset. Must be
  // positive and at most that cap.
  std::optional<int64_t> device_budget_bytes = std::nullopt;
  // Share of the budget chunks may take while the tide is unknown (warm-up, off the trace,
  // untracked accesses). In (0, 1]. PatrickStar's warmup_gpu_chunk_mem_ratio is 0.1.
  double warmup_chunk_fraction = 0.2;
  // Bytes kept free for communication buffers (0 for world size 1).
  int64_t comm_buffer_bytes = 0;
  // Bytes kept free beside the measured tide for what the tracker cannot see: the caching
  // allocator's rounding and fragmentation, short-lived buffers between samples.
  int64_t nonmodel_slack_bytes = 0;
  // Load the next moment's chunks on the copy stream while the current operator computes.
  bool prefetch = true;
  // Keep host copies of loaded chunks so that unchanged chunks are evicted without a copy.
  bool clean_eviction = true;
  // Start the write-back of a chunk as soon as its last accelerator use of the iteration ends, when
  // it goes back to the host anyway (see the file comment). Needs clean_eviction.
  bool write_behind = true;
  // ADAM placement: bytes kept free beside the param chunks and the optimizer state placed on the
  // accelerator.
  int64_t adam_margin_bytes = 0;
  // The stream the caller's accelerator kernels run on, if any (not owned; must outlive the
  // manager). Accesses become stream-ordered: see "Stream order" in the file comment.
  Stream* compute_stream = nullptr;
  // Times stalls, compute waits, collectives and chunk events (base/clock.h); clock() hands it
  // to callers that time around the manager (TrainStep), so all their times share one clock.
  MonotonicClock clock = kSteadyClock;
  // Evict chunks when the accelerator runs out of memory anyway (see "Pressure" in the file
  // comment).
  bool evict_under_pressure = true;
  // Told about every chunk move and access (scheduler/chunk_events.h); not owned, must outlive
  // the manager. Null: nothing is reported and nothing extra is enqueued on the copy streams.
  ChunkEventListener* listener = nullptr;
  // ZeRO collectives (see the file comment); required for a layout of world size > 1, where its
  // rank and world size must be the store's. Not owned; must outlive the manager. Ignored (but
  // still checked to be a world of one) for world size 1.
  CollectiveHooks* collectives = nullptr;
  // The disk tier (scheduler/disk_tier.h): optimizer-state chunks this rank owns spill to
  // `disk->swap` under `disk->host_budget_bytes` of host memory. Unset: no disk tier.
  std::optional<DiskTierOptions> disk = std::nullopt;
};

class ChunkManager {
 public:
  // None of the pointers is owned; all must outlive the manager. `accelerator` must be the memory
  // of `backend`'s device and `host` host memory; both must have a chunk pool for every chunk
  // type's size of `store` (DeviceMemory::chunk_pool_for: with 16-bit params, a pool of 16-bit
  // blocks beside the f32 one, or else the param chunks take f32-sized blocks). Chunks' payloads
  // keep pointing into those pools after the manager is gone. InvalidArgument (naming the field)
  // for null arguments or invalid options, and for a layout of world size > 1 without matching
  // ChunkManagerOptions::collectives.
  static absl::StatusOr<std::unique_ptr<ChunkManager>> Create(ChunkStore* store, Backend* backend,
                                                              DeviceMemory* accelerator,
                                                              DeviceMemory* host,
                                                              ChunkManagerOptions options = {});

  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;
  // Waits for the copies in flight and for the compute stream to reach the last Release.
  ~ChunkManager();

  // --- Iterations -----------------------------------------------------------------------------

  // Starts an iteration (the first is the warm-up). FailedPrecondition inside one.
  [[nodiscard]] absl::Status BeginIteration();
  // Ends it. FailedPrecondition outside an iteration or while an operator or chunk is still
  // accessed. Ending the warm-up finishes the trace and hands the schedule to the policy and the
  // planner; a warm-up without moments ends without learning (the next iteration is the warm-up).
  [[nodiscard]] absl::Status EndIteration();

  // --- The model ------------------------------------------------------------------------------

  // Makes operator `op`'s param chunk resident on the accelerator (allocating it if released,
  // loading it, evicting others as the policy chooses) and sets its tensors to COMPUTE (FREE
  // tensors are zero-filled). With a compute stream, that stream waits for the copies and the
  // host returns at once; without one, the host waits for them (see "Stream order"). `stage` is
  // kForward (read-only: the chunk stays clean) or kBackward (gradients overwrite parameters: the
  // chunk becomes dirty; for a frozen operator, chunk/chunk_layout.h, backward only reads: the
  // chunk stays clean and is never written back). InvalidArgument for an unknown operator or stage
  // kAdam; FailedPrecondition if the operator is already accessed or has no tensors;
  // ResourceExhausted if its working set cannot fit (see the file comment); errors of the pools and
  // streams otherwise. A failed Access is no moment.
  [[nodiscard]] absl::Status Access(OperatorId op, Stage stage);

  // Sets the operator's tensors COMPUTE -> HOLD_AFTER_FWD (kForward) or HOLD_AFTER_BWD
  // (kBackward: the slots hold gradients). A frozen operator's tensors go COMPUTE -> HOLD after
  // kBackward: its slots still hold the parameters (as after an optimizer step), so the next
  // forward accesses them with no optimizer step over them. No write-behind for frozen chunks.
  // FailedPrecondition without a matching Access; InvalidArgument for kAdam.
  [[nodiscard]] absl::Status Release(OperatorId op, Stage stage);

  // --- The optimizer --------------------------------------------------------------------------

  // The start of the optimizer step (a moment of stage ADAM). Waits (on the host) for the compute
  // stream up to the last Release, so the optimizer never reads a gradient a queued backward
  // kernel has yet to write. Returns the placement (see the file comment). FailedPrecondition
  // while an operator is accessed; the compute stream's asynchronous error, if any.
  [[nodiscard]] absl::StatusOr<AdamPlacement> BeginAdam();

  // Makes chunk `chunk_index` of each of `types` resident on `device` (the accelerator of this
  // manager, or the host) and sets all of its tensors to COMPUTE. kReadWrite marks them dirty.
  // Returns once the copies are complete (the host waits, with or without a compute stream).
  // One moment of stage ADAM. InvalidArgument for a bad index, no types, a repeated type or
  // another device; FailedPrecondition if one of them is already accessed or cannot hold a
  // payload (another rank's optimizer state); ResourceExhausted as for Access. A failed call is
  // no moment.
  [[nodiscard]] absl::Status AccessChunks(int64_t chunk_index, absl::Span<const ChunkType> types,
                                          Device device, AccessMode mode);
  // The same with a mode per type (`modes[k]` for `types[k]`): the optimizer's restore pass writes
  // the param chunk but only reads the master, whose disk copy then stays valid. Still one
  // moment. InvalidArgument also when the spans' sizes differ. With the disk tier: the swap's
  // errors naming the chunk ("loading momentum#12 from disk: ..."), and ResourceExhausted when the
  // tier's host budget is held by chunks in use; the call is then no moment and the manager
  // stays usable.
  [[nodiscard]] absl::Status AccessChunks(int64_t chunk_index, absl::Span<const ChunkType> types,
                                          Device device, absl::Span<const AccessMode> modes);
  // COMPUTE -> HOLD for every tensor of those chunks. FailedPrecondition without AccessChunks.
  // With the disk tier, starts the write-behind of changed streamed optimizer-state chunks (an
  // error starting it is returned, naming the chunk; the chunks are released anyway).
  [[nodiscard]] absl::Status ReleaseChunks(int64_t chunk_index, absl::Span<const ChunkType> types);

  // --- The optimizer inside backward (optimizer.overlap, docs/pipeline.md) --------------------

  // Called, when set, at the end of the BWD Release (inside an iteration) that makes trainable
  // param chunk `chunk_index`'s gradients final: world size 1, every tensor of the chunk is
  // HOLD_AFTER_BWD and every operator in it was released in BWD at least as often as it was
  // accessed in FWD before the backward (ZeroGroups' rule, so a tied or recomputed operator does
  // not end it early); under ZeRO, after the group's reduce-scatter and free, for the chunk this
  // rank owns. At most once per chunk and iteration. The hook may call AccessChunksInBackward
  // and ReleaseChunks for that chunk; its error is Release's. Null: no hook.
  void SetGradientsFinalHook(std::function<absl::Status(int64_t chunk_index)> hook) {
    gradients_final_hook_ = std::move(hook);
  }
  // AccessChunks for the hook: the host first waits for the compute stream (backward's kernels
  // wrote the gradients), and the access is untracked — no moment, no trace entry — so the
  // learned schedule is the same whether a step runs the optimizer inside backward or not.
  [[nodiscard]] absl::Status AccessChunksInBackward(int64_t chunk_index,
                                                    absl::Span<const ChunkType> types,
                                                    Device device,
                                                    absl::Span<const AccessMode> modes);
  // Whether the learned ADAM placement keeps chunk `chunk_index`'s optimizer state on the
  // accelerator (BeginAdam returns it on the trace; all-host otherwise).
  bool AdamPlacedOnAccelerator(int64_t chunk_index) const {
    return adam_placement_.OnAccelerator(chunk_index);
  }
  // Whether the accelerator's memory is host RAM the host may read and write (the cpu backend's
  // emulated accelerator).
  bool accelerator_in_host_memory() const { return accelerator_in_host_memory_; }

  // --- ZeRO ---------------------------------------------------------------------------------

  // Frees the remote payloads of every gathered group (no communication; any gradients in them
  // that were not reduce-scattered yet are dropped). Call it on every rank before rewriting
  // parameters outside the optimizer step (initialization, checkpoint load), so that the next
  // access gathers the new values. No-op for world size 1. FailedPrecondition while an operator
  // or chunk is accessed.
  [[nodiscard]] absl::Status ReleaseRemoteChunks();
  // Whether group `group`'s remote chunks hold the owners' bytes (always false for world size 1).
  // REQUIRES: 0 <= group < the layout's num_groups().
  bool group_gathered(int64_t group) const {
    return groups_ != nullptr && groups_->gathered(group);
  }
  int world_size() const { return store_->layout().world_size(); }
  int rank() const { return store_->rank(); }

  // --- Observers ------------------------------------------------------------------------------

  // The store whose chunks this manager schedules, and the accelerator it schedules them onto.
  const ChunkStore& store() const { return *store_; }
  Device accelerator_device() const { return accel_->device(); }
  const Metronome& metronome() const { return metronome_; }
  const TideTrace& tide() const { return trace_; }
  bool is_warmup() const { return metronome_.is_warmup(); }
  bool in_iteration() const { return in_iteration_; }
  const EvictionPolicy& policy() const { return *policy_; }
  const ResidencyPlanner& planner() const { return *planner_; }
  int64_t budget_bytes() const { return planner_->options().budget_bytes; }
  // Bytes kept free beside the tide: comm_buffer_bytes + nonmodel_slack_bytes.
  int64_t reserved_bytes() const { return planner_->options().reserved_bytes; }
  // What one resident chunk of `type` costs on the accelerator (a block of its size's chunk
  // pool: a 16-bit param chunk costs half an f32 one).
  int64_t device_chunk_cost_bytes(ChunkType type = ChunkType::kParam) const {
    return engine_->chunk_cost_bytes(type);
  }
  // Accelerator bytes of resident chunks (including loads in flight).
  int64_t resident_bytes() const { return engine_->resident_bytes(); }
  // Dense keys of the chunks resident on the accelerator, ascending.
  std::vector<int64_t> ResidentChunkKeys() const { return engine_->ResidentKeys(); }
  // target(m) (scheduler/planner.h) for `moment` of the learned trace.
  // REQUIRES: the warm-up ended and 0 <= moment < tide().total_moments().
  int64_t ChunkableBytes(int64_t moment) const { return planner_->ChunkableBytes(moment); }
  // The limit resident_bytes() is kept under at the current moment: target(moment) or, when the
  // current access's working set is larger, that working set.
  int64_t current_limit_bytes() const { return current_limit_bytes_; }

  ChunkManagerCounters counters() const { return counters_; }
  // The disk tier; null without ChunkManagerOptions::disk.
  const DiskTier* disk_tier() const { return disk_.get(); }
  // ChunkManagerOptions::clock: the clock counters()' times (stall_ns, compute_wait_ns, comm_ns)
  // and the events' timestamps are read from.
  MonotonicClock clock() const { return options_.clock; }
  // Counters of each completed iteration (index 0: the warm-up).
  const std::vector<ChunkManagerCounters>& iteration_counters() const {
    return iteration_counters_;
  }

  // Dense chunk keys: type * num_chunks + index (the keys the policy and the schedule use).
  int64_t ChunkKey(ChunkId id) const { return keys_.Key(id); }
  ChunkId ChunkIdOfKey(int64_t key) const { return keys_.IdOf(key); }

 private:
  ChunkManager(ChunkStore* store, DeviceMemory* accelerator, DeviceMemory* host,
               ChunkManagerOptions options);

  // Registered with the accelerator's bottom resource: evicts under memory pressure.
  class PressureReclaimer final : public Reclaimer {
   public:
    explicit PressureReclaimer(ChunkManager* manager) : manager_(manager) {}
    int64_t ReleaseCached() override { return manager_->ReclaimUnderPressure(); }

   private:
    ChunkManager* const manager_;
  };
  // Marks the manager busy for the scope of a public call, so that an allocation made inside it
  // does not re-enter through the reclaimer.
  class BusyScope {
   public:
    explicit BusyScope(ChunkManager* m) : m_(m) { ++m_->busy_; }
    ~BusyScope() { --m_->busy_; }

   private:
    ChunkManager* const m_;
  };
  int64_t ReclaimUnderPressure();

  Chunk& ChunkOfKey(int64_t key) { return store_->chunk(keys_.IdOf(key)); }
  // The pass `stage` belongs to, for the counters (see ChunkManagerCounters::by_stage).
  Stage PassOf(Stage stage) const {
    return stage == Stage::kForward && backward_started_ ? Stage::kBackward : stage;
  }
  // The moment the next successful tick would start; -1 outside an iteration (untracked).
  int64_t NextMoment() const { return in_iteration_ ? metronome_.moment() + 1 : -1; }
  // The current moment for moves and events; -1 outside an iteration.
  int64_t CurrentMoment() const { return in_iteration_ ? metronome_.moment() : -1; }
  // Free bytes stranded inside the accelerator's activation segments beyond nonmodel_slack_bytes:
  // memory the tide does not count, the slack does not cover and no chunk can use. Accesses and
  // prefetches keep that much more room (the plan replays one allocator history; a run whose
  // segments were released and re-taken under pressure can strand more).
  int64_t UnplannedStrandedBytes() const;
  // Closes the current moment's tide interval (recording it during the warm-up) and starts
  // moment `moment` (NextMoment()) of `stage`. No-op for an untracked access (moment -1).
  absl::Status Tick(Stage stage, int64_t moment);
  absl::Status SampleTide();
  // Makes `keys` resident on the accelerator at `moment`: checks the working set, evicts, starts
  // the loads (nobody waits for them yet: see AwaitAccess). `stage` is the pass the traffic counts
  // under.
  absl::Status MakeResident(const std::vector<int64_t>& keys, Stage stage, int64_t moment,
                            const std::string& what);
  // The end of an access of `keys` (`zero_fill`: zero-fills were enqueued on the load stream):
  // with a compute stream, that stream waits for their copies; without one, the host does.
  absl::Status AwaitAccess(const std::vector<int64_t>& keys, bool zero_fill);
  // The host waits for the copies of `keys` and (`zero_fill`) the load stream's zero-fills.
  absl::Status WaitForAccessOnHost(const std::vector<int64_t>& keys, bool zero_fill);
  std::string WorkingSetError(const std::string& what, const AccessPlan& plan,
                              int64_t moment) const;
  // Prefetches the chunks of the moment after `moment`, as the planner allows.
  absl::Status Prefetch(int64_t moment);
  // Starts the write-back of `key` if its last accelerator use of the iteration just ended and it
  // goes back to the host anyway (see the file comment).
  absl::Status WriteBehind(int64_t key);
  // ZeRO: makes `group` resident and reduce-scatters it; reduces (if touched by backward) and
  // frees every gathered group.
  absl::Status ReduceGroup(int64_t group, Stage stage, int64_t moment);
  absl::Status FinishGroups(Stage stage);
  absl::Status AccessChunksImpl(int64_t chunk_index, absl::Span<const ChunkType> types,
                                Device device, absl::Span<const AccessMode> modes, bool tracked);
  // World size 1: whether param chunk `chunk_index`'s gradients are final (see
  // SetGradientsFinalHook).
  bool GradientsFinalNow(int64_t chunk_index) const;
  // Calls the hook for `chunk_index` once per iteration.
  absl::Status CallGradientsFinalHook(int64_t chunk_index, bool final);

  ChunkStore* const store_;
  DeviceMemory* const accel_;
  DeviceMemory* const host_;
  const ChunkManagerOptions options_;
  const ChunkKeys keys_;
  int busy_ = 0;
  std::unique_ptr<PressureReclaimer> reclaimer_;

  ChunkManagerCounters counters_;
  ChunkManagerCounters iteration_start_counters_;
  std::vector<ChunkManagerCounters> iteration_counters_;

  Metronome metronome_;
  TideTrace trace_;
  std::optional<ResidencyPlanner> planner_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::unique_ptr<ResidencyEngine> engine_;
  // World size > 1 only.
  std::unique_ptr<ZeroGroups> groups_;
  // With ChunkManagerOptions::disk only; destroyed first (it waits for its I/O).
  std::unique_ptr<DiskTier> disk_;

  bool in_iteration_ = false;
  // Whether this iteration had a BWD access yet.
  bool backward_started_ = false;
  AdamPlacement adam_placement_;
  // Operators (with the stage they were accessed in) and optimizer chunks between access and
  // release.
  absl::flat_hash_map<OperatorId, Stage> active_ops_;
  absl::flat_hash_set<int64_t> active_chunks_;
  int64_t current_limit_bytes_ = 0;

  // SetGradientsFinalHook; world size 1: the operators of each param chunk, each operator's FWD
  // accesses before the backward and BWD releases in this iteration; by chunk: hook called.
  std::function<absl::Status(int64_t)> gradients_final_hook_;
  bool accelerator_in_host_memory_ = false;
  // Chunk indices accessed by AccessChunksInBackward and not released yet (their disk tier
  // read-ahead runs in backward's descending order).
  absl::flat_hash_set<int64_t> backward_accessed_;
  // Whether an iteration made an AccessChunksInBackward (then the optimizer step's moment count
  // varies with its verdict: EndIteration does not warn).
  bool gradients_final_hook_used_ = false;
  std::vector<std::vector<OperatorId>> chunk_ops_;
  std::vector<int> forward_uses_;
  std::vector<int> backward_releases_;
  std::vector<uint8_t> gradients_final_called_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_CHUNK_MANAGER_H_
