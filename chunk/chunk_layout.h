// ChunkLayout: where every parameter lives — which chunk, at which element offset — plus the
// per-operator grouping and the ZeRO communication groups. Pure metadata: building the layout of
// a 10B-parameter model allocates a few hundred kilobytes, never model-sized memory. Runtime
// chunks (payloads, tensor states) are built over a finished layout by chunk/chunk_store.h.
//
// Design:
//  - One placement, four types. A layout is a single placement of tensors into chunks of
//    `capacity_elems` elements. Chunk i of every ChunkType (param, master, momentum, variance)
//    mirrors it: the same tensors at the same element offsets, only the element type differs
//    (chunk/chunk_type.h). The four types are therefore aligned by construction; nothing has to
//    keep four placements in sync (PatrickStar keeps a separate "as ref" placement per type).
//  - Operators are the unit of placement. All tensors of one operator are placed atomically in one
//    chunk or not at all, so one chunk access makes a whole operator resident.
//  - First fit within a chunk. Each tensor of the operator goes into the lowest-offset gap of the
//    chunk that holds it (at an offset aligned to `tensor_alignment_elems`), or after the last
//    tensor. If any tensor of the operator does not fit, the tensors already placed are taken out
//    again (rollback) and the chunk is unchanged. Deletions leave gaps that later inserts fill.
//    Offsets never overlap and never exceed the capacity: tensors of a chunk are kept in an
//    offset-ordered map and every insert is checked against both neighbours (PatrickStar's gap
//    insert can misorder its list and overlap after deletions; Validate() proves we do not).
//  - Choice of chunk: PlaceOperator(kAppend) (the default, as PatrickStar) tries only the last
//    chunk, else opens a new one, so chunks hold operators in model order and the forward pass
//    walks the chunks in index order — the access locality eviction and prefetching rely on.
//    kFirstFit tries every chunk in index order first: denser after deletions, worse locality.
//  - ZeRO grouping for a world of N ranks: chunk i (of every type) belongs to communication group
//    i / N and is owned by rank i % N. Padding chunks — empty, at the end — make the chunk count a
//    multiple of N; they are derived from the number of data chunks, so the count is a multiple of
//    N after every operation. Only the owner of a chunk holds its master/momentum/variance
//    payloads, and padding chunks hold none (they have no parameters); padding param chunks do
//    take part in all-gather/reduce-scatter as their owner's contribution.
//  - Frozen and trainable chunks. An operator is frozen when its spec says trainable = false (a
//    LoRA fine-tune's base model). A chunk holding frozen operators is *frozen*: it has only a
//    param payload (HoldsPayload is false for its master, momentum and variance on every rank),
//    and the optimizer never sees it. A chunk never mixes kinds: an empty chunk takes the kind of
//    the first operator placed in it, TryPlaceOperator refuses an operator of the other kind, and
//    so kAppend opens a new chunk when the kind changes and kFirstFit skips chunks of the other
//    kind. For world_size N > 1 the rule holds per ZeRO group (the N chunks of a group share a
//    kind), so that a group is reduce-scattered or not as a whole; placement then opens empty
//    chunks up to the next group boundary when the kind changes. A chunk (or group) emptied by
//    removals may take either kind again. Empty chunks, padding included, count as trainable.
//
// Ids: tensor and operator ids are dense, assigned in registration order, and never reused.
//
// Thread safety: thread-compatible (const methods may be called concurrently).
#ifndef PATRICKSTAR_CHUNK_CHUNK_LAYOUT_H_
#define PATRICKSTAR_CHUNK_CHUNK_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"

namespace ps {

using TensorId = int64_t;
using OperatorId = int64_t;

// chunk_index / offset_elems of something not placed.
inline constexpr int64_t kUnplaced = -1;

struct TensorInfo {
  TensorId id = -1;
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  OperatorId op = -1;
  // False once RemoveTensor() deleted it; the id stays allocated.
  bool live = true;
  int64_t chunk_index = kUnplaced;
  int64_t offset_elems = kUnplaced;

  bool placed() const { return chunk_index != kUnplaced; }
};

struct OperatorInfo {
  OperatorId id = -1;
  std::string name;
  // Live tensors, in registration order.
  std::vector<TensorId> tensors;
  // Sum of the live tensors' numel.
  int64_t numel = 0;
  int64_t chunk_index = kUnplaced;
  // OperatorSpec::trainable: false for a frozen operator (see "Frozen and trainable chunks").
  bool trainable = true;

  bool placed() const { return chunk_index != kUnplaced; }
};

struct ChunkLayoutOptions {
  // Elements per chunk (the same for every type). Must be > 0.
  int64_t capacity_elems = 0;
  // Ranks sharing the model ZeRO-style. Must be >= 1.
  int world_size = 1;
  // Every tensor offset is a multiple of this. Must be >= 1. GPT shapes give 64-aligned offsets
  // with 1 already (every dimension is a multiple of the hidden size or 64).
  int64_t tensor_alignment_elems = 1;
};

class ChunkLayout {
 public:
  enum class Placement {
    // Try the last data chunk, else open a new chunk (model order; the default).
    kAppend,
    // Try every data chunk in index order, else open a new chunk.
    kFirstFit,
  };

  // InvalidArgument naming the field for a bad option.
  static absl::StatusOr<ChunkLayout> Create(const ChunkLayoutOptions& options);

  // Builds a layout and places every operator of `ops` in order with `placement`.
  static absl::StatusOr<ChunkLayout> Build(const ChunkLayoutOptions& options,
                                           absl::Span<const OperatorSpec> ops,
                                           Placement placement = Placement::kAppend);

  ChunkLayout(const ChunkLayout&) = default;
  ChunkLayout& operator=(const ChunkLayout&) = default;
  ChunkLayout(ChunkLayout&&) = default;
  ChunkLayout& operator=(ChunkLayout&&) = default;

  // --- Building -------------------------------------------------------------------------------

  // Registers an operator and its tensors, unplaced. InvalidArgument for an invalid spec
  // (chunk/operator_spec.h) or an operator/tensor name already in the layout; nothing is
  // registered then.
  [[nodiscard]] absl::StatusOr<OperatorId> AddOperator(const OperatorSpec& spec);

  // Atomically places all tensors of `op` in chunk `chunk_index` by first fit. Returns true when
  // placed (also when `op` is already in that chunk: a no-op), false when they do not all fit or
  // the chunk (for world size > 1: a chunk of its group) holds operators of the other kind
  // (frozen vs trainable) — the layout is then unchanged. A padding chunk index (num_data_chunks()
  // <= chunk_index < num_chunks()) turns that chunk and the ones before it into data chunks if the
  // placement succeeds. Errors: InvalidArgument for an unknown op or a chunk index outside [0,
  // num_chunks()); FailedPrecondition if `op` has no live tensors or is placed in another chunk.
  [[nodiscard]] absl::StatusOr<bool> TryPlaceOperator(OperatorId op, int64_t chunk_index);

  // Places `op` in an existing chunk of its kind chosen by `placement`, or in a new chunk at the
  // end (for world size > 1 possibly after empty chunks that complete a group of the other kind).
  // Returns the chunk index. InvalidArgument if the operator cannot fit even an empty chunk (the
  // message names the operator, its size and the chunk size to use); FailedPrecondition if already
  // placed or without live tensors.
  [[nodiscard]] absl::StatusOr<int64_t> PlaceOperator(OperatorId op,
                                                      Placement placement = Placement::kAppend);

  // AddOperator + PlaceOperator; if placement fails the operator is not registered either.
  [[nodiscard]] absl::StatusOr<OperatorId> AppendOperator(const OperatorSpec& spec,
                                                          Placement placement = Placement::kAppend);

  // Opens a new empty data chunk after the existing data chunks (taking the first padding slot
  // if there is one) and returns its index.
  int64_t AddChunk();

  // Takes every tensor of `op` out of its chunk, leaving a gap; the operator stays registered.
  // InvalidArgument for an unknown op; FailedPrecondition if it is not placed.
  [[nodiscard]] absl::Status UnplaceOperator(OperatorId op);

  // Deletes a tensor from the layout (and from its operator), leaving a gap in its chunk. Its id
  // is not reused; its name becomes free. An operator left without tensors becomes unplaced.
  // InvalidArgument for an unknown id; FailedPrecondition if already removed.
  [[nodiscard]] absl::Status RemoveTensor(TensorId tensor);

  // --- Chunks and ZeRO groups -----------------------------------------------------------------

  int64_t capacity_elems() const { return options_.capacity_elems; }
  int world_size() const { return options_.world_size; }
  int64_t tensor_alignment_elems() const { return options_.tensor_alignment_elems; }
  const ChunkLayoutOptions& options() const { return options_; }

  // Chunks per type, padding included; always a multiple of world_size().
  int64_t num_chunks() const;
  // Chunks that were opened for tensors (a prefix of the chunk indices).
  int64_t num_data_chunks() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t num_padding_chunks() const { return num_chunks() - num_data_chunks(); }
  // REQUIRES for the per-chunk queries below: 0 <= chunk_index < num_chunks().
  bool is_padding(int64_t chunk_index) const;
  // Communication groups: num_chunks() / world_size().
  int64_t num_groups() const { return num_chunks() / options_.world_size; }
  int64_t group_of(int64_t chunk_index) const;
  int owner_of(int64_t chunk_index) const;
  // The chunk indices of group `group`: [group * N, group * N + N). REQUIRES 0 <= group <
  // num_groups().
  std::vector<int64_t> ChunksInGroup(int64_t group) const;
  // Whether `rank` holds the payloads of chunk `chunk_index` of `type` persistently: a param
  // chunk is held by its owner (other ranks hold it only transiently, gathered for use); master,
  // momentum and variance chunks by their owner, and never for padding or frozen chunks.
  bool HoldsPayload(ChunkType type, int64_t chunk_index, int rank) const;
  // False when the chunk holds frozen operators; true when it holds trainable ones or none
  // (empty and padding chunks).
  bool chunk_trainable(int64_t chunk_index) const;
  // Whether the ZeRO group holds frozen operators (then all of its non-empty chunks do).
  // REQUIRES 0 <= group < num_groups().
  bool group_frozen(int64_t group) const;

  // Live tensors of a chunk, ordered by offset. Empty for a padding chunk.
  std::vector<TensorId> TensorsInChunk(int64_t chunk_index) const;
  int64_t num_tensors_in_chunk(int64_t chunk_index) const;
  // Sum of the numel of the tensors in the chunk.
  int64_t used_elems(int64_t chunk_index) const;
  // One past the last element used by a tensor (0 when empty).
  int64_t end_elems(int64_t chunk_index) const;

  // --- Tensors and operators ------------------------------------------------------------------

  // Ids ever assigned: valid ids are [0, num_tensor_ids()), some possibly removed.
  int64_t num_tensor_ids() const { return static_cast<int64_t>(tensors_.size()); }
  int64_t num_operator_ids() const { return static_cast<int64_t>(ops_.size()); }
  // REQUIRES: 0 <= id < num_tensor_ids() (resp. num_operator_ids()).
  const TensorInfo& tensor(TensorId id) const;
  const OperatorInfo& op(OperatorId id) const;
  // NotFound naming the missing name.
  absl::StatusOr<TensorId> FindTensor(absl::string_view name) const;
  absl::StatusOr<OperatorId> FindOperator(absl::string_view name) const;

  // Total numel of placed tensors (= parameters of the model once everything is placed).
  int64_t placed_elems() const { return placed_elems_; }
  // placed_elems() split by kind: tensors of trainable and of frozen operators.
  int64_t trainable_elems() const { return placed_elems_ - frozen_elems_; }
  int64_t frozen_elems() const { return frozen_elems_; }
  // Number of live tensors not placed in any chunk.
  int64_t num_unplaced_tensors() const;
  // placed_elems() / (num_chunks() * capacity_elems()); 0 for an empty layout.
  double utilization() const;

  // --- Model-data bytes -----------------------------------------------------------------------

  // Payload bytes of one chunk of `type`: capacity_elems * SizeOf(ChunkDType(type, compute)).
  int64_t ChunkBytes(ChunkType type, DType compute_dtype) const;
  // Model-data bytes of the whole layout over all ranks: every param chunk (padding included)
  // plus master/momentum/variance for every trainable data chunk (frozen chunks are param-only).
  // For world_size 1, no padding and no frozen chunk this is
  // ModelDataBytesPerParam(compute) * num_chunks() * capacity_elems().
  int64_t TotalModelDataBytes(DType compute_dtype) const;
  // The bytes `rank` holds persistently (HoldsPayload summed over chunks and types).
  int64_t RankModelDataBytes(DType compute_dtype, int rank) const;

  // --- Checking -------------------------------------------------------------------------------

  // Checks every invariant: offsets in bounds, aligned and non-overlapping, each chunk's index
  // consistent with the tensors, every placed operator's tensors in its chunk and no unplaced
  // operator with placed tensors, used_elems, placed_elems and frozen_elems sums, the name
  // indexes, no chunk (or ZeRO group) mixing frozen and trainable operators. Internal error
  // describing the first violation.
  [[nodiscard]] absl::Status Validate() const;

  // One line per chunk: index, owner, group, "frozen" for a frozen chunk, used/capacity, tensors
  // with offsets.
  std::string DebugString() const;

 private:
  struct ChunkSlots {
    // offset_elems -> tensor id.
    absl::btree_map<int64_t, TensorId> tensors_by_offset;
    int64_t used_elems = 0;
  };

  explicit ChunkLayout(const ChunkLayoutOptions& options) : options_(options) {}

  // The offset where first fit puts `numel` elements in `chunk`, or kUnplaced.
  int64_t FindFirstFit(const ChunkSlots& chunk, int64_t numel) const;
  // Elements the operator's tensors span when placed from offset 0 of an empty chunk.
  int64_t FootprintInEmptyChunk(const OperatorInfo& op) const;
  // Whether chunk `chunk_index` (for world size > 1: any chunk of its group) holds an operator
  // whose kind differs from `trainable`.
  bool KindConflicts(int64_t chunk_index, bool trainable) const;
  absl::Status CheckOperatorId(OperatorId op) const;
  void CheckChunkIndex(int64_t chunk_index) const;

  ChunkLayoutOptions options_;
  std::vector<TensorInfo> tensors_;
  std::vector<OperatorInfo> ops_;
  absl::flat_hash_map<std::string, TensorId> tensor_by_name_;
  absl::flat_hash_map<std::string, OperatorId> op_by_name_;
  std::vector<ChunkSlots> chunks_;
  int64_t placed_elems_ = 0;
  // Placed elements of frozen operators.
  int64_t frozen_elems_ = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_CHUNK_LAYOUT_H_
