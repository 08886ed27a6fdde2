// ZeroGroups: the ChunkManager's ZeRO data parallelism (world size N > 1) — which chunk groups
// are gathered, when a group has finished its forward or its backward, and the collectives over
// a group's payloads.
//
// Layout (chunk/chunk_layout.h): chunk i is in group i / N and is owned by rank i % N. Each rank
// holds persistently the param chunks it owns and, for those only, master/momentum/variance: 14/N
// bytes per parameter (16/N with f32 compute) plus the group buffers below. The collectives come
// from CollectiveHooks (scheduler/collective_hooks.h), so this library does not depend on comm/.
//  - Gather. A group is *gathered* (its remote param chunks hold the owners' bytes) or not. The
//    manager makes every (non-padding) chunk of the group resident on the accelerator as one
//    working set — the remote ones as fresh chunk-pool payloads, counted like any resident chunk,
//    so the limits and the tide include the group buffers — and Gather all-gathers it and sets
//    every tensor of the group to HOLD (an owner's tensor never written, FREE, is zero-filled
//    first, as an access would). Gathered remote chunks are ordinary chunks from then on: they
//    may be evicted and loaded again like owned ones.
//  - Free after forward. When a forward release (before the iteration's backward started, or
//    untracked) leaves every tensor of its group HOLD_AFTER_FWD, Free gives the remote payloads
//    back wherever they are (their tensors become FREE). Not during backward: a recompute
//    (activation checkpointing) keeps the group for its backward.
//  - Reduce after backward. A group has finished its backward (FinishedBackward) when every
//    tensor is HOLD_AFTER_BWD *and* every operator of the group was released in BWD at least as
//    often as it was accessed in FWD before the backward started (at least once): a tied
//    parameter used twice (wte: encoder and LM head) finishes only after its second backward use.
//    Then the manager makes the group resident and ReduceScatter averages it into the owner's
//    param chunk (now dirty), and Free gives the remote payloads back.
//  - Frozen groups (chunk/chunk_layout.h keeps a ZeRO group of one kind). A frozen operator's
//    BWD release leaves its tensors HOLD (no gradient), so a frozen group has finished its
//    backward when every tensor is HOLD and the release counts above hold; it is then only freed
//    (no reduce-scatter), and a backward access never marks it touched.
//  - Every decision depends only on the sequence of accesses and releases, never on memory
//    pressure or timing, so ranks that run the same sequence issue the same collectives in the
//    same order.
// Accounting: PatrickStar budgets backward as if every rank held every group buffer of every rank
// (its available memory is multiplied by the world size); here a gathered remote chunk is one
// chunk-pool block on this rank, exactly what it occupies.
// Order with the caller's compute stream (scheduler/chunk_manager.h, "Stream order"): every
// collective is called from the host after the group's copies completed (a host wait). A
// reduce-scatter and a free first wait on the host for the compute stream up to the last Release
// (the gradients a queued kernel writes, the payload a queued kernel reads). A gather does not: it
// writes only remote payloads that were just allocated (their blocks were given back only after
// such a wait) and reads owners' chunks no kernel writes while the group is not gathered.
// Known limits: gathers are synchronous (no prefetching of the next group's collective), and the
// reduce-scatter needs the whole group resident at once.
//
// Thread safety: thread-compatible; the manager's thread.
#ifndef PATRICKSTAR_SCHEDULER_ZERO_GROUPS_H_
#define PATRICKSTAR_SCHEDULER_ZERO_GROUPS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/tensor_state.h"
#include "memory/dtype.h"
#include "scheduler/chunk_counters.h"
#include "scheduler/collective_hooks.h"
#include "scheduler/metronome.h"
#include "scheduler/residency.h"

namespace ps {

class ZeroGroups {
 public:
  // None of the pointers is owned; all must outlive this object. REQUIRES: the store's layout has
  // world size > 1 and `collectives` is this rank of that world.
  ZeroGroups(ChunkStore* store, ResidencyEngine* residency, CollectiveHooks* collectives,
             ChunkManagerCounters* counters);

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int64_t num_groups() const { return static_cast<int64_t>(gathered_.size()); }
  // The group of param chunk `chunk_index`.
  int64_t GroupOf(int64_t chunk_index) const { return layout().group_of(chunk_index); }
  bool gathered(int64_t group) const { return gathered_[group] != 0; }
  // Touched by a BWD access since it was gathered (its gradients must be reduced).
  bool backward_touched(int64_t group) const { return backward_touched_[group] != 0; }
  // The dense keys of the param chunks of `group` that are not padding.
  std::vector<int64_t> Keys(int64_t group) const;
  // The key of this rank's param chunk of `group`, or -1 when it is padding.
  int64_t OwnKey(int64_t group) const;

  // --- The access sequence --------------------------------------------------------------------

  // A new iteration: forgets the operators' FWD accesses and BWD releases.
  void BeginIteration();
  // Operator `op` of `group` was accessed in `stage` (`forward_before_backward`: a FWD access of
  // the iteration before its first BWD access).
  void NoteAccess(OperatorId op, int64_t group, Stage stage, bool forward_before_backward);
  // Operator `op` was released in BWD inside an iteration.
  void NoteBackwardRelease(OperatorId op);
  // Whether every tensor of the group's param chunks is in `state`.
  bool AllIn(int64_t group, TensorState state) const;
  // See the file comment.
  bool FinishedBackward(int64_t group) const;

  // --- Collectives (see the file comment) -----------------------------------------------------

  // All-gathers `group`, whose chunks are resident; every tensor of the group becomes HOLD.
  [[nodiscard]] absl::Status Gather(int64_t group);
  // Reduce-scatters (averages) `group`, whose chunks are resident, into this rank's chunk, after
  // the caller's compute.
  [[nodiscard]] absl::Status ReduceScatter(int64_t group);
  // Gives the remote payloads of `group` back; the group is no longer gathered.
  [[nodiscard]] absl::Status Free(int64_t group);

 private:
  const ChunkLayout& layout() const { return store_->layout(); }
  // Runs `collective` over `keys` (pinned while it runs) with the payload pointers by owner rank.
  absl::Status RunCollective(
      int64_t group, const std::vector<int64_t>& keys,
      const std::function<absl::Status(absl::Span<void* const>, int64_t, DType)>& collective);

  ChunkStore* const store_;
  ResidencyEngine* const residency_;
  CollectiveHooks* const collectives_;
  ChunkManagerCounters* const counters_;
  const int world_size_;
  const int rank_;
  // By group: gathered, and touched by a BWD access since it was gathered.
  std::vector<uint8_t> gathered_;
  std::vector<uint8_t> backward_touched_;
  // By group: the operators placed in its chunks.
  std::vector<std::vector<OperatorId>> group_ops_;
  // By operator, this iteration: FWD accesses before the backward started, and BWD releases.
  std::vector<int32_t> forward_uses_;
  std::vector<int32_t> backward_releases_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_ZERO_GROUPS_H_
