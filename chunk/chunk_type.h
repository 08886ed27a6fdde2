// ChunkType and ChunkId: the four kinds of model data a chunk can hold, and the name of one chunk.
//
// Model data (arXiv:2108.05818 §3) lives in four parallel families of chunks:
//
//   type       dtype          holds
//   kParam     compute dtype  the parameters used by forward/backward; after a parameter's last
//                             backward use its slot is overwritten by its gradient (no separate
//                             gradient storage)
//   kMaster    f32            the f32 master copy of every parameter
//   kMomentum  f32            Adam's first moment
//   kVariance  f32            Adam's second moment
//
// Chunk i of every type holds the same parameters at the same element offsets (one placement,
// see chunk/chunk_layout.h), so model data costs SizeOf(compute) + 12 bytes per parameter:
// 14 with f16/bf16 compute, 16 with f32 compute.
//
// Thread safety: everything here is a value type or a pure function.
#ifndef PATRICKSTAR_CHUNK_CHUNK_TYPE_H_
#define PATRICKSTAR_CHUNK_CHUNK_TYPE_H_

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "memory/dtype.h"

namespace ps {

enum class ChunkType : uint8_t { kParam = 0, kMaster = 1, kMomentum = 2, kVariance = 3 };

inline constexpr int kNumChunkTypes = 4;
inline constexpr std::array<ChunkType, kNumChunkTypes> kAllChunkTypes = {
    ChunkType::kParam, ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance};

// "param", "master", "momentum", "variance".
absl::string_view ChunkTypeName(ChunkType type);
std::ostream& operator<<(std::ostream& os, ChunkType type);

// True for the optimizer-state types (master, momentum, variance): with ZeRO data parallelism only
// the owner rank of a chunk ever holds their payloads.
constexpr bool IsOptimizerState(ChunkType type) { return type != ChunkType::kParam; }

// The element type of a chunk of `type` when parameters are computed in `compute_dtype`.
constexpr DType ChunkDType(ChunkType type, DType compute_dtype) {
  return type == ChunkType::kParam ? compute_dtype : DType::kF32;
}

// Bytes of model data per parameter over the four types: 14 for f16/bf16, 16 for f32.
constexpr int64_t ModelDataBytesPerParam(DType compute_dtype) {
  int64_t bytes = 0;
  for (ChunkType type : kAllChunkTypes) bytes += SizeOf(ChunkDType(type, compute_dtype));
  return bytes;
}

// Names one chunk: its type and its index among the chunks of that type (the same index names the
// mirrored chunk of every other type). Printed as "param#3".
struct ChunkId {
  ChunkType type = ChunkType::kParam;
  int64_t index = 0;

  std::string ToString() const;

  friend bool operator==(const ChunkId& a, const ChunkId& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const ChunkId& a, const ChunkId& b) { return !(a == b); }
  friend bool operator<(const ChunkId& a, const ChunkId& b) {
    return a.type != b.type ? a.type < b.type : a.index < b.index;
  }
  template <typename H>
  friend H AbslHashValue(H h, const ChunkId& id) {
    return H::combine(std::move(h), static_cast<int>(id.type), id.index);
  }
};

std::ostream& operator<<(std::ostream& os, const ChunkId& id);

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_CHUNK_TYPE_H_
