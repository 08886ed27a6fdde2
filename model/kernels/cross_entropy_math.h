// The per-logit and per-row arithmetic of the fused LM head + cross-entropy (see
// model/kernels/lm_head_cross_entropy.h for the math), as PS_HOST_DEVICE functions shared by the
// CPU kernel, the CUDA kernels (model/kernels/cuda/) and the tests. The log-sum-exp over
// vocabulary tiles is model/kernels/softmax_math.h's SoftmaxState (tiles merge with SoftmaxMerge /
// SoftmaxRescale).
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_CROSS_ENTROPY_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_CROSS_ENTROPY_MATH_H_

#include <cmath>

#include "base/host_device.h"
#include "model/kernels/softmax_math.h"

namespace ps {

// One row's loss -log softmax(z)[t] = lse - z_t, taken in double (the loss is summed in double).
template <typename T>
PS_HOST_DEVICE double CrossEntropyRowLoss(T row_lse, T target_logit) {
  return static_cast<double>(row_lse) - static_cast<double>(target_logit);
}

// dL/dz_v = scale * (softmax(z)_v - [v == t]) = scale * exp(z_v - lse) - (v == t ? scale : 0),
// where scale = dL/dloss / (number of non-ignored rows).
template <typename T>
PS_HOST_DEVICE T CrossEntropyLogitGrad(T logit, T row_lse, T scale, bool is_target) {
  const T g = scale * std::exp(logit - row_lse);
  return is_target ? g - scale : g;
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_CROSS_ENTROPY_MATH_H_
