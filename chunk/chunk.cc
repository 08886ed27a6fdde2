#include "chunk/chunk.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {
namespace {

// Prepends context to a status, keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

absl::StatusOr<CopyKind> CopyKindBetween(Device src, Device dst) {
  if (src.is_host() && dst.is_host()) return CopyKind::kHostToHost;
  if (src.is_host()) return CopyKind::kHostToDevice;
  if (dst.is_host()) return CopyKind::kDeviceToHost;
  if (src.index != dst.index) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot copy from ", src.ToString(), " to ", dst.ToString(),
                     ": copies between two accelerators are not supported; move through the host"));
  }
  return CopyKind::kDeviceToDevice;
}

absl::StatusOr<std::unique_ptr<Chunk>> Chunk::Create(ChunkSpec spec) {
  const std::string name = spec.id.ToString();
  if (spec.capacity_elems <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", name, ": capacity_elems must be positive, got ", spec.capacity_elems));
  }
  int64_t prev_end = 0;
  absl::flat_hash_map<TensorId, int> seen;
  for (const ChunkTensor& t : spec.tensors) {
    if (t.numel <= 0 || t.offset_elems < prev_end ||
        t.offset_elems > spec.capacity_elems - t.numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", name, ": tensor '", t.name, "' at [", t.offset_elems, ", ",
                       t.offset_elems + t.numel,
                       ") is empty, out of offset order, overlapping (previous ends at ", prev_end,
                       ") or beyond the capacity ", spec.capacity_elems));
    }
    if (!seen.emplace(t.id, 0).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", name, ": tensor id ", t.id, " appears twice"));
    }
    prev_end = t.offset_elems + t.numel;
  }
  return std::unique_ptr<Chunk>(new Chunk(std::move(spec)));
}

Chunk::Chunk(ChunkSpec spec) : spec_(std::move(spec)) {
  states_.assign(spec_.tensors.size(), TensorState::kFree);
  counts_[static_cast<int>(TensorState::kFree)] = num_tensors();
  slot_of_.reserve(spec_.tensors.size());
  for (int i = 0; i < num_tensors(); ++i) slot_of_.emplace(spec_.tensors[i].id, i);
}

Chunk::~Chunk() {
  if (backing_ != nullptr) {
    absl::Status s = backing_resource_->Deallocate(backing_, capacity_bytes());
    LOG_IF(ERROR, !s.ok()) << "chunk " << id() << " could not give its backing copy back to "
                           << backing_resource_->name() << " on destruction: " << s;
  }
  if (payload_ == nullptr) return;
  absl::Status s = resource_->Deallocate(payload_, capacity_bytes());
  LOG_IF(ERROR, !s.ok()) << "chunk " << id() << " could not give its payload back to "
                         << resource_->name() << " on destruction: " << s;
}

Device Chunk::device() const {
  CHECK(has_payload()) << "chunk " << id() << " has no payload, hence no device";
  return resource_->device();
}

absl::Status Chunk::AllocatePayload(MemoryResource& resource) {
  if (has_payload()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", id().ToString(), " already has a payload on ", device().ToString(),
                     "; release or move it instead of allocating again"));
  }
  if (IsOptimizerState(type())) {
    if (!is_local()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chunk ", id().ToString(), " is owned by rank ", owner_rank(), " and this is rank ",
          spec_.local_rank, ": only the owner of a chunk holds its ", ChunkTypeName(type()),
          " payload"));
    }
    if (is_padding()) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", id().ToString(), " is a padding chunk: it has no parameters, ",
                       "so it has no ", ChunkTypeName(type()), " payload"));
    }
  }
  absl::StatusOr<void*> p = resource.Allocate(capacity_bytes());
  if (!p.ok()) {
    return Annotate(p.status(),
                    absl::StrCat("allocating the payload of chunk ", id().ToString(), " (",
                                 FormatBytes(capacity_bytes()), ") from ", resource.name()));
  }
  payload_ = *p;
  resource_ = &resource;
  return absl::OkStatus();
}

bool Chunk::movable() const {
  return has_payload() && tensor_count(TensorState::kCompute) == 0 && !pinned();
}

absl::Status Chunk::CheckMovable(absl::string_view action) const {
  if (!has_payload()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot ", action, " chunk ", id().ToString(), ": it has no payload"));
  }
  if (tensor_count(TensorState::kCompute) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot ", action, " chunk ", id().ToString(), ": ", tensor_count(TensorState::kCompute),
        " of its tensors are in COMPUTE; release them first"));
  }
  if (pinned()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot ", action, " chunk ", id().ToString(),
                                                      ": it is pinned (", pin_count_, " pins)"));
  }
  return absl::OkStatus();
}

absl::Status Chunk::ReleasePayload() {
  RETURN_IF_ERROR(CheckMovable("release the payload of"));
  RETURN_IF_ERROR(FreeBacking());
  RETURN_IF_ERROR(Annotate(resource_->Deallocate(payload_, capacity_bytes()),
                           absl::StrCat("releasing the payload of chunk ", id().ToString())));
  payload_ = nullptr;
  resource_ = nullptr;
  // HOLD* -> FREE is legal for every state left (COMPUTE was refused above).
  states_.assign(states_.size(), TensorState::kFree);
  counts_ = {};
  counts_[static_cast<int>(TensorState::kFree)] = num_tensors();
  return absl::OkStatus();
}

absl::Status Chunk::MoveTo(MemoryResource& destination, Stream& stream) {
  RETURN_IF_ERROR(CheckMovable("move"));
  if (&destination == resource_) return absl::OkStatus();
  if (&destination == backing_resource_) {
    if (!backing_valid_) {
      RETURN_IF_ERROR(WriteBackAsync(stream));
      RETURN_IF_ERROR(
          Annotate(stream.Synchronize(), absl::StrCat("writing back chunk ", id().ToString())));
    }
    return RevertToBacking();
  }
  const Device src = resource_->device();
  const Device dst = destination.device();
  const std::string context =
      absl::StrCat("moving chunk ", id().ToString(), " (", FormatBytes(capacity_bytes()), ") from ",
                   src.ToString(), " to ", dst.ToString());
  absl::StatusOr<CopyKind> kind = CopyKindBetween(src, dst);
  if (!kind.ok()) return Annotate(kind.status(), context);
  absl::StatusOr<void*> target = destination.Allocate(capacity_bytes());
  if (!target.ok()) return Annotate(target.status(), context);
  absl::Status copied = stream.MemcpyAsync(*target, payload_, capacity_bytes(), *kind);
  if (copied.ok()) copied = stream.Synchronize();
  if (!copied.ok()) {
    absl::Status undo = destination.Deallocate(*target, capacity_bytes());
    LOG_IF(ERROR, !undo.ok()) << context
                              << ": could not free the destination after a failed copy: " << undo;
    return Annotate(copied, context);
  }
  void* old_payload = payload_;
  MemoryResource* old_resource = resource_;
  payload_ = *target;
  resource_ = &destination;
  RETURN_IF_ERROR(Annotate(old_resource->Deallocate(old_payload, capacity_bytes()),
                           absl::StrCat(context, ", freeing the source")));
  return Annotate(FreeBacking(), context);
}

Device Chunk::backing_device() const {
  CHECK(has_backing()) << "chunk " << id() << " has no backing copy, hence no backing device";
  return backing_resource_->device();
}

absl::Status Chunk::FreeBacking() {
  if (backing_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(
      Annotate(backing_resource_->Deallocate(backing_, capacity_bytes()),
               absl::StrCat("giving back the backing copy of chunk ", id().ToString())));
  backing_ = nullptr;
  backing_resource_ = nullptr;
  backing_valid_ = false;
  return absl::OkStatus();
}

absl::Status Chunk::CopyToKeepingBacking(MemoryResource& destination, Stream& stream) {
  RETURN_IF_ERROR(CheckMovable("copy"));
  if (has_backing()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot copy chunk ", id().ToString(), " keeping its source: it already has a backing copy",
        " on ", backing_device().ToString(), "; write it back and revert, or discard it first"));
  }
  if (&destination == resource_) {
    return absl::FailedPreconditionError(absl::StrCat("cannot copy chunk ", id().ToString(), " to ",
                                                      destination.name(),
                                                      ": its payload is already there"));
  }
  const Device src = resource_->device();
  const Device dst = destination.device();
  const std::string context =
      absl::StrCat("copying chunk ", id().ToString(), " (", FormatBytes(capacity_bytes()),
                   ") from ", src.ToString(), " to ", dst.ToString());
  absl::StatusOr<CopyKind> kind = CopyKindBetween(src, dst);
  if (!kind.ok()) return Annotate(kind.status(), context);
  absl::StatusOr<void*> target = destination.Allocate(capacity_bytes());
  if (!target.ok()) return Annotate(target.status(), context);
  if (absl::Status copied = stream.MemcpyAsync(*target, payload_, capacity_bytes(), *kind);
      !copied.ok()) {
    absl::Status undo = destination.Deallocate(*target, capacity_bytes());
    LOG_IF(ERROR, !undo.ok()) << context
                              << ": could not free the destination after a failed copy: " << undo;
    return Annotate(copied, context);
  }
  backing_ = payload_;
  backing_resource_ = resource_;
  backing_valid_ = true;
  payload_ = *target;
  resource_ = &destination;
  return absl::OkStatus();
}

absl::Status Chunk::WriteBackAsync(Stream& stream, MemoryResource* backing_resource) {
  RETURN_IF_ERROR(CheckMovable("write back"));
  if (backing_valid()) return absl::OkStatus();
  bool allocated = false;
  if (!has_backing()) {
    if (backing_resource == nullptr || backing_resource == resource_) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write back chunk ", id().ToString(),
                       ": it has no backing copy and no other resource was given to hold one"));
    }
    absl::StatusOr<void*> buffer = backing_resource->Allocate(capacity_bytes());
    if (!buffer.ok()) {
      return Annotate(
          buffer.status(),
          absl::StrCat("allocating a backing copy of chunk ", id().ToString(), " (",
                       FormatBytes(capacity_bytes()), ") from ", backing_resource->name()));
    }
    backing_ = *buffer;
    backing_resource_ = backing_resource;
    allocated = true;
  }
  const std::string context = absl::StrCat(
      "writing back chunk ", id().ToString(), " (", FormatBytes(capacity_bytes()), ") from ",
      resource_->device().ToString(), " to ", backing_resource_->device().ToString());
  absl::Status s = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(CopyKind kind, CopyKindBetween(resource_->device(), backing_device()));
    return stream.MemcpyAsync(backing_, payload_, capacity_bytes(), kind);
  }();
  if (!s.ok()) {
    if (allocated) {
      absl::Status undo = FreeBacking();
      LOG_IF(ERROR, !undo.ok()) << context << ": " << undo;
    }
    return Annotate(s, context);
  }
  backing_valid_ = true;
  return absl::OkStatus();
}

absl::Status Chunk::RevertToBacking() {
  RETURN_IF_ERROR(CheckMovable("revert to the backing copy of"));
  if (!has_backing()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot revert chunk ", id().ToString(), " to its backing copy: it has none"));
  }
  if (!backing_valid_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot revert chunk ", id().ToString(), " to its backing copy on ",
        backing_device().ToString(), ": the payload was written since; write it back first"));
  }
  RETURN_IF_ERROR(Annotate(resource_->Deallocate(payload_, capacity_bytes()),
                           absl::StrCat("dropping the payload of chunk ", id().ToString())));
  payload_ = backing_;
  resource_ = backing_resource_;
  backing_ = nullptr;
  backing_resource_ = nullptr;
  backing_valid_ = false;
  return absl::OkStatus();
}

absl::Status Chunk::DiscardBacking() {
  if (!has_backing()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot discard the backing copy of chunk ",
                                                      id().ToString(), ": it has none"));
  }
  return FreeBacking();
}

absl::Status Chunk::Unpin() {
  if (pin_count_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot unpin chunk ", id().ToString(), ": it is not pinned"));
  }
  --pin_count_;
  return absl::OkStatus();
}

const ChunkTensor& Chunk::tensor(int slot) const {
  CHECK(slot >= 0 && slot < num_tensors())
      << "slot " << slot << " outside [0, " << num_tensors() << ") of chunk " << id();
  return spec_.tensors[slot];
}

TensorState Chunk::tensor_state(int slot) const {
  CHECK(slot >= 0 && slot < num_tensors())
      << "slot " << slot << " outside [0, " << num_tensors() << ") of chunk " << id();
  return states_[slot];
}

absl::StatusOr<int> Chunk::FindSlot(TensorId tensor_id) const {
  auto it = slot_of_.find(tensor_id);
  if (it == slot_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor id ", tensor_id, " is not in chunk ", id().ToString()));
  }
  return it->second;
}

absl::Status Chunk::CheckSlot(int slot) const {
  if (slot < 0 || slot >= num_tensors()) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is outside [0, ", num_tensors(),
                                                   ") of chunk ", id().ToString()));
  }
  return absl::OkStatus();
}

absl::Status Chunk::CheckTransition(int slot, TensorState to, bool has_stream) const {
  RETURN_IF_ERROR(CheckSlot(slot));
  const TensorState from = states_[slot];
  const ChunkTensor& t = spec_.tensors[slot];
  if (!IsLegalTransition(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "illegal tensor state transition ", TensorStateName(from), " -> ", TensorStateName(to),
        " for tensor '", t.name, "' (id ", t.id, ") in chunk ", id().ToString(), "; legal from ",
        TensorStateName(from), ": ", LegalTargetsString(from)));
  }
  if (to != TensorState::kFree && !has_payload()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", t.name, "' (id ", t.id, ") in chunk ", id().ToString(),
                     " cannot go ", TensorStateName(from), " -> ", TensorStateName(to),
                     ": the chunk is RELEASED (no payload); allocate or fetch its payload first"));
  }
  if (from == TensorState::kFree && to == TensorState::kCompute && !device().is_host() &&
      !has_stream) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "' (id ", t.id, ") in chunk ", id().ToString(),
                     " goes FREE -> COMPUTE on ", device().ToString(),
                     ": zero-filling accelerator memory needs a stream, none was given"));
  }
  return absl::OkStatus();
}

absl::Status Chunk::SetTensorState(int slot, TensorState to, Stream* stream) {
  RETURN_IF_ERROR(CheckTransition(slot, to, stream != nullptr));
  const TensorState from = states_[slot];
  // The payload's bytes change (zero-fill, or the caller fills the tensor after FREE -> HOLD).
  if (from == TensorState::kFree) backing_valid_ = false;
  if (from == TensorState::kFree && to == TensorState::kCompute) {
    const ChunkTensor& t = spec_.tensors[slot];
    char* data = static_cast<char*>(payload_) + t.offset_elems * SizeOf(dtype());
    const int64_t bytes = t.numel * SizeOf(dtype());
    if (device().is_host()) {
      std::memset(data, 0, static_cast<size_t>(bytes));
    } else {
      RETURN_IF_ERROR(
          Annotate(stream->MemsetAsync(data, 0, bytes),
                   absl::StrCat("zero-filling tensor '", t.name, "' in chunk ", id().ToString())));
    }
  }
  states_[slot] = to;
  --counts_[static_cast<int>(from)];
  ++counts_[static_cast<int>(to)];
  return absl::OkStatus();
}

absl::StatusOr<TensorView> Chunk::View(int slot) const {
  RETURN_IF_ERROR(CheckSlot(slot));
  const ChunkTensor& t = spec_.tensors[slot];
  if (!has_payload()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", t.name, "' in chunk ", id().ToString(), " has no data: the chunk is RELEASED"));
  }
  return TensorView{static_cast<char*>(payload_) + t.offset_elems * SizeOf(dtype()), t.numel,
                    dtype(), device()};
}

absl::StatusOr<TensorView> Chunk::PayloadView() const {
  if (!has_payload()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", id().ToString(), " is RELEASED: it has no payload"));
  }
  return TensorView{payload_, capacity_elems(), dtype(), device()};
}

std::string Chunk::DebugString() const {
  return absl::StrCat(id().ToString(), " [", ChunkStateName(state()), "] ", num_tensors(),
                      " tensors ", has_payload() ? "on " + device().ToString() : "released", ", ",
                      FormatBytes(capacity_bytes()), ", owner ", owner_rank(),
                      is_padding() ? ", padding" : "", pinned() ? ", pinned " : "",
                      pinned() ? absl::StrCat(pin_count_) : "",
                      has_backing() ? absl::StrCat(", backing on ", backing_device().ToString(),
                                                   backing_valid_ ? " (clean)" : " (stale)")
                                    : "");
}

}  // namespace ps
