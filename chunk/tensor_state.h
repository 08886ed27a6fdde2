// TensorState, its table of legal transitions, and the chunk state derived from tensor states.
//
// Every tensor of every chunk (one per parameter and chunk type) carries a TensorState:
//
//   FREE            no meaningful data; the chunk may drop its payload as far as this tensor goes
//   COMPUTE         an operator is using the data; the chunk may neither move nor be released
//   HOLD            the data is meaningful and must be kept; the chunk may move
//   HOLD_AFTER_FWD  HOLD, and the forward pass has finished with the tensor
//   HOLD_AFTER_BWD  HOLD, and the backward pass has finished with the tensor (for a param chunk
//                   the slot now holds the gradient)
//
// Legal transitions (PatrickStar performs exactly these but never rejects others; we do):
//
//   from \ to        FREE  COMPUTE  HOLD  HOLD_AFTER_FWD  HOLD_AFTER_BWD
//   FREE              -      yes     yes        -               -
//   COMPUTE           -       -      yes       yes             yes
//   HOLD             yes     yes      -         -               -
//   HOLD_AFTER_FWD   yes     yes     yes        -               -
//   HOLD_AFTER_BWD   yes     yes     yes        -               -
//
//  - FREE -> COMPUTE: first use of a tensor with no data; the tensor's view is zero-filled.
//  - FREE -> HOLD: data arrives from outside (all-gather of a remote chunk, initialization).
//  - COMPUTE -> HOLD / HOLD_AFTER_FWD / HOLD_AFTER_BWD: an operator releases the tensor.
//  - HOLD* -> COMPUTE: the next access. HOLD_AFTER_* -> HOLD: the stage marker is reset (end of
//    forward, after the optimizer step). HOLD* -> FREE: the data is dropped (a remote chunk after
//    its group finished a stage, or a payload release).
//  - Everything else, including every self-transition, is illegal: COMPUTE -> FREE would drop data
//    an operator is using; stage markers only come from COMPUTE; re-entering a state hides a
//    bookkeeping error in the caller.
//
// Chunk state (derived, never stored): RELEASED when the chunk has no payload; otherwise the first
// state with a non-zero tensor count in the order COMPUTE > HOLD > HOLD_AFTER_FWD >
// HOLD_AFTER_BWD; otherwise (all tensors FREE, or no tensors) FREE.
//
// Thread safety: pure functions and constants.
#ifndef PATRICKSTAR_CHUNK_TENSOR_STATE_H_
#define PATRICKSTAR_CHUNK_TENSOR_STATE_H_

#include <array>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace ps {

enum class TensorState : uint8_t {
  kFree = 0,
  kCompute = 1,
  kHold = 2,
  kHoldAfterFwd = 3,
  kHoldAfterBwd = 4,
};

inline constexpr int kNumTensorStates = 5;
inline constexpr std::array<TensorState, kNumTensorStates> kAllTensorStates = {
    TensorState::kFree, TensorState::kCompute, TensorState::kHold, TensorState::kHoldAfterFwd,
    TensorState::kHoldAfterBwd};

// "FREE", "COMPUTE", "HOLD", "HOLD_AFTER_FWD", "HOLD_AFTER_BWD".
absl::string_view TensorStateName(TensorState state);
std::ostream& operator<<(std::ostream& os, TensorState state);

// The table above: kLegalTransitions[from][to].
inline constexpr bool kLegalTransitions[kNumTensorStates][kNumTensorStates] = {
    //            FREE   COMPUTE HOLD   H_FWD  H_BWD
    /* FREE    */ {false, true, true, false, false},
    /* COMPUTE */ {false, false, true, true, true},
    /* HOLD    */ {true, true, false, false, false},
    /* H_FWD   */ {true, true, true, false, false},
    /* H_BWD   */ {true, true, true, false, false},
};

constexpr bool IsLegalTransition(TensorState from, TensorState to) {
  return kLegalTransitions[static_cast<int>(from)][static_cast<int>(to)];
}

// The states reachable from `from` in one legal step, for error messages: "COMPUTE, HOLD".
std::string LegalTargetsString(TensorState from);

// A chunk's state, derived from its payload and tensor-state counts.
enum class ChunkState : uint8_t {
  kFree = 0,
  kCompute = 1,
  kHold = 2,
  kHoldAfterFwd = 3,
  kHoldAfterBwd = 4,
  kReleased = 5,
};

// "FREE", "COMPUTE", "HOLD", "HOLD_AFTER_FWD", "HOLD_AFTER_BWD", "RELEASED".
absl::string_view ChunkStateName(ChunkState state);
std::ostream& operator<<(std::ostream& os, ChunkState state);

// Tensor counts indexed by TensorState.
using TensorStateCounts = std::array<int64_t, kNumTensorStates>;

// The derivation rule in the file comment.
ChunkState DeriveChunkState(bool has_payload, const TensorStateCounts& counts);

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_TENSOR_STATE_H_
