// ChunkStore: every runtime chunk of one rank — chunk i of each of the four ChunkTypes for every
// chunk index of a finished ChunkLayout — and the tensor-level entry points the scheduler builds
// on (state of a tensor by id, state of all tensors of an operator, views).
//
// The store owns the layout it was built over (moved in, so it cannot change under the chunks).
// Chunk i of every type is created from the same layout chunk, so the four types hold the same
// tensors at the same offsets by construction. Every chunk starts RELEASED with all tensors FREE;
// payloads are allocated, moved and released through the Chunk objects (chunk/chunk.h) by the
// scheduler, which decides where each chunk lives. Master, momentum and variance chunks of chunks
// this rank does not own exist (so indices are uniform) but can never get a payload.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_CHUNK_CHUNK_STORE_H_
#define PATRICKSTAR_CHUNK_CHUNK_STORE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunk/chunk.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "chunk/tensor_state.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/dtype.h"

namespace ps {

struct ChunkStoreOptions {
  // Element type of the param chunks (f16, bf16 or f32); the others are f32.
  DType compute_dtype = DType::kF16;
  // This process's rank in [0, layout.world_size()).
  int rank = 0;
};

class ChunkStore {
 public:
  // Where a tensor lives: the chunk index (the same for every type) and its slot in that chunk.
  struct Location {
    int64_t chunk_index = kUnplaced;
    int slot = -1;
  };

  // Builds the chunks over `layout`. InvalidArgument for a rank outside [0, world_size);
  // FailedPrecondition if a live tensor is not placed (naming it) or the layout is inconsistent.
  static absl::StatusOr<std::unique_ptr<ChunkStore>> Create(ChunkLayout layout,
                                                            const ChunkStoreOptions& options);

  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  const ChunkLayout& layout() const { return layout_; }
  DType compute_dtype() const { return options_.compute_dtype; }
  int rank() const { return options_.rank; }
  // Chunks per type (padding included).
  int64_t num_chunks() const { return layout_.num_chunks(); }

  // REQUIRES: 0 <= id.index < num_chunks().
  Chunk& chunk(ChunkId id);
  const Chunk& chunk(ChunkId id) const;
  Chunk& chunk(ChunkType type, int64_t index) { return chunk(ChunkId{type, index}); }
  const Chunk& chunk(ChunkType type, int64_t index) const { return chunk(ChunkId{type, index}); }

  // InvalidArgument for an unknown or removed tensor id.
  absl::StatusOr<Location> Locate(TensorId tensor) const;

  absl::StatusOr<TensorState> tensor_state(ChunkType type, TensorId tensor) const;

  // Chunk::SetTensorState on the tensor's chunk of `type` (same errors).
  [[nodiscard]] absl::Status SetTensorState(ChunkType type, TensorId tensor, TensorState to,
                                            Stream* stream = nullptr);

  // Moves every tensor of operator `op` (all in one chunk) to `to`, all or nothing: every
  // transition is checked before any is applied, so an illegal one changes no tensor. (Only a
  // failing zero-fill enqueue on the stream, a broken backend, could stop it part way.)
  [[nodiscard]] absl::Status SetOperatorState(ChunkType type, OperatorId op, TensorState to,
                                              Stream* stream = nullptr);

  // The tensor's elements in its chunk of `type`. FailedPrecondition if that chunk is RELEASED.
  absl::StatusOr<TensorView> View(ChunkType type, TensorId tensor) const;

  // Payload bytes currently on `device`, over all chunks of all types.
  int64_t PayloadBytesOn(Device device) const;

 private:
  ChunkStore(ChunkLayout layout, const ChunkStoreOptions& options)
      : layout_(std::move(layout)), options_(options) {}

  ChunkLayout layout_;
  ChunkStoreOptions options_;
  // chunks_[type][index].
  std::array<std::vector<std::unique_ptr<Chunk>>, kNumChunkTypes> chunks_;
  // Indexed by TensorId; chunk_index kUnplaced for removed tensors.
  std::vector<Location> locations_;
};

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_CHUNK_STORE_H_
