#include "optimizer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ps {

absl::string_view LrScheduleTypeName(LrScheduleType type) {
  switch (type) {
    case LrScheduleType::kConstant:
      return "constant";
    case LrScheduleType::kWarmup:
      return "WarmupLR";
    case LrScheduleType::kWarmupDecay:
      return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosine:
      return "WarmupCosineLR";
  }
  return "unknown";
}

absl::StatusOr<LrScheduleType> ParseLrScheduleType(absl::string_view name) {
  for (LrScheduleType type : {LrScheduleType::kConstant, LrScheduleType::kWarmup,
                              LrScheduleType::kWarmupDecay, LrScheduleType::kWarmupCosine}) {
    if (name == LrScheduleTypeName(type)) return type;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "scheduler.type \"", name,
      "\" is not supported; use one of constant, WarmupLR, WarmupDecayLR, WarmupCosineLR"));
}

absl::StatusOr<LrSchedule> LrSchedule::Create(const LrScheduleOptions& options) {
  if (!(options.lr >= 0.0) || !std::isfinite(options.lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler lr (`scheduler.params.warmup_max_lr`, or `optimizer.params.lr`) "
                     "must be finite and >= 0, got ",
                     options.lr));
  }
  if (options.type == LrScheduleType::kConstant) return LrSchedule(options);
  if (!(options.warmup_min_lr >= 0.0) || !(options.warmup_min_lr <= options.lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`scheduler.params.warmup_min_lr` must be in [0, ", options.lr, "], got ",
                     options.warmup_min_lr));
  }
  if (options.warmup_num_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`scheduler.params.warmup_num_steps` must be >= 0, got ", options.warmup_num_steps));
  }
  if (options.type == LrScheduleType::kWarmupDecay && options.total_num_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`scheduler.params.total_num_steps` must be >= 0, got ", options.total_num_steps));
  }
  if (options.type == LrScheduleType::kWarmupCosine) {
    const int64_t warmup = std::max<int64_t>(2, options.warmup_num_steps);
    if (options.total_num_steps <= warmup) {
      return absl::InvalidArgumentError(
          absl::StrCat("`scheduler.params.total_num_steps` (", options.total_num_steps,
                       ") must exceed the warm-up steps (", warmup, ") for WarmupCosineLR"));
    }
    for (const auto& [key, value] :
         {std::pair<absl::string_view, double>{"warmup_min_ratio", options.warmup_min_ratio},
          {"cos_min_ratio", options.cos_min_ratio}}) {
      if (!(value >= 0.0 && value <= 1.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("`scheduler.params.", key, "` must be in [0, 1], got ", value));
      }
    }
  }
  return LrSchedule(options);
}

LrSchedule::LrSchedule(const LrScheduleOptions& options)
    : options_(options), warmup_steps_(std::max<int64_t>(2, options.warmup_num_steps)) {}

double LrSchedule::WarmupGamma(int64_t step) const {
  if (options_.warmup_type == WarmupType::kLog) {
    return std::log(static_cast<double>(step + 1)) / std::log(static_cast<double>(warmup_steps_));
  }
  return static_cast<double>(step) / static_cast<double>(warmup_steps_);
}

double LrSchedule::LearningRate(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  const LrScheduleOptions& o = options_;
  switch (o.type) {
    case LrScheduleType::kConstant:
      return o.lr;
    case LrScheduleType::kWarmup:
    case LrScheduleType::kWarmupDecay: {
      double gamma;
      if (step < warmup_steps_) {
        gamma = WarmupGamma(step);
      } else if (o.type == LrScheduleType::kWarmup) {
        gamma = 1.0;
      } else {
        gamma = std::max(0.0,
                         static_cast<double>(o.total_num_steps - step) /
                             std::max(1.0, static_cast<double>(o.total_num_steps - warmup_steps_)));
      }
      return o.warmup_min_lr + (o.lr - o.warmup_min_lr) * gamma;
    }
    case LrScheduleType::kWarmupCosine: {
      double ratio;
      if (step < warmup_steps_) {
        ratio = o.warmup_min_ratio + (1.0 - o.warmup_min_ratio) * WarmupGamma(step);
      } else {
        // DeepSpeed does not clamp s, so its cosine rises again after total_num_steps; we hold
        // the final value instead.
        const double total = static_cast<double>(o.total_num_steps - warmup_steps_);
        const double s = std::min(static_cast<double>(step - warmup_steps_ + 1), total);
        const double cosine = (1.0 + std::cos(std::numbers::pi * s / total)) / 2.0;
        ratio = std::max(0.0, o.cos_min_ratio + (1.0 - o.cos_min_ratio) * cosine);
      }
      return o.lr * ratio;
    }
  }
  return o.lr;
}

}  // namespace ps
