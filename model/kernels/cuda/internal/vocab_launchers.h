// Launchers of the vocabulary-block kernels (vocab_blocks_kernels.cu), for
// model/kernels/cuda/vocab_blocks.cc. Plain C++ without Abseil (nvcc compiles the .cu that defines
// them). Each enqueues on `stream` and returns cudaGetLastError(); none allocates or
// synchronizes. Shapes are REQUIRED valid (checked by the callers); dimensions are element counts;
// dtype codes are ps::DType's (0 f32, 1 f16, 2 bf16). The per-element rules, device-data errors
// included, are model/kernels/cuda/vocab_blocks_math.h's.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_VOCAB_LAUNCHERS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_VOCAB_LAUNCHERS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace ps::cuda_internal {

// out[n, :] = block[tokens[n] - row_begin, :] widened, for the block's tokens; NaN rows for tokens
// outside [0, vocab).
cudaError_t LaunchEmbeddingBlockForward(int64_t rows, int64_t channels, int64_t vocab,
                                        int64_t row_begin, int64_t block_rows,
                                        const int32_t* tokens, int block_dtype, const void* block,
                                        float* out, cudaStream_t stream);
// slot_rows[slot(tokens[n]), c] += dout[n, c], n increasing for every element (one thread per
// channel walks the tokens in order, as the CPU's tasks do: the same additions in the same order).
cudaError_t LaunchScatterRowsAdd(int64_t num_tokens, int64_t channels, int64_t vocab,
                                 int64_t num_slots, const int32_t* tokens,
                                 const int32_t* slot_of_token, const float* dout, float* slot_rows,
                                 cudaStream_t stream);
// slot_rows[slot(row_begin + r), :] = src[r, :] for the rows with a slot.
cudaError_t LaunchCopyRowsToSlots(int64_t row_begin, int64_t rows, int64_t channels, int64_t vocab,
                                  int64_t num_slots, const int32_t* slot_of_token, const float* src,
                                  float* slot_rows, cudaStream_t stream);
// dst[r, :] = slot_rows[slot(row_begin + r), :] stored as dst_dtype, for the rows with a slot;
// NaN rows where slot_of_token holds a slot outside the buffer.
cudaError_t LaunchCopySlotsToRows(int64_t row_begin, int64_t rows, int64_t channels, int64_t vocab,
                                  int64_t num_slots, const int32_t* slot_of_token,
                                  const float* slot_rows, int dst_dtype, void* dst,
                                  cudaStream_t stream);
// out[b, t, :] += wpe[p, :], p = t, or positions[b*T + t] when positions is not null (then a
// position outside [0, max_positions) makes the row NaN).
cudaError_t LaunchPositionEmbeddingForward(int64_t batch, int64_t seq_len, int64_t channels,
                                           int64_t max_positions, const int32_t* positions,
                                           const float* wpe, float* out, cudaStream_t stream);
// Without positions: dwpe[t, c] += dout[0, t, c], then += dout[1, t, c], ... (b increasing, one
// thread per element). With positions: dwpe[p(b,t), c] += dout[b, t, c] over (b, t) increasing;
// a thread owns channel c of 32 consecutive positions and scans every (b, t); positions outside
// [0, max_positions) add nothing.
cudaError_t LaunchPositionEmbeddingBackward(int64_t batch, int64_t seq_len, int64_t channels,
                                            int64_t max_positions, const int32_t* positions,
                                            const float* dout, float* dwpe, cudaStream_t stream);
// state[0, rows) = -inf (running max), state[rows, 3 rows) = 0 (running sum, target logit).
cudaError_t LaunchLmHeadStateInit(int64_t rows, float* state, cudaStream_t stream);
// lse[n] = log-sum-exp of row n's state; *loss = mean of lse - target logit over the rows whose
// target is not ignore_index (0 if none), in double, in a fixed order (one block); NaN when a
// target is outside [0, vocab) and not ignore_index.
cudaError_t LaunchLmHeadFinish(int64_t rows, int64_t vocab, int32_t ignore_index,
                               const int32_t* targets, const float* state, float* lse, double* loss,
                               cudaStream_t stream);

}  // namespace ps::cuda_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_VOCAB_LAUNCHERS_H_
