#include "trainer/config_optimizer.h"

#include <utility>

#include "base/status_macros.h"
#include "chunk/chunk_layout.h"

namespace ps {

absl::StatusOr<LossScaler> MakeLossScaler(const TrainConfig& config) {
  if (config.precision() != PrecisionMode::kF16) return LossScaler::None();
  if (config.fp16.loss_scale > 0) return LossScaler::Static(config.fp16.loss_scale);
  DynamicLossScalerOptions options;
  options.initial_scale_power = config.fp16.initial_scale_power;
  options.loss_scale_window = config.fp16.loss_scale_window;
  options.hysteresis = config.fp16.hysteresis;
  options.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
  options.min_loss_scale = config.fp16.min_loss_scale;
  return LossScaler::Dynamic(options);
}

LrScheduleOptions MakeLrScheduleOptions(const TrainConfig& config) {
  const SchedulerConfig& s = config.scheduler;
  LrScheduleOptions o;
  o.lr = config.optimizer.lr;
  switch (s.type) {
    case SchedulerType::kNone:
      o.type = LrScheduleType::kConstant;
      return o;
    case SchedulerType::kWarmupLR:
      o.type = LrScheduleType::kWarmup;
      break;
    case SchedulerType::kWarmupDecayLR:
      o.type = LrScheduleType::kWarmupDecay;
      break;
    case SchedulerType::kWarmupCosineLR:
      o.type = LrScheduleType::kWarmupCosine;
      break;
  }
  if (s.type != SchedulerType::kWarmupCosineLR && s.warmup_max_lr != -1) o.lr = s.warmup_max_lr;
  o.warmup_min_lr = s.warmup_min_lr;
  o.warmup_num_steps = s.warmup_num_steps;
  o.warmup_type = s.warmup_type == "log" ? WarmupType::kLog : WarmupType::kLinear;
  o.total_num_steps = s.total_num_steps > 0 ? s.total_num_steps : config.steps;
  o.warmup_min_ratio = s.warmup_min_ratio;
  o.cos_min_ratio = s.cos_min_ratio;
  return o;
}

absl::StatusOr<HybridAdamOptions> MakeHybridAdamOptions(const TrainConfig& config) {
  HybridAdamOptions o;
  o.mode = config.optimizer.type == OptimizerType::kAdamW ? AdamMode::kAdamW : AdamMode::kAdam;
  o.beta1 = config.optimizer.beta1;
  o.beta2 = config.optimizer.beta2;
  o.eps = config.optimizer.eps;
  o.max_grad_norm = config.gradient_clipping;
  ASSIGN_OR_RETURN(o.loss_scaler, MakeLossScaler(config));
  // fp16.max_consecutive_skipped_steps 0 is DeepSpeed's rule: a dynamic scale has no count limit
  // (its overflow at min_loss_scale stops the run); a static one cannot be lowered, so its first
  // overflow does. (f32/bf16 never skip: HybridAdam stops at the first Inf/NaN gradient.)
  const int64_t max_skips = config.fp16.max_consecutive_skipped_steps;
  o.max_consecutive_skipped_steps = max_skips > 0 ? max_skips : (o.loss_scaler.dynamic() ? -1 : 0);
  o.gradient_accumulation_steps = config.gradient_accumulation_steps;
  o.overlap = config.optimizer.overlap;
  o.groups.clear();
  if (config.optimizer.weight_decay > 0) {
    ParamGroupOptions no_decay;
    no_decay.name = "no_decay";
    no_decay.lr = config.optimizer.lr;
    no_decay.weight_decay = 0;
    no_decay.selector = [](const TensorInfo& t) { return IsBiasOrNormTensor(t); };
    ParamGroupOptions decay;
    decay.name = "decay";
    decay.lr = config.optimizer.lr;
    decay.weight_decay = config.optimizer.weight_decay;
    o.groups.push_back(std::move(no_decay));
    o.groups.push_back(std::move(decay));
  } else {
    ParamGroupOptions all;
    all.name = "default";
    all.lr = config.optimizer.lr;
    all.weight_decay = 0;
    o.groups.push_back(std::move(all));
  }
  return o;
}

}  // namespace ps
