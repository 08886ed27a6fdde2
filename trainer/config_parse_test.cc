// trainer/config_parse.h: every key path accepted and landing, the DeepSpeed testdata, misspellings
// with suggestions, wrong types, syntax-error positions, the other forms the parser accepts, random
// corruption (never a crash, always a clear error) and config files.
#include "trainer/config_parse.h"

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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/config_schema.h"
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

// --- Parsing: defaults and every key --------------------------------------------------------

TEST(ParseTrainConfigTest, EmptyObjectGivesTheStructDefaults) {
  EXPECT_THAT(Parse("{}"), IsOkAndHolds(TrainConfig{}));
  EXPECT_THAT(Parse("  {\n}\n"), IsOkAndHolds(TrainConfig{}));
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

// An empty string is never "not given": at every key that takes a string (a path, a name, an
// enum, a size), "" is refused naming the key; leaving the key out is the default.
TEST(ParseTrainConfigTest, AnEmptyStringIsRefusedAtEveryKeyNamingIt) {
  const std::map<std::string, KeySample> samples = KeySamples();
  int string_keys = 0;
  for (const std::string& path : TrainConfigKeyPaths()) {
    auto it = samples.find(path);
    ASSERT_NE(it, samples.end()) << path;
    if (!it->second.value.is_string()) continue;
    ++string_keys;
    const Json doc = DocFor(path, "");
    SCOPED_TRACE(doc.dump());
    EXPECT_THAT(Parse(doc.dump()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("`", path, "` = string \"\""))));
  }
  // data.train/val, checkpoint.dir/init_from/export/export_merged, profile.trace/metrics,
  // model.preset, nvme_path, lora.bias/init_from, and the enums and sizes written as strings.
  EXPECT_GE(string_keys, 12);
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

TEST(ParseTrainConfigTest, OptimizerOverlap) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c, Parse(R"({"optimizer": {"type": "AdamW"}})"));
  EXPECT_FALSE(c.optimizer.overlap);
  ASSERT_OK_AND_ASSIGN(c, Parse(R"({"optimizer": {"type": "Adam", "overlap": true}})"));
  EXPECT_TRUE(c.optimizer.overlap);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  // Alone, the key keeps the default optimizer.
  ASSERT_OK_AND_ASSIGN(c, Parse(R"({"optimizer": {"overlap": true}})"));
  EXPECT_TRUE(c.optimizer.overlap);
  EXPECT_EQ(c.optimizer.type, DefaultTrainConfig().optimizer.type);
  EXPECT_FALSE(Parse(R"({"optimizer": {"overlap": 1}})").ok());
  EXPECT_FALSE(Parse(R"({"optimizer": {"overlap": false, "params": {"lr": 1}}})").ok())
      << "type is still required beside other keys";
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
