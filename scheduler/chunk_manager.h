// ChunkManager: the tide-aware chunk runtime — the one façade the model and the optimizer use to
// get at model data. It decides where every chunk payload lives (accelerator or host), moves
// chunks whole, and makes sure that model data plus the non-model "tide" never exceed the
// accelerator, while moving as few bytes as possible.
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
// untracked: they follow the warm-up rules below and leave the learned schedule alone.
//
// Moments and the warm-up. Every Access, BeginAdam and AccessChunks inside an iteration is one
// moment of the Metronome (scheduler/metronome.h). The first iteration is the warm-up: at every
// moment the manager reads the accelerator's and the host's MemoryTracker
// (SnapshotAndResetPeaks) into a TideTrace (scheduler/tide_trace.h), together with the chunks each
// moment accesses. At the end of the warm-up the trace is finished and the eviction policy gets
// its AccessSchedule.
//
// How much may be resident. Chunks on the accelerator are counted at what they cost there (one
// block of the accelerator's chunk pool each; the pool has one block size, so with f16/bf16
// compute a param chunk occupies a block sized for the f32 chunks — per-dtype pools would fix
// that in memory/). At moment m:
//  - after the warm-up, on the trace: target(m) = TideTrace::ChunkableBytes(m) = budget -
//    max(peak[m], peak[m+1]) - reserved, where reserved = comm_buffer_bytes +
//    nonmodel_slack_bytes. Evicting down to target(m) at moment m is the *proactive* eviction:
//    whatever stays resident already leaves room for the next moment's tide.
//  - during the warm-up (nothing known yet), off the trace, or untracked: target =
//    warmup_chunk_fraction * budget, a conservative share that leaves the rest to activations.
//  An access whose working set (its chunks plus the chunks that cannot move: in COMPUTE or
//  pinned) exceeds target(m) may still run if the working set fits the hard limit: budget -
//  peak[m] - reserved after the warm-up, budget - current non-model bytes - reserved otherwise.
//  Beyond the hard limit the access fails with ResourceExhausted naming the operator, the bytes it
//  needs, the device budget and the tide, and what to change. Nothing is ever over-committed: the
//  pools' hard cap is never the mechanism that stops the scheduler.
//
// Eviction. Candidates are resident chunks not in COMPUTE, not pinned and not needed by the
// access; the EvictionPolicy (OPT by default) chooses. Clean eviction: a chunk loaded from the host
// keeps its host buffer as a backing copy (chunk/chunk.h), so a chunk not written since it was
// loaded (parameters during forward) is evicted by dropping the accelerator copy, with no copy.
// A dirty chunk (gradients written in backward, optimizer state updated, new data) is written back
// into its host buffer (allocating one from the host chunk pool if it has none). With
// clean_eviction off, host copies are freed as soon as a load completes and every eviction is a
// write-back (PatrickStar's behaviour, kept for comparison).
//
// Prefetch. After an Access at moment m on the trace, the chunks of moment m+1 (same iteration,
// FWD or BWD) are loaded on the host-to-accelerator stream while the operator computes. A prefetch never takes the
// resident bytes above target(m). When that needs evictions, it makes exactly the evictions the
// demand access at m+1 would make (the policy is asked with the same candidates and `now` = m+1,
// and only if no more bytes are needed than the demand access would need), and only clean ones,
// which cost no copy: otherwise the prefetch is left to the demand access. So prefetching changes
// when bytes move, never how many (tested).
//
// Write-behind. After the warm-up, when a Release in BWD ends the last accelerator use of a param
// chunk in the iteration (the schedule says so) and its index is updated on the host, the chunk
// must go back to the host before its next use whatever the policy does (evicted now or moved for
// the optimizer step), so its write-back starts at once on the accelerator-to-host stream,
// overlapping the next operators' compute; when it is later evicted or moved, that is a clean
// drop. The same bytes move, earlier; and backward's victims become clean, so prefetching works in
// backward too. Write-behinds count as write-backs of the stage that issued them.
//
// Waiting. Copies run on two streams of the manager, one per direction (a GPU's two copy engines).
// Access returns once the operator's chunks are resident and their copies complete (the host
// waits on an event; the time is counted as stall), so the caller may use the views from the host
// or any stream at once. Before a chunk's device payload is written back or dropped, work the
// caller enqueued on `compute_stream` (if given) up to the last Release is waited for.
//
// ADAM placement. BeginAdam() returns which chunk indices the accelerator updates in place
// (hybrid Adam); the rest run on the host. AccessChunks(i, types, device, mode) makes chunk i of
// each type resident on that device (for the host, moving it back: clean drop or write-back).
// Design: optimizer state is placed on the accelerator only where it can *stay*: the room left at
// every moment of the learned trace (min over m of target(m)) once every param chunk the
// iteration uses there is resident, minus adam_margin_bytes, in units of three chunks
// (master, momentum, variance). Placing state that merely fits while the activations are gone
// would have OPT evict it (dirty, 12 bytes/param back) as soon as the next forward's tide rises
// and load it again (12 bytes/param) at the next step: 24 bytes/param of traffic per iteration
// against 4 for updating on the host (gradients down, parameters up). Placed state is loaded once,
// at the first optimizer step after the warm-up (so that iteration moves those bytes once more
// than the warm-up), and then never moves. During the warm-up nothing is known, and every index
// runs on the host. The placement is computed once, when the warm-up ends; indices whose param
// chunk is used last in the iteration (so still resident when the step starts) come first.
//
// Pressure. The tide is what the accelerator's MemoryTracker counts: the bytes of activations in
// use. The caching allocator holds them in segments whose free tails it cannot always reuse, so
// the device can run out of memory while the tracker says there is room (nonmodel_slack_bytes is
// the planned margin for that). When it happens anyway, the accelerator's bottom resource asks its
// reclaimers for memory before failing; the manager is one of them (evict_under_pressure): it
// evicts every resident chunk that may move (not COMPUTE, not pinned) — writing back dirty ones and
// waiting for the copies — and returns the freed blocks to the device, so the allocation succeeds
// at the cost of reloading those chunks later. Counted in pressure_reclaims / pressure_evictions.
// Allocations made by the manager itself (inside its own calls) never trigger this.
//
// ZeRO data parallelism (world size N > 1; chunk/chunk_layout.h: chunk i is in group i / N and
// is owned by rank i % N). Each rank holds persistently the param chunks it owns and, for those
// only, master/momentum/variance: 14/N bytes per parameter (16/N with f32 compute) plus the
// group buffers below. The collectives come from ChunkManagerOptions::collectives
// (scheduler/collective_hooks.h; scheduler/comm_collectives.h implements them over comm/), so
// this library does not depend on comm/.
//  - Gather. A group is *gathered* (its remote param chunks hold the owners' bytes) or not. An
//    Access whose chunk's group is not gathered makes every (non-padding) chunk of the group
//    resident on the accelerator as one working set — the remote ones as fresh payloads of the
//    accelerator's chunk pool, counted like any resident chunk, so the limits and the tide
//    include the group buffers — then all-gathers it, and sets every tensor of the group to HOLD
//    (an owner's tensor that was never written, FREE, is zero-filled first, as an access would).
//    Gathered remote chunks are ordinary chunks from then on: they may be evicted (written back
//    to the host) and loaded again like owned ones.
//  - Free after forward. When a forward Release (before the iteration's backward started, or
//    untracked) leaves every tensor of its group HOLD_AFTER_FWD, the remote payloads are freed
//    wherever they are (their tensors become FREE) and the group is no longer gathered. Not
//    during backward: a recompute (activation checkpointing) keeps the group for its backward.
//  - Reduce after backward. A group is finished with backward when every tensor is
//    HOLD_AFTER_BWD *and* every operator of the group has been released in BWD at least as often
//    as it was accessed in FWD before the backward started (at least once): a tied parameter
//    used twice (wte: encoder and LM head) is only finished after its second backward use.
//    Then the group is made resident on the accelerator, the caller's compute is waited for, the
//    group is reduce-scattered (averaged: the owner's param chunk now holds the mean gradient)
//    and the remote payloads are freed. The owner's chunk is dirty (and written behind, as for
//    world size 1).
//  - BeginAdam (and EndIteration) first reduce-scatters every gathered group touched by a
//    backward access and not yet reduced, then frees every gathered group, so the optimizer only
//    sees owned chunks and the next forward gathers the updated parameters.
//  - Every decision above depends only on the sequence of Access/Release/BeginAdam calls, never
//    on memory pressure or timing, so ranks that run the same sequence issue the same collectives
//    in the same order (ReleaseRemoteChunks, called on every rank, keeps that true when
//    parameters are rewritten outside the optimizer).
//  Accounting: PatrickStar budgets backward as if every rank held every group buffer of every
//  rank (its available memory is multiplied by the world size); here a gathered remote chunk is
//  one chunk-pool block on this rank, exactly what it occupies.
//  Known limits: gathers are synchronous (no prefetching of the next group's collective), and the
//  reduce-scatter needs the whole group resident at once.
//
// Known limits: a prefetch whose victim is dirty is left to the demand access (evicting it would
// need its write-back to finish before the block can be reused; write-behind makes this rare);
// before dropping a clean chunk the host waits for the compute stream up to the last Release (one
// event for all chunks, not one per chunk).
//
// Thread safety: thread-compatible. One thread (the training loop) calls the manager; the copy
// streams only move bytes the manager told them to.
#ifndef PATRICKSTAR_SCHEDULER_CHUNK_MANAGER_H_
#define PATRICKSTAR_SCHEDULER_CHUNK_MANAGER_H_

#include <array>
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
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/memory_resource.h"
#include "scheduler/chunk_events.h"
#include "scheduler/collective_hooks.h"
#include "scheduler/eviction_policy.h"
#include "scheduler/metronome.h"
#include "scheduler/tide_trace.h"

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
  // manager). Write-backs and drops of a chunk's device copy wait for the work enqueued on it
  // before the last Release (a host wait, except for write-behinds, which wait on the stream).
  Stream* compute_stream = nullptr;
  // Monotonic clock for stall times, in nanoseconds; absl::GetCurrentTimeNanos when unset.
  std::function<int64_t()> clock_ns = nullptr;
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
};

// Chunk traffic. A load is a host-to-accelerator chunk copy, a write-back an accelerator-to-host
// one; bytes are payload bytes (capacity_bytes of the chunk).
struct TransferCounters {
  int64_t loads = 0;
  int64_t load_bytes = 0;
  int64_t write_backs = 0;
  int64_t write_back_bytes = 0;
  // Evictions that dropped the accelerator copy of a clean chunk: no copy.
  int64_t clean_evictions = 0;
  // Released chunks given a fresh accelerator payload (no copy).
  int64_t allocations = 0;

  int64_t moved_bytes() const { return load_bytes + write_back_bytes; }
  TransferCounters& operator+=(const TransferCounters& o);
  friend bool operator==(const TransferCounters& a, const TransferCounters& b) = default;
};

struct ChunkManagerCounters {
  // By the pass of the iteration whose access caused the traffic: FWD accesses after the
  // iteration's first BWD access (activation-checkpointing recompute) belong to the backward
  // pass and count under BWD. Untracked accesses count under the stage they name.
  std::array<TransferCounters, kNumStages> by_stage;
  // Chunks loaded ahead of their access, and accesses that found their chunk already loaded (or
  // loading) by a prefetch.
  int64_t prefetches = 0;
  int64_t prefetch_hits = 0;
  // Write-backs started early (also counted in by_stage as write-backs).
  int64_t write_behinds = 0;
  // Times the accelerator ran out of memory between accesses and the manager evicted chunks to
  // make room (see "Pressure" in the file comment), and the chunks evicted then (also counted in
  // by_stage as write-backs or clean evictions).
  int64_t pressure_reclaims = 0;
  int64_t pressure_evictions = 0;
  // Time the calling thread waited for copies (loads, write-backs, zero-fills).
  int64_t stall_ns = 0;
  // ZeRO (world size > 1): group all-gathers and the bytes this rank received (remote data
  // chunks), reduce-scatters and the bytes this rank sent for others (remote data chunks), and
  // remote payloads freed. Time inside the collectives counts as comm_ns, not as stall.
  int64_t all_gathers = 0;
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatters = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t remote_releases = 0;
  int64_t comm_ns = 0;

  const TransferCounters& stage(Stage s) const { return by_stage[static_cast<int>(s)]; }
  TransferCounters Total() const;
  // `this - earlier`, counter by counter.
  ChunkManagerCounters Minus(const ChunkManagerCounters& earlier) const;
  // One line for logs.
  std::string DebugString() const;
};

// Which chunk indices the optimizer step updates on the accelerator.
struct AdamPlacement {
  // Ascending.
  std::vector<int64_t> accelerator_chunks;
  // Accelerator bytes found for optimizer state that stays resident (see the file comment).
  int64_t available_bytes = 0;

  bool OnAccelerator(int64_t chunk_index) const;
};

class ChunkManager {
 public:
  // None of the pointers is owned; all must outlive the manager. `accelerator` must be the memory
  // of `backend`'s device and `host` host memory; both chunk pools must hold a chunk of every
  // type of `store`. Chunks' payloads keep pointing into those pools after the manager is gone.
  // InvalidArgument (naming the field) for null arguments or invalid options, and for a layout of
  // world size > 1 without matching ChunkManagerOptions::collectives.
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
  // accessed. Ending the warm-up finishes the trace and hands the schedule to the policy.
  [[nodiscard]] absl::Status EndIteration();

  // --- The model ------------------------------------------------------------------------------

  // Makes operator `op`'s param chunk resident on the accelerator (allocating it if released,
  // loading it, evicting others as the policy chooses), waits for its copy, and sets its tensors to
  // COMPUTE (FREE tensors are zero-filled). `stage` is kForward (read-only: the chunk stays clean)
  // or kBackward (gradients overwrite parameters: the chunk becomes dirty).
  // InvalidArgument for an unknown operator or stage kAdam; FailedPrecondition if the operator is
  // already accessed or has no tensors; ResourceExhausted if its working set cannot fit (see the
  // file comment); errors of the pools and streams otherwise.
  [[nodiscard]] absl::Status Access(OperatorId op, Stage stage);

  // Sets the operator's tensors COMPUTE -> HOLD_AFTER_FWD (kForward) or HOLD_AFTER_BWD
  // (kBackward). FailedPrecondition without a matching Access; InvalidArgument for kAdam.
  [[nodiscard]] absl::Status Release(OperatorId op, Stage stage);

  // --- The optimizer --------------------------------------------------------------------------

  // The start of the optimizer step (a moment of stage ADAM). Returns the placement (see the file
  // comment). FailedPrecondition while an operator is accessed.
  [[nodiscard]] absl::StatusOr<AdamPlacement> BeginAdam();

  // Makes chunk `chunk_index` of each of `types` resident on `device` (the accelerator of this
  // manager, or the host) and sets all of its tensors to COMPUTE. kReadWrite marks them dirty.
  // One moment of stage ADAM. InvalidArgument for a bad index, no types, a repeated type or
  // another device; FailedPrecondition if one of them is already accessed or cannot hold a payload
  // (another rank's optimizer state); ResourceExhausted as for Access.
  [[nodiscard]] absl::Status AccessChunks(int64_t chunk_index, absl::Span<const ChunkType> types,
                                          Device device, AccessMode mode);
  // COMPUTE -> HOLD for every tensor of those chunks. FailedPrecondition without AccessChunks.
  [[nodiscard]] absl::Status ReleaseChunks(int64_t chunk_index, absl::Span<const ChunkType> types);

  // --- Observers ------------------------------------------------------------------------------

  // --- ZeRO ---------------------------------------------------------------------------------

  // Frees the remote payloads of every gathered group (no communication; any gradients in them
  // that were not reduce-scattered yet are dropped). Call it on every rank before rewriting
  // parameters outside the optimizer step (initialization, checkpoint load), so that the next
  // access gathers the new values. No-op for world size 1. FailedPrecondition while an operator
  // or chunk is accessed.
  [[nodiscard]] absl::Status ReleaseRemoteChunks();
  // Whether group `group`'s remote chunks hold the owners' bytes. REQUIRES: 0 <= group <
  // store's num_groups().
  bool group_gathered(int64_t group) const { return gathered_[group] != 0; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }

  // The store whose chunks this manager schedules, and the accelerator it schedules them onto.
  const ChunkStore& store() const { return *store_; }
  Device accelerator_device() const { return accel_->device(); }
  const Metronome& metronome() const { return metronome_; }
  const TideTrace& tide() const { return trace_; }
  bool is_warmup() const { return metronome_.is_warmup(); }
  bool in_iteration() const { return in_iteration_; }
  const EvictionPolicy& policy() const { return *policy_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  // Bytes kept free beside the tide: comm_buffer_bytes + nonmodel_slack_bytes.
  int64_t reserved_bytes() const { return reserved_bytes_; }
  // What one resident chunk costs on the accelerator (a chunk-pool block).
  int64_t device_chunk_cost_bytes() const { return device_cost_bytes_; }
  // Accelerator bytes of resident chunks (including loads in flight).
  int64_t resident_bytes() const { return resident_bytes_; }
  // Dense keys of the chunks resident on the accelerator, ascending.
  std::vector<int64_t> ResidentChunkKeys() const;
  // target(m) of the file comment for `moment` of the learned trace.
  // REQUIRES: the warm-up ended and 0 <= moment < tide().total_moments().
  int64_t ChunkableBytes(int64_t moment) const;
  // The limit resident_bytes() is kept under at the current moment: target(moment) or, when the
  // current access's working set is larger, that working set.
  int64_t current_limit_bytes() const { return current_limit_bytes_; }

  ChunkManagerCounters counters() const { return counters_; }
  // Counters of each completed iteration (index 0: the warm-up).
  const std::vector<ChunkManagerCounters>& iteration_counters() const {
    return iteration_counters_;
  }

  // Dense chunk keys: type * num_chunks + index (the keys the policy and the schedule use).
  int64_t ChunkKey(ChunkId id) const;
  ChunkId ChunkIdOfKey(int64_t key) const;

 private:
  struct Limits {
    int64_t target_bytes = 0;
    int64_t hard_bytes = 0;
    // For messages.
    int64_t tide_bytes = 0;
    bool known = false;
  };

  ChunkManager(ChunkStore* store, Backend* backend, DeviceMemory* accelerator, DeviceMemory* host,
               ChunkManagerOptions options);

  // --- ZeRO (see the file comment) ---
  // The dense keys of the param chunks of `group` that are not padding.
  std::vector<int64_t> GroupKeys(int64_t group) const;
  // All-gathers `group`, whose chunks are resident. Sets every tensor of the group to HOLD.
  absl::Status GatherGroup(int64_t group);
  // Makes `group` resident and reduce-scatters it (averaging into the owner's chunk).
  absl::Status ReduceGroup(int64_t group, Stage stage, int64_t moment);
  // Frees the remote payloads of `group`.
  absl::Status FreeGroup(int64_t group);
  // Whether every tensor of the group's data chunks is in `state`.
  bool GroupAllIn(int64_t group, TensorState state) const;
  // Whether the group finished its backward (see the file comment).
  bool GroupFinishedBackward(int64_t group) const;
  // Reduces (if touched by backward) and frees every gathered group.
  absl::Status FinishGroups(Stage stage);
  // Runs a collective over `keys` (pinned while it runs); payload pointers by owner rank.
  absl::Status RunGroupCollective(
      int64_t group, const std::vector<int64_t>& keys,
      const std::function<absl::Status(absl::Span<void* const>, int64_t, DType)>& collective);

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

  // Enqueues a copy with `enqueue` on `stream`; with a listener, brackets it with host functions
  // that time it on the stream and report `event` when it completes.
  absl::Status TimedCopy(Stream& stream, ChunkMoveEvent event,
                         const std::function<absl::Status()>& enqueue);
  ChunkMoveEvent MoveEvent(ChunkMoveKind kind, const Chunk& chunk, Stage stage) const;
  // Reports a move without a copy, now.
  void ReportMove(ChunkMoveKind kind, int64_t key, Stage stage);
  void ReportAccess(absl::string_view name, int64_t chunk_index, Stage stage, int64_t moment,
                    int64_t request_ns);

  Chunk& ChunkOfKey(int64_t key) { return store_->chunk(ChunkIdOfKey(key)); }
  int64_t NowNs() const;
  // The pass `stage` belongs to, for the counters (see ChunkManagerCounters::by_stage).
  Stage PassOf(Stage stage) const {
    return stage == Stage::kForward && backward_started_ ? Stage::kBackward : stage;
  }

  // Closes the current moment's tide interval (recording it during the warm-up) and starts the
  // next moment of `stage`. Returns -1 for an untracked access.
  absl::StatusOr<int64_t> Tick(Stage stage);
  absl::Status SampleTide();
  Limits LimitsAt(int64_t moment) const;
  // Makes `keys` resident on the accelerator: checks the working set, evicts, loads, waits.
  absl::Status MakeResident(const std::vector<int64_t>& keys, Stage stage, int64_t moment,
                            const std::string& what);
  // Evicts `need_bytes` of chunks, not in `keep`, as the policy chooses at `now`.
  absl::Status EvictFor(int64_t need_bytes, const absl::flat_hash_set<int64_t>& keep, Stage stage,
                        int64_t now, const std::string& what);
  // Moves `victims` (resident, movable) to the host: clean ones by dropping the accelerator copy,
  // dirty ones by writing back first.
  absl::Status Evict(const std::vector<int64_t>& victims, Stage stage);
  // Starts loads (or allocations, for released chunks) of `keys` onto the accelerator.
  absl::Status Load(const std::vector<int64_t>& keys, Stage stage, bool prefetch);
  // Waits for the copies (loads, write-behinds) of `keys` in flight.
  absl::Status WaitForCopies(const std::vector<int64_t>& keys);
  // True when no copy of `key` is in flight (completing the bookkeeping of finished ones).
  bool CopiesDone(int64_t key);
  // Starts the write-back of a dirty chunk whose last accelerator use of the iteration just ended
  // (see the file comment).
  absl::Status WriteBehind(int64_t key);
  // The ADAM placement from the finished trace.
  void ComputeAdamPlacement();
  // Brings chunk `key` back to the host (allocating it there if released).
  absl::Status MoveToHost(int64_t key, Stage stage);
  // Prefetches the chunks of the moment after `moment`.
  absl::Status Prefetch(int64_t moment);
  // Waits for the work enqueued on `stream` so far, counting stall time.
  absl::Status SyncStream(Stream& stream);
  absl::Status WaitForCompute();
  void RecordUse(int64_t key, int64_t moment);
  absl::Status RecordAccess(int64_t key, int64_t moment);
  std::string WorkingSetError(const std::string& what, int64_t working_set_bytes, int64_t own_bytes,
                              const Limits& limits, int64_t moment) const;

  ChunkStore* const store_;
  Backend* const backend_;
  DeviceMemory* const accel_;
  DeviceMemory* const host_;
  const ChunkManagerOptions options_;
  int busy_ = 0;
  std::unique_ptr<PressureReclaimer> reclaimer_;
  const int64_t num_chunks_;
  const int64_t device_cost_bytes_;
  int64_t budget_bytes_ = 0;
  int64_t reserved_bytes_ = 0;

  // Host-to-accelerator copies and zero-fills; accelerator-to-host copies (two copy engines).
  std::unique_ptr<Stream> load_stream_;
  std::unique_ptr<Stream> store_stream_;
  std::unique_ptr<Event> compute_done_;
  bool compute_pending_ = false;
  std::unique_ptr<EvictionPolicy> policy_;

  // ZeRO.
  const int world_size_;
  const int rank_;
  CollectiveHooks* const collectives_;
  // By group: gathered, and touched by a BWD access since it was gathered.
  std::vector<uint8_t> gathered_;
  std::vector<uint8_t> backward_touched_;
  // By group: the operators placed in its chunks.
  std::vector<std::vector<OperatorId>> group_ops_;
  // By operator, this iteration: FWD accesses before the backward started, and BWD releases.
  std::vector<int32_t> forward_uses_;
  std::vector<int32_t> backward_releases_;

  Metronome metronome_;
  TideTrace trace_;
  bool in_iteration_ = false;
  // Whether this iteration had a BWD access yet.
  bool backward_started_ = false;

  // Chunks whose payload is on the accelerator (loads in flight included).
  absl::flat_hash_set<int64_t> resident_;
  int64_t resident_bytes_ = 0;
  // Copies in flight (loads, write-behinds): key -> the event recorded after the copy.
  absl::flat_hash_map<int64_t, std::shared_ptr<Event>> pending_;
  AdamPlacement adam_placement_;
  // Chunks loaded by a prefetch and not accessed since.
  absl::flat_hash_set<int64_t> prefetched_;
  // Operators (with the stage they were accessed in) and optimizer chunks between access and
  // release.
  absl::flat_hash_map<OperatorId, Stage> active_ops_;
  absl::flat_hash_set<int64_t> active_chunks_;
  int64_t current_limit_bytes_ = 0;

  ChunkManagerCounters counters_;
  ChunkManagerCounters iteration_start_counters_;
  std::vector<ChunkManagerCounters> iteration_counters_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_CHUNK_MANAGER_H_
