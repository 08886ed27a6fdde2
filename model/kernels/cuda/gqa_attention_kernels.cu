// Causal grouped-query attention on the GPU, the one attention kernel of every model (see
// model/kernels/gqa_attention.h for the math and layouts: GPT-2's multi-head attention is the case
// Hkv = Hq read from its fused qkv through row strides), with the online softmax and the backward
// recomputation of model/kernels/attention_math.h and softmax_math.h — the functions the CPU
// kernels call. q [B,T,Hq,D] and k, v [B,T,Hkv,D] rows are q_stride and kv_stride elements apart
// (dq, dk, dv likewise); out, dout and lse are packed. A key/value head is shared by Hq/Hkv query
// heads.
//
// Work decomposition. A block is (group of kGqaRowsPerBlock = 8 positions, head, batch); each warp
// owns one position and holds that position's vectors in registers, lane l holding elements
// l, l + 32, ... of the head dimension (D <= kGqaMaxHeadDim = 128). The other side's vectors
// stream through shared memory in tiles of kGqaKeyTile = 32 positions, loaded once per block and
// used by all its warps. No T x T buffer exists anywhere: shared memory is O(32 D) per block.
//
//  Forward:  block = (query group, query head h, b); keys and values of kv head h / (Hq/Hkv) stream
//            through; lane jj keeps the score of key j0 + jj, the tile's max and sum come from warp
//            reductions, the running state and the output row are rescaled by SoftmaxRescale.
//  Backward: D_i = dO_i . out_i per (b, h, i) into the workspace; then a key pass (block = (key
//            group, kv head g, b), warp = key j, accumulating dk_j and dv_j over the group's query
//            heads in increasing order and, for each, over query tiles i >= j in increasing order)
//            and a query pass (block = (query group, query head, b), warp = query i, accumulating
//            dq_i over j <= i in increasing order). Every output row has one owner: no atomics,
//            deterministic results.
#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/attention_math.h"
#include "model/kernels/cuda/internal/device_util.cuh"
#include "model/kernels/cuda/internal/llama_launchers.h"
#include "model/kernels/softmax_math.h"

namespace ps::cuda_internal {
namespace {

constexpr int kWarps = kGqaRowsPerBlock;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTile = kGqaKeyTile;
constexpr int kPerLane = static_cast<int>(kGqaMaxHeadDim / kWarpSize);
static_assert(kTile == kWarpSize, "one score per lane in the forward pass");

// The addressing of one batch element: row t of head h of a [T, H, D] tensor whose token rows are
// `stride` elements apart starts at t * stride + h * D.
struct HeadRows {
  const float* base;  // the batch element's first row
  int64_t stride;     // elements between consecutive tokens' rows (H * D when packed)
  int64_t head_dim;   // D
  int64_t h;          // the head
  __device__ const float* Row(int64_t t) const { return base + t * stride + h * head_dim; }
};

// The mask of one batch row (model/kernels/gqa_attention.h): query t sees keys [First(t), t].
// key_start is the row's [T] (null: 0). Clamped to [0, t + 1] so that a key_start breaking its
// contract (device data, unchecked) gives wrong values (NaN when a query sees nothing), never a
// read out of bounds.
struct RowMask {
  const int32_t* key_start;
  int64_t window;
  __device__ int64_t First(int64_t t) const {
    const int64_t f = AttentionFirstKey(t, key_start == nullptr ? 0 : key_start[t], window);
    return f < 0 ? 0 : (f > t + 1 ? t + 1 : f);
  }
};

__device__ RowMask MaskOf(const int32_t* key_start, int64_t b, int64_t seq_len, int64_t window) {
  return RowMask{key_start == nullptr ? nullptr : key_start + b * seq_len, window};
}

// Copies rows t0 .. t0 + kTile - 1 (zeros past `len`) of one head into dst[kTile][D]. All threads
// of the block take part.
__device__ void LoadTile(const HeadRows& src, int64_t t0, int64_t len, float* __restrict__ dst) {
  const int64_t hd = src.head_dim;
  const int64_t n = kTile * hd;
  for (int64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const int64_t t = t0 + idx / hd;
    dst[idx] = t < len ? src.Row(t)[idx % hd] : 0.0f;
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
    GqaForwardKernel(int64_t seq_len, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t q_stride, int64_t kv_stride, int64_t window,
                     const int32_t* __restrict__ key_start, const float* __restrict__ q,
                     const float* __restrict__ k, const float* __restrict__ v,
                     float* __restrict__ out, float* __restrict__ lse) {
  extern __shared__ float smem[];
  const int64_t L = seq_len, Hq = num_heads, Hkv = num_kv_heads, hd = head_dim;
  float* k_s = smem;
  float* v_s = smem + kTile * hd;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (Hq / Hkv);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t i = q0 + warp;
  const bool active = i < L;
  const HeadRows q_rows{q + b * L * q_stride, q_stride, hd, h};
  const HeadRows k_rows{k + b * L * kv_stride, kv_stride, hd, g};
  const HeadRows v_rows{v + b * L * kv_stride, kv_stride, hd, g};
  const float scale = AttentionScale<float>(hd);
  float qv[kPerLane], acc[kPerLane];
  LoadLaneVector(q_rows.Row(active ? i : 0), hd, lane, qv);
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) acc[kk] = 0.0f;
  float m = NegativeInfinity<float>(), l = 0.0f;
  const RowMask mask = MaskOf(key_start, b, L, window);
  const int64_t first = active ? mask.First(i) : 0;
  const int64_t last = MinOf<int64_t>(L - 1, q0 + kWarps - 1);
  // Key tiles from the block's first visible key (its first query's): earlier keys are skipped.
  for (int64_t j0 = mask.First(q0); j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    LoadTile(k_rows, j0, L, k_s);
    LoadTile(v_rows, j0, L, v_s);
    __syncthreads();
    if (!active || j0 > i || j0 + kTile <= first) continue;                  // warp-uniform
    const int n_keys = static_cast<int>(MinOf<int64_t>(kTile, i - j0 + 1));  // causal: j <= i
    const int jj_begin = static_cast<int>(MaxOf<int64_t>(0, first - j0));    // the mask's start
    float my_score = NegativeInfinity<float>();  // lane jj: the score of key j0 + jj
    for (int jj = jj_begin; jj < n_keys; ++jj) {
      const float s = scale * WarpDot(qv, k_s + jj * hd, hd, lane);
      if (lane == jj) my_score = s;
    }
    const float new_m = MaxOf(m, WarpMax(my_score));
    const float correction = SoftmaxRescale(m, new_m);  // 0 on the first tile
    const float p = SoftmaxWeight(my_score, new_m);     // 0 for masked lanes
    l = l * correction + WarpSum(p);
#pragma unroll
    for (int kk = 0; kk < kPerLane; ++kk) acc[kk] *= correction;
    for (int jj = jj_begin; jj < n_keys; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
#pragma unroll
      for (int kk = 0; kk < kPerLane; ++kk) {
        const int64_t d = lane + kWarpSize * kk;
        if (d < hd) acc[kk] += pj * v_s[jj * hd + d];
      }
    }
    m = new_m;
  }
  if (!active) return;
  const float inv_l = 1.0f / l;
  float* o = out + ((b * L + i) * Hq + h) * hd;
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) {
    const int64_t d = lane + kWarpSize * kk;
    if (d < hd) o[d] = acc[kk] * inv_l;
  }
  if (lane == 0) lse[(b * Hq + h) * L + i] = SoftmaxLogSumExp(SoftmaxState<float>{m, l});
}

// row_d[(b*Hq + h)*L + i] = dout_i . out_i over head h: one warp per row.
__global__ void __launch_bounds__(kThreads)
    GqaRowDKernel(int64_t batch, int64_t seq_len, int64_t num_heads, int64_t head_dim,
                  const float* __restrict__ out, const float* __restrict__ dout,
                  float* __restrict__ row_d) {
  const int64_t L = seq_len, Hq = num_heads, hd = head_dim;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= batch * Hq * L) return;  // warp-uniform
  const int64_t b = row / (Hq * L), h = (row / L) % Hq, i = row % L;
  const int64_t offset = ((b * L + i) * Hq + h) * hd;
  float part = 0.0f;
  for (int64_t d = lane; d < hd; d += kWarpSize) part += dout[offset + d] * out[offset + d];
  const float total = WarpSum(part);
  if (lane == 0) row_d[row] = total;
}

// Pass A: warp = key j of kv head g; dk_j += scale sum_{h in group} sum_{i>=j} dS^h_ij q^h_i,
// dv_j += sum_{h in group} sum_{i>=j} P^h_ij dO^h_i.
__global__ void __launch_bounds__(kThreads)
    GqaKeyGradKernel(int64_t seq_len, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                     int64_t q_stride, int64_t kv_stride, int64_t window,
                     const int32_t* __restrict__ key_start, const float* __restrict__ q,
                     const float* __restrict__ k, const float* __restrict__ v,
                     const float* __restrict__ lse, const float* __restrict__ dout,
                     const float* __restrict__ row_d, float* __restrict__ dk,
                     float* __restrict__ dv) {
  extern __shared__ float smem[];
  const int64_t L = seq_len, Hq = num_heads, Hkv = num_kv_heads, hd = head_dim;
  const int64_t group = Hq / Hkv;
  float* q_s = smem;
  float* do_s = q_s + kTile * hd;
  float* lse_s = do_s + kTile * hd;
  float* d_s = lse_s + kTile;
  int64_t* first_s = reinterpret_cast<int64_t*>(d_s + kTile);  // 8-byte aligned: kTile even
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t b = blockIdx.z, g = blockIdx.y;
  const int64_t j_first = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t j_last = MinOf<int64_t>(L - 1, j_first + kWarps - 1);
  const RowMask mask = MaskOf(key_start, b, L, window);
  const int64_t j = j_first + warp;
  const bool active = j < L;
  const int64_t kv_offset = (b * L + (active ? j : 0)) * kv_stride + g * hd;
  const float scale = AttentionScale<float>(hd);
  float kv[kPerLane], vv[kPerLane], dkv[kPerLane], dvv[kPerLane];
  LoadLaneVector(k + kv_offset, hd, lane, kv);
  LoadLaneVector(v + kv_offset, hd, lane, vv);
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) dkv[kk] = dvv[kk] = 0.0f;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const HeadRows q_rows{q + b * L * q_stride, q_stride, hd, h};
    const HeadRows do_rows{dout + b * L * Hq * hd, Hq * hd, hd, h};
    const float* lse_bh = lse + (b * Hq + h) * L;
    const float* d_bh = row_d + (b * Hq + h) * L;
    // Query tiles from the block's first key on, until a tile's first query starts after the
    // block's last key (every later query does too: the first visible key never decreases).
    for (int64_t i0 = j_first; i0 < L && mask.First(i0) <= j_last; i0 += kTile) {
      __syncthreads();
      LoadTile(q_rows, i0, L, q_s);
      LoadTile(do_rows, i0, L, do_s);
      for (int idx = threadIdx.x; idx < kTile; idx += blockDim.x) {
        const int64_t t = i0 + idx;
        lse_s[idx] = t < L ? lse_bh[t] : 0.0f;
        d_s[idx] = t < L ? d_bh[t] : 0.0f;
        first_s[idx] = t < L ? mask.First(t) : L;
      }
      __syncthreads();
      if (!active) continue;  // warp-uniform
      const int64_t i_end = MinOf<int64_t>(i0 + kTile, L);
      for (int64_t i = MaxOf<int64_t>(i0, j); i < i_end; ++i) {
        const int ii = static_cast<int>(i - i0);
        if (first_s[ii] > j) break;  // this query and all later ones start after key j
        const float* qi = q_s + ii * hd;
        const float* doi = do_s + ii * hd;
        const float p = AttentionProbability(scale * WarpDot(kv, qi, hd, lane), lse_s[ii]);
        const float ds = AttentionScoreGrad(p, WarpDot(vv, doi, hd, lane), d_s[ii]);
#pragma unroll
        for (int kk = 0; kk < kPerLane; ++kk) {
          const int64_t d = lane + kWarpSize * kk;
          if (d < hd) {
            dkv[kk] += scale * ds * qi[d];
            dvv[kk] += p * doi[d];
          }
        }
      }
    }
  }
  if (!active) return;
  AddLaneVector(dkv, hd, lane, dk + kv_offset);
  AddLaneVector(dvv, hd, lane, dv + kv_offset);
}

// Pass B: warp = query i of head h; dq_i += scale sum_{j<=i} dS_ij k_j (k of kv head g(h)).
__global__ void __launch_bounds__(kThreads)
    GqaQueryGradKernel(int64_t seq_len, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                       int64_t q_stride, int64_t kv_stride, int64_t window,
                       const int32_t* __restrict__ key_start, const float* __restrict__ q,
                       const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ lse, const float* __restrict__ dout,
                       const float* __restrict__ row_d, float* __restrict__ dq) {
  extern __shared__ float smem[];
  const int64_t L = seq_len, Hq = num_heads, Hkv = num_kv_heads, hd = head_dim;
  float* k_s = smem;
  float* v_s = smem + kTile * hd;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (Hq / Hkv);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t i = q0 + warp;
  const bool active = i < L;
  const int64_t i_safe = active ? i : 0;
  const int64_t q_offset = (b * L + i_safe) * q_stride + h * hd;
  const int64_t out_offset = ((b * L + i_safe) * Hq + h) * hd;
  const HeadRows k_rows{k + b * L * kv_stride, kv_stride, hd, g};
  const HeadRows v_rows{v + b * L * kv_stride, kv_stride, hd, g};
  const float scale = AttentionScale<float>(hd);
  float qv[kPerLane], dov[kPerLane], dqv[kPerLane];
  LoadLaneVector(q + q_offset, hd, lane, qv);
  LoadLaneVector(dout + out_offset, hd, lane, dov);
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) dqv[kk] = 0.0f;
  const float row_lse = lse[(b * Hq + h) * L + i_safe];
  const float d_i = row_d[(b * Hq + h) * L + i_safe];
  const RowMask mask = MaskOf(key_start, b, L, window);
  const int64_t first = active ? mask.First(i) : 0;
  const int64_t last = MinOf<int64_t>(L - 1, q0 + kWarps - 1);
  for (int64_t j0 = mask.First(q0); j0 <= last; j0 += kTile) {
    __syncthreads();
    LoadTile(k_rows, j0, L, k_s);
    LoadTile(v_rows, j0, L, v_s);
    __syncthreads();
    if (!active || j0 > i || j0 + kTile <= first) continue;  // warp-uniform
    const int n_keys = static_cast<int>(MinOf<int64_t>(kTile, i - j0 + 1));
    for (int jj = static_cast<int>(MaxOf<int64_t>(0, first - j0)); jj < n_keys; ++jj) {
      const float* kj = k_s + jj * hd;
      const float p = AttentionProbability(scale * WarpDot(qv, kj, hd, lane), row_lse);
      const float ds = AttentionScoreGrad(p, WarpDot(dov, v_s + jj * hd, hd, lane), d_i);
#pragma unroll
      for (int kk = 0; kk < kPerLane; ++kk) {
        const int64_t d = lane + kWarpSize * kk;
        if (d < hd) dqv[kk] += scale * ds * kj[d];
      }
    }
  }
  if (!active) return;
  AddLaneVector(dqv, hd, lane, dq + q_offset);
}

dim3 PositionGrid(int64_t batch, int64_t seq_len, int64_t heads) {
  return dim3(static_cast<unsigned int>((seq_len + kWarps - 1) / kWarps),
              static_cast<unsigned int>(heads), static_cast<unsigned int>(batch));
}

}  // namespace

cudaError_t LaunchGqaAttentionForward(int64_t batch, int64_t seq_len, int64_t num_heads,
                                      int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                                      int64_t kv_stride, int64_t window, const int32_t* key_start,
                                      const float* q, const float* k, const float* v, float* out,
                                      float* lse, cudaStream_t stream) {
  const size_t smem = sizeof(float) * 2 * kTile * head_dim;
  GqaForwardKernel<<<PositionGrid(batch, seq_len, num_heads), kThreads, smem, stream>>>(
      seq_len, num_heads, num_kv_heads, head_dim, q_stride, kv_stride, window, key_start, q, k, v,
      out, lse);
  return cudaGetLastError();
}

cudaError_t LaunchGqaAttentionBackward(int64_t batch, int64_t seq_len, int64_t num_heads,
                                       int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                                       int64_t kv_stride, int64_t window, const int32_t* key_start,
                                       const float* q, const float* k, const float* v,
                                       const float* out, const float* lse, const float* dout,
                                       float* row_d, float* dq, float* dk, float* dv,
                                       cudaStream_t stream) {
  const int64_t rows = batch * num_heads * seq_len;
  GqaRowDKernel<<<static_cast<unsigned int>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      batch, seq_len, num_heads, head_dim, out, dout, row_d);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const size_t key_smem =
      sizeof(float) * (2 * kTile * head_dim + 2 * kTile) + sizeof(int64_t) * kTile;
  GqaKeyGradKernel<<<PositionGrid(batch, seq_len, num_kv_heads), kThreads, key_smem, stream>>>(
      seq_len, num_heads, num_kv_heads, head_dim, q_stride, kv_stride, window, key_start, q, k, v,
      lse, dout, row_d, dk, dv);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const size_t query_smem = sizeof(float) * 2 * kTile * head_dim;
  GqaQueryGradKernel<<<PositionGrid(batch, seq_len, num_heads), kThreads, query_smem, stream>>>(
      seq_len, num_heads, num_kv_heads, head_dim, q_stride, kv_stride, window, key_start, q, k, v,
      lse, dout, row_d, dq);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
