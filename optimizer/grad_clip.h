// Gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_: when the norm of
// all gradients together (every chunk; across ranks once comm/ all-reduces GradStats) exceeds
// max_norm, every gradient is multiplied by max_norm / (norm + 1e-6). This is a true norm clip,
// which keeps the update's direction — PatrickStar instead clamped each element to
// [-clip * loss_scale, clip * loss_scale] (reference notes §1.13), which changes it.
//
// The coefficient is applied inside the Adam kernels (AdamStepScalars::clip_coef), so clipping
// costs no extra pass over the gradients; the norm comes from the GradientStats pass the overflow
// check needs anyway.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_OPTIMIZER_GRAD_CLIP_H_
#define PATRICKSTAR_OPTIMIZER_GRAD_CLIP_H_

#include <algorithm>
#include <cmath>

namespace ps {

// torch.nn.utils.clip_grad_norm_'s epsilon in the denominator.
inline constexpr double kClipNormEpsilon = 1e-6;

// The factor to multiply every (unscaled) gradient by: min(1, max_norm / (total_norm + 1e-6)).
// max_norm <= 0 disables clipping (returns 1). REQUIRES: total_norm is finite and >= 0 (a step
// with Inf/NaN gradients is skipped before clipping).
inline double ClipCoefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0;
  return std::min(1.0, max_norm / (total_norm + kClipNormEpsilon));
}

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_GRAD_CLIP_H_
