// The embedded default (trainer/config.h DefaultTrainConfig): valid, the documented values, model
// data above the accelerator cap, chunks that hold every operator, a warm-up-then-decay schedule;
// and the derived values.
#include "trainer/config.h"

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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "nlohmann/json.hpp"
#include "optimizer/lr_schedule.h"
#include "trainer/config_json.h"
#include "trainer/config_optimizer.h"
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

// --- The embedded default -----------------------------------------------------------------

TEST(DefaultTrainConfigTest, IsValid) { EXPECT_OK(ValidateTrainConfig(DefaultTrainConfig())); }

TEST(DefaultTrainConfigTest, HasTheDocumentedValues) {
  const TrainConfig c = DefaultTrainConfig();
  EXPECT_EQ(c.model.preset, "");
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.max_seq_len, 128);
  EXPECT_EQ(c.model.hidden, 128);
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.model.num_heads, 4);
  EXPECT_EQ(c.data.seq_len, 64);
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.steps, 2000);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 30);
  EXPECT_EQ(c.scheduler.warmup_type, "linear");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.precision(), PrecisionMode::kF32);
  EXPECT_EQ(c.accelerator.kind, AcceleratorKind::kCpu);
  EXPECT_EQ(c.accelerator.memory_bytes, 10 * kMiB);
  EXPECT_EQ(c.data.train_path, "");
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_EQ(c.steps_per_print, 1);
  EXPECT_EQ(c.data.eval_every, 250);
  EXPECT_GT(c.chunk.size_elems, 0);
}

TEST(DefaultTrainConfigTest, ModelDataExceedsTheAcceleratorCap) {
  const TrainConfig c = DefaultTrainConfig();
  ASSERT_OK_AND_ASSIGN(const GptConfig model, ResolveModelConfig(c.model));
  const int64_t model_data_bytes =
      ModelDataBytesPerParam(ComputeDType(c.precision())) * GptParameterCount(model);
  EXPECT_EQ(GptParameterCount(model), 842496);
  EXPECT_GT(model_data_bytes, c.accelerator.memory_bytes)
      << FormatBytes(model_data_bytes) << " vs " << FormatBytes(c.accelerator.memory_bytes);
}

TEST(DefaultTrainConfigTest, ChunkHoldsEveryOperatorButMoreThanOneChunkIsNeeded) {
  const TrainConfig c = DefaultTrainConfig();
  ASSERT_OK_AND_ASSIGN(const GptConfig model, ResolveModelConfig(c.model));
  int64_t largest = 0;
  for (const OperatorSpec& op : GptOperators(model)) {
    largest = std::max(largest, OperatorNumElems(op));
  }
  EXPECT_GE(c.chunk.size_elems, largest);
  EXPECT_GT(GptParameterCount(model), 4 * c.chunk.size_elems);
}

TEST(DefaultTrainConfigTest, RoundTripsThroughJson) {
  const TrainConfig c = DefaultTrainConfig();
  EXPECT_THAT(Parse(TrainConfigToJson(c)), IsOkAndHolds(c));
}

TEST(DefaultTrainConfigTest, ScheduleWarmsUpThenDecaysToZero) {
  const TrainConfig c = DefaultTrainConfig();
  ASSERT_OK_AND_ASSIGN(const LrSchedule schedule, LrSchedule::Create(MakeLrScheduleOptions(c)));
  EXPECT_DOUBLE_EQ(schedule.LearningRate(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(15), 1.5e-3);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(30), 3e-3);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(c.steps), 0.0);
}

// --- Derived values --------------------------------------------------------------------------

TEST(ConversionTest, PrecisionAndDType) {
  TrainConfig c;
  EXPECT_EQ(c.precision(), PrecisionMode::kF32);
  EXPECT_EQ(ComputeDType(c.precision()), DType::kF32);
  c.bf16 = true;
  EXPECT_EQ(c.precision(), PrecisionMode::kBF16);
  EXPECT_EQ(ComputeDType(c.precision()), DType::kBF16);
  c.bf16 = false;
  c.fp16.enabled = true;
  EXPECT_EQ(c.precision(), PrecisionMode::kF16);
  EXPECT_EQ(ComputeDType(c.precision()), DType::kF16);
  EXPECT_EQ(PrecisionModeName(PrecisionMode::kBF16), "bf16");
}

TEST(ConversionTest, ResolvedSizes) {
  TrainConfig c = DefaultTrainConfig();
  ASSERT_OK_AND_ASSIGN(const GptConfig model, ResolveModelConfig(c.model));
  EXPECT_EQ(ResolveSeqLen(c, model), 64);
  c.data.seq_len = 0;
  EXPECT_EQ(ResolveSeqLen(c, model), 128);
  c.data.seq_len = 32;
  EXPECT_EQ(ResolveSeqLen(c, model), 32);
  EXPECT_EQ(ResolveTrainBatchSize(c, 1), 8);
  EXPECT_EQ(ResolveTrainBatchSize(c, 4), 32);
  c.train_batch_size = 16;
  EXPECT_EQ(ResolveTrainBatchSize(c, 4), 16);
}

}  // namespace
}  // namespace ps
