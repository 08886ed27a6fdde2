// The row passes of the fused LM head + cross-entropy on the GPU (see
// model/kernels/lm_head_cross_entropy.h for the math and
// model/kernels/cuda/lm_head_cross_entropy.h for the tiling); the GEMMs
// producing and consuming each logits tile are cuBLAS calls made by the host
// code. The arithmetic is model/kernels/cross_entropy_math.h's and
// softmax_math.h's.
//
// Forward tile: one block per row; each thread folds its strided columns into a
// SoftmaxState (SoftmaxAdd), the block merges the 256 states in a fixed tree
// (SoftmaxMerge, which handles the empty states of threads without columns),
// and thread 0 merges the tile into the row's running state. The CPU takes a
// tile max first and then one sum; results agree to rounding.
//
// Reductions to a scalar (the mean loss, the number of valid targets) run in
// one block in a fixed order, in double, so they are reproducible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "model/kernels/cross_entropy_math.h"
#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/softmax_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kRowThreads = 256;
constexpr int kReduceThreads = 1024;

__device__ bool ValidTarget(int32_t t, int64_t vocab) { return t >= 0 && t < vocab; }

__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyForwardTileKernel(int64_t vocab_tile, int64_t v0, const float* __restrict__ z,
                                  const int32_t* __restrict__ targets, float* __restrict__ run_max,
                                  float* __restrict__ run_sum, float* __restrict__ target_logit) {
  __shared__ float max_s[kRowThreads];
  __shared__ float sum_s[kRowThreads];
  const int64_t i = blockIdx.x;
  const float* zi = z + i * vocab_tile;
  const int64_t t = targets[i];
  SoftmaxState<float> state = EmptySoftmaxState<float>();
  for (int64_t v = threadIdx.x; v < vocab_tile; v += kRowThreads) {
    state = SoftmaxAdd(state, zi[v]);
    if (v0 + v == t) target_logit[i] = zi[v];
  }
  max_s[threadIdx.x] = state.max;
  sum_s[threadIdx.x] = state.sum;
  __syncthreads();
  for (int width = kRowThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) {
      const SoftmaxState<float> merged =
          SoftmaxMerge(SoftmaxState<float>{max_s[threadIdx.x], sum_s[threadIdx.x]},
                       SoftmaxState<float>{max_s[threadIdx.x + width], sum_s[threadIdx.x + width]});
      max_s[threadIdx.x] = merged.max;
      sum_s[threadIdx.x] = merged.sum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const SoftmaxState<float> running =
        v0 == 0 ? EmptySoftmaxState<float>() : SoftmaxState<float>{run_max[i], run_sum[i]};
    const SoftmaxState<float> merged =
        SoftmaxMerge(running, SoftmaxState<float>{max_s[0], sum_s[0]});
    run_max[i] = merged.max;
    run_sum[i] = merged.sum;
  }
}

__global__ void CrossEntropyFinishRowsKernel(int64_t rows, int64_t vocab, int32_t ignore_index,
                                             const int32_t* __restrict__ targets,
                                             const float* __restrict__ run_max,
                                             const float* __restrict__ run_sum,
                                             const float* __restrict__ target_logit,
                                             float* __restrict__ lse,
                                             double* __restrict__ row_loss) {
  for (int64_t i = GlobalThread(); i < rows; i += GridStride()) {
    const float row_lse = SoftmaxLogSumExp(SoftmaxState<float>{run_max[i], run_sum[i]});
    lse[i] = row_lse;
    const int32_t t = targets[i];
    row_loss[i] = t == ignore_index       ? 0.0
                  : ValidTarget(t, vocab) ? CrossEntropyRowLoss(row_lse, target_logit[i])
                                          : static_cast<double>(NAN);
  }
}

// One block: sums (in double) and counts with each thread taking every
// kReduceThreads-th row, then a fixed tree.
__global__ void __launch_bounds__(kReduceThreads)
    CrossEntropyMeanLossKernel(int64_t rows, int32_t ignore_index,
                               const int32_t* __restrict__ targets,
                               const double* __restrict__ row_loss, double* __restrict__ loss) {
  __shared__ double sum_s[kReduceThreads];
  __shared__ long long count_s[kReduceThreads];
  double sum = 0.0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kReduceThreads) {
    if (targets[i] == ignore_index) continue;
    sum += row_loss[i];
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

__global__ void __launch_bounds__(kReduceThreads)
    CrossEntropyGradScaleKernel(int64_t rows, int32_t ignore_index,
                                const int32_t* __restrict__ targets, double loss_grad,
                                float* __restrict__ scale) {
  __shared__ long long count_s[kReduceThreads];
  long long count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kReduceThreads) count += targets[i] != ignore_index;
  count_s[threadIdx.x] = count;
  __syncthreads();
  for (int width = kReduceThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) count_s[threadIdx.x] += count_s[threadIdx.x + width];
    __syncthreads();
  }
  // As the CPU: the loss is the constant 0 without valid targets, so is its
  // gradient.
  if (threadIdx.x == 0) {
    *scale =
        count_s[0] == 0 ? 0.0f : static_cast<float>(loss_grad / static_cast<double>(count_s[0]));
  }
}

__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyBackwardTileKernel(int64_t vocab_tile, int64_t v0, int64_t vocab,
                                   int32_t ignore_index, const int32_t* __restrict__ targets,
                                   const float* __restrict__ lse, const float* __restrict__ scale,
                                   float* __restrict__ dz) {
  const int64_t i = blockIdx.x;
  float* zi = dz + i * vocab_tile;
  const int32_t t = targets[i];
  if (t == ignore_index || !ValidTarget(t, vocab)) {
    const float fill = t == ignore_index ? 0.0f : NAN;
    for (int64_t v = threadIdx.x; v < vocab_tile; v += kRowThreads) zi[v] = fill;
    return;
  }
  const float row_lse = lse[i], s = *scale;
  for (int64_t v = threadIdx.x; v < vocab_tile; v += kRowThreads) {
    zi[v] = CrossEntropyLogitGrad(zi[v], row_lse, s, v0 + v == t);
  }
}

}  // namespace

cudaError_t LaunchCrossEntropyForwardTile(int64_t rows, int64_t vocab_tile, int64_t v0,
                                          const float* z, const int32_t* targets, float* run_max,
                                          float* run_sum, float* target_logit,
                                          cudaStream_t stream) {
  CrossEntropyForwardTileKernel<<<static_cast<unsigned int>(rows), kRowThreads, 0, stream>>>(
      vocab_tile, v0, z, targets, run_max, run_sum, target_logit);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyFinishRows(int64_t rows, int64_t vocab, int32_t ignore_index,
                                         const int32_t* targets, const float* run_max,
                                         const float* run_sum, const float* target_logit,
                                         float* lse, double* row_loss, cudaStream_t stream) {
  CrossEntropyFinishRowsKernel<<<GridFor(rows, kRowThreads), kRowThreads, 0, stream>>>(
      rows, vocab, ignore_index, targets, run_max, run_sum, target_logit, lse, row_loss);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyMeanLoss(int64_t rows, int32_t ignore_index, const int32_t* targets,
                                       const double* row_loss, double* loss, cudaStream_t stream) {
  CrossEntropyMeanLossKernel<<<1, kReduceThreads, 0, stream>>>(rows, ignore_index, targets,
                                                               row_loss, loss);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyGradScale(int64_t rows, int32_t ignore_index, const int32_t* targets,
                                        double loss_grad, float* scale, cudaStream_t stream) {
  CrossEntropyGradScaleKernel<<<1, kReduceThreads, 0, stream>>>(rows, ignore_index, targets,
                                                                loss_grad, scale);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackwardTile(int64_t rows, int64_t vocab_tile, int64_t v0,
                                           int64_t vocab, int32_t ignore_index,
                                           const int32_t* targets, const float* lse,
                                           const float* scale, float* dz, cudaStream_t stream) {
  CrossEntropyBackwardTileKernel<<<static_cast<unsigned int>(rows), kRowThreads, 0, stream>>>(
      vocab_tile, v0, vocab, ignore_index, targets, lse, scale, dz);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
