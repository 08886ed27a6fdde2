#include "chunk/chunk_store.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::Create(ChunkLayout layout,
                                                               const ChunkStoreOptions& options) {
  if (options.rank < 0 || options.rank >= layout.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk store: rank ", options.rank, " is outside [0, ", layout.world_size(),
                     ") for a layout of world size ", layout.world_size()));
  }
  if (absl::Status s = layout.Validate(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk store: the layout is inconsistent: ", s.message()));
  }
  for (TensorId id = 0; id < layout.num_tensor_ids(); ++id) {
    const TensorInfo& t = layout.tensor(id);
    if (t.live && !t.placed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chunk store: tensor '", t.name, "' of operator '", layout.op(t.op).name,
          "' is not placed in any chunk; place every operator before building the chunks (",
          layout.num_unplaced_tensors(), " tensors unplaced)"));
    }
  }

  std::unique_ptr<ChunkStore> store(new ChunkStore(std::move(layout), options));
  const ChunkLayout& l = store->layout_;
  store->locations_.assign(l.num_tensor_ids(), Location{});
  for (ChunkType type : kAllChunkTypes) {
    store->chunks_[static_cast<int>(type)].reserve(l.num_chunks());
  }
  for (int64_t index = 0; index < l.num_chunks(); ++index) {
    std::vector<ChunkTensor> tensors;
    const std::vector<TensorId> ids = l.TensorsInChunk(index);
    tensors.reserve(ids.size());
    for (size_t slot = 0; slot < ids.size(); ++slot) {
      const TensorInfo& t = l.tensor(ids[slot]);
      tensors.push_back(ChunkTensor{t.id, t.name, t.offset_elems, t.numel});
      store->locations_[t.id] = Location{index, static_cast<int>(slot)};
    }
    for (ChunkType type : kAllChunkTypes) {
      ChunkSpec spec;
      spec.id = ChunkId{type, index};
      spec.dtype = ChunkDType(type, options.compute_dtype);
      spec.capacity_elems = l.capacity_elems();
      spec.owner_rank = l.owner_of(index);
      spec.local_rank = options.rank;
      spec.is_padding = l.is_padding(index);
      spec.tensors = tensors;
      ASSIGN_OR_RETURN(std::unique_ptr<Chunk> chunk, Chunk::Create(std::move(spec)));
      store->chunks_[static_cast<int>(type)].push_back(std::move(chunk));
    }
  }
  return store;
}

Chunk& ChunkStore::chunk(ChunkId id) {
  CHECK(id.index >= 0 && id.index < num_chunks())
      << "chunk " << id << " outside [0, " << num_chunks() << ")";
  return *chunks_[static_cast<int>(id.type)][id.index];
}

const Chunk& ChunkStore::chunk(ChunkId id) const {
  CHECK(id.index >= 0 && id.index < num_chunks())
      << "chunk " << id << " outside [0, " << num_chunks() << ")";
  return *chunks_[static_cast<int>(id.type)][id.index];
}

absl::StatusOr<ChunkStore::Location> ChunkStore::Locate(TensorId tensor) const {
  if (tensor < 0 || tensor >= static_cast<TensorId>(locations_.size()) ||
      locations_[tensor].chunk_index == kUnplaced) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor id ", tensor, " is not a tensor of this chunk store"));
  }
  return locations_[tensor];
}

absl::StatusOr<TensorState> ChunkStore::tensor_state(ChunkType type, TensorId tensor) const {
  ASSIGN_OR_RETURN(Location loc, Locate(tensor));
  return chunk(type, loc.chunk_index).tensor_state(loc.slot);
}

absl::Status ChunkStore::SetTensorState(ChunkType type, TensorId tensor, TensorState to,
                                        Stream* stream) {
  ASSIGN_OR_RETURN(Location loc, Locate(tensor));
  return chunk(type, loc.chunk_index).SetTensorState(loc.slot, to, stream);
}

absl::Status ChunkStore::SetOperatorState(ChunkType type, OperatorId op, TensorState to,
                                          Stream* stream) {
  if (op < 0 || op >= layout_.num_operator_ids()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown operator id ", op));
  }
  const OperatorInfo& info = layout_.op(op);
  if (!info.placed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator '", info.name, "' has no tensors in any chunk"));
  }
  Chunk& c = chunk(type, info.chunk_index);
  std::vector<int> slots;
  slots.reserve(info.tensors.size());
  for (TensorId id : info.tensors) {
    slots.push_back(locations_[id].slot);
    RETURN_IF_ERROR(c.CheckTransition(slots.back(), to, stream != nullptr));
  }
  for (int slot : slots) RETURN_IF_ERROR(c.SetTensorState(slot, to, stream));
  return absl::OkStatus();
}

absl::StatusOr<TensorView> ChunkStore::View(ChunkType type, TensorId tensor) const {
  ASSIGN_OR_RETURN(Location loc, Locate(tensor));
  return chunk(type, loc.chunk_index).View(loc.slot);
}

int64_t ChunkStore::PayloadBytesOn(Device device) const {
  int64_t bytes = 0;
  for (const auto& of_type : chunks_) {
    for (const auto& c : of_type) {
      if (c->has_payload() && c->device() == device) bytes += c->capacity_bytes();
    }
  }
  return bytes;
}

}  // namespace ps
