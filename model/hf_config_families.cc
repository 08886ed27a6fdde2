// Family-specific parts of the Hugging Face config reader and writer (model/hf_config.h): the
// sliding windows of mistral, phi3, qwen2, qwen3 and smollm3, SmolLM3's NoPE layers, and Gemma
// 3's text model (gemma3_text, transformers 4.57.6's Gemma3TextConfig).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/hf_json.h"
#include "model/internal/hf_config_keys.h"
#include "model/model_config.h"
#include "nlohmann/json.hpp"

namespace ps::hf_config_internal {

absl::StatusOr<std::optional<int64_t>> SlidingWindow(const Keys& keys,
                                                     std::optional<int64_t> fallback) {
  const json* v = keys.Find("sliding_window");
  if (v == nullptr) return fallback;
  if (v->is_null()) return std::optional<int64_t>();
  ASSIGN_OR_RETURN(const int64_t w, keys.AsInt("sliding_window", *v));
  if (w <= 0) return keys.Invalid("sliding_window", absl::StrCat("must be positive, got ", w));
  return std::optional<int64_t>(w);
}

namespace {

// The layers layer_types names "sliding_attention" (each entry "full_attention" or
// "sliding_attention", one per layer); nullopt when layer_types is absent or null.
absl::StatusOr<std::optional<std::vector<bool>>> SlidingLayerTypes(const Keys& keys,
                                                                   int64_t num_layers) {
  const json* types = keys.FindNonNull("layer_types");
  if (types == nullptr) return std::optional<std::vector<bool>>();
  if (!types->is_array() || static_cast<int64_t>(types->size()) != num_layers) {
    return keys.Invalid("layer_types",
                        absl::StrCat("must be an array of ", num_layers,
                                     " strings (one per layer), got ", hf_json::Brief(*types)));
  }
  std::vector<bool> layers(static_cast<size_t>(num_layers), false);
  for (size_t i = 0; i < types->size(); ++i) {
    const json& t = (*types)[i];
    if (t == "full_attention") continue;
    if (t == "sliding_attention") {
      layers[i] = true;
      continue;
    }
    if (!t.is_string()) {
      return keys.Invalid(absl::StrCat("layer_types[", i, "]"),
                          absl::StrCat("must be a string, got ", hf_json::Brief(t)));
    }
    return keys.Unsupported(
        absl::StrCat("layer_types[", i, "]"),
        absl::StrCat("is ", hf_json::Brief(t), "; supported: full_attention, sliding_attention"));
  }
  return std::optional<std::vector<bool>>(std::move(layers));
}

}  // namespace

// Sets c.sliding_window and c.sliding_window_layers as transformers 4.57.6 applies them: mistral
// on every layer when sliding_window is not null (absent: MistralConfig's 4096); qwen2 and qwen3
// only with use_sliding_window true and a non-null sliding_window (absent: 4096), on the layers
// layer_types names "sliding_attention" (absent: those >= max_window_layers, default 28).
absl::Status ParseSlidingWindow(const Keys& keys, ModelConfig& c) {
  c.sliding_window = 0;
  c.sliding_window_layers.clear();
  if (c.family == ModelFamily::kMistral || c.family == ModelFamily::kPhi3) {
    // Phi3Config's sliding_window defaults to None (its mask then is the plain causal one).
    ASSIGN_OR_RETURN(
        const std::optional<int64_t> window,
        SlidingWindow(
            keys, c.family == ModelFamily::kPhi3 ? std::nullopt : std::optional<int64_t>(4096)));
    if (window.has_value()) {
      c.sliding_window = *window;
      c.sliding_window_layers.assign(static_cast<size_t>(c.num_layers), true);
    }
    return absl::OkStatus();
  }
  if (c.family == ModelFamily::kSmolLM3) {
    // Its eager mask takes config.sliding_window on "sliding_attention" layers whatever
    // use_sliding_window says: refuse any window rather than guess.
    ASSIGN_OR_RETURN(const bool use, keys.Bool("use_sliding_window", false));
    ASSIGN_OR_RETURN(const std::optional<int64_t> window, SlidingWindow(keys, std::nullopt));
    if (use && window.has_value()) {
      return keys.Unsupported("use_sliding_window",
                              "is true with a sliding_window: SmolLM3's sliding-window attention "
                              "is not supported");
    }
    if (const json* types = keys.FindNonNull("layer_types"); types != nullptr) {
      if (!types->is_array()) {
        return keys.Invalid("layer_types",
                            absl::StrCat("must be an array, got ", hf_json::Brief(*types)));
      }
      for (size_t i = 0; i < types->size(); ++i) {
        if ((*types)[i] != "full_attention") {
          return keys.Unsupported(absl::StrCat("layer_types[", i, "]"),
                                  absl::StrCat("is ", hf_json::Brief((*types)[i]),
                                               "; supported for smollm3: full_attention"));
        }
      }
    }
    return absl::OkStatus();
  }
  if (c.family != ModelFamily::kQwen2 && c.family != ModelFamily::kQwen3) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const bool use, keys.Bool("use_sliding_window", false));
  ASSIGN_OR_RETURN(const std::optional<int64_t> window, SlidingWindow(keys, 4096));
  int64_t max_window_layers = 28;
  if (const json* v = keys.Find("max_window_layers"); v != nullptr) {
    ASSIGN_OR_RETURN(max_window_layers, keys.AsInt("max_window_layers", *v));
    if (max_window_layers < 0) {
      return keys.Invalid("max_window_layers",
                          absl::StrCat("must be non-negative, got ", max_window_layers));
    }
  }
  // Which layers use the window: layer_types when given, else layers >= max_window_layers.
  ASSIGN_OR_RETURN(std::optional<std::vector<bool>> types, SlidingLayerTypes(keys, c.num_layers));
  std::vector<bool> layers(static_cast<size_t>(c.num_layers), false);
  if (types.has_value()) {
    layers = std::move(*types);
  } else {
    for (int64_t i = max_window_layers; i < c.num_layers; ++i) {
      layers[static_cast<size_t>(i)] = true;
    }
  }
  if (use && window.has_value() && std::find(layers.begin(), layers.end(), true) != layers.end()) {
    c.sliding_window = *window;
    c.sliding_window_layers = std::move(layers);
  }
  return absl::OkStatus();
}

// SmolLM3's NoPE layers (SmolLM3Config, transformers 4.57.6): no_rope_layers, one 1 (RoPE) or 0
// (no RoPE) per layer; absent or null: layer i has RoPE unless (i + 1) % no_rope_layer_interval
// is 0 (default interval 4).
absl::Status ParseNoRopeLayers(const Keys& keys, ModelConfig& c) {
  c.layers_without_rope.assign(static_cast<size_t>(c.num_layers), false);
  if (const json* list = keys.FindNonNull("no_rope_layers"); list != nullptr) {
    if (!list->is_array() || static_cast<int64_t>(list->size()) != c.num_layers) {
      return keys.Invalid("no_rope_layers",
                          absl::StrCat("must be an array of ", c.num_layers,
                                       " entries 1 (RoPE) or 0 (no RoPE), one per layer, got ",
                                       hf_json::Brief(*list)));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string key = absl::StrCat("no_rope_layers[", i, "]");
      ASSIGN_OR_RETURN(const int64_t v, keys.AsInt(key, (*list)[i]));
      if (v != 0 && v != 1) {
        return keys.Invalid(key, absl::StrCat("must be 1 (RoPE) or 0 (no RoPE), got ", v));
      }
      c.layers_without_rope[i] = v == 0;
    }
  } else {
    ASSIGN_OR_RETURN(const int64_t interval, keys.PositiveInt("no_rope_layer_interval", 4));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      c.layers_without_rope[static_cast<size_t>(i)] = (i + 1) % interval == 0;
    }
  }
  // All layers with RoPE is the empty list (ModelConfig's "RoPE everywhere").
  if (std::find(c.layers_without_rope.begin(), c.layers_without_rope.end(), true) ==
      c.layers_without_rope.end()) {
    c.layers_without_rope.clear();
  }
  return absl::OkStatus();
}

absl::Status ParseGemma3Text(const Keys& keys, ModelConfig& c) {
  ASSIGN_OR_RETURN(const std::string act, keys.String("hidden_activation", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh" && act != "gelu_new") {
    return keys.Unsupported("hidden_activation",
                            absl::StrCat("is \"", act,
                                         "\"; supported: gelu_pytorch_tanh (= gelu_new, the tanh "
                                         "approximation)"));
  }
  c.hidden_act = HiddenAct::kGeluTanh;
  // Attention scale query_pre_attn_scalar^-0.5: the attention kernel's is head_dim^-0.5 (every
  // Gemma 3 text model but the 27B has query_pre_attn_scalar == head_dim).
  if (const json* q = keys.Find("query_pre_attn_scalar"); q != nullptr) {
    ASSIGN_OR_RETURN(const double scalar, keys.AsNumber("query_pre_attn_scalar", *q));
    if (scalar != static_cast<double>(c.head_dim)) {
      return keys.Unsupported(
          "query_pre_attn_scalar",
          absl::StrCat("is ", hf_json::Brief(*q), "; only head_dim (", c.head_dim,
                       ") is supported (the attention scale head_dim^-0.5)"));
    }
  } else if (c.head_dim != 256) {
    return keys.Unsupported("query_pre_attn_scalar",
                            absl::StrCat("is absent (Gemma3TextConfig's default 256) but head_dim "
                                         "is ",
                                         c.head_dim, "; only head_dim is supported"));
  }
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    if (const json* v = keys.FindNonNull(cap); v != nullptr) {
      ASSIGN_OR_RETURN(const double value, keys.AsNumber(cap, *v));
      return keys.Unsupported(cap, absl::StrCat("is ", value,
                                                "; soft-capping is not supported for gemma3_text "
                                                "(null only, as every Gemma 3 checkpoint has)"));
    }
  }
  ASSIGN_OR_RETURN(const bool bidirectional, keys.Bool("use_bidirectional_attention", false));
  if (bidirectional) {
    return keys.Unsupported("use_bidirectional_attention", "is true: only causal attention");
  }
  ASSIGN_OR_RETURN(c.rope_local_base_freq, keys.PositiveNumber("rope_local_base_freq", 10000.0));
  ASSIGN_OR_RETURN(const std::optional<int64_t> window, SlidingWindow(keys, 4096));
  if (!window.has_value()) {
    return keys.Invalid("sliding_window",
                        "is null; Gemma 3's sliding layers need a window (a positive integer)");
  }
  ASSIGN_OR_RETURN(std::optional<std::vector<bool>> types, SlidingLayerTypes(keys, c.num_layers));
  std::vector<bool> layers(static_cast<size_t>(c.num_layers), false);
  if (types.has_value()) {
    layers = std::move(*types);
  } else {
    // Gemma3TextConfig: layer i slides unless (i + 1) % sliding_window_pattern == 0 (default 6).
    ASSIGN_OR_RETURN(const int64_t pattern, keys.PositiveInt("sliding_window_pattern", 6));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
    }
  }
  c.sliding_window = 0;
  c.sliding_window_layers.clear();
  if (std::find(layers.begin(), layers.end(), true) != layers.end()) {
    c.sliding_window = *window;
    c.sliding_window_layers = std::move(layers);
  }
  return absl::OkStatus();
}

void WriteGemma3Text(const ModelConfig& c, json& out) {
  out.erase("hidden_act");
  out.erase("sliding_window_pattern");  // layer_types says it
  out["hidden_activation"] = "gelu_pytorch_tanh";
  out["query_pre_attn_scalar"] = c.head_dim;
  out["final_logit_softcapping"] = nullptr;
  out["attn_logit_softcapping"] = nullptr;
  out["use_bidirectional_attention"] = false;
  out["rope_local_base_freq"] = c.rope_local_base_freq;
  if (c.sliding_window > 0) {
    out["sliding_window"] = c.sliding_window;
  } else if (!out.contains("sliding_window") || !out["sliding_window"].is_number_integer()) {
    out["sliding_window"] = 4096;  // unused: no layer slides
  }
  json types = json::array();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    types.push_back(c.LayerSlidingWindow(i) > 0 ? "sliding_attention" : "full_attention");
  }
  out["layer_types"] = std::move(types);
}

}  // namespace ps::hf_config_internal
