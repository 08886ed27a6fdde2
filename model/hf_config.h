// Hugging Face config.json <-> ModelConfig, for the families of model/model_config.h.
//
// Reading. config.json must name a supported "model_type" — "llama", "qwen2", "qwen3", "mistral",
// "smollm3", "olmo2", "phi3", "gemma3_text", "gpt2" — and, if it has "architectures", the
// causal-LM class of that type (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// MistralForCausalLM, SmolLM3ForCausalLM, Olmo2ForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM,
// GPT2LMHeadModel). The multimodal Gemma 3 (model_type "gemma3") is refused, saying the text
// model is supported. Keys are read under the names and with the defaults of
// transformers' config classes (LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig, GPT2Config;
// checked against transformers 5.23 and 4.57.6, which agree on these; qwen3 has qwen2's defaults
// unless stated;
// SmolLM3Config of 4.57.6: vocab 128256, hidden 2048, 36 layers, 16 heads, 4 kv heads, 32768
// positions, rope_theta 2e6, tied, otherwise llama's; Olmo2Config of 4.57.6: vocab 50304,
// rms_norm_eps 1e-5, otherwise llama's; Phi3Config of 4.57.6: vocab 32064, hidden 3072,
// intermediate 8192, 4096 positions, rms_norm_eps 1e-5, no biases, sliding_window null,
// otherwise llama's):
//
//   key (gpt2 name)                        default when absent
//   vocab_size                             llama 32000, qwen2 151936, mistral 32000, gpt2 50257
//   hidden_size (n_embd)                   4096 (gpt2 768)
//   intermediate_size (n_inner)            llama 11008, qwen2 22016, mistral 14336; gpt2: null=4E
//   num_hidden_layers (n_layer)            32 (gpt2 12)
//   num_attention_heads (n_head)           32 (gpt2 12)
//   num_key_value_heads                    llama: = heads, qwen2 32, mistral 8 (null: = heads)
//   head_dim                               hidden_size / num_attention_heads (null: the same);
//                                          qwen3 128
//   max_position_embeddings (n_positions)  llama 2048, qwen2 32768, mistral 131072 (gpt2 1024)
//   rms_norm_eps (layer_norm_epsilon)      1e-6 (gpt2 1e-5)
//   rope_theta                             10000.0
//   rope_scaling / rope_parameters         none
//   hidden_act (activation_function)       "silu" (gpt2 "gelu_new")
//   tie_word_embeddings                    false (gpt2 true)
//   attention_bias (llama, qwen3, smollm3, false
//   olmo2)
//   mlp_bias (llama, smollm3)              false
//   no_rope_layers (smollm3)               1 (RoPE) or 0 (none) per layer; absent or null: 0 on
//   no_rope_layer_interval (smollm3)       layers with (i + 1) % interval == 0 (interval 4)
//   sliding_window                         mistral 4096 (every layer; null: none); qwen2, qwen3
//   use_sliding_window, max_window_layers, 4096 but only with use_sliding_window (false), on the
//   layer_types                            layers layer_types names "sliding_attention", else
//                                          those >= max_window_layers (28) — as transformers
//                                          4.57.6 applies them (ModelConfig::sliding_window)
//   partial_rotary_factor (phi3)           1 (RoPE on the first int(head_dim * factor) channels;
//                                          other families: only 1 is accepted)
//   sliding_window (phi3)                  null (a window on every layer when set)
//   rope_scaling longrope (phi3)           {"type": "longrope" (or "su", "yarn"), "short_factor",
//   original_max_position_embeddings       "long_factor"}: rotary_dim / 2 numbers each, exactly
//                                          these keys (Phi3Config's rule); the top-level
//                                          original_max_position_embeddings, default 4096
//   gemma3_text (Gemma3TextConfig of 4.57.6: vocab 262208, hidden 2304, intermediate 9216, 26
//   layers, 8 heads, 4 kv heads, head_dim 256, 131072 positions, rope_theta 1e6, tied):
//   hidden_activation                      "gelu_pytorch_tanh" (or gelu_new; others refused)
//   query_pre_attn_scalar                  256; only head_dim is supported
//   final_/attn_logit_softcapping          null; a number is refused (Unimplemented)
//   sliding_window, layer_types,           4096 on the layers layer_types names
//   sliding_window_pattern                 "sliding_attention", else those with
//                                          (i + 1) % pattern != 0 (pattern 6); null refused
//   rope_local_base_freq                   10000.0 (the sliding layers' RoPE base)
//   use_bidirectional_attention            false; true refused
//   torch_dtype / dtype                    none ("dtype", transformers 5's name, wins)
// gpt2 also accepts its attribute-map aliases (hidden_size for n_embd, max_position_embeddings for
// n_positions, num_attention_heads for n_head, num_hidden_layers for n_layer), which must agree
// with the canonical key when both are present. RoPE parameters follow transformers 5: the
// "rope_scaling" object (transformers 4's name) if non-empty, else "rope_parameters"; its
// "rope_type" (or legacy "type"); rope_theta from inside it, else the top-level "rope_theta"
// (both present and different is an error); llama3's original_max_position_embeddings from a
// top-level key of that name, else from inside, else max_position_embeddings.
// Keys this project has no use for (bos/eos ids, initializer_range, dropout rates, use_cache,
// pretraining_tp, ...) are ignored; dropout is not modeled (as in the GPT-2 model).
//
// Refused, naming the file and the key:
//   InvalidArgument  not JSON, not an object, a repeated key, a value of the wrong type (an
//                    integer that is a string or 4096.5, a boolean that is 1, ...), a size that is
//                    not positive, num_key_value_heads that does not divide num_attention_heads,
//                    hidden_size not divisible by the heads (llama always, as transformers 5's
//                    LlamaConfig; qwen2 and mistral only when head_dim is absent), an
//                    architectures entry that contradicts model_type, rope_theta disagreeing with
//                    rope_parameters.rope_theta, a missing llama3 parameter, a sliding_window that
//                    is not a positive integer or null, layer_types not one string per layer,
//                    no_rope_layers not one 0 or 1 per layer,
//                    everything ValidateModelConfig refuses (with the config key's name).
//   Unimplemented    a model_type or architecture outside the five; a layer_types entry other
//                    than full_attention and sliding_attention (smollm3: any but full_attention,
//                    and use_sliding_window true with a window); mixture of experts (num_experts,
//                    num_local_experts, num_experts_per_tok, n_routed_experts, n_shared_experts,
//                    moe_intermediate_size, shared_expert_intermediate_size set to anything but
//                    null or 0); a rope type other than "default" and "llama3" (linear, dynamic,
//                    yarn, longrope, ...); per-layer-type rope parameters; partial_rotary_factor
//                    other than 1; an activation other than silu/swish (llama-likes) or
//                    gelu_new/gelu_pytorch_tanh (gpt2); quantization_config; a dtype other than
//                    float32/float16/bfloat16; gpt2 with scale_attn_weights false,
//                    scale_attn_by_inverse_layer_idx true or add_cross_attention true.
// Accepted, by decision: head_dim different from hidden_size / num_attention_heads (Mistral-Nemo
// style; every shape follows q_size() and kv_size()); attention_bias and mlp_bias true for llama
// (the biases are ordinary parameters of ModelOperators; a model that does not compute them must
// refuse such a config itself); gpt2 layer_norm_epsilon and n_inner other than 1e-5 / 4E (the
// ModelConfig holds them; ToGptConfig refuses them for today's GptModel).
//
// Writing. HfConfigJson renders a ModelConfig as the config.json transformers writes for its
// family (sorted keys, two-space indent), in the transformers-4 spelling that transformers 5 also
// reads ("rope_theta", "rope_scaling", "torch_dtype"), optionally over the original file's object
// so keys this project does not model (token ids, generation settings) survive a round trip.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_HF_CONFIG_H_
#define PATRICKSTAR_MODEL_HF_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "memory/dtype.h"
#include "model/model_config.h"

namespace ps {

// The file name of a model directory's configuration.
inline constexpr absl::string_view kHfConfigFileName = "config.json";

// Parses the text of a config.json (see the file comment). `path` names the file in error
// messages and becomes the config's name. The result passes ValidateModelConfig.
[[nodiscard]] absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text,
                                                        absl::string_view path);

// Reads and parses the file at `path` (NotFound if it does not exist).
[[nodiscard]] absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& path);

struct HfConfigJsonOptions {
  // The dtype to declare ("torch_dtype"); when nullopt, config.torch_dtype (omitted if unset).
  std::optional<DType> torch_dtype;
  // The original config.json text, or empty. Its keys are kept except those this function writes
  // and those that would contradict them (transformers 5's "rope_parameters" and "dtype"; for
  // gpt2 the attribute-map aliases).
  std::string base_json;
};

// The config.json text for `config` (ends with a newline). transformers' from_pretrained and
// ParseHfConfig read it back to the same model (ParseHfConfig(HfConfigJson(c)) equals c except
// for the name).
// Errors: InvalidArgument if `config` is invalid or base_json is not a JSON object.
[[nodiscard]] absl::StatusOr<std::string> HfConfigJson(const ModelConfig& config,
                                                       const HfConfigJsonOptions& options = {});

// The causal-LM class transformers uses for `family`: "LlamaForCausalLM", "Qwen2ForCausalLM",
// "MistralForCausalLM", "SmolLM3ForCausalLM", "Olmo2ForCausalLM", "GPT2LMHeadModel".
absl::string_view HfArchitectureName(ModelFamily family);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_HF_CONFIG_H_
