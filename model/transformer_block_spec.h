// TransformerBlockSpec: the small description of a transformer block that lets one chunked model
// (model/gpt_model.h) and one activation profile (model/gpt_activation_profile.h) serve both
// architectures of model/model_config.h. Everything else (operator accesses, gradient slots,
// activation checkpointing, 16-bit chunks, the vocabulary in row blocks) is shared; these fields
// are what differs between GPT-2 and the Llama family.
//
// Thread safety: a value type and a pure function.
#ifndef PATRICKSTAR_MODEL_TRANSFORMER_BLOCK_SPEC_H_
#define PATRICKSTAR_MODEL_TRANSFORMER_BLOCK_SPEC_H_

#include <cstdint>
#include <vector>

#include "model/kernels/swiglu_math.h"
#include "model/model_config.h"

namespace ps {

struct TransformerBlockSpec {
  // LayerNorm (weight and bias, keeps mean and rstd) or RMSNorm (weight, keeps rstd); the final
  // norm is the same kind.
  enum class Norm { kLayerNorm, kRmsNorm };
  // GPT-2's c_fc -> GELU(tanh) -> c_proj, or SwiGLU: down(silu(gate(x)) * up(x)).
  enum class Mlp { kGelu, kSwiGlu };
  // GPT-2's fused c_attn ([in, out] Conv1D, multi-head attention over the packed qkv), or
  // separate q/k/v nn.Linear projections, RoPE on q and k, grouped-query attention.
  enum class Attention { kFusedMha, kGqaRope };
  // Learned absolute positions (wpe, added to the embedding) or rotary positions.
  enum class Positions { kLearned, kRope };

  Norm norm = Norm::kLayerNorm;
  Mlp mlp = Mlp::kGelu;
  Attention attention = Attention::kFusedMha;
  Positions positions = Positions::kLearned;
  // Linear weights stored [out, in] (nn.Linear) rather than [in, out] (GPT-2's Conv1D).
  bool linear_out_in = false;
  bool qkv_bias = true;
  bool o_bias = true;
  bool mlp_bias = true;
  // A per-head RMSNorm of q and of k (weights q_norm, k_norm [head_dim] in the q/k/v operator,
  // eps norm_eps) after the projections, before RoPE: Qwen3.
  bool qk_norm = false;
  // The q/k norm over each token's whole projection (weights [Q], [K]) instead of per head: OLMo 2.
  bool qk_norm_whole = false;
  // The block's two norms after attention and after the MLP, on the sublayer's output before the
  // residual add (x + norm(attention(x)), then h + norm(mlp(h))), instead of on their inputs:
  // OLMo 2.
  bool post_norms = false;
  // Gemma's four norms: the pre-norms (ln_1 before attention, ln_2 before the MLP) and a norm of
  // each sublayer's output before the residual add (ln_1_post, ln_2_post):
  // h = x + ln_1_post(attention(ln_1(x))), out = h + ln_2_post(mlp(ln_2(h))).
  bool sandwich_norms = false;
  // Every RMSNorm's gain is (norm_weight_offset + w) (Gemma: 1; RmsNormShape::weight_offset).
  double norm_weight_offset = 0;
  // The token embedding times this factor, rounded to f32 (Gemma: sqrt(hidden_size)); 0 = none.
  double embedding_multiplier = 0;
  // The MLP gate's activation (kSwiGlu only): silu, or Gemma's tanh GELU (GeGLU).
  GateActivation gate = GateActivation::kSilu;
  // LM head = token embedding (no lm_head operators).
  bool tied_lm_head = true;
  // Layers whose attention rotates neither q nor k (SmolLM3's NoPE layers; kRope only): one entry
  // per layer, or empty for RoPE on every layer.
  std::vector<bool> layers_without_rope;
  // Partial rotary (Phi-3; kRope only): RoPE on the first rotary_dim channels of each head (the
  // RoPE tables then have rotary_dim / 2 columns); 0 = the whole head.
  int64_t rotary_dim = 0;

  // Whether `layer` applies the positions' rotation (kRope and not a NoPE layer).
  bool RopeOn(int64_t layer) const {
    return positions == Positions::kRope &&
           (layers_without_rope.empty() || !layers_without_rope[static_cast<size_t>(layer)]);
  }
};

// The block of `config`'s architecture. REQUIRES: ValidateModelConfig(config) is OK.
inline TransformerBlockSpec BlockSpecOf(const ModelConfig& config) {
  TransformerBlockSpec s;
  if (config.architecture() == ModelArchitecture::kLlama) {
    s.norm = TransformerBlockSpec::Norm::kRmsNorm;
    s.mlp = TransformerBlockSpec::Mlp::kSwiGlu;
    s.attention = TransformerBlockSpec::Attention::kGqaRope;
    s.positions = TransformerBlockSpec::Positions::kRope;
    s.linear_out_in = true;
  }
  s.qkv_bias = config.qkv_bias;
  s.o_bias = config.o_proj_bias;
  s.mlp_bias = config.mlp_bias;
  s.qk_norm = config.qk_norm();
  s.qk_norm_whole = config.qk_norm_whole();
  s.post_norms = config.post_norms();
  s.sandwich_norms = config.sandwich_norms();
  s.norm_weight_offset = config.norm_weight_offset();
  s.embedding_multiplier = config.embedding_multiplier();
  if (config.architecture() == ModelArchitecture::kLlama &&
      config.hidden_act == HiddenAct::kGeluTanh) {
    s.gate = GateActivation::kGeluTanh;
  }
  s.tied_lm_head = config.tie_word_embeddings;
  s.layers_without_rope = config.layers_without_rope;
  if (config.rotary_dim() != config.head_dim) s.rotary_dim = config.rotary_dim();
  return s;
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_TRANSFORMER_BLOCK_SPEC_H_
