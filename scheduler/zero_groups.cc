#include "scheduler/zero_groups.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {

ZeroGroups::ZeroGroups(ChunkStore* store, ResidencyEngine* residency, CollectiveHooks* collectives,
                       ChunkManagerCounters* counters)
    : store_(store),
      residency_(residency),
      collectives_(collectives),
      counters_(counters),
      world_size_(store->layout().world_size()),
      rank_(store->rank()) {
  CHECK_GT(world_size_, 1) << "ZeroGroups is for world size > 1";
  CHECK(collectives_ != nullptr);
  const ChunkLayout& l = layout();
  gathered_.assign(l.num_groups(), 0);
  backward_touched_.assign(l.num_groups(), 0);
  group_ops_.resize(l.num_groups());
  for (OperatorId op = 0; op < l.num_operator_ids(); ++op) {
    if (l.op(op).placed()) group_ops_[l.group_of(l.op(op).chunk_index)].push_back(op);
  }
  forward_uses_.assign(l.num_operator_ids(), 0);
  backward_releases_.assign(l.num_operator_ids(), 0);
}

std::vector<int64_t> ZeroGroups::Keys(int64_t group) const {
  std::vector<int64_t> keys;
  for (int64_t index : layout().ChunksInGroup(group)) {
    if (!layout().is_padding(index))
      keys.push_back(residency_->keys().Key(ChunkType::kParam, index));
  }
  return keys;
}

int64_t ZeroGroups::OwnKey(int64_t group) const {
  const int64_t index = group * world_size_ + rank_;
  return layout().is_padding(index) ? -1 : residency_->keys().Key(ChunkType::kParam, index);
}

void ZeroGroups::BeginIteration() {
  std::fill(forward_uses_.begin(), forward_uses_.end(), 0);
  std::fill(backward_releases_.begin(), backward_releases_.end(), 0);
}

void ZeroGroups::NoteAccess(OperatorId op, int64_t group, Stage stage,
                            bool forward_before_backward) {
  // A frozen group's backward writes nothing: there is nothing to reduce.
  if (stage == Stage::kBackward && !layout().group_frozen(group)) backward_touched_[group] = 1;
  if (stage == Stage::kForward && forward_before_backward) ++forward_uses_[op];
}

void ZeroGroups::NoteBackwardRelease(OperatorId op) { ++backward_releases_[op]; }

bool ZeroGroups::AllIn(int64_t group, TensorState state) const {
  for (int64_t key : Keys(group)) {
    const Chunk& chunk = residency_->chunk(key);
    if (chunk.tensor_count(state) != chunk.num_tensors()) return false;
  }
  return true;
}

bool ZeroGroups::FinishedBackward(int64_t group) const {
  // A frozen operator's backward release leaves HOLD (its slots keep the parameters).
  const bool frozen = layout().group_frozen(group);
  if (!AllIn(group, frozen ? TensorState::kHold : TensorState::kHoldAfterBwd)) return false;
  for (OperatorId op : group_ops_[group]) {
    if (backward_releases_[op] < std::max(forward_uses_[op], 1)) return false;
  }
  return true;
}

absl::Status ZeroGroups::RunCollective(
    int64_t group, const std::vector<int64_t>& keys,
    const std::function<absl::Status(absl::Span<void* const>, int64_t, DType)>& collective) {
  // The loads of the group and any write-behind must be complete before the collective reads or
  // writes the payloads (the collectives are called from the host).
  RETURN_IF_ERROR(residency_->WaitForCopies(keys));
  std::vector<void*> payloads(static_cast<size_t>(world_size_), nullptr);
  for (int64_t key : keys) {
    Chunk& chunk = residency_->chunk(key);
    if (!chunk.has_payload()) {
      return absl::InternalError(
          absl::StrCat("ZeRO group ", group, ": chunk ", chunk.id().ToString(), " has no payload"));
    }
    payloads[static_cast<size_t>(chunk.owner_rank())] = chunk.payload();
  }
  for (int64_t key : keys) residency_->chunk(key).Pin();
  const int64_t start = residency_->NowNs();
  absl::Status status = collective(payloads, layout().capacity_elems(), store_->compute_dtype());
  counters_->comm_ns += residency_->NowNs() - start;
  for (int64_t key : keys) RETURN_IF_ERROR(residency_->chunk(key).Unpin());
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("ZeRO collective of chunk group ", group, " (rank ", rank_,
                                     " of ", world_size_, "): ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status ZeroGroups::Gather(int64_t group) {
  const std::vector<int64_t> keys = Keys(group);
  // An owner's tensor that was never written (FREE) is zero-filled, as an access would, so that
  // every rank sees the same bytes.
  bool zero_fill = false;
  for (int64_t key : keys) {
    Chunk& chunk = residency_->chunk(key);
    if (!chunk.is_local()) continue;
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (chunk.tensor_state(slot) == TensorState::kFree) {
        RETURN_IF_ERROR(
            chunk.SetTensorState(slot, TensorState::kCompute, &residency_->load_stream()));
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kHold));
        zero_fill = true;
      }
    }
  }
  if (zero_fill) RETURN_IF_ERROR(residency_->SyncLoadStream());
  RETURN_IF_ERROR(
      RunCollective(group, keys, [&](absl::Span<void* const> payloads, int64_t count, DType dtype) {
        return collectives_->AllGatherGroup(group, payloads, count, dtype);
      }));
  for (int64_t key : keys) {
    Chunk& chunk = residency_->chunk(key);
    if (!chunk.is_local()) {
      chunk.MarkPayloadWritten();
      counters_->all_gather_bytes += chunk.capacity_bytes();
    }
    for (int slot = 0; slot < chunk.num_tensors(); ++slot) {
      if (chunk.tensor_state(slot) != TensorState::kHold) {
        RETURN_IF_ERROR(chunk.SetTensorState(slot, TensorState::kHold));
      }
    }
  }
  ++counters_->all_gathers;
  gathered_[group] = 1;
  backward_touched_[group] = 0;
  VLOG(2) << "rank " << rank_ << ": gathered group " << group;
  return absl::OkStatus();
}

absl::Status ZeroGroups::ReduceScatter(int64_t group) {
  const std::vector<int64_t> keys = Keys(group);
  // The caller's kernels that wrote the gradients must be done.
  RETURN_IF_ERROR(residency_->WaitForCompute());
  RETURN_IF_ERROR(
      RunCollective(group, keys, [&](absl::Span<void* const> payloads, int64_t count, DType dtype) {
        return collectives_->ReduceScatterGroup(group, payloads, count, dtype);
      }));
  for (int64_t key : keys) {
    Chunk& chunk = residency_->chunk(key);
    if (chunk.is_local()) {
      chunk.MarkPayloadWritten();
    } else {
      counters_->reduce_scatter_bytes += chunk.capacity_bytes();
    }
  }
  ++counters_->reduce_scatters;
  backward_touched_[group] = 0;
  VLOG(2) << "rank " << rank_ << ": reduce-scattered group " << group;
  return absl::OkStatus();
}

absl::Status ZeroGroups::Free(int64_t group) {
  for (int64_t key : Keys(group)) {
    Chunk& chunk = residency_->chunk(key);
    if (chunk.is_local() || !chunk.has_payload()) continue;
    RETURN_IF_ERROR(residency_->ReleasePayload(key));
    ++counters_->remote_releases;
  }
  gathered_[group] = 0;
  backward_touched_[group] = 0;
  return absl::OkStatus();
}

}  // namespace ps
