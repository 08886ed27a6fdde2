// The element-wise and row kernels of the vocabulary blocks on the GPU
// (model/kernels/cuda/vocab_blocks.h; launchers in internal/vocab_launchers.h). Indexing and
// device-data errors are vocab_blocks_math.h's (CPU-tested); the LM head's softmax arithmetic is
// softmax_math.h's and cross_entropy_math.h's. Accumulations run in the CPU kernels' order
// (ScatterRowsAdd: tokens increasing per element; PositionEmbeddingBackward: b increasing), so
// those results equal the CPU's bit for bit.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "model/kernels/cross_entropy_math.h"
#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/vocab_launchers.h"
#include "model/kernels/cuda/vocab_blocks_math.h"
#include "model/kernels/softmax_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

__global__ void EmbeddingBlockForwardKernel(int64_t rows, int64_t channels, int64_t vocab,
                                            int64_t row_begin, int64_t block_rows,
                                            const int32_t* __restrict__ tokens, int block_dtype,
                                            const void* __restrict__ block,
                                            float* __restrict__ out) {
  const int64_t n_elems = rows * channels;
  for (int64_t i = GlobalThread(); i < n_elems; i += GridStride()) {
    const int64_t n = i / channels, c = i % channels;
    const int64_t r = cuda::EmbeddingBlockRow(tokens[n], vocab, row_begin, block_rows);
    if (r == cuda::kRowNotInBlock) continue;
    out[i] =
        r == cuda::kRowInvalid ? NAN : cuda::WidenElement(block_dtype, block, r * channels + c);
  }
}

__global__ void ScatterRowsAddKernel(int64_t num_tokens, int64_t channels, int64_t vocab,
                                     int64_t num_slots, const int32_t* __restrict__ tokens,
                                     const int32_t* __restrict__ slot_of_token,
                                     const float* __restrict__ dout,
                                     float* __restrict__ slot_rows) {
  for (int64_t c = GlobalThread(); c < channels; c += GridStride()) {
    for (int64_t n = 0; n < num_tokens; ++n) {
      bool invalid;
      const int32_t slot = cuda::TouchedSlot(slot_of_token, vocab, num_slots, tokens[n], &invalid);
      if (slot < 0) continue;
      slot_rows[static_cast<int64_t>(slot) * channels + c] += dout[n * channels + c];
    }
  }
}

__global__ void CopyRowsToSlotsKernel(int64_t row_begin, int64_t rows, int64_t channels,
                                      int64_t vocab, int64_t num_slots,
                                      const int32_t* __restrict__ slot_of_token,
                                      const float* __restrict__ src,
                                      float* __restrict__ slot_rows) {
  const int64_t n_elems = rows * channels;
  for (int64_t i = GlobalThread(); i < n_elems; i += GridStride()) {
    const int64_t r = i / channels, c = i % channels;
    bool invalid;
    const int32_t slot =
        cuda::TouchedSlot(slot_of_token, vocab, num_slots, row_begin + r, &invalid);
    if (slot >= 0) slot_rows[static_cast<int64_t>(slot) * channels + c] = src[i];
  }
}

__global__ void CopySlotsToRowsKernel(int64_t row_begin, int64_t rows, int64_t channels,
                                      int64_t vocab, int64_t num_slots,
                                      const int32_t* __restrict__ slot_of_token,
                                      const float* __restrict__ slot_rows, int dst_dtype,
                                      void* __restrict__ dst) {
  const int64_t n_elems = rows * channels;
  for (int64_t i = GlobalThread(); i < n_elems; i += GridStride()) {
    const int64_t r = i / channels, c = i % channels;
    bool invalid;
    const int32_t slot =
        cuda::TouchedSlot(slot_of_token, vocab, num_slots, row_begin + r, &invalid);
    if (invalid) {
      cuda::StoreElement(dst_dtype, dst, i, NAN);
    } else if (slot >= 0) {
      cuda::StoreElement(dst_dtype, dst, i, slot_rows[static_cast<int64_t>(slot) * channels + c]);
    }
  }
}

__global__ void PositionEmbeddingForwardKernel(int64_t batch, int64_t seq_len, int64_t channels,
                                               int64_t max_positions,
                                               const int32_t* __restrict__ positions,
                                               const float* __restrict__ wpe,
                                               float* __restrict__ out) {
  const int64_t n_elems = batch * seq_len * channels;
  for (int64_t i = GlobalThread(); i < n_elems; i += GridStride()) {
    const int64_t row = i / channels, c = i % channels;
    const int64_t t = positions == nullptr ? row % seq_len : positions[row];
    if (positions != nullptr && (t < 0 || t >= max_positions)) {
      out[i] = NAN;
      continue;
    }
    out[i] += wpe[t * channels + c];
  }
}

// Positions per thread of PositionEmbeddingBackwardPositionsKernel.
constexpr int64_t kPositionBucket = 32;

// Thread (bucket, c) owns dwpe[p, c] for p in [bucket * 32, bucket * 32 + 32) and adds
// dout[b, t, c] for every (b, t) in increasing order whose position falls there — each element
// of dwpe receives its terms in (b, t) order, as the CPU kernel adds them.
__global__ void PositionEmbeddingBackwardPositionsKernel(int64_t batch, int64_t seq_len,
                                                         int64_t channels, int64_t max_positions,
                                                         const int32_t* __restrict__ positions,
                                                         const float* __restrict__ dout,
                                                         float* __restrict__ dwpe) {
  const int64_t buckets = (max_positions + kPositionBucket - 1) / kPositionBucket;
  const int64_t n_threads = buckets * channels;
  for (int64_t i = GlobalThread(); i < n_threads; i += GridStride()) {
    const int64_t c = i % channels, p0 = (i / channels) * kPositionBucket;
    const int64_t p1 = MinOf<int64_t>(max_positions, p0 + kPositionBucket);
    for (int64_t row = 0; row < batch * seq_len; ++row) {
      const int64_t p = positions[row];
      if (p >= p0 && p < p1) dwpe[p * channels + c] += dout[row * channels + c];
    }
  }
}

__global__ void PositionEmbeddingBackwardKernel(int64_t batch, int64_t seq_len, int64_t channels,
                                                const float* __restrict__ dout,
                                                float* __restrict__ dwpe) {
  const int64_t n_elems = seq_len * channels;
  for (int64_t i = GlobalThread(); i < n_elems; i += GridStride()) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * n_elems + i];
    dwpe[i] = acc;
  }
}

__global__ void LmHeadStateInitKernel(int64_t rows, float* __restrict__ state) {
  for (int64_t i = GlobalThread(); i < 3 * rows; i += GridStride()) {
    state[i] = i < rows ? EmptySoftmaxState<float>().max : 0.0f;
  }
}

// One block: each thread takes every kReduceThreads-th row, then a fixed tree (as the unsplit
// LM head's CrossEntropyMeanLoss).
__global__ void __launch_bounds__(kReduceThreads)
    LmHeadFinishKernel(int64_t rows, int64_t vocab, int32_t ignore_index,
                       const int32_t* __restrict__ targets, const float* __restrict__ state,
                       float* __restrict__ lse, double* __restrict__ loss) {
  __shared__ double sum_s[kReduceThreads];
  __shared__ long long count_s[kReduceThreads];
  const float* run_max = state;
  const float* run_sum = state + rows;
  const float* target_logit = state + 2 * rows;
  double sum = 0.0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kReduceThreads) {
    const float row_lse = SoftmaxLogSumExp(SoftmaxState<float>{run_max[i], run_sum[i]});
    lse[i] = row_lse;
    const int32_t t = targets[i];
    if (t == ignore_index) continue;
    sum += t >= 0 && t < vocab ? CrossEntropyRowLoss(row_lse, target_logit[i])
                               : static_cast<double>(NAN);
    ++count;
  }
  sum_s[threadIdx.x] = sum;
  count_s[threadIdx.x] = count;
  __syncthreads();
  for (int width = kReduceThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) {
      sum_s[threadIdx.x] += sum_s[threadIdx.x + width];
      count_s[threadIdx.x] += count_s[threadIdx.x + width];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = count_s[0] == 0 ? 0.0 : sum_s[0] / static_cast<double>(count_s[0]);
}

}  // namespace

cudaError_t LaunchEmbeddingBlockForward(int64_t rows, int64_t channels, int64_t vocab,
                                        int64_t row_begin, int64_t block_rows,
                                        const int32_t* tokens, int block_dtype, const void* block,
                                        float* out, cudaStream_t stream) {
  EmbeddingBlockForwardKernel<<<GridFor(rows * channels, kThreads), kThreads, 0, stream>>>(
      rows, channels, vocab, row_begin, block_rows, tokens, block_dtype, block, out);
  return cudaGetLastError();
}

cudaError_t LaunchScatterRowsAdd(int64_t num_tokens, int64_t channels, int64_t vocab,
                                 int64_t num_slots, const int32_t* tokens,
                                 const int32_t* slot_of_token, const float* dout, float* slot_rows,
                                 cudaStream_t stream) {
  // 64 threads per block: channels are few (hundreds to thousands), so spread them over SMs.
  ScatterRowsAddKernel<<<GridFor(channels, 64), 64, 0, stream>>>(
      num_tokens, channels, vocab, num_slots, tokens, slot_of_token, dout, slot_rows);
  return cudaGetLastError();
}

cudaError_t LaunchCopyRowsToSlots(int64_t row_begin, int64_t rows, int64_t channels, int64_t vocab,
                                  int64_t num_slots, const int32_t* slot_of_token, const float* src,
                                  float* slot_rows, cudaStream_t stream) {
  CopyRowsToSlotsKernel<<<GridFor(rows * channels, kThreads), kThreads, 0, stream>>>(
      row_begin, rows, channels, vocab, num_slots, slot_of_token, src, slot_rows);
  return cudaGetLastError();
}

cudaError_t LaunchCopySlotsToRows(int64_t row_begin, int64_t rows, int64_t channels, int64_t vocab,
                                  int64_t num_slots, const int32_t* slot_of_token,
                                  const float* slot_rows, int dst_dtype, void* dst,
                                  cudaStream_t stream) {
  CopySlotsToRowsKernel<<<GridFor(rows * channels, kThreads), kThreads, 0, stream>>>(
      row_begin, rows, channels, vocab, num_slots, slot_of_token, slot_rows, dst_dtype, dst);
  return cudaGetLastError();
}

cudaError_t LaunchPositionEmbeddingForward(int64_t batch, int64_t seq_len, int64_t channels,
                                           int64_t max_positions, const int32_t* positions,
                                           const float* wpe, float* out, cudaStream_t stream) {
  PositionEmbeddingForwardKernel<<<GridFor(batch * seq_len * channels, kThreads), kThreads, 0,
                                   stream>>>(batch, seq_len, channels, max_positions, positions,
                                             wpe, out);
  return cudaGetLastError();
}

cudaError_t LaunchPositionEmbeddingBackward(int64_t batch, int64_t seq_len, int64_t channels,
                                            int64_t max_positions, const int32_t* positions,
                                            const float* dout, float* dwpe, cudaStream_t stream) {
  if (positions == nullptr) {
    PositionEmbeddingBackwardKernel<<<GridFor(seq_len * channels, kThreads), kThreads, 0,
                                      stream>>>(batch, seq_len, channels, dout, dwpe);
  } else {
    const int64_t buckets = (max_positions + kPositionBucket - 1) / kPositionBucket;
    PositionEmbeddingBackwardPositionsKernel<<<GridFor(buckets * channels, kThreads), kThreads, 0,
                                               stream>>>(batch, seq_len, channels, max_positions,
                                                         positions, dout, dwpe);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLmHeadStateInit(int64_t rows, float* state, cudaStream_t stream) {
  LmHeadStateInitKernel<<<GridFor(3 * rows, kThreads), kThreads, 0, stream>>>(rows, state);
  return cudaGetLastError();
}

cudaError_t LaunchLmHeadFinish(int64_t rows, int64_t vocab, int32_t ignore_index,
                               const int32_t* targets, const float* state, float* lse, double* loss,
                               cudaStream_t stream) {
  LmHeadFinishKernel<<<1, kReduceThreads, 0, stream>>>(rows, vocab, ignore_index, targets, state,
                                                       lse, loss);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
