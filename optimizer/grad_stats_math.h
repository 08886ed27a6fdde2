// The gradient statistics (sum of squares, Inf/NaN count) in exactly the order of the CPU kernel
// (optimizer/cpu_adam.cc StatsBlock and SumSquares), as PS_HOST_DEVICE scalar code: the CUDA
// kernel (optimizer/cuda/adam_kernels.cu) runs it so that a chunk's GradStats, and so the global
// norm and the clipping coefficient, have the same bits whichever device computed them; the CPU
// tests run it against CpuAdam.
//
// The CPU order, per segment: blocks of kCpuAdamBlockElems from the segment's start; per block,
// tiles of kCpuAdamTileElems; per tile, SumSquares with `lanes` f32 lanes (the SIMD width of the
// CPU target that runs: 8 on AVX2, 16 on AVX-512) in four vector accumulators:
//   acc[a][l] += x[k*4L + a*L + l]^2     for the whole groups of 4L elements (k ascending),
//   acc[0][l] += x[i0 + g*L + l]^2       for the whole vectors after them (g ascending),
// each a multiply-add (fused on targets with native FMA), then in double
//   sum = acc[0][0] + ... + acc[0][L-1] + acc[1][0] + ... + acc[3][L-1]   (left to right)
//   sum += double(x[i]) * x[i]           for the last n mod L elements.
// A tile whose sum is finite adds it to the block's sum; otherwise the tile is recounted
// element by element: Inf/NaN counted, the others' squares added in double to the block's sum.
// Blocks are then added in order, starting from 0.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_OPTIMIZER_GRAD_STATS_MATH_H_
#define PATRICKSTAR_OPTIMIZER_GRAD_STATS_MATH_H_

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace ps {

// x * x + acc, fused (one rounding) or not (two), as the CPU target's MulAdd is.
PS_HOST_DEVICE float SquareAdd(float x, float acc, bool fused) {
#if defined(__CUDA_ARCH__)
  return fused ? __fmaf_rn(x, x, acc) : __fadd_rn(__fmul_rn(x, x), acc);
#else
  if (fused) return std::fma(x, x, acc);
  const float square = x * x;  // rounded: the host build does not contract
  return square + acc;
#endif
}

// The f32 value of lane `lane` of accumulator `a` (0..3) after SumSquares' loops over the n
// values x(0), ..., x(n - 1) with `lanes` lanes. `x` is callable as float(int64_t).
template <typename X>
PS_HOST_DEVICE float SumSquaresAccumulator(const X& x, int64_t n, int lanes, int a, int lane,
                                           bool fused) {
  const int64_t group = 4 * static_cast<int64_t>(lanes);
  const int64_t whole_groups = n / group;
  float acc = 0.0f;
  for (int64_t k = 0; k < whole_groups; ++k) {
    acc = SquareAdd(x(k * group + static_cast<int64_t>(a) * lanes + lane), acc, fused);
  }
  if (a == 0) {
    for (int64_t i = whole_groups * group; i + lanes <= n; i += lanes) {
      acc = SquareAdd(x(i + lane), acc, fused);
    }
  }
  return acc;
}

// SumSquares' double result from its accumulators (`accumulator(a, lane)`, float) and the tail.
template <typename X, typename Accumulator>
PS_HOST_DEVICE double SumSquaresFromAccumulators(const X& x, int64_t n, int lanes,
                                                 const Accumulator& accumulator) {
  double sum = 0.0;
  for (int a = 0; a < 4; ++a) {
    for (int lane = 0; lane < lanes; ++lane) sum += static_cast<double>(accumulator(a, lane));
  }
  const int64_t vectors_end = n / lanes * lanes;
  for (int64_t i = vectors_end; i < n; ++i) {
    const double v = static_cast<double>(x(i));
    sum += v * v;
  }
  return sum;
}

// SumSquares of one tile of n values.
template <typename X>
PS_HOST_DEVICE double TileSumSquares(const X& x, int64_t n, int lanes, bool fused) {
  return SumSquaresFromAccumulators(x, n, lanes, [&](int a, int lane) {
    return SumSquaresAccumulator(x, n, lanes, a, lane, fused);
  });
}

// The recount of a tile whose fast sum was not finite (AddTileSlow), into a block's sums.
template <typename X>
PS_HOST_DEVICE void AddTileSquaresSlowly(const X& x, int64_t n, double& sum_squares,
                                         int64_t& nonfinite) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x(i);
#if defined(__CUDA_ARCH__)
    const bool finite = isfinite(v);
#else
    const bool finite = std::isfinite(v);
#endif
    if (!finite) {
      ++nonfinite;
    } else {
      sum_squares += static_cast<double>(v) * v;
    }
  }
}

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_GRAD_STATS_MATH_H_
