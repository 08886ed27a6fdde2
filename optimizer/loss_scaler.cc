#include "optimizer/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<LossScaler> LossScaler::Static(double scale) {
  if (!(scale > 0.0) || !(scale <= kMaxLossScale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16.loss_scale must be in (0, 2^100] for a static loss scale (0 selects the dynamic "
        "scaler), got ",
        scale));
  }
  LossScalerState state;
  state.scale = scale;
  return LossScaler(/*dynamic=*/false, DynamicLossScalerOptions{}, state);
}

LossScaler LossScaler::None() {
  return LossScaler(/*dynamic=*/false, DynamicLossScalerOptions{}, LossScalerState{});
}

absl::StatusOr<LossScaler> LossScaler::Dynamic(const DynamicLossScalerOptions& options) {
  if (options.initial_scale_power < 0 || options.initial_scale_power > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp16.initial_scale_power must be in [0, 100] (the initial scale is 2^power), "
                     "got ",
                     options.initial_scale_power));
  }
  if (options.loss_scale_window < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16.loss_scale_window must be >= 1 clean steps, got ", options.loss_scale_window));
  }
  if (options.hysteresis < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp16.hysteresis must be >= 1, got ", options.hysteresis));
  }
  if (!(options.min_loss_scale > 0.0) || !(options.min_loss_scale <= kMaxLossScale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp16.min_loss_scale must be in (0, 2^100], got ", options.min_loss_scale));
  }
  if (!(options.scale_factor > 1.0) || !std::isfinite(options.scale_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler scale_factor must be finite and > 1, got ", options.scale_factor));
  }
  LossScalerState state;
  state.scale = std::ldexp(1.0, options.initial_scale_power);
  state.hysteresis_left = options.hysteresis;
  return LossScaler(/*dynamic=*/true, options, state);
}

absl::Status LossScaler::Update(bool overflow) {
  absl::Status status;
  if (dynamic_) {
    if (overflow) {
      if (options_.hysteresis == 1 || state_.hysteresis_left == 1) {
        if (state_.scale == options_.min_loss_scale && options_.error_at_min_scale) {
          status = absl::OutOfRangeError(absl::StrCat(
              "gradients overflowed (Inf/NaN) at iteration ", state_.iteration,
              " while the loss scale is already at fp16.min_loss_scale = ", options_.min_loss_scale,
              "; training cannot continue. Lower the learning rate, check the model and data for "
              "NaNs, or lower fp16.min_loss_scale"));
        } else {
          state_.scale = std::max(state_.scale / options_.scale_factor, options_.min_loss_scale);
        }
      } else {
        --state_.hysteresis_left;
      }
      state_.last_overflow_iteration = state_.iteration;
    } else {
      if (options_.consecutive_hysteresis) state_.hysteresis_left = options_.hysteresis;
      if ((state_.iteration - state_.last_overflow_iteration) % options_.loss_scale_window == 0) {
        if (!options_.consecutive_hysteresis) state_.hysteresis_left = options_.hysteresis;
        state_.scale = std::min(state_.scale * options_.scale_factor, kMaxLossScale);
      }
    }
  }
  ++state_.iteration;
  return status;
}

absl::Status LossScaler::Restore(const LossScalerState& state) {
  const double min_scale = dynamic_ ? options_.min_loss_scale : 0.0;
  if (!(state.scale > 0.0) || state.scale < min_scale || !(state.scale <= kMaxLossScale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss scaler state: scale ", state.scale,
                                                   " is outside [", dynamic_ ? min_scale : 0.0,
                                                   ", 2^100]"));
  }
  if (!dynamic_ && state.scale != state_.scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler state: scale ", state.scale, " differs from the static scale ", state_.scale));
  }
  if (state.last_overflow_iteration < -1 || state.last_overflow_iteration >= state.iteration) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scaler state: last_overflow_iteration ", state.last_overflow_iteration,
                     " must be in [-1, iteration = ", state.iteration, ")"));
  }
  const int max_credits = dynamic_ ? options_.hysteresis : 1;
  if (state.hysteresis_left < 1 || state.hysteresis_left > max_credits) {
    return absl::InvalidArgumentError(absl::StrCat("loss scaler state: hysteresis_left ",
                                                   state.hysteresis_left, " is outside [1, ",
                                                   max_credits, "]"));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace ps
