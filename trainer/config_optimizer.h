// The optimizer's options built from a TrainConfig: the loss scaler, the learning-rate schedule
// and HybridAdam's options (betas, clipping, parameter groups). The trainer builds its optimizer
// with these, and ValidateTrainConfig checks that they can be built.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_TRAINER_CONFIG_OPTIMIZER_H_
#define PATRICKSTAR_TRAINER_CONFIG_OPTIMIZER_H_

#include "absl/status/statusor.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/lr_schedule.h"
#include "trainer/config.h"

namespace ps {

// The loss scaler: None() for f32 and bf16; Static(fp16.loss_scale) if it is > 0; Dynamic from
// the other fp16 keys otherwise. InvalidArgument (naming fp16.*) for values the scaler rejects.
absl::StatusOr<LossScaler> MakeLossScaler(const TrainConfig& config);

// The learning-rate schedule: kConstant at optimizer.lr without a scheduler; otherwise the
// scheduler's type and params, with lr = warmup_max_lr (or optimizer.lr when it is -1, and always
// for WarmupCosineLR, whose peak is the optimizer's lr, as in DeepSpeed) and total_num_steps =
// train_steps when 0. Not validated here: LrSchedule::Create does (ValidateTrainConfig calls it).
LrScheduleOptions MakeLrScheduleOptions(const TrainConfig& config);

// HybridAdam's options: mode from optimizer.type, betas, eps, max_grad_norm = gradient_clipping,
// the loss scaler (MakeLossScaler), and the parameter groups: with weight_decay > 0, "no_decay"
// (biases and LayerNorm parameters, IsBiasOrNormTensor, weight decay 0) then "decay" (every other
// tensor), as Hugging Face's Trainer and DeepSpeed examples group them; otherwise one "default"
// group. Every group starts at optimizer.lr (the trainer sets the scheduled rate each step).
absl::StatusOr<HybridAdamOptions> MakeHybridAdamOptions(const TrainConfig& config);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_OPTIMIZER_H_
