#include "model/hf_config.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/splitmix64.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/model_config.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::string_view kPath = "/models/x/config.json";

// config.json files of published models, as on the Hugging Face Hub (values: see the sources in
// model_config.cc; the key sets follow the files, transformers 4.x spelling).
constexpr absl::string_view kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

constexpr absl::string_view kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr absl::string_view kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.31.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr absl::string_view kLlama2_7B = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr absl::string_view kMistral7B_v03 = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768})";

// Qwen/Qwen3-0.6B's config.json: head_dim 128 is not hidden_size / heads = 64.
constexpr absl::string_view kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// openai-community/gpt2's config.json (abridged: task_specific_params dropped).
constexpr absl::string_view kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "vocab_size": 50257})";

// Meta-Llama-3-8B in transformers 5's spelling (rope_parameters, dtype).
constexpr absl::string_view kLlama3_8B_v5 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "dtype": "bfloat16",
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 8192, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
  "tie_word_embeddings": false, "transformers_version": "5.23.0", "vocab_size": 128256})";

ModelConfig Named(ModelConfig c, absl::string_view name) {
  c.name = std::string(name);
  return c;
}

TEST(HfConfigTest, PublishedConfigsGiveThePresets) {
  const std::pair<absl::string_view, const char*> cases[] = {
      {kLlama32_1B, "llama-3.2-1b"},       {kQwen25_05B, "qwen2.5-0.5b"},
      {kTinyLlama, "tinyllama-1.1b"},      {kLlama2_7B, "llama-2-7b"},
      {kMistral7B_v03, "mistral-7b-v0.3"}, {kLlama3_8B_v5, "llama-3-8b"},
      {kQwen3_06B, "qwen3-0.6b"},
  };
  for (const auto& [json_text, preset] : cases) {
    ASSERT_OK_AND_ASSIGN(const ModelConfig parsed, ParseHfConfig(json_text, kPath));
    ASSERT_OK_AND_ASSIGN(const ModelConfig want, ModelPreset(preset));
    EXPECT_EQ(parsed, Named(want, kPath)) << preset;
  }
  ASSERT_OK_AND_ASSIGN(const ModelConfig gpt2, ParseHfConfig(kGpt2, kPath));
  ASSERT_OK_AND_ASSIGN(const ModelConfig want, ModelPreset("gpt2"));
  EXPECT_EQ(gpt2, Named(want, kPath));
}

TEST(HfConfigTest, AbsentKeysTakeTransformersDefaults) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig llama, ParseHfConfig(R"({"model_type": "llama"})", kPath));
  EXPECT_EQ(llama.vocab_size, 32000);
  EXPECT_EQ(llama.hidden_size, 4096);
  EXPECT_EQ(llama.intermediate_size, 11008);
  EXPECT_EQ(llama.num_layers, 32);
  EXPECT_EQ(llama.num_heads, 32);
  EXPECT_EQ(llama.num_kv_heads, 32);
  EXPECT_EQ(llama.head_dim, 128);
  EXPECT_EQ(llama.max_position_embeddings, 2048);
  EXPECT_EQ(llama.norm_eps, 1e-6);
  EXPECT_EQ(llama.rope_theta, 10000.0);
  EXPECT_EQ(llama.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FALSE(llama.tie_word_embeddings);
  EXPECT_FALSE(llama.qkv_bias || llama.o_proj_bias || llama.mlp_bias);
  EXPECT_EQ(llama.torch_dtype, std::nullopt);

  ASSERT_OK_AND_ASSIGN(const ModelConfig qwen, ParseHfConfig(R"({"model_type": "qwen2"})", kPath));
  EXPECT_EQ(qwen.vocab_size, 151936);
  EXPECT_EQ(qwen.intermediate_size, 22016);
  EXPECT_EQ(qwen.num_kv_heads, 32);
  EXPECT_EQ(qwen.max_position_embeddings, 32768);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_proj_bias);

  // Qwen3Config: qwen2's sizes, but head_dim 128 of its own and one attention_bias (false).
  ASSERT_OK_AND_ASSIGN(const ModelConfig qwen3, ParseHfConfig(R"({"model_type": "qwen3"})", kPath));
  EXPECT_EQ(qwen3.vocab_size, 151936);
  EXPECT_EQ(qwen3.intermediate_size, 22016);
  EXPECT_EQ(qwen3.num_kv_heads, 32);
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_EQ(qwen3.max_position_embeddings, 32768);
  EXPECT_FALSE(qwen3.qkv_bias || qwen3.o_proj_bias || qwen3.mlp_bias);
  EXPECT_TRUE(qwen3.qk_norm());
  ASSERT_OK_AND_ASSIGN(
      const ModelConfig qwen3_bias,
      ParseHfConfig(R"({"model_type": "qwen3", "attention_bias": true, "head_dim": 64})", kPath));
  EXPECT_TRUE(qwen3_bias.qkv_bias && qwen3_bias.o_proj_bias);
  EXPECT_EQ(qwen3_bias.head_dim, 64);
  // Qwen3's window, as Qwen2's: with use_sliding_window, on the layers >= max_window_layers.
  ASSERT_OK_AND_ASSIGN(const ModelConfig qwen3_window,
                       ParseHfConfig(R"({"model_type": "qwen3", "use_sliding_window": true,
                                "sliding_window": 4096, "max_window_layers": 0})",
                                     kPath));
  EXPECT_EQ(qwen3_window.sliding_window, 4096);
  EXPECT_EQ(qwen3_window.sliding_window_layers, std::vector<bool>(32, true));

  // MistralConfig's default sliding_window (4096) applies to every layer.
  ASSERT_OK_AND_ASSIGN(const ModelConfig mistral_default,
                       ParseHfConfig(R"({"model_type": "mistral"})", kPath));
  EXPECT_EQ(mistral_default.sliding_window, 4096);
  EXPECT_EQ(mistral_default.sliding_window_layers, std::vector<bool>(32, true));
  ASSERT_OK_AND_ASSIGN(
      const ModelConfig mistral,
      ParseHfConfig(R"({"model_type": "mistral", "sliding_window": null})", kPath));
  EXPECT_EQ(mistral.sliding_window, 0);
  EXPECT_TRUE(mistral.sliding_window_layers.empty());
  EXPECT_EQ(mistral.num_kv_heads, 8);
  EXPECT_EQ(mistral.intermediate_size, 14336);
  EXPECT_EQ(mistral.max_position_embeddings, 131072);
  // A null num_key_value_heads means "as many as the query heads" in every family.
  ASSERT_OK_AND_ASSIGN(const ModelConfig mistral_mha,
                       ParseHfConfig(R"({"model_type": "mistral", "sliding_window": null,
                        "num_key_value_heads": null})",
                                     kPath));
  EXPECT_EQ(mistral_mha.num_kv_heads, 32);

  ASSERT_OK_AND_ASSIGN(const ModelConfig gpt2, ParseHfConfig(R"({"model_type": "gpt2"})", kPath));
  ASSERT_OK_AND_ASSIGN(const ModelConfig want, ModelPreset("gpt2"));
  EXPECT_EQ(gpt2, Named(want, kPath));
}

TEST(HfConfigTest, RopeSpellings) {
  // transformers 5: rope_parameters with the theta inside; llama3 without
  // original_max_position_embeddings takes max_position_embeddings.
  ASSERT_OK_AND_ASSIGN(const ModelConfig c,
                       ParseHfConfig(R"({"model_type": "llama", "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 5.0, "factor": 8,
                            "low_freq_factor": 1, "high_freq_factor": 4}})",
                                     kPath));
  EXPECT_EQ(c.rope_theta, 5.0);
  EXPECT_EQ(c.rope_scaling, (RopeScaling{RopeScalingType::kLlama3, 8, 1, 4, 4096}));
  // Legacy "type"; a top-level original_max_position_embeddings wins.
  ASSERT_OK_AND_ASSIGN(
      const ModelConfig d,
      ParseHfConfig(R"({"model_type": "llama", "original_max_position_embeddings": 1000,
        "rope_scaling": {"type": "llama3", "factor": 2, "low_freq_factor": 1,
                         "high_freq_factor": 2, "original_max_position_embeddings": 8}})",
                    kPath));
  EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 1000);
  // "default" is no scaling; an empty rope_scaling defers to rope_parameters.
  ASSERT_OK_AND_ASSIGN(const ModelConfig e,
                       ParseHfConfig(R"({"model_type": "qwen2", "rope_scaling": {},
                        "rope_parameters": {"rope_type": "default", "rope_theta": 7}})",
                                     kPath));
  EXPECT_EQ(e.rope_theta, 7.0);
  EXPECT_EQ(e.rope_scaling.type, RopeScalingType::kNone);
  // Equal thetas in both places are fine.
  EXPECT_OK(ParseHfConfig(
      R"({"model_type": "llama", "rope_theta": 7, "rope_parameters": {"rope_theta": 7.0}})",
      kPath));
}

TEST(HfConfigTest, Gpt2AliasesAndNInner) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig c,
                       ParseHfConfig(R"({"model_type": "gpt2", "hidden_size": 64, "n_head": 4,
                                         "num_hidden_layers": 3, "n_inner": 100})",
                                     kPath));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.intermediate_size, 100);
  EXPECT_THAT(ToGptConfig(c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n_inner")));
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "gpt2", "hidden_size": 64, "n_embd": 32})", kPath),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"hidden_size\"")));
}

struct Refusal {
  const char* json;
  absl::StatusCode code;
  const char* key;  // must appear, quoted, in the message
};

TEST(HfConfigTest, RefusalsNameTheFileAndTheKey) {
  using C = absl::StatusCode;
  const Refusal cases[] = {
      // Malformed.
      {R"({"model_type": "llama",})", C::kInvalidArgument, "line 1"},
      {R"([1, 2])", C::kInvalidArgument, "not a JSON object"},
      {R"({"model_type": "llama", "hidden_size": 64, "hidden_size": 64})", C::kInvalidArgument,
       "\"hidden_size\""},
      {R"({"hidden_size": 64})", C::kInvalidArgument, "\"model_type\""},
      {R"({"model_type": 3})", C::kInvalidArgument, "\"model_type\""},
      {R"({"model_type": "llama", "hidden_size": "4096"})", C::kInvalidArgument, "\"hidden_size\""},
      {R"({"model_type": "llama", "hidden_size": 4096.0})", C::kInvalidArgument, "\"hidden_size\""},
      {R"({"model_type": "llama", "hidden_size": 0})", C::kInvalidArgument, "\"hidden_size\""},
      {R"({"model_type": "llama", "vocab_size": null})", C::kInvalidArgument, "\"vocab_size\""},
      {R"({"model_type": "llama", "vocab_size": 18446744073709551615})", C::kInvalidArgument,
       "\"vocab_size\""},
      {R"({"model_type": "llama", "num_key_value_heads": 5})", C::kInvalidArgument,
       "\"num_key_value_heads\""},
      {R"({"model_type": "llama", "num_attention_heads": 3})", C::kInvalidArgument,
       "\"num_attention_heads\""},
      {R"({"model_type": "llama", "head_dim": 63})", C::kInvalidArgument, "\"head_dim\""},
      {R"({"model_type": "llama", "rms_norm_eps": 0})", C::kInvalidArgument, "\"rms_norm_eps\""},
      {R"({"model_type": "llama", "rms_norm_eps": "1e-5"})", C::kInvalidArgument,
       "\"rms_norm_eps\""},
      {R"({"model_type": "llama", "tie_word_embeddings": 1})", C::kInvalidArgument,
       "\"tie_word_embeddings\""},
      {R"({"model_type": "llama", "attention_bias": "no"})", C::kInvalidArgument,
       "\"attention_bias\""},
      {R"({"model_type": "llama", "architectures": "LlamaForCausalLM"})", C::kInvalidArgument,
       "\"architectures\""},
      {R"({"model_type": "llama", "architectures": ["MistralForCausalLM"]})", C::kInvalidArgument,
       "\"architectures\""},
      {R"({"model_type": "llama", "rope_theta": 5, "rope_parameters": {"rope_theta": 6}})",
       C::kInvalidArgument, "\"rope_theta\""},
      {R"({"model_type": "llama", "rope_scaling": [1]})", C::kInvalidArgument, "\"rope_scaling\""},
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8,
           "high_freq_factor": 4}})",
       C::kInvalidArgument, "\"rope_scaling.low_freq_factor\""},
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8,
           "low_freq_factor": 4, "high_freq_factor": 1}})",
       C::kInvalidArgument, "\"rope_scaling.high_freq_factor\""},
      {R"({"model_type": "llama", "torch_dtype": 16})", C::kInvalidArgument, "\"torch_dtype\""},
      {R"({"model_type": "qwen2", "layer_types": ["full_attention"]})", C::kInvalidArgument,
       "\"layer_types\""},
      {R"({"model_type": "mistral", "sliding_window": "4096"})", C::kInvalidArgument,
       "\"sliding_window\""},
      {R"({"model_type": "mistral", "sliding_window": 4096.5})", C::kInvalidArgument,
       "\"sliding_window\""},
      {R"({"model_type": "mistral", "sliding_window": 0})", C::kInvalidArgument,
       "\"sliding_window\""},
      {R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": true})",
       C::kInvalidArgument, "\"sliding_window\""},
      {R"({"model_type": "qwen2", "use_sliding_window": 1})", C::kInvalidArgument,
       "\"use_sliding_window\""},
      {R"({"model_type": "qwen2", "max_window_layers": "2"})", C::kInvalidArgument,
       "\"max_window_layers\""},
      {R"({"model_type": "gpt2", "n_head": 7})", C::kInvalidArgument, "\"n_head\""},
      {R"({"model_type": "gpt2", "n_positions": -4})", C::kInvalidArgument, "\"n_positions\""},
      // Unsupported.
      {R"({"model_type": "mixtral"})", C::kUnimplemented, "\"model_type\""},
      {R"({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]})",
       C::kUnimplemented, "\"architectures\""},
      {R"({"model_type": "qwen2", "layer_types": ["full_attention", "chunked_attention"],
           "num_hidden_layers": 2})",
       C::kUnimplemented, "\"layer_types[1]\""},
      {R"({"model_type": "llama", "num_local_experts": 8})", C::kUnimplemented,
       "\"num_local_experts\""},
      {R"({"model_type": "qwen2", "num_experts": 60})", C::kUnimplemented, "\"num_experts\""},
      {R"({"model_type": "llama", "moe_intermediate_size": 1408})", C::kUnimplemented,
       "\"moe_intermediate_size\""},
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4}})",
       C::kUnimplemented, "\"rope_scaling.rope_type\""},
      {R"({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2}})",
       C::kUnimplemented, "\"rope_scaling.rope_type\""},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "dynamic", "factor": 2}})",
       C::kUnimplemented, "\"rope_parameters.rope_type\""},
      {R"({"model_type": "qwen2", "rope_parameters": {"full_attention": {"rope_type": "default"}}})",
       C::kUnimplemented, "\"rope_parameters\""},
      {R"({"model_type": "llama", "partial_rotary_factor": 0.5})", C::kUnimplemented,
       "\"partial_rotary_factor\""},
      {R"({"model_type": "llama", "hidden_act": "gelu"})", C::kUnimplemented, "\"hidden_act\""},
      {R"({"model_type": "gpt2", "activation_function": "relu"})", C::kUnimplemented,
       "\"activation_function\""},
      {R"({"model_type": "gpt2", "tie_word_embeddings": false})", C::kUnimplemented,
       "\"tie_word_embeddings\""},
      {R"({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true})", C::kUnimplemented,
       "\"scale_attn_by_inverse_layer_idx\""},
      {R"({"model_type": "llama", "quantization_config": {"quant_method": "gptq"}})",
       C::kUnimplemented, "\"quantization_config\""},
      {R"({"model_type": "llama", "torch_dtype": "float64"})", C::kUnimplemented,
       "\"torch_dtype\""},
      {R"({"model_type": "llama", "dtype": "int8", "torch_dtype": "float16"})", C::kUnimplemented,
       "\"dtype\""},
  };
  for (const Refusal& r : cases) {
    const absl::StatusOr<ModelConfig> c = ParseHfConfig(r.json, kPath);
    EXPECT_THAT(c, StatusIs(r.code, AllOf(HasSubstr(kPath), HasSubstr(r.key)))) << r.json;
  }
}

TEST(HfConfigTest, AcceptedByDecision) {
  // A head_dim that differs from hidden_size / heads (Mistral-Nemo's 5120 / 32 = 160 vs 128).
  ASSERT_OK_AND_ASSIGN(
      const ModelConfig nemo,
      ParseHfConfig(R"({"model_type": "mistral", "hidden_size": 5120, "head_dim": 128,
                        "num_attention_heads": 32, "num_key_value_heads": 8,
                        "sliding_window": null})",
                    kPath));
  EXPECT_EQ(nemo.q_size(), 4096);
  // Llama with attention and MLP biases.
  ASSERT_OK_AND_ASSIGN(
      const ModelConfig biased,
      ParseHfConfig(R"({"model_type": "llama", "attention_bias": true, "mlp_bias": true})", kPath));
  EXPECT_TRUE(biased.qkv_bias && biased.o_proj_bias && biased.mlp_bias);
  // Qwen2's window off by default, even with sliding_attention layers.
  ASSERT_OK_AND_ASSIGN(const ModelConfig qwen2_off,
                       ParseHfConfig(R"({"model_type": "qwen2", "sliding_window": 8,
                             "layer_types": ["sliding_attention", "full_attention"],
                             "num_hidden_layers": 2})",
                                     kPath));
  EXPECT_EQ(qwen2_off.sliding_window, 0);
  // MoE keys that say "no experts".
  EXPECT_OK(ParseHfConfig(R"({"model_type": "llama", "num_experts": null, "num_local_experts": 0})",
                          kPath));
}

// Sliding windows as transformers 4.57.6 applies them, written back so that they read the same.
TEST(HfConfigTest, SlidingWindowLayers) {
  // Qwen2: layers >= max_window_layers, only with use_sliding_window.
  ASSERT_OK_AND_ASSIGN(const ModelConfig qwen2,
                       ParseHfConfig(R"({"model_type": "qwen2", "use_sliding_window": true,
                         "sliding_window": 6, "max_window_layers": 1, "num_hidden_layers": 3})",
                                     kPath));
  EXPECT_EQ(qwen2.sliding_window, 6);
  EXPECT_EQ(qwen2.sliding_window_layers, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(qwen2.LayerSlidingWindow(0), 0);
  EXPECT_EQ(qwen2.LayerSlidingWindow(2), 6);
  // layer_types wins over max_window_layers.
  ASSERT_OK_AND_ASSIGN(const ModelConfig types,
                       ParseHfConfig(R"({"model_type": "qwen2", "use_sliding_window": true,
                         "sliding_window": 5, "max_window_layers": 0, "num_hidden_layers": 3,
                         "layer_types": ["sliding_attention", "full_attention",
                                         "sliding_attention"]})",
                                     kPath));
  EXPECT_EQ(types.sliding_window_layers, (std::vector<bool>{true, false, true}));
  // No layer at or past max_window_layers: no window; a null window: none.
  ASSERT_OK_AND_ASSIGN(const ModelConfig none,
                       ParseHfConfig(R"({"model_type": "qwen2", "use_sliding_window": true,
                         "sliding_window": 5, "num_hidden_layers": 3})",
                                     kPath));
  EXPECT_EQ(none.sliding_window, 0);
  ASSERT_OK_AND_ASSIGN(const ModelConfig null_window,
                       ParseHfConfig(R"({"model_type": "qwen2", "use_sliding_window": true,
                         "sliding_window": null, "max_window_layers": 0})",
                                     kPath));
  EXPECT_EQ(null_window.sliding_window, 0);
  // Mistral 7B v0.1: 4096 on every layer, also when the window reaches past the context.
  ASSERT_OK_AND_ASSIGN(const ModelConfig mistral,
                       ParseHfConfig(R"({"model_type": "mistral", "sliding_window": 4096,
                         "max_position_embeddings": 32768, "num_hidden_layers": 2})",
                                     kPath));
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.sliding_window_layers, (std::vector<bool>{true, true}));
  // Each reads back from what HfConfigJson writes.
  for (const ModelConfig& c : {qwen2, types, mistral}) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(const std::string json, HfConfigJson(c));
    ASSERT_OK_AND_ASSIGN(const ModelConfig back, ParseHfConfig(json, kPath));
    EXPECT_EQ(back, c) << json;
  }
  // Over a base whose layer_types slide but whose window is now off, the window stays off.
  ASSERT_OK_AND_ASSIGN(const std::string off,
                       HfConfigJson(none, {.torch_dtype = std::nullopt,
                                           .base_json = R"({"model_type": "qwen2", "layer_types":
                                           ["sliding_attention", "sliding_attention",
                                            "sliding_attention"]})"}));
  ASSERT_OK_AND_ASSIGN(const ModelConfig off_back, ParseHfConfig(off, kPath));
  EXPECT_EQ(off_back.sliding_window, 0);
}

// SmolLM3 (transformers 4.57.6's SmolLM3Config): no_rope_layers 1 = RoPE, 0 = none; absent, every
// no_rope_layer_interval-th layer has none; its defaults; a window refused.
TEST(HfConfigTest, SmolLM3NoRopeLayers) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig defaults,
                       ParseHfConfig(R"({"model_type": "smollm3"})", kPath));
  EXPECT_EQ(defaults.family, ModelFamily::kSmolLM3);
  EXPECT_EQ(defaults.vocab_size, 128256);
  EXPECT_EQ(defaults.hidden_size, 2048);
  EXPECT_EQ(defaults.num_layers, 36);
  EXPECT_EQ(defaults.num_heads, 16);
  EXPECT_EQ(defaults.num_kv_heads, 4);
  EXPECT_EQ(defaults.head_dim, 128);
  EXPECT_EQ(defaults.intermediate_size, 11008);
  EXPECT_EQ(defaults.max_position_embeddings, 32768);
  EXPECT_EQ(defaults.rope_theta, 2000000.0);
  EXPECT_TRUE(defaults.tie_word_embeddings);
  ASSERT_EQ(defaults.layers_without_rope.size(), 36u);
  for (int64_t i = 0; i < 36; ++i) {
    EXPECT_EQ(defaults.LayerHasRope(i), (i + 1) % 4 != 0) << i;
  }
  ASSERT_OK_AND_ASSIGN(const ModelConfig preset, ModelPreset("smollm3-3b"));
  EXPECT_EQ(defaults.layers_without_rope, preset.layers_without_rope);

  ASSERT_OK_AND_ASSIGN(const ModelConfig listed,
                       ParseHfConfig(R"({"model_type": "smollm3", "num_hidden_layers": 3,
                         "no_rope_layers": [0, 1, 1], "no_rope_layer_interval": 2,
                         "attention_bias": true, "mlp_bias": true})",
                                     kPath));
  EXPECT_EQ(listed.layers_without_rope, (std::vector<bool>{true, false, false}));
  EXPECT_TRUE(listed.qkv_bias && listed.o_proj_bias && listed.mlp_bias);
  ASSERT_OK_AND_ASSIGN(const ModelConfig interval,
                       ParseHfConfig(R"({"model_type": "smollm3", "num_hidden_layers": 3,
                         "no_rope_layers": null, "no_rope_layer_interval": 2})",
                                     kPath));
  EXPECT_EQ(interval.layers_without_rope, (std::vector<bool>{false, true, false}));
  ASSERT_OK_AND_ASSIGN(const ModelConfig all_rope,
                       ParseHfConfig(R"({"model_type": "smollm3", "num_hidden_layers": 2,
                         "no_rope_layers": [1, 1]})",
                                     kPath));
  EXPECT_TRUE(all_rope.layers_without_rope.empty());
  for (const ModelConfig& c : {listed, interval, all_rope, preset}) {
    ASSERT_OK_AND_ASSIGN(const std::string json, HfConfigJson(c));
    ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseHfConfig(json, kPath));
    back.name = c.name;
    EXPECT_EQ(back, c) << json;
  }

  using C = absl::StatusCode;
  const struct {
    const char* json;
    C code;
    const char* key;
  } refused[] = {
      {R"({"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [1]})",
       C::kInvalidArgument, "\"no_rope_layers\""},
      {R"({"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [1, 2]})",
       C::kInvalidArgument, "\"no_rope_layers[1]\""},
      {R"({"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [1, true]})",
       C::kInvalidArgument, "\"no_rope_layers[1]\""},
      {R"({"model_type": "smollm3", "no_rope_layers": "1,1,1,0"})", C::kInvalidArgument,
       "\"no_rope_layers\""},
      {R"({"model_type": "smollm3", "no_rope_layer_interval": 0})", C::kInvalidArgument,
       "\"no_rope_layer_interval\""},
      {R"({"model_type": "smollm3", "use_sliding_window": true, "sliding_window": 8})",
       C::kUnimplemented, "\"use_sliding_window\""},
      {R"({"model_type": "smollm3", "sliding_window": "8"})", C::kInvalidArgument,
       "\"sliding_window\""},
      {R"({"model_type": "smollm3", "num_hidden_layers": 2,
           "layer_types": ["full_attention", "sliding_attention"]})",
       C::kUnimplemented, "\"layer_types[1]\""},
      {R"({"model_type": "smollm3", "architectures": ["LlamaForCausalLM"]})", C::kInvalidArgument,
       "\"architectures\""},
  };
  for (const auto& r : refused) {
    EXPECT_THAT(ParseHfConfig(r.json, kPath),
                StatusIs(r.code, AllOf(HasSubstr(kPath), HasSubstr(r.key))))
        << r.json;
  }
}

// OLMo 2 (transformers 4.57.6's Olmo2Config): its defaults, post norms, whole-projection q/k norm.
TEST(HfConfigTest, Olmo2) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig c, ParseHfConfig(R"({"model_type": "olmo2"})", kPath));
  EXPECT_EQ(c.family, ModelFamily::kOlmo2);
  EXPECT_EQ(c.vocab_size, 50304);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000);
  EXPECT_FALSE(c.tie_word_embeddings || c.qkv_bias || c.mlp_bias);
  EXPECT_TRUE(c.qk_norm() && c.qk_norm_whole() && c.post_norms());
  ASSERT_OK_AND_ASSIGN(const ModelConfig biased,
                       ParseHfConfig(R"({"model_type": "olmo2", "attention_bias": true,
                         "architectures": ["Olmo2ForCausalLM"]})",
                                     kPath));
  EXPECT_TRUE(biased.qkv_bias && biased.o_proj_bias && !biased.mlp_bias);
  ASSERT_OK_AND_ASSIGN(const ModelConfig preset, ModelPreset("olmo-2-1b"));
  ASSERT_OK_AND_ASSIGN(const std::string json, HfConfigJson(preset));
  ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseHfConfig(json, kPath));
  back.name = preset.name;
  EXPECT_EQ(back, preset) << json;
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "olmo2", "attention_bias": "no"})", kPath),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"attention_bias\"")));
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "olmo2", "architectures": ["Olmo2Model"]})", kPath),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("\"architectures\"")));
}

// Phi-3 / Phi-4-mini (transformers 4.57.6's Phi3Config): its defaults, partial rotary, the window
// on every layer, and refusals naming the key.
TEST(HfConfigTest, Phi3) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig c, ParseHfConfig(R"({"model_type": "phi3"})", kPath));
  EXPECT_EQ(c.family, ModelFamily::kPhi3);
  EXPECT_EQ(c.vocab_size, 32064);
  EXPECT_EQ(c.hidden_size, 3072);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000);
  EXPECT_EQ(c.rotary_dim(), 96);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.tie_word_embeddings || c.qkv_bias || c.o_proj_bias || c.mlp_bias);
  ASSERT_OK_AND_ASSIGN(const ModelConfig mini, ParseHfConfig(R"({"model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "num_attention_heads": 24,
    "num_key_value_heads": 8, "partial_rotary_factor": 0.75, "sliding_window": 2047,
    "tie_word_embeddings": true})",
                                                             kPath));
  EXPECT_EQ(mini.head_dim, 128);
  EXPECT_EQ(mini.rotary_dim(), 96);
  EXPECT_EQ(mini.sliding_window, 2047);
  EXPECT_EQ(mini.sliding_window_layers, std::vector<bool>(32, true));
  ASSERT_OK_AND_ASSIGN(const std::string json, HfConfigJson(mini));
  ASSERT_OK_AND_ASSIGN(const ModelConfig back, ParseHfConfig(json, kPath));
  EXPECT_EQ(back, mini) << json;
  ASSERT_OK_AND_ASSIGN(const ModelConfig preset, ModelPreset("phi-4-mini"));
  EXPECT_EQ(preset.rotary_dim(), 96);
  // longrope (also under its older names su and yarn), with 48 factors for 96 rotated channels.
  for (const char* type : {"longrope", "su", "yarn"}) {
    SCOPED_TRACE(type);
    std::string factors = "[";
    for (int j = 0; j < 48; ++j) factors += absl::StrCat(j > 0 ? ", " : "", 1 + 0.25 * j);
    factors += "]";
    ASSERT_OK_AND_ASSIGN(
        const ModelConfig lr,
        ParseHfConfig(absl::StrCat(R"({"model_type": "phi3", "num_attention_heads": 24,
          "num_key_value_heads": 8, "partial_rotary_factor": 0.75,
          "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
          "rope_scaling": {"type": ")",
                                   type, R"(", "short_factor": )", factors, R"(, "long_factor": )",
                                   factors, "}}"),
                      kPath));
    EXPECT_EQ(lr.rope_scaling.type, RopeScalingType::kLongRope);
    EXPECT_EQ(lr.rope_scaling.original_max_position_embeddings, 4096);
    ASSERT_EQ(lr.rope_scaling.short_factor.size(), 48u);
    EXPECT_EQ(lr.rope_scaling.long_factor[47], 1 + 0.25 * 47);
    // Phi-4-mini's attention factor: sqrt(1 + ln 32 / ln 4096).
    EXPECT_DOUBLE_EQ(LongRopeAttentionFactor(lr), std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
    ASSERT_OK_AND_ASSIGN(const std::string lr_json, HfConfigJson(lr));
    ASSERT_OK_AND_ASSIGN(const ModelConfig lr_back, ParseHfConfig(lr_json, kPath));
    EXPECT_EQ(lr_back, lr) << lr_json;
  }
  struct Bad {
    const char* json;
    const char* key;
  };
  for (const Bad& bad : {
           Bad{R"({"model_type": "phi3", "partial_rotary_factor": "half"})",
               "\"partial_rotary_factor\""},
           Bad{R"({"model_type": "phi3", "partial_rotary_factor": 0.001})",
               "\"partial_rotary_factor\""},
           Bad{R"({"model_type": "phi3", "partial_rotary_factor": 1.5})",
               "\"partial_rotary_factor\""},
           Bad{R"({"model_type": "llama", "partial_rotary_factor": 0.5})",
               "\"partial_rotary_factor\""},
           Bad{R"({"model_type": "phi3", "sliding_window": "4k"})", "\"sliding_window\""},
           Bad{R"({"model_type": "phi3", "sliding_window": 0})", "\"sliding_window\""},
           Bad{R"({"model_type": "phi3", "rope_scaling": {"type": "linear", "factor": 2}})",
               "rope_scaling"},
           Bad{R"({"model_type": "phi3", "architectures": ["Phi3Model"]})", "\"architectures\""},
           // longrope: rotary_dim 96 needs 48 factors of each kind; exactly Phi3Config's keys.
           Bad{R"({"model_type": "phi3", "rope_scaling": {"type": "longrope",
               "short_factor": [1, 2], "long_factor": [1, 2]}})",
               "\"rope_scaling.short_factor\""},
           Bad{R"({"model_type": "phi3", "rope_scaling": {"type": "su",
               "short_factor": "none", "long_factor": [1, 2]}})",
               "\"rope_scaling.short_factor\""},
           Bad{R"({"model_type": "phi3", "rope_scaling": {"type": "longrope", "factor": 2.0,
               "short_factor": [], "long_factor": []}})",
               "\"rope_scaling.factor\""},
           Bad{R"({"model_type": "llama", "rope_scaling": {"rope_type": "longrope",
               "short_factor": [], "long_factor": []}})",
               "\"rope_scaling.rope_type\""},
       }) {
    SCOPED_TRACE(bad.json);
    const absl::StatusOr<ModelConfig> got = ParseHfConfig(bad.json, kPath);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr(bad.key));
  }
}

// Gemma 3's text model (transformers 4.57.6's Gemma3TextConfig): its defaults, the sliding
// pattern, gemma-3-1b's config.json, and refusals naming the key (the multimodal model, soft-
// capping, query_pre_attn_scalar other than head_dim, linear rope scaling).
TEST(HfConfigTest, Gemma3Text) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig d,
                       ParseHfConfig(R"({"model_type": "gemma3_text"})", kPath));
  EXPECT_EQ(d.family, ModelFamily::kGemma3);
  EXPECT_EQ(d.vocab_size, 262208);
  EXPECT_EQ(d.hidden_size, 2304);
  EXPECT_EQ(d.intermediate_size, 9216);
  EXPECT_EQ(d.num_layers, 26);
  EXPECT_EQ(d.num_heads, 8);
  EXPECT_EQ(d.num_kv_heads, 4);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.max_position_embeddings, 131072);
  EXPECT_EQ(d.norm_eps, 1e-6);
  EXPECT_EQ(d.rope_theta, 1e6);
  EXPECT_EQ(d.rope_local_base_freq, 1e4);
  EXPECT_EQ(d.hidden_act, HiddenAct::kGeluTanh);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_FALSE(d.qkv_bias || d.o_proj_bias || d.mlp_bias);
  EXPECT_EQ(d.sliding_window, 4096);
  for (int64_t i = 0; i < d.num_layers; ++i) {
    EXPECT_EQ(d.sliding_window_layers[i], (i + 1) % 6 != 0) << i;
    EXPECT_EQ(d.LayerHasLocalRope(i), (i + 1) % 6 != 0) << i;
  }
  EXPECT_TRUE(d.qk_norm() && !d.qk_norm_whole() && d.sandwich_norms() && !d.post_norms());
  EXPECT_EQ(d.norm_weight_offset(), 1.0);
  EXPECT_EQ(d.embedding_multiplier(), std::sqrt(2304.0));
  // google/gemma-3-1b-pt's config.json gives the preset.
  ASSERT_OK_AND_ASSIGN(ModelConfig one, ParseHfConfig(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})",
                                                      kPath));
  ASSERT_OK_AND_ASSIGN(const ModelConfig preset, ModelPreset("gemma-3-1b"));
  EXPECT_EQ(one, Named(preset, kPath));
  ASSERT_OK_AND_ASSIGN(const std::string json, HfConfigJson(preset));
  EXPECT_THAT(json, AllOf(HasSubstr("\"hidden_activation\": \"gelu_pytorch_tanh\""),
                          HasSubstr("\"query_pre_attn_scalar\": 256"),
                          HasSubstr("\"rope_local_base_freq\": 10000.0"),
                          HasSubstr("\"Gemma3ForCausalLM\"")));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("\"hidden_act\"")));
  ASSERT_OK_AND_ASSIGN(const ModelConfig back, ParseHfConfig(json, kPath));
  EXPECT_EQ(back, Named(preset, kPath)) << json;
  // google/gemma-3-4b-pt's text_config as a gemma3_text config.json gives the 4b preset (linear
  // rope scaling 8).
  ASSERT_OK_AND_ASSIGN(const ModelConfig four, ParseHfConfig(R"({
    "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 2560,
    "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
    "vocab_size": 262208, "torch_dtype": "bfloat16"})",
                                                     kPath));
  ASSERT_OK_AND_ASSIGN(const ModelConfig preset4, ModelPreset("gemma-3-4b"));
  EXPECT_EQ(four, Named(preset4, kPath));
  EXPECT_EQ(four.rope_scaling.type, RopeScalingType::kLinear);
  ASSERT_OK_AND_ASSIGN(const std::string json4, HfConfigJson(preset4));
  ASSERT_OK_AND_ASSIGN(const ModelConfig back4, ParseHfConfig(json4, kPath));
  EXPECT_EQ(back4, Named(preset4, kPath)) << json4;
  // layer_types wins over the pattern; no sliding layer is no window.
  ASSERT_OK_AND_ASSIGN(const ModelConfig full, ParseHfConfig(R"({"model_type": "gemma3_text",
    "num_hidden_layers": 2, "layer_types": ["full_attention", "full_attention"]})",
                                                             kPath));
  EXPECT_EQ(full.sliding_window, 0);
  EXPECT_FALSE(full.LayerHasLocalRope(0));
  struct Bad {
    const char* json;
    absl::StatusCode code;
    const char* key;
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;
  for (const Bad& bad : {
           Bad{R"({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]})",
               kUnimplemented, "the text model is supported"},
           Bad{R"({"model_type": "gemma3_text",
               "architectures": ["Gemma3ForConditionalGeneration"]})",
               kUnimplemented, "\"architectures\""},
           Bad{R"({"model_type": "gemma3_text", "final_logit_softcapping": 30.0})", kUnimplemented,
               "\"final_logit_softcapping\""},
           Bad{R"({"model_type": "gemma3_text", "attn_logit_softcapping": "50"})", kInvalid,
               "\"attn_logit_softcapping\""},
           Bad{R"({"model_type": "gemma3_text", "query_pre_attn_scalar": 168})", kUnimplemented,
               "\"query_pre_attn_scalar\""},
           Bad{R"({"model_type": "gemma3_text", "query_pre_attn_scalar": "256"})", kInvalid,
               "\"query_pre_attn_scalar\""},
           Bad{R"({"model_type": "gemma3_text", "sliding_window": "4k"})", kInvalid,
               "\"sliding_window\""},
           Bad{R"({"model_type": "gemma3_text", "sliding_window": null})", kInvalid,
               "\"sliding_window\""},
           Bad{R"({"model_type": "gemma3_text", "num_hidden_layers": 2,
               "layer_types": ["full_attention"]})",
               kInvalid, "\"layer_types\""},
           Bad{R"({"model_type": "gemma3_text", "num_hidden_layers": 1,
               "layer_types": ["chunked_attention"]})",
               kUnimplemented, "\"layer_types[0]\""},
           Bad{R"({"model_type": "gemma3_text", "rope_local_base_freq": -1})", kInvalid,
               "\"rope_local_base_freq\""},
           Bad{R"({"model_type": "gemma3_text", "hidden_activation": "gelu"})", kUnimplemented,
               "\"hidden_activation\""},
           Bad{R"({"model_type": "gemma3_text", "use_bidirectional_attention": true})",
               kUnimplemented, "\"use_bidirectional_attention\""},
           Bad{R"({"model_type": "gemma3_text", "rope_scaling": {"rope_type": "yarn",
               "factor": 8.0}})",
               kUnimplemented, "\"rope_scaling.rope_type\""},
           Bad{R"({"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear"}})",
               kInvalid, "\"rope_scaling.factor\""},
           Bad{R"({"model_type": "gemma3_text",
               "rope_scaling": {"rope_type": "linear", "factor": "8"}})",
               kInvalid, "\"rope_scaling.factor\""},
           Bad{R"({"model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": 8}})",
               kUnimplemented, "\"rope_scaling.rope_type\""},
       }) {
    SCOPED_TRACE(bad.json);
    EXPECT_THAT(ParseHfConfig(bad.json, kPath), StatusIs(bad.code, HasSubstr(bad.key)));
  }
}

// Every valid config survives HfConfigJson -> ParseHfConfig unchanged.
TEST(HfConfigTest, RoundTripsEveryPreset) {
  for (const std::string& name : ModelPresetNames()) {
    ASSERT_OK_AND_ASSIGN(const ModelConfig c, ModelPreset(name));
    ASSERT_OK_AND_ASSIGN(const std::string text, HfConfigJson(c));
    ASSERT_OK_AND_ASSIGN(const ModelConfig back, ParseHfConfig(text, kPath));
    EXPECT_EQ(back, Named(c, kPath)) << name << "\n" << text;
  }
  ASSERT_OK_AND_ASSIGN(ModelConfig biased, ModelPreset("llama-tiny"));
  biased.qkv_bias = biased.o_proj_bias = biased.mlp_bias = true;
  biased.head_dim = 24;  // != hidden / heads
  biased.torch_dtype = DType::kBF16;
  ASSERT_OK_AND_ASSIGN(const std::string text, HfConfigJson(biased));
  ASSERT_OK_AND_ASSIGN(const ModelConfig back, ParseHfConfig(text, kPath));
  EXPECT_EQ(back, Named(biased, kPath));
}

TEST(HfConfigTest, ExportKeepsTheOriginalsOtherKeys) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig c, ParseHfConfig(kLlama3_8B_v5, kPath));
  std::string base(kLlama3_8B_v5);
  base.insert(base.size() - 1, R"(, "bos_token_id": 128000, "eos_token_id": [128001, 128009])");
  ASSERT_OK_AND_ASSIGN(const std::string text,
                       HfConfigJson(c, {.torch_dtype = DType::kF32, .base_json = base}));
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["bos_token_id"], 128000);
  EXPECT_EQ(j["eos_token_id"], nlohmann::json::array({128001, 128009}));
  EXPECT_EQ(j["transformers_version"], "5.23.0");
  EXPECT_FALSE(j.contains("rope_parameters"));  // replaced by rope_theta / rope_scaling
  EXPECT_FALSE(j.contains("dtype"));            // replaced by torch_dtype
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseHfConfig(text, kPath));
  EXPECT_EQ(back.torch_dtype, DType::kF32);
  back.torch_dtype = c.torch_dtype;
  EXPECT_EQ(back, c);

  ASSERT_OK_AND_ASSIGN(const ModelConfig gpt, ParseHfConfig(kGpt2, kPath));
  EXPECT_THAT(
      HfConfigJson(gpt, {.torch_dtype = std::nullopt, .base_json = std::string(kLlama32_1B)}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model_type")));
  EXPECT_THAT(HfConfigJson(gpt, {.torch_dtype = std::nullopt, .base_json = "[]"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Random corruption of real files: every outcome is a valid config or a clean error naming the
// file (and, for a value replaced by one of the wrong type, the key).
TEST(HfConfigTest, RandomCorruptionIsEitherValidOrAClearError) {
  const absl::string_view originals[] = {kLlama32_1B,    kQwen25_05B, kTinyLlama,   kLlama2_7B,
                                         kMistral7B_v03, kGpt2,       kLlama3_8B_v5};
  const nlohmann::json replacements[] = {"oops",
                                         nlohmann::json::array(),
                                         nlohmann::json::object(),
                                         true,
                                         nullptr,
                                         -1,
                                         0,
                                         1.5,
                                         1e300,
                                         static_cast<uint64_t>(1) << 63,
                                         3};
  SplitMix64 rng(1414);
  int ok = 0, errors = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const absl::string_view original = originals[rng.Below(std::size(originals))];
    std::string text(original);
    std::string replaced_key;
    bool wrong_type = false;
    switch (rng.Below(5)) {
      case 0:  // truncation
        text.resize(rng.Below(text.size()));
        break;
      case 1: {  // a byte replaced by a random printable or special one
        const char bytes[] = {'"', '{', '}', ',', ':', '0', 'x', '\\', '\xff', '\0'};
        text[rng.Below(text.size())] = bytes[rng.Below(std::size(bytes))];
        break;
      }
      default: {  // a key deleted or its value replaced
        nlohmann::json j = nlohmann::json::parse(original);
        auto it = j.begin();
        std::advance(it, rng.Below(j.size()));
        replaced_key = it.key();
        if (rng.Below(3) == 0) {
          j.erase(it);
          replaced_key.clear();
        } else {
          const nlohmann::json& r = replacements[rng.Below(std::size(replacements))];
          wrong_type = r.is_string() || r.is_array() || r.is_object();
          *it = r;
        }
        text = j.dump();
        break;
      }
    }
    const absl::StatusOr<ModelConfig> c = ParseHfConfig(text, kPath);
    if (c.ok()) {
      ++ok;
      EXPECT_OK(ValidateModelConfig(*c));
      continue;
    }
    ++errors;
    EXPECT_TRUE(c.status().code() == absl::StatusCode::kInvalidArgument ||
                c.status().code() == absl::StatusCode::kUnimplemented)
        << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(kPath));
    // A wrong-typed value is reported at its own key (unless that key is one we ignore, and
    // then parsing succeeds).
    if (wrong_type) {
      EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"" + replaced_key)) << text << "\n"
                                                                                     << c.status();
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace ps
