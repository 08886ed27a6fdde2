#!/usr/bin/env python3
"""Parity directories for the families of issue #40, written and run by transformers itself.

Each directory model/testdata/parity_<name>/ holds what transformers' save_pretrained writes for a
tiny model with fixed seeded weights (config.json, model.safetensors, float32), and
reference.safetensors with transformers' own results on a fixed batch:
  tokens, targets        I32 [B, T] (targets -100 are ignored)
  loss_f32               F32 [], transformers' model in float32 with attn_implementation="eager"
                         (its code unchanged)
  loss_f64               F64 [], the model in float64 (RMSNorm without its float32 cast and sdpa
                         attention, whose softmax is not forced to float32, as
                         model/kernels/testing/testdata/make_llama_testdata.py explains)
  grad.<name>            F64, d loss_f64 / d parameter (torch autograd; a tied head appears once;
                         Phi-3's fused qkv_proj / gate_up_proj gradients split into the q/k/v and
                         gate/up row ranges the C++ model keeps, under their names)
  loss_f32_ablated      F32 [], the same model without the family's feature (the window off; RoPE
                         on every layer): the test checks the feature changes the loss by far more
                         than its tolerance, so a model that ignores it fails
The C++ test (model/llama_model_test.cc, FamiliesMatchTransformers) reads the directory with the
project's own Hugging Face reader and compares; CI never runs Python.

Directories:
  parity_mistral_window  MistralForCausalLM, sliding_window 4 < T = 11, GQA (4 heads, 2 kv
                         heads), untied head. The script asserts that transformers applies the
                         window in eager attention (the loss differs from sliding_window=None).
  parity_smollm3_nope    SmolLM3ForCausalLM, 3 layers with no_rope_layers [1, 0, 1] (layer 1 has
                         no RoPE), GQA, tied head (SmolLM3Config's default), rope_theta 100
                         so that RoPE matters over 11 tokens.
  parity_olmo2           Olmo2ForCausalLM, 2 layers, norms after attention and MLP, q/k RMSNorm
                         over the whole projection, GQA (4 heads, 2 kv heads), untied head
                         (no ablation: a pre-norm model has other parameter names).
  parity_phi3            Phi3ForCausalLM, 2 layers, partial_rotary_factor 0.5 (RoPE on 4 of 8
                         channels per head), sliding_window 4 < T = 11 on every layer, GQA,
                         untied head, rope_theta 100; its files hold the fused qkv_proj and
                         gate_up_proj. Ablation: partial_rotary_factor 1 (RoPE on whole heads).
  parity_phi3_longrope   Phi3ForCausalLM with rope_scaling longrope (short_factor [1.5, 3],
                         long_factor [2.5, 7]), max_position_embeddings 64 and
                         original_max_position_embeddings 8 < T = 11: the long factors and
                         cos/sin scaled by sqrt(1 + ln 8 / ln 8). Ablation: no rope_scaling.
  parity_phi3_shortrope  the same with original_max_position_embeddings 32 >= T: the short
                         factors, scaled by sqrt(1 + ln 2 / ln 32). Ablation: no rope_scaling.
  parity_gemma3          Gemma3ForCausalLM (model_type gemma3_text), 3 layers: sliding, full,
                         sliding with sliding_window 4 < T = 11, rope_local_base_freq 100 on the
                         sliding layers and rope_theta 10000 on the full one, GQA (4 heads, 2 kv
                         heads, head_dim 8 = query_pre_attn_scalar), tied head, four (1 + w)
                         RMSNorms per layer and the per-head q/k norms (gains 1 + w with w in
                         U(-0.3, 0.3)), GeGLU, embeddings times sqrt(32). Ablation: every layer
                         full attention (no window, rope_theta everywhere).
  parity_gemma3_linear   the same with rope_scaling {"rope_type": "linear", "factor": 4} (Gemma 3
                         4B's kind) and rope_theta 100, on the full layer only (the sliding
                         layers keep rope_local_base_freq's plain tables). Ablation: no
                         rope_scaling.

Recorded run (the committed files were made by it):
  /work/venv-peftnew/bin/python model/testdata/make_family_parity.py model/testdata
  # (parity_mistral_window's reference named its ablation loss_f32_no_window until SmolLM3 came;
  # the whole set was rewritten then, with the same weights and tokens)
  # torch 2.15.0, transformers 4.57.6, safetensors 0.8.0, numpy 2.4.6 (Python 3.11)
"""
import json
import os
import shutil
import sys
import types

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

BATCH, SEQ_LEN = 2, 11  # model/llama_model_test.cc's kBatch, kSeqLen


def fill_weights(model, seed):
    """Norm gains 1 + U(-0.3, 0.3), everything else N(0, 0.2): far from initialization. (Gemma's
    norms store w of the gain 1 + w: w itself is U(-0.3, 0.3) there.)"""
    gen = torch.Generator().manual_seed(seed)
    center = 0.0 if model.config.model_type == "gemma3_text" else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(center + 0.6 * (torch.rand(p.shape, generator=gen) - 0.5))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def batch(seed, vocab):
    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, vocab, (BATCH, SEQ_LEN + 1), generator=gen)
    tokens, targets = stream[:, :-1].clone(), stream[:, 1:].clone()
    targets[:, -1] = -100
    targets[1, 3] = -100
    return tokens.to(torch.int32), targets


def rmsnorm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def gemma_rmsnorm_in_input_dtype(self, x):
    """Gemma3RMSNorm without its float32 cast: x rsqrt(mean(x^2) + eps) (1 + w)."""
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * (1.0 + self.weight)


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens.long(), use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100)


def mistral_window():
    return transformers.MistralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4, tie_word_embeddings=False,
        hidden_act="silu", pad_token_id=None, attn_implementation="eager")


def smollm3_nope():
    return transformers.SmolLM3Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=100.0, no_rope_layers=[1, 0, 1], pad_token_id=None,
        bos_token_id=None, eos_token_id=None, attn_implementation="eager")


def olmo2():
    return transformers.Olmo2Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")


def phi3():
    return transformers.Phi3Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        original_max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=100.0,
        partial_rotary_factor=0.5, sliding_window=4, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")


def phi3_longrope(original):
    def config():
        return transformers.Phi3Config(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            original_max_position_embeddings=original, rms_norm_eps=1e-5, rope_theta=100.0,
            partial_rotary_factor=0.5, sliding_window=None, tie_word_embeddings=False,
            rope_scaling={"type": "longrope", "short_factor": [1.5, 3.0],
                          "long_factor": [2.5, 7.0]},
            pad_token_id=None, bos_token_id=None, eos_token_id=None,
            attn_implementation="eager")
    return config


def gemma3(rope_theta=10000.0, rope_scaling=None):
    def config():
        return transformers.Gemma3TextConfig(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
            max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=rope_theta,
            rope_scaling=rope_scaling, rope_local_base_freq=100.0, sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=None,
            bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    return config


def split_fused(config, name, tensor):
    """Phi-3's fused qkv_proj [Q + 2K, E] and gate_up_proj [2I, E] as the parameters the C++
    model keeps (q/k/v_proj, gate/up_proj: their row ranges), or None for any other tensor."""
    head_dim = config.hidden_size // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    k = config.num_key_value_heads * head_dim
    if name.endswith("self_attn.qkv_proj.weight"):
        p = name[:-len("qkv_proj.weight")]
        return [(p + "q_proj.weight", tensor[:q]), (p + "k_proj.weight", tensor[q:q + k]),
                (p + "v_proj.weight", tensor[q + k:])]
    if name.endswith("mlp.gate_up_proj.weight"):
        p = name[:-len("gate_up_proj.weight")]
        i = config.intermediate_size
        return [(p + "gate_proj.weight", tensor[:i]), (p + "up_proj.weight", tensor[i:])]
    return None


def make(out_dir, name, config_fn, seed, ablation=None):
    directory = os.path.join(out_dir, "parity_" + name)
    if os.path.exists(directory):
        shutil.rmtree(directory)
    torch.manual_seed(0)
    config = config_fn()
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="eager")
    model.eval()
    fill_weights(model, seed)
    model.save_pretrained(directory)
    tokens, targets = batch(seed + 1, config.vocab_size)
    ref = {"tokens": tokens.contiguous(), "targets": targets.to(torch.int32).contiguous()}

    # Reload what was written, as the C++ side does.
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                              attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        loss32 = loss_of(model, tokens, targets)
    ref["loss_f32"] = loss32.reshape(())

    if ablation is not None:
        off = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, attn_implementation="eager", **ablation)
        with torch.no_grad():
            loss_off = loss_of(off, tokens, targets)
        ref["loss_f32_ablated"] = loss_off.reshape(())
        # The feature must matter, or the test proves nothing.
        assert abs(loss_off.item() - loss32.item()) > 1e-3 * abs(loss32.item()), (loss_off, loss32)

    model.double()
    model.config._attn_implementation = "sdpa"
    for module in model.modules():
        if type(module).__name__ == "Gemma3RMSNorm":
            module.forward = types.MethodType(gemma_rmsnorm_in_input_dtype, module)
        elif type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rmsnorm_in_input_dtype, module)
    loss64 = loss_of(model, tokens, targets)
    loss64.backward()
    assert abs(loss64.item() - loss32.item()) < 1e-5 * abs(loss32.item()), (loss64, loss32)
    ref["loss_f64"] = loss64.detach().reshape(())
    for pname, p in model.named_parameters():
        grad = p.grad.detach().clone()
        split = split_fused(config, pname, grad)
        if split is None:
            ref["grad." + pname] = grad
        else:
            ref.update({"grad." + n: g.contiguous() for n, g in split})
    metadata = {"source": "make_family_parity.py",
                "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"}
    save_file(ref, os.path.join(directory, "reference.safetensors"), metadata=metadata)
    print(f"{directory}: loss_f32 {loss32.item():.6f} loss_f64 {loss64.item():.9f}"
          + (f" ablated {ref['loss_f32_ablated'].item():.6f}" if ablation else ""))


MODELS = {
    "mistral_window": (mistral_window, 4040, {"sliding_window": None}),
    "smollm3_nope": (smollm3_nope, 4141, {"no_rope_layers": [1, 1, 1]}),
    "olmo2": (olmo2, 4242, None),
    "phi3": (phi3, 4343, {"partial_rotary_factor": 1.0}),
    "phi3_longrope": (phi3_longrope(8), 4444, {"rope_scaling": None}),
    "phi3_shortrope": (phi3_longrope(32), 4545, {"rope_scaling": None}),
    "gemma3": (gemma3(), 4646, {"layer_types": ["full_attention"] * 3}),
    "gemma3_linear": (gemma3(100.0, {"rope_type": "linear", "factor": 4.0}), 4747,
                      {"rope_scaling": None}),
}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    names = sys.argv[2:] or list(MODELS)
    torch.use_deterministic_algorithms(True)
    for name in names:
        config_fn, seed, ablation = MODELS[name]
        make(out_dir, name, config_fn, seed, ablation)


if __name__ == "__main__":
    main()
