// Causal attention on the GPU (see model/kernels/attention.h for the math),
// with the online softmax and the backward recomputation of
// model/kernels/attention_math.h and softmax_math.h — the functions the CPU
// kernel calls.
//
// Work decomposition. A block is (query or key group of
// kAttentionQueriesPerBlock = 8 positions, head, batch); each warp owns one
// position and holds that position's vectors in registers, lane l holding
// elements l, l + 32, ... of the head dimension (hd <= kAttentionMaxHeadDim =
// 128). The other side's vectors stream through shared memory in tiles of
// kAttentionKeyTile = 32 positions, loaded once per block and used by all its
// warps. A dot product of a register vector with a shared row is a per-lane
// partial sum and a butterfly reduction. No T x T buffer exists anywhere:
// shared memory is O(32 hd) per block.
//
//  Forward:  warp = query i; per key tile, lane jj keeps the score s_{i,j0+jj}
//  (each a warp dot);
//            the tile's max and sum come from warp reductions, the running
//            state (m, l) and the output row (in registers) are rescaled by
//            SoftmaxRescale(m, m'), then the tile's weights are broadcast lane
//            by lane to accumulate sum_j p_j v_j.
//  Backward: D_i = dO_i . out_i per row into the workspace; then, as on the
//  CPU, a key pass
//            (warp = key j, query tiles streamed, accumulating dk_j and dv_j
//            over i >= j in increasing order) and a query pass (warp = query i,
//            key tiles streamed, accumulating dq_i over j <= i in increasing
//            order). Every output row has one owner: no atomics, deterministic
//            results.
#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/attention_math.h"
#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/softmax_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kWarps = kAttentionQueriesPerBlock;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTile = kAttentionKeyTile;
constexpr int kPerLane = static_cast<int>(kAttentionMaxHeadDim / kWarpSize);
static_assert(kTile == kWarpSize, "one score per lane in the forward pass");

// Copies rows t0 .. t0 + kTile - 1 (zeros past `len`) of a strided matrix,
// columns [col, col + hd), into dst[kTile][hd]. All threads of the block take
// part.
__device__ void LoadTile(const float* __restrict__ src, int64_t row_stride, int64_t col, int64_t t0,
                         int64_t len, int64_t hd, float* __restrict__ dst) {
  const int64_t n = kTile * hd;
  for (int64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const int64_t t = t0 + idx / hd;
    dst[idx] = t < len ? src[t * row_stride + col + idx % hd] : 0.0f;
  }
}

// Lane `lane`'s elements of a head-dim vector.
__device__ void LoadLaneVector(const float* __restrict__ src, int64_t hd, int lane,
                               float (&v)[kPerLane]) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + kWarpSize * k;
    v[k] = d < hd ? src[d] : 0.0f;
  }
}

__device__ void AddLaneVector(const float (&v)[kPerLane], int64_t hd, int lane, float* dst) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + kWarpSize * k;
    if (d < hd) dst[d] += v[k];
  }
}

// reg . row over the head dimension, the result in every lane.
__device__ float WarpDot(const float (&reg)[kPerLane], const float* row, int64_t hd, int lane) {
  float part = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + kWarpSize * k;
    if (d < hd) part += reg[k] * row[d];
  }
  return WarpSum(part);
}

__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(int64_t seq_len, int64_t channels, int64_t num_heads,
                           const float* __restrict__ qkv, float* __restrict__ out,
                           float* __restrict__ lse) {
  extern __shared__ float smem[];
  const int64_t L = seq_len, C = channels, H = num_heads, hd = C / H;
  float* k_s = smem;
  float* v_s = smem + kTile * hd;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t i = q0 + warp;
  const bool active = i < L;
  const float* base = qkv + b * L * 3 * C;
  const float scale = AttentionScale<float>(hd);
  float q[kPerLane], acc[kPerLane];
  LoadLaneVector(base + (active ? i : 0) * 3 * C + h * hd, hd, lane, q);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) acc[k] = 0.0f;
  float m = NegativeInfinity<float>(), l = 0.0f;
  const int64_t last = MinOf<int64_t>(L - 1, q0 + kWarps - 1);
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    LoadTile(base, 3 * C, C + h * hd, j0, L, hd, k_s);
    LoadTile(base, 3 * C, 2 * C + h * hd, j0, L, hd, v_s);
    __syncthreads();
    if (!active || j0 > i) continue;                                         // warp-uniform
    const int n_keys = static_cast<int>(MinOf<int64_t>(kTile, i - j0 + 1));  // causal: j <= i
    float my_score = NegativeInfinity<float>();  // lane jj: the score of key j0 + jj
    for (int jj = 0; jj < n_keys; ++jj) {
      const float s = scale * WarpDot(q, k_s + jj * hd, hd, lane);
      if (lane == jj) my_score = s;
    }
    const float new_m = MaxOf(m, WarpMax(my_score));
    const float correction = SoftmaxRescale(m, new_m);  // 0 on the first tile
    const float p = SoftmaxWeight(my_score, new_m);     // 0 for masked lanes
    l = l * correction + WarpSum(p);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) acc[k] *= correction;
    for (int jj = 0; jj < n_keys; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t d = lane + kWarpSize * k;
        if (d < hd) acc[k] += pj * v_s[jj * hd + d];
      }
    }
    m = new_m;
  }
  if (!active) return;
  const float inv_l = 1.0f / l;
  float* o = out + (b * L + i) * C + h * hd;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + kWarpSize * k;
    if (d < hd) o[d] = acc[k] * inv_l;
  }
  if (lane == 0) lse[(b * H + h) * L + i] = SoftmaxLogSumExp(SoftmaxState<float>{m, l});
}

// row_d[(b*H + h)*L + i] = dout_i . out_i over head h: one warp per row.
__global__ void __launch_bounds__(kThreads)
    AttentionRowDKernel(int64_t batch, int64_t seq_len, int64_t channels, int64_t num_heads,
                        const float* __restrict__ out, const float* __restrict__ dout,
                        float* __restrict__ row_d) {
  const int64_t L = seq_len, C = channels, H = num_heads, hd = C / H;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= batch * H * L) return;  // warp-uniform
  const int64_t b = row / (H * L), h = (row / L) % H, i = row % L;
  const int64_t offset = (b * L + i) * C + h * hd;
  float part = 0.0f;
  for (int64_t d = lane; d < hd; d += kWarpSize) part += dout[offset + d] * out[offset + d];
  const float total = WarpSum(part);
  if (lane == 0) row_d[row] = total;
}

// Pass A: warp = key j; dk_j += scale sum_{i>=j} dS_ij q_i, dv_j += sum_{i>=j}
// P_ij dO_i.
__global__ void __launch_bounds__(kThreads)
    AttentionKeyGradKernel(int64_t seq_len, int64_t channels, int64_t num_heads,
                           const float* __restrict__ qkv, const float* __restrict__ lse,
                           const float* __restrict__ dout, const float* __restrict__ row_d,
                           float* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int64_t L = seq_len, C = channels, H = num_heads, hd = C / H;
  float* q_s = smem;
  float* do_s = q_s + kTile * hd;
  float* lse_s = do_s + kTile * hd;
  float* d_s = lse_s + kTile;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t j_first = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t j = j_first + warp;
  const bool active = j < L;
  const float* base = qkv + b * L * 3 * C;
  const float* dout_b = dout + b * L * C;
  const float* lse_bh = lse + (b * H + h) * L;
  const float* d_bh = row_d + (b * H + h) * L;
  const float scale = AttentionScale<float>(hd);
  float kv[kPerLane], vv[kPerLane], dk[kPerLane], dv[kPerLane];
  LoadLaneVector(base + (active ? j : 0) * 3 * C + C + h * hd, hd, lane, kv);
  LoadLaneVector(base + (active ? j : 0) * 3 * C + 2 * C + h * hd, hd, lane, vv);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) dk[k] = dv[k] = 0.0f;
  for (int64_t i0 = j_first; i0 < L; i0 += kTile) {
    __syncthreads();
    LoadTile(base, 3 * C, h * hd, i0, L, hd, q_s);
    LoadTile(dout_b, C, h * hd, i0, L, hd, do_s);
    for (int idx = threadIdx.x; idx < kTile; idx += blockDim.x) {
      const int64_t t = i0 + idx;
      lse_s[idx] = t < L ? lse_bh[t] : 0.0f;
      d_s[idx] = t < L ? d_bh[t] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;  // warp-uniform
    const int64_t i_end = MinOf<int64_t>(i0 + kTile, L);
    for (int64_t i = MaxOf<int64_t>(i0, j); i < i_end; ++i) {
      const int ii = static_cast<int>(i - i0);
      const float* qi = q_s + ii * hd;
      const float* doi = do_s + ii * hd;
      const float p = AttentionProbability(scale * WarpDot(kv, qi, hd, lane), lse_s[ii]);
      const float ds = AttentionScoreGrad(p, WarpDot(vv, doi, hd, lane), d_s[ii]);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t d = lane + kWarpSize * k;
        if (d < hd) {
          dk[k] += scale * ds * qi[d];
          dv[k] += p * doi[d];
        }
      }
    }
  }
  if (!active) return;
  float* row = dqkv + (b * L + j) * 3 * C + h * hd;
  AddLaneVector(dk, hd, lane, row + C);
  AddLaneVector(dv, hd, lane, row + 2 * C);
}

// Pass B: warp = query i; dq_i += scale sum_{j<=i} dS_ij k_j.
__global__ void __launch_bounds__(kThreads)
    AttentionQueryGradKernel(int64_t seq_len, int64_t channels, int64_t num_heads,
                             const float* __restrict__ qkv, const float* __restrict__ lse,
                             const float* __restrict__ dout, const float* __restrict__ row_d,
                             float* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int64_t L = seq_len, C = channels, H = num_heads, hd = C / H;
  float* k_s = smem;
  float* v_s = smem + kTile * hd;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t i = q0 + warp;
  const bool active = i < L;
  const int64_t i_safe = active ? i : 0;
  const float* base = qkv + b * L * 3 * C;
  const float scale = AttentionScale<float>(hd);
  float q[kPerLane], dov[kPerLane], dq[kPerLane];
  LoadLaneVector(base + i_safe * 3 * C + h * hd, hd, lane, q);
  LoadLaneVector(dout + (b * L + i_safe) * C + h * hd, hd, lane, dov);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) dq[k] = 0.0f;
  const float row_lse = lse[(b * H + h) * L + i_safe];
  const float d_i = row_d[(b * H + h) * L + i_safe];
  const int64_t last = MinOf<int64_t>(L - 1, q0 + kWarps - 1);
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    LoadTile(base, 3 * C, C + h * hd, j0, L, hd, k_s);
    LoadTile(base, 3 * C, 2 * C + h * hd, j0, L, hd, v_s);
    __syncthreads();
    if (!active || j0 > i) continue;  // warp-uniform
    const int n_keys = static_cast<int>(MinOf<int64_t>(kTile, i - j0 + 1));
    for (int jj = 0; jj < n_keys; ++jj) {
      const float* kj = k_s + jj * hd;
      const float p = AttentionProbability(scale * WarpDot(q, kj, hd, lane), row_lse);
      const float ds = AttentionScoreGrad(p, WarpDot(dov, v_s + jj * hd, hd, lane), d_i);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t d = lane + kWarpSize * k;
        if (d < hd) dq[k] += scale * ds * kj[d];
      }
    }
  }
  if (!active) return;
  AddLaneVector(dq, hd, lane, dqkv + (b * L + i) * 3 * C + h * hd);
}

dim3 PositionGrid(int64_t batch, int64_t seq_len, int64_t num_heads) {
  return dim3(static_cast<unsigned int>((seq_len + kWarps - 1) / kWarps),
              static_cast<unsigned int>(num_heads), static_cast<unsigned int>(batch));
}

}  // namespace

cudaError_t LaunchAttentionForward(int64_t batch, int64_t seq_len, int64_t channels,
                                   int64_t num_heads, const float* qkv, float* out, float* lse,
                                   cudaStream_t stream) {
  const int64_t hd = channels / num_heads;
  const size_t smem = sizeof(float) * 2 * kTile * hd;
  AttentionForwardKernel<<<PositionGrid(batch, seq_len, num_heads), kThreads, smem, stream>>>(
      seq_len, channels, num_heads, qkv, out, lse);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackward(int64_t batch, int64_t seq_len, int64_t channels,
                                    int64_t num_heads, const float* qkv, const float* out,
                                    const float* lse, const float* dout, float* row_d, float* dqkv,
                                    cudaStream_t stream) {
  const int64_t hd = channels / num_heads;
  const int64_t rows = batch * num_heads * seq_len;
  AttentionRowDKernel<<<static_cast<unsigned int>((rows + kWarps - 1) / kWarps), kThreads, 0,
                        stream>>>(batch, seq_len, channels, num_heads, out, dout, row_d);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const dim3 grid = PositionGrid(batch, seq_len, num_heads);
  const size_t key_smem = sizeof(float) * (2 * kTile * hd + 2 * kTile);
  AttentionKeyGradKernel<<<grid, kThreads, key_smem, stream>>>(seq_len, channels, num_heads, qkv,
                                                               lse, dout, row_d, dqkv);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const size_t query_smem = sizeof(float) * 2 * kTile * hd;
  AttentionQueryGradKernel<<<grid, kThreads, query_smem, stream>>>(seq_len, channels, num_heads,
                                                                   qkv, lse, dout, row_d, dqkv);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
