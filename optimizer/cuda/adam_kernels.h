// The Adam kernels on the GPU: the fused update (optimizer/adam_math.h's AdamUpdate, element for
// element — the very function the CPU tests check; adam_kernels.cu is compiled with --fmad=false,
// so only its explicit fused multiply-adds are fused and the result is CpuAdam's bit for bit on
// FMA targets), the gradient statistics pass (in CpuAdam's summation order,
// optimizer/grad_stats_math.h), and gradient accumulation (optimizer/grad_accumulate_math.h). The
// host wrapper implementing optimizer/adam_kernels.h is optimizer/cuda/cuda_adam.h.
//
// The launchers are plain C++ (no Abseil; includable from host code compiled by the host
// compiler): they enqueue on `stream` and return the launch status from cudaGetLastError(). They
// never allocate and never synchronize; callers own the stream and the workspaces.
//
// Vectorized loads: when master, exp_avg and exp_avg_sq are 16-byte aligned and grad/param are
// aligned to four of their elements, the update runs four elements per thread with float4 (and
// uint2 for 16-bit gradients and parameters) loads and stores; the remaining 0-3 elements, and any
// segment not so aligned, run one element per thread. Pointers need only their element alignment.
//
// Thread safety: as for any kernel launch; the launchers have no state.
#ifndef PATRICKSTAR_OPTIMIZER_CUDA_ADAM_KERNELS_H_
#define PATRICKSTAR_OPTIMIZER_CUDA_ADAM_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "optimizer/adam_math.h"

namespace ps {
namespace cuda {

// Element type of gradients and parameters; the values equal ps::DType's (memory/dtype.h), which
// is not included here to keep Abseil out of nvcc.
enum class GradType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// CPU-order blocks one statistics launch covers at most; its workspace holds one double per block.
inline constexpr int kGradStatsMaxBlocks = 1024;
// Limits of the CPU order the statistics kernel reproduces: tiles per block, f32 lanes.
inline constexpr int64_t kGradStatsMaxTilesPerBlock = 32;
inline constexpr int kGradStatsMaxLanes = 16;

// The CPU kernel's summation order (optimizer/grad_stats_math.h): blocks of `block_elems` from the
// segment's start, tiles of `tile_elems`, `lanes` f32 lanes, multiply-adds fused or not.
struct GradStatsOrder {
  int64_t block_elems = 0;
  int64_t tile_elems = 0;
  int lanes = 0;
  bool fused = true;
};

// The fused Adam update of n_elems elements (see AdamSegment in optimizer/adam_kernels.h):
// reads grad[i], updates master/exp_avg/exp_avg_sq[i], writes param[i] = master[i] rounded to
// `type` (param may equal grad; with kF32 it may be null). For every effective gradient that is
// Inf or NaN, *nonfinite_count is incremented (device memory; may be null).
// REQUIRES: device pointers valid for n_elems elements until the kernel ran. n_elems == 0 launches
// nothing; n_elems < 0, an unknown type, or a null array (n_elems > 0) is cudaErrorInvalidValue.
cudaError_t LaunchAdamStep(const AdamStepScalars& scalars, GradType type, const void* grad,
                           void* param, float* master, float* exp_avg, float* exp_avg_sq,
                           int64_t n_elems, unsigned long long* nonfinite_count,
                           cudaStream_t stream);

// Gradient statistics of blocks [first_block, first_block + n_blocks) of a segment of n_elems
// gradients, in `order` (the CPU kernel's, so the caller adding block_sums[0, n_blocks) in index
// order after the blocks before them gets CpuAdam's bits): writes block b's sum of squares of the
// finite gradients (double) to block_sums[b - first_block] (device) and adds its Inf/NaN count to
// *nonfinite_count. One CUDA block per CPU block.
// REQUIRES: 1 <= n_blocks <= kGradStatsMaxBlocks, the blocks lie in the segment, 1 <= lanes <=
// kGradStatsMaxLanes, block_elems a multiple of tile_elems with at most
// kGradStatsMaxTilesPerBlock tiles; otherwise cudaErrorInvalidValue.
cudaError_t LaunchGradStats(GradType type, const void* grad, int64_t n_elems, int64_t first_block,
                            int64_t n_blocks, const GradStatsOrder& order, double* block_sums,
                            unsigned long long* nonfinite_count, cudaStream_t stream);

// Gradient accumulation: acc[i] = acc[i] + grad[i] widened to f32 (AccumulateGradF32/F16/BF16 of
// optimizer/grad_accumulate_math.h), i in [0, n_elems). Both pointers must be addressable by the
// device: device memory, or pinned host memory mapped into the unified address space (then each
// element crosses the bus once each way).
// REQUIRES: grad and acc do not overlap. n_elems == 0 launches nothing; n_elems < 0, an unknown
// type, or a null pointer (n_elems > 0) is cudaErrorInvalidValue.
cudaError_t LaunchAccumulateGrads(GradType type, const void* grad, float* acc, int64_t n_elems,
                                  cudaStream_t stream);

}  // namespace cuda
}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_CUDA_ADAM_KERNELS_H_
