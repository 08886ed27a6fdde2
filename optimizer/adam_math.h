// The Adam and AdamW update of one element: the scalar reference every Adam kernel of this project
// implements (the Highway CPU kernel in optimizer/cpu_adam.h, the CUDA kernel in
// optimizer/cuda/adam_kernels.h). It is PS_HOST_DEVICE, so the CPU tests, the kernels' tail loops
// and the GPU kernel run this very arithmetic.
//
// One step t = 1, 2, ... of Adam (Kingma & Ba) on a parameter p with gradient g, in the order of
// torch.optim.Adam / torch.optim.AdamW (amsgrad off, maximize off):
//
//   g <- g / loss_scale * clip_coef            undo the loss scale, apply global-norm clipping
//   Adam  (L2):        g <- g + weight_decay * p
//   AdamW (decoupled): p <- p * (1 - lr * weight_decay)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Bias correction is always applied. The per-step constants (everything but g, p, m, v) are
// computed once per step on the host in double precision and rounded to f32 (MakeAdamStepScalars);
// the element-wise work is f32. Two deliberate differences from PyTorch's code, both of rounding
// only: PyTorch updates m with lerp (m + (1-beta1)(g-m)) where we use the textbook form above,
// and we multiply by 1/sqrt(1-beta2^t) instead of dividing by sqrt(1-beta2^t).
//
// The multiply-adds are explicit and fused (FusedMulAdd: std::fma on the host, __fmaf_rn on the
// GPU) exactly where the Highway kernel uses MulAdd/NegMulAdd, and every other product and sum is
// rounded on its own (adam_kernels.cu is compiled with --fmad=false, the host build contracts
// nothing). So the CPU kernel on a target with native FMA (AVX2, AVX-512: its vectors and its
// scalar tail), the CUDA kernel and this reference give the same bits: a chunk's Adam step is the
// same whichever device runs it (a resumed run replays the warm-up step on the CPU). A target
// without native FMA (SSE4, the emulated scalar one) rounds the vector products separately and
// agrees within a few ULP.
//
// Thread safety: pure functions and value types.
#ifndef PATRICKSTAR_OPTIMIZER_ADAM_MATH_H_
#define PATRICKSTAR_OPTIMIZER_ADAM_MATH_H_

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace ps {

// L2 (weight decay added to the gradient, torch.optim.Adam) or decoupled weight decay
// (torch.optim.AdamW).
enum class AdamMode : uint8_t { kAdam = 0, kAdamW = 1 };

// Everything an Adam kernel needs besides the four arrays, for one step of one parameter group.
// Plain data (copyable to a GPU kernel argument). Build with MakeAdamStepScalars.
struct AdamStepScalars {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  // lr / (1 - beta1^t).
  float step_size = 1e-3f;
  // 1 / sqrt(1 - beta2^t).
  float inv_sqrt_bias_correction2 = 1.0f;
  // Adam: weight_decay (added to the gradient times p). AdamW: 0.
  float l2 = 0.0f;
  // AdamW: 1 - lr * weight_decay (p is multiplied by it). Adam: 1.
  float decay = 1.0f;
  // The gradient is divided by this (the loss scale; 1 without loss scaling). > 0.
  float loss_scale = 1.0f;
  // Then multiplied by this (global-norm clipping coefficient, in (0, 1]; 1 without clipping).
  float clip_coef = 1.0f;
};

// Per-step constants for step `step` (1-based: the first update is step 1) of a group with these
// hyperparameters. Computed in double and rounded to f32 once.
// REQUIRES: step >= 1, 0 <= beta1 < 1, 0 <= beta2 < 1, loss_scale > 0 (callers validate; see
// optimizer/hybrid_adam.h for the checked entry point).
inline AdamStepScalars MakeAdamStepScalars(AdamMode mode, double lr, double beta1, double beta2,
                                           double eps, double weight_decay, int64_t step,
                                           double loss_scale = 1.0, double clip_coef = 1.0) {
  AdamStepScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  s.step_size = static_cast<float>(lr / bias_correction1);
  s.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  if (mode == AdamMode::kAdam) {
    s.l2 = static_cast<float>(weight_decay);
    s.decay = 1.0f;
  } else {
    s.l2 = 0.0f;
    s.decay = static_cast<float>(1.0 - lr * weight_decay);
  }
  s.loss_scale = static_cast<float>(loss_scale);
  s.clip_coef = static_cast<float>(clip_coef);
  return s;
}

// a * b + c rounded once (IEEE fused multiply-add) on the host and the GPU alike.
PS_HOST_DEVICE float FusedMulAdd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The effective gradient: raw / loss_scale * clip_coef.
PS_HOST_DEVICE float AdamEffectiveGrad(const AdamStepScalars& s, float raw_grad) {
  return raw_grad / s.loss_scale * s.clip_coef;
}

// One Adam/AdamW update of one element, in place. `raw_grad` is the gradient as stored (still
// multiplied by the loss scale). The L2 term is skipped when l2 == 0 and the decay when decay == 1,
// so an Inf/NaN master value is never multiplied by a zero coefficient into a NaN it was not.
PS_HOST_DEVICE void AdamUpdate(const AdamStepScalars& s, float raw_grad, float& param,
                               float& exp_avg, float& exp_avg_sq) {
  // Each FusedMulAdd is a Highway MulAdd (NegMulAdd for the last) in optimizer/cpu_adam.cc's
  // AdamLoop, in the same order; keep the two in step.
  float g = AdamEffectiveGrad(s, raw_grad);
  float p = param;
  if (s.l2 != 0.0f) g = FusedMulAdd(s.l2, p, g);
  if (s.decay != 1.0f) p = p * s.decay;
  const float m = FusedMulAdd(s.beta1, exp_avg, s.one_minus_beta1 * g);
  const float v = FusedMulAdd(s.beta2, exp_avg_sq, (s.one_minus_beta2 * g) * g);
#if defined(__CUDA_ARCH__)
  const float denom = FusedMulAdd(sqrtf(v), s.inv_sqrt_bias_correction2, s.eps);
#else
  const float denom = FusedMulAdd(std::sqrt(v), s.inv_sqrt_bias_correction2, s.eps);
#endif
  p = FusedMulAdd(-s.step_size, m / denom, p);
  exp_avg = m;
  exp_avg_sq = v;
  param = p;
}

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_ADAM_MATH_H_
