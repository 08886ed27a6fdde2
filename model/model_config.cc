#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {
namespace {

// Presets of published llama-like models. Every number is the model's config.json on the Hugging
// Face Hub. Where they were read (the Hub itself is not reachable from here):
//  [L] Lightning-AI/litgpt litgpt/config.py (commit 26857050fe3f, 2026-06-29), whose entries cite
//      the config.json URL of each model: hidden, layers, heads, kv heads (n_query_groups),
//      intermediate, vocab (padded_vocab_size), positions (block_size), rope_theta (rope_base),
//      norm eps, attention bias (attn_bias), llama3 rope (rope_adjustments).
//  [T] kevinstephano/thunder_model_blocks hf_llama/llama_config.py: a verbatim copy of
//      meta-llama/Llama-3.2-1B-Instruct's config.json (same architecture as the base model):
//      head_dim 64, rms_norm_eps 1e-05, tie_word_embeddings true, torch_dtype bfloat16.
//  [Q] copies of Qwen/Qwen2.5-0.5B's config.json (transformers 4.40.1; e.g. in
//      rwth-i6/i6_experiments .../qwen2/qwen2_configs.py for Qwen2-0.5B, same shapes): rms_norm_eps
//      1e-06, tie_word_embeddings true, use_sliding_window false, bfloat16. Qwen2.5-1.5B's model
//      card: "tied word embeddings", 1.54B parameters (1.31B non-embedding).
//  [3] Qwen/Qwen3-0.6B's config.json (transformers 4.51.0), quoted verbatim in public code:
//      hidden 1024, 28 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 3072, vocab
//      151936, max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-06, attention_bias
//      false, tie_word_embeddings true, bfloat16. Qwen/Qwen3-4B (the April 2025 release, not the
//      2507 update with 262144 positions and rope_theta 5e6): hidden 2560, 36 layers, 32 heads, 8
//      kv heads, head_dim 128, intermediate 9728, vocab 151936 (public code checks these against
//      its config.json), the family's 40960 positions, 1e6, 1e-06 and tied embeddings; its model
//      card's "4.0B parameters, 3.6B non-embedding" is the closed-form count below.
//  [S] HuggingFaceTB/SmolLM3-3B's config.json (transformers 4.54), quoted in public code (not
//      fetched here): vocab 128256, hidden 2048, intermediate 11008, 36 layers, 16 heads, 4 kv
//      heads, max_position_embeddings 65536, rope_theta 5e6, rms_norm_eps 1e-06,
//      tie_word_embeddings true, bfloat16, no_rope_layer_interval 4 with no_rope_layers
//      [1, 1, 1, 0] x 9 (transformers' SmolLM3Config default for that interval); the model
//      card's "3B" (3.08B) is the closed-form count.
//  [O] allenai/OLMo-2-0425-1B's config.json, quoted in public code (not fetched here): vocab
//      100352, hidden 2048, intermediate 8192, 16 layers, 16 heads, 16 kv heads,
//      max_position_embeddings 4096, rope_theta 500000, rms_norm_eps 1e-06, attention_bias
//      false, tie_word_embeddings false; bfloat16 as the OLMo 2 releases. Its model card's "1B"
//      (1.48B) is the closed-form count (transformers 4.57.6's Olmo2ForCausalLM on the meta device
//      counts the same).
//  [P] microsoft/Phi-4-mini-instruct's config.json, as transformers' Phi-4-mini documentation and
//      public ports quote it (not fetched here): vocab 200064, hidden 3072, intermediate 8192, 32
//      layers, 24 heads, 8 kv heads (head_dim 128), partial_rotary_factor 0.75 (RoPE on 96 of
//      128 channels), max_position_embeddings 131072, rope_theta 10000, rms_norm_eps 1e-5, tied,
//      bfloat16. Its rope_scaling is "longrope" (per-frequency factors for sequences past
//      original_max_position_embeddings 4096), which the preset leaves out: its tables are the
//      plain RoPE of sequences up to 4096 tokens.
//      The model card's "3.8B" is the closed-form count; transformers 4.57.6's Phi3ForCausalLM
//      on the meta device counts the same 3,836,021,760.
//  [G] google/gemma-3-1b-pt's config.json (Gemma3ForCausalLM, model_type gemma3_text), as public
//      ports quote it (not fetched here): vocab 262144, hidden 1152, intermediate 6912, 26
//      layers, 4 heads, 1 kv head, head_dim 256, query_pre_attn_scalar 256,
//      max_position_embeddings 32768, rms_norm_eps 1e-6, rope_theta 1e6, rope_local_base_freq
//      10000, sliding_window 512 with sliding_window_pattern 6 (layer i slides unless
//      (i + 1) % 6 == 0), rope_scaling null, hidden_activation gelu_pytorch_tanh, tied,
//      bfloat16. transformers 4.57.6's Gemma3ForCausalLM on the meta device counts 999,885,952,
//      the closed form's count.
//  [G4] google/gemma-3-4b-pt's text_config (its config.json is Gemma3ForConditionalGeneration's;
//      the preset is the text model, Gemma3ForCausalLM), as public ports quote it (not fetched
//      here): vocab 262208, hidden 2560, intermediate 10240, 34 layers, 8 heads, 4 kv heads,
//      head_dim 256, query_pre_attn_scalar 256, max_position_embeddings 131072, rope_theta 1e6
//      with rope_scaling {"rope_type": "linear", "factor": 8.0}, rope_local_base_freq 10000,
//      sliding_window 1024, pattern 6, tied, bfloat16. transformers 4.57.6's Gemma3ForCausalLM of
//      that text config on the meta device counts 3,880,263,168, the closed form's count.
// Tied/untied and dtypes not in [L]: Llama-2-7b-hf, Meta-Llama-3-8B and Mistral-7B-v0.3 have
// tie_word_embeddings false (their safetensors indexes list lm_head.weight), TinyLlama's config
// says false and float32 (its safetensors header holds F32 tensors only), Llama-2-7b-hf float16.
// The parameter counts in the header (checked by model_config_test) are the Hub's "safetensors
// total" of each model, cross-checked against the index files' total_size where one was found:
// Meta-Llama-3-8B 16,060,522,496 bytes / 2 = 8,030,261,248; Llama-2-7b-hf 13,476,839,424 bytes =
// 2 x 6,738,415,616 + 8,192 (its files also hold 32 layers x 64 f32 rotary_emb.inv_freq buffers).
struct LlamaPreset {
  const char* name;
  ModelFamily family;
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t num_layers;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t intermediate_size;
  int64_t max_position_embeddings;
  double norm_eps;
  double rope_theta;
  RopeScaling rope_scaling;
  bool qkv_bias;
  bool tie_word_embeddings;
  DType torch_dtype;
};

constexpr RopeScaling kNoScaling{};

const LlamaPreset kLlamaPresets[] = {
    // [L] Llama-3.2-1B, [T]: rope_scaling {factor 32, low 1, high 4, original 8192, "llama3"}.
    {"llama-3.2-1b", ModelFamily::kLlama, 128256, 2048, 16, 32, 8, 64, 8192, 131072, 1e-5, 500000.0,
     RopeScaling{RopeScalingType::kLlama3, 32.0, 1.0, 4.0, 8192}, false, true, DType::kBF16},
    // [L] Meta-Llama-3-8B: no rope scaling (that came with 3.1).
    {"llama-3-8b", ModelFamily::kLlama, 128256, 4096, 32, 32, 8, 128, 14336, 8192, 1e-5, 500000.0,
     kNoScaling, false, false, DType::kBF16},
    // [L] Llama-2-7b-hf: litgpt's defaults n_embd 4096, n_head 32 (= kv heads), block 4096.
    {"llama-2-7b", ModelFamily::kLlama, 32000, 4096, 32, 32, 32, 128, 11008, 4096, 1e-5, 10000.0,
     kNoScaling, false, false, DType::kF16},
    // [L] TinyLlama-1.1B-intermediate-step-1431k-3T.
    {"tinyllama-1.1b", ModelFamily::kLlama, 32000, 2048, 22, 32, 4, 64, 5632, 2048, 1e-5, 10000.0,
     kNoScaling, false, false, DType::kF32},
    // [L], [Q] Qwen2.5-0.5B.
    {"qwen2.5-0.5b", ModelFamily::kQwen2, 151936, 896, 24, 14, 2, 64, 4864, 32768, 1e-6, 1000000.0,
     kNoScaling, true, true, DType::kBF16},
    // [L] Qwen2.5-1.5B (the base model's config.json has max_position_embeddings 131072).
    {"qwen2.5-1.5b", ModelFamily::kQwen2, 151936, 1536, 28, 12, 2, 128, 8960, 131072, 1e-6,
     1000000.0, kNoScaling, true, true, DType::kBF16},
    // Qwen2.5-3B (issue #21's headline model): the values of Qwen/Qwen2.5-3B's config.json as
    // issue #24 gives them (hidden 2048, 36 layers, 16 heads, 2 kv heads, intermediate 11008,
    // vocab 151936, tied), with the Qwen2.5 family's rope_theta 1e6, rms_norm_eps 1e-6, q/k/v
    // biases, 32768 positions and bf16 of [L]/[Q]; head_dim 2048 / 16 = 128. Its closed-form
    // count, 3,085,938,688, is the "3.09B" of the model card.
    {"qwen2.5-3b", ModelFamily::kQwen2, 151936, 2048, 36, 16, 2, 128, 11008, 32768, 1e-6, 1000000.0,
     kNoScaling, true, true, DType::kBF16},
    // [L] Qwen2.5-14B and Qwen2.5-32B (issue #37's QLoRA headline): vocab 152064, hidden 5120,
    // 40 heads, 8 kv heads (head_dim 128), intermediate 13824 / 27648, 48 / 64 layers, 131072
    // positions, rms_norm_eps 1e-5, rope_theta 1e6; untied and bf16 as Qwen/Qwen2.5-32B's
    // config.json ("tie_word_embeddings": false, "torch_dtype": "bfloat16").
    {"qwen2.5-14b", ModelFamily::kQwen2, 152064, 5120, 48, 40, 8, 128, 13824, 131072, 1e-5,
     1000000.0, kNoScaling, true, false, DType::kBF16},
    {"qwen2.5-32b", ModelFamily::kQwen2, 152064, 5120, 64, 40, 8, 128, 27648, 131072, 1e-5,
     1000000.0, kNoScaling, true, false, DType::kBF16},
    // [L] Mistral-7B-v0.3: sliding_window null (v0.1's 4096 window is gone), vocab 32768.
    {"mistral-7b-v0.3", ModelFamily::kMistral, 32768, 4096, 32, 32, 8, 128, 14336, 32768, 1e-5,
     1000000.0, kNoScaling, false, false, DType::kBF16},
    // [3] Qwen3-0.6B: head_dim 128 (not 1024 / 16), tied, no attention bias.
    {"qwen3-0.6b", ModelFamily::kQwen3, 151936, 1024, 28, 16, 8, 128, 3072, 40960, 1e-6, 1000000.0,
     kNoScaling, false, true, DType::kBF16},
    // [3] Qwen3-4B: head_dim 128 (not 2560 / 32), tied, no attention bias.
    {"qwen3-4b", ModelFamily::kQwen3, 151936, 2560, 36, 32, 8, 128, 9728, 40960, 1e-6, 1000000.0,
     kNoScaling, false, true, DType::kBF16},
    // [S] SmolLM3-3B: NoPE on every fourth layer (layers 3, 7, ..., 35), tied, no biases.
    {"smollm3-3b", ModelFamily::kSmolLM3, 128256, 2048, 36, 16, 4, 128, 11008, 65536, 1e-6,
     5000000.0, kNoScaling, false, true, DType::kBF16},
    // [O] OLMo-2-0425-1B: MHA (16 kv heads), untied, no biases, rope_theta 5e5.
    {"olmo-2-1b", ModelFamily::kOlmo2, 100352, 2048, 16, 16, 16, 128, 8192, 4096, 1e-6, 500000.0,
     kNoScaling, false, false, DType::kBF16},
    // [P] Phi-4-mini: partial rotary 0.75 (set in FromLlamaPreset), GQA, tied, no biases; no
    // longrope factors (see [P]).
    {"phi-4-mini", ModelFamily::kPhi3, 200064, 3072, 32, 24, 8, 128, 8192, 131072, 1e-5, 10000.0,
     kNoScaling, false, true, DType::kBF16},
    // [G] Gemma 3 1B (text): MQA (1 kv head), head_dim 256, tied; window and local RoPE base set
    // in FromLlamaPreset.
    {"gemma-3-1b", ModelFamily::kGemma3, 262144, 1152, 26, 4, 1, 256, 6912, 32768, 1e-6, 1000000.0,
     kNoScaling, false, true, DType::kBF16},
    // [G4] Gemma 3 4B's text model: linear RoPE scaling 8 on the global layers.
    {"gemma-3-4b", ModelFamily::kGemma3, 262208, 2560, 34, 8, 4, 256, 10240, 131072, 1e-6, 1000000.0,
     RopeScaling{.type = RopeScalingType::kLinear, .factor = 8.0}, false, true, DType::kBF16},
    // For tests: every llama feature that changes shapes (GQA, untied head) at a tiny size.
    {"llama-tiny", ModelFamily::kLlama, 256, 64, 2, 4, 2, 16, 160, 128, 1e-5, 10000.0, kNoScaling,
     false, false, DType::kF32},
};

ModelConfig FromLlamaPreset(const LlamaPreset& p) {
  ModelConfig c;
  c.name = p.name;
  c.family = p.family;
  c.vocab_size = p.vocab_size;
  c.hidden_size = p.hidden_size;
  c.num_layers = p.num_layers;
  c.num_heads = p.num_heads;
  c.num_kv_heads = p.num_kv_heads;
  c.head_dim = p.head_dim;
  c.intermediate_size = p.intermediate_size;
  c.max_position_embeddings = p.max_position_embeddings;
  c.norm_eps = p.norm_eps;
  c.rope_theta = p.rope_theta;
  c.rope_scaling = p.rope_scaling;
  c.qkv_bias = p.qkv_bias;
  c.o_proj_bias = false;
  c.mlp_bias = false;
  c.tie_word_embeddings = p.tie_word_embeddings;
  c.hidden_act = HiddenAct::kSilu;
  c.torch_dtype = p.torch_dtype;
  if (p.family == ModelFamily::kSmolLM3) {
    // SmolLM3Config's no_rope_layers for no_rope_layer_interval 4: layer i has no RoPE when
    // (i + 1) % 4 == 0.
    for (int64_t i = 0; i < p.num_layers; ++i) c.layers_without_rope.push_back((i + 1) % 4 == 0);
  }
  if (p.family == ModelFamily::kPhi3) c.partial_rotary_factor = 0.75;  // [P] Phi-4-mini
  if (p.family == ModelFamily::kGemma3) {
    // [G]: GeGLU, local layers of base 10000 with a window of 512, every sixth layer global.
    c.hidden_act = HiddenAct::kGeluTanh;
    c.rope_local_base_freq = 10000.0;
    c.sliding_window = p.hidden_size == 1152 ? 512 : 1024;  // [G] 1b's 512, [G4] 4b's 1024
    for (int64_t i = 0; i < p.num_layers; ++i) c.sliding_window_layers.push_back((i + 1) % 6 != 0);
  }
  return c;
}

absl::Status Invalid(const ModelConfig& c, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("model config '", c.name, "': ", what));
}

bool FinitePositive(double v) { return std::isfinite(v) && v > 0; }

// Adds a*b (+ into *acc), reporting overflow.
bool AddProduct(int64_t* acc, int64_t a, int64_t b) {
  int64_t p;
  return !__builtin_mul_overflow(a, b, &p) && !__builtin_add_overflow(*acc, p, acc);
}

// The closed form, with overflow detection. nullopt on overflow.
std::optional<int64_t> CheckedParameterCount(const ModelConfig& c) {
  const int64_t e = c.hidden_size, v = c.vocab_size, i = c.intermediate_size;
  int64_t per_layer = 0;
  int64_t total = 0;
  if (c.architecture() == ModelArchitecture::kGpt2) {
    // ln_1, ln_2: 4E; c_attn: E x 3E + 3E; attn.c_proj: E x E + E; c_fc: E x I + I;
    // mlp.c_proj: I x E + E.
    if (!AddProduct(&per_layer, 4 * e, e) || !AddProduct(&per_layer, 2 * e, i) ||
        !AddProduct(&per_layer, 1, i) || !AddProduct(&per_layer, 9, e)) {
      return std::nullopt;
    }
    if (!AddProduct(&total, v + c.max_position_embeddings, e) ||
        !AddProduct(&total, c.num_layers, per_layer) || !AddProduct(&total, 2, e)) {
      return std::nullopt;
    }
    return total;
  }
  const int64_t q = c.q_size(), k = c.kv_size();
  if (!AddProduct(&per_layer, c.sandwich_norms() ? 4 : 2, e) || !AddProduct(&per_layer, 2 * e, q) ||
      !AddProduct(&per_layer, 2 * e, k) || !AddProduct(&per_layer, 3 * e, i)) {
    return std::nullopt;
  }
  if (c.qkv_bias && !AddProduct(&per_layer, 1, q + 2 * k)) return std::nullopt;
  if (c.o_proj_bias && !AddProduct(&per_layer, 1, e)) return std::nullopt;
  if (c.mlp_bias && !AddProduct(&per_layer, 1, 2 * i + e)) return std::nullopt;
  if (c.qk_norm() && !c.qk_norm_whole() && !AddProduct(&per_layer, 2, c.head_dim)) {
    return std::nullopt;
  }
  if (c.qk_norm_whole() && !AddProduct(&per_layer, 1, q + k)) return std::nullopt;
  if (!AddProduct(&total, v, e) || (!c.tie_word_embeddings && !AddProduct(&total, v, e)) ||
      !AddProduct(&total, 1, e) || !AddProduct(&total, c.num_layers, per_layer)) {
    return std::nullopt;
  }
  return total;
}

OperatorSpec Op(std::string name, std::vector<TensorSpec> tensors) {
  return OperatorSpec{std::move(name), std::move(tensors)};
}

// A linear layer: "<name>.weight" [out, in] and, with `bias`, "<name>.bias" [out].
OperatorSpec LinearOp(const std::string& name, int64_t in, int64_t out, bool bias) {
  OperatorSpec op{name, {{name + ".weight", {out, in}}}};
  if (bias) op.tensors.push_back({name + ".bias", {out}});
  return op;
}

// GPT-2's Conv1D: "<name>.weight" [in, out], "<name>.bias" [out].
OperatorSpec Conv1DOp(const std::string& name, int64_t in, int64_t out) {
  return Op(name, {{name + ".weight", {in, out}}, {name + ".bias", {out}}});
}

// The row blocks of a [V, E] vocabulary matrix: operator `op` holding `tensor` whole, or one
// operator "op[r0:r1]" holding "tensor[r0:r1]" per block.
void AppendVocabularyOperators(const std::string& op, const std::string& tensor, int64_t v,
                               int64_t e, const VocabLayoutOptions& layout,
                               std::vector<OperatorSpec>& ops) {
  CHECK_GE(layout.vocab_block_rows, 0);
  const int64_t rows = layout.vocab_block_rows == 0 ? v : std::min(layout.vocab_block_rows, v);
  if (rows == v) {
    ops.push_back(Op(op, {{tensor, {v, e}}}));
    return;
  }
  for (int64_t r = 0; r < v; r += rows) {
    const int64_t end = std::min(v, r + rows);
    ops.push_back(Op(RowBlockNameOf(op, r, end), {{RowBlockNameOf(tensor, r, end), {end - r, e}}}));
  }
}

std::vector<OperatorSpec> Gpt2Operators(const ModelConfig& c, const VocabLayoutOptions& layout) {
  const int64_t e = c.hidden_size, i = c.intermediate_size;
  auto layer_norm = [e](const std::string& name) {
    return Op(name, {{name + ".weight", {e}}, {name + ".bias", {e}}});
  };
  std::vector<OperatorSpec> ops;
  ops.reserve(3 + 6 * c.num_layers);
  AppendVocabularyOperators("wte", "wte.weight", c.vocab_size, e, layout, ops);
  ops.push_back(Op("wpe", {{"wpe.weight", {c.max_position_embeddings, e}}}));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("h.", l, ".");
    ops.push_back(layer_norm(p + "ln_1"));
    ops.push_back(Conv1DOp(p + "attn.c_attn", e, 3 * e));
    ops.push_back(Conv1DOp(p + "attn.c_proj", e, e));
    ops.push_back(layer_norm(p + "ln_2"));
    ops.push_back(Conv1DOp(p + "mlp.c_fc", e, i));
    ops.push_back(Conv1DOp(p + "mlp.c_proj", i, e));
  }
  ops.push_back(layer_norm("ln_f"));
  return ops;
}

std::vector<OperatorSpec> LlamaOperators(const ModelConfig& c, const VocabLayoutOptions& layout) {
  const int64_t e = c.hidden_size, i = c.intermediate_size, q = c.q_size(), k = c.kv_size();
  auto norm = [e](const std::string& name) { return Op(name, {{name + ".weight", {e}}}); };
  std::vector<OperatorSpec> ops;
  ops.reserve(3 + 7 * c.num_layers);
  AppendVocabularyOperators("model.embed_tokens", "model.embed_tokens.weight", c.vocab_size, e,
                            layout, ops);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    if (!c.post_norms()) ops.push_back(norm(p + "input_layernorm"));
    const std::string a = p + "self_attn.";
    OperatorSpec qkv{a + "qkv_proj",
                     {{a + "q_proj.weight", {q, e}},
                      {a + "k_proj.weight", {k, e}},
                      {a + "v_proj.weight", {k, e}}}};
    if (c.qkv_bias) {
      qkv.tensors.push_back({a + "q_proj.bias", {q}});
      qkv.tensors.push_back({a + "k_proj.bias", {k}});
      qkv.tensors.push_back({a + "v_proj.bias", {k}});
    }
    if (c.qk_norm()) {
      qkv.tensors.push_back({a + "q_norm.weight", {c.qk_norm_whole() ? q : c.head_dim}});
      qkv.tensors.push_back({a + "k_norm.weight", {c.qk_norm_whole() ? k : c.head_dim}});
    }
    ops.push_back(std::move(qkv));
    ops.push_back(LinearOp(a + "o_proj", q, e, c.o_proj_bias));
    ops.push_back(norm(p + "post_attention_layernorm"));
    if (c.sandwich_norms()) ops.push_back(norm(p + "pre_feedforward_layernorm"));
    ops.push_back(LinearOp(p + "mlp.gate_proj", e, i, c.mlp_bias));
    ops.push_back(LinearOp(p + "mlp.up_proj", e, i, c.mlp_bias));
    ops.push_back(LinearOp(p + "mlp.down_proj", i, e, c.mlp_bias));
    if (c.post_norms() || c.sandwich_norms()) {
      ops.push_back(norm(p + "post_feedforward_layernorm"));
    }
  }
  ops.push_back(norm("model.norm"));
  if (!c.tie_word_embeddings) {
    AppendVocabularyOperators("lm_head", "lm_head.weight", c.vocab_size, e, layout, ops);
  }
  return ops;
}

}  // namespace

absl::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt2:
      return "gpt2";
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kSmolLM3:
      return "smollm3";
    case ModelFamily::kOlmo2:
      return "olmo2";
    case ModelFamily::kPhi3:
      return "phi3";
    case ModelFamily::kGemma3:
      return "gemma3_text";
  }
  return "unknown";
}

ModelArchitecture ArchitectureOf(ModelFamily family) {
  return family == ModelFamily::kGpt2 ? ModelArchitecture::kGpt2 : ModelArchitecture::kLlama;
}

absl::string_view HiddenActName(HiddenAct act) {
  switch (act) {
    case HiddenAct::kSilu:
      return "silu";
    case HiddenAct::kGeluTanh:
      return "gelu_new";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, const ModelConfig& c) {
  os << "ModelConfig{name='" << c.name << "', family=" << ModelFamilyName(c.family)
     << ", vocab_size=" << c.vocab_size << ", hidden_size=" << c.hidden_size
     << ", num_layers=" << c.num_layers << ", num_heads=" << c.num_heads
     << ", num_kv_heads=" << c.num_kv_heads << ", head_dim=" << c.head_dim
     << ", intermediate_size=" << c.intermediate_size
     << ", max_position_embeddings=" << c.max_position_embeddings << ", norm_eps=" << c.norm_eps
     << ", rope_theta=" << c.rope_theta;
  if (c.partial_rotary_factor != 1.0) os << ", partial_rotary_factor=" << c.partial_rotary_factor;
  if (c.rope_scaling.type == RopeScalingType::kLlama3) {
    os << ", rope_scaling=llama3{factor=" << c.rope_scaling.factor
       << ", low_freq_factor=" << c.rope_scaling.low_freq_factor
       << ", high_freq_factor=" << c.rope_scaling.high_freq_factor
       << ", original_max_position_embeddings=" << c.rope_scaling.original_max_position_embeddings
       << "}";
  }
  if (c.rope_scaling.type == RopeScalingType::kLongRope) {
    os << ", rope_scaling=longrope{original_max_position_embeddings="
       << c.rope_scaling.original_max_position_embeddings << ", short_factor=["
       << absl::StrJoin(c.rope_scaling.short_factor, ",") << "], long_factor=["
       << absl::StrJoin(c.rope_scaling.long_factor, ",") << "]}";
  }
  os << ", qkv_bias=" << c.qkv_bias << ", o_proj_bias=" << c.o_proj_bias
     << ", mlp_bias=" << c.mlp_bias << ", tie_word_embeddings=" << c.tie_word_embeddings
     << ", hidden_act=" << HiddenActName(c.hidden_act);
  if (c.sliding_window > 0) {
    os << ", sliding_window=" << c.sliding_window << " on layers [";
    for (size_t i = 0; i < c.sliding_window_layers.size(); ++i) {
      os << (i > 0 ? "," : "") << (c.sliding_window_layers[i] ? 1 : 0);
    }
    os << "]";
  }
  if (!c.layers_without_rope.empty()) {
    os << ", layers_without_rope=[";
    for (size_t i = 0; i < c.layers_without_rope.size(); ++i) {
      os << (i > 0 ? "," : "") << (c.layers_without_rope[i] ? 1 : 0);
    }
    os << "]";
  }
  os << ", torch_dtype="
     << (c.torch_dtype.has_value() ? DTypeName(*c.torch_dtype) : absl::string_view("none")) << "}";
  return os;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_layers", c.num_layers},
      {"num_heads", c.num_heads},
      {"num_kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) return Invalid(c, absl::StrCat(field, " must be positive, got ", value));
  }
  if (c.num_layers > (int64_t{1} << 20)) {
    return Invalid(c, absl::StrCat("num_layers ", c.num_layers, " exceeds 2^20"));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Invalid(
        c, absl::StrCat("num_kv_heads ", c.num_kv_heads, " does not divide num_heads ", c.num_heads,
                        " (grouped-query attention shares each key/value "
                        "head among a whole number of query heads)"));
  }
  if (!FinitePositive(c.norm_eps)) {
    return Invalid(c, absl::StrCat("norm_eps must be finite and positive, got ", c.norm_eps));
  }
  int64_t q_size;
  if (__builtin_mul_overflow(c.num_heads, c.head_dim, &q_size)) {
    return Invalid(c, "num_heads * head_dim overflows");
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kNone &&
      (rs.factor != 0 || rs.low_freq_factor != 0 || rs.high_freq_factor != 0 ||
       rs.original_max_position_embeddings != 0)) {
    return Invalid(c, "rope_scaling parameters are set but rope_scaling.type is none");
  }
  if (rs.type != RopeScalingType::kLongRope &&
      (!rs.short_factor.empty() || !rs.long_factor.empty())) {
    return Invalid(c,
                   "rope_scaling.short_factor / long_factor are set but the type is not "
                   "longrope");
  }
  if (rs.type == RopeScalingType::kLongRope) {
    if (c.family != ModelFamily::kPhi3) {
      return Invalid(c, "rope_scaling longrope is supported for phi3 only");
    }
    if (rs.factor != 0 || rs.low_freq_factor != 0 || rs.high_freq_factor != 0) {
      return Invalid(c, "longrope has no factor / low_freq_factor / high_freq_factor");
    }
    if (rs.original_max_position_embeddings <= 0) {
      return Invalid(c, absl::StrCat("original_max_position_embeddings must be positive, got ",
                                     rs.original_max_position_embeddings));
    }
    for (const auto& [key, factors] :
         {std::pair<const char*, const std::vector<double>*>{"short_factor", &rs.short_factor},
          {"long_factor", &rs.long_factor}}) {
      if (static_cast<int64_t>(factors->size()) != c.rotary_dim() / 2) {
        return Invalid(
            c, absl::StrCat("rope_scaling.", key, " has ", factors->size(),
                            " entries; longrope needs rotary_dim / 2 = ", c.rotary_dim() / 2));
      }
      for (const double f : *factors) {
        if (!FinitePositive(f)) {
          return Invalid(c,
                         absl::StrCat("rope_scaling.", key, " entries must be positive, got ", f));
        }
      }
    }
  }
  const absl::string_view family = ModelFamilyName(c.family);
  if (c.architecture() == ModelArchitecture::kGpt2) {
    if (c.num_kv_heads != c.num_heads) {
      return Invalid(c, absl::StrCat("gpt2 has no grouped-query attention: num_kv_heads ",
                                     c.num_kv_heads, " must equal num_heads ", c.num_heads));
    }
    if (q_size != c.hidden_size) {
      return Invalid(c, absl::StrCat("gpt2 needs head_dim * num_heads == hidden_size, got ",
                                     c.head_dim, " * ", c.num_heads, " != ", c.hidden_size));
    }
    if (!c.qkv_bias || !c.o_proj_bias || !c.mlp_bias) {
      return Invalid(c,
                     "gpt2 has biases on every linear: qkv_bias, o_proj_bias and mlp_bias must "
                     "be true");
    }
    if (!c.tie_word_embeddings) {
      return Invalid(c, "gpt2's LM head is tied to wte: tie_word_embeddings must be true");
    }
    if (c.hidden_act != HiddenAct::kGeluTanh) {
      return Invalid(
          c, absl::StrCat("gpt2 uses hidden_act gelu_new, got ", HiddenActName(c.hidden_act)));
    }
    if (rs.type != RopeScalingType::kNone) {
      return Invalid(c, "gpt2 has learned positions: rope_scaling must be none");
    }
  } else {
    if (c.head_dim % 2 != 0) {
      return Invalid(
          c, absl::StrCat("head_dim ", c.head_dim, " is odd; RoPE rotates pairs of channels"));
    }
    if (!FinitePositive(c.rope_theta)) {
      return Invalid(c, absl::StrCat("rope_theta must be finite and positive, got ", c.rope_theta));
    }
    if (rs.type == RopeScalingType::kLinear) {
      if (c.family != ModelFamily::kGemma3) {
        return Invalid(c, "rope_scaling linear is supported for gemma3_text only");
      }
      if (!std::isfinite(rs.factor) || rs.factor < 1) {
        return Invalid(c, absl::StrCat("rope_scaling.factor must be >= 1, got ", rs.factor));
      }
      if (rs.low_freq_factor != 0 || rs.high_freq_factor != 0 ||
          rs.original_max_position_embeddings != 0) {
        return Invalid(c, "linear rope scaling has only a factor");
      }
    }
    if (rs.type == RopeScalingType::kLlama3) {
      if (!std::isfinite(rs.factor) || rs.factor < 1) {
        return Invalid(c, absl::StrCat("rope_scaling.factor must be >= 1, got ", rs.factor));
      }
      if (!FinitePositive(rs.low_freq_factor)) {
        return Invalid(c, absl::StrCat("rope_scaling.low_freq_factor must be positive, got ",
                                       rs.low_freq_factor));
      }
      if (!std::isfinite(rs.high_freq_factor) || rs.high_freq_factor <= rs.low_freq_factor) {
        return Invalid(c, absl::StrCat("rope_scaling.high_freq_factor ", rs.high_freq_factor,
                                       " must exceed low_freq_factor ", rs.low_freq_factor));
      }
      if (rs.original_max_position_embeddings <= 0) {
        return Invalid(
            c, absl::StrCat("rope_scaling.original_max_position_embeddings must be positive, "
                            "got ",
                            rs.original_max_position_embeddings));
      }
    }
    const HiddenAct act =
        c.family == ModelFamily::kGemma3 ? HiddenAct::kGeluTanh : HiddenAct::kSilu;
    if (c.hidden_act != act) {
      return Invalid(c, absl::StrCat(family, " uses hidden_act ", HiddenActName(act), ", got ",
                                     HiddenActName(c.hidden_act)));
    }
    if (c.family == ModelFamily::kGemma3) {
      if (!FinitePositive(c.rope_local_base_freq)) {
        return Invalid(c, absl::StrCat("rope_local_base_freq must be finite and positive, got ",
                                       c.rope_local_base_freq));
      }
      if (rs.type != RopeScalingType::kNone && rs.type != RopeScalingType::kLinear) {
        return Invalid(c, "gemma3_text: rope_scaling other than none and linear is not supported");
      }
    } else if (c.rope_local_base_freq != 0) {
      return Invalid(c, absl::StrCat(family,
                                     " has one RoPE base: rope_local_base_freq must be 0 "
                                     "(gemma3_text only)"));
    }
    switch (c.family) {
      case ModelFamily::kLlama:
        if (c.qkv_bias != c.o_proj_bias) {
          return Invalid(c,
                         "llama's config.json has one attention_bias for q, k, v and o: "
                         "qkv_bias and o_proj_bias must be equal");
        }
        break;
      case ModelFamily::kQwen2:
        if (!c.qkv_bias || c.o_proj_bias || c.mlp_bias) {
          return Invalid(c,
                         "qwen2 has biases on q, k and v only: qkv_bias must be true, "
                         "o_proj_bias and mlp_bias false");
        }
        break;
      case ModelFamily::kQwen3:
        if (c.qkv_bias != c.o_proj_bias || c.mlp_bias) {
          return Invalid(c,
                         "qwen3's config.json has one attention_bias for q, k, v and o and no "
                         "MLP bias: qkv_bias and o_proj_bias must be equal, mlp_bias false");
        }
        break;
      case ModelFamily::kOlmo2:
        if (c.qkv_bias != c.o_proj_bias || c.mlp_bias) {
          return Invalid(c,
                         "olmo2's config.json has one attention_bias for q, k, v and o and no "
                         "MLP bias: qkv_bias and o_proj_bias must be equal, mlp_bias false");
        }
        break;
      case ModelFamily::kGemma3:
        if (c.qkv_bias != c.o_proj_bias || c.mlp_bias) {
          return Invalid(c,
                         "gemma3_text's config.json has one attention_bias for q, k, v and o and "
                         "no MLP bias: qkv_bias and o_proj_bias must be equal, mlp_bias false");
        }
        break;
      case ModelFamily::kSmolLM3:
        if (c.qkv_bias != c.o_proj_bias) {
          return Invalid(c,
                         "smollm3's config.json has one attention_bias for q, k, v and o: "
                         "qkv_bias and o_proj_bias must be equal");
        }
        break;
      case ModelFamily::kMistral:
      case ModelFamily::kPhi3:
        if (c.qkv_bias || c.o_proj_bias || c.mlp_bias) {
          return Invalid(c, absl::StrCat(family,
                                         " has no biases: qkv_bias, o_proj_bias and mlp_bias "
                                         "must be false"));
        }
        break;
      case ModelFamily::kGpt2:
        break;
    }
  }
  if (c.partial_rotary_factor != 1.0) {
    if (c.family != ModelFamily::kPhi3) {
      return Invalid(c, absl::StrCat(family,
                                     " rotates whole heads: partial_rotary_factor must be "
                                     "1 (phi3 only)"));
    }
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) {
      return Invalid(c, absl::StrCat("partial_rotary_factor must be in (0, 1], got ",
                                     c.partial_rotary_factor));
    }
    if (c.rotary_dim() <= 0 || c.rotary_dim() % 2 != 0) {
      return Invalid(
          c, absl::StrCat("partial_rotary_factor ", c.partial_rotary_factor, " gives rotary_dim ",
                          c.rotary_dim(), " of head_dim ", c.head_dim,
                          "; RoPE rotates a positive even number of "
                          "channels"));
    }
  }
  if (!c.layers_without_rope.empty()) {
    if (c.family != ModelFamily::kSmolLM3) {
      return Invalid(c, absl::StrCat(family, " applies RoPE on every layer: layers_without_rope "
                                             "must be empty (smollm3 only)"));
    }
    if (static_cast<int64_t>(c.layers_without_rope.size()) != c.num_layers) {
      return Invalid(c, absl::StrCat("layers_without_rope has ", c.layers_without_rope.size(),
                                     " entries for ", c.num_layers, " layers"));
    }
  }
  if (c.sliding_window < 0) {
    return Invalid(c, absl::StrCat("sliding_window must be >= 0 (0: none), got ",
                                   c.sliding_window));
  }
  if (c.sliding_window == 0 && !c.sliding_window_layers.empty()) {
    return Invalid(c, "sliding_window_layers is set but sliding_window is 0");
  }
  if (c.sliding_window > 0) {
    if (static_cast<int64_t>(c.sliding_window_layers.size()) != c.num_layers) {
      return Invalid(c, absl::StrCat("sliding_window_layers has ", c.sliding_window_layers.size(),
                                     " entries for ", c.num_layers, " layers"));
    }
    if (c.family == ModelFamily::kGpt2 || c.family == ModelFamily::kLlama ||
        c.family == ModelFamily::kSmolLM3 || c.family == ModelFamily::kOlmo2) {
      return Invalid(c, absl::StrCat(family, "'s config.json has no sliding window: "
                                             "sliding_window must be 0"));
    }
    if ((c.family == ModelFamily::kMistral || c.family == ModelFamily::kPhi3) &&
        std::find(c.sliding_window_layers.begin(), c.sliding_window_layers.end(), false) !=
            c.sliding_window_layers.end()) {
      return Invalid(c, absl::StrCat(family,
                                     "'s sliding_window applies to every layer: "
                                     "sliding_window_layers must be all true"));
    }
  }
  if (!CheckedParameterCount(c).has_value()) {
    return Invalid(c, "the parameter count overflows a 64-bit integer");
  }
  return absl::OkStatus();
}

double LongRopeAttentionFactor(const ModelConfig& c) {
  if (c.rope_scaling.type != RopeScalingType::kLongRope) return 1.0;
  const double original = static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  const double factor = static_cast<double>(c.max_position_embeddings) / original;
  if (factor <= 1.0) return 1.0;
  return std::sqrt(1 + std::log(factor) / std::log(original));
}

absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name) {
  for (const LlamaPreset& p : kLlamaPresets) {
    if (name == p.name) return FromLlamaPreset(p);
  }
  for (const std::string& gpt : GptPresetNames()) {
    if (name == gpt) {
      ASSIGN_OR_RETURN(const GptConfig g, GptPreset(name));
      return FromGptConfig(g);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model preset '", name,
                   "'; known presets: ", absl::StrJoin(ModelPresetNames(), ", ")));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const LlamaPreset& p : kLlamaPresets) names.push_back(p.name);
  for (std::string& gpt : GptPresetNames()) names.push_back(std::move(gpt));
  return names;
}

std::vector<OperatorSpec> ModelOperators(const ModelConfig& config,
                                         const VocabLayoutOptions& layout) {
  const absl::Status valid = ValidateModelConfig(config);
  CHECK(valid.ok()) << valid;
  return config.architecture() == ModelArchitecture::kGpt2 ? Gpt2Operators(config, layout)
                                                           : LlamaOperators(config, layout);
}

int64_t ModelParameterCount(const ModelConfig& config) {
  const std::optional<int64_t> count = CheckedParameterCount(config);
  CHECK(count.has_value()) << "parameter count of '" << config.name << "' overflows";
  return *count;
}

ModelFlops ModelTrainingFlops(const ModelConfig& c, int64_t batch, int64_t seq_len) {
  const double n = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double E = static_cast<double>(c.hidden_size), V = static_cast<double>(c.vocab_size),
               L = static_cast<double>(c.num_layers), T = static_cast<double>(seq_len),
               Q = static_cast<double>(c.q_size()), K = static_cast<double>(c.kv_size()),
               I = static_cast<double>(c.intermediate_size);
  const double per_layer = c.architecture() == ModelArchitecture::kLlama
                               ? E * (Q + 2 * K) + Q * E + 3 * E * I
                               : E * (Q + 2 * K) + Q * E + 2 * E * I;
  ModelFlops f;
  f.linear = 6.0 * n * L * per_layer;
  f.head = 6.0 * n * E * V;
  // Query-key pairs per sequence and layer: the causal triangle, or with a sliding window W
  // (query t sees min(t + 1, W) keys) W (W + 1) / 2 + (T - W) W once T > W.
  if (c.sliding_window == 0 || c.sliding_window >= seq_len) {
    f.attention = 3.0 * L * static_cast<double>(batch) * 4.0 * T * (T + 1) / 2.0 * Q;
    return f;
  }
  double pairs = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t w = c.LayerSlidingWindow(l);
    if (w == 0) {
      pairs += T * (T + 1) / 2.0;
    } else {
      const double W = static_cast<double>(w);
      pairs += W * (W + 1) / 2.0 + (T - W) * W;
    }
  }
  f.attention = 3.0 * static_cast<double>(batch) * 4.0 * pairs * Q;
  return f;
}

ModelConfig FromGptConfig(const GptConfig& gpt) {
  ModelConfig c;
  c.name = gpt.name;
  c.family = ModelFamily::kGpt2;
  c.vocab_size = gpt.vocab_size;
  c.hidden_size = gpt.hidden;
  c.num_layers = gpt.num_layers;
  c.num_heads = gpt.num_heads;
  c.num_kv_heads = gpt.num_heads;
  c.head_dim = gpt.num_heads > 0 ? gpt.hidden / gpt.num_heads : 0;
  c.intermediate_size = 4 * gpt.hidden;
  c.max_position_embeddings = gpt.max_seq_len;
  c.norm_eps = 1e-5;
  c.qkv_bias = c.o_proj_bias = c.mlp_bias = true;
  c.tie_word_embeddings = true;
  c.hidden_act = HiddenAct::kGeluTanh;
  return c;
}

absl::StatusOr<GptConfig> ToGptConfig(const ModelConfig& c) {
  if (c.family != ModelFamily::kGpt2) {
    return Invalid(c, absl::StrCat("is a ", ModelFamilyName(c.family),
                                   " model, not gpt2; GptConfig describes GPT-2 only"));
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  if (c.intermediate_size != 4 * c.hidden_size) {
    return Invalid(c, absl::StrCat("intermediate_size (n_inner) ", c.intermediate_size,
                                   " is not 4 * hidden_size = ", 4 * c.hidden_size,
                                   ", the only MLP width GptModel has"));
  }
  if (c.norm_eps != 1e-5) {
    return Invalid(c, absl::StrCat("norm_eps (layer_norm_epsilon) ", c.norm_eps,
                                   " is not 1e-5, the only value GptModel computes with"));
  }
  return GptConfig{c.name,        c.vocab_size, c.max_position_embeddings,
                   c.hidden_size, c.num_layers, c.num_heads};
}

}  // namespace ps
