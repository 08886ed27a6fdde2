#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/hf_json.h"
#include "model/internal/hf_config_keys.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using hf_config_internal::Keys;
using hf_config_internal::kWhat;
using hf_config_internal::ParseGemma3Text;
using hf_config_internal::ParseNoRopeLayers;
using hf_config_internal::ParseSlidingWindow;
using hf_config_internal::WriteGemma3Text;
using nlohmann::json;

struct FamilyInfo {
  ModelFamily family;
  const char* model_type;
  const char* architecture;
};
constexpr FamilyInfo kFamilies[] = {
    {ModelFamily::kLlama, "llama", "LlamaForCausalLM"},
    {ModelFamily::kQwen2, "qwen2", "Qwen2ForCausalLM"},
    {ModelFamily::kMistral, "mistral", "MistralForCausalLM"},
    {ModelFamily::kQwen3, "qwen3", "Qwen3ForCausalLM"},
    {ModelFamily::kSmolLM3, "smollm3", "SmolLM3ForCausalLM"},
    {ModelFamily::kOlmo2, "olmo2", "Olmo2ForCausalLM"},
    {ModelFamily::kPhi3, "phi3", "Phi3ForCausalLM"},
    {ModelFamily::kGemma3, "gemma3_text", "Gemma3ForCausalLM"},
    {ModelFamily::kGpt2, "gpt2", "GPT2LMHeadModel"},
};

// Keys whose presence (with a value other than null or 0) means a mixture-of-experts model.
constexpr const char* kMoeKeys[] = {
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
};

absl::Status CheckArchitectures(const Keys& keys, ModelFamily family) {
  const json* archs = keys.FindNonNull("architectures");
  if (archs == nullptr) return absl::OkStatus();
  if (!archs->is_array() || archs->empty()) {
    return keys.Invalid("architectures", absl::StrCat("must be a non-empty array of class names, "
                                                      "got ",
                                                      hf_json::Brief(*archs)));
  }
  const absl::string_view expected = HfArchitectureName(family);
  for (const json& a : *archs) {
    if (!a.is_string()) {
      return keys.Invalid("architectures",
                          absl::StrCat("must hold class names (strings), got ", hf_json::Brief(a)));
    }
    const std::string name = a.get<std::string>();
    if (name == expected) continue;
    for (const FamilyInfo& f : kFamilies) {
      if (name == f.architecture) {
        return keys.Invalid("architectures",
                            absl::StrCat("names ", name, ", which contradicts model_type \"",
                                         ModelFamilyName(family), "\" (expected ", expected, ")"));
      }
    }
    return keys.Unsupported("architectures", absl::StrCat("names ", name, "; only ", expected,
                                                          " is supported for model_type \"",
                                                          ModelFamilyName(family), "\""));
  }
  return absl::OkStatus();
}

absl::Status CheckNoMoeNoQuantization(const Keys& keys) {
  for (const char* key : kMoeKeys) {
    const json* v = keys.FindNonNull(key);
    if (v == nullptr) continue;
    if (v->is_number_integer() && v->get<int64_t>() == 0) continue;
    return keys.Unsupported(key, absl::StrCat("is ", hf_json::Brief(*v),
                                              ": mixture-of-experts models are not supported"));
  }
  // A bitsandbytes quantization_config describes how the weights are stored: HfCheckpoint::Open
  // reads it (model/quant4_import.h checks every key); the shapes here are the same.
  if (const json* q = keys.FindNonNull("quantization_config"); q != nullptr) {
    const auto method = q->is_object() ? q->find("quant_method") : q->end();
    const bool bitsandbytes =
        q->is_object() && (method == q->end() ||
                           (method->is_string() && method->get<std::string>() == "bitsandbytes"));
    if (!bitsandbytes) {
      return keys.Unsupported(
          "quantization_config",
          absl::StrCat("is ", hf_json::Brief(*q),
                       ": only bitsandbytes 4-bit directories are supported (quant_method "
                       "\"bitsandbytes\"), or use the model's unquantized weights"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<DType>> ParseTorchDType(const Keys& keys) {
  const char* key = "dtype";
  const json* v = keys.FindNonNull(key);
  if (v == nullptr) {
    key = "torch_dtype";
    v = keys.FindNonNull(key);
  }
  if (v == nullptr) return std::optional<DType>();
  if (!v->is_string()) {
    return keys.Invalid(
        key, absl::StrCat("must be a string such as \"bfloat16\", got ", hf_json::Brief(*v)));
  }
  const std::string name = v->get<std::string>();
  if (name == "float32") return std::optional<DType>(DType::kF32);
  if (name == "float16") return std::optional<DType>(DType::kF16);
  if (name == "bfloat16") return std::optional<DType>(DType::kBF16);
  return keys.Unsupported(key,
                          absl::StrCat("is \"", name, "\"; supported: float32, float16, bfloat16"));
}

// Returns the key among {canonical, alias} that is present (canonical when neither is), refusing
// the two with different values.
absl::StatusOr<const char*> CanonicalOrAlias(const Keys& keys, const char* canonical,
                                             const char* alias) {
  const json* c = keys.Find(canonical);
  const json* a = keys.Find(alias);
  if (c != nullptr && a != nullptr && *c != *a) {
    return keys.Invalid(
        alias, absl::StrCat("is ", hf_json::Brief(*a), " but \"", canonical,
                            "\" (the same setting in GPT-2's naming) is ", hf_json::Brief(*c)));
  }
  return c == nullptr && a != nullptr ? alias : canonical;
}

absl::StatusOr<ModelConfig> ParseGpt2(const Keys& keys, ModelConfig c) {
  ASSIGN_OR_RETURN(c.vocab_size, keys.PositiveInt("vocab_size", 50257));
  ASSIGN_OR_RETURN(const char* positions_key,
                   CanonicalOrAlias(keys, "n_positions", "max_position_embeddings"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, keys.PositiveInt(positions_key, 1024));
  ASSIGN_OR_RETURN(const char* embd_key, CanonicalOrAlias(keys, "n_embd", "hidden_size"));
  ASSIGN_OR_RETURN(c.hidden_size, keys.PositiveInt(embd_key, 768));
  ASSIGN_OR_RETURN(const char* layer_key, CanonicalOrAlias(keys, "n_layer", "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_layers, keys.PositiveInt(layer_key, 12));
  ASSIGN_OR_RETURN(const char* head_key, CanonicalOrAlias(keys, "n_head", "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_heads, keys.PositiveInt(head_key, 12));
  if (c.hidden_size % c.num_heads != 0) {
    return keys.Invalid(
        head_key, absl::StrCat(c.num_heads, " does not divide ", embd_key, " ", c.hidden_size));
  }
  c.num_kv_heads = c.num_heads;
  c.head_dim = c.hidden_size / c.num_heads;
  ASSIGN_OR_RETURN(const std::optional<int64_t> n_inner, keys.OptionalPositiveInt("n_inner"));
  c.intermediate_size = n_inner.value_or(4 * c.hidden_size);
  ASSIGN_OR_RETURN(const std::string act, keys.String("activation_function", "gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return keys.Unsupported("activation_function",
                            absl::StrCat("is \"", act,
                                         "\"; supported: gelu_new, gelu_pytorch_tanh (GELU with "
                                         "the tanh approximation)"));
  }
  c.hidden_act = HiddenAct::kGeluTanh;
  ASSIGN_OR_RETURN(c.norm_eps, keys.PositiveNumber("layer_norm_epsilon", 1e-5));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, keys.Bool("tie_word_embeddings", true));
  if (!c.tie_word_embeddings) {
    return keys.Unsupported("tie_word_embeddings",
                            "is false: GPT-2's LM head is supported only tied to wte");
  }
  ASSIGN_OR_RETURN(const bool scale_attn_weights, keys.Bool("scale_attn_weights", true));
  if (!scale_attn_weights) {
    return keys.Unsupported("scale_attn_weights",
                            "is false: attention without the 1/sqrt(head_dim) scale is not "
                            "supported");
  }
  ASSIGN_OR_RETURN(const bool by_layer, keys.Bool("scale_attn_by_inverse_layer_idx", false));
  if (by_layer) {
    return keys.Unsupported("scale_attn_by_inverse_layer_idx", "is true: not supported");
  }
  ASSIGN_OR_RETURN(const bool cross, keys.Bool("add_cross_attention", false));
  if (cross) return keys.Unsupported("add_cross_attention", "is true: not supported");
  c.qkv_bias = c.o_proj_bias = c.mlp_bias = true;
  c.rope_theta = 10000;
  return c;
}

// Phi-3's longrope: rope_scaling {"type": "longrope", "short_factor": [...], "long_factor":
// [...]} (exactly those keys, as Phi3Config requires), each rotary_dim / 2 numbers, and the
// top-level original_max_position_embeddings (Phi3Config's default 4096).
absl::Status ParseLongRope(const Keys& keys, const json& rope, const char* rope_key,
                           ModelConfig& c) {
  auto sub = [&](absl::string_view k) { return absl::StrCat(rope_key, ".", k); };
  for (const auto& [key, value] : rope.items()) {
    if (key != "type" && key != "rope_type" && key != "short_factor" && key != "long_factor") {
      return keys.Unsupported(sub(key),
                              "is not a key of Phi-3's longrope (type, short_factor, "
                              "long_factor)");
    }
  }
  RopeScaling rs;
  rs.type = RopeScalingType::kLongRope;
  ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                   keys.PositiveInt("original_max_position_embeddings", 4096));
  for (const auto& [name, field] :
       {std::pair<const char*, std::vector<double>*>{"short_factor", &rs.short_factor},
        {"long_factor", &rs.long_factor}}) {
    const auto it = rope.find(name);
    if (it == rope.end() || !it->is_array()) {
      return keys.Invalid(sub(name), "must be a list of numbers (one per rotated pair)");
    }
    for (const json& v : *it) {
      ASSIGN_OR_RETURN(const double f, keys.AsNumber(sub(name), v));
      if (!std::isfinite(f) || f <= 0) {
        return keys.Invalid(
            sub(name), absl::StrCat("entries must be positive numbers, got ", hf_json::Brief(v)));
      }
      field->push_back(f);
    }
    if (static_cast<int64_t>(field->size()) != c.rotary_dim() / 2) {
      return keys.Invalid(
          sub(name), absl::StrCat("has ", field->size(),
                                  " entries; rotary_dim / 2 = ", c.rotary_dim() / 2, " needed"));
    }
  }
  c.rope_scaling = std::move(rs);
  return absl::OkStatus();
}

absl::Status ParseRope(const Keys& keys, ModelConfig& c) {
  const char* rope_key = "rope_scaling";
  const json* rope = keys.FindNonNull(rope_key);
  if (rope == nullptr || (rope->is_object() && rope->empty())) {
    rope_key = "rope_parameters";
    rope = keys.FindNonNull(rope_key);
  }
  if (rope != nullptr && !rope->is_object()) {
    return keys.Invalid(
        rope_key, absl::StrCat("must be an object or null, got ", hf_json::TypeName(*rope), " ",
                               hf_json::Brief(*rope)));
  }
  auto sub = [&](absl::string_view k) { return absl::StrCat(rope_key, ".", k); };

  std::optional<double> top_theta;
  if (const json* t = keys.Find("rope_theta"); t != nullptr) {
    ASSIGN_OR_RETURN(top_theta, keys.PositiveNumber("rope_theta", 0));
  }
  std::optional<double> inner_theta;
  std::string type = "default";
  const char* type_key = "rope_type";
  const json no_rope = json::object();
  const Keys inner(rope == nullptr ? no_rope : *rope, keys.path());
  if (rope != nullptr) {
    for (const char* nested : {"full_attention", "sliding_attention"}) {
      if (rope->contains(nested)) {
        return keys.Unsupported(rope_key,
                                "holds per-layer-type rope parameters, which are not "
                                "supported");
      }
    }
    type_key = rope->contains("rope_type") ? "rope_type" : "type";
    if (const json* t = inner.Find(type_key); t != nullptr) {
      if (!t->is_string()) {
        return keys.Invalid(sub(type_key),
                            absl::StrCat("must be a string, got ", hf_json::Brief(*t)));
      }
      type = t->get<std::string>();
    }
    if (const json* t = inner.Find("rope_theta"); t != nullptr) {
      ASSIGN_OR_RETURN(const double theta, keys.AsNumber(sub("rope_theta"), *t));
      if (!std::isfinite(theta) || theta <= 0) {
        return keys.Invalid(sub("rope_theta"),
                            absl::StrCat("must be a positive number, got ", hf_json::Brief(*t)));
      }
      inner_theta = theta;
    }
    if (const json* p = inner.FindNonNull("partial_rotary_factor"); p != nullptr) {
      ASSIGN_OR_RETURN(const double f, keys.AsNumber(sub("partial_rotary_factor"), *p));
      if (f != 1.0) {
        return keys.Unsupported(sub("partial_rotary_factor"),
                                absl::StrCat("is ", f, ": partial RoPE is not supported"));
      }
    }
  }
  if (top_theta.has_value() && inner_theta.has_value() && *top_theta != *inner_theta) {
    return keys.Invalid("rope_theta", absl::StrCat("is ", *top_theta, " but ", sub("rope_theta"),
                                                   " is ", *inner_theta));
  }
  // SmolLM3Config's default is 2e6, Gemma3TextConfig's 1e6; the others' 10000.
  c.rope_theta =
      inner_theta.value_or(top_theta.value_or(c.family == ModelFamily::kSmolLM3  ? 2000000.0
                                              : c.family == ModelFamily::kGemma3 ? 1000000.0
                                                                                 : 10000.0));

  if (type == "default") {
    c.rope_scaling = RopeScaling{};
    return absl::OkStatus();
  }
  const bool phi3 = c.family == ModelFamily::kPhi3;
  // Phi3Config renames the older "su" and "yarn" to "longrope".
  if (type == "longrope" || (phi3 && (type == "su" || type == "yarn"))) {
    if (!phi3) {
      return keys.Unsupported(sub("rope_type"), absl::StrCat("is \"", type,
                                                             "\": longrope is supported for phi3 "
                                                             "only; supported: default, llama3"));
    }
    return ParseLongRope(keys, *rope, rope_key, c);
  }
  if (type == "linear" && c.family == ModelFamily::kGemma3) {
    // Gemma 3 4B and up: inv_freq / factor on the global layers.
    const json* f = inner.FindNonNull("factor");
    if (f == nullptr) return keys.Invalid(sub("factor"), "is required for rope_type linear");
    RopeScaling rs;
    rs.type = RopeScalingType::kLinear;
    ASSIGN_OR_RETURN(rs.factor, keys.AsNumber(sub("factor"), *f));
    if (!std::isfinite(rs.factor) || rs.factor < 1) {
      return keys.Invalid(sub("factor"), absl::StrCat("must be >= 1, got ", rs.factor));
    }
    c.rope_scaling = rs;
    return absl::OkStatus();
  }
  if (type != "llama3") {
    return keys.Unsupported(sub("rope_type"),
                            absl::StrCat("is \"", type, "\"; supported: default, llama3",
                                         phi3 ? ", longrope (su, yarn)" : ""));
  }
  RopeScaling rs;
  rs.type = RopeScalingType::kLlama3;
  for (auto [name, field] : {std::pair<const char*, double*>{"factor", &rs.factor},
                             {"low_freq_factor", &rs.low_freq_factor},
                             {"high_freq_factor", &rs.high_freq_factor}}) {
    const json* v = inner.FindNonNull(name);
    if (v == nullptr) return keys.Invalid(sub(name), "is required for rope_type llama3");
    ASSIGN_OR_RETURN(*field, keys.AsNumber(sub(name), *v));
  }
  // transformers 5: a top-level original_max_position_embeddings wins, then the rope object's,
  // then max_position_embeddings.
  if (const json* v = keys.FindNonNull("original_max_position_embeddings"); v != nullptr) {
    ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                     keys.AsInt("original_max_position_embeddings", *v));
  } else if (const json* w = inner.FindNonNull("original_max_position_embeddings"); w != nullptr) {
    ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                     keys.AsInt(sub("original_max_position_embeddings"), *w));
  } else {
    rs.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (!std::isfinite(rs.factor) || rs.factor < 1) {
    return keys.Invalid(sub("factor"), absl::StrCat("must be >= 1, got ", rs.factor));
  }
  if (!std::isfinite(rs.low_freq_factor) || rs.low_freq_factor <= 0) {
    return keys.Invalid(sub("low_freq_factor"),
                        absl::StrCat("must be positive, got ", rs.low_freq_factor));
  }
  if (!std::isfinite(rs.high_freq_factor) || rs.high_freq_factor <= rs.low_freq_factor) {
    return keys.Invalid(sub("high_freq_factor"),
                        absl::StrCat("must exceed low_freq_factor ", rs.low_freq_factor, ", got ",
                                     rs.high_freq_factor));
  }
  if (rs.original_max_position_embeddings <= 0) {
    return keys.Invalid(
        sub("original_max_position_embeddings"),
        absl::StrCat("must be positive, got ", rs.original_max_position_embeddings));
  }
  c.rope_scaling = rs;
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseLlamaLike(const Keys& keys, ModelConfig c) {
  int64_t default_vocab = 32000, default_inter = 11008, default_positions = 2048;
  if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3) {
    // Qwen2Config's and Qwen3Config's defaults.
    default_vocab = 151936;
    default_inter = 22016;
    default_positions = 32768;
  } else if (c.family == ModelFamily::kMistral) {
    default_inter = 14336;
    default_positions = 131072;
  } else if (c.family == ModelFamily::kSmolLM3) {
    // SmolLM3Config's defaults.
    default_vocab = 128256;
    default_positions = 32768;
  } else if (c.family == ModelFamily::kOlmo2) {
    // Olmo2Config's defaults (hidden, intermediate, layers, heads as llama's).
    default_vocab = 50304;
  } else if (c.family == ModelFamily::kPhi3) {
    // Phi3Config's defaults (Phi-3-mini's shape): hidden 3072, 32 layers, 32 heads.
    default_vocab = 32064;
    default_inter = 8192;
    default_positions = 4096;
  } else if (c.family == ModelFamily::kGemma3) {
    // Gemma3TextConfig's defaults (gemma-2-2b's shape): hidden 2304, 26 layers, 8 heads.
    default_vocab = 262208;
    default_inter = 9216;
    default_positions = 131072;
  }
  const bool gemma3 = c.family == ModelFamily::kGemma3;
  const int64_t default_hidden = c.family == ModelFamily::kSmolLM3 ? 2048
                                 : c.family == ModelFamily::kPhi3  ? 3072
                                 : gemma3                          ? 2304
                                                                   : 4096;
  const int64_t default_layers = c.family == ModelFamily::kSmolLM3 ? 36 : gemma3 ? 26 : 32;
  const int64_t default_heads = c.family == ModelFamily::kSmolLM3 ? 16 : gemma3 ? 8 : 32;
  ASSIGN_OR_RETURN(c.vocab_size, keys.PositiveInt("vocab_size", default_vocab));
  ASSIGN_OR_RETURN(c.hidden_size, keys.PositiveInt("hidden_size", default_hidden));
  ASSIGN_OR_RETURN(c.intermediate_size, keys.PositiveInt("intermediate_size", default_inter));
  ASSIGN_OR_RETURN(c.num_layers, keys.PositiveInt("num_hidden_layers", default_layers));
  ASSIGN_OR_RETURN(c.num_heads, keys.PositiveInt("num_attention_heads", default_heads));
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   keys.PositiveInt("max_position_embeddings", default_positions));
  // num_key_value_heads: absent means the family's default, null means "= heads".
  int64_t default_kv = c.num_heads;
  if (keys.Find("num_key_value_heads") == nullptr) {
    if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3) default_kv = 32;
    if (c.family == ModelFamily::kMistral) default_kv = 8;
    if (c.family == ModelFamily::kSmolLM3) default_kv = 4;
    if (gemma3) default_kv = 4;
  }
  ASSIGN_OR_RETURN(c.num_kv_heads, keys.PositiveInt("num_key_value_heads", default_kv,
                                                    /*null_is_default=*/true));
  if (c.num_heads % c.num_kv_heads != 0) {
    return keys.Invalid(
        "num_key_value_heads",
        absl::StrCat(c.num_kv_heads, " does not divide num_attention_heads ", c.num_heads));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, keys.OptionalPositiveInt("head_dim"));
  // Qwen3Config's head_dim defaults to 128 whatever hidden_size / num_attention_heads is.
  if (!head_dim.has_value() && c.family == ModelFamily::kQwen3) head_dim = 128;
  // Gemma3TextConfig's head_dim defaults to 256.
  if (!head_dim.has_value() && gemma3) head_dim = 256;
  const bool divisible = c.hidden_size % c.num_heads == 0;
  if (!divisible && (!head_dim.has_value() || c.family == ModelFamily::kLlama)) {
    return keys.Invalid("num_attention_heads",
                        absl::StrCat(c.num_heads, " does not divide hidden_size ", c.hidden_size,
                                     c.family == ModelFamily::kLlama ? ""
                                                                     : " and head_dim is not "
                                                                       "set"));
  }
  c.head_dim = head_dim.value_or(c.hidden_size / c.num_heads);
  if (c.head_dim % 2 != 0) {
    return keys.Invalid(head_dim.has_value() ? "head_dim" : "num_attention_heads",
                        absl::StrCat("gives head_dim ", c.head_dim,
                                     ", which is odd; RoPE rotates pairs of channels"));
  }
  // Olmo2Config's and Phi3Config's rms_norm_eps default to 1e-5; the others' to 1e-6.
  ASSIGN_OR_RETURN(
      c.norm_eps,
      keys.PositiveNumber(
          "rms_norm_eps",
          c.family == ModelFamily::kOlmo2 || c.family == ModelFamily::kPhi3 ? 1e-5 : 1e-6));
  if (!gemma3) {  // Gemma 3's activation key is hidden_activation (ParseGemma3Text)
    ASSIGN_OR_RETURN(const std::string act, keys.String("hidden_act", "silu"));
    if (act != "silu" && act != "swish") {
      return keys.Unsupported("hidden_act",
                              absl::StrCat("is \"", act, "\"; supported: silu (= swish)"));
    }
    c.hidden_act = HiddenAct::kSilu;
  }
  // SmolLM3Config and Gemma3TextConfig leave tie_word_embeddings to PretrainedConfig, whose
  // default is true.
  ASSIGN_OR_RETURN(c.tie_word_embeddings,
                   keys.Bool("tie_word_embeddings", c.family == ModelFamily::kSmolLM3 || gemma3));
  switch (c.family) {
    case ModelFamily::kQwen3:
    case ModelFamily::kGemma3:
    case ModelFamily::kOlmo2: {
      ASSIGN_OR_RETURN(const bool attention_bias, keys.Bool("attention_bias", false));
      c.qkv_bias = c.o_proj_bias = attention_bias;
      break;
    }
    case ModelFamily::kLlama:
    case ModelFamily::kSmolLM3: {
      ASSIGN_OR_RETURN(const bool attention_bias, keys.Bool("attention_bias", false));
      c.qkv_bias = c.o_proj_bias = attention_bias;
      ASSIGN_OR_RETURN(c.mlp_bias, keys.Bool("mlp_bias", false));
      break;
    }
    case ModelFamily::kQwen2:
      c.qkv_bias = true;
      break;
    default:
      break;
  }
  if (const json* p = keys.FindNonNull("partial_rotary_factor"); p != nullptr) {
    ASSIGN_OR_RETURN(const double f, keys.AsNumber("partial_rotary_factor", *p));
    if (c.family == ModelFamily::kPhi3) {
      // Phi3Config: RoPE on the first int(head_dim * factor) channels of each head.
      c.partial_rotary_factor = f;
      if (!(f > 0 && f <= 1) || c.rotary_dim() <= 0 || c.rotary_dim() % 2 != 0) {
        return keys.Invalid("partial_rotary_factor",
                            absl::StrCat("is ", f, ", which gives ", c.rotary_dim(),
                                         " rotated channels of head_dim ", c.head_dim,
                                         "; it must be in (0, 1] and give a positive even "
                                         "number"));
      }
    } else if (f != 1.0) {
      return keys.Unsupported("partial_rotary_factor",
                              absl::StrCat("is ", f,
                                           ": partial RoPE is not supported (phi3 "
                                           "only)"));
    }
  }
  RETURN_IF_ERROR(ParseRope(keys, c));
  RETURN_IF_ERROR(ParseSlidingWindow(keys, c));
  if (gemma3) RETURN_IF_ERROR(ParseGemma3Text(keys, c));
  if (c.family == ModelFamily::kSmolLM3) RETURN_IF_ERROR(ParseNoRopeLayers(keys, c));
  return c;
}

}  // namespace

absl::string_view HfArchitectureName(ModelFamily family) {
  for (const FamilyInfo& f : kFamilies) {
    if (f.family == family) return f.architecture;
  }
  return "unknown";
}

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text, absl::string_view path) {
  ASSIGN_OR_RETURN(const json object, hf_json::ParseObject(json_text, kWhat, path,
                                                           absl::StatusCode::kInvalidArgument));
  const Keys keys(object, path);
  const json* type = keys.Find("model_type");
  if (type == nullptr) {
    return keys.Invalid("model_type",
                        "is missing; a Hugging Face config names its model type "
                        "(\"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"smollm3\", \"olmo2\", "
                        "\"phi3\", \"gemma3_text\" or \"gpt2\")");
  }
  if (!type->is_string()) {
    return keys.Invalid("model_type",
                        absl::StrCat("must be a string, got ", hf_json::Brief(*type)));
  }
  const std::string model_type = type->get<std::string>();
  const FamilyInfo* info = nullptr;
  for (const FamilyInfo& f : kFamilies) {
    if (model_type == f.model_type) info = &f;
  }
  if (info == nullptr && model_type == "gemma3") {
    // Gemma3ForConditionalGeneration: the text model sits under "text_config" with a vision
    // tower beside it.
    return keys.Unsupported(
        "model_type",
        "is \"gemma3\", the multimodal Gemma 3 (Gemma3ForConditionalGeneration); "
        "the text model is supported: model_type \"gemma3_text\" "
        "(Gemma3ForCausalLM, e.g. gemma-3-1b)");
  }
  if (info == nullptr) {
    return keys.Unsupported(
        "model_type",
        absl::StrCat("is \"", model_type,
                     "\"; supported: llama, qwen2, qwen3, mistral, smollm3, olmo2, phi3, "
                     "gemma3_text, gpt2"));
  }
  RETURN_IF_ERROR(CheckArchitectures(keys, info->family));
  RETURN_IF_ERROR(CheckNoMoeNoQuantization(keys));
  ModelConfig c;
  c.name = std::string(path);
  c.family = info->family;
  ASSIGN_OR_RETURN(c.torch_dtype, ParseTorchDType(keys));
  if (c.family == ModelFamily::kGpt2) {
    ASSIGN_OR_RETURN(c, ParseGpt2(keys, std::move(c)));
  } else {
    ASSIGN_OR_RETURN(c, ParseLlamaLike(keys, std::move(c)));
  }
  if (absl::Status valid = ValidateModelConfig(c); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, " '", path, "': ", valid.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, hf_json::ReadTextFile(path, kWhat));
  return ParseHfConfig(text, path);
}

absl::StatusOr<std::string> HfConfigJson(const ModelConfig& c, const HfConfigJsonOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(c));
  json out = json::object();
  if (!options.base_json.empty()) {
    ASSIGN_OR_RETURN(out, hf_json::ParseObject(options.base_json, "base config.json",
                                               "(HfConfigJsonOptions::base_json)",
                                               absl::StatusCode::kInvalidArgument));
    if (const auto it = out.find("model_type");
        it != out.end() && *it != std::string(ModelFamilyName(c.family))) {
      return absl::InvalidArgumentError(absl::StrCat("base config.json has model_type ",
                                                     hf_json::Brief(*it), " but the model is ",
                                                     ModelFamilyName(c.family)));
    }
  }
  for (const char* stale : {"rope_parameters", "dtype", "torch_dtype"}) out.erase(stale);
  out["architectures"] = json::array({std::string(HfArchitectureName(c.family))});
  out["model_type"] = std::string(ModelFamilyName(c.family));
  out["vocab_size"] = c.vocab_size;
  if (c.family == ModelFamily::kGpt2) {
    for (const char* alias :
         {"hidden_size", "max_position_embeddings", "num_attention_heads", "num_hidden_layers"}) {
      out.erase(alias);
    }
    out["n_positions"] = c.max_position_embeddings;
    if (out.contains("n_ctx")) out["n_ctx"] = c.max_position_embeddings;
    out["n_embd"] = c.hidden_size;
    out["n_layer"] = c.num_layers;
    out["n_head"] = c.num_heads;
    out["n_inner"] =
        c.intermediate_size == 4 * c.hidden_size ? json(nullptr) : json(c.intermediate_size);
    out["activation_function"] = "gelu_new";
    out["layer_norm_epsilon"] = c.norm_eps;
    out["tie_word_embeddings"] = true;
  } else {
    out["hidden_size"] = c.hidden_size;
    out["intermediate_size"] = c.intermediate_size;
    out["num_hidden_layers"] = c.num_layers;
    out["num_attention_heads"] = c.num_heads;
    out["num_key_value_heads"] = c.num_kv_heads;
    out["head_dim"] = c.head_dim;
    out["max_position_embeddings"] = c.max_position_embeddings;
    out["rms_norm_eps"] = c.norm_eps;
    out["rope_theta"] = c.rope_theta;
    // Now inside rope_scaling (phi3 keeps it at the top: longrope's, or unused without it).
    if (c.family != ModelFamily::kPhi3) out.erase("original_max_position_embeddings");
    out.erase("partial_rotary_factor");             // only 1 was accepted
    if (c.rope_scaling.type == RopeScalingType::kLlama3) {
      out["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    } else if (c.rope_scaling.type == RopeScalingType::kLinear) {
      out["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
    } else if (c.rope_scaling.type == RopeScalingType::kLongRope) {
      out["rope_scaling"] = {{"type", "longrope"},
                             {"short_factor", c.rope_scaling.short_factor},
                             {"long_factor", c.rope_scaling.long_factor}};
      out["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    } else {
      out["rope_scaling"] = nullptr;
    }
    if (c.family == ModelFamily::kGemma3) {
      WriteGemma3Text(c, out);
    } else {
      out["hidden_act"] = "silu";
    }
    out["tie_word_embeddings"] = c.tie_word_embeddings;
    if (c.family == ModelFamily::kLlama) {
      out["attention_bias"] = c.qkv_bias;
      out["mlp_bias"] = c.mlp_bias;
    } else if (c.family == ModelFamily::kMistral || c.family == ModelFamily::kPhi3) {
      out["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    }
    if (c.family == ModelFamily::kPhi3) out["partial_rotary_factor"] = c.partial_rotary_factor;
    if (c.family == ModelFamily::kQwen3 || c.family == ModelFamily::kOlmo2 ||
        c.family == ModelFamily::kGemma3) {
      out["attention_bias"] = c.qkv_bias;
    }
    if (c.family == ModelFamily::kSmolLM3) {
      out["attention_bias"] = c.qkv_bias;
      out["mlp_bias"] = c.mlp_bias;
      out["use_sliding_window"] = false;
      out["sliding_window"] = nullptr;
      json no_rope = json::array();
      for (int64_t i = 0; i < c.num_layers; ++i) no_rope.push_back(c.LayerHasRope(i) ? 1 : 0);
      out["no_rope_layers"] = std::move(no_rope);
    }
    if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3) {
      out["use_sliding_window"] = c.sliding_window > 0;
      // Without a window a base's layer_types stays (transformers ignores it when
      // use_sliding_window is false).
      if (c.sliding_window > 0) {
        // layer_types says which layers slide (transformers >= 4.53 reads it); max_window_layers
        // is the first of them, which says the same to older versions when the sliding layers
        // are the last ones (Qwen2's own convention).
        const auto first = std::find(c.sliding_window_layers.begin(),
                                     c.sliding_window_layers.end(), true);
        out["sliding_window"] = c.sliding_window;
        out["max_window_layers"] = first - c.sliding_window_layers.begin();
        json types = json::array();
        for (const bool sliding : c.sliding_window_layers) {
          types.push_back(sliding ? "sliding_attention" : "full_attention");
        }
        out["layer_types"] = std::move(types);
      }
    }
  }
  const std::optional<DType> dtype =
      options.torch_dtype.has_value() ? options.torch_dtype : c.torch_dtype;
  if (dtype.has_value()) {
    out["torch_dtype"] = *dtype == DType::kF32   ? "float32"
                         : *dtype == DType::kF16 ? "float16"
                                                 : "bfloat16";
  }
  return out.dump(2) + "\n";
}

}  // namespace ps
