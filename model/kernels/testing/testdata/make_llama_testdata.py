#!/usr/bin/env python3
"""Reference values for model/kernels/testing/tiny_llama_test.cc, from Hugging Face transformers.

Builds a tiny LlamaForCausalLM (grouped-query attention, untied LM head, rope_scaling "llama3"), a
tiny Qwen2ForCausalLM (q/k/v biases, tied embeddings, one key/value head) and a tiny
Qwen3ForCausalLM (per-head q/k RMSNorm, head_dim 6 != hidden/heads, tied) from fixed seeded
weights, runs them on fixed tokens with transformers' own code (eager attention, CPU) and saves,
per model, one safetensors file holding:
  <Hugging Face parameter names>   the weights (Llama, Qwen3: F32; Qwen2: BF16 — values generated
                                   in f32 and rounded to bf16, the model then computes in f32/f64
                                   from them, as a bf16 checkpoint loaded into an f32 model does)
  test.tokens, test.targets        I32 [B, T]; targets -100 are ignored
  test.inv_freq                    F32 [D/2], rotary_emb.inv_freq
  test.rope_cos, test.rope_sin     F32 [T, D/2], the first half of the cos/sin tables transformers
                                   computes for positions 0..T-1 (the second half repeats it)
  test.logits_f32, test.loss_f32   the model run in float32
  test.logits_f64, test.loss_f64   the model run in float64 (model.double())
  test.grad.<name>                 F64, d loss_f64 / d parameter (torch autograd, float64 run)
The C++ tests never run Python; they read these files.

The float64 run is transformers' model in float64 with two parts of its code that deliberately
compute in float32 switched to the input dtype, so that the run is float64 throughout: RMSNorm
(LlamaRMSNorm/Qwen2RMSNorm.forward cast to float32; here the same formula in the input dtype) and
the eager attention's softmax (dtype=torch.float32; here torch's scaled_dot_product_attention, which
computes in float64). Its rotary tables stay the float32 ones transformers always uses
(LlamaRotaryEmbedding.forward casts inv_freq to float and disables autocast, then casts cos/sin to
float64); the test feeds our float64 model those same recorded tables, so that comparison is exact
up to float64 rounding. The float32 run is transformers' code unchanged.

Recorded run (the files checked in were made by it):
  python3 -m venv /tmp/venv-llama
  /tmp/venv-llama/bin/pip install torch transformers==4.57.6 safetensors numpy
  # torch 2.15.0, transformers 4.57.6, safetensors 0.8.0, numpy 2.4.6 (Python 3.11.7)
  /tmp/venv-llama/bin/python model/kernels/testing/testdata/make_llama_testdata.py \
      model/kernels/testing/testdata
tiny_qwen3.safetensors was added later by the same script, the other two files left as they were:
  /tmp/venv-q3/bin/pip install torch transformers==4.57.6 safetensors numpy
  # torch 2.15.0, transformers 4.57.6, safetensors 0.8.0, numpy 2.4.6 (Python 3.11.7)
  /tmp/venv-q3/bin/python model/kernels/testing/testdata/make_llama_testdata.py \
      model/kernels/testing/testdata tiny_qwen3
Keep the configs in sync with tiny_llama_test.cc (LlamaReferenceConfig / Qwen2ReferenceConfig) and
model/llama_model_test.cc (Qwen3Reference).
"""
import json
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

BATCH, SEQ_LEN = 2, 11


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0,
        # head_dim 8, theta 1e4: wavelengths 6.3, 63, 628, 6283 against 128/4 = 32 and 128/1 =
        # 128: one high, one medium (smoothed) and two low (divided) frequencies.
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu",
        pad_token_id=None, attn_implementation="eager")


def qwen2_config():
    return transformers.Qwen2Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False, hidden_act="silu", pad_token_id=None,
        attn_implementation="eager")


def qwen3_config():
    # head_dim 6 is not hidden_size / heads = 8: Qwen3's head_dim is its own.
    return transformers.Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=6, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False,
        use_sliding_window=False, hidden_act="silu", pad_token_id=None,
        attn_implementation="eager")


def fill_weights(model, seed, round_to_bf16):
    """Deterministic weights far from initialization: RMSNorm gains 1 + U(-0.3, 0.3), biases
    N(0, 0.1), everything else N(0, 0.2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                v = 1 + 0.6 * (torch.rand(p.shape, generator=gen) - 0.5)
            elif name.endswith(".bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            else:
                v = 0.2 * torch.randn(p.shape, generator=gen)
            if round_to_bf16:
                v = v.to(torch.bfloat16).to(torch.float32)
            p.copy_(v)


def batch(seed, vocab):
    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, vocab, (BATCH, SEQ_LEN + 1), generator=gen)
    tokens = stream[:, :-1].clone()
    targets = stream[:, 1:].clone()
    targets[:, -1] = -100  # the last position of each sequence is not predicted
    targets[1, 3] = -100   # and one ignored target in the middle
    return tokens.to(torch.int32), targets.to(torch.int64)


def rmsnorm_in_input_dtype(self, hidden_states):
    """LlamaRMSNorm.forward without its float32 cast (the same formula in the input dtype)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def make_float64(model):
    model.double()
    model.config._attn_implementation = "sdpa"  # eager's softmax is forced to float32
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rmsnorm_in_input_dtype, module)


def run(model, tokens, targets):
    out = model(input_ids=tokens.long(), use_cache=False)
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100)
    return logits, loss


def make(path, config, seed, store_bf16):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    fill_weights(model, seed, store_bf16)
    tokens, targets = batch(seed + 1, config.vocab_size)

    tensors = {}
    for name, p in model.state_dict().items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue  # save_pretrained omits the tied copy too
        t = p.detach().clone()
        tensors[name] = t.to(torch.bfloat16) if store_bf16 else t
    tensors["test.tokens"] = tokens.contiguous()
    tensors["test.targets"] = targets.to(torch.int32).contiguous()

    rotary = model.model.rotary_emb
    tensors["test.inv_freq"] = rotary.inv_freq.detach().float().clone()
    positions = torch.arange(SEQ_LEN)[None, :]
    dummy = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(dummy, positions)
    half = cos.shape[-1] // 2
    assert torch.equal(cos[0, :, :half], cos[0, :, half:])
    tensors["test.rope_cos"] = cos[0, :, :half].contiguous()
    tensors["test.rope_sin"] = sin[0, :, :half].contiguous()

    with torch.no_grad():
        logits32, loss32 = run(model, tokens, targets)
    tensors["test.logits_f32"] = logits32.detach().contiguous()
    tensors["test.loss_f32"] = loss32.detach().reshape(())

    make_float64(model)
    logits64, loss64 = run(model, tokens, targets)
    loss64.backward()
    tensors["test.logits_f64"] = logits64.detach().contiguous()
    tensors["test.loss_f64"] = loss64.detach().reshape(())
    for name, p in model.named_parameters():  # a tied lm_head appears once, as embed_tokens
        tensors["test.grad." + name] = p.grad.detach().clone()

    metadata = {
        "source": "make_llama_testdata.py",
        "config": json.dumps(config.to_diff_dict(), sort_keys=True),
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
    }
    save_file(tensors, path, metadata=metadata)
    print(f"{path}: loss_f32 {loss32.item():.6f} loss_f64 {loss64.item():.12f} "
          f"({os.path.getsize(path)} bytes)")


MODELS = {
    "tiny_llama": (llama_config, 1234, False),
    "tiny_qwen2": (qwen2_config, 5678, True),
    "tiny_qwen3": (qwen3_config, 9012, False),
}


def main():
    """make_llama_testdata.py [OUT_DIR [MODEL ...]]: every model of MODELS, or those named."""
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    names = sys.argv[2:] or list(MODELS)
    torch.use_deterministic_algorithms(True)
    for name in names:
        config, seed, store_bf16 = MODELS[name]
        make(os.path.join(out_dir, name + ".safetensors"), config(), seed, store_bf16)


if __name__ == "__main__":
    main()
