// Inverted dropout with a counter-based mask: whether element i is kept is a pure function of
// (seed, i, p), so the forward, the backward and a recomputed forward agree without storing a
// mask, and the CPU (model/kernels/cpu_kernels.h) and CUDA (model/kernels/cuda/) kernels agree bit
// for bit. The exact rule:
//   bits(seed, i)   = Mix64(seed ^ (i * 0x9E3779B97F4A7C15)) >> 40         (24 bits, uint64 math)
//   threshold(p)    = (uint32) (double(p) * 2^24 + 0.5)                      (round(p * 2^24))
//   keep(seed, i)   = bits(seed, i) >= threshold(p)
//   scale(p)        = 1.0f / (1.0f - p)                                      (f32, once per call)
//   forward:  y[i]  = keep ? x[i] * scale : 0
//   backward: dx[i] += keep ? dy[i] * scale : 0
// Mix64 is SplitMix64's finalizer (Steele, Lea, Flood 2014), a bijection of uint64 whose output
// bits are statistically independent of the input's, so the kept fraction is 1 - threshold/2^24
// (p to within 2^-25) and neighbouring i are independent. p == 0 keeps everything with scale 1
// (y = x exactly). REQUIRES: 0 <= p < 1.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_DROPOUT_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_DROPOUT_MATH_H_

#include <cstdint>

#include "base/host_device.h"

namespace ps {

// SplitMix64's output function.
PS_HOST_DEVICE uint64_t DropoutMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// round(p * 2^24): elements whose 24 random bits are below it are dropped.
PS_HOST_DEVICE uint32_t DropoutThreshold(float p) {
  return static_cast<uint32_t>(static_cast<double>(p) * 16777216.0 + 0.5);
}

// The factor kept elements are multiplied by.
PS_HOST_DEVICE float DropoutScale(float p) { return 1.0f / (1.0f - p); }

// Whether element i survives, for threshold = DropoutThreshold(p).
PS_HOST_DEVICE bool DropoutKeep(uint64_t seed, uint64_t i, uint32_t threshold) {
  const uint64_t bits = DropoutMix64(seed ^ (i * 0x9E3779B97F4A7C15ULL)) >> 40;
  return bits >= threshold;
}

// keep ? v * scale : 0 (the forward's value, and the backward's term).
// The product is rounded on its own (__fmul_rn on the device), so that a caller's `dx += term`
// is never contracted into a fused multiply-add there: CPU and GPU give the same bits.
PS_HOST_DEVICE float DropoutApply(uint64_t seed, uint64_t i, uint32_t threshold, float scale,
                                  float v) {
#if defined(__CUDA_ARCH__)
  return DropoutKeep(seed, i, threshold) ? __fmul_rn(v, scale) : 0.0f;
#else
  return DropoutKeep(seed, i, threshold) ? v * scale : 0.0f;
#endif
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_DROPOUT_MATH_H_
