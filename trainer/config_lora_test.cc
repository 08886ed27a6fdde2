// LoRA fine-tuning's configuration in PEFT's words: the lora section and checkpoint.export_merged —
// every key, the defaults, each error naming the key, the --lora_* and --export_merged overrides,
// ValidateTrainConfig's checks across keys and of lora.init_from, and the canonical JSON
// (--print_config) round trip.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/config_overrides.h"
#include "trainer/config_parse.h"
#include "trainer/config_schema.h"
#include "trainer/config_validate.h"
#include "trainer/testing/config_testing.h"

namespace ps {
namespace {

using config_testing::Json;
using config_testing::Parse;
using config_testing::WithMinimal;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// A fresh directory under the test's temporary directory holding `files` (empty files).
std::string MakeDir(const std::string& name, const std::vector<std::string>& files = {}) {
  const std::string dir = TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  for (const std::string& file : files) std::ofstream(dir + "/" + file) << "{}";
  return dir;
}

// A lora section with PEFT's defaults but `r` and `targets`.
LoraSettings Lora(int64_t r, std::vector<std::string> targets) {
  LoraSettings l;
  l.r = r;
  l.target_modules = std::move(targets);
  return l;
}

// The default run with a LoRA section on its GPT-2.
TrainConfig LoraRun() {
  TrainConfig c = DefaultTrainConfig();
  c.lora = Lora(4, {"c_attn"});
  return c;
}

TEST(LoraConfigTest, AbsentSectionMeansNoLora) {
  EXPECT_FALSE(TrainConfig{}.lora.has_value());
  EXPECT_FALSE(DefaultTrainConfig().lora.has_value());
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(WithMinimal(Json::object())));
  EXPECT_FALSE(c.lora.has_value());
  EXPECT_EQ(c.checkpoint.export_merged, "");
  // Configs without LoRA write no lora section (their manifests are as before).
  EXPECT_THAT(TrainConfigToJson(DefaultTrainConfig()), Not(HasSubstr("\"lora\"")));
}

TEST(LoraConfigTest, DefaultsArePefts) {
  ASSERT_OK_AND_ASSIGN(
      const TrainConfig c,
      Parse(WithMinimal(Json::parse(R"({"lora": {"r": 16, "target_modules": ["c_attn"]}})"))));
  ASSERT_TRUE(c.lora.has_value());
  EXPECT_EQ(c.lora->r, 16);
  EXPECT_EQ(c.lora->lora_alpha, 8);
  EXPECT_EQ(c.lora->lora_dropout, 0);
  EXPECT_THAT(c.lora->target_modules, ElementsAre("c_attn"));
  EXPECT_EQ(c.lora->bias, "none");
  EXPECT_THAT(c.lora->modules_to_save, IsEmpty());
  EXPECT_EQ(c.lora->init_from, "");
  EXPECT_FALSE(c.lora->all_linear());
  EXPECT_EQ(c.lora->scale(), 0.5);
  EXPECT_OK(ValidateTrainConfig(c));  // a seeded random base: legal (benchmarks)
}

TEST(LoraConfigTest, EveryKeyLands) {
  const std::string adapter =
      MakeDir("every_key", {"adapter_config.json", "adapter_model.safetensors"});
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(WithMinimal(Json::parse(absl::StrCat(R"({
      "checkpoint": {"export": "adapter_out", "export_merged": "merged_out"},
      "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
               "target_modules": ["q_proj", "v_proj"], "bias": "none",
               "modules_to_save": ["lm_head"], "init_from": ")",
                                                                                       adapter,
                                                                                       R"(",
               "task_type": "CAUSAL_LM"}})")))));
  ASSERT_TRUE(c.lora.has_value());
  const LoraSettings& l = *c.lora;
  EXPECT_EQ(l.r, 8);
  EXPECT_EQ(l.lora_alpha, 16);
  EXPECT_EQ(l.lora_dropout, 0.1);
  EXPECT_THAT(l.target_modules, ElementsAre("q_proj", "v_proj"));
  EXPECT_EQ(l.bias, "none");
  EXPECT_THAT(l.modules_to_save, ElementsAre("lm_head"));
  EXPECT_EQ(l.init_from, adapter);
  EXPECT_EQ(l.scale(), 2);
  EXPECT_EQ(c.checkpoint.export_path, "adapter_out");
  EXPECT_EQ(c.checkpoint.export_merged, "merged_out");
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(LoraConfigTest, AllLinearIsAStringAndNullModulesToSaveIsNone) {
  for (const char* spelling : {"all-linear", "ALL-LINEAR", "All-Linear"}) {
    SCOPED_TRACE(spelling);
    ASSERT_OK_AND_ASSIGN(
        const TrainConfig c,
        Parse(WithMinimal(Json{
            {"lora", {{"r", 4}, {"target_modules", spelling}, {"modules_to_save", nullptr}}}})));
    ASSERT_TRUE(c.lora.has_value());
    EXPECT_THAT(c.lora->target_modules, ElementsAre(kLoraAllLinear));
    EXPECT_TRUE(c.lora->all_linear());
    EXPECT_THAT(c.lora->modules_to_save, IsEmpty());
  }
}

TEST(LoraConfigTest, ValueErrorsNameTheKey) {
  const struct {
    const char* patch;
    const char* key;
    const char* rule;
  } kCases[] = {
      {R"({"lora": {"target_modules": ["q_proj"]}})", "`lora.r` is required in a lora section",
       "--lora_r"},
      {R"({"lora": {"r": 8}})", "`lora.target_modules` is required in a lora section",
       "\"all-linear\""},
      {R"({"lora": {}})", "`lora.r` is required", ""},
      {R"({"lora": {"r": 0, "target_modules": ["q_proj"]}})", "`lora.r` = 0", "must be >= 1"},
      {R"({"lora": {"r": -3, "target_modules": ["q_proj"]}})", "`lora.r` = -3", "must be >= 1"},
      {R"({"lora": {"r": 2147483648, "target_modules": ["q_proj"]}})", "`lora.r` = 2147483648",
       "must be <= 1073741824"},
      {R"({"lora": {"r": 2.5, "target_modules": ["q_proj"]}})", "`lora.r`", ""},
      {R"({"lora": {"r": "8", "target_modules": ["q_proj"]}})", "`lora.r`", "integer"},
      {R"({"lora": {"r": 8, "lora_alpha": 0, "target_modules": ["q_proj"]}})",
       "`lora.lora_alpha` = 0", "must be finite and > 0"},
      {R"({"lora": {"r": 8, "lora_alpha": -16, "target_modules": ["q_proj"]}})",
       "`lora.lora_alpha` = -16", "lora_alpha / r"},
      {R"({"lora": {"r": 8, "lora_alpha": "16", "target_modules": ["q_proj"]}})",
       "`lora.lora_alpha` must be a number", ""},
      {R"({"lora": {"r": 8, "lora_dropout": 1, "target_modules": ["q_proj"]}})",
       "`lora.lora_dropout` = 1", "must be in [0, 1)"},
      {R"({"lora": {"r": 8, "lora_dropout": -0.1, "target_modules": ["q_proj"]}})",
       "`lora.lora_dropout` = -0.1", "must be in [0, 1)"},
      {R"({"lora": {"r": 8, "target_modules": []}})", "`lora.target_modules` = []",
       "name the modules to adapt"},
      {R"({"lora": {"r": 8, "target_modules": ".*proj"}})",
       "`lora.target_modules` = string \".*proj\"", "regular expression"},
      {R"({"lora": {"r": 8, "target_modules": 3}})",
       "`lora.target_modules` must be a list of module names or the string \"all-linear\"", ""},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj", 1]}})",
       "`lora.target_modules[1]` must be a string (a module name)", ""},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj", ""]}})", "`lora.target_modules[1]` = \"\"",
       "cannot be empty"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj", "q_proj"]}})",
       "`lora.target_modules` = [\"q_proj\", \"q_proj\"]", "lists \"q_proj\" twice"},
      {R"({"lora": {"r": 8, "target_modules": ["all-linear"]}})",
       "`lora.target_modules[0]` = string \"all-linear\"", "stands alone"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj", "ALL-LINEAR"]}})",
       "`lora.target_modules[1]` = string \"ALL-LINEAR\"", "not inside a list"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "bias": "all"}})",
       "`lora.bias` = \"all\"", "only \"none\" is supported"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "bias": "lora_only"}})",
       "`lora.bias` = \"lora_only\"", "only \"none\" is supported"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "bias": "None"}})",
       "`lora.bias` = \"None\"", "only \"none\" is supported"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "modules_to_save": "lm_head"}})",
       "`lora.modules_to_save` must be a list of module names (or null)", ""},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "modules_to_save": ["lm_head", ""]}})",
       "`lora.modules_to_save[1]` = \"\"", "cannot be empty"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "modules_to_save": ["x", "x"]}})",
       "`lora.modules_to_save` = [\"x\", \"x\"]", "twice"},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "init_from": 1}})",
       "`lora.init_from` must be a string", ""},
      {R"({"lora": {"rank": 8, "target_modules": ["q_proj"]}})",
       "unknown key `lora.rank`; did you mean `r`?", ""},
      {R"({"lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj"]}})",
       "unknown key `lora.alpha`; did you mean `lora_alpha`?", ""},
      {R"({"lora": {"r": 8, "target_modules": ["q_proj"], "use_rslora": true}})",
       "unknown key `lora.use_rslora`", ""},
      {R"({"lora": 16})", "`lora` must be an object", ""},
      {R"({"peft": {"r": 8}})", "unknown key `peft`; did you mean `lora`?", ""},
      {R"({"checkpoint": {"export_merged": 1}})", "`checkpoint.export_merged` must be a string",
       ""},
      {R"({"checkpoint": {"merged_export": "m"}})",
       "unknown key `checkpoint.merged_export`; did you mean `export_merged`?", ""},
  };
  for (const auto& k : kCases) {
    SCOPED_TRACE(k.patch);
    EXPECT_THAT(Parse(k.patch), StatusIs(kInvalid, AllOf(HasSubstr("test.json: "), HasSubstr(k.key),
                                                         HasSubstr(k.rule))));
  }
}

TEST(LoraConfigTest, TaskTypeIsIgnoredByName) {
  std::vector<std::string> ignored;
  ASSERT_OK_AND_ASSIGN(
      const TrainConfig c,
      ParseTrainConfig(
          R"({"lora": {"r": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM"}})",
          "test.json", &ignored));
  EXPECT_TRUE(c.lora.has_value());
  EXPECT_THAT(ignored, ElementsAre("task_type"));
}

TEST(LoraConfigTest, ChecksOfTheStructNameTheKey) {
  // What only code or flags can produce: each per-key check on the struct.
  const auto check = [](void (*edit)(LoraSettings&)) {
    TrainConfig c = LoraRun();
    edit(*c.lora);
    return CheckTrainConfigValues(c);
  };
  EXPECT_THAT(check([](LoraSettings& l) { l.r = 0; }),
              StatusIs(kInvalid, HasSubstr("`lora.r` = 0: must be >= 1")));
  EXPECT_THAT(
      check([](LoraSettings& l) { l.lora_alpha = std::numeric_limits<double>::infinity(); }),
      StatusIs(kInvalid, HasSubstr("`lora.lora_alpha` = inf")));
  EXPECT_THAT(check([](LoraSettings& l) { l.lora_alpha = std::nan(""); }),
              StatusIs(kInvalid, HasSubstr("`lora.lora_alpha`")));
  EXPECT_THAT(check([](LoraSettings& l) { l.lora_dropout = std::nan(""); }),
              StatusIs(kInvalid, HasSubstr("`lora.lora_dropout`")));
  EXPECT_THAT(check([](LoraSettings& l) { l.target_modules.clear(); }),
              StatusIs(kInvalid, AllOf(HasSubstr("`lora.target_modules` = []"),
                                       HasSubstr("--lora_target_modules"))));
  EXPECT_THAT(check([](LoraSettings& l) { l.target_modules = {"q\xff"}; }),
              StatusIs(kInvalid, HasSubstr("`lora.target_modules[0]`")));
  EXPECT_THAT(check([](LoraSettings& l) {
                l.target_modules = {"q_proj", "All-Linear"};
              }),
              StatusIs(kInvalid, AllOf(HasSubstr("`lora.target_modules[1]` = \"All-Linear\""),
                                       HasSubstr("stands alone"))));
  EXPECT_THAT(check([](LoraSettings& l) { l.modules_to_save = {"all-linear"}; }),
              StatusIs(kInvalid, HasSubstr("`lora.modules_to_save[0]` = \"all-linear\": is not "
                                           "a module name")));
  EXPECT_THAT(check([](LoraSettings& l) { l.bias = ""; }),
              StatusIs(kInvalid, HasSubstr("`lora.bias` = \"\": only \"none\" is supported")));
  EXPECT_THAT(check([](LoraSettings& l) { l.init_from = std::string("a\0b", 3); }),
              StatusIs(kInvalid, HasSubstr("`lora.init_from`")));
  TrainConfig c = LoraRun();
  c.checkpoint.export_merged = "\xc3";
  EXPECT_THAT(CheckTrainConfigValues(c),
              StatusIs(kInvalid, HasSubstr("`checkpoint.export_merged`")));
}

TEST(LoraConfigTest, ExportMergedNeedsLoraAndItsOwnPath) {
  TrainConfig c = DefaultTrainConfig();
  c.checkpoint.export_merged = "merged";
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("`checkpoint.export_merged` = \"merged\""),
                                       HasSubstr("--export_merged"),
                                       HasSubstr("no lora section, so there are no adapters to "
                                                 "merge"),
                                       HasSubstr("checkpoint.export"))));
  c.lora = LoraRun().lora;
  EXPECT_OK(ValidateTrainConfig(c));
  c.checkpoint.export_path = "merged";
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("`checkpoint.export` and "
                                                 "`checkpoint.export_merged` both name \"merged\""),
                                       HasSubstr("give them different paths"))));
  c.checkpoint.export_path = "adapter";
  EXPECT_OK(ValidateTrainConfig(c));
}

TEST(LoraConfigTest, LoraCombinesWithTheOtherModes) {
  TrainConfig c = LoraRun();
  c.bf16 = true;
  c.gradient_accumulation_steps = 2;
  c.lora->lora_dropout = 0.1;
  c.lora->modules_to_save = {"lm_head"};
  EXPECT_OK(ValidateTrainConfig(c));
  EXPECT_OK(ValidateTrainConfig(c, /*world_size=*/2));
  c.zero_optimization.offload_optimizer = {.device = OffloadDevice::kNvme,
                                           .nvme_path = MakeDir("swap")};
  EXPECT_OK(ValidateTrainConfig(c));
  // offload_param "nvme": the frozen base on disk too, in the same swap.
  c.zero_optimization.offload_param.device = OffloadDevice::kNvme;
  c.zero_optimization.offload_param.nvme_path = c.zero_optimization.offload_optimizer.nvme_path;
  EXPECT_OK(ValidateTrainConfig(c));
  // Without LoRA nothing is frozen: refused.
  c.lora.reset();
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, HasSubstr("zero_optimization.offload_param.device")));
}

TEST(LoraConfigTest, InitFromMustBeAPeftAdapterDirectory) {
  TrainConfig c = LoraRun();
  const std::string missing = TempDir() + "/no/such/adapter";
  c.lora->init_from = missing;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("lora.init_from (--lora_init_from)"), HasSubstr(missing))));
  const std::string file = TempDir() + "/adapter_file";
  std::ofstream(file) << "x";
  c.lora->init_from = file;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("lora.init_from"), HasSubstr(file),
                                       HasSubstr("is not a directory"))));
  const std::string empty = MakeDir("empty_adapter");
  c.lora->init_from = empty;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr(empty), HasSubstr("is not a PEFT adapter "
                                                                   "directory: it has no "
                                                                   "adapter_config.json"))));
  const std::string config_only = MakeDir("config_only", {"adapter_config.json"});
  c.lora->init_from = config_only;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr(config_only),
                                       HasSubstr("has no adapter_model.safetensors (the"))));
  const std::string pickle = MakeDir("pickle", {"adapter_config.json", "adapter_model.bin"});
  c.lora->init_from = pickle;
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("only adapter_model.bin"),
                                       HasSubstr("safe_serialization=True"))));
  const std::string good =
      MakeDir("good_adapter", {"adapter_config.json", "adapter_model.safetensors"});
  c.lora->init_from = good;
  EXPECT_OK(ValidateTrainConfig(c));
  EXPECT_OK(CheckLoraInitFrom(c));
  // Only a lora section's init_from is examined.
  c.lora->init_from = "";
  EXPECT_OK(CheckLoraInitFrom(c));
  c.lora.reset();
  EXPECT_OK(CheckLoraInitFrom(c));
}

TEST(LoraConfigTest, FlagsTurnLoraOnAndOverrideTheFile) {
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides o;
  o.lora_r = 16;
  o.lora_alpha = 32;
  o.lora_dropout = 0.05;
  o.lora_target_modules = " c_attn , c_proj,c_fc";
  o.export_merged = "merged";
  ASSERT_OK(ApplyOverrides(o, &c));
  ASSERT_TRUE(c.lora.has_value());
  EXPECT_EQ(c.lora->r, 16);
  EXPECT_EQ(c.lora->lora_alpha, 32);
  EXPECT_EQ(c.lora->lora_dropout, 0.05);
  EXPECT_THAT(c.lora->target_modules, ElementsAre("c_attn", "c_proj", "c_fc"));
  EXPECT_EQ(c.checkpoint.export_merged, "merged");
  EXPECT_OK(ValidateTrainConfig(c));

  // Over a file's section: only the flags' keys change.
  ASSERT_OK_AND_ASSIGN(TrainConfig f, Parse(WithMinimal(Json::parse(R"(
      {"lora": {"r": 4, "lora_alpha": 4, "target_modules": ["q_proj"],
                "modules_to_save": ["lm_head"]}})"))));
  ConfigOverrides alpha;
  alpha.lora_alpha = 64;
  alpha.lora_target_modules = "ALL-LINEAR";
  const std::string adapter =
      MakeDir("flag_adapter", {"adapter_config.json", "adapter_model.safetensors"});
  alpha.lora_init_from = adapter;
  ASSERT_OK(ApplyOverrides(alpha, &f));
  EXPECT_EQ(f.lora->r, 4);
  EXPECT_EQ(f.lora->lora_alpha, 64);
  EXPECT_TRUE(f.lora->all_linear());
  EXPECT_THAT(f.lora->modules_to_save, ElementsAre("lm_head"));
  EXPECT_EQ(f.lora->init_from, adapter);
  EXPECT_OK(ValidateTrainConfig(f));

  // --lora_r alone turns LoRA on with PEFT's defaults; the modules are then missing.
  TrainConfig r_only = DefaultTrainConfig();
  ConfigOverrides rank;
  rank.lora_r = 8;
  ASSERT_OK(ApplyOverrides(rank, &r_only));
  EXPECT_EQ(r_only.lora, Lora(8, {}));
  EXPECT_THAT(ValidateTrainConfig(r_only),
              StatusIs(kInvalid, AllOf(HasSubstr("`lora.target_modules` = []"),
                                       HasSubstr("--lora_target_modules"))));
}

TEST(LoraConfigTest, LoraFlagsWithoutARankNameTheFlag) {
  const auto apply = [](void (*set)(ConfigOverrides&)) {
    ConfigOverrides o;
    set(o);
    TrainConfig c = DefaultTrainConfig();
    const absl::Status s = ApplyOverrides(o, &c);
    EXPECT_EQ(c, DefaultTrainConfig());  // unchanged on error
    return s;
  };
  constexpr absl::string_view kRule = "needs a rank: pass --lora_r=N";
  EXPECT_THAT(apply([](ConfigOverrides& o) { o.lora_alpha = 32; }),
              StatusIs(kInvalid, AllOf(HasSubstr("--lora_alpha=32: "), HasSubstr(kRule))));
  EXPECT_THAT(apply([](ConfigOverrides& o) { o.lora_dropout = 0.1; }),
              StatusIs(kInvalid, AllOf(HasSubstr("--lora_dropout=0.1: "), HasSubstr(kRule))));
  EXPECT_THAT(
      apply([](ConfigOverrides& o) { o.lora_target_modules = "q_proj"; }),
      StatusIs(kInvalid, AllOf(HasSubstr("--lora_target_modules=q_proj: "), HasSubstr(kRule))));
  EXPECT_THAT(apply([](ConfigOverrides& o) { o.lora_init_from = "dir"; }),
              StatusIs(kInvalid, AllOf(HasSubstr("--lora_init_from=dir: "), HasSubstr(kRule))));
  // --export_merged alone is not a --lora_* flag: validation says why it needs LoRA.
  TrainConfig c = DefaultTrainConfig();
  ConfigOverrides merged;
  merged.export_merged = "m";
  ASSERT_OK(ApplyOverrides(merged, &c));
  EXPECT_FALSE(c.lora.has_value());
  EXPECT_THAT(ValidateTrainConfig(c), StatusIs(kInvalid, HasSubstr("--export_merged")));
}

TEST(LoraConfigTest, BadFlagValuesNameTheFlagAndLeaveTheConfig) {
  const struct {
    void (*set)(ConfigOverrides&);
    const char* message;
  } kCases[] = {
      {[](ConfigOverrides& o) { o.lora_r = 0; }, "--lora_r=0: must be in [1, 1073741824]"},
      {[](ConfigOverrides& o) { o.lora_r = -1; }, "--lora_r=-1: must be in"},
      {[](ConfigOverrides& o) {
         o.lora_r = 8;
         o.lora_alpha = 0;
       },
       "--lora_alpha=0: must be finite and > 0"},
      {[](ConfigOverrides& o) {
         o.lora_r = 8;
         o.lora_alpha = std::numeric_limits<double>::infinity();
       },
       "--lora_alpha=inf: must be finite"},
      {[](ConfigOverrides& o) {
         o.lora_r = 8;
         o.lora_dropout = 1;
       },
       "--lora_dropout=1: must be in [0, 1)"},
      {[](ConfigOverrides& o) {
         o.lora_r = 8;
         o.lora_target_modules = "q_proj,,v_proj";
       },
       "--lora_target_modules=q_proj,,v_proj: give comma-separated module names"},
  };
  for (const auto& k : kCases) {
    SCOPED_TRACE(k.message);
    ConfigOverrides o;
    k.set(o);
    TrainConfig c = LoraRun();
    c.lora.reset();
    const TrainConfig before = c;
    EXPECT_THAT(ApplyOverrides(o, &c), StatusIs(kInvalid, HasSubstr(k.message)));
    EXPECT_EQ(c, before);
  }
  EXPECT_THAT(ParseLoraModuleList(" q_proj ,v_proj"), ElementsAre("q_proj", "v_proj"));
  EXPECT_THAT(ParseLoraModuleList(""), ElementsAre(""));
}

TEST(LoraConfigTest, PrintConfigShowsTheSectionAndRoundTrips) {
  TrainConfig c = LoraRun();
  c.lora = Lora(16, {"q_proj", "k_proj"});
  c.lora->lora_alpha = 32;
  c.lora->lora_dropout = 0.05;
  c.lora->modules_to_save = {"lm_head"};
  c.lora->init_from = "adapter";
  c.checkpoint.export_merged = "merged";
  std::string text = TrainConfigToJson(c);
  Json j = Json::parse(text);
  EXPECT_EQ(j["lora"], Json::parse(R"({"r": 16, "lora_alpha": 32.0, "lora_dropout": 0.05,
                                       "target_modules": ["q_proj", "k_proj"], "bias": "none",
                                       "modules_to_save": ["lm_head"], "init_from": "adapter"})"));
  EXPECT_EQ(j["checkpoint"]["export_merged"], "merged");
  EXPECT_THAT(Parse(text), IsOkAndHolds(c));
  // "all-linear" is written as PEFT writes it: a string.
  c.lora->target_modules = {std::string(kLoraAllLinear)};
  text = TrainConfigToJson(c);
  EXPECT_EQ(Json::parse(text)["lora"]["target_modules"], "all-linear");
  EXPECT_THAT(Parse(text), IsOkAndHolds(c));
}

TEST(LoraConfigTest, KeyPathsListTheNewKeys) {
  const std::vector<std::string> paths = TrainConfigKeyPaths();
  for (const char* path :
       {"lora.r", "lora.lora_alpha", "lora.lora_dropout", "lora.target_modules", "lora.bias",
        "lora.modules_to_save", "lora.init_from", "checkpoint.export_merged"}) {
    EXPECT_THAT(paths, testing::Contains(path));
  }
  EXPECT_THAT(paths, Not(testing::Contains("lora")));
  EXPECT_THAT(paths, Not(testing::Contains("lora.task_type")));
}

}  // namespace
}  // namespace ps
