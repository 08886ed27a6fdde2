// QLoRA's 4-bit base in the config (issue #37): the quantization section in transformers'
// BitsAndBytesConfig names — every key, its default, bad values and unknown keys named, the keys
// transformers writes beside them — --load_in_4bit with and without a section, the refusals
// across keys (no lora section; a compute dtype or a run precision not built yet), the JSON
// written back, and the conversion to model/quant4_config.h's Quant4Config.
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/quant4_config.h"
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
using config_testing::Minimal;
using config_testing::Parse;
using config_testing::WithMinimal;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;

// A config of the tiny model with a LoRA section and `quantization`.
Json WithLora(const Json& quantization) {
  Json doc = Minimal();
  doc["lora"] = {{"r", 4}, {"target_modules", {"c_attn"}}};
  if (!quantization.is_null()) doc["quantization"] = quantization;
  return doc;
}

TEST(QuantizationConfigTest, AbsentOrEmptyIsNoQuantization) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig none, Parse("{}"));
  EXPECT_EQ(none.quantization, QuantizationSettings{});
  EXPECT_FALSE(none.quantization.load_in_4bit);
  EXPECT_EQ(ToQuant4Config(none.quantization), std::nullopt);
  ASSERT_OK_AND_ASSIGN(const TrainConfig empty, Parse(R"({"quantization": {}})"));
  EXPECT_EQ(empty.quantization, QuantizationSettings{});
  // load_in_4bit false with other keys: kept (for --load_in_4bit), but no quantization.
  ASSERT_OK_AND_ASSIGN(const TrainConfig off, Parse(R"({"quantization": {"load_in_4bit": false,
      "bnb_4bit_quant_type": "nf4"}})"));
  EXPECT_FALSE(off.quantization.load_in_4bit);
  EXPECT_EQ(off.quantization.quant_type, Quant4Type::kNf4);
  EXPECT_EQ(ToQuant4Config(off.quantization), std::nullopt);
}

// BitsAndBytesConfig(load_in_4bit=True) alone: fp4, no double quant, float32 compute, no skips —
// the same defaults as model/quant4_config.h's Quant4Config.
TEST(QuantizationConfigTest, LoadIn4bitAloneTakesBitsAndBytesDefaults) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(R"({"quantization": {"load_in_4bit": true}})"));
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_EQ(c.quantization.quant_type, Quant4Type::kFp4);
  EXPECT_FALSE(c.quantization.double_quant);
  EXPECT_EQ(c.quantization.compute_dtype, DType::kF32);
  EXPECT_TRUE(c.quantization.skip_modules.empty());
  ASSERT_TRUE(ToQuant4Config(c.quantization).has_value());
  EXPECT_EQ(*ToQuant4Config(c.quantization), Quant4Config{});
}

TEST(QuantizationConfigTest, EveryKeyLandsAndConverts) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(R"({"quantization": {
      "load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
      "bnb_4bit_compute_dtype": "float16", "llm_int8_skip_modules": ["lm_head", "model.layers.1."]}})"));
  const QuantizationSettings& q = c.quantization;
  EXPECT_TRUE(q.load_in_4bit);
  EXPECT_EQ(q.quant_type, Quant4Type::kNf4);
  EXPECT_TRUE(q.double_quant);
  EXPECT_EQ(q.compute_dtype, DType::kF16);
  EXPECT_EQ(q.skip_modules, (std::vector<std::string>{"lm_head", "model.layers.1."}));
  const std::optional<Quant4Config> model = ToQuant4Config(q);
  ASSERT_TRUE(model.has_value());
  EXPECT_EQ(model->quant_type, Quant4Type::kNf4);
  EXPECT_TRUE(model->double_quant);
  EXPECT_EQ(model->compute_dtype, DType::kF16);
  EXPECT_EQ(model->skip_modules, q.skip_modules);
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, DType>>{
           {"float32", DType::kF32}, {"bfloat16", DType::kBF16}, {"float16", DType::kF16}}) {
    ASSERT_OK_AND_ASSIGN(
        const TrainConfig d,
        Parse(Json{{"quantization", {{"bnb_4bit_compute_dtype", name}}}}.dump()));
    EXPECT_EQ(d.quantization.compute_dtype, dtype) << name;
  }
  // transformers writes null for no skipped modules.
  ASSERT_OK_AND_ASSIGN(const TrainConfig n,
                       Parse(R"({"quantization": {"llm_int8_skip_modules": null}})"));
  EXPECT_TRUE(n.quantization.skip_modules.empty());
}

// What transformers writes beside the keys (quantization_config in config.json): accepted with the
// one value that means this section.
TEST(QuantizationConfigTest, TransformersCompanionKeysAcceptedOnlyWithTheirOneValue) {
  ASSERT_OK_AND_ASSIGN(const TrainConfig c, Parse(R"({"quantization": {
      "quant_method": "bitsandbytes", "load_in_4bit": true, "load_in_8bit": false,
      "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4"}})"));
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_EQ(c.quantization.quant_type, Quant4Type::kNf4);

  EXPECT_THAT(Parse(R"({"quantization": {"quant_method": "gptq"}})"),
              StatusIs(kInvalid, AllOf(HasSubstr("`quantization.quant_method`"),
                                       HasSubstr("gptq"), HasSubstr("bitsandbytes"))));
  EXPECT_THAT(Parse(R"({"quantization": {"bnb_4bit_quant_storage": "bfloat16"}})"),
              StatusIs(kInvalid, AllOf(HasSubstr("`quantization.bnb_4bit_quant_storage`"),
                                       HasSubstr("bfloat16"), HasSubstr("uint8"))));
  EXPECT_THAT(Parse(R"({"quantization": {"load_in_8bit": true}})"),
              StatusIs(kUnimplemented, AllOf(HasSubstr("`quantization.load_in_8bit`"),
                                             HasSubstr("load_in_4bit"))));
  EXPECT_THAT(Parse(R"({"quantization": {"load_in_8bit": "no"}})"),
              StatusIs(kInvalid, HasSubstr("quantization.load_in_8bit")));
}

// BitsAndBytesConfig.to_dict() of transformers 4.57, as save_pretrained wrote it into the
// config.json of model/testdata/nf4_prequant/llama_nf4_nested, pasted as the section: it loads,
// the 8-bit settings ignored (warned about), the rest as model/quant4_import.cc reads it.
TEST(QuantizationConfigTest, PastedToDictLoads) {
  const std::string path = "model/testdata/nf4_prequant/llama_nf4_nested/config.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const Json to_dict = Json::parse(in)["quantization_config"];
  ASSERT_TRUE(to_dict.contains("_load_in_4bit")) << to_dict.dump();
  ASSERT_TRUE(to_dict.contains("llm_int8_threshold")) << to_dict.dump();
  std::vector<std::string> ignored;
  ASSERT_OK_AND_ASSIGN(const TrainConfig c,
                       ParseTrainConfig(WithLora(to_dict).dump(), "t.json", &ignored));
  EXPECT_THAT(ignored, testing::Contains("llm_int8_threshold"));
  EXPECT_THAT(ignored, testing::Contains("llm_int8_has_fp16_weight"));
  EXPECT_THAT(ignored, testing::Contains("llm_int8_enable_fp32_cpu_offload"));
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_EQ(c.quantization.quant_type, Quant4Type::kNf4);
  EXPECT_TRUE(c.quantization.double_quant);
  EXPECT_EQ(c.quantization.compute_dtype, DType::kF32);
  EXPECT_TRUE(c.quantization.skip_modules.empty());
  EXPECT_OK(ValidateTrainConfig(c));
  // The config written back holds none of the companion keys, and loads to the same config.
  const Json back = Json::parse(TrainConfigToJson(c))["quantization"];
  for (const char* key : {"_load_in_4bit", "_load_in_8bit", "load_in_8bit", "llm_int8_threshold",
                          "quant_method"}) {
    EXPECT_FALSE(back.contains(key)) << key;
  }
  EXPECT_THAT(Parse(TrainConfigToJson(c)), IsOkAndHolds(c));

  // The attribute alone stands for its flag.
  ASSERT_OK_AND_ASSIGN(const TrainConfig attr, Parse(R"({"quantization": {"_load_in_4bit": true,
      "_load_in_8bit": false}})"));
  EXPECT_TRUE(attr.quantization.load_in_4bit);
  // Each pair must agree, refused naming both keys.
  Json disagree = to_dict;
  disagree["_load_in_4bit"] = false;
  EXPECT_THAT(Parse(WithLora(disagree).dump()),
              StatusIs(kInvalid, AllOf(HasSubstr("`quantization.load_in_4bit` = true"),
                                       HasSubstr("`quantization._load_in_4bit` = false"))));
  disagree = to_dict;
  disagree["_load_in_8bit"] = true;
  EXPECT_THAT(Parse(WithLora(disagree).dump()),
              StatusIs(kInvalid, AllOf(HasSubstr("`quantization.load_in_8bit` = false"),
                                       HasSubstr("`quantization._load_in_8bit` = true"))));
  EXPECT_THAT(Parse(R"({"quantization": {"_load_in_8bit": true}})"),
              StatusIs(kUnimplemented, HasSubstr("`quantization.load_in_8bit`")));
  // The ignored settings' types are still checked (as transformers' post_init does).
  for (const auto& [key, value] : std::vector<std::pair<std::string, Json>>{
           {"llm_int8_threshold", "6"},
           {"llm_int8_has_fp16_weight", 0},
           {"llm_int8_enable_fp32_cpu_offload", "no"},
           {"_load_in_4bit", "yes"}}) {
    SCOPED_TRACE(key);
    Json bad = to_dict;
    bad[key] = value;
    EXPECT_THAT(Parse(WithLora(bad).dump()),
                StatusIs(kInvalid, HasSubstr(absl::StrCat("`quantization.", key, "`"))));
  }
}

TEST(QuantizationConfigTest, BadValuesAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      // bitsandbytes spells the types in lower case only.
      {R"({"bnb_4bit_quant_type": "NF4"})",
       {"`quantization.bnb_4bit_quant_type`", "\"NF4\"", "\"nf4\" or \"fp4\""}},
      {R"({"bnb_4bit_quant_type": "int4"})", {"`quantization.bnb_4bit_quant_type`", "int4"}},
      {R"({"bnb_4bit_quant_type": 4})", {"`quantization.bnb_4bit_quant_type`", "string"}},
      {R"({"bnb_4bit_compute_dtype": "fp32"})",
       {"`quantization.bnb_4bit_compute_dtype`", "fp32", "\"float32\""}},
      {R"({"bnb_4bit_compute_dtype": "torch.float32"})",
       {"`quantization.bnb_4bit_compute_dtype`", "torch.float32"}},
      {R"({"load_in_4bit": "true"})", {"`quantization.load_in_4bit`", "boolean"}},
      {R"({"load_in_4bit": 1})", {"`quantization.load_in_4bit`"}},
      {R"({"bnb_4bit_use_double_quant": null})", {"`quantization.bnb_4bit_use_double_quant`"}},
      {R"({"llm_int8_skip_modules": "lm_head"})",
       {"`quantization.llm_int8_skip_modules`", "list of module names"}},
      {R"({"llm_int8_skip_modules": [3]})", {"`quantization.llm_int8_skip_modules[0]`"}},
      {R"({"llm_int8_skip_modules": ["lm_head", ""]})",
       {"`quantization.llm_int8_skip_modules[1]`"}},
      {R"({"llm_int8_skip_modules": ["mlp.", "mlp."]})",
       {"`quantization.llm_int8_skip_modules`", "twice"}},
      {R"({"bnb_4bit_quant_type": ""})", {"`quantization.bnb_4bit_quant_type` = string \"\""}},
  };
  for (const auto& [section, expected] : cases) {
    SCOPED_TRACE(section);
    const absl::StatusOr<TrainConfig> c =
        Parse(absl::StrCat(R"({"quantization": )", section, "}"));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), kInvalid) << c.status();
    for (const std::string& part : expected) EXPECT_THAT(c.status().message(), HasSubstr(part));
  }
  EXPECT_THAT(Parse(R"({"quantization": true})"),
              StatusIs(kInvalid, HasSubstr("`quantization`")));
}

TEST(QuantizationConfigTest, UnknownKeysAreRefusedNamingThem) {
  // BitsAndBytesConfig's 8-bit keys are not this section's.
  for (const char* key : {"bnb_4bit_blocksize", "blocksize", "llm_int8_thresh"}) {
    SCOPED_TRACE(key);
    EXPECT_THAT(Parse(Json{{"quantization", {{key, 1}}}}.dump()),
                StatusIs(kInvalid, HasSubstr(absl::StrCat("quantization.", key))));
  }
  // Misspellings and the short names people write suggest the key.
  EXPECT_THAT(Parse(R"({"quantization": {"bnb_4bit_quant_typ": "nf4"}})"),
              StatusIs(kInvalid, HasSubstr("bnb_4bit_quant_type")));
  EXPECT_THAT(Parse(R"({"quantization": {"quant_type": "nf4"}})"),
              StatusIs(kInvalid, HasSubstr("did you mean `bnb_4bit_quant_type`")));
  EXPECT_THAT(Parse(R"({"quantization": {"double_quant": true}})"),
              StatusIs(kInvalid, HasSubstr("bnb_4bit_use_double_quant")));
  EXPECT_THAT(Parse(R"({"quantization": {"skip_modules": []}})"),
              StatusIs(kInvalid, HasSubstr("llm_int8_skip_modules")));
  // At the top level: transformers' name for the section, and the key without its section.
  EXPECT_THAT(Parse(R"({"quantization_config": {"load_in_4bit": true}})"),
              StatusIs(kInvalid, AllOf(HasSubstr("quantization_config"),
                                       HasSubstr("did you mean `quantization`"))));
  EXPECT_THAT(Parse(R"({"load_in_4bit": true})"),
              StatusIs(kInvalid, HasSubstr("quantization.load_in_4bit")));
}

TEST(QuantizationConfigTest, KeyPathsListTheSectionsKeysOnly) {
  const std::vector<std::string> paths = TrainConfigKeyPaths();
  for (const char* path :
       {"quantization.load_in_4bit", "quantization.bnb_4bit_quant_type",
        "quantization.bnb_4bit_use_double_quant", "quantization.bnb_4bit_compute_dtype",
        "quantization.llm_int8_skip_modules"}) {
    EXPECT_THAT(paths, testing::Contains(path));
  }
  for (const char* path : {"quantization", "quantization.quant_method",
                           "quantization.bnb_4bit_quant_storage", "quantization.load_in_8bit",
                           "quantization._load_in_4bit", "quantization._load_in_8bit",
                           "quantization.llm_int8_threshold"}) {
    EXPECT_THAT(paths, Not(testing::Contains(path)));
  }
}

// --- Across keys (ValidateTrainConfig) -------------------------------------------------------

TEST(QuantizationConfigTest, FourBitWithoutLoraIsRefusedNamingBoth) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c,
                       Parse(WithMinimal({{"quantization", {{"load_in_4bit", true}}}})));
  EXPECT_THAT(ValidateTrainConfig(c),
              StatusIs(kInvalid, AllOf(HasSubstr("`quantization.load_in_4bit`"),
                                       HasSubstr("`lora`"), HasSubstr("--lora_r"))));
  // With a lora section: valid; without load_in_4bit the section's other keys need nothing.
  ASSERT_OK_AND_ASSIGN(c, Parse(WithLora({{"load_in_4bit", true}}).dump()));
  EXPECT_OK(ValidateTrainConfig(c));
  ASSERT_OK_AND_ASSIGN(c, Parse(WithMinimal({{"quantization",
                                              {{"load_in_4bit", false},
                                               {"bnb_4bit_compute_dtype", "bfloat16"}}}})));
  EXPECT_OK(ValidateTrainConfig(c));
}

// The 4-bit GEMMs compute in bnb_4bit_compute_dtype (float32, bfloat16, float16), whatever the
// run's own dtype (the param chunks': f32, bf16 or fp16).
TEST(QuantizationConfigTest, ComputeDtypesAndSixteenBitRunsAreValid) {
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    SCOPED_TRACE(dtype);
    ASSERT_OK_AND_ASSIGN(
        const TrainConfig c,
        Parse(WithLora({{"load_in_4bit", true}, {"bnb_4bit_compute_dtype", dtype}}).dump()));
    EXPECT_OK(ValidateTrainConfig(c));
    for (const char* run : {"bf16", "fp16"}) {
      Json j = WithLora({{"load_in_4bit", true}, {"bnb_4bit_compute_dtype", dtype}});
      j[run] = {{"enabled", true}};
      ASSERT_OK_AND_ASSIGN(const TrainConfig r, Parse(j.dump()));
      EXPECT_OK(ValidateTrainConfig(r)) << run;
    }
  }
}

// Double quantization keeps each weight's nested offset on the rank that quantized it: one rank
// only (unknown before mpirun's ranks join: checked again once they have).
TEST(QuantizationConfigTest, DoubleQuantUnderZeroIsUnimplementedNamingTheKey) {
  ASSERT_OK_AND_ASSIGN(
      const TrainConfig c,
      Parse(WithLora({{"load_in_4bit", true}, {"bnb_4bit_use_double_quant", true}}).dump()));
  EXPECT_OK(ValidateTrainConfig(c, 1));
  EXPECT_OK(ValidateTrainConfig(c, std::nullopt));
  EXPECT_THAT(ValidateTrainConfig(c, 2),
              StatusIs(kUnimplemented, AllOf(HasSubstr("`quantization.bnb_4bit_use_double_quant`"),
                                             HasSubstr("2 ranks"))));
  ASSERT_OK_AND_ASSIGN(const TrainConfig plain, Parse(WithLora({{"load_in_4bit", true}}).dump()));
  EXPECT_OK(ValidateTrainConfig(plain, 2));
}

// --- --load_in_4bit ----------------------------------------------------------------------------

TEST(QuantizationConfigTest, LoadIn4bitFlagTurnsTheSectionOnWithTheFilesKeys) {
  // No section: BitsAndBytesConfig's defaults.
  ASSERT_OK_AND_ASSIGN(TrainConfig c, Parse(WithLora(Json()).dump()));
  ConfigOverrides o;
  o.load_in_4bit = true;
  ASSERT_OK(ApplyOverrides(o, &c));
  QuantizationSettings on;
  on.load_in_4bit = true;
  EXPECT_EQ(c.quantization, on);
  EXPECT_OK(ValidateTrainConfig(c));

  // A section that is off: its keys stay.
  ASSERT_OK_AND_ASSIGN(c, Parse(WithLora({{"load_in_4bit", false},
                                          {"bnb_4bit_quant_type", "nf4"},
                                          {"bnb_4bit_use_double_quant", true},
                                          {"llm_int8_skip_modules", {"o_proj"}}})
                                    .dump()));
  const QuantizationSettings file = c.quantization;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_EQ(c.quantization.quant_type, Quant4Type::kNf4);
  EXPECT_TRUE(c.quantization.double_quant);
  EXPECT_EQ(c.quantization.skip_modules, file.skip_modules);

  // --noload_in_4bit turns it off again, keys kept; not given leaves the file's value.
  o.load_in_4bit = false;
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_EQ(c.quantization, file);
  ConfigOverrides none;
  ASSERT_OK_AND_ASSIGN(c, Parse(WithLora({{"load_in_4bit", true}}).dump()));
  ASSERT_OK(ApplyOverrides(none, &c));
  EXPECT_TRUE(c.quantization.load_in_4bit);
}

TEST(QuantizationConfigTest, LoadIn4bitFlagNeedsLoraFromTheFileOrTheFlags) {
  ASSERT_OK_AND_ASSIGN(TrainConfig c, Parse(Minimal().dump()));
  ConfigOverrides o;
  o.load_in_4bit = true;
  TrainConfig flag_only = c;
  ASSERT_OK(ApplyOverrides(o, &flag_only));
  EXPECT_THAT(ValidateTrainConfig(flag_only),
              StatusIs(kInvalid, AllOf(HasSubstr("quantization.load_in_4bit"),
                                       HasSubstr("--load_in_4bit"), HasSubstr("`lora`"))));
  // --lora_r and --lora_target_modules make the lora section.
  o.lora_r = 8;
  o.lora_target_modules = "c_attn";
  ASSERT_OK(ApplyOverrides(o, &c));
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_OK(ValidateTrainConfig(c));
}

// --- Written back ------------------------------------------------------------------------------

TEST(QuantizationConfigTest, PrintedConfigLoadsBack) {
  // The default config has no section (its printed form is unchanged).
  EXPECT_FALSE(Json::parse(TrainConfigToJson(DefaultTrainConfig())).contains("quantization"));

  TrainConfig c = DefaultTrainConfig();
  LoraSettings lora;
  lora.r = 4;
  lora.target_modules = {"c_attn"};
  c.lora = lora;
  c.quantization.load_in_4bit = true;
  c.quantization.quant_type = Quant4Type::kNf4;
  c.quantization.double_quant = true;
  c.quantization.skip_modules = {"lm_head", "h.0."};
  const std::string text = TrainConfigToJson(c);
  EXPECT_EQ(Json::parse(text)["quantization"],
            Json::parse(R"({"load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
                            "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "float32",
                            "llm_int8_skip_modules": ["lm_head", "h.0."]})"));
  EXPECT_THAT(Parse(text), IsOkAndHolds(c));
  ASSERT_OK_AND_ASSIGN(const TrainConfig back, Parse(text));
  EXPECT_OK(ValidateTrainConfig(back));

  // Random sections, on or off, round-trip exactly (an off section with other keys is written too,
  // so --load_in_4bit on the printed config means what it meant on the file).
  std::mt19937_64 rng(37);
  const std::vector<std::string> names = {"q_proj", "mlp.", "model.layers.3.", "lm_head", "c_fc"};
  for (int i = 0; i < 200; ++i) {
    TrainConfig r = DefaultTrainConfig();
    QuantizationSettings& q = r.quantization;
    q.load_in_4bit = rng() % 2 == 0;
    q.quant_type = rng() % 2 == 0 ? Quant4Type::kNf4 : Quant4Type::kFp4;
    q.double_quant = rng() % 2 == 0;
    q.compute_dtype = std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16}[rng() % 3];
    for (const std::string& name : names) {
      if (rng() % 3 == 0) q.skip_modules.push_back(name);
    }
    SCOPED_TRACE(TrainConfigToJson(r));
    EXPECT_EQ(Json::parse(TrainConfigToJson(r)).contains("quantization"),
              q != QuantizationSettings{});
    EXPECT_THAT(Parse(TrainConfigToJson(r)), IsOkAndHolds(r));
  }
}

}  // namespace
}  // namespace ps
