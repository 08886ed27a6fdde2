#include "chunk/chunk_type.h"

#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps {

absl::string_view ChunkTypeName(ChunkType type) {
  switch (type) {
    case ChunkType::kParam:
      return "param";
    case ChunkType::kMaster:
      return "master";
    case ChunkType::kMomentum:
      return "momentum";
    case ChunkType::kVariance:
      return "variance";
  }
  return "invalid_chunk_type";
}

std::ostream& operator<<(std::ostream& os, ChunkType type) { return os << ChunkTypeName(type); }

std::string ChunkId::ToString() const { return absl::StrCat(ChunkTypeName(type), "#", index); }

std::ostream& operator<<(std::ostream& os, const ChunkId& id) { return os << id.ToString(); }

}  // namespace ps
