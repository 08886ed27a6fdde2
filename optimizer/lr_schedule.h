// LrSchedule: the learning rate as a function of the optimizer step, with the semantics of
// DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py). `step` is the 0-based index of the
// optimizer step about to be taken — DeepSpeed's last_batch_iteration — which advances only on
// steps that were not skipped for overflow (DeepSpeed's engine does not step the scheduler on an
// overflow; HybridAdam::step() counts exactly those steps).
//
//   kConstant:          lr.
//   kWarmup (WarmupLR): warmup_min_lr + (lr - warmup_min_lr) * gamma(step), where during warm-up
//                       (step < W) gamma is log(step + 1) / log(W) (warmup_type "log", DeepSpeed's
//                       default) or step / W ("linear"), and 1 afterwards. W =
//                       max(2, warmup_num_steps), as DeepSpeed.
//   kWarmupDecay (WarmupDecayLR): the same warm-up, then gamma = max(0, (T - step) / max(1, T - W))
//                       — linear decay to warmup_min_lr at step T = total_num_steps.
//   kWarmupCosine (WarmupCosineLR): lr * ratio(step), where during warm-up ratio =
//                       warmup_min_ratio + (1 - warmup_min_ratio) * gamma(step), and afterwards,
//                       with s = step - W + 1, ratio = max(0, cos_min_ratio + (1 - cos_min_ratio)
//                       * (1 + cos(pi * s / (T - W))) / 2). DeepSpeed lets s run past T - W,
//                       so its rate climbs back after total_num_steps; we clamp s to T - W and
//                       hold lr * cos_min_ratio.
//
// `lr` plays DeepSpeed's warmup_max_lr for kWarmup/kWarmupDecay and the optimizer's base lr for
// kWarmupCosine. Feed the result to HybridAdam::SetLearningRate before each step; HybridAdam reads
// the learning rate at every step (PatrickStar froze it into per-parameter state, so its schedulers
// had no effect).
//
// Thread safety: immutable after creation.
#ifndef PATRICKSTAR_OPTIMIZER_LR_SCHEDULE_H_
#define PATRICKSTAR_OPTIMIZER_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

enum class LrScheduleType : uint8_t { kConstant, kWarmup, kWarmupDecay, kWarmupCosine };
enum class WarmupType : uint8_t { kLog, kLinear };

// DeepSpeed "scheduler.params" keys where they exist.
struct LrScheduleOptions {
  LrScheduleType type = LrScheduleType::kConstant;
  // The peak learning rate (warmup_max_lr; the base lr for cosine). >= 0, finite.
  double lr = 1e-3;
  // warmup_min_lr (kWarmup, kWarmupDecay). In [0, lr].
  double warmup_min_lr = 0.0;
  // warmup_num_steps. >= 0 (values below 2 act as 2, as in DeepSpeed).
  int64_t warmup_num_steps = 1000;
  // warmup_type.
  WarmupType warmup_type = WarmupType::kLog;
  // total_num_steps (kWarmupDecay, kWarmupCosine). kWarmupCosine needs total > warm-up steps.
  int64_t total_num_steps = 0;
  // warmup_min_ratio and cos_min_ratio (kWarmupCosine). In [0, 1].
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
};

class LrSchedule {
 public:
  // InvalidArgument naming the first bad option.
  static absl::StatusOr<LrSchedule> Create(const LrScheduleOptions& options);

  // The learning rate of the optimizer step with 0-based index `step` (>= 0; negative is treated
  // as 0).
  double LearningRate(int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  explicit LrSchedule(const LrScheduleOptions& options);
  // DeepSpeed's gamma during warm-up, in [0, 1).
  double WarmupGamma(int64_t step) const;

  LrScheduleOptions options_;
  int64_t warmup_steps_;  // max(2, warmup_num_steps)
};

// "constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR".
absl::string_view LrScheduleTypeName(LrScheduleType type);
// Accepts the names above (DeepSpeed's "scheduler.type"), case-sensitive; InvalidArgument
// otherwise.
absl::StatusOr<LrScheduleType> ParseLrScheduleType(absl::string_view name);

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_LR_SCHEDULE_H_
