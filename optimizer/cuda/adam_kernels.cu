// CUDA kernels of optimizer/cuda/adam_kernels.h.
//
// The update is memory-bound (about 28 bytes moved per element with 16-bit gradients), so the
// kernels aim at full-width coalesced accesses: four elements per thread with 16-byte loads of
// the f32 arrays when the pointers allow, grid-stride loops with a capped grid. The per-element
// arithmetic is AdamUpdate from optimizer/adam_math.h and the conversions are
// memory/dtype_math.h's, so the GPU computes what the CPU reference computes, bit for bit: this
// file is compiled with --fmad=false (optimizer/cuda/BUILD.bazel), so the only fused
// multiply-adds are AdamUpdate's explicit ones, which are the CPU kernel's. The statistics run the
// CPU kernel's summation order (optimizer/grad_stats_math.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "memory/dtype_math.h"
#include "optimizer/adam_math.h"
#include "optimizer/cuda/adam_kernels.h"
#include "optimizer/grad_accumulate_math.h"
#include "optimizer/grad_stats_math.h"

namespace ps {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 8192;

struct F32Type {
  using Storage = float;
  static __device__ float Accumulate(float acc, float g) { return AccumulateGradF32(acc, g); }
  static __device__ float ToFloat(float x) { return x; }
  static __device__ float FromFloat(float x) { return x; }
};
struct F16Type {
  using Storage = uint16_t;
  static __device__ float Accumulate(float acc, uint16_t g) { return AccumulateGradF16(acc, g); }
  static __device__ float ToFloat(uint16_t x) { return HalfBitsToFloat(x); }
  static __device__ uint16_t FromFloat(float x) { return FloatToHalfBits(x); }
};
struct BF16Type {
  using Storage = uint16_t;
  static __device__ float Accumulate(float acc, uint16_t g) { return AccumulateGradBF16(acc, g); }
  static __device__ float ToFloat(uint16_t x) { return BFloat16BitsToFloat(x); }
  static __device__ uint16_t FromFloat(float x) { return FloatToBFloat16Bits(x); }
};

// Four consecutive gradients / parameters in one aligned access.
template <typename T>
struct Quad;
template <>
struct Quad<F32Type> {
  static __device__ void Load(const float* p, int64_t q, float out[4]) {
    const float4 v = reinterpret_cast<const float4*>(p)[q];
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
  static __device__ void Store(float* p, int64_t q, const float in[4]) {
    reinterpret_cast<float4*>(p)[q] = make_float4(in[0], in[1], in[2], in[3]);
  }
};
template <typename T>
struct Quad16 {
  static __device__ void Load(const uint16_t* p, int64_t q, float out[4]) {
    const uint2 v = reinterpret_cast<const uint2*>(p)[q];
    out[0] = T::ToFloat(static_cast<uint16_t>(v.x & 0xffffu));
    out[1] = T::ToFloat(static_cast<uint16_t>(v.x >> 16));
    out[2] = T::ToFloat(static_cast<uint16_t>(v.y & 0xffffu));
    out[3] = T::ToFloat(static_cast<uint16_t>(v.y >> 16));
  }
  static __device__ void Store(uint16_t* p, int64_t q, const float in[4]) {
    uint2 v;
    v.x = static_cast<uint32_t>(T::FromFloat(in[0])) |
          (static_cast<uint32_t>(T::FromFloat(in[1])) << 16);
    v.y = static_cast<uint32_t>(T::FromFloat(in[2])) |
          (static_cast<uint32_t>(T::FromFloat(in[3])) << 16);
    reinterpret_cast<uint2*>(p)[q] = v;
  }
};
template <>
struct Quad<F16Type> : Quad16<F16Type> {};
template <>
struct Quad<BF16Type> : Quad16<BF16Type> {};

__device__ void CountIfNonFinite(const AdamStepScalars& s, float raw,
                                 unsigned long long* nonfinite_count) {
  if (nonfinite_count != nullptr && !isfinite(AdamEffectiveGrad(s, raw))) {
    atomicAdd(nonfinite_count, 1ull);
  }
}

// One element per thread. No __restrict__ on grad/param: they may alias.
template <typename T>
__global__ void AdamScalarKernel(AdamStepScalars s, const typename T::Storage* grad,
                                 typename T::Storage* param, float* __restrict__ master,
                                 float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                                 int64_t n_elems, unsigned long long* nonfinite_count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_elems;
       i += stride) {
    const float raw = T::ToFloat(grad[i]);
    CountIfNonFinite(s, raw, nonfinite_count);
    float p = master[i];
    float m = exp_avg[i];
    float v = exp_avg_sq[i];
    AdamUpdate(s, raw, p, m, v);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (param != nullptr) param[i] = T::FromFloat(p);
  }
}

// Four elements per thread, `n_quads` groups of four.
template <typename T>
__global__ void AdamQuadKernel(AdamStepScalars s, const typename T::Storage* grad,
                               typename T::Storage* param, float* __restrict__ master,
                               float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                               int64_t n_quads, unsigned long long* nonfinite_count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < n_quads;
       q += stride) {
    float raw[4], p[4], m[4], v[4];
    Quad<T>::Load(grad, q, raw);
    Quad<F32Type>::Load(master, q, p);
    Quad<F32Type>::Load(exp_avg, q, m);
    Quad<F32Type>::Load(exp_avg_sq, q, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      CountIfNonFinite(s, raw[j], nonfinite_count);
      AdamUpdate(s, raw[j], p[j], m[j], v[j]);
    }
    Quad<F32Type>::Store(master, q, p);
    Quad<F32Type>::Store(exp_avg, q, m);
    Quad<F32Type>::Store(exp_avg_sq, q, v);
    if (param != nullptr) Quad<T>::Store(param, q, p);
  }
}

// One CUDA block per CPU block (optimizer/grad_stats_math.h): the f32 accumulators of every tile
// in parallel (thread j of a tile's 4 * lanes takes accumulator j / lanes, lane j % lanes: a warp
// reads consecutive elements), then each tile's double sum in the CPU's order, then the block's
// sum over its tiles in order, recounting a tile whose fast sum is not finite.
template <typename T>
__global__ void GradStatsKernel(const typename T::Storage* __restrict__ grad, int64_t n_elems,
                                int64_t first_block, GradStatsOrder order,
                                double* __restrict__ block_sums,
                                unsigned long long* nonfinite_count) {
  __shared__ float accumulators[kGradStatsMaxTilesPerBlock][4 * kGradStatsMaxLanes];
  __shared__ double tile_sums[kGradStatsMaxTilesPerBlock];
  const int lanes = order.lanes;
  const int slots = 4 * lanes;
  const int64_t begin = (first_block + blockIdx.x) * order.block_elems;
  const int64_t len = n_elems - begin < order.block_elems ? n_elems - begin : order.block_elems;
  const int tiles = static_cast<int>((len + order.tile_elems - 1) / order.tile_elems);
  const auto tile_len = [&](int t) {
    const int64_t rest = len - t * order.tile_elems;
    return rest < order.tile_elems ? rest : order.tile_elems;
  };
  for (int task = threadIdx.x; task < tiles * slots; task += blockDim.x) {
    const int t = task / slots;
    const int slot = task % slots;
    const typename T::Storage* x = grad + begin + t * order.tile_elems;
    accumulators[t][slot] = SumSquaresAccumulator(
        [x](int64_t i) { return T::ToFloat(x[i]); }, tile_len(t), lanes, slot / lanes,
        slot % lanes, order.fused);
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < tiles) {
    const int t = threadIdx.x;
    const typename T::Storage* x = grad + begin + t * order.tile_elems;
    tile_sums[t] = SumSquaresFromAccumulators(
        [x](int64_t i) { return T::ToFloat(x[i]); }, tile_len(t), lanes,
        [&](int a, int lane) { return accumulators[t][a * lanes + lane]; });
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    int64_t bad = 0;
    for (int t = 0; t < tiles; ++t) {
      if (isfinite(tile_sums[t])) {
        sum += tile_sums[t];
      } else {
        const typename T::Storage* x = grad + begin + t * order.tile_elems;
        AddTileSquaresSlowly([x](int64_t i) { return T::ToFloat(x[i]); }, tile_len(t), sum, bad);
      }
    }
    block_sums[blockIdx.x] = sum;
    if (bad != 0) atomicAdd(nonfinite_count, static_cast<unsigned long long>(bad));
  }
}

// acc[i] += widen(grad[i]), one element per thread (the kernel is bound by memory or, for a
// mapped host accumulator, by the bus; wider accesses would not change that).
template <typename T>
__global__ void AccumulateKernel(const typename T::Storage* __restrict__ grad,
                                 float* __restrict__ acc, int64_t n_elems) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_elems;
       i += stride) {
    acc[i] = T::Accumulate(acc[i], grad[i]);
  }
}

unsigned int BlocksFor(int64_t work_items, int64_t max_blocks) {
  return static_cast<unsigned int>(
      std::min<int64_t>((work_items + kThreadsPerBlock - 1) / kThreadsPerBlock, max_blocks));
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
cudaError_t LaunchStep(const AdamStepScalars& s, const void* grad_v, void* param_v, float* master,
                       float* exp_avg, float* exp_avg_sq, int64_t n_elems,
                       unsigned long long* nonfinite_count, cudaStream_t stream) {
  using Storage = typename T::Storage;
  const auto* grad = static_cast<const Storage*>(grad_v);
  auto* param = static_cast<Storage*>(param_v);
  const uintptr_t quad_bytes = 4 * sizeof(Storage);
  const bool quads = Aligned(master, 16) && Aligned(exp_avg, 16) && Aligned(exp_avg_sq, 16) &&
                     Aligned(grad, quad_bytes) && (param == nullptr || Aligned(param, quad_bytes));
  int64_t done = 0;
  if (quads && n_elems >= 4) {
    const int64_t n_quads = n_elems / 4;
    AdamQuadKernel<T><<<BlocksFor(n_quads, kMaxBlocks), kThreadsPerBlock, 0, stream>>>(
        s, grad, param, master, exp_avg, exp_avg_sq, n_quads, nonfinite_count);
    done = n_quads * 4;
  }
  if (done < n_elems) {
    AdamScalarKernel<T><<<BlocksFor(n_elems - done, kMaxBlocks), kThreadsPerBlock, 0, stream>>>(
        s, grad + done, param == nullptr ? nullptr : param + done, master + done, exp_avg + done,
        exp_avg_sq + done, n_elems - done, nonfinite_count);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchStats(const void* grad, int64_t n_elems, int64_t first_block, int64_t n_blocks,
                        const GradStatsOrder& order, double* block_sums,
                        unsigned long long* nonfinite_count, cudaStream_t stream) {
  GradStatsKernel<T><<<static_cast<unsigned int>(n_blocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<const typename T::Storage*>(grad), n_elems, first_block, order, block_sums,
      nonfinite_count);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAccumulate(const void* grad, float* acc, int64_t n_elems, cudaStream_t stream) {
  AccumulateKernel<T><<<BlocksFor(n_elems, kMaxBlocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<const typename T::Storage*>(grad), acc, n_elems);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAdamStep(const AdamStepScalars& scalars, GradType type, const void* grad,
                           void* param, float* master, float* exp_avg, float* exp_avg_sq,
                           int64_t n_elems, unsigned long long* nonfinite_count,
                           cudaStream_t stream) {
  if (n_elems < 0) return cudaErrorInvalidValue;
  if (n_elems == 0) return cudaSuccess;
  if (grad == nullptr || master == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr ||
      (param == nullptr && type != GradType::kF32)) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case GradType::kF32:
      return LaunchStep<F32Type>(scalars, grad, param, master, exp_avg, exp_avg_sq, n_elems,
                                 nonfinite_count, stream);
    case GradType::kF16:
      return LaunchStep<F16Type>(scalars, grad, param, master, exp_avg, exp_avg_sq, n_elems,
                                 nonfinite_count, stream);
    case GradType::kBF16:
      return LaunchStep<BF16Type>(scalars, grad, param, master, exp_avg, exp_avg_sq, n_elems,
                                  nonfinite_count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchGradStats(GradType type, const void* grad, int64_t n_elems, int64_t first_block,
                            int64_t n_blocks, const GradStatsOrder& order, double* block_sums,
                            unsigned long long* nonfinite_count, cudaStream_t stream) {
  if (n_elems <= 0 || grad == nullptr || block_sums == nullptr || nonfinite_count == nullptr ||
      order.lanes < 1 || order.lanes > kGradStatsMaxLanes || order.tile_elems < 1 ||
      order.block_elems < order.tile_elems || order.block_elems % order.tile_elems != 0 ||
      order.block_elems / order.tile_elems > kGradStatsMaxTilesPerBlock || n_blocks < 1 ||
      n_blocks > kGradStatsMaxBlocks || first_block < 0 ||
      (first_block + n_blocks - 1) * order.block_elems >= n_elems) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case GradType::kF32:
      return LaunchStats<F32Type>(grad, n_elems, first_block, n_blocks, order, block_sums,
                                  nonfinite_count, stream);
    case GradType::kF16:
      return LaunchStats<F16Type>(grad, n_elems, first_block, n_blocks, order, block_sums,
                                  nonfinite_count, stream);
    case GradType::kBF16:
      return LaunchStats<BF16Type>(grad, n_elems, first_block, n_blocks, order, block_sums,
                                   nonfinite_count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchAccumulateGrads(GradType type, const void* grad, float* acc, int64_t n_elems,
                                  cudaStream_t stream) {
  if (n_elems < 0) return cudaErrorInvalidValue;
  if (n_elems == 0) return cudaSuccess;
  if (grad == nullptr || acc == nullptr) return cudaErrorInvalidValue;
  switch (type) {
    case GradType::kF32:
      return LaunchAccumulate<F32Type>(grad, acc, n_elems, stream);
    case GradType::kF16:
      return LaunchAccumulate<F16Type>(grad, acc, n_elems, stream);
    case GradType::kBF16:
      return LaunchAccumulate<BF16Type>(grad, acc, n_elems, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace ps
