// Gradient accumulation of one element: the arithmetic every AccumulateGradients kernel runs
// (optimizer/adam_kernels.h; CpuAdam on the host, the CUDA kernel of
// optimizer/cuda/adam_kernels.h on the GPU). PS_HOST_DEVICE, so the CPU tests check the very
// function the GPU kernel calls.
//
//   acc <- acc + widen(g)
//
// widen() is exact (f16 and bf16 are subsets of f32): memory/dtype_math.h's bit conversions, which
// return a quiet NaN for a NaN input, as memory/convert.h does on every SIMD target. The one
// rounding is the f32 addition (round to nearest even on both devices; an add alone is never
// contracted into a fused multiply-add), so CPU and GPU accumulators agree bit for bit, NaN
// payloads aside.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_OPTIMIZER_GRAD_ACCUMULATE_MATH_H_
#define PATRICKSTAR_OPTIMIZER_GRAD_ACCUMULATE_MATH_H_

#include <cstdint>

#include "base/host_device.h"
#include "memory/dtype_math.h"

namespace ps {

// acc + g for an f32 gradient.
PS_HOST_DEVICE float AccumulateGradF32(float acc, float grad) { return acc + grad; }

// acc + g for an f16 gradient given as its bits.
PS_HOST_DEVICE float AccumulateGradF16(float acc, uint16_t grad_bits) {
  return acc + HalfBitsToFloat(grad_bits);
}

// acc + g for a bf16 gradient given as its bits.
PS_HOST_DEVICE float AccumulateGradBF16(float acc, uint16_t grad_bits) {
  return acc + BFloat16BitsToFloat(grad_bits);
}

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_GRAD_ACCUMULATE_MATH_H_
