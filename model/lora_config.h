// LoRA (low-rank adapters) over a model of model/model_config.h: the configuration in PEFT's
// names, its validation against a model, which linear layers get adapters (LoraTargets), the
// operators of a LoRA fine-tune (a frozen base plus trainable adapter operators), the mapping
// between our tensor names and PEFT's, and PEFT's initialization of the adapters' A matrices.
//
// Semantics follow peft 0.17/0.18 (huggingface/peft, tags v0.17.1 and v0.18.1, read for this
// file):
//   - target_modules (a list) matches a module whose Hugging Face full name equals an entry or
//     ends with "." + entry (tuners_utils.check_target_module_exists), so "q_proj",
//     "self_attn.q_proj" and "model.layers.0.self_attn.q_proj" are all accepted. The single
//     entry "all-linear" (PEFT's INCLUDE_LINEAR_LAYERS_SHORTHAND, a string there) targets every
//     linear layer except the output embedding (the LM head), and, as in PEFT, not those that
//     modules_to_save names. Here every entry must match at least one linear layer; an entry
//     that matches nothing, or matches a module that is not a linear layer of a block (a norm,
//     an embedding, a container such as "self_attn", the LM head), is refused.
//   - modules_to_save matches a module whose full name ends with the entry, as a plain string
//     suffix (other.py _set_trainable: `key.endswith(target_key)`; so "norm" names every
//     *norm module, as in PEFT). Every module matched must own parameters (not a container),
//     and the operators holding them must be saved whole (Qwen3's q_norm shares the q/k/v
//     operator with the projections, so it cannot be saved alone). Tied embeddings (lm_head,
//     embed_tokens, GPT-2's wte while tie_word_embeddings) are refused: PEFT's
//     ModulesToSaveWrapper copies the module, which unties it, and the adapter would then not
//     reproduce this model.
//   - The math: y = W x (+ b) + (lora_alpha / r) B (A drop(x)); A [r, in] starts
//     Kaiming-uniform (nn.init.kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in))), B
//     [out, r] zeros. GPT-2's Conv1D layers (weights [in, out], PEFT's fan_in_fan_out) have the
//     same A and B shapes.
//
// Names. Our tensor names are Hugging Face's (model/model_config.h; GPT-2's without the
// "transformer." prefix). An adapter on module M ("model.layers.0.self_attn.q_proj",
// "h.0.attn.c_attn") has tensors "M.lora_A.weight" [r, in] and "M.lora_B.weight" [out, r], in
// the adapter operator "<base operator>.lora" (q, k and v share the base operator
// "model.layers.{i}.self_attn.qkv_proj", so its adapter operator holds up to three A/B pairs in
// q, k, v order). PEFT's names are "base_model.model." + the Hugging Face full name
// ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
// "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"); see model/peft_adapter.h.
//
// Thread safety: value types and pure functions.
#ifndef PATRICKSTAR_MODEL_LORA_CONFIG_H_
#define PATRICKSTAR_MODEL_LORA_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "chunk/operator_spec.h"
#include "model/model_config.h"

namespace ps {

// The target_modules entry that targets every linear layer but the LM head.
inline constexpr absl::string_view kLoraAllLinear = "all-linear";

// PEFT LoraConfig's names and defaults (r 8, lora_alpha 8, dropout 0, bias "none").
struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  // Module names or dotted suffixes ("q_proj", "self_attn.q_proj", ...; GPT-2 "c_attn",
  // "c_proj", "c_fc"), or the single entry "all-linear".
  std::vector<std::string> target_modules;
  std::string bias = "none";
  // Modules trained in full and saved with the adapter ("lm_head", "embed_tokens", "norm", ...).
  std::vector<std::string> modules_to_save;

  double scale() const { return lora_alpha / static_cast<double>(r); }

  friend bool operator==(const LoraConfig&, const LoraConfig&) = default;
};

// OK, or InvalidArgument saying what to change, for: r <= 0; lora_alpha not finite and
// positive; lora_dropout outside [0, 1); bias other than "none"; an empty target_modules; an
// entry of target_modules that matches no module of the model (the message lists the model's
// linear layer names, e.g. q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or
// matches a module that is not a block's linear layer; "all-linear" together with other
// entries; r larger than min(in, out) of a targeted layer (naming it and its shape); an entry of
// modules_to_save that matches no module, matches a container module, names a tied embedding,
// or covers only part of an operator; a module both targeted (by name) and saved.
// REQUIRES: ValidateModelConfig(model) is OK.
[[nodiscard]] absl::Status ValidateLoraConfig(const ModelConfig& model, const LoraConfig& lora);

// One adapted linear layer.
struct LoraTarget {
  std::string module;       // "model.layers.0.self_attn.q_proj" (our naming)
  std::string base_op;      // "model.layers.0.self_attn.qkv_proj"
  std::string base_weight;  // "model.layers.0.self_attn.q_proj.weight"
  std::string adapter_op;   // "model.layers.0.self_attn.qkv_proj.lora"
  std::string a;            // "model.layers.0.self_attn.q_proj.lora_A.weight", [r, in]
  std::string b;            // "model.layers.0.self_attn.q_proj.lora_B.weight", [out, r]
  int64_t in = 0;
  int64_t out = 0;
  bool conv1d = false;  // GPT-2's Conv1D: base weight [in, out]

  friend bool operator==(const LoraTarget&, const LoraTarget&) = default;
};

// The adapted layers in forward order (per layer: q, k, v, o, gate, up, down; GPT-2: c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj). REQUIRES: ValidateLoraConfig(model, lora) is OK.
std::vector<LoraTarget> LoraTargets(const ModelConfig& model, const LoraConfig& lora);

// The names (ours, whole tensors, forward order) of the base parameters modules_to_save covers.
// REQUIRES: ValidateLoraConfig(model, lora) is OK.
std::vector<std::string> LoraSavedTensors(const ModelConfig& model, const LoraConfig& lora);

// ModelOperators(model, vocab) with trainable = false except the operators modules_to_save
// covers, then one trainable adapter operator per base operator with targets, in forward order,
// named "<base op>.lora", holding each target's A [r, in] then B [out, r].
// REQUIRES: ValidateLoraConfig(model, lora) is OK.
std::vector<OperatorSpec> LoraModelOperators(const ModelConfig& model, const LoraConfig& lora,
                                             const VocabLayoutOptions& vocab = {});

// Our tensor name -> PEFT's: "base_model.model." + the Hugging Face full name (GPT-2: with the
// "transformer." prefix, except lm_head).
std::string PeftTensorName(const ModelConfig& model, absl::string_view our_name);

// PEFT's tensor name -> ours (the inverse of PeftTensorName). InvalidArgument for a name without
// the "base_model.model." prefix (or, for GPT-2, outside "transformer." and "lm_head").
[[nodiscard]] absl::StatusOr<std::string> TensorNameFromPeft(const ModelConfig& model,
                                                             absl::string_view peft_name);

// The linear layer names of the model's blocks, as target_modules takes them: llama-likes
// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2 c_attn, c_proj, c_fc.
std::vector<std::string> LoraLinearModuleNames(const ModelConfig& model);

// Fills `a` (an A matrix [r, in_features], row-major) with PEFT's initialization,
// U(-1/sqrt(in_features), 1/sqrt(in_features)), from stream `stream` of `seed` with
// model/parameter_init.h's scheme: a std::mt19937_64 seeded with SplitMix64(seed ^
// SplitMix64(stream)); element i is (2 u_i - 1) / sqrt(in_features) computed in double, u_i =
// (draw i >> 11) * 2^-53, rounded to float. Reproducible on every platform. The caller picks the
// stream (GptModel: the tensor's index in LoraModelOperators' order, as for base tensors).
// REQUIRES: in_features > 0.
void InitLoraA(uint64_t seed, uint64_t stream, absl::Span<float> a, int64_t in_features);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_LORA_CONFIG_H_
