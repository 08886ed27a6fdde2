#include "model/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/splitmix64.h"
#include "base/testing/status_matchers.h"
#include "chunk/operator_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "model/hf_config.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

ModelConfig Tiny(const std::string& family) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const std::string path =
      absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/hf_tiny_", family,
                   "/config.json");
  absl::StatusOr<ModelConfig> config = ReadHfConfig(path);
  EXPECT_THAT(config.status(), IsOk());
  return *config;
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  const std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Random values per tensor, seeded by its name.
std::map<std::string, std::vector<float>> RandomTensors(const std::vector<TensorSpec>& specs) {
  std::map<std::string, std::vector<float>> values;
  uint64_t salt = 1;
  for (const TensorSpec& t : specs) {
    SplitMix64 rng(0x1234 + salt++);
    std::vector<float>& v = values[t.name];
    v.resize(static_cast<size_t>(t.numel()));
    for (float& x : v) x = static_cast<float>(rng.Uniform() * 2 - 1) * 0.37f;
  }
  return values;
}

PeftTensorFn FromMap(const std::map<std::string, std::vector<float>>& values) {
  return [&values](const TensorSpec& t, absl::Span<float> dst) -> absl::Status {
    const std::vector<float>& v = values.at(t.name);
    if (v.size() != dst.size()) return absl::InternalError("size");
    std::copy(v.begin(), v.end(), dst.begin());
    return absl::OkStatus();
  };
}

LoraConfig LlamaLora() {
  LoraConfig lora;
  lora.r = 4;
  lora.lora_alpha = 16;
  lora.lora_dropout = 0.05;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  lora.modules_to_save = {"lm_head", "model.norm"};
  return lora;
}

// Writes a Llama adapter into a fresh directory `name` and returns the directory.
std::string WriteLlamaAdapter(const std::string& name, const ModelConfig& llama) {
  const std::string dir = FreshDir(name);
  const LoraConfig lora = LlamaLora();
  const auto values = RandomTensors(PeftAdapterTensors(llama, lora));
  EXPECT_THAT(WritePeftAdapter(dir, llama, lora, "hf/tiny-llama", FromMap(values)), IsOk());
  return dir;
}

// The keys of a JSON object, sorted.
std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Every field of peft 0.10.0's LoraConfig with its base classes (src/peft/config.py
// PeftConfigMixin and PeftConfig, src/peft/tuners/lora/config.py LoraConfig, as released on
// PyPI). peft before 0.14 builds the config with LoraConfig(**json), so any other key in
// adapter_config.json is a TypeError there.
void ExpectOnlyPeft010Keys(const Json& config) {
  static const char* const kPeft010LoraConfigFields[] = {
      // PeftConfigMixin, PeftConfig
      "peft_type", "auto_mapping", "base_model_name_or_path", "revision", "task_type",
      "inference_mode",
      // LoraConfig
      "r", "target_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out", "bias", "use_rslora",
      "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern",
      "rank_pattern", "alpha_pattern", "megatron_config", "megatron_core", "loftq_config",
      "use_dora", "layer_replication"};
  for (const auto& [key, value] : config.items()) {
    EXPECT_NE(
        std::find(std::begin(kPeft010LoraConfigFields), std::end(kPeft010LoraConfigFields), key),
        std::end(kPeft010LoraConfigFields))
        << key << " is not a field of peft 0.10's LoraConfig: peft 0.10 refuses the file";
  }
}

void EditConfig(const std::string& dir, const std::function<void(Json&)>& edit) {
  const std::string path = absl::StrCat(dir, "/adapter_config.json");
  Json j = Json::parse(ReadFile(path));
  edit(j);
  WriteFile(path, j.dump(2));
}

TEST(PeftAdapterTest, TensorsInOrder) {
  const ModelConfig llama = Tiny("llama");  // E 32, Q 32, K 16, I 48, V 64
  const std::vector<TensorSpec> t = PeftAdapterTensors(llama, LlamaLora());
  ASSERT_EQ(t.size(), 14u);
  EXPECT_EQ(t[0].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_THAT(t[0].shape, ElementsAre(4, 32));
  EXPECT_EQ(t[3].name, "model.layers.0.self_attn.v_proj.lora_B.weight");
  EXPECT_THAT(t[3].shape, ElementsAre(16, 4));
  EXPECT_EQ(t[4].name, "model.layers.0.mlp.down_proj.lora_A.weight");
  EXPECT_THAT(t[4].shape, ElementsAre(4, 48));
  EXPECT_EQ(t[12].name, "model.norm.weight");
  EXPECT_EQ(t[13].name, "lm_head.weight");
  EXPECT_THAT(t[13].shape, ElementsAre(64, 32));
}

TEST(PeftAdapterTest, LlamaRoundTripIsBitExact) {
  const ModelConfig llama = Tiny("llama");
  const LoraConfig lora = LlamaLora();
  const std::string dir = FreshDir("llama_adapter");
  const auto values = RandomTensors(PeftAdapterTensors(llama, lora));
  ASSERT_THAT(WritePeftAdapter(dir, llama, lora, "hf/tiny-llama", FromMap(values)), IsOk());

  // The files as PEFT writes them.
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(absl::StrCat(dir, "/adapter_model.safetensors"));
  ASSERT_THAT(file.status(), IsOk());
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_EQ(file->tensors().size(), 14u);
  EXPECT_NE(file->Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_NE(file->Find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"), nullptr);
  EXPECT_NE(file->Find("base_model.model.lm_head.weight"), nullptr);
  EXPECT_NE(file->Find("base_model.model.model.norm.weight"), nullptr);
  for (const SafetensorsTensorInfo& info : file->tensors()) EXPECT_EQ(info.dtype_name, "F32");

  const Json config = Json::parse(ReadFile(absl::StrCat(dir, "/adapter_config.json")));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 4);
  EXPECT_TRUE(config["lora_alpha"].is_number_integer());
  EXPECT_EQ(config["lora_alpha"], 16);
  EXPECT_DOUBLE_EQ(config["lora_dropout"].get<double>(), 0.05);
  EXPECT_EQ(config["target_modules"], Json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(config["modules_to_save"], Json({"lm_head", "model.norm"}));
  EXPECT_EQ(config["base_model_name_or_path"], "hf/tiny-llama");
  EXPECT_THAT(Keys(config),
              ElementsAre("base_model_name_or_path", "lora_alpha", "lora_dropout",
                          "modules_to_save", "peft_type", "r", "target_modules", "task_type"));
  ExpectOnlyPeft010Keys(config);

  absl::StatusOr<PeftAdapter> read = ReadPeftAdapter(dir, llama);
  ASSERT_THAT(read.status(), IsOk());
  EXPECT_EQ(read->lora, lora);
  EXPECT_EQ(read->base_model_name_or_path, "hf/tiny-llama");
  ASSERT_EQ(read->tensors.size(), values.size());
  for (const auto& [name, v] : values) {
    ASSERT_TRUE(read->tensors.contains(name)) << name;
    const std::vector<float>& r = read->tensors.at(name);
    ASSERT_EQ(r.size(), v.size());
    EXPECT_EQ(std::memcmp(r.data(), v.data(), v.size() * sizeof(float)), 0) << name;
  }
}

TEST(PeftAdapterTest, Gpt2RoundTripAndNames) {
  const ModelConfig gpt2 = Tiny("gpt2");
  LoraConfig lora;
  lora.r = 2;
  lora.lora_alpha = 3.5;
  lora.target_modules = {"all-linear"};
  lora.modules_to_save = {"ln_f"};
  const std::string dir = FreshDir("gpt2_adapter");
  const auto values = RandomTensors(PeftAdapterTensors(gpt2, lora));
  ASSERT_THAT(WritePeftAdapter(dir, gpt2, lora, "", FromMap(values)), IsOk());
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(absl::StrCat(dir, "/adapter_model.safetensors"));
  ASSERT_THAT(file.status(), IsOk());
  EXPECT_EQ(file->tensors().size(), 18u);  // 8 linears x (A, B) + ln_f weight and bias
  const SafetensorsTensorInfo* a =
      file->Find("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(a->shape, ElementsAre(2, 16));
  const SafetensorsTensorInfo* b =
      file->Find("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(b->shape, ElementsAre(64, 2));
  EXPECT_NE(file->Find("base_model.model.transformer.ln_f.bias"), nullptr);

  const Json config = Json::parse(ReadFile(absl::StrCat(dir, "/adapter_config.json")));
  EXPECT_EQ(config["fan_in_fan_out"], true);
  EXPECT_EQ(config["target_modules"], "all-linear");
  EXPECT_DOUBLE_EQ(config["lora_alpha"].get<double>(), 3.5);
  // Defaults left out: no base name, dropout 0, bias "none".
  EXPECT_THAT(Keys(config), ElementsAre("fan_in_fan_out", "lora_alpha", "modules_to_save",
                                        "peft_type", "r", "target_modules", "task_type"));
  ExpectOnlyPeft010Keys(config);

  absl::StatusOr<PeftAdapter> read = ReadPeftAdapter(dir, gpt2);
  ASSERT_THAT(read.status(), IsOk());
  EXPECT_EQ(read->lora, lora);
  EXPECT_EQ(read->base_model_name_or_path, "");
  EXPECT_EQ(read->tensors.size(), 18u);
  for (const auto& [name, v] : values) EXPECT_EQ(read->tensors.at(name), v) << name;
}

// What peft itself writes: every field of its LoraConfig, most at their defaults. A directory
// peft 0.21.2 saved (make_lora_testdata.py, with the keys of later releases: eva_config,
// lora_bias, peft_version, ...) reads, and our rewrite of it holds the few keys we write and
// reads back the same.
TEST(PeftAdapterTest, ReadsWhatPeftWritesAndRewritesItShort) {
  const ModelConfig llama = Tiny("llama");
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string peft_dir = absl::StrCat(srcdir != nullptr ? srcdir : ".",
                                            "/patrickstar_cc/model/testdata/lora_ref_llama/"
                                            "adapter_init");
  const Json peft_config = Json::parse(ReadFile(absl::StrCat(peft_dir, "/adapter_config.json")));
  ASSERT_EQ(peft_config["peft_version"], "0.21.2");
  EXPECT_GT(peft_config.size(), 40u);
  absl::StatusOr<PeftAdapter> read = ReadPeftAdapter(peft_dir, llama);
  ASSERT_THAT(read.status(), IsOk());
  EXPECT_EQ(read->lora.r, 4);
  EXPECT_EQ(read->lora.lora_alpha, 8);
  EXPECT_EQ(read->lora.lora_dropout, 0);
  EXPECT_EQ(read->lora.target_modules.size(), 7u);
  EXPECT_TRUE(read->lora.modules_to_save.empty());
  EXPECT_EQ(read->base_model_name_or_path, "model/testdata/hf_tiny_llama");
  EXPECT_EQ(read->tensors.size(), 2u * 7 * 2);  // 2 layers x 7 targets x (A, B)

  const std::string dir = FreshDir("rewritten_peft");
  ASSERT_THAT(WritePeftAdapter(dir, llama, read->lora, read->base_model_name_or_path,
                               FromMap(read->tensors)),
              IsOk());
  const Json ours = Json::parse(ReadFile(absl::StrCat(dir, "/adapter_config.json")));
  EXPECT_THAT(Keys(ours), ElementsAre("base_model_name_or_path", "lora_alpha", "peft_type", "r",
                                      "target_modules", "task_type"));
  ExpectOnlyPeft010Keys(ours);
  for (const std::string& key : Keys(ours)) EXPECT_EQ(ours[key], peft_config[key]) << key;
  absl::StatusOr<PeftAdapter> back = ReadPeftAdapter(dir, llama);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->lora, read->lora);
  EXPECT_EQ(back->base_model_name_or_path, read->base_model_name_or_path);
  EXPECT_EQ(back->tensors, read->tensors);
}

// peft 0.10 to 0.13 wrote every field of their LoraConfig too (at its defaults here, as
// save_pretrained writes them, inference_mode true); such a directory reads as our short one.
TEST(PeftAdapterTest, ReadsAnOldPeftConfigWithEveryKey) {
  const ModelConfig llama = Tiny("llama");
  const std::string dir = WriteLlamaAdapter("old_peft", llama);
  EditConfig(dir, [](Json& j) {
    j["auto_mapping"] = nullptr;
    j["revision"] = nullptr;
    j["inference_mode"] = true;
    j["fan_in_fan_out"] = false;
    j["bias"] = "none";
    j["use_rslora"] = false;
    j["init_lora_weights"] = true;
    j["layers_to_transform"] = nullptr;
    j["layers_pattern"] = nullptr;
    j["rank_pattern"] = Json::object();
    j["alpha_pattern"] = Json::object();
    j["megatron_config"] = nullptr;
    j["megatron_core"] = "megatron.core";
    j["loftq_config"] = Json::object();
    j["use_dora"] = false;
    j["layer_replication"] = nullptr;
  });
  const Json config = Json::parse(ReadFile(absl::StrCat(dir, "/adapter_config.json")));
  EXPECT_EQ(config.size(), 24u);  // every field of peft 0.10's LoraConfig
  ExpectOnlyPeft010Keys(config);
  absl::StatusOr<PeftAdapter> read = ReadPeftAdapter(dir, llama);
  ASSERT_THAT(read.status(), IsOk());
  EXPECT_EQ(read->lora, LlamaLora());
  EXPECT_EQ(read->base_model_name_or_path, "hf/tiny-llama");
}

TEST(PeftAdapterTest, Bf16AndF16Exports) {
  const ModelConfig qwen3 = Tiny("qwen3");
  LoraConfig lora;
  lora.r = 2;
  lora.target_modules = {"q_proj", "k_proj"};
  const auto values = RandomTensors(PeftAdapterTensors(qwen3, lora));
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string dir = FreshDir(absl::StrCat("qwen3_", DTypeName(dtype)));
    ASSERT_THAT(WritePeftAdapter(dir, qwen3, lora, "q", FromMap(values), dtype), IsOk());
    absl::StatusOr<PeftAdapter> read = ReadPeftAdapter(dir, qwen3);
    ASSERT_THAT(read.status(), IsOk());
    for (const auto& [name, v] : values) {
      std::vector<uint16_t> half(v.size());
      std::vector<float> expect(v.size());
      if (dtype == DType::kBF16) {
        ConvertF32ToBF16(v.data(), half.data(), static_cast<int64_t>(v.size()));
        ConvertBF16ToF32(half.data(), expect.data(), static_cast<int64_t>(v.size()));
      } else {
        ConvertF32ToF16(v.data(), half.data(), static_cast<int64_t>(v.size()));
        ConvertF16ToF32(half.data(), expect.data(), static_cast<int64_t>(v.size()));
      }
      EXPECT_EQ(read->tensors.at(name), expect) << name;
    }
  }
}

TEST(PeftAdapterTest, ReplacesAdapterDirectoriesOnly) {
  const ModelConfig llama = Tiny("llama");
  const std::string dir = WriteLlamaAdapter("replace", llama);
  WriteFile(absl::StrCat(dir, "/README.md"), "model card");
  WriteFile(absl::StrCat(dir, "/adapter_model.bin"), "old pickle");
  // Rewrite: README.md survives, the old pickle does not.
  const LoraConfig lora = LlamaLora();
  const auto values = RandomTensors(PeftAdapterTensors(llama, lora));
  ASSERT_THAT(WritePeftAdapter(dir, llama, lora, "x", FromMap(values)), IsOk());
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/README.md")), "model card");
  EXPECT_FALSE(std::ifstream(absl::StrCat(dir, "/adapter_model.bin")).good());

  // A getter error aborts the write and leaves the directory as it was.
  const std::string before = ReadFile(absl::StrCat(dir, "/adapter_config.json"));
  EXPECT_THAT(WritePeftAdapter(dir, llama, lora, "changed",
                               [](const TensorSpec&, absl::Span<float>) {
                                 return absl::DataLossError("chunk read failed");
                               }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("chunk read failed")));
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/adapter_config.json")), before);

  // Not an adapter directory: refused.
  const std::string other = FreshDir("not_adapter");
  WriteFile(absl::StrCat(other, "/data.txt"), "precious");
  EXPECT_THAT(WritePeftAdapter(other, llama, lora, "x", FromMap(values)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // An invalid config writes nothing.
  LoraConfig bad = lora;
  bad.r = 0;
  EXPECT_THAT(WritePeftAdapter(FreshDir("bad") + "/out", llama, bad, "x", FromMap(values)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PeftAdapterTest, MissingFiles) {
  const ModelConfig llama = Tiny("llama");
  const std::string empty = FreshDir("empty");
  EXPECT_THAT(ReadPeftAdapter(empty, llama),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("has no adapter_config.json")));
  const std::string dir = WriteLlamaAdapter("no_weights", llama);
  ASSERT_EQ(std::remove(absl::StrCat(dir, "/adapter_model.safetensors").c_str()), 0);
  EXPECT_THAT(ReadPeftAdapter(dir, llama),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("has no adapter_model.safetensors")));
  WriteFile(absl::StrCat(dir, "/adapter_model.bin"), "pickle");
  EXPECT_THAT(ReadPeftAdapter(dir, llama),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("a PyTorch pickle")));
}

TEST(PeftAdapterTest, ConfigErrors) {
  const ModelConfig llama = Tiny("llama");
  const std::string dir = WriteLlamaAdapter("config_errors", llama);
  const std::string path = absl::StrCat(dir, "/adapter_config.json");
  const std::string good = ReadFile(path);
  const auto expect_error = [&](const std::function<void(Json&)>& edit, absl::StatusCode code,
                                const std::string& substr) {
    WriteFile(path, good);
    EditConfig(dir, edit);
    EXPECT_THAT(ReadPeftAdapter(dir, llama),
                StatusIs(code, ::testing::AllOf(HasSubstr(path), HasSubstr(substr))))
        << substr;
  };
  expect_error([](Json& j) { j["peft_type"] = "PREFIX_TUNING"; },
               absl::StatusCode::kInvalidArgument, "peft_type is \"PREFIX_TUNING\"");
  expect_error([](Json& j) { j.erase("peft_type"); }, absl::StatusCode::kInvalidArgument,
               "peft_type is missing");
  expect_error([](Json& j) { j["task_type"] = "SEQ_CLS"; }, absl::StatusCode::kInvalidArgument,
               "task_type");
  expect_error([](Json& j) { j["use_dora"] = true; }, absl::StatusCode::kUnimplemented,
               "use_dora = true: DoRA");
  expect_error([](Json& j) { j["use_rslora"] = true; }, absl::StatusCode::kUnimplemented,
               "use_rslora = true: rank-stabilized LoRA");
  expect_error(
      [](Json& j) {
        j["rank_pattern"] = {{"q_proj", 8}};
      },
      absl::StatusCode::kUnimplemented, "rank_pattern");
  expect_error([](Json& j) { j["layers_to_transform"] = {0}; }, absl::StatusCode::kUnimplemented,
               "layers_to_transform");
  expect_error([](Json& j) { j["init_lora_weights"] = "pissa_niter_4"; },
               absl::StatusCode::kUnimplemented, "rewrote the base model's weights");
  expect_error([](Json& j) { j["init_lora_weights"] = "lora_ga"; },
               absl::StatusCode::kUnimplemented, "rewrote the base model's weights");
  expect_error(
      [](Json& j) {
        j["use_bdlora"] = {{"target_modules_bd_a", {"q_proj"}}};
      },
      absl::StatusCode::kUnimplemented, "use_bdlora = ");
  expect_error(
      [](Json& j) {
        j["kasa_config"] = Json::object({{"x", 1}});
      },
      absl::StatusCode::kUnimplemented, "KaSA");
  expect_error([](Json& j) { j["target_modules"] = ".*q_proj"; }, absl::StatusCode::kUnimplemented,
               "regular expression");
  expect_error([](Json& j) { j["target_modules"] = nullptr; }, absl::StatusCode::kInvalidArgument,
               "target_modules is missing or null");
  expect_error(
      [](Json& j) {
        j["target_modules"] = {"q_proj", "c_attn"};
      },
      absl::StatusCode::kInvalidArgument, "'c_attn' matches no module");
  expect_error(
      [](Json& j) {
        j["target_modules"] = {"q_proj", 3};
      },
      absl::StatusCode::kInvalidArgument, "target_modules must be a list of strings");
  expect_error([](Json& j) { j["r"] = "4"; }, absl::StatusCode::kInvalidArgument,
               "r must be an integer");
  expect_error([](Json& j) { j["r"] = 40; }, absl::StatusCode::kInvalidArgument,
               "lora.r = 40 exceeds");
  expect_error([](Json& j) { j["bias"] = "all"; }, absl::StatusCode::kInvalidArgument,
               "only \"none\"");
  expect_error([](Json& j) { j["modules_to_save"] = {"score"}; },
               absl::StatusCode::kInvalidArgument, "'score' matches no module");
  WriteFile(path, "{\"peft_type\": \"LORA\",");
  EXPECT_THAT(ReadPeftAdapter(dir, llama), StatusIs(absl::StatusCode::kInvalidArgument));

  // A Llama adapter against GPT-2: its target modules do not exist there; the message lists
  // GPT-2's.
  WriteFile(path, good);
  EditConfig(dir, [](Json& j) { j["modules_to_save"] = nullptr; });
  EXPECT_THAT(ReadPeftAdapter(dir, Tiny("gpt2")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("'q_proj' matches no module"),
                                        HasSubstr("c_attn, c_proj, c_fc"))));
}

TEST(PeftAdapterTest, TensorErrors) {
  const ModelConfig llama = Tiny("llama");
  const LoraConfig lora = LlamaLora();
  const std::string dir = WriteLlamaAdapter("tensor_errors", llama);
  const std::string weights = absl::StrCat(dir, "/adapter_model.safetensors");
  const std::vector<TensorSpec> specs = PeftAdapterTensors(llama, lora);

  // Rewrites the weights: `tensors` (our names), every element `value`.
  const auto rewrite = [&](const std::vector<TensorSpec>& tensors, float value) {
    std::vector<std::vector<float>> data;
    std::vector<SafetensorsTensorData> out;
    data.reserve(tensors.size());
    for (const TensorSpec& t : tensors) {
      data.emplace_back(static_cast<size_t>(t.numel()), value);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      out.push_back(SafetensorsTensorData{
          SafetensorsTensorSpec{PeftTensorName(llama, tensors[i].name), DType::kF32,
                                tensors[i].shape},
          absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data[i].data()),
                                    data[i].size() * sizeof(float))});
    }
    ASSERT_THAT(WriteSafetensors(weights, out, {{"format", "pt"}}), IsOk());
  };

  std::vector<TensorSpec> fewer(specs.begin() + 1, specs.end());
  rewrite(fewer, 0.5f);
  EXPECT_THAT(ReadPeftAdapter(dir, llama),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr(weights),
                                        HasSubstr("missing 1 tensor(s): base_model.model.model."
                                                  "layers.0.self_attn.q_proj.lora_A.weight"))));

  std::vector<TensorSpec> more = specs;
  more.push_back(TensorSpec{"model.layers.0.self_attn.k_proj.lora_A.weight", {4, 32}});
  rewrite(more, 0.5f);
  EXPECT_THAT(ReadPeftAdapter(dir, llama),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unexpected 1 tensor(s): base_model.model.model.layers.0."
                                 "self_attn.k_proj.lora_A.weight")));

  std::vector<TensorSpec> reshaped = specs;
  reshaped[1].shape = {32, 8};  // q_proj's B with rank 8
  rewrite(reshaped, 0.5f);
  EXPECT_THAT(
      ReadPeftAdapter(dir, llama),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("tensor base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight "
                         "has shape [32, 8], but this model (r = 4) needs [32, 4]")));

  rewrite(specs, std::nanf(""));
  EXPECT_THAT(ReadPeftAdapter(dir, llama),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("holds nan")));

  rewrite(specs, 0.25f);
  EXPECT_THAT(ReadPeftAdapter(dir, llama).status(), IsOk());

  // Another base: the same module names, other shapes.
  ModelConfig wider = llama;
  wider.intermediate_size = 64;
  EXPECT_THAT(
      ReadPeftAdapter(dir, wider),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("down_proj.lora_A.weight has shape [4, 48], but this model (r = 4) "
                         "needs [4, 64]")));
}

}  // namespace
}  // namespace ps
