// The per-element arithmetic of the vocabulary-block kernels on the GPU
// (model/kernels/cuda/vocab_blocks.h), as PS_HOST_DEVICE functions so that the CPU tests
// (vocab_blocks_math_test.cc) check, against the CPU kernels of model/kernels/vocab_blocks.h, the
// very code the CUDA kernels run: which row of a block a token reads, which slot a row goes to,
// and what a device-data error (a token outside the vocabulary, a slot outside the buffer) does.
//
// Device-data errors cannot be reported at enqueue (the tokens live on the device), so, as the
// other CUDA kernels of this directory, these functions never index out of bounds and poison
// what the error affects with NaN: an embedding row whose token is outside [0, V) is NaN, a
// touched row copied from a slot outside the buffer is NaN. Scatters whose destination does not
// exist add nothing (the forward's NaN row already made the loss NaN).
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_VOCAB_BLOCKS_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_VOCAB_BLOCKS_MATH_H_

#include <cstdint>

#include "base/host_device.h"
#include "memory/dtype_math.h"

namespace ps::cuda {

// What EmbeddingBlockForward does with one output row.
inline constexpr int64_t kRowNotInBlock = -1;  // another block's row: left alone
inline constexpr int64_t kRowInvalid = -2;     // token outside [0, vocab): the row becomes NaN

// The row of the block that `token` reads (in [0, block_rows)), or kRowNotInBlock, or
// kRowInvalid.
PS_HOST_DEVICE int64_t EmbeddingBlockRow(int32_t token, int64_t vocab_size, int64_t row_begin,
                                         int64_t block_rows) {
  if (token < 0 || token >= vocab_size) return kRowInvalid;
  const int64_t local = static_cast<int64_t>(token) - row_begin;
  return local >= 0 && local < block_rows ? local : kRowNotInBlock;
}

// A stored element widened to f32 exactly (memory/dtype_math.h's conversions). dtype codes are
// ps::DType's: 0 f32, 1 f16, 2 bf16.
PS_HOST_DEVICE float WidenElement(int dtype, const void* data, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == 1 ? HalfBitsToFloat(bits) : BFloat16BitsToFloat(bits);
}

// An f32 value stored as `dtype` (round to nearest even for f16/bf16, as memory/convert.h).
PS_HOST_DEVICE void StoreElement(int dtype, void* data, int64_t i, float x) {
  if (dtype == 0) {
    static_cast<float*>(data)[i] = x;
  } else {
    static_cast<uint16_t*>(data)[i] = dtype == 1 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
  }
}

// The slot of vocabulary row `row` in a touched-rows buffer of `num_slots` rows: >= 0, or -1 when
// the row has none (not touched) — and also -1 when slot_of_token holds a value the buffer cannot
// hold (a device-data error; `*invalid` is then set).
PS_HOST_DEVICE int32_t TouchedSlot(const int32_t* slot_of_token, int64_t vocab_size,
                                   int64_t num_slots, int64_t row, bool* invalid) {
  *invalid = false;
  if (row < 0 || row >= vocab_size) {
    *invalid = true;
    return -1;
  }
  const int32_t slot = slot_of_token[row];
  if (slot < 0) return -1;
  if (slot >= num_slots) {
    *invalid = true;
    return -1;
  }
  return slot;
}

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_VOCAB_BLOCKS_MATH_H_
