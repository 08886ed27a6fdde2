#include "chunk/tensor_state.h"

#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps {

absl::string_view TensorStateName(TensorState state) {
  switch (state) {
    case TensorState::kFree:
      return "FREE";
    case TensorState::kCompute:
      return "COMPUTE";
    case TensorState::kHold:
      return "HOLD";
    case TensorState::kHoldAfterFwd:
      return "HOLD_AFTER_FWD";
    case TensorState::kHoldAfterBwd:
      return "HOLD_AFTER_BWD";
  }
  return "INVALID_TENSOR_STATE";
}

std::ostream& operator<<(std::ostream& os, TensorState state) {
  return os << TensorStateName(state);
}

std::string LegalTargetsString(TensorState from) {
  std::string out;
  for (TensorState to : kAllTensorStates) {
    if (!IsLegalTransition(from, to)) continue;
    if (!out.empty()) out += ", ";
    absl::StrAppend(&out, TensorStateName(to));
  }
  return out;
}

absl::string_view ChunkStateName(ChunkState state) {
  switch (state) {
    case ChunkState::kFree:
      return "FREE";
    case ChunkState::kCompute:
      return "COMPUTE";
    case ChunkState::kHold:
      return "HOLD";
    case ChunkState::kHoldAfterFwd:
      return "HOLD_AFTER_FWD";
    case ChunkState::kHoldAfterBwd:
      return "HOLD_AFTER_BWD";
    case ChunkState::kReleased:
      return "RELEASED";
  }
  return "INVALID_CHUNK_STATE";
}

std::ostream& operator<<(std::ostream& os, ChunkState state) { return os << ChunkStateName(state); }

ChunkState DeriveChunkState(bool has_payload, const TensorStateCounts& counts) {
  if (!has_payload) return ChunkState::kReleased;
  if (counts[static_cast<int>(TensorState::kCompute)] > 0) return ChunkState::kCompute;
  if (counts[static_cast<int>(TensorState::kHold)] > 0) return ChunkState::kHold;
  if (counts[static_cast<int>(TensorState::kHoldAfterFwd)] > 0) return ChunkState::kHoldAfterFwd;
  if (counts[static_cast<int>(TensorState::kHoldAfterBwd)] > 0) return ChunkState::kHoldAfterBwd;
  return ChunkState::kFree;
}

}  // namespace ps
