// RMSNorm on the GPU (see model/kernels/rmsnorm.h for the math). One warp per row for the forward
// and for dx: the lanes take strided partial sums over the channels, combined by a butterfly
// reduction, and apply model/kernels/rmsnorm_math.h's per-element functions — the ones the CPU
// kernel calls. dw is a column reduction over rows: a 32 x 32 block per 32 channels, each thread
// summing every 32nd row, partials added in a fixed order (deterministic, no atomics).
//
// The only differences from the CPU are rounding: the order of the row and column sums, and the
// multiply-adds nvcc may fuse.
#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/llama_launchers.h"
#include "model/kernels/rmsnorm_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void RmsNormForwardKernel(int64_t rows, int64_t channels, float eps, float offset,
                                     const float* __restrict__ x, const float* __restrict__ w,
                                     float* __restrict__ y, float* __restrict__ rstd) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // warp-uniform
  const float* xr = x + r * channels;
  float sq = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarpSize) sq += xr[c] * xr[c];
  const float s = RmsNormRstd(WarpSum(sq), channels, eps);
  float* yr = y + r * channels;
  for (int64_t c = lane; c < channels; c += kWarpSize) {
    yr[c] = RmsNormOutput(xr[c], s, offset + w[c]);
  }
  if (lane == 0) rstd[r] = s;
}

__global__ void RmsNormInputGradKernel(int64_t rows, int64_t channels, float offset,
                                       const float* __restrict__ x,
                                       const float* __restrict__ w, const float* __restrict__ rstd,
                                       const float* __restrict__ dy, float* __restrict__ dx) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // warp-uniform
  const float* xr = x + r * channels;
  const float* dyr = dy + r * channels;
  const float s = rstd[r];
  float g_xhat = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarpSize) {
    g_xhat += RmsNormGradTerm(dyr[c], offset + w[c], xr[c], s);
  }
  const float g_xhat_mean = WarpSum(g_xhat) / static_cast<float>(channels);
  float* dxr = dx + r * channels;
  for (int64_t c = lane; c < channels; c += kWarpSize) {
    dxr[c] += RmsNormInputGrad(dyr[c], offset + w[c], xr[c], s, g_xhat_mean);
  }
}

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 32;

__global__ void RmsNormWeightGradKernel(int64_t rows, int64_t channels, const float* __restrict__ x,
                                        const float* __restrict__ rstd,
                                        const float* __restrict__ dy, float* __restrict__ dw) {
  __shared__ float part[kRowLanes][kColumnTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  float acc = 0.0f;
  if (c < channels) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      acc += RmsNormWeightGradTerm(dy[r * channels + c], x[r * channels + c], rstd[r]);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    float sum = 0.0f;
    for (int yy = 0; yy < kRowLanes; ++yy) sum += part[yy][threadIdx.x];
    dw[c] += sum;
  }
}

unsigned int RowBlocks(int64_t rows) {
  return static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

cudaError_t LaunchRmsNormForward(int64_t rows, int64_t channels, float eps, float weight_offset,
                                 const float* x, const float* w, float* y, float* rstd,
                                 cudaStream_t stream) {
  RmsNormForwardKernel<<<RowBlocks(rows), kWarpsPerBlock * kWarpSize, 0, stream>>>(
      rows, channels, eps, weight_offset, x, w, y, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBackward(int64_t rows, int64_t channels, float weight_offset,
                                  const float* x, const float* w, const float* rstd,
                                  const float* dy, float* dx, float* dw, cudaStream_t stream) {
  RmsNormInputGradKernel<<<RowBlocks(rows), kWarpsPerBlock * kWarpSize, 0, stream>>>(
      rows, channels, weight_offset, x, w, rstd, dy, dx);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (dw == nullptr) return cudaSuccess;  // input gradient only
  const unsigned int blocks = static_cast<unsigned int>((channels + kColumnTile - 1) / kColumnTile);
  RmsNormWeightGradKernel<<<blocks, dim3(kColumnTile, kRowLanes), 0, stream>>>(rows, channels, x,
                                                                               rstd, dy, dw);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
