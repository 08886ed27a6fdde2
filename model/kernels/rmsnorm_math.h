// The per-row and per-element arithmetic of RMSNorm (see model/kernels/rmsnorm.h for the math), as
// PS_HOST_DEVICE functions shared by the CPU kernel, the CUDA kernel (model/kernels/cuda/) and the
// tests. The kernels differ only in how they take the row sums (the CPU in vector accumulators,
// the GPU in a warp tree); what they do with the sums is written once, here.
//
// Expressions are evaluated in exactly the order written (no reassociation). The forward rounds
// like Hugging Face's LlamaRMSNorm in f32: xhat = x * rstd first, then w * xhat.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_RMSNORM_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_RMSNORM_MATH_H_

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace ps {

// rstd = 1 / sqrt(sum_sq / C + eps), sum_sq = sum_c x_c^2 (the mean square; no mean is removed).
template <typename T>
PS_HOST_DEVICE T RmsNormRstd(T sum_sq, int64_t channels, T eps) {
  return T{1} / std::sqrt(sum_sq / static_cast<T>(channels) + eps);
}

// y = w * (x * rstd).
template <typename T>
PS_HOST_DEVICE T RmsNormOutput(T x, T rstd, T w) {
  return w * (x * rstd);
}

// The per-element term of the backward's row reduction: g * xhat with g = dy * w (the gradient
// reaching xhat) and xhat = x * rstd.
template <typename T>
PS_HOST_DEVICE T RmsNormGradTerm(T dy, T w, T x, T rstd) {
  return (dy * w) * (x * rstd);
}

// dL/dx_c = rstd * (g_c - xhat_c * mean(g * xhat)), with g_xhat_mean = sum(g * xhat) / C.
template <typename T>
PS_HOST_DEVICE T RmsNormInputGrad(T dy, T w, T x, T rstd, T g_xhat_mean) {
  return rstd * (dy * w - (x * rstd) * g_xhat_mean);
}

// One row's contribution to dL/dw_c: dy_c * xhat_c.
template <typename T>
PS_HOST_DEVICE T RmsNormWeightGradTerm(T dy, T x, T rstd) {
  return dy * (x * rstd);
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_RMSNORM_MATH_H_
