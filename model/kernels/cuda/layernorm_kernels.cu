// LayerNorm on the GPU (see model/kernels/layernorm.h for the math). One warp
// per row for the forward and for dx: the lanes take strided partial sums over
// the channels, combined by a butterfly reduction, and apply
// model/kernels/layernorm_math.h's per-element functions — the ones the CPU
// kernel calls. dw and db are column reductions over rows, computed like the
// Conv1D bias gradient: a 32 x 32 block per 32 channels, each thread summing
// every 32nd row, partials added in a fixed order.
//
// The only differences from the CPU are rounding: the CPU sums a row in index
// order, the GPU in 32 strided partial sums and a tree; nvcc may fuse
// multiply-adds.
#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/layernorm_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void LayerNormForwardKernel(int64_t rows, int64_t channels, float eps,
                                       const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ b, float* __restrict__ y,
                                       float* __restrict__ mean, float* __restrict__ rstd) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // warp-uniform
  const float* xr = x + r * channels;
  float sum = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarpSize) sum += xr[c];
  const float m = LayerNormMean(WarpSum(sum), channels);
  float sq = 0.0f;  // two passes, as on the CPU: no cancellation when |mean| >> std
  for (int64_t c = lane; c < channels; c += kWarpSize) sq += (xr[c] - m) * (xr[c] - m);
  const float s = LayerNormRstd(WarpSum(sq), channels, eps);
  float* yr = y + r * channels;
  for (int64_t c = lane; c < channels; c += kWarpSize)
    yr[c] = LayerNormOutput(xr[c], m, s, w[c], b[c]);
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

__global__ void LayerNormInputGradKernel(int64_t rows, int64_t channels,
                                         const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ mean,
                                         const float* __restrict__ rstd,
                                         const float* __restrict__ dy, float* __restrict__ dx) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // warp-uniform
  const float* xr = x + r * channels;
  const float* dyr = dy + r * channels;
  const float m = mean[r], s = rstd[r];
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarpSize) {
    const LayerNormGradTerms<float> t = LayerNormBackwardTerms(dyr[c], w[c], xr[c], m, s);
    g_sum += t.g;
    g_xhat_sum += t.g_xhat;
  }
  const float g_mean = LayerNormMean(WarpSum(g_sum), channels);
  const float g_xhat_mean = LayerNormMean(WarpSum(g_xhat_sum), channels);
  float* dxr = dx + r * channels;
  for (int64_t c = lane; c < channels; c += kWarpSize) {
    dxr[c] += LayerNormInputGrad(dyr[c], w[c], xr[c], m, s, g_mean, g_xhat_mean);
  }
}

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 32;

__global__ void LayerNormParamGradKernel(int64_t rows, int64_t channels,
                                         const float* __restrict__ x,
                                         const float* __restrict__ mean,
                                         const float* __restrict__ rstd,
                                         const float* __restrict__ dy, float* __restrict__ dw,
                                         float* __restrict__ db) {
  __shared__ float dw_part[kRowLanes][kColumnTile + 1];
  __shared__ float db_part[kRowLanes][kColumnTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  float dw_acc = 0.0f, db_acc = 0.0f;
  if (c < channels) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const float d = dy[r * channels + c];
      dw_acc += LayerNormWeightGradTerm(d, x[r * channels + c], mean[r], rstd[r]);
      db_acc += d;
    }
  }
  dw_part[threadIdx.y][threadIdx.x] = dw_acc;
  db_part[threadIdx.y][threadIdx.x] = db_acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    float dw_sum = 0.0f, db_sum = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) {
      dw_sum += dw_part[y][threadIdx.x];
      db_sum += db_part[y][threadIdx.x];
    }
    if (dw != nullptr) dw[c] += dw_sum;
    if (db != nullptr) db[c] += db_sum;
  }
}

unsigned int RowBlocks(int64_t rows) {
  return static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

cudaError_t LaunchLayerNormForward(int64_t rows, int64_t channels, float eps, const float* x,
                                   const float* w, const float* b, float* y, float* mean,
                                   float* rstd, cudaStream_t stream) {
  LayerNormForwardKernel<<<RowBlocks(rows), kWarpsPerBlock * kWarpSize, 0, stream>>>(
      rows, channels, eps, x, w, b, y, mean, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(int64_t rows, int64_t channels, const float* x, const float* w,
                                    const float* mean, const float* rstd, const float* dy,
                                    float* dx, float* dw, float* db, cudaStream_t stream) {
  LayerNormInputGradKernel<<<RowBlocks(rows), kWarpsPerBlock * kWarpSize, 0, stream>>>(
      rows, channels, x, w, mean, rstd, dy, dx);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (dw == nullptr && db == nullptr) return cudaSuccess;  // input gradient only
  const unsigned int blocks = static_cast<unsigned int>((channels + kColumnTile - 1) / kColumnTile);
  LayerNormParamGradKernel<<<blocks, dim3(kColumnTile, kRowLanes), 0, stream>>>(
      rows, channels, x, mean, rstd, dy, dw, db);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
