#include "chunk/chunk_layout.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {

absl::StatusOr<ChunkLayout> ChunkLayout::Create(const ChunkLayoutOptions& options) {
  if (options.capacity_elems <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk layout: capacity_elems must be positive (elements per chunk), got ",
                     options.capacity_elems));
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk layout: world_size must be >= 1 (number of data-parallel ranks), got ",
                     options.world_size));
  }
  if (options.tensor_alignment_elems < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk layout: tensor_alignment_elems must be >= 1, got ", options.tensor_alignment_elems));
  }
  return ChunkLayout(options);
}

absl::StatusOr<ChunkLayout> ChunkLayout::Build(const ChunkLayoutOptions& options,
                                               absl::Span<const OperatorSpec> ops,
                                               Placement placement) {
  ASSIGN_OR_RETURN(ChunkLayout layout, Create(options));
  for (const OperatorSpec& spec : ops) {
    RETURN_IF_ERROR(layout.AppendOperator(spec, placement).status());
  }
  return layout;
}

absl::Status ChunkLayout::CheckOperatorId(OperatorId op) const {
  if (op < 0 || op >= num_operator_ids()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown operator id ", op, " (the layout has ",
                                                   num_operator_ids(), " operators)"));
  }
  return absl::OkStatus();
}

void ChunkLayout::CheckChunkIndex(int64_t chunk_index) const {
  CHECK(chunk_index >= 0 && chunk_index < num_chunks())
      << "chunk index " << chunk_index << " outside [0, " << num_chunks() << ")";
}

absl::StatusOr<OperatorId> ChunkLayout::AddOperator(const OperatorSpec& spec) {
  RETURN_IF_ERROR(ValidateOperatorSpec(spec));
  if (op_by_name_.contains(spec.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("operator name '", spec.name, "' is already in the layout"));
  }
  std::vector<int64_t> numels;
  numels.reserve(spec.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    if (tensor_by_name_.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", t.name, "' of operator '",
                                                     spec.name, "' is already in the layout"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (spec.tensors[j].name == t.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("operator '", spec.name, "' lists tensor '", t.name, "' twice"));
      }
    }
    ASSIGN_OR_RETURN(int64_t numel, ShapeNumElems(t.shape));
    numels.push_back(numel);
  }

  const OperatorId op_id = num_operator_ids();
  OperatorInfo op;
  op.id = op_id;
  op.name = spec.name;
  op.trainable = spec.trainable;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    TensorInfo info;
    info.id = num_tensor_ids();
    info.name = spec.tensors[i].name;
    info.shape = spec.tensors[i].shape;
    info.numel = numels[i];
    info.op = op_id;
    tensor_by_name_.emplace(info.name, info.id);
    op.tensors.push_back(info.id);
    op.numel += info.numel;
    tensors_.push_back(std::move(info));
  }
  op_by_name_.emplace(op.name, op_id);
  ops_.push_back(std::move(op));
  return op_id;
}

int64_t ChunkLayout::FindFirstFit(const ChunkSlots& chunk, int64_t numel) const {
  const int64_t capacity = options_.capacity_elems;
  const int64_t alignment = options_.tensor_alignment_elems;
  if (numel > capacity) return kUnplaced;
  int64_t prev_end = 0;
  for (const auto& [offset, id] : chunk.tensors_by_offset) {
    const int64_t candidate = AlignUp(prev_end, alignment);
    if (candidate + numel <= offset) return candidate;
    prev_end = offset + tensors_[id].numel;
  }
  const int64_t candidate = AlignUp(prev_end, alignment);
  return candidate <= capacity - numel ? candidate : kUnplaced;
}

int64_t ChunkLayout::FootprintInEmptyChunk(const OperatorInfo& op) const {
  int64_t end = 0;
  for (TensorId id : op.tensors) {
    end = AlignUp(end, options_.tensor_alignment_elems) + tensors_[id].numel;
  }
  return end;
}

absl::StatusOr<bool> ChunkLayout::TryPlaceOperator(OperatorId op_id, int64_t chunk_index) {
  RETURN_IF_ERROR(CheckOperatorId(op_id));
  OperatorInfo& op = ops_[op_id];
  if (chunk_index < 0 || chunk_index >= num_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot place operator '", op.name, "' in chunk ", chunk_index,
                     ": the layout has ", num_chunks(), " chunks; open one with AddChunk()"));
  }
  if (op.tensors.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator '", op.name, "' has no tensors left to place"));
  }
  if (op.placed()) {
    if (op.chunk_index == chunk_index) return true;
    return absl::FailedPreconditionError(
        absl::StrCat("operator '", op.name, "' is already placed in chunk ", op.chunk_index,
                     "; unplace it before placing it in chunk ", chunk_index));
  }

  if (KindConflicts(chunk_index, op.trainable)) return false;
  const size_t old_num_data_chunks = chunks_.size();
  if (chunk_index >= num_data_chunks()) chunks_.resize(chunk_index + 1);
  ChunkSlots& chunk = chunks_[chunk_index];
  std::vector<TensorId> placed;
  placed.reserve(op.tensors.size());
  bool fits = true;
  for (TensorId id : op.tensors) {
    TensorInfo& t = tensors_[id];
    const int64_t offset = FindFirstFit(chunk, t.numel);
    if (offset == kUnplaced) {
      fits = false;
      break;
    }
    chunk.tensors_by_offset.emplace(offset, id);
    t.chunk_index = chunk_index;
    t.offset_elems = offset;
    placed.push_back(id);
  }
  if (!fits) {
    // Roll back: the chunk returns to exactly its previous contents.
    for (TensorId id : placed) {
      TensorInfo& t = tensors_[id];
      chunk.tensors_by_offset.erase(t.offset_elems);
      t.chunk_index = kUnplaced;
      t.offset_elems = kUnplaced;
    }
    chunks_.resize(old_num_data_chunks);
    return false;
  }
  chunk.used_elems += op.numel;
  placed_elems_ += op.numel;
  if (!op.trainable) frozen_elems_ += op.numel;
  op.chunk_index = chunk_index;
  return true;
}

absl::StatusOr<int64_t> ChunkLayout::PlaceOperator(OperatorId op_id, Placement placement) {
  RETURN_IF_ERROR(CheckOperatorId(op_id));
  const OperatorInfo& op = ops_[op_id];
  if (op.placed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator '", op.name, "' is already placed in chunk ", op.chunk_index));
  }
  if (op.tensors.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator '", op.name, "' has no tensors left to place"));
  }
  const int64_t footprint_elems = FootprintInEmptyChunk(op);
  if (footprint_elems > options_.capacity_elems) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "operator '%s' has %d parameters (%d elements with alignment) but a chunk holds only %d "
        "elements, and all parameters of an operator must share one chunk. Use a chunk size of "
        "at least %d elements (//tools:chunk_size_search finds the least wasteful one), or split "
        "the operator",
        op.name, op.numel, footprint_elems, options_.capacity_elems, footprint_elems));
  }
  std::vector<int64_t> tried;
  if (placement == Placement::kAppend) {
    if (!chunks_.empty()) tried.push_back(num_data_chunks() - 1);
  } else {
    for (int64_t i = 0; i < num_data_chunks(); ++i) tried.push_back(i);
  }
  for (int64_t chunk_index : tried) {
    ASSIGN_OR_RETURN(bool placed, TryPlaceOperator(op_id, chunk_index));
    if (placed) return chunk_index;
  }
  // A new chunk; for world size > 1 a group holding the other kind is completed with empty
  // chunks first, so at most world_size chunks are opened.
  for (int opened = 0; opened < options_.world_size; ++opened) {
    const int64_t chunk_index = AddChunk();
    ASSIGN_OR_RETURN(bool placed, TryPlaceOperator(op_id, chunk_index));
    if (placed) return chunk_index;
    CHECK(KindConflicts(chunk_index, op.trainable))
        << "operator '" << op.name << "' of footprint " << footprint_elems
        << " did not fit an empty chunk of " << options_.capacity_elems;
  }
  return absl::InternalError(absl::StrCat("operator '", op.name,
                                          "' found no chunk of its kind after opening ",
                                          options_.world_size, " new chunks"));
}

absl::StatusOr<OperatorId> ChunkLayout::AppendOperator(const OperatorSpec& spec,
                                                       Placement placement) {
  ASSIGN_OR_RETURN(OperatorId op_id, AddOperator(spec));
  absl::StatusOr<int64_t> placed = PlaceOperator(op_id, placement);
  if (!placed.ok()) {
    // Unregister: the operator and its tensors are the last ids, so popping restores the state.
    const OperatorInfo& op = ops_.back();
    for (TensorId id : op.tensors) tensor_by_name_.erase(tensors_[id].name);
    tensors_.resize(tensors_.size() - op.tensors.size());
    op_by_name_.erase(op.name);
    ops_.pop_back();
    return placed.status();
  }
  return op_id;
}

int64_t ChunkLayout::AddChunk() {
  chunks_.emplace_back();
  return num_data_chunks() - 1;
}

absl::Status ChunkLayout::UnplaceOperator(OperatorId op_id) {
  RETURN_IF_ERROR(CheckOperatorId(op_id));
  OperatorInfo& op = ops_[op_id];
  if (!op.placed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator '", op.name, "' is not placed in any chunk"));
  }
  ChunkSlots& chunk = chunks_[op.chunk_index];
  for (TensorId id : op.tensors) {
    TensorInfo& t = tensors_[id];
    chunk.tensors_by_offset.erase(t.offset_elems);
    t.chunk_index = kUnplaced;
    t.offset_elems = kUnplaced;
  }
  chunk.used_elems -= op.numel;
  placed_elems_ -= op.numel;
  if (!op.trainable) frozen_elems_ -= op.numel;
  op.chunk_index = kUnplaced;
  return absl::OkStatus();
}

absl::Status ChunkLayout::RemoveTensor(TensorId id) {
  if (id < 0 || id >= num_tensor_ids()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown tensor id ", id, " (the layout has ",
                                                   num_tensor_ids(), " tensor ids)"));
  }
  TensorInfo& t = tensors_[id];
  if (!t.live) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", t.name, "' (id ", id, ") was already removed"));
  }
  OperatorInfo& op = ops_[t.op];
  if (t.placed()) {
    ChunkSlots& chunk = chunks_[t.chunk_index];
    chunk.tensors_by_offset.erase(t.offset_elems);
    chunk.used_elems -= t.numel;
    placed_elems_ -= t.numel;
    if (!op.trainable) frozen_elems_ -= t.numel;
  }
  op.tensors.erase(std::find(op.tensors.begin(), op.tensors.end(), id));
  op.numel -= t.numel;
  if (op.tensors.empty()) op.chunk_index = kUnplaced;
  tensor_by_name_.erase(t.name);
  t.live = false;
  t.chunk_index = kUnplaced;
  t.offset_elems = kUnplaced;
  return absl::OkStatus();
}

int64_t ChunkLayout::num_chunks() const { return AlignUp(num_data_chunks(), options_.world_size); }

bool ChunkLayout::is_padding(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  return chunk_index >= num_data_chunks();
}

int64_t ChunkLayout::group_of(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  return chunk_index / options_.world_size;
}

int ChunkLayout::owner_of(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  return static_cast<int>(chunk_index % options_.world_size);
}

std::vector<int64_t> ChunkLayout::ChunksInGroup(int64_t group) const {
  CHECK(group >= 0 && group < num_groups())
      << "group " << group << " outside [0, " << num_groups() << ")";
  std::vector<int64_t> out;
  out.reserve(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r) out.push_back(group * options_.world_size + r);
  return out;
}

bool ChunkLayout::HoldsPayload(ChunkType type, int64_t chunk_index, int rank) const {
  if (owner_of(chunk_index) != rank) return false;
  return type == ChunkType::kParam || (!is_padding(chunk_index) && chunk_trainable(chunk_index));
}

bool ChunkLayout::chunk_trainable(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  if (chunk_index >= num_data_chunks()) return true;
  const ChunkSlots& chunk = chunks_[chunk_index];
  if (chunk.tensors_by_offset.empty()) return true;
  return ops_[tensors_[chunk.tensors_by_offset.begin()->second].op].trainable;
}

bool ChunkLayout::group_frozen(int64_t group) const {
  for (int64_t c : ChunksInGroup(group)) {
    if (!chunk_trainable(c)) return true;
  }
  return false;
}

bool ChunkLayout::KindConflicts(int64_t chunk_index, bool trainable) const {
  const int64_t first = chunk_index / options_.world_size * options_.world_size;
  for (int64_t c = first; c < first + options_.world_size && c < num_data_chunks(); ++c) {
    for (const auto& [offset, id] : chunks_[c].tensors_by_offset) {
      if (ops_[tensors_[id].op].trainable != trainable) return true;
    }
  }
  return false;
}

std::vector<TensorId> ChunkLayout::TensorsInChunk(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  std::vector<TensorId> out;
  if (chunk_index >= num_data_chunks()) return out;
  const ChunkSlots& chunk = chunks_[chunk_index];
  out.reserve(chunk.tensors_by_offset.size());
  for (const auto& [offset, id] : chunk.tensors_by_offset) out.push_back(id);
  return out;
}

int64_t ChunkLayout::num_tensors_in_chunk(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  if (chunk_index >= num_data_chunks()) return 0;
  return static_cast<int64_t>(chunks_[chunk_index].tensors_by_offset.size());
}

int64_t ChunkLayout::used_elems(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  return chunk_index < num_data_chunks() ? chunks_[chunk_index].used_elems : 0;
}

int64_t ChunkLayout::end_elems(int64_t chunk_index) const {
  CheckChunkIndex(chunk_index);
  if (chunk_index >= num_data_chunks()) return 0;
  const ChunkSlots& chunk = chunks_[chunk_index];
  if (chunk.tensors_by_offset.empty()) return 0;
  const auto& [offset, id] = *chunk.tensors_by_offset.rbegin();
  return offset + tensors_[id].numel;
}

const TensorInfo& ChunkLayout::tensor(TensorId id) const {
  CHECK(id >= 0 && id < num_tensor_ids())
      << "tensor id " << id << " outside [0, " << num_tensor_ids() << ")";
  return tensors_[id];
}

const OperatorInfo& ChunkLayout::op(OperatorId id) const {
  CHECK(id >= 0 && id < num_operator_ids())
      << "operator id " << id << " outside [0, " << num_operator_ids() << ")";
  return ops_[id];
}

absl::StatusOr<TensorId> ChunkLayout::FindTensor(absl::string_view name) const {
  auto it = tensor_by_name_.find(name);
  if (it == tensor_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor named '", name, "' in the layout"));
  }
  return it->second;
}

absl::StatusOr<OperatorId> ChunkLayout::FindOperator(absl::string_view name) const {
  auto it = op_by_name_.find(name);
  if (it == op_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no operator named '", name, "' in the layout"));
  }
  return it->second;
}

int64_t ChunkLayout::num_unplaced_tensors() const {
  int64_t n = 0;
  for (const TensorInfo& t : tensors_) n += (t.live && !t.placed()) ? 1 : 0;
  return n;
}

double ChunkLayout::utilization() const {
  const int64_t n = num_chunks();
  if (n == 0) return 0.0;
  return static_cast<double>(placed_elems_) /
         (static_cast<double>(n) * static_cast<double>(options_.capacity_elems));
}

int64_t ChunkLayout::ChunkBytes(ChunkType type, DType compute_dtype) const {
  return options_.capacity_elems * SizeOf(ChunkDType(type, compute_dtype));
}

int64_t ChunkLayout::TotalModelDataBytes(DType compute_dtype) const {
  int64_t bytes = 0;
  for (int64_t i = 0; i < num_chunks(); ++i) {
    // Every chunk is held by exactly one rank, its owner.
    for (ChunkType type : kAllChunkTypes) {
      if (HoldsPayload(type, i, owner_of(i))) bytes += ChunkBytes(type, compute_dtype);
    }
  }
  return bytes;
}

int64_t ChunkLayout::RankModelDataBytes(DType compute_dtype, int rank) const {
  int64_t bytes = 0;
  for (int64_t i = 0; i < num_chunks(); ++i) {
    for (ChunkType type : kAllChunkTypes) {
      if (HoldsPayload(type, i, rank)) bytes += ChunkBytes(type, compute_dtype);
    }
  }
  return bytes;
}

absl::Status ChunkLayout::Validate() const {
  auto fail = [](auto&&... args) { return absl::InternalError(absl::StrCat(args...)); };
  if (num_chunks() % options_.world_size != 0) {
    return fail("chunk count ", num_chunks(), " is not a multiple of world size ",
                options_.world_size);
  }
  int64_t total_placed = 0, total_frozen = 0;
  for (int64_t c = 0; c < num_data_chunks(); ++c) {
    const ChunkSlots& chunk = chunks_[c];
    if (!chunk.tensors_by_offset.empty()) {
      const TensorInfo& first = tensors_[chunk.tensors_by_offset.begin()->second];
      const bool trainable =
          first.op >= 0 && first.op < num_operator_ids() ? ops_[first.op].trainable : true;
      if (KindConflicts(c, trainable)) {
        return fail("chunk ", c, options_.world_size > 1 ? " (or its ZeRO group)" : "",
                    " mixes frozen and trainable operators (tensor '", first.name, "' is ",
                    trainable ? "trainable" : "frozen", ")");
      }
    }
    int64_t prev_end = 0;
    int64_t used = 0;
    for (const auto& [offset, id] : chunk.tensors_by_offset) {
      if (id < 0 || id >= num_tensor_ids()) return fail("chunk ", c, " lists unknown tensor ", id);
      const TensorInfo& t = tensors_[id];
      if (!t.live) return fail("chunk ", c, " holds removed tensor '", t.name, "'");
      if (t.chunk_index != c || t.offset_elems != offset) {
        return fail("tensor '", t.name, "' says chunk ", t.chunk_index, " offset ", t.offset_elems,
                    " but chunk ", c, " has it at offset ", offset);
      }
      if (offset < prev_end) {
        return fail("tensor '", t.name, "' at offset ", offset, " of chunk ", c,
                    " overlaps the previous tensor ending at ", prev_end);
      }
      if (offset % options_.tensor_alignment_elems != 0) {
        return fail("tensor '", t.name, "' at offset ", offset, " of chunk ", c,
                    " is not aligned to ", options_.tensor_alignment_elems);
      }
      if (t.numel <= 0 || offset + t.numel > options_.capacity_elems) {
        return fail("tensor '", t.name, "' [", offset, ", ", offset + t.numel, ") of chunk ", c,
                    " exceeds the capacity ", options_.capacity_elems);
      }
      const OperatorInfo& op = ops_[t.op];
      if (op.chunk_index != c) {
        return fail("tensor '", t.name, "' is in chunk ", c, " but its operator '", op.name,
                    "' is in chunk ", op.chunk_index);
      }
      prev_end = offset + t.numel;
      used += t.numel;
      if (!op.trainable) total_frozen += t.numel;
    }
    if (used != chunk.used_elems) {
      return fail("chunk ", c, " records ", chunk.used_elems, " used elements but holds ", used);
    }
    total_placed += used;
  }
  if (total_placed != placed_elems_) {
    return fail("layout records ", placed_elems_, " placed elements but chunks hold ",
                total_placed);
  }
  if (total_frozen != frozen_elems_) {
    return fail("layout records ", frozen_elems_, " frozen elements but chunks hold ",
                total_frozen);
  }
  int64_t live_tensors = 0;
  for (const TensorInfo& t : tensors_) {
    if (!t.live) {
      if (t.placed()) return fail("removed tensor '", t.name, "' is still placed");
      continue;
    }
    ++live_tensors;
    if (t.placed() && (t.chunk_index >= num_data_chunks() ||
                       !chunks_[t.chunk_index].tensors_by_offset.contains(t.offset_elems) ||
                       chunks_[t.chunk_index].tensors_by_offset.at(t.offset_elems) != t.id)) {
      return fail("tensor '", t.name, "' claims chunk ", t.chunk_index, " offset ", t.offset_elems,
                  " but that chunk does not hold it there");
    }
    auto it = tensor_by_name_.find(t.name);
    if (it == tensor_by_name_.end() || it->second != t.id) {
      return fail("the name index does not map '", t.name, "' to id ", t.id);
    }
  }
  if (static_cast<int64_t>(tensor_by_name_.size()) != live_tensors) {
    return fail("the name index has ", tensor_by_name_.size(), " entries for ", live_tensors,
                " live tensors");
  }
  for (const OperatorInfo& op : ops_) {
    int64_t numel = 0;
    for (TensorId id : op.tensors) {
      const TensorInfo& t = tensors_[id];
      if (!t.live || t.op != op.id) {
        return fail("operator '", op.name, "' lists tensor '", t.name, "' that is not its own");
      }
      if (t.chunk_index != op.chunk_index) {
        return fail("operator '", op.name, "' is in chunk ", op.chunk_index, " but its tensor '",
                    t.name, "' is in chunk ", t.chunk_index, ": an operator must be placed whole");
      }
      numel += t.numel;
    }
    if (numel != op.numel) {
      return fail("operator '", op.name, "' records ", op.numel, " elements but has ", numel);
    }
  }
  return absl::OkStatus();
}

std::string ChunkLayout::DebugString() const {
  std::string out = absl::StrFormat(
      "ChunkLayout: capacity %d elems, world %d, %d chunks (%d padding), %d placed elems "
      "(%d frozen), utilization %.4f\n",
      options_.capacity_elems, options_.world_size, num_chunks(), num_padding_chunks(),
      placed_elems_, frozen_elems_, utilization());
  for (int64_t c = 0; c < num_chunks(); ++c) {
    absl::StrAppendFormat(&out, "  chunk %d (group %d, owner %d%s%s): %d/%d used:", c, group_of(c),
                          owner_of(c), is_padding(c) ? ", padding" : "",
                          chunk_trainable(c) ? "" : ", frozen", used_elems(c),
                          options_.capacity_elems);
    for (TensorId id : TensorsInChunk(c)) {
      absl::StrAppendFormat(&out, " %s@%d+%d", tensors_[id].name, tensors_[id].offset_elems,
                            tensors_[id].numel);
    }
    out += "\n";
  }
  return out;
}

}  // namespace ps
