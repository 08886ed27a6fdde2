// Element-wise CUDA kernels of the Llama-family operators: RoPE, SwiGLU and the token embedding.
// Memory-bound; grid-stride loops over elements. The arithmetic is model/kernels/rope_math.h's and
// swiglu_math.h's, the functions the CPU kernels call.
//
// Determinism: the embedding backward gives every dwte element one owner thread that adds the
// rows in increasing order, exactly as the CPU kernel, so it matches it bit for bit.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/llama_launchers.h"
#include "model/kernels/rope_math.h"
#include "model/kernels/swiglu_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kThreads = 256;

// One thread per pair (row, head, i < R/2): channels [0, R) of each head of D are rotated.
__global__ void RopeKernel(int64_t rows, int64_t seq_len, int64_t num_heads, int64_t head_dim,
                           int64_t rotary_dim, int64_t table_positions,
                           const float* __restrict__ cos, const float* __restrict__ sin,
                           const int32_t* __restrict__ positions, float* __restrict__ x,
                           bool inverse) {
  const int64_t half = rotary_dim / 2;
  const int64_t n = rows * num_heads * half;
  for (int64_t idx = GlobalThread(); idx < n; idx += GridStride()) {
    const int64_t i = idx % half;
    const int64_t head = idx / half;  // row * num_heads + h
    const int64_t row = head / num_heads;
    const int64_t t = positions == nullptr ? row % seq_len : positions[row];
    float* p = x + head * head_dim;
    if (t < 0 || t >= table_positions) {  // a position the tables lack: NaN, never out of bounds
      p[i] = p[i + half] = NAN;
      continue;
    }
    const float c = cos[t * half + i], s = sin[t * half + i];
    const RopePair<float> r =
        inverse ? RopeRotateInverse(p[i], p[i + half], c, s) : RopeRotate(p[i], p[i + half], c, s);
    p[i] = r.first;
    p[i + half] = r.second;
  }
}

// h may alias g or u: no __restrict__.
__global__ void SwiGluForwardKernel(int64_t n, const float* g, const float* u, float* h,
                                    GateActivation act) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    h[i] = GatedActivation(act, g[i], u[i]);
  }
}

__global__ void SwiGluBackwardKernel(int64_t n, const float* __restrict__ g,
                                     const float* __restrict__ u, const float* __restrict__ dh,
                                     float* __restrict__ dg, float* __restrict__ du,
                                     GateActivation act) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const SwiGluGrads<float> d = GatedActivationBackwardTerms(act, g[i], u[i], dh[i]);
    dg[i] += d.dg;
    du[i] += d.du;
  }
}

__global__ void EmbeddingForwardKernel(int64_t rows, int64_t channels, int64_t vocab,
                                       const int32_t* __restrict__ tokens,
                                       const float* __restrict__ wte, float* __restrict__ out) {
  const int64_t n = rows * channels;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int32_t token = tokens[i / channels];
    out[i] = token >= 0 && token < vocab
                 ? wte[static_cast<int64_t>(token) * channels + i % channels]
                 : NAN;
  }
}

// The scatter is a reduction over rows sharing a token. Thread (c, k) owns channel c of every
// vocabulary row v with v % kBuckets == k: it walks all rows in order and adds those whose token
// is in its bucket, so each (v, c) has one owner adding rows in increasing order, like the CPU.
constexpr int kBuckets = 64;
constexpr int kBucketsPerBlock = kThreads / 32;

__global__ void EmbeddingBackwardKernel(int64_t rows, int64_t channels, int64_t vocab,
                                        int64_t padding_idx, const int32_t* __restrict__ tokens,
                                        const float* __restrict__ dout, float* __restrict__ dwte) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int bucket = blockIdx.y * kBucketsPerBlock + threadIdx.y;
  if (c >= channels) return;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t token = tokens[r];
    if (token < 0 || token >= vocab || token == padding_idx || token % kBuckets != bucket) {
      continue;
    }
    dwte[static_cast<int64_t>(token) * channels + c] += dout[r * channels + c];
  }
}

}  // namespace

cudaError_t LaunchRope(int64_t batch, int64_t seq_len, int64_t num_heads, int64_t head_dim,
                       int64_t rotary_dim, int64_t table_positions, const float* cos,
                       const float* sin, const int32_t* positions, float* x, bool inverse,
                       cudaStream_t stream) {
  const int64_t rows = batch * seq_len;
  RopeKernel<<<GridFor(rows * num_heads * (rotary_dim / 2), kThreads), kThreads, 0, stream>>>(
      rows, seq_len, num_heads, head_dim, rotary_dim, table_positions, cos, sin, positions, x,
      inverse);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluForward(int64_t n, const float* g, const float* u, float* h,
                                GateActivation act, cudaStream_t stream) {
  SwiGluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, g, u, h, act);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluBackward(int64_t n, const float* g, const float* u, const float* dh,
                                 float* dg, float* du, GateActivation act, cudaStream_t stream) {
  SwiGluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(n, g, u, dh, dg, du, act);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(int64_t rows, int64_t channels, int64_t vocab,
                                   const int32_t* tokens, const float* wte, float* out,
                                   cudaStream_t stream) {
  EmbeddingForwardKernel<<<GridFor(rows * channels, kThreads), kThreads, 0, stream>>>(
      rows, channels, vocab, tokens, wte, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(int64_t rows, int64_t channels, int64_t vocab,
                                    int64_t padding_idx, const int32_t* tokens, const float* dout,
                                    float* dwte, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((channels + 31) / 32), kBuckets / kBucketsPerBlock);
  EmbeddingBackwardKernel<<<grid, dim3(32, kBucketsPerBlock), 0, stream>>>(
      rows, channels, vocab, padding_idx, tokens, dout, dwte);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
