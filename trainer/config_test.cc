// Tests for trainer/config.h: the embedded default, parsing every key, misspellings with
// suggestions, wrong types, every impossible value, syntax-error positions, overrides, presets,
// the conversions to the optimizer's options, and random round trips and random corruptions.
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

namespace ps {

// Failures print configs as their JSON.
void PrintTo(const TrainConfig& config, std::ostream* os) { *os << TrainConfigToJson(config); }

namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;
using Json = nlohmann::json;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

absl::StatusOr<TrainConfig> Parse(const std::string& text) {
  return ParseTrainConfig(text, "test.json");
}

// Parses and validates.
absl::Status ParseAndValidate(const std::string& text, int world_size = 1) {
  absl::StatusOr<TrainConfig> c = Parse(text);
  if (!c.ok()) return c.status();
  return ValidateTrainConfig(*c, world_size);
}

// A small valid config to build on.
Json Minimal() { return Json{{"train_steps", 10}, {"model", {{"preset", "tiny"}}}}; }

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

// --- Parsing: defaults and every key --------------------------------------------------------

TEST(ParseTrainConfigTest, EmptyObjectGivesTheStructDefaults) {
  EXPECT_THAT(Parse("{}"), IsOkAndHolds(TrainConfig{}));
  EXPECT_THAT(Parse("  {\n}\n"), IsOkAndHolds(TrainConfig{}));
}

// One sample value per key path and how to see it landed.
struct KeySample {
  Json value;
  std::function<bool(const TrainConfig&)> landed;
};

std::map<std::string, KeySample> KeySamples() {
  std::map<std::string, KeySample> s;
  s["train_batch_size"] = {16, [](const TrainConfig& c) { return c.train_batch_size == 16; }};
  s["train_micro_batch_size_per_gpu"] = {
      4, [](const TrainConfig& c) { return c.train_micro_batch_size_per_gpu == 4; }};
  s["gradient_accumulation_steps"] = {
      1, [](const TrainConfig& c) { return c.gradient_accumulation_steps == 1; }};
  s["train_steps"] = {7, [](const TrainConfig& c) { return c.steps == 7; }};
  s["seed"] = {uint64_t{18446744073709551615u},
               [](const TrainConfig& c) { return c.seed == 18446744073709551615u; }};
  s["threads"] = {3, [](const TrainConfig& c) { return c.threads == 3; }};
  s["steps_per_print"] = {5, [](const TrainConfig& c) { return c.steps_per_print == 5; }};
  s["gradient_clipping"] = {0.5, [](const TrainConfig& c) { return c.gradient_clipping == 0.5; }};
  s["optimizer.type"] = {
      "Adam", [](const TrainConfig& c) { return c.optimizer.type == OptimizerType::kAdam; }};
  s["optimizer.params.lr"] = {0.01, [](const TrainConfig& c) { return c.optimizer.lr == 0.01; }};
  s["optimizer.params.betas"] = {Json::array({0.8, 0.95}), [](const TrainConfig& c) {
                                   return c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.95;
                                 }};
  s["optimizer.params.eps"] = {1e-6, [](const TrainConfig& c) { return c.optimizer.eps == 1e-6; }};
  s["optimizer.params.weight_decay"] = {
      0.1, [](const TrainConfig& c) { return c.optimizer.weight_decay == 0.1; }};
  s["optimizer.params.adam_w_mode"] = {
      true, [](const TrainConfig& c) { return c.optimizer.type == OptimizerType::kAdamW; }};
  s["optimizer.params.amsgrad"] = {false, [](const TrainConfig&) { return true; }};
  s["optimizer.params.bias_correction"] = {true, [](const TrainConfig&) { return true; }};
  s["scheduler.type"] = {"WarmupLR", [](const TrainConfig& c) {
                           return c.scheduler.type == SchedulerType::kWarmupLR;
                         }};
  s["scheduler.params.warmup_min_lr"] = {
      1e-5, [](const TrainConfig& c) { return c.scheduler.warmup_min_lr == 1e-5; }};
  s["scheduler.params.warmup_max_lr"] = {
      0.02, [](const TrainConfig& c) { return c.scheduler.warmup_max_lr == 0.02; }};
  s["scheduler.params.warmup_num_steps"] = {
      11, [](const TrainConfig& c) { return c.scheduler.warmup_num_steps == 11; }};
  s["scheduler.params.warmup_type"] = {
      "log", [](const TrainConfig& c) { return c.scheduler.warmup_type == "log"; }};
  s["scheduler.params.total_num_steps"] = {
      99, [](const TrainConfig& c) { return c.scheduler.total_num_steps == 99; }};
  s["scheduler.params.warmup_min_ratio"] = {
      0.1, [](const TrainConfig& c) { return c.scheduler.warmup_min_ratio == 0.1; }};
  s["scheduler.params.cos_min_ratio"] = {
      0.01, [](const TrainConfig& c) { return c.scheduler.cos_min_ratio == 0.01; }};
  s["scheduler.params.last_batch_iteration"] = {-1, [](const TrainConfig&) { return true; }};
  s["fp16.enabled"] = {true, [](const TrainConfig& c) { return c.fp16.enabled; }};
  s["fp16.loss_scale"] = {128, [](const TrainConfig& c) { return c.fp16.loss_scale == 128; }};
  s["fp16.initial_scale_power"] = {
      12, [](const TrainConfig& c) { return c.fp16.initial_scale_power == 12; }};
  s["fp16.loss_scale_window"] = {
      500, [](const TrainConfig& c) { return c.fp16.loss_scale_window == 500; }};
  s["fp16.hysteresis"] = {4, [](const TrainConfig& c) { return c.fp16.hysteresis == 4; }};
  s["fp16.consecutive_hysteresis"] = {
      true, [](const TrainConfig& c) { return c.fp16.consecutive_hysteresis; }};
  s["fp16.min_loss_scale"] = {0.25,
                              [](const TrainConfig& c) { return c.fp16.min_loss_scale == 0.25; }};
  s["bf16.enabled"] = {true, [](const TrainConfig& c) { return c.bf16; }};
  s["model.preset"] = {"gpt2", [](const TrainConfig& c) { return c.model.preset == "gpt2"; }};
  s["model.vocab_size"] = {1000, [](const TrainConfig& c) { return c.model.vocab_size == 1000; }};
  s["model.n_positions"] = {256, [](const TrainConfig& c) { return c.model.max_seq_len == 256; }};
  s["model.n_embd"] = {64, [](const TrainConfig& c) { return c.model.hidden == 64; }};
  s["model.n_layer"] = {2, [](const TrainConfig& c) { return c.model.num_layers == 2; }};
  s["model.n_head"] = {8, [](const TrainConfig& c) { return c.model.num_heads == 8; }};
  s["model.activation_checkpointing"] = {
      true, [](const TrainConfig& c) { return c.model.activation_checkpointing; }};
  s["chunk.size"] = {12345, [](const TrainConfig& c) { return c.chunk.size_elems == 12345; }};
  s["accelerator.backend"] = {
      "cuda", [](const TrainConfig& c) { return c.accelerator.kind == AcceleratorKind::kCuda; }};
  s["accelerator.memory"] = {
      "64MiB", [](const TrainConfig& c) { return c.accelerator.memory_bytes == 64 * kMiB; }};
  s["accelerator.host_memory"] = {
      "1GiB", [](const TrainConfig& c) { return c.accelerator.host_memory_bytes == kGiB; }};
  s["accelerator.copy_bandwidth"] = {"12GB/s", [](const TrainConfig& c) {
                                       return c.accelerator.copy_bandwidth_bytes_per_s == 12e9;
                                     }};
  s["accelerator.device"] = {1,
                             [](const TrainConfig& c) { return c.accelerator.device_index == 1; }};
  s["data.train"] = {"a.bin", [](const TrainConfig& c) { return c.data.train_path == "a.bin"; }};
  s["data.val"] = {"b.bin", [](const TrainConfig& c) { return c.data.val_path == "b.bin"; }};
  s["data.seq_len"] = {64, [](const TrainConfig& c) { return c.data.seq_len == 64; }};
  s["data.shuffle"] = {true, [](const TrainConfig& c) { return c.data.shuffle; }};
  s["data.seed"] = {7, [](const TrainConfig& c) { return c.data.seed == 7; }};
  s["data.eval_every"] = {10, [](const TrainConfig& c) { return c.data.eval_every == 10; }};
  s["data.eval_batches"] = {2, [](const TrainConfig& c) { return c.data.eval_batches == 2; }};
  s["checkpoint.dir"] = {"ckpt", [](const TrainConfig& c) { return c.checkpoint.dir == "ckpt"; }};
  s["checkpoint.every"] = {50, [](const TrainConfig& c) { return c.checkpoint.every == 50; }};
  s["checkpoint.keep_last"] = {3, [](const TrainConfig& c) { return c.checkpoint.keep_last == 3; }};
  s["checkpoint.resume"] = {true, [](const TrainConfig& c) { return c.checkpoint.resume; }};
  s["checkpoint.init_from"] = {"gpt2.safetensors", [](const TrainConfig& c) {
                                 return c.checkpoint.init_from == "gpt2.safetensors";
                               }};
  s["checkpoint.export"] = {"out.safetensors", [](const TrainConfig& c) {
                              return c.checkpoint.export_path == "out.safetensors";
                            }};
  s["profile.trace"] = {"t.json",
                        [](const TrainConfig& c) { return c.profile.trace_path == "t.json"; }};
  s["profile.metrics"] = {"m.jsonl",
                          [](const TrainConfig& c) { return c.profile.metrics_path == "m.jsonl"; }};
  return s;
}

// A document holding `value` at `path`, with the siblings the path needs (an optimizer type for
// optimizer.params, a scheduler type the param applies to).
Json DocFor(const std::string& path, const Json& value) {
  Json doc = Json::object();
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  Json* node = &doc;
  for (size_t i = 0; i + 1 < parts.size(); ++i) node = &(*node)[parts[i]];
  (*node)[parts.back()] = value;
  if (absl::StartsWith(path, "optimizer.params.")) doc["optimizer"]["type"] = "AdamW";
  if (absl::StartsWith(path, "scheduler.params.")) {
    const std::string& key = parts.back();
    doc["scheduler"]["type"] =
        (key == "warmup_min_ratio" || key == "cos_min_ratio") ? "WarmupCosineLR" : "WarmupDecayLR";
  }
  return doc;
}

TEST(ParseTrainConfigTest, EveryKeyPathIsAcceptedAndLands) {
  const std::map<std::string, KeySample> samples = KeySamples();
  const std::vector<std::string> paths = TrainConfigKeyPaths();
  EXPECT_EQ(paths.size(), samples.size());
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    auto it = samples.find(path);
    ASSERT_NE(it, samples.end()) << "no sample for key path " << path;
    const Json doc = DocFor(path, it->second.value);
    ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(doc.dump()));
    EXPECT_TRUE(it->second.landed(c)) << doc.dump();
  }
}

TEST(ParseTrainConfigTest, KeyPathsAreUniqueAndNamed) {
  std::vector<std::string> paths = TrainConfigKeyPaths();
  EXPECT_THAT(paths, testing::Contains("optimizer.params.betas"));
  EXPECT_THAT(paths, testing::Contains("model.n_embd"));
  EXPECT_THAT(paths, testing::Contains("scheduler.params.cos_min_ratio"));
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(std::adjacent_find(paths.begin(), paths.end()), paths.end());
}

TEST(ParseTrainConfigTest, TestdataDeepSpeedConfigLoadsAndValidates) {
  std::vector<std::string> ignored;
  std::ifstream in("trainer/testdata/configs/deepspeed_gpt2.json");
  ASSERT_TRUE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_OK_AND_ASSIGN(const TrainConfig c,
                       ParseTrainConfig(text, "deepspeed_gpt2.json", &ignored));
  EXPECT_THAT(ignored, UnorderedElementsAre("zero_optimization", "zero_allow_untested_optimizer",
                                            "wall_clock_breakdown"));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);  // "Adam" with adam_w_mode
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.total_num_steps, 10000);
  EXPECT_EQ(c.precision(), PrecisionMode::kF16);
  EXPECT_EQ(c.model.preset, "gpt2");
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_EQ(c.chunk.size_elems, 0);
  EXPECT_EQ(c.accelerator.kind, AcceleratorKind::kCuda);
  EXPECT_EQ(c.accelerator.memory_bytes, 16 * kGiB);
  EXPECT_EQ(c.accelerator.host_memory_bytes, 64 * kGiB);
  EXPECT_EQ(c.data.seq_len, 1024);
  EXPECT_EQ(c.checkpoint.every, 1000);
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(LoadTrainConfigTest, LoadsTestdataCustomModel) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c,
                       LoadTrainConfig("trainer/testdata/configs/cpu_custom_model.json"));
  EXPECT_EQ(c.precision(), PrecisionMode::kBF16);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_EQ(c.accelerator.copy_bandwidth_bytes_per_s, 12e9);
  EXPECT_EQ(c.accelerator.memory_bytes, 4 * kMiB);
  EXPECT_OK(ValidateTrainConfig(c));
  ASSERT_OK_AND_ASSIGN(const GptConfig model, ResolveModelConfig(c.model));
  EXPECT_EQ(model.name, "custom");
  EXPECT_EQ(ResolveSeqLen(c, model), 64);
}

// --- Misspellings ---------------------------------------------------------------------------

struct Misspelling {
  std::string json;
  std::string path;        // the unknown key's full path
  std::string suggestion;  // "" = none expected
};

class MisspellingTest : public testing::TestWithParam<Misspelling> {};

TEST_P(MisspellingTest, NamesThePathAndSuggests) {
  const Misspelling& m = GetParam();
  const absl::StatusOr<TrainConfig> c = Parse(m.json);
  EXPECT_THAT(c, StatusIs(kInvalid, HasSubstr(absl::StrCat("unknown key `", m.path, "`"))));
  if (m.suggestion.empty()) {
    EXPECT_THAT(c, StatusIs(kInvalid, Not(HasSubstr("did you mean"))));
  } else {
    EXPECT_THAT(c,
                StatusIs(kInvalid, HasSubstr(absl::StrCat("did you mean `", m.suggestion, "`?"))));
  }
  EXPECT_THAT(c, StatusIs(kInvalid, HasSubstr("test.json: ")));
}

INSTANTIATE_TEST_SUITE_P(
    EverySection, MisspellingTest,
    testing::Values(
        Misspelling{R"({"train_step": 1})", "train_step", "train_steps"},
        Misspelling{R"({"steps_per_prnit": 1})", "steps_per_prnit", "steps_per_print"},
        Misspelling{R"({"Train_Steps": 1})", "Train_Steps", "train_steps"},
        Misspelling{R"({"max_steps": 1})", "max_steps", "train_steps"},
        Misspelling{R"({"bfloat16": {"enabled": true}})", "bfloat16", "bf16"},
        Misspelling{R"({"optimizer": {"typ": "Adam"}})", "optimizer.typ", "type"},
        Misspelling{R"({"optimizer": {"type": "Adam", "params": {"betaz": [0.9, 0.9]}}})",
                    "optimizer.params.betaz", "betas"},
        Misspelling{R"({"optimizer": {"type": "Adam", "params": {"weight_decy": 0}}})",
                    "optimizer.params.weight_decy", "weight_decay"},
        Misspelling{R"({"optimizer": {"type": "Adam", "lr": 0.1}})", "optimizer.lr", "params"},
        Misspelling{R"({"scheduler": {"type": "WarmupLR", "parms": {}}})", "scheduler.parms",
                    "params"},
        Misspelling{R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 3}}})",
                    "scheduler.params.warmup_num_step", "warmup_num_steps"},
        Misspelling{R"({"fp16": {"enable": true}})", "fp16.enable", "enabled"},
        Misspelling{R"({"fp16": {"initial_scale_pwoer": 8}})", "fp16.initial_scale_pwoer",
                    "initial_scale_power"},
        Misspelling{R"({"bf16": {"enabeld": true}})", "bf16.enabeld", "enabled"},
        Misspelling{R"({"model": {"n_embed": 64}})", "model.n_embed", "n_embd"},
        Misspelling{R"({"model": {"hidden_size": 64}})", "model.hidden_size", "n_embd"},
        Misspelling{R"({"model": {"num_layers": 2}})", "model.num_layers", "n_layer"},
        Misspelling{R"({"model": {"n_ctx": 2}})", "model.n_ctx", "n_positions"},
        Misspelling{R"({"model": {"N_HEAD": 2}})", "model.N_HEAD", "n_head"},
        Misspelling{R"({"chunk": {"sise": 5}})", "chunk.sise", "size"},
        Misspelling{R"({"chunk": {"chunk_size": 5}})", "chunk.chunk_size", "size"},
        Misspelling{R"({"accelerator": {"memroy": "1GiB"}})", "accelerator.memroy", "memory"},
        Misspelling{R"({"accelerator": {"backnd": "cpu"}})", "accelerator.backnd", "backend"},
        Misspelling{R"({"accelerator": {"copy_bandwith": 1}})", "accelerator.copy_bandwith",
                    "copy_bandwidth"},
        Misspelling{R"({"data": {"seq_lenn": 5}})", "data.seq_lenn", "seq_len"},
        Misspelling{R"({"data": {"train_path": "x"}})", "data.train_path", "train"},
        Misspelling{R"({"checkpoint": {"keep_lst": 5}})", "checkpoint.keep_lst", "keep_last"},
        Misspelling{R"({"checkpoint": {"save_dir": "x"}})", "checkpoint.save_dir", "dir"},
        Misspelling{R"({"profile": {"trce": "x"}})", "profile.trce", "trace"},
        Misspelling{R"({"profile": {"metrics_out": "x"}})", "profile.metrics_out", "metrics"},
        Misspelling{R"({"xyzzy": 1})", "xyzzy", ""},
        Misspelling{R"({"model": {"completely_different": 1}})", "model.completely_different",
                    ""}));

TEST(ParseTrainConfigTest, UnknownKeyListsTheValidKeys) {
  EXPECT_THAT(Parse(R"({"chunk": {"sise": 5}})"),
              StatusIs(kInvalid, HasSubstr("valid keys in `chunk`: size")));
  EXPECT_THAT(Parse(R"({"xyzzy": 1})"),
              StatusIs(kInvalid, HasSubstr("valid keys at the top level: train_batch_size")));
}

TEST(ParseTrainConfigTest, IgnoredDeepSpeedKeysAreReportedNotRejected) {
  std::vector<std::string> ignored;
  ASSERT_OK_AND_ASSIGN(
      const TrainConfig c,
      ParseTrainConfig(R"({"zero_optimization": {"stage": 2}, "wall_clock_breakdown": true,
                          "train_steps": 3})",
                       "t.json", &ignored));
  EXPECT_EQ(c.steps, 3);
  EXPECT_THAT(ignored, UnorderedElementsAre("zero_optimization", "wall_clock_breakdown"));
  for (const std::string& key : IgnoredDeepSpeedKeys()) {
    SCOPED_TRACE(key);
    EXPECT_OK(Parse(Json{{key, Json::object()}}.dump()));
  }
}

TEST(ParseTrainConfigTest, IgnoredKeysAreOnlyIgnoredAtTheTopLevel) {
  EXPECT_THAT(Parse(R"({"model": {"zero_optimization": {}}})"),
              StatusIs(kInvalid, HasSubstr("unknown key `model.zero_optimization`")));
}

// --- Wrong types ----------------------------------------------------------------------------

struct WrongType {
  std::string json;
  std::string message;  // expected substring: the key, the expected and the found type
};

class WrongTypeTest : public testing::TestWithParam<WrongType> {};

TEST_P(WrongTypeTest, NamesKeyExpectedAndFound) {
  EXPECT_THAT(Parse(GetParam().json), StatusIs(kInvalid, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Keys, WrongTypeTest,
    testing::Values(
        WrongType{R"({"train_steps": "10"})",
                  "`train_steps` must be an integer, found string \"10\""},
        WrongType{R"({"train_steps": 2.5})", "`train_steps` must be an integer, found number 2.5"},
        WrongType{R"({"train_steps": null})", "`train_steps` must be an integer, found null"},
        WrongType{R"({"train_steps": true})",
                  "`train_steps` must be an integer, found boolean true"},
        WrongType{R"({"seed": -1})", "`seed` = integer -1: must be >= 0"},
        WrongType{R"({"seed": 1.5})", "`seed` must be an unsigned integer, found number 1.5"},
        WrongType{R"({"seed": "1"})", "`seed` must be an unsigned integer, found string"},
        WrongType{R"({"gradient_clipping": "1.0"})",
                  "`gradient_clipping` must be a number, found string \"1.0\""},
        WrongType{R"({"fp16": {"enabled": 1}})",
                  "`fp16.enabled` must be a boolean (true or false), found integer 1"},
        WrongType{R"({"fp16": {"enabled": "auto"}})",
                  "`fp16.enabled` must be a boolean (true or false), found string \"auto\""},
        WrongType{R"({"fp16": true})", "`fp16` must be an object, found boolean true"},
        WrongType{R"({"bf16": {"enabled": []}})",
                  "`bf16.enabled` must be a boolean (true or false), found array of 0"},
        WrongType{R"({"optimizer": "Adam"})", "`optimizer` must be an object, found string"},
        WrongType{R"({"optimizer": {"type": 1}})", "`optimizer.type` must be a string, found"},
        WrongType{R"({"optimizer": {"type": "Adam", "params": {"lr": "0.1"}}})",
                  "`optimizer.params.lr` must be a number, found string \"0.1\""},
        WrongType{R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
                  "`optimizer.params.betas` must be an array of two numbers [beta1, beta2], "
                  "found array of 1 element(s)"},
        WrongType{R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, "x"]}}})",
                  "`optimizer.params.betas` must be an array of two numbers"},
        WrongType{R"({"optimizer": {"type": "Adam", "params": {"betas": 0.9}}})",
                  "`optimizer.params.betas` must be an array of two numbers [beta1, beta2], "
                  "found number 0.9"},
        WrongType{R"({"optimizer": {"type": "Adam", "params": []}})",
                  "`optimizer.params` must be an object, found array"},
        WrongType{R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1.5}}})",
                  "`scheduler.params.warmup_num_steps` must be an integer, found number 1.5"},
        WrongType{R"({"scheduler": {"type": ["WarmupLR"]}})",
                  "`scheduler.type` must be a string, found array"},
        WrongType{R"({"model": "gpt2"})", "`model` must be an object, found string \"gpt2\""},
        WrongType{R"({"model": {"preset": 5}})",
                  "`model.preset` must be a string, found integer 5"},
        WrongType{R"({"model": {"n_layer": "4"}})", "`model.n_layer` must be an integer"},
        WrongType{R"({"chunk": {"size": true}})",
                  "`chunk.size` must be an integer number of elements or \"auto\", found boolean"},
        WrongType{R"({"chunk": {"size": 1.5}})", "`chunk.size` must be an integer, found number"},
        WrongType{R"({"accelerator": {"memory": [1]}})",
                  "`accelerator.memory` must be a byte quantity"},
        WrongType{R"({"accelerator": {"memory": 1.5}})",
                  "`accelerator.memory` must be an integer, found number 1.5"},
        WrongType{R"({"accelerator": {"copy_bandwidth": {}}})",
                  "`accelerator.copy_bandwidth` must be a bandwidth"},
        WrongType{R"({"accelerator": {"backend": null}})",
                  "`accelerator.backend` must be a string, found null"},
        WrongType{R"({"accelerator": {"device": "0"}})", "`accelerator.device` must be an integer"},
        WrongType{R"({"data": {"train": 5}})", "`data.train` must be a string, found integer 5"},
        WrongType{R"({"data": {"shuffle": "yes"}})", "`data.shuffle` must be a boolean"},
        WrongType{R"({"checkpoint": {"resume": "true"}})", "`checkpoint.resume` must be a boolean"},
        WrongType{R"({"checkpoint": {"every": {}}})", "`checkpoint.every` must be an integer"},
        WrongType{R"({"profile": {"trace": false}})", "`profile.trace` must be a string"},
        WrongType{R"([1, 2])", "a config is a JSON object ({...}), found array"},
        WrongType{R"("config")", "a config is a JSON object ({...}), found string"},
        WrongType{R"(42)", "a config is a JSON object ({...}), found integer 42"}));

TEST(ParseTrainConfigTest, WholeFloatsAreIntegers) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(R"({"train_steps": 1e3, "seed": 2.0})"));
  EXPECT_EQ(c.steps, 1000);
  EXPECT_EQ(c.seed, 2u);
}

TEST(ParseTrainConfigTest, IntegersOutOfTheirTypeAreRejected) {
  EXPECT_THAT(Parse(R"({"threads": 1e10})"),
              StatusIs(kInvalid, HasSubstr("`threads` = number 1e+10: out of range")));
  EXPECT_THAT(
      Parse(R"({"fp16": {"hysteresis": 3000000000}})"),
      StatusIs(kInvalid, HasSubstr("`fp16.hysteresis` = integer 3000000000: out of range")));
  EXPECT_THAT(
      Parse(R"({"train_steps": 18446744073709551615})"),
      StatusIs(kInvalid, HasSubstr("`train_steps` = integer 18446744073709551615: out of")));
  EXPECT_THAT(Parse(R"({"train_steps": 1e300})"),
              StatusIs(kInvalid, HasSubstr("`train_steps` = number 1e+300: out of range")));
  EXPECT_THAT(Parse(R"({"seed": 1e20})"),
              StatusIs(kInvalid, HasSubstr("`seed` = number 1e+20: out of range")));
}

// --- Impossible values ------------------------------------------------------------------------

struct BadValueCase {
  std::string json;     // parsed (and, with `validate`, validated)
  std::string message;  // expected substring
};

class ImpossibleValueTest : public testing::TestWithParam<BadValueCase> {};

TEST_P(ImpossibleValueTest, IsInvalidArgumentNamingKeyAndValue) {
  EXPECT_THAT(ParseAndValidate(GetParam().json), StatusIs(kInvalid, HasSubstr(GetParam().message)));
}

std::string WithMinimal(const Json& patch) {
  Json doc = Minimal();
  doc.merge_patch(patch);
  return doc.dump();
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
        BadValueCase{
            WithMinimal({{"gradient_accumulation_steps", 4}}),
            "`gradient_accumulation_steps` = 4: gradient accumulation is not supported yet"},
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
                     "`accelerator.copy_bandwidth` = -1: must be finite and >= 0"},
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
        BadValueCase{WithMinimal({{"data", {{"seq_len", 65}}}}),
                     "`data.seq_len` = 65 exceeds the model's n_positions (64, model tiny)"},
        BadValueCase{WithMinimal({{"model", {{"preset", "tiny"}, {"n_head", 5}}}}),
                     "`model.n_embd` = 64 is not divisible by `model.n_head` = 5"},
        BadValueCase{R"({"train_steps": 1, "model": {"n_embd": 64, "n_head": 4}})",
                     "the model is not defined: set model.preset (tiny, gpt2"},
        BadValueCase{R"({"train_steps": 1, "model": {"n_embd": 64, "n_head": 4}})",
                     "missing: model.vocab_size, model.n_positions, model.n_layer"},
        BadValueCase{WithMinimal({{"model", {{"preset", "gpt2"}}}, {"chunk", {{"size", 1000000}}}}),
                     "`chunk.size` = 1000000 elements cannot hold operator embedding (39383808 "
                     "elements; all tensors of an operator share one chunk) of model gpt2; use "
                     "chunk.size >= 39383808 or \"auto\""},
        BadValueCase{
            WithMinimal({{"model", {{"vocab_size", 1 << 30}, {"n_embd", 1 << 30}, {"n_head", 1}}}}),
            "parameters, more than 2^53"},
        BadValueCase{
            WithMinimal({{"scheduler",
                          {{"type", "WarmupCosineLR"},
                           {"params", {{"warmup_num_steps", 20}, {"total_num_steps", 20}}}}}}),
            "scheduler WarmupCosineLR: scheduler.params.total_num_steps (20) must exceed the "
            "warm-up steps (20)"},
        BadValueCase{WithMinimal({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.001}}}}},
                                  {"scheduler",
                                   {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.01}}}}}}),
                     "scheduler WarmupLR: scheduler.params.warmup_min_lr must be in [0, 0.001]"},
        BadValueCase{WithMinimal({{"checkpoint", {{"every", 100}}}}),
                     "`checkpoint.every` = 100 needs a checkpoint directory"},
        BadValueCase{WithMinimal({{"checkpoint", {{"resume", true}}}}),
                     "`checkpoint.resume` = true needs checkpoint.dir"},
        BadValueCase{
            WithMinimal({{"accelerator", {{"backend", "cuda"}, {"copy_bandwidth", "1GB/s"}}}}),
            "`accelerator.copy_bandwidth` = 1e+09 bytes/s emulates a link and applies "
            "only to backend \"cpu\""}));

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

// --- Syntax errors --------------------------------------------------------------------------

struct SyntaxCase {
  std::string text;
  std::string position;  // "line:column"
};

class SyntaxErrorTest : public testing::TestWithParam<SyntaxCase> {};

TEST_P(SyntaxErrorTest, ReportsLineAndColumn) {
  EXPECT_THAT(Parse(GetParam().text),
              StatusIs(kInvalid, HasSubstr(absl::StrCat("test.json:", GetParam().position,
                                                        ": JSON syntax error: "))));
}

INSTANTIATE_TEST_SUITE_P(
    Positions, SyntaxErrorTest,
    testing::Values(SyntaxCase{"", "1:1"}, SyntaxCase{"   ", "1:4"},
                    SyntaxCase{"{\n  \"a\": ,}", "2:8"}, SyntaxCase{"{\"train_steps\": 1", "1:18"},
                    SyntaxCase{"{\"train_steps\": 1,}", "1:19"}, SyntaxCase{"{} x", "1:4"},
                    SyntaxCase{"{\n\n\n    \"seed\": tru}", "4:16"},
                    // The column counts characters: "é" is two bytes, one column.
                    SyntaxCase{"{\"\xC3\xA9\": nul}", "1:10"},
                    SyntaxCase{"{\r\n\"a\": 'x'}", "2:6"}, SyntaxCase{"{\"a\": 1e999}", "1:11"},
                    SyntaxCase{"{\"a\": \"bad \xFF\"}", "1:12"},
                    SyntaxCase{"// comment\n{}", "1:1"}, SyntaxCase{"{\"a\": [1, 2}", "1:12"}));

TEST(SyntaxErrorMessageTest, MessageQuotesTheLineAndTheParserReason) {
  EXPECT_THAT(Parse("{\n  \"lr\": ,\n}"),
              StatusIs(kInvalid, AllOf(HasSubstr("test.json:2:9: JSON syntax error: syntax error "
                                                 "while parsing value - unexpected ','"),
                                       HasSubstr("the line reads: \"  \\\"lr\\\": ,\""),
                                       Not(HasSubstr("[json.exception")))));
}

TEST(SyntaxErrorMessageTest, DuplicateKeysAreNamedWithTheirPath) {
  EXPECT_THAT(Parse(R"({"seed": 1, "seed": 2})"),
              StatusIs(kInvalid, HasSubstr("test.json: key `seed` appears more than once")));
  EXPECT_THAT(Parse(R"({"optimizer": {"type": "Adam", "params": {"lr": 1, "lr": 2}}})"),
              StatusIs(kInvalid, HasSubstr("key `optimizer.params.lr` appears more than once")));
  EXPECT_THAT(Parse(R"({"a": [{"x": 1}, {"x": 1, "x": 2}]})"),
              StatusIs(kInvalid, HasSubstr("key `a[1].x` appears more than once")));
  // The same key in different objects is fine.
  EXPECT_OK(Parse(R"({"fp16": {"enabled": false}, "bf16": {"enabled": false}})"));
}

TEST(SyntaxErrorMessageTest, DeepNestingIsRejectedWithoutRecursion) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_THAT(Parse(deep), StatusIs(kInvalid, HasSubstr("nests deeper than 16 levels")));
  const std::string unbalanced(200000, '{');
  EXPECT_THAT(Parse(unbalanced), StatusIs(kInvalid));
}

// --- Overrides ----------------------------------------------------------------------------

TEST(ApplyOverridesTest, NothingSetChangesNothing) {
  TrainConfig c = DefaultTrainConfig();
  ASSERT_OK(ApplyOverrides(ConfigOverrides{}, &c));
  EXPECT_EQ(c, DefaultTrainConfig());
}

TEST(ApplyOverridesTest, EveryFieldLands) {
  TrainConfig c = DefaultTrainConfig();
  c.train_batch_size = 8;
  c.model.activation_checkpointing = true;
  ConfigOverrides o;
  o.model = "gpt2";
  o.train_data = "train.bin";
  o.val_data = "val.bin";
  o.init_from = "gpt2.safetensors";
  o.accelerator = "CUDA";
  o.accelerator_memory = "64MiB";
  o.chunk_size = "auto";
  o.save_dir = "ckpt";
  o.metrics_out = "m.jsonl";
  o.trace_out = "t.json";
  o.steps = 5;
  o.seq_len = 256;
  o.micro_batch_size = 2;
  o.seed = 99;
  o.resume = true;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.model.preset, "gpt2");
  EXPECT_EQ(c.model.vocab_size, 0);  // the file's explicit dimensions are gone
  EXPECT_EQ(c.model.hidden, 0);
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_EQ(c.data.train_path, "train.bin");
  EXPECT_EQ(c.data.val_path, "val.bin");
  EXPECT_EQ(c.checkpoint.init_from, "gpt2.safetensors");
  EXPECT_EQ(c.accelerator.kind, AcceleratorKind::kCuda);
  EXPECT_EQ(c.accelerator.memory_bytes, 64 * kMiB);
  EXPECT_EQ(c.chunk.size_elems, 0);
  EXPECT_EQ(c.checkpoint.dir, "ckpt");
  EXPECT_EQ(c.profile.metrics_path, "m.jsonl");
  EXPECT_EQ(c.profile.trace_path, "t.json");
  EXPECT_EQ(c.steps, 5);
  EXPECT_EQ(c.data.seq_len, 256);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.train_batch_size, 0);  // re-derived from the flag
  EXPECT_EQ(c.seed, 99u);
  EXPECT_TRUE(c.checkpoint.resume);
  EXPECT_OK(ValidateTrainConfig(c));
}

struct BadOverride {
  std::function<void(ConfigOverrides&)> set;
  std::string message;
};

class BadOverrideTest : public testing::TestWithParam<BadOverride> {};

TEST_P(BadOverrideTest, IsInvalidArgumentNamingTheFlagAndLeavesTheConfig) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.steps = 7;  // applied before the bad one in a partial implementation; must not stick
  GetParam().set(o);
  EXPECT_THAT(ApplyOverrides(o, &c), StatusIs(kInvalid, HasSubstr(GetParam().message)));
  EXPECT_EQ(c, DefaultTrainConfig());
}

INSTANTIATE_TEST_SUITE_P(
    Flags, BadOverrideTest,
    testing::Values(
        BadOverride{[](ConfigOverrides& o) { o.accelerator_memory = "12XB"; },
                    "--accelerator_memory=12XB: cannot parse byte quantity \"12XB\": unknown unit"},
        BadOverride{[](ConfigOverrides& o) { o.accelerator_memory = "-1GiB"; },
                    "--accelerator_memory=-1GiB: byte quantity \"-1GiB\" is negative"},
        BadOverride{[](ConfigOverrides& o) { o.accelerator_memory = ""; },
                    "--accelerator_memory=: cannot parse byte quantity"},
        BadOverride{[](ConfigOverrides& o) { o.accelerator = "tpu"; },
                    "--accelerator=tpu: is not a backend; use \"cpu\""},
        BadOverride{[](ConfigOverrides& o) { o.model = "gpt3"; },
                    "--model=gpt3: unknown model preset; valid presets: tiny, gpt2"},
        BadOverride{[](ConfigOverrides& o) { o.chunk_size = "64MiB"; },
                    "--chunk_size=64MiB: chunk sizes are in elements, not bytes"},
        BadOverride{[](ConfigOverrides& o) { o.chunk_size = "1e3"; },
                    "--chunk_size=1e3: must be an integer number of elements"},
        BadOverride{[](ConfigOverrides& o) { o.chunk_size = "0"; },
                    "--chunk_size=0: must be an integer number of elements in [1,"},
        BadOverride{[](ConfigOverrides& o) { o.chunk_size = "-5"; }, "--chunk_size=-5: must be"},
        BadOverride{[](ConfigOverrides& o) { o.chunk_size = "lots"; },
                    "--chunk_size=lots: must be"},
        BadOverride{[](ConfigOverrides& o) { o.chunk_size = "99999999999999999999"; },
                    "--chunk_size=99999999999999999999: must be"},
        BadOverride{[](ConfigOverrides& o) { o.steps = 0; }, "--steps=0: must be > 0"},
        BadOverride{[](ConfigOverrides& o) { o.steps = -3; }, "--steps=-3: must be > 0"},
        BadOverride{[](ConfigOverrides& o) { o.seq_len = -1; }, "--seq_len=-1: must be >= 0"},
        BadOverride{[](ConfigOverrides& o) { o.micro_batch_size = 0; },
                    "--micro_batch_size=0: must be >= 1"}));

TEST(ApplyOverridesTest, ChunkSizeForms) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.chunk_size = " 4096 ";
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.chunk.size_elems, 4096);
  o.chunk_size = "AUTO";
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.chunk.size_elems, 0);
}

TEST(ApplyOverridesTest, ModelOverrideThenValidationSaysWhatToChange) {
  TrainConfig c = DefaultTrainConfig();
  c.data.seq_len = 128;
  ConfigOverrides o;
  o.model = "tiny";  // 64 positions; this seq_len is 128
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("`data.seq_len` = 128 exceeds the model's n_positions "
                                           "(64, model tiny); use at most 64")));
  o = ConfigOverrides{};
  o.seq_len = 0;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_OK(ValidateTrainConfig(c));

  c = DefaultTrainConfig();
  o = ConfigOverrides{};
  o.model = "gpt2";  // its embedding does not fit the default's chunk
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("cannot hold operator embedding")));
  o = ConfigOverrides{};
  o.chunk_size = "auto";
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(ApplyOverridesTest, StepsOverrideSatisfiesAFileWithoutSteps) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c, Parse(R"({"model": {"preset": "tiny"}})"));
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, HasSubstr("train_steps")));
  ConfigOverrides o;
  o.steps = 3;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(ApplyOverridesTest, NonUtf8PathIsCaughtByValidation) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.save_dir = std::string("ck\xC0\x80pt");  // overlong NUL
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, HasSubstr("`checkpoint.dir` = ")));
}

// --- Presets and the model -------------------------------------------------------------------

TEST(ResolveModelConfigTest, EveryPresetResolvesToItself) {
  for (const std::string& name : GptPresetNames()) {
    SCOPED_TRACE(name);
    ModelConfig m;
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
  ModelConfig m;
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
  ModelConfig m;
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
  EXPECT_THAT(ResolveModelConfig(ModelConfig{}),
              StatusIs(kInvalid, HasSubstr("missing: model.vocab_size, model.n_positions, "
                                           "model.n_embd, model.n_layer, model.n_head")));
}

TEST(ResolveModelConfigTest, HugeDimensionsAreRejectedNotOverflowed) {
  ModelConfig m;
  m.preset = "tiny";
  m.num_layers = int64_t{1} << 30;
  m.hidden = int64_t{1} << 30;
  m.num_heads = 1;
  EXPECT_THAT(ResolveModelConfig(m), StatusIs(kInvalid, HasSubstr("more than 2^53")));
  m.hidden = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(ResolveModelConfig(m), StatusIs(kInvalid, HasSubstr("`model.n_embd` = ")));
}

// --- Conversions --------------------------------------------------------------------------

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

// --- Other forms the parser accepts ---------------------------------------------------------

TEST(ParseTrainConfigTest, NamesAreCaseInsensitive) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c,
                       Parse(R"({"optimizer": {"type": "adamw"}, "accelerator": {"backend": "CUDA"},
               "scheduler": {"type": "warmuplr", "params": {"warmup_type": "LOG"}},
               "chunk": {"size": "Auto"}})"));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(c.accelerator.kind, AcceleratorKind::kCuda);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_EQ(c.chunk.size_elems, 0);
}

TEST(ParseTrainConfigTest, AdamWModeTurnsAdamIntoAdamW) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c, Parse(R"({"optimizer": {"type": "Adam"}})"));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  ASSERT_OK_AND_ASSIGN(
      c, Parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  ASSERT_OK_AND_ASSIGN(
      c, Parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})"));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
}

TEST(ParseTrainConfigTest, ByteAndBandwidthForms) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c,
                       Parse(R"({"accelerator": {"memory": 1048576, "host_memory": "1.5 GiB",
                                "copy_bandwidth": "1.5 GiB/s"}})"));
  EXPECT_EQ(c.accelerator.memory_bytes, kMiB);
  EXPECT_EQ(c.accelerator.host_memory_bytes, 3 * kGiB / 2);
  EXPECT_EQ(c.accelerator.copy_bandwidth_bytes_per_s, 1.5 * kGiB);
  ASSERT_OK_AND_ASSIGN(c, Parse(R"({"accelerator": {"copy_bandwidth": 5e8, "memory": "2gb"}})"));
  EXPECT_EQ(c.accelerator.copy_bandwidth_bytes_per_s, 5e8);
  EXPECT_EQ(c.accelerator.memory_bytes, 2000000000);
  ASSERT_OK_AND_ASSIGN(c, Parse(R"({"accelerator": {"copy_bandwidth": "100MB"}})"));
  EXPECT_EQ(c.accelerator.copy_bandwidth_bytes_per_s, 1e8);
}

TEST(ParseTrainConfigTest, WarmupMaxLrAbsentMeansTheOptimizerLr) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(R"({"scheduler": {"type": "WarmupLR"}})"));
  EXPECT_EQ(c.scheduler.warmup_max_lr, -1);
}

// --- Canonical JSON -----------------------------------------------------------------------

TEST(TrainConfigToJsonTest, CanonicalForms) {
  TrainConfig c = DefaultTrainConfig();
  std::string json = TrainConfigToJson(c);
  EXPECT_THAT(json, HasSubstr("\"memory\": \"10MiB\""));
  EXPECT_THAT(json, HasSubstr("\"host_memory\": 0"));
  EXPECT_THAT(json, HasSubstr("\"size\": 81920"));
  EXPECT_THAT(json, HasSubstr("\"type\": \"WarmupDecayLR\""));
  EXPECT_THAT(json, Not(HasSubstr("warmup_max_lr")));              // -1: the optimizer's lr
  EXPECT_THAT(json, Not(HasSubstr("cos_min_ratio")));              // not a WarmupDecayLR param
  EXPECT_THAT(json, Not(HasSubstr("train_batch_size\"")));         // 0: derived
  EXPECT_EQ(json.find("\"train_micro_batch_size_per_gpu\""), 4u);  // fixed order, 2-space indent
  c.scheduler = SchedulerConfig{};  // kNone: no section, so no params either
  c.chunk.size_elems = 0;
  c.accelerator.memory_bytes = 1536;
  c.accelerator.host_memory_bytes = 3 * kKiB;
  json = TrainConfigToJson(c);
  EXPECT_THAT(json, Not(HasSubstr("scheduler")));
  EXPECT_THAT(json, HasSubstr("\"size\": \"auto\""));
  EXPECT_THAT(json, HasSubstr("\"memory\": 1536"));
  EXPECT_THAT(json, HasSubstr("\"host_memory\": \"3KiB\""));
  EXPECT_THAT(Parse(json), IsOkAndHolds(c));
}

TEST(TrainConfigToJsonTest, InapplicableSchedulerParamsAreNotWritten) {
  TrainConfig c;
  c.scheduler.type = SchedulerType::kWarmupLR;
  c.scheduler.cos_min_ratio = 0.5;  // not a WarmupLR param
  ASSERT_OK_AND_ASSIGN(const TrainConfig back, Parse(TrainConfigToJson(c)));
  EXPECT_EQ(back.scheduler.cos_min_ratio, SchedulerConfig{}.cos_min_ratio);
  c.scheduler.cos_min_ratio = SchedulerConfig{}.cos_min_ratio;
  EXPECT_EQ(back, c);
}

// --- Random round trips -------------------------------------------------------------------

class RandomConfigs {
 public:
  explicit RandomConfigs(uint64_t seed) : rng_(seed) {}

  TrainConfig Next() {
    TrainConfig c;
    c.train_batch_size = Int(0, std::numeric_limits<int64_t>::max());
    c.train_micro_batch_size_per_gpu = Int(1, std::numeric_limits<int64_t>::max());
    c.steps = Int(0, std::numeric_limits<int64_t>::max());
    c.seed = U64();
    c.threads = static_cast<int>(Int(0, 65536));
    c.steps_per_print = Int(1, std::numeric_limits<int64_t>::max());
    c.gradient_clipping = NonNegative();
    c.optimizer.type = Bool() ? OptimizerType::kAdam : OptimizerType::kAdamW;
    c.optimizer.lr = NonNegative();
    c.optimizer.beta1 = UnitOpen();
    c.optimizer.beta2 = UnitOpen();
    c.optimizer.eps = Positive();
    c.optimizer.weight_decay = NonNegative();
    c.scheduler.type = static_cast<SchedulerType>(Int(0, 3));
    if (c.scheduler.type != SchedulerType::kNone) {
      c.scheduler.warmup_num_steps = Int(0, std::numeric_limits<int64_t>::max());
      c.scheduler.warmup_type = Bool() ? "log" : "linear";
    }
    if (c.scheduler.type == SchedulerType::kWarmupLR ||
        c.scheduler.type == SchedulerType::kWarmupDecayLR) {
      c.scheduler.warmup_min_lr = NonNegative();
      c.scheduler.warmup_max_lr = Bool() ? -1.0 : NonNegative();
    }
    if (c.scheduler.type == SchedulerType::kWarmupDecayLR ||
        c.scheduler.type == SchedulerType::kWarmupCosineLR) {
      c.scheduler.total_num_steps = Int(0, std::numeric_limits<int64_t>::max());
    }
    if (c.scheduler.type == SchedulerType::kWarmupCosineLR) {
      c.scheduler.warmup_min_ratio = UnitClosed();
      c.scheduler.cos_min_ratio = UnitClosed();
    }
    c.fp16.enabled = Bool();
    c.fp16.loss_scale = Bool() ? 0.0 : std::ldexp(UnitClosed(), static_cast<int>(Int(0, 100)));
    c.fp16.initial_scale_power = static_cast<int>(Int(0, 100));
    c.fp16.loss_scale_window = Int(1, std::numeric_limits<int64_t>::max());
    c.fp16.hysteresis = static_cast<int>(Int(1, std::numeric_limits<int>::max()));
    c.fp16.consecutive_hysteresis = Bool();
    c.fp16.min_loss_scale = std::ldexp(0.5 + UnitClosed() / 2, static_cast<int>(Int(-60, 99)));
    c.bf16 = Bool();
    const std::vector<std::string> presets = GptPresetNames();
    c.model.preset = Bool() ? "" : presets[Int(0, presets.size() - 1)];
    c.model.vocab_size = Int(0, int64_t{1} << 30);
    c.model.max_seq_len = Int(0, int64_t{1} << 30);
    c.model.hidden = Int(0, int64_t{1} << 30);
    c.model.num_layers = Int(0, int64_t{1} << 30);
    c.model.num_heads = Int(0, int64_t{1} << 30);
    c.model.activation_checkpointing = Bool();
    c.chunk.size_elems = Int(0, int64_t{1} << 40);
    c.accelerator.kind = Bool() ? AcceleratorKind::kCpu : AcceleratorKind::kCuda;
    c.accelerator.memory_bytes = Bytes();
    c.accelerator.host_memory_bytes = Bytes();
    c.accelerator.copy_bandwidth_bytes_per_s = NonNegative();
    c.accelerator.device_index = static_cast<int>(Int(0, 65536));
    c.data.train_path = String();
    c.data.val_path = String();
    c.data.seq_len = Int(0, std::numeric_limits<int64_t>::max());
    c.data.shuffle = Bool();
    c.data.seed = U64();
    c.data.eval_every = Int(0, std::numeric_limits<int64_t>::max());
    c.data.eval_batches = Int(1, std::numeric_limits<int64_t>::max());
    c.checkpoint.dir = String();
    c.checkpoint.every = Int(0, std::numeric_limits<int64_t>::max());
    c.checkpoint.keep_last = Int(1, std::numeric_limits<int64_t>::max());
    c.checkpoint.resume = Bool();
    c.checkpoint.init_from = String();
    c.checkpoint.export_path = String();
    c.profile.trace_path = String();
    c.profile.metrics_path = String();
    return c;
  }

 private:
  // Small values, boundaries, and anything in between.
  int64_t Int(int64_t lo, int64_t hi) {
    switch (std::uniform_int_distribution<int>(0, 3)(rng_)) {
      case 0:
        return lo;
      case 1:
        return hi;
      case 2:
        return std::uniform_int_distribution<int64_t>(lo, std::min(hi, lo + 100))(rng_);
      default:
        return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
    }
  }
  uint64_t U64() {
    return Bool() ? std::uniform_int_distribution<uint64_t>(0, 10)(rng_)
                  : std::uniform_int_distribution<uint64_t>()(rng_);
  }
  bool Bool() { return std::uniform_int_distribution<int>(0, 1)(rng_) == 1; }
  double UnitClosed() {
    const double picks[] = {0.0, 1.0, 0.1, 1.0 / 3, 5e-324, 0.9999999999999999};
    return Bool() ? picks[Int(0, 5)] : std::uniform_real_distribution<double>(0, 1)(rng_);
  }
  double UnitOpen() {
    const double v = UnitClosed();
    return v == 1.0 ? 0.5 : v;
  }
  double Positive() {
    const double picks[] = {
        5e-324, 1e-300, 1e-8, 0.1, 1.0 / 3, 1e300, std::numeric_limits<double>::max()};
    return Bool() ? picks[Int(0, 6)]
                  : std::ldexp(0.5 + UnitClosed() / 2, static_cast<int>(Int(-1000, 1000)));
  }
  double NonNegative() { return Int(0, 4) == 0 ? 0.0 : Positive(); }
  int64_t Bytes() {
    switch (std::uniform_int_distribution<int>(0, 4)(rng_)) {
      case 0:
        return 0;
      case 1:
        return Int(1, 1 << 20) * kMiB;
      case 2:
        return Int(1, 100) * kGiB * 1024;
      case 3:
        return std::numeric_limits<int64_t>::max() - Int(0, 5000);
      default:
        return Int(0, std::numeric_limits<int64_t>::max());
    }
  }
  // Valid UTF-8 without NUL: ASCII (quotes, backslashes, control characters), two- to four-byte
  // characters, noncharacters.
  std::string String() {
    if (Int(0, 3) == 0) return "";
    std::string s;
    const int64_t n = Int(1, 40);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t cp = 0;
      switch (std::uniform_int_distribution<int>(0, 3)(rng_)) {
        case 0:
          cp = static_cast<uint32_t>(Int(1, 0x7F));
          break;
        case 1:
          cp = static_cast<uint32_t>(Int(0x80, 0x7FF));
          break;
        case 2:
          do {
            cp = static_cast<uint32_t>(Int(0x800, 0xFFFF));
          } while (cp >= 0xD800 && cp <= 0xDFFF);
          break;
        default:
          cp = static_cast<uint32_t>(Int(0x10000, 0x10FFFF));
      }
      AppendUtf8(cp, &s);
    }
    return s;
  }
  static void AppendUtf8(uint32_t cp, std::string* s) {
    if (cp < 0x80) {
      s->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  std::mt19937_64 rng_;
};

TEST(RoundTripTest, RandomConfigsSurviveJsonExactly) {
  RandomConfigs random(20240607);
  for (int i = 0; i < 1000; ++i) {
    const TrainConfig c = random.Next();
    const std::string json = TrainConfigToJson(c);
    SCOPED_TRACE(absl::StrCat("config #", i, ":\n", json));
    ASSERT_OK_AND_ASSIGN(const TrainConfig back, Parse(json));
    ASSERT_EQ(back, c);
    // Canonical: writing the parsed config again gives the same text.
    ASSERT_EQ(TrainConfigToJson(back), json);
  }
}

// --- Random corruption: never a crash, always a clear error -----------------------------------

TEST(RobustnessTest, RandomByteCorruptionIsOkOrInvalidArgument) {
  const std::string base = TrainConfigToJson(DefaultTrainConfig());
  std::mt19937_64 rng(7);
  const std::string alphabet = "{}[],:\"\\0123456789.eE+-truefalsn \n\xC3\xA9\xFF";
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = base;
    const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t pos = std::uniform_int_distribution<size_t>(0, text.size() - 1)(rng);
      const char ch = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
        case 0:
          text[pos] = ch;
          break;
        case 1:
          text.insert(pos, 1, ch);
          break;
        case 2:
          text.erase(pos, 1);
          break;
        default:
          text.resize(pos);
      }
    }
    const absl::StatusOr<TrainConfig> c = Parse(text);
    if (!c.ok()) {
      ++rejected;
      ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
      ASSERT_THAT(std::string(c.status().message()), HasSubstr("test.json"));
    }
  }
  EXPECT_GT(rejected, 2000);
}

TEST(RobustnessTest, AnyValueAtAnyKeyIsOkOrNamesTheKey) {
  const std::vector<Json> values = {nullptr,
                                    true,
                                    false,
                                    0,
                                    -1,
                                    1,
                                    2.5,
                                    -2.5,
                                    1e300,
                                    -1e300,
                                    "",
                                    "x",
                                    "auto",
                                    "64MiB",
                                    "-1",
                                    Json::array(),
                                    Json::object(),
                                    Json::array({1, 2}),
                                    Json::array({0.5, 0.5}),
                                    uint64_t{18446744073709551615u},
                                    std::numeric_limits<int64_t>::min(),
                                    5e-324};
  for (const std::string& path : TrainConfigKeyPaths()) {
    for (const Json& value : values) {
      const Json doc = DocFor(path, value);
      SCOPED_TRACE(doc.dump());
      const absl::StatusOr<TrainConfig> c = Parse(doc.dump());
      if (!c.ok()) {
        EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(c.status().message()), HasSubstr(path));
      } else {
        // Whatever was accepted validates or fails cleanly, and round-trips.
        (void)ValidateTrainConfig(*c);
        EXPECT_THAT(Parse(TrainConfigToJson(*c)), IsOk());
      }
    }
  }
}

// --- Files --------------------------------------------------------------------------------

class LoadTrainConfigFileTest : public testing::Test {
 protected:
  std::filesystem::path Dir() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    return std::filesystem::path(tmp != nullptr ? tmp : "/tmp");
  }
};

TEST_F(LoadTrainConfigFileTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadTrainConfig((Dir() / "no_such_config.json").string()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such_config.json")));
  EXPECT_THAT(LoadTrainConfig((Dir() / "no_dir" / "c.json").string()),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LoadTrainConfigFileTest, DirectoryIsInvalidArgument) {
  EXPECT_THAT(LoadTrainConfig(Dir().string()), StatusIs(kInvalid, HasSubstr("is a directory")));
}

TEST_F(LoadTrainConfigFileTest, ErrorsNameTheFile) {
  const std::string path = (Dir() / "bad.json").string();
  std::ofstream(path) << "{\n  \"train_steps\": 5,\n  \"seed\": x\n}\n";
  EXPECT_THAT(LoadTrainConfig(path),
              StatusIs(kInvalid, HasSubstr(absl::StrCat(path, ":3:11: JSON syntax error"))));
}

TEST_F(LoadTrainConfigFileTest, SavedConfigLoadsBack) {
  const std::string path = (Dir() / "saved.json").string();
  TrainConfig c = DefaultTrainConfig();
  c.data.train_path = "d\xC3\xA9j\xC3\xA0 vu/\"quoted\"\\.bin";
  std::ofstream(path) << TrainConfigToJson(c);
  EXPECT_THAT(LoadTrainConfig(path), IsOkAndHolds(c));
}

TEST_F(LoadTrainConfigFileTest, HugeFileIsRejected) {
  const std::string path = (Dir() / "huge.json").string();
  {
    std::ofstream out(path);
    const std::string spaces(kMiB, ' ');
    for (int i = 0; i < 17; ++i) out << spaces;
  }
  EXPECT_THAT(LoadTrainConfig(path), StatusIs(kInvalid, HasSubstr("is larger than 16.00 MiB")));
}

}  // namespace
}  // namespace ps
