// The per-score arithmetic of causal attention (see model/kernels/gqa_attention.h for the math), as
// PS_HOST_DEVICE functions shared by the CPU kernel, the CUDA kernels (model/kernels/cuda/) and the
// tests. The streaming softmax over key tiles is model/kernels/softmax_math.h's SoftmaxState: per
// tile the running max moves to max(m, tile max), the running sum and output row are multiplied by
// SoftmaxRescale(m, m'), and each score s contributes p = SoftmaxWeight(s, m') = exp(s - m').
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_ATTENTION_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_ATTENTION_MATH_H_

#include <cmath>
#include <cstdint>

#include "base/host_device.h"
#include "model/kernels/softmax_math.h"

namespace ps {

// The score scale 1 / sqrt(head_dim).
template <typename T>
PS_HOST_DEVICE T AttentionScale(int64_t head_dim) {
  return T{1} / std::sqrt(static_cast<T>(head_dim));
}

// The first key query t sees: max(key_start, t - window + 1), or key_start when window is 0
// (no sliding window). The last key it sees is t itself (causal), so it always sees at least one.
// With key_start non-decreasing in t the first key is too, which the kernels' tile skipping uses.
PS_HOST_DEVICE int64_t AttentionFirstKey(int64_t t, int64_t key_start, int64_t window) {
  const int64_t window_start = window > 0 ? t - window + 1 : 0;
  return key_start > window_start ? key_start : window_start;
}

// The probability P_ij = exp(s_ij - lse_i), recomputed in the backward pass from the score and
// the forward's saved log-sum-exp of the row.
template <typename T>
PS_HOST_DEVICE T AttentionProbability(T score, T row_lse) {
  return std::exp(score - row_lse);
}

// The score gradient through the softmax Jacobian: dS_ij = P_ij (dP_ij - D_i), with
// dP_ij = dO_i . v_j and D_i = dO_i . out_i = sum_j P_ij dP_ij.
template <typename T>
PS_HOST_DEVICE T AttentionScoreGrad(T p, T dp, T row_d) {
  return p * (dp - row_d);
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_ATTENTION_MATH_H_
