// trainer/config_overrides.h: every flag lands, bad values name the flag and leave the config
// alone, and overrides meet validation.
#include "trainer/config_overrides.h"

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
                    "--micro_batch_size=0: must be >= 1"},
        BadOverride{[](ConfigOverrides& o) { o.gradient_accumulation_steps = 0; },
                    "--gradient_accumulation_steps=0: must be >= 1"}));

// --gradient_accumulation_steps lands and, like --micro_batch_size, re-derives train_batch_size
// (a file's value cannot contradict the flag).
TEST(ApplyOverridesTest, GradientAccumulationStepsLandsAndRederivesTheBatch) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c,
                       ParseTrainConfig(
                           R"({"model": {"preset": "tiny"}, "train_steps": 2, "train_batch_size": 4,
              "train_micro_batch_size_per_gpu": 4})",
                           "cfg.json"));
  ConfigOverrides o;
  o.gradient_accumulation_steps = 3;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.train_batch_size, 0);
  EXPECT_OK(ValidateTrainConfig(c));
  EXPECT_EQ(ResolveTrainBatchSize(c, 2), 24);
}

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

  // A preset comes with its sizes: --model alone makes the chunk size and the accelerator memory
  // "auto" (the default's 80 Ki-element chunks cannot hold gpt2's mlp.c_fc).
  c = DefaultTrainConfig();
  o = ConfigOverrides{};
  o.model = "gpt2";
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.chunk.size_elems, 0);
  EXPECT_EQ(c.accelerator.memory_bytes, 0);
  EXPECT_OK(ValidateTrainConfig(c));
  // Flags given beside --model win; a chunk below the model's smallest says what to change.
  c = DefaultTrainConfig();
  o.chunk_size = "100000";
  o.accelerator_memory = "1GiB";
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.accelerator.memory_bytes, kGiB);
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("below the smallest chunk of model gpt2")));
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

}  // namespace
}  // namespace ps
