// ProgramLayoutOf (model/transformer_program.h): the program's operators and tensors, in the order
// of ModelOperators (model/model_config.h), resolved to ids.
#include <cstddef>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "model/transformer_block_spec.h"
#include "model/transformer_program.h"

namespace ps {

using Block = ProgramLayout::Block;
using Op = ProgramLayout::Op;
using VocabBlock = ProgramLayout::VocabBlock;

ProgramLayout ProgramLayoutOf(const ModelConfig& config, absl::Span<const OperatorSpec> ops,
                              absl::Span<const GptVocabBlock> rows,
                              absl::FunctionRef<OperatorId(size_t op)> op_id,
                              absl::FunctionRef<TensorId(size_t op, size_t tensor)> tensor_id) {
  const TransformerBlockSpec spec = BlockSpecOf(config);
  auto op_at = [&](size_t i) {
    Op r{.op = op_id(i), .w = tensor_id(i, 0), .trainable = ops[i].trainable};
    if (ops[i].tensors.size() > 1) r.b = tensor_id(i, 1);
    return r;
  };
  auto blocks_at = [&](size_t first) {
    std::vector<VocabBlock> out;
    for (size_t k = 0; k < rows.size(); ++k) {
      out.push_back({op_id(first + k), tensor_id(first + k, 0), rows[k].row_begin, rows[k].rows,
                     ops[first + k].trainable});
    }
    return out;
  };
  ProgramLayout layout;
  const size_t nb = rows.size();
  layout.embed = blocks_at(0);
  size_t next = nb;
  if (spec.positions == TransformerBlockSpec::Positions::kLearned) layout.wpe = op_at(next++);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    Block b;
    if (spec.attention == TransformerBlockSpec::Attention::kFusedMha) {
      // ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj.
      b.ln_1 = op_at(next);
      b.qkv = op_at(next + 1);
      b.attn_out = op_at(next + 2);
      b.ln_2 = op_at(next + 3);
      b.mlp_in = op_at(next + 4);
      b.mlp_out = op_at(next + 5);
      next += 6;
    } else {
      // input_layernorm, self_attn.qkv_proj (q, k, v weights, then with biases q, k, v biases,
      // then with the q/k norm q_norm and k_norm),
      // self_attn.o_proj, post_attention_layernorm, mlp.gate_proj, mlp.up_proj, mlp.down_proj.
      // With post norms (OLMo 2): self_attn.qkv_proj, self_attn.o_proj,
      // post_attention_layernorm (ln_1), the MLP, post_feedforward_layernorm (ln_2).
      const bool post = spec.post_norms;
      if (!post) b.ln_1 = op_at(next++);
      const size_t q = next;
      ProgramLayout::QkvOp& s = b.qkv_split;
      s.op = op_id(q);
      s.trainable = ops[q].trainable;
      s.q_w = tensor_id(q, 0);
      s.k_w = tensor_id(q, 1);
      s.v_w = tensor_id(q, 2);
      size_t next_tensor = 3;
      if (config.qkv_bias) {
        s.q_b = tensor_id(q, next_tensor++);
        s.k_b = tensor_id(q, next_tensor++);
        s.v_b = tensor_id(q, next_tensor++);
      }
      if (spec.qk_norm) {
        s.q_norm = tensor_id(q, next_tensor++);
        s.k_norm = tensor_id(q, next_tensor++);
      }
      CHECK_EQ(next_tensor, ops[q].tensors.size()) << ops[q].name;
      b.attn_out = op_at(next + 1);
      if (spec.sandwich_norms) {
        // Gemma: post_attention_layernorm, pre_feedforward_layernorm, the MLP,
        // post_feedforward_layernorm.
        b.ln_1_post = op_at(next + 2);
        b.ln_2 = op_at(next + 3);
        b.mlp_in = op_at(next + 4);
        b.mlp_up = op_at(next + 5);
        b.mlp_out = op_at(next + 6);
        b.ln_2_post = op_at(next + 7);
        next += 8;
        layout.blocks.push_back(b);
        continue;
      }
      if (post) {
        b.ln_1 = op_at(next + 2);
      } else {
        b.ln_2 = op_at(next + 2);
      }
      b.mlp_in = op_at(next + 3);
      b.mlp_up = op_at(next + 4);
      b.mlp_out = op_at(next + 5);
      next += 6;
      if (post) b.ln_2 = op_at(next++);
    }
    layout.blocks.push_back(b);
  }
  layout.ln_f = op_at(next++);
  if (!spec.tied_lm_head) {
    layout.lm_head = blocks_at(next);
    next += nb;
  }
  // The adapters: "<base>.lora" holds (lora_A, lora_B) pairs named after the adapted module.
  if (next == ops.size()) return layout;
  absl::flat_hash_map<std::string, ProgramLayout::Lora*> lora_of;  // module -> its adapter slot
  for (size_t l = 0; l < layout.blocks.size(); ++l) {
    Block& b = layout.blocks[l];
    const bool gpt2 = spec.attention == TransformerBlockSpec::Attention::kFusedMha;
    const std::string p =
        gpt2 ? "h." + std::to_string(l) + "." : "model.layers." + std::to_string(l) + ".";
    if (gpt2) {
      lora_of[p + "attn.c_attn"] = &b.qkv.lora;
      lora_of[p + "attn.c_proj"] = &b.attn_out.lora;
      lora_of[p + "mlp.c_fc"] = &b.mlp_in.lora;
      lora_of[p + "mlp.c_proj"] = &b.mlp_out.lora;
    } else {
      lora_of[p + "self_attn.q_proj"] = &b.qkv_split.q_lora;
      lora_of[p + "self_attn.k_proj"] = &b.qkv_split.k_lora;
      lora_of[p + "self_attn.v_proj"] = &b.qkv_split.v_lora;
      lora_of[p + "self_attn.o_proj"] = &b.attn_out.lora;
      lora_of[p + "mlp.gate_proj"] = &b.mlp_in.lora;
      lora_of[p + "mlp.up_proj"] = &b.mlp_up.lora;
      lora_of[p + "mlp.down_proj"] = &b.mlp_out.lora;
    }
  }
  constexpr absl::string_view kA = ".lora_A.weight", kB = ".lora_B.weight";
  for (size_t i = next; i < ops.size(); ++i) {
    const OperatorSpec& op = ops[i];
    CHECK(absl::EndsWith(op.name, ".lora") && op.tensors.size() % 2 == 0 && !op.tensors.empty())
        << "not an adapter operator: " << op.name;
    for (size_t j = 0; j < op.tensors.size(); j += 2) {
      const TensorSpec& a = op.tensors[j];
      const TensorSpec& bt = op.tensors[j + 1];
      CHECK(absl::EndsWith(a.name, kA) && absl::EndsWith(bt.name, kB)) << op.name;
      const std::string module(absl::string_view(a.name).substr(0, a.name.size() - kA.size()));
      auto it = lora_of.find(module);
      CHECK(it != lora_of.end()) << "adapter of an unknown linear: " << a.name;
      CHECK_EQ(a.shape.size(), 2u) << a.name;
      *it->second = ProgramLayout::Lora{
          .op = op_id(i), .a = tensor_id(i, j), .b = tensor_id(i, j + 1), .rank = a.shape[0]};
    }
  }
  return layout;
}

}  // namespace ps
