#!/usr/bin/env python3
"""Writes tiny Hugging Face model directories with transformers' own save_pretrained.

The C++ tests (model/hf_checkpoint_test.cc) open these directories with HfCheckpoint and check,
against manifest.json written here, that every tensor's bytes are read exactly (FNV-1a 64 of the
raw little-endian bytes, computed by this script from the tensors transformers saved), that the
config parses to the shapes given below, and that an import -> export round trip is bit-exact.
CI never runs Python; it uses the committed files.

Recorded runs (the directories checked in were made by them; --only rewrites just the directories
named and leaves the others' bytes alone):
  python3 -m venv /tmp/venv-hfio && /tmp/venv-hfio/bin/pip install torch transformers safetensors numpy
  # torch 2.15.0, transformers 5.23.0, safetensors 0.8.0, huggingface_hub 2.4.0
  /tmp/venv-hfio/bin/python model/testdata/make_hf_testdata.py model/testdata \
      --only hf_tiny_llama hf_tiny_qwen2 hf_tiny_gpt2
  # hf_tiny_qwen3, later, from another venv: torch 2.15.0+cu132, transformers 4.57.6 (which writes
  # rope_theta and rope_scaling at the top level, as Qwen3's published config.json files do),
  # safetensors 0.8.0
  /tmp/venv-q3/bin/python model/testdata/make_hf_testdata.py model/testdata --only hf_tiny_qwen3

Directories (each < 100 KB):
  hf_tiny_llama  LlamaForCausalLM, bfloat16, GQA (4 heads, 2 kv heads), untied head, llama3 RoPE
                 scaling, sharded (max_shard_size 8KB -> several model-0000k-of-0000n files)
  hf_tiny_qwen2  Qwen2ForCausalLM, float32, q/k/v biases, tied head, sharded (max_shard_size 16KB)
  hf_tiny_gpt2   GPT2LMHeadModel, float16, one model.safetensors
  hf_tiny_qwen3  Qwen3ForCausalLM, bfloat16, per-head q/k RMSNorm (q_norm, k_norm), head_dim 16 not
                 hidden_size / num_attention_heads (32 / 4), GQA (4 heads, 2 kv heads), no
                 biases, tied head, vocabulary 256 (the trainer's byte corpus), sharded
                 (max_shard_size 16KB)
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from safetensors import safe_open

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> str:
    h = FNV_OFFSET
    for b in data:
        h ^= b
        h = (h * FNV_PRIME) & MASK
    return f"{h:016x}"


def randomize(model, seed):
    """Every parameter random (norm weights too), so a swapped tensor cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.5)


def manifest(directory):
    """name -> {dtype, shape, fnv1a64, file} for every tensor of every safetensors file."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(directory, name), framework="pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
                out[key] = {
                    "dtype": str(t.dtype).replace("torch.", ""),
                    "shape": list(t.shape),
                    "fnv1a64": fnv1a64(raw),
                    "file": name,
                }
    return out


def save(model, directory, dtype, max_shard_size):
    if os.path.exists(directory):
        shutil.rmtree(directory)
    model = model.to(dtype)
    model.save_pretrained(directory, max_shard_size=max_shard_size)
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump({"generator": "make_hf_testdata.py",
                   "transformers": transformers.__version__,
                   "torch": torch.__version__,
                   "tensors": manifest(directory)}, f, indent=1, sort_keys=True)
        f.write("\n")


def make_llama(out):
    llama = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})
    m = transformers.LlamaForCausalLM(llama)
    randomize(m, 1)
    save(m, os.path.join(out, "hf_tiny_llama"), torch.bfloat16, "8KB")


def make_qwen2(out):
    qwen = transformers.Qwen2Config(
        vocab_size=80, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    m = transformers.Qwen2ForCausalLM(qwen)
    randomize(m, 2)
    save(m, os.path.join(out, "hf_tiny_qwen2"), torch.float32, "16KB")


def make_gpt2(out):
    gpt2 = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    m = transformers.GPT2LMHeadModel(gpt2)
    randomize(m, 3)
    save(m, os.path.join(out, "hf_tiny_gpt2"), torch.float16, "1MB")


def make_qwen3(out):
    # head_dim 16 != hidden_size / num_attention_heads = 8 (Qwen3-0.6B: 128 != 1024 / 16); the
    # vocabulary is the byte corpus's 256 so the trainer can train on the directory as it is.
    qwen3 = transformers.Qwen3Config(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=True)
    m = transformers.Qwen3ForCausalLM(qwen3)
    randomize(m, 4)
    save(m, os.path.join(out, "hf_tiny_qwen3"), torch.bfloat16, "16KB")


MAKERS = {"hf_tiny_llama": make_llama, "hf_tiny_qwen2": make_qwen2, "hf_tiny_gpt2": make_gpt2,
          "hf_tiny_qwen3": make_qwen3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=os.path.dirname(os.path.abspath(__file__)),
                        help="directory to write the model directories into")
    parser.add_argument("--only", nargs="+", choices=sorted(MAKERS), default=sorted(MAKERS),
                        help="which directories to (re)write; default: all")
    args = parser.parse_args()
    for name in args.only:
        MAKERS[name](args.out)


if __name__ == "__main__":
    main()
