// trainer/config_optimizer.h: the loss scaler, the learning-rate schedule and HybridAdam's options
// built from a config (and HybridAdam accepting them on the default model's layout).
#include "trainer/config_optimizer.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "nlohmann/json.hpp"
#include "optimizer/adam_math.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/lr_schedule.h"
#include "trainer/config.h"
#include "trainer/config_parse.h"
#include "trainer/config_validate.h"
#include "trainer/testing/config_testing.h"

namespace ps {
namespace {

using config_testing::DocFor;
using config_testing::Json;
using config_testing::KeySample;
using config_testing::KeySamples;
using config_testing::Minimal;
using config_testing::Parse;
using config_testing::ParseAndValidate;
using config_testing::RandomConfigs;
using config_testing::WithMinimal;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// --- Conversions to the optimizer's options ----------------------------------------------

TEST(ConversionTest, LossScalerFollowsPrecisionAndFp16Keys) {
  TrainConfig c;
  ASSERT_OK_AND_ASSIGN(LossScaler none, MakeLossScaler(c));
  EXPECT_FALSE(none.dynamic());
  EXPECT_EQ(none.scale(), 1.0);
  c.bf16 = true;
  c.fp16.loss_scale = 1024;  // ignored without fp16
  ASSERT_OK_AND_ASSIGN(LossScaler bf16, MakeLossScaler(c));
  EXPECT_FALSE(bf16.dynamic());
  EXPECT_EQ(bf16.scale(), 1.0);
  c.bf16 = false;
  c.fp16.enabled = true;
  ASSERT_OK_AND_ASSIGN(LossScaler fixed, MakeLossScaler(c));
  EXPECT_FALSE(fixed.dynamic());
  EXPECT_EQ(fixed.scale(), 1024.0);
  c.fp16.loss_scale = 0;
  c.fp16.initial_scale_power = 12;
  c.fp16.hysteresis = 3;
  c.fp16.loss_scale_window = 77;
  c.fp16.consecutive_hysteresis = true;
  c.fp16.min_loss_scale = 0.5;
  ASSERT_OK_AND_ASSIGN(LossScaler dynamic, MakeLossScaler(c));
  EXPECT_TRUE(dynamic.dynamic());
  EXPECT_EQ(dynamic.scale(), 4096.0);
  EXPECT_EQ(dynamic.options().hysteresis, 3);
  EXPECT_EQ(dynamic.options().loss_scale_window, 77);
  EXPECT_TRUE(dynamic.options().consecutive_hysteresis);
  EXPECT_EQ(dynamic.options().min_loss_scale, 0.5);
}

TEST(ConversionTest, LrScheduleOptions) {
  TrainConfig c;
  c.steps = 500;
  c.optimizer.lr = 0.02;
  LrScheduleOptions o = MakeLrScheduleOptions(c);
  EXPECT_EQ(o.type, LrScheduleType::kConstant);
  EXPECT_EQ(o.lr, 0.02);

  c.scheduler.type = SchedulerType::kWarmupLR;
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.warmup_type = "log";
  o = MakeLrScheduleOptions(c);
  EXPECT_EQ(o.type, LrScheduleType::kWarmup);
  EXPECT_EQ(o.lr, 0.02);  // warmup_max_lr -1: the optimizer's
  EXPECT_EQ(o.warmup_type, WarmupType::kLog);
  EXPECT_EQ(o.warmup_num_steps, 10);
  c.scheduler.warmup_max_lr = 0.05;
  EXPECT_EQ(MakeLrScheduleOptions(c).lr, 0.05);

  c.scheduler.type = SchedulerType::kWarmupDecayLR;
  o = MakeLrScheduleOptions(c);
  EXPECT_EQ(o.type, LrScheduleType::kWarmupDecay);
  EXPECT_EQ(o.total_num_steps, 500);  // 0: train_steps
  c.scheduler.total_num_steps = 123;
  EXPECT_EQ(MakeLrScheduleOptions(c).total_num_steps, 123);

  c.scheduler.type = SchedulerType::kWarmupCosineLR;
  c.scheduler.warmup_min_ratio = 0.25;
  c.scheduler.cos_min_ratio = 0.125;
  c.scheduler.warmup_type = "linear";
  o = MakeLrScheduleOptions(c);
  EXPECT_EQ(o.type, LrScheduleType::kWarmupCosine);
  EXPECT_EQ(o.lr, 0.02);  // cosine's peak is the optimizer's lr, warmup_max_lr aside
  EXPECT_EQ(o.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(o.warmup_min_ratio, 0.25);
  EXPECT_EQ(o.cos_min_ratio, 0.125);
  ASSERT_OK_AND_ASSIGN(const LrSchedule schedule, LrSchedule::Create(o));
  EXPECT_DOUBLE_EQ(schedule.LearningRate(0), 0.02 * 0.25);
}

TensorInfo Tensor(const std::string& name) {
  TensorInfo t;
  t.name = name;
  return t;
}

TEST(ConversionTest, HybridAdamOptionsWithWeightDecayHasTwoGroups) {
  TrainConfig c = DefaultTrainConfig();
  c.optimizer.type = OptimizerType::kAdam;
  c.optimizer.beta1 = 0.8;
  c.optimizer.beta2 = 0.95;
  c.optimizer.eps = 1e-6;
  ASSERT_OK_AND_ASSIGN(const HybridAdamOptions o, MakeHybridAdamOptions(c));
  EXPECT_EQ(o.mode, AdamMode::kAdam);
  EXPECT_EQ(o.beta1, 0.8);
  EXPECT_EQ(o.beta2, 0.95);
  EXPECT_EQ(o.eps, 1e-6);
  EXPECT_EQ(o.max_grad_norm, 1.0);
  EXPECT_FALSE(o.loss_scaler.dynamic());
  ASSERT_EQ(o.groups.size(), 2u);
  EXPECT_EQ(o.groups[0].name, "no_decay");
  EXPECT_EQ(o.groups[0].weight_decay, 0.0);
  EXPECT_EQ(o.groups[0].lr, 3e-3);
  EXPECT_EQ(o.groups[1].name, "decay");
  EXPECT_EQ(o.groups[1].weight_decay, 0.01);
  EXPECT_FALSE(o.groups[1].selector);  // takes everything the first group leaves
  ASSERT_TRUE(o.groups[0].selector);
  // Every GPT-2 tensor: biases and LayerNorms undecayed, weights and embeddings decayed.
  ASSERT_OK_AND_ASSIGN(const GptConfig model, ResolveModelConfig(c.model));
  int no_decay = 0, decay = 0;
  for (const OperatorSpec& op : GptOperators(model)) {
    for (const TensorSpec& t : op.tensors) {
      const bool undecayed = o.groups[0].selector(Tensor(t.name));
      const bool expect_undecayed =
          absl::EndsWith(t.name, ".bias") || absl::StrContains(t.name, "ln_");
      EXPECT_EQ(undecayed, expect_undecayed) << t.name;
      (undecayed ? no_decay : decay)++;
    }
  }
  EXPECT_EQ(decay, 2 + 4 * model.num_layers);  // wte, wpe, and 4 weights per block
  EXPECT_EQ(no_decay, 2 + 8 * model.num_layers);
}

// The options build a real HybridAdam over the default model's chunk layout, and every GPT-2
// tensor lands in the group its name calls for.
TEST(ConversionTest, HybridAdamAcceptsTheOptionsOnTheDefaultLayout) {
  const TrainConfig c = DefaultTrainConfig();
  ASSERT_OK_AND_ASSIGN(const GptConfig model, ResolveModelConfig(c.model));
  const std::vector<OperatorSpec> ops = GptOperators(model);
  ASSERT_OK_AND_ASSIGN(const ChunkLayout layout,
                       ChunkLayout::Build({.capacity_elems = c.chunk.size_elems}, ops));
  EXPECT_EQ(layout.num_unplaced_tensors(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuAdam> cpu_adam, CpuAdam::Create({.num_threads = 1}));
  ASSERT_OK_AND_ASSIGN(HybridAdamOptions options, MakeHybridAdamOptions(c));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HybridAdam> adam,
                       HybridAdam::Create(layout, /*rank=*/0, ComputeDType(c.precision()),
                                          std::move(options), {.host = cpu_adam.get()}));
  ASSERT_EQ(adam->num_param_groups(), 2);
  EXPECT_EQ(adam->param_group_name(0), "no_decay");
  EXPECT_EQ(adam->param_group(1).weight_decay, 0.01);
  EXPECT_EQ(adam->mode(), AdamMode::kAdamW);
  for (const OperatorSpec& op : ops) {
    for (const TensorSpec& t : op.tensors) {
      ASSERT_OK_AND_ASSIGN(const TensorId id, layout.FindTensor(t.name));
      const bool bias_or_norm = absl::EndsWith(t.name, ".bias") || absl::StrContains(t.name, "ln_");
      EXPECT_EQ(adam->group_of(id), bias_or_norm ? 0 : 1) << t.name;
    }
  }
}

TEST(ConversionTest, HybridAdamOptionsWithoutWeightDecayHasOneGroup) {
  TrainConfig c;
  c.fp16.enabled = true;
  c.gradient_clipping = 0;
  ASSERT_OK_AND_ASSIGN(const HybridAdamOptions o, MakeHybridAdamOptions(c));
  EXPECT_EQ(o.mode, AdamMode::kAdamW);
  EXPECT_EQ(o.max_grad_norm, 0.0);
  EXPECT_TRUE(o.loss_scaler.dynamic());
  ASSERT_EQ(o.groups.size(), 1u);
  EXPECT_EQ(o.groups[0].name, "default");
  EXPECT_FALSE(o.groups[0].selector);
  EXPECT_EQ(o.groups[0].lr, 1e-3);
}

}  // namespace
}  // namespace ps
