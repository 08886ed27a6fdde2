// trainer/config_validate.h: every impossible value named with its key and value (per key and
// across keys), the edges of the valid ranges, and the model a config resolves to.
#include "trainer/config_validate.h"

#include <unistd.h>

#include <algorithm>
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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gpt_config.h"
#include "model/model_config.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_parse.h"
#include "trainer/config_schema.h"
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

// --- Impossible values ------------------------------------------------------------------------

struct BadValueCase {
  std::string json;     // parsed (and, with `validate`, validated)
  std::string message;  // expected substring
};

class ImpossibleValueTest : public testing::TestWithParam<BadValueCase> {};

TEST_P(ImpossibleValueTest, IsInvalidArgumentNamingKeyAndValue) {
  EXPECT_THAT(ParseAndValidate(GetParam().json), StatusIs(kInvalid, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    PerKey, ImpossibleValueTest,
    testing::Values(
        BadValueCase{WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", -0.1}}}}}}),
                     "`optimizer.params.lr` = -0.1: the learning rate must be finite and >= 0"},
        BadValueCase{
            WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", {1.0, 0.9}}}}}}}),
            "`optimizer.params.betas[0]` = 1: must be in [0, 1)"},
        BadValueCase{
            WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", {0.9, -0.1}}}}}}}),
            "`optimizer.params.betas[1]` = -0.1: must be in [0, 1)"},
        BadValueCase{WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"eps", 0}}}}}}),
                     "`optimizer.params.eps` = 0: must be finite and > 0"},
        BadValueCase{
            WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"eps", -1e-8}}}}}}),
            "`optimizer.params.eps` = -1e-08: must be finite and > 0"},
        BadValueCase{WithMinimal({{"optimizer",
                                   {{"type", "AdamW"}, {"params", {{"weight_decay", -0.01}}}}}}),
                     "`optimizer.params.weight_decay` = -0.01: must be finite and >= 0"},
        BadValueCase{WithMinimal({{"optimizer", {{"type", "Lamb"}}}}),
                     "`optimizer.type` = string \"Lamb\": is not supported; use \"Adam\" or "
                     "\"AdamW\""},
        BadValueCase{WithMinimal({{"optimizer", {{"params", {{"lr", 0.1}}}}}}),
                     "`optimizer.type` is required"},
        BadValueCase{
            WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"amsgrad", true}}}}}}),
            "`optimizer.params.amsgrad` = boolean true: not supported"},
        BadValueCase{WithMinimal({{"optimizer",
                                   {{"type", "AdamW"}, {"params", {{"bias_correction", false}}}}}}),
                     "`optimizer.params.bias_correction` = boolean false: not supported"},
        BadValueCase{
            WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"adam_w_mode", false}}}}}}),
            "`optimizer.params.adam_w_mode` = boolean false: contradicts optimizer.type"},
        BadValueCase{WithMinimal({{"train_micro_batch_size_per_gpu", 0}}),
                     "`train_micro_batch_size_per_gpu` = 0: must be >= 1"},
        BadValueCase{WithMinimal({{"train_batch_size", -8}}),
                     "`train_batch_size` = -8: must be >= 1"},
        BadValueCase{WithMinimal({{"gradient_accumulation_steps", 0}}),
                     "`gradient_accumulation_steps` = 0: must be >= 1"},
        BadValueCase{WithMinimal({{"train_steps", -1}}), "`train_steps` = -1: must be > 0"},
        BadValueCase{WithMinimal({{"threads", -2}}), "`threads` = -2: must be in [0, 65536]"},
        BadValueCase{WithMinimal({{"steps_per_print", 0}}), "`steps_per_print` = 0: must be >= 1"},
        BadValueCase{WithMinimal({{"gradient_clipping", -1}}),
                     "`gradient_clipping` = -1: must be finite and >= 0"},
        BadValueCase{WithMinimal({{"scheduler", {{"type", "OneCycle"}}}}),
                     "`scheduler.type` = string \"OneCycle\": is not supported; use \"WarmupLR\""},
        BadValueCase{WithMinimal({{"scheduler", {{"params", Json::object()}}}}),
                     "`scheduler.type` is required"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupLR"}, {"params", {{"cos_min_ratio", 0.1}}}}}}),
            "`scheduler.params.cos_min_ratio` does not apply to scheduler type WarmupLR, which "
            "takes: warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, "
            "last_batch_iteration"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupCosineLR"}, {"params", {{"warmup_max_lr", 0.1}}}}}}),
            "`scheduler.params.warmup_max_lr` does not apply to scheduler type "
            "WarmupCosineLR"},
        BadValueCase{WithMinimal({{"scheduler",
                                   {{"type", "WarmupLR"}, {"params", {{"warmup_type", "cos"}}}}}}),
                     "`scheduler.params.warmup_type` = string \"cos\": use \"log\" or \"linear\""},
        BadValueCase{WithMinimal({{"scheduler",
                                   {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", -1}}}}}}),
                     "`scheduler.params.warmup_max_lr` = integer -1: must be >= 0"},
        BadValueCase{WithMinimal({{"scheduler",
                                   {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", -1}}}}}}),
                     "`scheduler.params.warmup_min_lr` = -1: must be finite and >= 0"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", -5}}}}}}),
            "`scheduler.params.warmup_num_steps` = -5: must be >= 0"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", -5}}}}}}),
            "`scheduler.params.total_num_steps` = -5: must be >= 0"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupCosineLR"}, {"params", {{"cos_min_ratio", 1.5}}}}}}),
            "`scheduler.params.cos_min_ratio` = 1.5: must be in [0, 1]"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupCosineLR"}, {"params", {{"warmup_min_ratio", -0.5}}}}}}),
            "`scheduler.params.warmup_min_ratio` = -0.5: must be in [0, 1]"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupLR"}, {"params", {{"last_batch_iteration", 5}}}}}}),
            "`scheduler.params.last_batch_iteration` = integer 5: only -1"},
        BadValueCase{WithMinimal({{"fp16", {{"loss_scale", -1}}}}),
                     "`fp16.loss_scale` = -1: must be in [0, 2^100]"},
        BadValueCase{WithMinimal({{"fp16", {{"initial_scale_power", 101}}}}),
                     "`fp16.initial_scale_power` = 101: must be in [0, 100]"},
        BadValueCase{WithMinimal({{"fp16", {{"loss_scale_window", 0}}}}),
                     "`fp16.loss_scale_window` = 0: must be >= 1"},
        BadValueCase{WithMinimal({{"fp16", {{"hysteresis", 0}}}}),
                     "`fp16.hysteresis` = 0: must be >= 1"},
        BadValueCase{WithMinimal({{"fp16", {{"min_loss_scale", 0}}}}),
                     "`fp16.min_loss_scale` = 0: must be in (0, 2^100]"},
        BadValueCase{WithMinimal({{"fp16", {{"max_consecutive_skipped_steps", -1}}}}),
                     "`fp16.max_consecutive_skipped_steps` = -1: must be >= 0"},
        BadValueCase{WithMinimal({{"model", {{"preset", "gpt3"}}}}),
                     "`model.preset` = \"gpt3\": unknown preset; valid presets: tiny, gpt2, "
                     "gpt2-medium, gpt2-large, gpt2-xl, 1B, 2B, 4B, 6B, 8B, 10B, 12B, 15B, 18B"},
        BadValueCase{WithMinimal({{"model", {{"n_layer", -2}}}}),
                     "`model.n_layer` = -2: must be in [1,"},
        BadValueCase{WithMinimal({{"chunk", {{"size", 0}}}}),
                     "`chunk.size` = integer 0: out of range; must be in [1, 1099511627776]"},
        BadValueCase{WithMinimal({{"chunk", {{"size", -64}}}}),
                     "`chunk.size` = integer -64: out of range"},
        BadValueCase{WithMinimal({{"chunk", {{"size", "64MiB"}}}}),
                     "`chunk.size` = string \"64MiB\": use \"auto\" (chunk-size search) or an "
                     "integer number of elements (not bytes)"},
        BadValueCase{WithMinimal({{"accelerator", {{"backend", "tpu"}}}}),
                     "`accelerator.backend` = string \"tpu\": is not a backend; use \"cpu\""},
        BadValueCase{WithMinimal({{"accelerator", {{"memory", "12XB"}}}}),
                     "`accelerator.memory` = string \"12XB\": cannot parse byte quantity \"12XB\": "
                     "unknown unit \"xb\""},
        BadValueCase{WithMinimal({{"accelerator", {{"memory", "lots"}}}}),
                     "`accelerator.memory` = string \"lots\": cannot parse"},
        BadValueCase{
            WithMinimal({{"accelerator", {{"memory", "-5MiB"}}}}),
            "`accelerator.memory` = string \"-5MiB\": byte quantity \"-5MiB\" is negative"},
        BadValueCase{WithMinimal({{"accelerator", {{"memory", -5}}}}),
                     "`accelerator.memory` = integer -5: out of range"},
        BadValueCase{WithMinimal({{"accelerator", {{"host_memory", "1.5B"}}}}),
                     "`accelerator.host_memory` = string \"1.5B\": byte quantity \"1.5B\" is not a "
                     "whole number of bytes"},
        BadValueCase{WithMinimal({{"accelerator", {{"copy_bandwidth", "fast"}}}}),
                     "`accelerator.copy_bandwidth` = string \"fast\": cannot parse"},
        BadValueCase{WithMinimal({{"accelerator", {{"copy_bandwidth", -1}}}}),
                     "`accelerator.copy_bandwidth` = -1: must be 0 (unthrottled) or between 1MB/s "
                     "and 1PB/s"},
        BadValueCase{WithMinimal({{"accelerator", {{"copy_bandwidth", "1KB/s"}}}}),
                     "`accelerator.copy_bandwidth` = 1000: must be 0 (unthrottled) or between"},
        BadValueCase{WithMinimal({{"accelerator", {{"copy_bandwidth", 1e300}}}}),
                     "`accelerator.copy_bandwidth` = 1e+300: must be 0 (unthrottled) or between"},
        BadValueCase{WithMinimal({{"accelerator", {{"device", -1}}}}),
                     "`accelerator.device` = -1: must be in [0, 65536]"},
        BadValueCase{WithMinimal({{"data", {{"seq_len", -1}}}}),
                     "`data.seq_len` = -1: must be >= 0"},
        BadValueCase{WithMinimal({{"data", {{"eval_every", -1}}}}),
                     "`data.eval_every` = -1: must be >= 0"},
        BadValueCase{WithMinimal({{"data", {{"eval_batches", 0}}}}),
                     "`data.eval_batches` = 0: must be >= 1"},
        BadValueCase{WithMinimal({{"data", {{"train", std::string("a\0b", 3)}}}}),
                     "`data.train` = \"a\\u0000b\": contains a NUL character"},
        BadValueCase{WithMinimal({{"checkpoint", {{"every", -1}}}}),
                     "`checkpoint.every` = -1: must be >= 0"},
        BadValueCase{WithMinimal({{"checkpoint", {{"keep_last", 0}}}}),
                     "`checkpoint.keep_last` = 0: must be >= 1"}));

// The boundaries just inside the ranges above are valid.
TEST(ValidRangesTest, JustInsideTheRangesIsValid) {
  EXPECT_OK(ParseAndValidate(WithMinimal(
      {{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", {0.0, 0.99999999}}, {"lr", 0}}}}},
       {"fp16", {{"initial_scale_power", 100}, {"loss_scale", 0x1p100}}},
       {"threads", 65536},
       {"gradient_clipping", 0}})));
}

INSTANTIATE_TEST_SUITE_P(
    AcrossKeys, ImpossibleValueTest,
    testing::Values(
        BadValueCase{
            WithMinimal({{"train_steps", 0}}),
            "`train_steps` = 0: must be > 0: set train_steps in the config or pass --steps"},
        BadValueCase{R"({"model": {"preset": "tiny"}})", "`train_steps` = 0: must be > 0"},
        BadValueCase{WithMinimal({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}),
                     "`fp16.enabled` and `bf16.enabled` are both true"},
        BadValueCase{WithMinimal({{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}}),
                     "`train_batch_size` = 16 does not equal train_micro_batch_size_per_gpu (4) x "
                     "gradient_accumulation_steps (1) x world size (1) = 4"},
        BadValueCase{WithMinimal({{"train_batch_size", 16},
                                  {"train_micro_batch_size_per_gpu", 4},
                                  {"gradient_accumulation_steps", 3}}),
                     "Check batch related parameters. train_batch_size is not equal to "
                     "micro_batch_per_gpu * gradient_acc_step * world_size 16 != 4 * 3 * 1: "
                     "`train_batch_size` = 16 does not equal train_micro_batch_size_per_gpu (4) x "
                     "gradient_accumulation_steps (3) x world size (1) = 12"},
        BadValueCase{WithMinimal({{"data", {{"seq_len", 65}}}}),
                     "`data.seq_len` = 65 exceeds the model's n_positions (64, model tiny)"},
        BadValueCase{WithMinimal({{"model", {{"preset", "tiny"}, {"n_head", 5}}}}),
                     "`model.n_embd` = 64 is not divisible by `model.n_head` = 5"},
        BadValueCase{R"({"train_steps": 1, "model": {"n_embd": 64, "n_head": 4}})",
                     "the model is not defined: set model.preset (tiny, gpt2"},
        BadValueCase{R"({"train_steps": 1, "model": {"n_embd": 64, "n_head": 4}})",
                     "missing: model.vocab_size, model.n_positions, model.n_layer"},
        BadValueCase{WithMinimal({{"model", {{"preset", "gpt2"}}}, {"chunk", {{"size", 1000000}}}}),
                     "`chunk.size` = 1000000 elements is below the smallest chunk of model gpt2 "
                     "(2362368 elements: its largest operator, or one vocabulary tile of 2048 wte "
                     "rows); use chunk.size >= 2362368 or \"auto\""},
        BadValueCase{
            WithMinimal({{"model", {{"vocab_size", 1 << 30}, {"n_embd", 1 << 30}, {"n_head", 1}}}}),
            "parameters, more than 2^53"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupCosineLR"},
                           {"params", {{"warmup_num_steps", 20}, {"total_num_steps", 20}}}}}}),
            "scheduler WarmupCosineLR: `scheduler.params.total_num_steps` (20) must exceed the "
            "warm-up steps (20)"},
        BadValueCase{WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.001}}}}},
                                  {"scheduler",
                                   {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.01}}}}}}),
                     "scheduler WarmupLR: `scheduler.params.warmup_min_lr` must be in [0, 0.001]"},
        BadValueCase{WithMinimal({{"checkpoint", {{"every", 100}}}}),
                     "`checkpoint.every` = 100 needs a checkpoint directory"},
        BadValueCase{WithMinimal({{"checkpoint", {{"resume", true}}}}),
                     "`checkpoint.resume` = true needs checkpoint.dir"},
        BadValueCase{
            WithMinimal({{"accelerator", {{"backend", "cuda"}, {"copy_bandwidth", "1GB/s"}}}}),
            "`accelerator.copy_bandwidth` = 1e+09 bytes/s emulates a link and applies "
            "only to backend \"cpu\""},
        BadValueCase{
            WithMinimal({{"accelerator", {{"memory", "64KiB"}}}, {"chunk", {{"size", 1 << 20}}}}),
            "`accelerator.memory` = 65536 bytes cannot hold one chunk of `chunk.size` = "
            "1048576 elements"}));

TEST(ValidateTrainConfigTest, BatchSizeAgreesWithWorldSize) {
  const std::string doc =
      WithMinimal({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 8}});
  EXPECT_OK(ParseAndValidate(doc, /*world_size=*/4));
  EXPECT_THAT(ParseAndValidate(doc, /*world_size=*/2),
              StatusIs(kInvalid, HasSubstr("x world size (2) = 16")));
  EXPECT_THAT(ParseAndValidate(doc, /*world_size=*/0),
              StatusIs(kInvalid, HasSubstr("world size must be >= 1")));
}

TEST(ValidateTrainConfigTest, AbsurdBatchesAreRejectedBeforeTheyOverflow) {
  TrainConfig c = DefaultTrainConfig();
  c.train_micro_batch_size_per_gpu = int64_t{1} << 35;  // x 64 tokens > 2^40
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("`train_micro_batch_size_per_gpu` = 34359738368: with "
                                           "world size 1 and seq_len 64")));
  c.train_micro_batch_size_per_gpu = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(ValidateTrainConfig(c, /*world_size=*/1 << 20), StatusIs(kInvalid));
  c.train_micro_batch_size_per_gpu = int64_t{1} << 20;
  c.data.seq_len = 1;
  EXPECT_OK(ValidateTrainConfig(c, /*world_size=*/1 << 20));  // exactly 2^40 sequences
  EXPECT_EQ(ResolveTrainBatchSize(c, 1 << 20), int64_t{1} << 40);
}

TEST(ValidateTrainConfigTest, RejectsWhatOnlyCodeOrFlagsCanProduce) {
  TrainConfig c = DefaultTrainConfig();
  c.optimizer.lr = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, HasSubstr("`optimizer.params.lr` = nan")));
  c = DefaultTrainConfig();
  c.gradient_clipping = std::numeric_limits<double>::infinity();
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, HasSubstr("`gradient_clipping` = inf")));
  c = DefaultTrainConfig();
  c.data.train_path = "bad\xff.bin";
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("`data.train` = \"bad\xEF\xBF\xBD.bin\": is not valid "
                                           "UTF-8")));
  c = DefaultTrainConfig();
  c.scheduler.warmup_type = "cosine";
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("`scheduler.params.warmup_type` = \"cosine\"")));
  c = DefaultTrainConfig();
  c.model.preset = "nope";
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, HasSubstr("`model.preset` = \"nope\"")));
}

// --- Presets and the model -------------------------------------------------------------------

TEST(ResolveModelConfigTest, EveryPresetResolvesToItself) {
  for (const std::string& name : GptPresetNames()) {
    SCOPED_TRACE(name);
    TrainModelConfig m;
    m.preset = name;
    ASSERT_OK_AND_ASSIGN(const GptConfig g, ResolveModelConfig(m));
    ASSERT_OK_AND_ASSIGN(const GptConfig want, GptPreset(name));
    EXPECT_EQ(g.name, want.name);
    EXPECT_EQ(g.vocab_size, want.vocab_size);
    EXPECT_EQ(g.max_seq_len, want.max_seq_len);
    EXPECT_EQ(g.hidden, want.hidden);
    EXPECT_EQ(g.num_layers, want.num_layers);
    EXPECT_EQ(g.num_heads, want.num_heads);
    // And through a file.
    ASSERT_OK(ParseAndValidate(WithMinimal({{"model", {{"preset", name}}},
                                            {"chunk", {{"size", "auto"}}},
                                            {"data", {{"seq_len", 0}}}})));
  }
}

TEST(ResolveModelConfigTest, ExplicitDimensionsOverrideThePreset) {
  TrainModelConfig m;
  m.preset = "gpt2";
  m.num_layers = 2;
  m.max_seq_len = 256;
  ASSERT_OK_AND_ASSIGN(const GptConfig g, ResolveModelConfig(m));
  EXPECT_EQ(g.name, "gpt2");
  EXPECT_EQ(g.num_layers, 2);
  EXPECT_EQ(g.max_seq_len, 256);
  EXPECT_EQ(g.hidden, 768);
  EXPECT_EQ(g.vocab_size, 50257);
}

TEST(ResolveModelConfigTest, CustomModelNeedsEveryDimension) {
  TrainModelConfig m;
  m.vocab_size = 100;
  m.max_seq_len = 16;
  m.hidden = 32;
  m.num_layers = 1;
  m.num_heads = 2;
  ASSERT_OK_AND_ASSIGN(const GptConfig g, ResolveModelConfig(m));
  EXPECT_EQ(g.name, "custom");
  EXPECT_EQ(GptParameterCount(g), (100 + 16) * 32 + 1 * (12 * 32 * 32 + 13 * 32) + 2 * 32);
  m.num_heads = 0;
  EXPECT_THAT(ResolveModelConfig(m), StatusIs(kInvalid, HasSubstr("missing: model.n_head")));
  EXPECT_THAT(ResolveModelConfig(TrainModelConfig{}),
              StatusIs(kInvalid, HasSubstr("missing: model.vocab_size, model.n_positions, "
                                           "model.n_embd, model.n_layer, model.n_head")));
}

TEST(ResolveModelConfigTest, HugeDimensionsAreRejectedNotOverflowed) {
  TrainModelConfig m;
  m.preset = "tiny";
  m.num_layers = int64_t{1} << 20;
  m.hidden = int64_t{1} << 30;
  m.num_heads = 1;
  EXPECT_THAT(ResolveModelConfig(m), StatusIs(kInvalid, HasSubstr("more than 2^53")));
  m.hidden = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(ResolveModelConfig(m), StatusIs(kInvalid, HasSubstr("`model.n_embd` = ")));
}

// More layers than the model allows is refused naming model.n_layer, as the config writes it
// (it used to reach the memory plan, which named ModelConfig's num_layers).
TEST(ResolveModelConfigTest, TooManyLayersNameTheKeyAsWritten) {
  for (const std::string preset : {"", "tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    TrainConfig c = DefaultTrainConfig();
    if (!preset.empty()) c.model = TrainModelConfig{.preset = preset};
    c.model.num_layers = (int64_t{1} << 20) + 1;
    EXPECT_THAT(ValidateTrainConfig(c),
                StatusIs(kInvalid, AllOf(HasSubstr("`model.n_layer` = 1048577: must be in [1, "
                                                   "1048576]"),
                                         Not(HasSubstr("num_layers")))));
  }
}

// Every preset, GPT-2's and the Llama family's, resolves to ModelPreset's model and validates
// from a file.
TEST(ResolveTrainModelTest, EveryPresetResolvesToItsModel) {
  const std::vector<std::string> names = TrainModelPresetNames();
  EXPECT_EQ(names.front(), "tiny");
  for (const char* llama : {"llama-3.2-1b", "qwen2.5-3b", "mistral-7b-v0.3", "llama-tiny"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), llama), names.end()) << llama;
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(const ModelConfig want, ModelPreset(name));
    ASSERT_OK_AND_ASSIGN(const ModelConfig got,
                         ResolveTrainModel(TrainModelConfig{.preset = name}));
    EXPECT_EQ(got, want);
    ASSERT_OK(ParseAndValidate(WithMinimal({{"model", {{"preset", name}}},
                                            {"chunk", {{"size", "auto"}}},
                                            {"data", {{"seq_len", 64}}}})));
  }
}

TEST(ResolveTrainModelTest, ExplicitDimensionsOverrideALlamaPreset) {
  TrainModelConfig m{.preset = "llama-tiny"};
  m.num_layers = 3;
  m.max_seq_len = 48;
  m.hidden = 128;
  m.num_heads = 8;
  m.vocab_size = 300;
  ASSERT_OK_AND_ASSIGN(const ModelConfig c, ResolveTrainModel(m));
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.max_position_embeddings, 48);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_kv_heads, 2);         // the preset's
  EXPECT_EQ(c.intermediate_size, 160);  // the preset's
  EXPECT_EQ(c.vocab_size, 300);
  // The GPT-2 view has the same dimensions.
  ASSERT_OK_AND_ASSIGN(const GptConfig g, ResolveModelConfig(m));
  EXPECT_EQ(g.hidden, 128);
  EXPECT_EQ(g.num_heads, 8);

  m = TrainModelConfig{.preset = "llama-tiny"};
  m.num_heads = 6;  // 64 / 6
  EXPECT_THAT(ResolveTrainModel(m), StatusIs(kInvalid, HasSubstr("`model.n_head` = 6")));
  m.hidden = 96;  // 16 per head, but 6 heads over 2 key/value heads is fine; 5 is not
  ASSERT_OK(ResolveTrainModel(m).status());
  m.hidden = 80;
  m.num_heads = 5;
  EXPECT_THAT(ResolveTrainModel(m),
              StatusIs(kInvalid, HasSubstr("`model.n_head` = 5 is not a multiple of the 2 "
                                           "key/value heads of model.preset \"llama-tiny\"")));
  m.num_heads = 4;
  m.hidden = 68;  // 17 per head
  EXPECT_THAT(ResolveTrainModel(m), StatusIs(kInvalid, HasSubstr("RoPE")));
}

// A file with a Llama-family preset is refused: a file is read as GPT-2 weights.
TEST(ValidateTrainConfigTest, ALlamaPresetTakesNoSafetensorsFile) {
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{.preset = "llama-tiny"};
  c.chunk.size_elems = 0;
  c.checkpoint.init_from = "/nonexistent/gpt2.safetensors";
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, AllOf(HasSubstr("gpt2.safetensors"),
                                                               HasSubstr("is a llama model"))));
}

// --comm=nccl: each refusal in the order a user fixes them, with the key or flag to change; the GPU
// probe runs only once the build and the config allow NCCL.
TEST(CheckNcclCommTest, RefusesWithTheFixNamedAndAcceptsAGpuRun) {
  TrainConfig c = DefaultTrainConfig();
  int probes = 0;
  const auto no_gpu = [&] {
    ++probes;
    return absl::UnavailableError("no CUDA device is available (cudaGetDeviceCount: no device)");
  };
  const auto gpu = [&] {
    ++probes;
    return absl::OkStatus();
  };

  // A build without CUDA: rebuild, and (with the cpu backend) switch the backend too.
  c.accelerator.kind = AcceleratorKind::kCpu;
  EXPECT_THAT(CheckNcclComm(c, /*nccl_compiled_in=*/false, no_gpu),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rebuild with --config=cuda"),
                             HasSubstr("accelerator.backend"), HasSubstr("--accelerator=cuda"))));
  c.accelerator.kind = AcceleratorKind::kCuda;
  EXPECT_THAT(
      CheckNcclComm(c, false, no_gpu),
      StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr("rebuild with --config=cuda"),
                                                            Not(HasSubstr("--accelerator=cuda")))));
  EXPECT_EQ(probes, 0);

  // A cuda build with the emulated accelerator: a config error naming both keys.
  c.accelerator.kind = AcceleratorKind::kCpu;
  EXPECT_THAT(CheckNcclComm(c, true, gpu),
              StatusIs(kInvalid, AllOf(HasSubstr("--comm=nccl"), HasSubstr("accelerator.backend"),
                                       HasSubstr("\"cpu\""), HasSubstr("--comm=mpi"))));
  EXPECT_EQ(probes, 0);

  // A cuda build without a GPU: the backend's own verdict, with its code.
  c.accelerator.kind = AcceleratorKind::kCuda;
  EXPECT_THAT(CheckNcclComm(c, true, no_gpu),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("--comm=nccl: accelerator.backend \"cuda\""),
                             HasSubstr("no CUDA device is available"))));
  EXPECT_EQ(probes, 1);

  // Everything in place: the run may start (the trainer creates the NCCL communicator).
  EXPECT_THAT(CheckNcclComm(c, true, gpu), IsOk());
  EXPECT_EQ(probes, 2);
}

// CudaAdam accumulates gradients into the host f32 accumulator (optimizer/cuda/cuda_adam.h), so
// accumulation is a valid cuda config; the values are still checked.
TEST(ValidateTrainConfigTest, CudaAcceptsGradientAccumulation) {
  TrainConfig c = DefaultTrainConfig();
  c.accelerator.kind = AcceleratorKind::kCuda;
  c.accelerator.copy_bandwidth_bytes_per_s = 0;
  c.gradient_accumulation_steps = 3;
  c.train_batch_size = 0;
  EXPECT_THAT(ValidateTrainConfig(c), IsOk());
  c.gradient_accumulation_steps = 0;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("`gradient_accumulation_steps` = 0: must be >= 1")));
}

}  // namespace
}  // namespace ps
