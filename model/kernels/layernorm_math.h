// The per-row and per-element arithmetic of LayerNorm (see model/kernels/layernorm.h for the
// math), as PS_HOST_DEVICE functions shared by the CPU kernel, the CUDA kernel
// (model/kernels/cuda/) and the tests. The kernels differ only in how they take the row sums
// (the CPU in index order, the GPU in a tree); what they do with the sums is written once, here.
//
// Expressions are evaluated in exactly the order written (no reassociation), which the CPU kernels'
// bit-for-bit reproducibility relies on.
//
// Thread safety: pure functions and value types.
#ifndef PATRICKSTAR_MODEL_KERNELS_LAYERNORM_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_LAYERNORM_MATH_H_

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace ps {

// mean = sum / C.
template <typename T>
PS_HOST_DEVICE T LayerNormMean(T sum, int64_t channels) {
  return sum / static_cast<T>(channels);
}

// rstd = 1 / sqrt(sum_sq / C + eps), sum_sq = sum_c (x_c - mean)^2 (biased variance, as PyTorch).
template <typename T>
PS_HOST_DEVICE T LayerNormRstd(T sum_sq, int64_t channels, T eps) {
  return T{1} / std::sqrt(sum_sq / static_cast<T>(channels) + eps);
}

// xhat = (x - mean) * rstd.
template <typename T>
PS_HOST_DEVICE T LayerNormXhat(T x, T mean, T rstd) {
  return (x - mean) * rstd;
}

// y = (x - mean) * rstd * w + b.
template <typename T>
PS_HOST_DEVICE T LayerNormOutput(T x, T mean, T rstd, T w, T b) {
  return (x - mean) * rstd * w + b;
}

// The two per-element terms of the backward's row reductions: g = dy * w (the gradient reaching
// xhat) and g * xhat.
template <typename T>
struct LayerNormGradTerms {
  T g;
  T g_xhat;
};
template <typename T>
PS_HOST_DEVICE LayerNormGradTerms<T> LayerNormBackwardTerms(T dy, T w, T x, T mean, T rstd) {
  const T g = dy * w;
  return LayerNormGradTerms<T>{g, g * (x - mean) * rstd};
}

// dL/dx_c = rstd * (g_c - mean(g) - xhat_c * mean(g * xhat)), with g_mean = sum(g) / C and
// g_xhat_mean = sum(g * xhat) / C.
template <typename T>
PS_HOST_DEVICE T LayerNormInputGrad(T dy, T w, T x, T mean, T rstd, T g_mean, T g_xhat_mean) {
  const T xhat = LayerNormXhat(x, mean, rstd);
  return rstd * (dy * w - g_mean - xhat * g_xhat_mean);
}

// One row's contribution to dL/dw_c: dy_c * xhat_c (dL/db_c's is dy_c itself).
template <typename T>
PS_HOST_DEVICE T LayerNormWeightGradTerm(T dy, T x, T mean, T rstd) {
  return dy * (x - mean) * rstd;
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_LAYERNORM_MATH_H_
