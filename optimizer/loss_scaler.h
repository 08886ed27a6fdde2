// LossScaler: the factor the loss is multiplied by before backward so that small f16 gradients do
// not flush to zero, and the policy that adapts it. Static (a fixed scale; 1 means none) or
// dynamic with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler),
// configured by DeepSpeed's "fp16" keys:
//
//   scale starts at 2^initial_scale_power.
//   Update(overflow = true):  if hysteresis is 1 or only one hysteresis credit is left, the scale
//       becomes max(scale / scale_factor, min_loss_scale); otherwise one credit is spent and the
//       scale stays. The step counts as the last overflow.
//   Update(overflow = false): if (iteration - last_overflow_iteration) % loss_scale_window == 0,
//       the scale is multiplied by scale_factor (and, unless consecutive_hysteresis, the credits
//       are refilled); with consecutive_hysteresis every clean step refills the credits, so only
//       `hysteresis` overflows in a row lower the scale.
//   The iteration counter advances on every Update.
//
// With DeepSpeed's defaults (hysteresis 2, consecutive_hysteresis false) the second overflow
// since the last scale increase halves the scale; 1000 clean steps after the last overflow double
// it. PatrickStar passes `hysteresis` as the scale factor (reference notes §1.14); we do not.
//
// An overflow while the scale is already at min_loss_scale and no credit is left is an error
// (OutOfRange) when error_at_min_scale is set, as DeepSpeed raises; the state still advances.
// The scale never exceeds kMaxLossScale (2^100), so the optimizer's f32 step constants stay
// finite; DeepSpeed has no cap.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_OPTIMIZER_LOSS_SCALER_H_
#define PATRICKSTAR_OPTIMIZER_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

inline constexpr double kMaxLossScale = 0x1p100;

// DeepSpeed "fp16" section keys and defaults.
struct DynamicLossScalerOptions {
  // fp16.initial_scale_power: the initial scale is 2^this. In [0, 100].
  int initial_scale_power = 16;
  // fp16.loss_scale_window: clean steps between scale increases. >= 1.
  int64_t loss_scale_window = 1000;
  // fp16.hysteresis (DeepSpeed's delayed_shift): overflows tolerated before lowering. >= 1.
  int hysteresis = 2;
  // fp16.consecutive_hysteresis: refill the hysteresis credits on every clean step.
  bool consecutive_hysteresis = false;
  // fp16.min_loss_scale. > 0.
  double min_loss_scale = 1.0;
  // Factor of each increase and decrease. > 1.
  double scale_factor = 2.0;
  // DeepSpeed's raise_error_at_min_scale.
  bool error_at_min_scale = true;
};

// Everything that changes, for checkpoints.
struct LossScalerState {
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int hysteresis_left = 1;
};

class LossScaler {
 public:
  // A fixed scale (fp16.loss_scale != 0 in DeepSpeed). InvalidArgument naming fp16.loss_scale
  // unless 0 < scale <= kMaxLossScale.
  static absl::StatusOr<LossScaler> Static(double scale);
  // No scaling: a static scale of 1.
  static LossScaler None();
  // InvalidArgument naming the first bad option.
  static absl::StatusOr<LossScaler> Dynamic(const DynamicLossScalerOptions& options);

  bool dynamic() const { return dynamic_; }
  // The current scale: multiply the loss by it, divide the gradients by it.
  double scale() const { return state_.scale; }
  const LossScalerState& state() const { return state_; }
  const DynamicLossScalerOptions& options() const { return options_; }

  // Advances the policy after a step whose gradients did (`overflow`) or did not contain Inf/NaN.
  // A static scaler only counts iterations. OutOfRange as described above; the state is updated
  // in every case.
  [[nodiscard]] absl::Status Update(bool overflow);

  // Restores a state from state(). InvalidArgument for a state that options cannot produce
  // (scale outside [min_loss_scale, kMaxLossScale], credits outside [1, hysteresis], ...).
  [[nodiscard]] absl::Status Restore(const LossScalerState& state);

 private:
  LossScaler(bool dynamic, const DynamicLossScalerOptions& options, LossScalerState state)
      : dynamic_(dynamic), options_(options), state_(state) {}

  bool dynamic_;
  DynamicLossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_LOSS_SCALER_H_
