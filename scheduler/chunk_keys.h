// ChunkKeys: the dense integer keys the scheduler uses for chunks — type * num_chunks + index —
// in the eviction policy, the access schedule, the resident set and the planner.
//
// Thread safety: a value type.
#ifndef PATRICKSTAR_SCHEDULER_CHUNK_KEYS_H_
#define PATRICKSTAR_SCHEDULER_CHUNK_KEYS_H_

#include <cstdint>

#include "chunk/chunk_type.h"

namespace ps {

class ChunkKeys {
 public:
  // `num_chunks`: chunks per type (>= 0).
  explicit constexpr ChunkKeys(int64_t num_chunks) : num_chunks_(num_chunks) {}

  int64_t num_chunks() const { return num_chunks_; }
  int64_t Key(ChunkId id) const { return static_cast<int64_t>(id.type) * num_chunks_ + id.index; }
  int64_t Key(ChunkType type, int64_t index) const { return Key(ChunkId{type, index}); }
  // REQUIRES: 0 <= key < kNumChunkTypes * num_chunks().
  ChunkId IdOf(int64_t key) const {
    return ChunkId{static_cast<ChunkType>(key / num_chunks_), key % num_chunks_};
  }

 private:
  int64_t num_chunks_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_CHUNK_KEYS_H_
