#!/usr/bin/env python3
"""Checks that the model directories written by this project's exporter load in transformers.

model/testdata/cpp_export_* were written by WriteHfCheckpoint
(bazel run //model/testing:write_hf_export_testdata -- $PWD/model/testdata); the C++ test
model/hf_checkpoint_test.cc checks that the exporter still writes exactly these bytes. This script
is the other half: an independent reader (transformers' AutoModelForCausalLM.from_pretrained and the
safetensors library) loads each directory and must find every parameter with the value
model/testing/hf_export_testdata.h defines, recomputed here: element i of tensor `name` is
(k - 64) / 64 with k = (Mix64(FNV1a64(name) + i) >> 40) mod 129.

Recorded runs (all four directories passed with both transformers versions):
  /tmp/venv-hfio/bin/python model/testdata/check_cpp_export.py model/testdata
  # torch 2.15.0, transformers 5.23.0, safetensors 0.8.0
  # and the same with a venv holding transformers 4.57.6 (pip install transformers==4.57.6)
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open

MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def expected(name: str, shape) -> np.ndarray:
    n = int(np.prod(shape)) if len(shape) else 1
    with np.errstate(over="ignore"):
        z = np.uint64(fnv1a64(name.encode())) + np.arange(n, dtype=np.uint64)
        k = (mix64(z) >> np.uint64(40)) % np.uint64(129)
    return ((k.astype(np.float64) - 64.0) / 64.0).reshape(shape)


def check(directory: str) -> None:
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    # 1. Raw files through the safetensors library: every stored tensor has the defined values.
    stored = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="pt") as f:
                assert f.metadata().get("format") == "pt", (name, f.metadata())
                for key in f.keys():
                    stored[key] = f.get_tensor(key)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            idx = json.load(f)
        assert set(idx["weight_map"]) == set(stored), "index and shards disagree"
        total = sum(t.numel() * t.element_size() for t in stored.values())
        assert idx["metadata"]["total_size"] == total, (idx["metadata"], total)
    for key, t in stored.items():
        want = expected(key, list(t.shape))
        assert np.array_equal(t.to(torch.float64).numpy(), want), key
        assert str(t.dtype) == "torch." + cfg["torch_dtype"], (key, t.dtype)

    # 2. transformers: the model loads, with no missing or unexpected keys, and its parameters hold
    #    the values (the tied head included).
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, output_loading_info=True, dtype="auto")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info.get(
        "mismatched_keys"), info
    assert type(model).__name__ == cfg["architectures"][0], type(model).__name__
    params = dict(model.named_parameters(remove_duplicate=False))
    prefix = "transformer." if cfg["model_type"] == "gpt2" else ""
    for key in stored:
        name = key if key in params else prefix + key
        got = params[name].detach().to(torch.float64).numpy()
        assert np.array_equal(got, expected(key, list(got.shape))), name
    if cfg.get("tie_word_embeddings"):
        assert model.get_output_embeddings().weight.data_ptr() == \
            model.get_input_embeddings().weight.data_ptr(), "head not tied"
    else:
        assert "lm_head.weight" in stored
    c = model.config
    if cfg["model_type"] != "gpt2":
        assert c.head_dim == cfg["head_dim"], (c.head_dim, cfg["head_dim"])
        assert model.model.layers[0].self_attn.q_proj.out_features == \
            cfg["num_attention_heads"] * cfg["head_dim"]
        if hasattr(c, "rope_parameters"):  # transformers 5
            rope = c.rope_parameters
        else:  # transformers 4
            rope = dict(c.rope_scaling or {"rope_type": "default"}, rope_theta=c.rope_theta)
        want_type = (cfg["rope_scaling"] or {}).get("rope_type", "default")
        assert rope["rope_type"] == want_type and rope["rope_theta"] == cfg["rope_theta"], rope
    # 3. It runs.
    ids = torch.arange(8).reshape(1, 8) % cfg["vocab_size"]
    with torch.no_grad():
        logits = model.float()(ids).logits
    assert logits.shape == (1, 8, cfg["vocab_size"]) and torch.isfinite(logits).all()
    print(f"{directory}: OK ({len(stored)} tensors, {type(model).__name__}, "
          f"{cfg['torch_dtype']})")


def main(root: str) -> None:
    dirs = sorted(d for d in os.listdir(root) if d.startswith("cpp_export_"))
    assert dirs, f"no cpp_export_* directories in {root}"
    for d in dirs:
        check(os.path.join(root, d))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
