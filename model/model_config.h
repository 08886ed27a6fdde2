// ModelConfig: the shape and numerics of one model of the transformer family this project trains —
// GPT-2, and the Llama architecture in its Llama 2/3, Qwen2/2.5 and Mistral variants — with
// presets of real models, validation, the parameter count in closed form, and the parameters as
// operators for the chunk layer.
//
// Families and what distinguishes them (Hugging Face model_type in quotes):
//   "gpt2"     LayerNorm, learned positions, GELU(tanh) MLP of width intermediate_size, biases on
//              every linear, LM head tied to the token embedding.
//   "llama"    RMSNorm, RoPE (optionally with Llama 3.1's "llama3" frequency scaling), SwiGLU MLP
//              (down(silu(gate(x)) * up(x))), grouped-query attention (num_kv_heads divides
//              num_heads), optional biases: attention_bias puts one on q, k, v and o; mlp_bias on
//              gate, up and down. Tied or untied LM head.
//   "qwen2"    as llama, with biases on q, k, v (not o), none in the MLP.
//   "mistral"  as llama, no biases, optionally sliding-window attention on every layer (Mistral
//              7B v0.1's sliding_window 4096).
//   "qwen3"    as llama (attention_bias on q, k, v and o, default none; no MLP bias), with a
//              per-head RMSNorm of q and of k (q_norm, k_norm: weights [head_dim], eps
//              rms_norm_eps) after the projections and before RoPE, and a head_dim that need
//              not be hidden_size / num_heads.
//   "smollm3"  as llama (attention_bias on q, k, v and o; mlp_bias), with no RoPE on some layers
//              (NoPE; config.json's no_rope_layers, 1 = RoPE, 0 = none; SmolLM3-3B: every
//              fourth).
//   "olmo2"    as llama (attention_bias on q, k, v and o; no MLP bias), with the block's norms
//              after attention and after the MLP, applied to the sublayer's output before the
//              residual add (post_attention_layernorm, post_feedforward_layernorm; no
//              input_layernorm), and an RMSNorm of q and of k over the whole projection
//              (q_norm [Q], k_norm [K], not per head) before RoPE.
//   "phi3"     as llama without biases (Phi-3, Phi-3.5-mini, Phi-4-mini), with partial rotary
//              (partial_rotary_factor: RoPE on the first int(head_dim * factor) channels of
//              each head) and optionally a sliding window on every layer. Its checkpoint fuses
//              q, k, v into self_attn.qkv_proj.weight [Q + 2K, E] (rows q, then k, then v) and
//              gate, up into mlp.gate_up_proj.weight [2I, E] (rows gate, then up): the
//              parameters here are the separate q/k/v and gate/up tensors below, and the Hugging
//              Face reader and writer (model/hf_checkpoint.h) split and fuse them.
//   "gemma3_text" Gemma 3's text model (Gemma3ForCausalLM): as llama (attention_bias on q, k, v and
//              o; no MLP bias) with RMSNorms that multiply by (1 + w) (every norm, q/k norms
//              included), four norms per layer (input_layernorm and post_attention_layernorm
//              around attention, pre_feedforward_layernorm and post_feedforward_layernorm around
//              the MLP: x + post(attn(pre(x)))), a per-head q/k RMSNorm before RoPE (as qwen3),
//              the token embedding multiplied by sqrt(hidden_size) (rounded to the compute
//              dtype), GeGLU (hidden_act gelu_pytorch_tanh: down(gelu_tanh(gate) * up)), a
//              sliding window on the layers layer_types names, whose RoPE base is
//              rope_local_base_freq (rope_theta on the others), and attention scale
//              query_pre_attn_scalar^-0.5 (only query_pre_attn_scalar == head_dim is supported).
// The llama-like families share one computation (architecture() == kLlama; Qwen3's q/k norm is an
// option of the block, model/transformer_block_spec.h); the family is kept so that an export
// writes back the config.json the model came from.
//
// Parameters, as OperatorSpecs in forward order (ModelOperators). Names are Hugging Face's, so
// the chunk layout, the importer and the exporter speak one language. Llama architecture
// (E = hidden_size, V = vocab_size, I = intermediate_size, Q = num_heads * head_dim,
//  K = num_kv_heads * head_dim; Linear weights are torch.nn.Linear's [out, in]):
//   operator                               tensors
//   model.embed_tokens                     model.embed_tokens.weight [V, E]
//     or, split: model.embed_tokens[r0:r1] model.embed_tokens.weight[r0:r1] [r1 - r0, E]
//   per layer i (p = "model.layers.{i}."):
//   p input_layernorm                      p input_layernorm.weight [E]
//   p self_attn.qkv_proj                   p self_attn.q_proj.weight [Q, E], k_proj.weight [K, E],
//                                          v_proj.weight [K, E], then (with qkv_bias) q_proj.bias
//                                          [Q], k_proj.bias [K], v_proj.bias [K], then (qwen3)
//                                          q_norm.weight [D], k_norm.weight [D] (olmo2: [Q], [K])
//   p self_attn.o_proj                     p self_attn.o_proj.weight [E, Q] (+ .bias [E])
//   p post_attention_layernorm             p post_attention_layernorm.weight [E]
//   p mlp.gate_proj                        p mlp.gate_proj.weight [I, E] (+ .bias [I])
//   p mlp.up_proj                          p mlp.up_proj.weight [I, E] (+ .bias [I])
//   p mlp.down_proj                        p mlp.down_proj.weight [E, I] (+ .bias [E])
//   model.norm                             model.norm.weight [E]
// Gemma 3's layer: input_layernorm, self_attn.qkv_proj (q_norm, k_norm [D]), self_attn.o_proj,
// post_attention_layernorm, pre_feedforward_layernorm, the MLP, post_feedforward_layernorm.
// OLMo 2's layer has no input_layernorm: self_attn.qkv_proj, self_attn.o_proj,
// post_attention_layernorm, the MLP, then post_feedforward_layernorm (weight [E]), the order its
// forward uses them.
//   lm_head (only if not tied)             lm_head.weight [V, E]
//     or, split: lm_head[r0:r1]            lm_head.weight[r0:r1] [r1 - r0, E]
// GPT-2: model/gpt_config.h's operators (names without the "transformer." prefix: wte whole or in
// row blocks, wpe, the blocks, ln_f), with the MLP width intermediate_size instead of a fixed
// 4E.
//
// Why this grouping. An operator is the unit of chunk access: all its tensors are resident
// together, so the largest operator bounds the chunk size from below. q, k and v are one operator
// because one attention step reads all three from the same normalized input, and together they
// are (Q + 2K) x E, at most 3 Q E — with grouped-query attention much less (Llama-3-8B: 48 MiB in
// bf16); gate and up are two operators although SwiGLU combines them, because each can be applied
// on its own (g = x Wg^T, then u = x Wu^T, both kept for backward): keeping them apart halves the
// MLP's working set (Llama-3-8B: 112 MiB each in bf16 instead of 224 MiB together). The largest
// per-layer operator is then one MLP matrix, I x E.
//
// The vocabulary matrices (embed_tokens, lm_head, GPT-2's wte) are each an operator of their own
// with a single [V, E] tensor, and every use of them is row-separable: the embedding gathers rows
// by token id, the LM head computes logits one vocabulary tile at a time
// (model/kernels/vocab_blocks.h computes both one row block at a time, bit-identical to the whole
// matrix). VocabLayoutOptions::vocab_block_rows splits them into chunk-sized row blocks, each an
// ordinary operator named "<operator>[r0:r1]" holding "<tensor>[r0:r1]" (rows [r0, r1) of the
// Hugging Face tensor, a contiguous element range), so the vocabulary never sets the chunk size:
// model/gpt_config.h's GptVocabBlockRowsForChunk sizes the blocks to the chunk in whole LM-head
// vocabulary tiles. The Hugging Face reader (model/safetensors_index.h) reads any element range of
// a tensor and the writer (model/hf_checkpoint.h) asks for element ranges, so a split matrix is
// imported and exported block by block, never whole. A tied LM head reuses embed_tokens' blocks
// (each block is then used twice per pass, as GPT-2's wte; ZeRO's reduce waits for the second
// use: scheduler/zero_groups.h).
//
// Thread safety: value types and pure functions.
#ifndef PATRICKSTAR_MODEL_MODEL_CONFIG_H_
#define PATRICKSTAR_MODEL_MODEL_CONFIG_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"

namespace ps {

// Hugging Face model_type of a supported family.
enum class ModelFamily {
  kGpt2,
  kLlama,
  kQwen2,
  kMistral,
  kQwen3,
  kSmolLM3,
  kOlmo2,
  kPhi3,
  kGemma3
};

// What the model computes: GPT-2, or the Llama architecture (Llama, Qwen2, Mistral, Qwen3,
// SmolLM3, OLMo 2 and Phi-3).
enum class ModelArchitecture { kGpt2, kLlama };

// "gpt2", "llama", "qwen2", "mistral", "qwen3", "smollm3", "olmo2", "phi3", "gemma3_text" (the
// Hugging Face model_type).
absl::string_view ModelFamilyName(ModelFamily family);
ModelArchitecture ArchitectureOf(ModelFamily family);

// The MLP activation. kSilu: x * sigmoid(x) (Hugging Face "silu"). kGeluTanh: GELU with the tanh
// approximation (Hugging Face "gelu_new" and "gelu_pytorch_tanh", the same function).
enum class HiddenAct { kSilu, kGeluTanh };
absl::string_view HiddenActName(HiddenAct act);  // "silu", "gelu_new"

// RoPE frequency scaling. kNone: inv_freq[j] = rope_theta^(-2j/head_dim). kLlama3 (Llama 3.1+):
// with wavelen = 2 pi / inv_freq, low_wavelen = original_max_position_embeddings /
// high_freq_factor and high_wavelen = original_max_position_embeddings / low_freq_factor,
// wavelengths below low_wavelen keep inv_freq, those above high_wavelen use inv_freq / factor, and
// those between interpolate with smooth = (original_max_position_embeddings / wavelen -
// low_freq_factor) / (high_freq_factor - low_freq_factor):
// (1 - smooth) inv_freq / factor + smooth inv_freq. (transformers' _compute_llama3_parameters.)
// kLongRope (Phi-3's "longrope", also spelled "su" or "yarn" in its config.json; phi3 only):
// inv_freq[j] = 1 / (ext[j] rope_theta^(2j/rotary_dim)) with ext = short_factor for sequences
// up to original_max_position_embeddings tokens and long_factor past them, and cos, sin
// multiplied by LongRopeAttentionFactor (transformers' _compute_longrope_parameters).
// kLinear (gemma3_text only, its global layers): inv_freq / factor (transformers'
// _compute_linear_scaling_rope_parameters; Gemma 3 4B's factor 8).
enum class RopeScalingType { kNone, kLlama3, kLongRope, kLinear };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  // kLlama3 and kLinear only (zero otherwise).
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;  // kLlama3 and kLongRope
  // kLongRope only (empty otherwise): rotary_dim / 2 factors each.
  std::vector<double> short_factor = {};
  std::vector<double> long_factor = {};

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct ModelConfig {
  std::string name;
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // E (GPT-2: n_embd)
  int64_t num_layers = 0;         // num_hidden_layers (GPT-2: n_layer)
  int64_t num_heads = 0;          // num_attention_heads (GPT-2: n_head)
  int64_t num_kv_heads = 0;       // num_key_value_heads; divides num_heads (GPT-2: num_heads)
  int64_t head_dim = 0;           // usually hidden_size / num_heads; may differ for llama-likes
  int64_t intermediate_size = 0;  // MLP width (GPT-2: n_inner, 4E when null)
  // Positions the model was trained for (GPT-2: n_positions; the size of wpe).
  int64_t max_position_embeddings = 0;
  double norm_eps = 1e-5;            // rms_norm_eps (llama-likes) / layer_norm_epsilon (GPT-2)
  double rope_theta = 10000;         // llama-likes only
  RopeScaling rope_scaling;          // llama-likes only
  bool qkv_bias = false;             // bias on q_proj, k_proj, v_proj (GPT-2: c_attn.bias, always)
  bool o_proj_bias = false;          // bias on o_proj (GPT-2: attn.c_proj.bias, always)
  bool mlp_bias = false;             // bias on the MLP's linears (GPT-2: always)
  bool tie_word_embeddings = false;  // LM head = token embedding (GPT-2: always)
  HiddenAct hidden_act = HiddenAct::kSilu;
  // Sliding-window (local) attention: query t sees keys j > t - sliding_window
  // (GqaAttentionShape::sliding_window) on the layers sliding_window_layers marks; 0 = none.
  // llama-likes only. Mistral: every layer or none; Qwen2 and Qwen3: use_sliding_window's layers
  // (layer_types, or those >= max_window_layers).
  int64_t sliding_window = 0;
  // One entry per layer when sliding_window > 0 (true: the layer uses the window), else empty.
  std::vector<bool> sliding_window_layers;
  // Layers that apply no RoPE to q and k (SmolLM3's NoPE layers): one entry per layer (true: no
  // RoPE), or empty for RoPE on every layer. smollm3 only.
  std::vector<bool> layers_without_rope;
  // The share of each head's channels RoPE rotates (Phi-3's partial_rotary_factor; 1 elsewhere):
  // the first rotary_dim() = int(head_dim * partial_rotary_factor) channels. phi3 only.
  double partial_rotary_factor = 1.0;
  // The RoPE base of the sliding-window layers (Gemma 3's rope_local_base_freq; rope_scaling does
  // not apply to them); 0 = rope_theta on every layer. gemma3_text only (and required there).
  double rope_local_base_freq = 0;
  // The dtype the checkpoint declares (config.json "torch_dtype" / "dtype"); informational: the
  // tensors' own dtypes are what is read. nullopt when not declared.
  std::optional<DType> torch_dtype;

  ModelArchitecture architecture() const { return ArchitectureOf(family); }
  int64_t q_size() const { return num_heads * head_dim; }      // Q: rows of q_proj
  int64_t kv_size() const { return num_kv_heads * head_dim; }  // K: rows of k_proj and v_proj
  // A per-head RMSNorm of q and k before RoPE (Qwen3's q_norm, k_norm).
  bool qk_norm() const {
    return family == ModelFamily::kQwen3 || family == ModelFamily::kOlmo2 ||
           family == ModelFamily::kGemma3;
  }
  // The q/k norm over the whole projection (weights [Q], [K]) rather than per head (OLMo 2).
  bool qk_norm_whole() const { return family == ModelFamily::kOlmo2; }
  // Norms after attention and MLP, on the sublayer's output before the residual add (OLMo 2).
  bool post_norms() const { return family == ModelFamily::kOlmo2; }
  // Gemma's four norms per layer: pre and post around attention and around the MLP.
  bool sandwich_norms() const { return family == ModelFamily::kGemma3; }
  // The RMSNorms' gain is (norm_weight_offset() + w): 1 for Gemma's (1 + w), else 0.
  double norm_weight_offset() const { return family == ModelFamily::kGemma3 ? 1.0 : 0.0; }
  // The factor the token embedding is multiplied by (Gemma: sqrt(hidden_size)); 0 = none.
  double embedding_multiplier() const {
    return family == ModelFamily::kGemma3 ? std::sqrt(static_cast<double>(hidden_size)) : 0.0;
  }
  // The RoPE base of `layer`: rope_local_base_freq on a sliding-window layer when set.
  bool LayerHasLocalRope(int64_t layer) const {
    return rope_local_base_freq > 0 && LayerSlidingWindow(layer) > 0;
  }
  // Channels of each head RoPE rotates: transformers' int(head_dim * partial_rotary_factor).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  // Whether `layer` rotates q and k (llama-likes; false on SmolLM3's NoPE layers).
  bool LayerHasRope(int64_t layer) const {
    return layers_without_rope.empty() || !layers_without_rope[static_cast<size_t>(layer)];
  }
  // The attention window of `layer` (0: full causal attention).
  int64_t LayerSlidingWindow(int64_t layer) const {
    return sliding_window > 0 && sliding_window_layers[static_cast<size_t>(layer)]
               ? sliding_window
               : 0;
  }

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};
std::ostream& operator<<(std::ostream& os, const ModelConfig& config);

// kLongRope's scale of cos and sin, as Phi3Config makes it: factor = max_position_embeddings /
// original_max_position_embeddings, then 1 when factor <= 1, else
// sqrt(1 + ln(factor) / ln(original_max_position_embeddings)). 1 for other scalings.
double LongRopeAttentionFactor(const ModelConfig& config);

// OK, or InvalidArgument naming the field (and the config's name) for: a non-positive size; more
// than 2^20 layers; num_kv_heads not dividing num_heads; an odd head_dim (RoPE rotates pairs);
// a norm_eps or rope_theta that is not finite and positive; llama3 rope scaling with factor < 1,
// a non-positive frequency factor, high_freq_factor <= low_freq_factor or a non-positive
// original_max_position_embeddings; scaling parameters set without a scaling type; a parameter
// count that overflows int64; and combinations the family cannot express in its config.json:
//   gpt2     num_kv_heads == num_heads, head_dim * num_heads == hidden_size, all biases, tied,
//            gelu_new, no rope scaling;
//   llama    silu, qkv_bias == o_proj_bias (one attention_bias key);
//   qwen2    silu, qkv_bias, no o_proj or MLP bias;
//   mistral  silu, no biases;
//   qwen3    silu, qkv_bias == o_proj_bias (one attention_bias key), no MLP bias;
//   smollm3  silu, qkv_bias == o_proj_bias (one attention_bias key), no sliding window;
//   olmo2    silu, qkv_bias == o_proj_bias (one attention_bias key), no MLP bias, no window;
//   phi3     silu, no biases, a window (if any) on every layer;
//   gemma3_text gelu_new (gelu_pytorch_tanh), qkv_bias == o_proj_bias, no MLP bias, rope scaling
//            none or linear (factor >= 1; linear for gemma3_text only), rope_local_base_freq
//            finite and positive (0 for every other family);
// partial_rotary_factor 1 except for phi3, where it is in (0, 1] with rotary_dim() even and
// positive;
// layers_without_rope empty or one entry per layer, and set only for smollm3;
// and for the sliding window: sliding_window >= 0; sliding_window_layers has num_layers entries
// when sliding_window > 0, none otherwise; mistral's window on every layer; none for gpt2 and
// llama (their config.json has no window).
[[nodiscard]] absl::Status ValidateModelConfig(const ModelConfig& config);

// Presets with the real shapes of published models (values from each model's config.json on the
// Hugging Face Hub; sources in model_config.cc), for planning, benchmarks and training from a
// seeded random init (the trainer's --model / model.preset):
//   "llama-3.2-1b"    meta-llama/Llama-3.2-1B                         1,235,814,400 params
//   "llama-3-8b"      meta-llama/Meta-Llama-3-8B                      8,030,261,248
//   "llama-2-7b"      meta-llama/Llama-2-7b-hf                        6,738,415,616
//   "tinyllama-1.1b"  TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T  1,100,048,384
//   "qwen2.5-0.5b"    Qwen/Qwen2.5-0.5B                                 494,032,768
//   "qwen2.5-1.5b"    Qwen/Qwen2.5-1.5B                               1,543,714,304
//   "qwen2.5-3b"      Qwen/Qwen2.5-3B                                 3,085,938,688
//   "qwen2.5-14b"     Qwen/Qwen2.5-14B                               14,770,033,664
//   "qwen2.5-32b"     Qwen/Qwen2.5-32B                               32,763,876,352
//   "mistral-7b-v0.3" mistralai/Mistral-7B-v0.3                       7,248,023,552
//   "qwen3-0.6b"      Qwen/Qwen3-0.6B                                   596,049,920
//   "qwen3-4b"        Qwen/Qwen3-4B                                   4,022,468,096
//   "smollm3-3b"      HuggingFaceTB/SmolLM3-3B                        3,075,098,624
//   "olmo-2-1b"       allenai/OLMo-2-0425-1B                          1,484,916,736
//   "phi-4-mini"      microsoft/Phi-4-mini-instruct                   3,836,021,760
//   "gemma-3-1b"      google/gemma-3-1b-pt (text)                       999,885,952
//   "gemma-3-4b"      google/gemma-3-4b-pt's text model               3,880,263,168
//   "llama-tiny"      a 2-layer GQA Llama for tests (vocab 256, E 64, 4 heads, 2 kv heads)
// and every GPT-2-architecture preset of GptPreset ("tiny", "gpt2", ..., "18B") converted with
// FromGptConfig. InvalidArgument listing the known names for anything else.
[[nodiscard]] absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name);

// The preset names above, llama-likes first.
std::vector<std::string> ModelPresetNames();

// The operators in forward order (see the file comment), the vocabulary matrices whole or in row
// blocks of layout.vocab_block_rows. REQUIRES: ValidateModelConfig is OK, vocab_block_rows >= 0.
std::vector<OperatorSpec> ModelOperators(const ModelConfig& config,
                                         const VocabLayoutOptions& layout = {});

// Closed form of the parameter count (== ModelNumElems(ModelOperators(config))).
//   llama-likes: V E (1 + untied) + E + L (2E (gemma3_text: 4E) + 2 E Q + 2 E K + 3 E I
//                + qkv_bias (Q + 2K) + o_proj_bias E + mlp_bias (2I + E) + qk_norm 2D
//                (whole-projection q/k norm: Q + K))
//   gpt2:        (V + P) E + L (4E^2 + 2 E I + I + 9E) + 2E
// REQUIRES: ValidateModelConfig is OK.
int64_t ModelParameterCount(const ModelConfig& config);

// The useful FLOPs of one training step (forward and backward; a multiply-add counts 2) on `batch`
// sequences of `seq_len` tokens, the numerator of a model FLOP rate and of MFU:
//   linear: 6 per weight of the blocks' projections and token (forward 2, backward 4):
//           gpt2 E(3E) + E^2 + 2 E I per layer, llama E(Q + 2K) + Q E + 3 E I;
//   head:   6 E V per token (the LM head's product, tied or not);
//   attention: the causal triangle's QK^T and PV, 4 Q per query-key pair forward, twice that
//           backward; a layer with a sliding window W < T counts its W (W + 1) / 2 + (T - W) W
//           pairs per sequence, not T (T + 1) / 2.
// Not counted: embeddings, norms, activations, softmax, the optimizer (memory-bound work).
// REQUIRES: ValidateModelConfig is OK, batch >= 1, seq_len >= 1.
struct ModelFlops {
  double linear = 0, head = 0, attention = 0;
  double Total() const { return linear + head + attention; }
};
ModelFlops ModelTrainingFlops(const ModelConfig& config, int64_t batch, int64_t seq_len);

// The GPT-2 ModelConfig of a GptConfig: intermediate 4E, layer_norm_epsilon 1e-5, tied, biases,
// gelu_new (what GptModel computes).
ModelConfig FromGptConfig(const GptConfig& gpt);

// The GptConfig of a GPT-2 ModelConfig. InvalidArgument naming the field when `config` is not a
// valid gpt2-family config or uses what GptConfig cannot express: intermediate_size (n_inner)
// other than 4 hidden_size, norm_eps (layer_norm_epsilon) other than 1e-5.
[[nodiscard]] absl::StatusOr<GptConfig> ToGptConfig(const ModelConfig& config);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_MODEL_CONFIG_H_
