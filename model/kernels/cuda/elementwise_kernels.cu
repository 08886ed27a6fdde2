// Element-wise CUDA kernels of model/kernels/cuda: encoder, GELU, residual, the
// bias broadcast and column sums of the Conv1D (matmul) layer. Memory-bound;
// grid-stride loops over elements. The GELU arithmetic is
// model/kernels/gelu_math.h's, the same functions the CPU kernel calls.
//
// Determinism: reductions (encoder backward, column sums) give every output
// element to exactly one thread, which adds its terms in a fixed order, so
// results do not depend on scheduling. The encoder backward adds in exactly the
// CPU kernel's order (rows ascending), so it matches it bit for bit.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/gelu_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kThreads = 256;

__global__ void EncoderForwardKernel(int64_t rows, int64_t seq_len, int64_t channels, int64_t vocab,
                                     const int32_t* __restrict__ tokens,
                                     const float* __restrict__ wte, const float* __restrict__ wpe,
                                     float* __restrict__ out) {
  const int64_t n = rows * channels;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t row = i / channels, c = i % channels;
    const int32_t token = tokens[row];
    out[i] = token >= 0 && token < vocab ? wte[static_cast<int64_t>(token) * channels + c] +
                                               wpe[(row % seq_len) * channels + c]
                                         : NAN;
  }
}

// The wte scatter is a reduction over rows sharing a token. Thread (c, k) owns
// channel c of every vocabulary row v with v % kBuckets == k: it walks all rows
// in order and adds those whose token is in its bucket, so each (v, c) has one
// owner adding rows in increasing order, like the CPU kernel.
constexpr int kBuckets = 64;
constexpr int kBucketsPerBlock = kThreads / 32;

__global__ void EncoderWteBackwardKernel(int64_t rows, int64_t channels, int64_t vocab,
                                         const int32_t* __restrict__ tokens,
                                         const float* __restrict__ dout, float* __restrict__ dwte) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int bucket = blockIdx.y * kBucketsPerBlock + threadIdx.y;
  if (c >= channels) return;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t token = tokens[r];
    if (token < 0 || token >= vocab || token % kBuckets != bucket) continue;
    dwte[static_cast<int64_t>(token) * channels + c] += dout[r * channels + c];
  }
}

// dwpe[t, c] += dout[b, t, c] for b ascending: one thread per (t, c).
__global__ void EncoderWpeBackwardKernel(int64_t batch, int64_t seq_len, int64_t channels,
                                         const float* __restrict__ dout, float* __restrict__ dwpe) {
  const int64_t n = seq_len * channels;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * n + i];
    dwpe[i] = acc;
  }
}

__global__ void GeluForwardKernel(int64_t n, const float* x, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) y[i] = GeluTanh(x[i]);
}

__global__ void GeluBackwardKernel(int64_t n, const float* __restrict__ x,
                                   const float* __restrict__ dy, float* __restrict__ dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    dx[i] += dy[i] * GeluTanhDerivative(x[i]);
  }
}

// out may alias a or b: no __restrict__.
__global__ void ResidualForwardKernel(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) out[i] = a[i] + b[i];
}

__global__ void ScaleInPlaceKernel(int64_t n, float alpha, float* x) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) x[i] *= alpha;
}

__global__ void ResidualBackwardKernel(int64_t n, const float* __restrict__ dout,
                                       float* __restrict__ da, float* __restrict__ db) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

__global__ void BroadcastRowsKernel(int64_t rows, int64_t cols, const float* __restrict__ bias,
                                    float* __restrict__ y) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) y[i] = bias[i % cols];
}

// Block (32 x 32) per 32 columns: thread (x, y) sums rows y, y + 32, ... of
// column x; the 32 partial sums are then added in y order. Fixed order, no
// atomics.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 32;

__global__ void ColumnSumsKernel(int64_t rows, int64_t cols, const float* __restrict__ dy,
                                 float* __restrict__ db) {
  __shared__ float partial[kRowLanes][kColumnTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += dy[r * cols + c];
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sum = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) sum += partial[y][threadIdx.x];
    db[c] += sum;
  }
}

}  // namespace

cudaError_t LaunchEncoderForward(int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab,
                                 const int32_t* tokens, const float* wte, const float* wpe,
                                 float* out, cudaStream_t stream) {
  const int64_t rows = batch * seq_len;
  EncoderForwardKernel<<<GridFor(rows * channels, kThreads), kThreads, 0, stream>>>(
      rows, seq_len, channels, vocab, tokens, wte, wpe, out);
  return cudaGetLastError();
}

cudaError_t LaunchEncoderBackward(int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab,
                                  const int32_t* tokens, const float* dout, float* dwte,
                                  float* dwpe, cudaStream_t stream) {
  const dim3 wte_grid(static_cast<unsigned int>((channels + 31) / 32), kBuckets / kBucketsPerBlock);
  EncoderWteBackwardKernel<<<wte_grid, dim3(32, kBucketsPerBlock), 0, stream>>>(
      batch * seq_len, channels, vocab, tokens, dout, dwte);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  EncoderWpeBackwardKernel<<<GridFor(seq_len * channels, kThreads), kThreads, 0, stream>>>(
      batch, seq_len, channels, dout, dwpe);
  return cudaGetLastError();
}

cudaError_t LaunchGeluForward(int64_t n, const float* x, float* y, cudaStream_t stream) {
  GeluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(int64_t n, const float* x, const float* dy, float* dx,
                               cudaStream_t stream) {
  GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, x, dy, dx);
  return cudaGetLastError();
}

cudaError_t LaunchResidualForward(int64_t n, const float* a, const float* b, float* out,
                                  cudaStream_t stream) {
  ResidualForwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, a, b, out);
  return cudaGetLastError();
}

cudaError_t LaunchScaleInPlace(int64_t n, float alpha, float* x, cudaStream_t stream) {
  ScaleInPlaceKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t LaunchResidualBackward(int64_t n, const float* dout, float* da, float* db,
                                   cudaStream_t stream) {
  ResidualBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, dout, da, db);
  return cudaGetLastError();
}

cudaError_t LaunchBroadcastRows(int64_t rows, int64_t cols, const float* bias, float* y,
                                cudaStream_t stream) {
  BroadcastRowsKernel<<<GridFor(rows * cols, kThreads), kThreads, 0, stream>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSums(int64_t rows, int64_t cols, const float* dy, float* db,
                             cudaStream_t stream) {
  const unsigned int blocks = static_cast<unsigned int>((cols + kColumnTile - 1) / kColumnTile);
  ColumnSumsKernel<<<blocks, dim3(kColumnTile, kRowLanes), 0, stream>>>(rows, cols, dy, db);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
