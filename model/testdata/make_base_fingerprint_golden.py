#!/usr/bin/env python3
"""The golden digests of model/base_fingerprint_test.cc, computed without the C++ code.

GptModel::BaseFingerprint (model/gpt_model.h) is stored in every LoRA checkpoint, and a resume
refuses a checkpoint whose fingerprint differs from the base it is given: a silent change of the
hash would turn every saved LoRA checkpoint into a refusal. This script computes the digest from
the algorithm as gpt_model.h documents it, over the tiny Hugging Face models in this directory,
so the C++ test compares the implementation with an independent reading of its contract:

  - the frozen base's tensors in operator order (model/model_config.cc's ModelOperators: GPT-2
    wte, wpe, per layer ln_1, c_attn, c_proj, ln_2, c_fc, c_proj, then ln_f; Llama embed_tokens,
    per layer input_layernorm, q/k/v_proj, o_proj, post_attention_layernorm, gate/up/down_proj,
    then norm and an untied lm_head), whole tensors under the model's names (GPT-2's without the
    "transformer." prefix), each weight before its bias;
  - per tensor, the pieces: its name, one NUL byte, each dimension as an int64, the compute
    dtype's name ("f32", "bf16"), then its values as the f32 the compute dtype stores
    (the file's f16/bf16 widened exactly; for bf16, rounded to nearest even first) in pieces of
    2^20 values;
  - each piece hashed as FNV-1a over 64-bit little-endian words (the last word zero-padded), then
    its byte count as one more word; per word h = ((h ^ w) * 0x100000001b3) mod 2^64,
    h ^= h >> 32; from h = 0xcbf29ce484222325; printed as 16 lowercase hex digits.

Run (Python 3.11.7, standard library only; no numpy, torch or safetensors needed), from the
repository root:
  python3 model/testdata/make_base_fingerprint_golden.py
and copy the printed digests into model/base_fingerprint_test.cc's kGolden table.
"""

import json
import os
import struct
import sys

MASK = (1 << 64) - 1
PIECE_VALUES = 1 << 20


class Fnv64Words:
    def __init__(self):
        self.h = 0xCBF29CE484222325

    def word(self, w):
        h = (self.h ^ w) * 0x100000001B3 & MASK
        self.h = h ^ (h >> 32)

    def piece(self, data: bytes):
        for i in range(0, len(data) - len(data) % 8, 8):
            self.word(int.from_bytes(data[i : i + 8], "little"))
        tail = len(data) % 8
        if tail:
            self.word(int.from_bytes(data[len(data) - tail :] + bytes(8 - tail), "little"))
        self.word(len(data))


def read_safetensors_dir(directory):
    """{name: (dtype, shape, raw bytes)} of a model.safetensors or a sharded index."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(header_len))
            data = f.read()
        for key, info in header.items():
            if key == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            tensors[key] = (info["dtype"], info["shape"], data[begin:end])
    return tensors


def to_f32_bits(dtype, raw):
    """The file's values as f32 bit patterns (exact widening)."""
    if dtype == "F32":
        return list(struct.unpack(f"<{len(raw) // 4}I", raw))
    if dtype == "BF16":
        return [v << 16 for v in struct.unpack(f"<{len(raw) // 2}H", raw)]
    if dtype == "F16":
        halves = struct.unpack(f"<{len(raw) // 2}e", raw)
        return list(struct.unpack(f"<{len(halves)}I", struct.pack(f"<{len(halves)}f", *halves)))
    raise ValueError(f"unsupported dtype {dtype}")


def round_to_bf16(bits):
    """f32 bits -> the f32 bits of the nearest bf16 (ties to even); the test data has no NaN."""
    rounding = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + rounding) & 0xFFFF0000) & 0xFFFFFFFF


def operator_order(config):
    if config["model_type"] == "gpt2":
        names = ["wte.weight", "wpe.weight"]
        for layer in range(config["n_layer"]):
            p = f"h.{layer}."
            for module in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
                names += [p + module + ".weight", p + module + ".bias"]
        return names + ["ln_f.weight", "ln_f.bias"]
    names = ["model.embed_tokens.weight"]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        names.append(p + "input_layernorm.weight")
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
        if config.get("attention_bias"):
            names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
        names.append(p + "self_attn.o_proj.weight")
        names.append(p + "post_attention_layernorm.weight")
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    names.append("model.norm.weight")
    if not config.get("tie_word_embeddings", True):
        names.append("lm_head.weight")
    return names


def fingerprint(directory, compute_dtype):
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    tensors = read_safetensors_dir(directory)
    if config["model_type"] == "gpt2":
        tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    h = Fnv64Words()
    for name in operator_order(config):
        dtype, shape, raw = tensors[name]
        h.piece(name.encode())
        h.piece(b"\0")
        for d in shape:
            h.piece(struct.pack("<q", d))
        h.piece(compute_dtype.encode())
        bits = to_f32_bits(dtype, raw)
        if compute_dtype == "bf16":
            bits = [round_to_bf16(b) for b in bits]
        for first in range(0, len(bits), PIECE_VALUES):
            chunk = bits[first : first + PIECE_VALUES]
            h.piece(struct.pack(f"<{len(chunk)}I", *chunk))
    return f"{h.h:016x}"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"# python {sys.version.split()[0]}")
    for model in ("hf_tiny_llama", "hf_tiny_gpt2"):
        for dtype in ("f32", "bf16"):
            print(f'{{"{model}", "{dtype}", "{fingerprint(os.path.join(here, model), dtype)}"}},')


if __name__ == "__main__":
    main()
