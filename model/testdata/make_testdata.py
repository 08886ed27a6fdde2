#!/usr/bin/env python3
"""Generates the reference safetensors files in this directory with Hugging Face's own library.

The C++ tests (model/safetensors_test.cc, model/gpt2_checkpoint_test.cc) read these files to prove
that our reader understands what the reference writer produces; they never run Python.

Recorded run (the files checked in were made by it):
  python3 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install safetensors numpy
  # safetensors 0.8.0, numpy 2.4.6
  /tmp/stvenv/bin/python model/testdata/make_testdata.py model/testdata

Values follow formulas the C++ tests recompute; keep them in sync if you change anything here.
"""
import os
import sys

import numpy as np
import safetensors

_keep_alive = []


def spec(array, dtype=None):
    """A TensorSpec for a C-contiguous little-endian numpy array (dtype overrides the name)."""
    array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
    _keep_alive.append(array)
    return safetensors.TensorSpec(
        dtype=dtype or array.dtype.name,
        shape=list(array.shape),
        data_ptr=array.ctypes.data,
        data_len=array.nbytes,
    )


def reference_file(path):
    tensors = {
        "a_f32": spec((np.arange(6, dtype=np.float32) * 0.5 - 1.0).reshape(2, 3)),
        "b_f16": spec(np.array([1.0, -2.0, 0.5, 65504.0, -0.0], dtype=np.float16)),
        # bfloat16 as raw bits: 1.0, -2.0, 3.140625, the smallest subnormal.
        "c_bf16": spec(np.array([[0x3F80, 0xC000], [0x4049, 0x0001]], dtype=np.uint16),
                       dtype="bfloat16"),
        "d_scalar": spec(np.array(3.25, dtype=np.float32)),
        "e_empty": spec(np.zeros((0, 3), dtype=np.float32)),
        "f_i64": spec(np.array([1, 2, 3], dtype=np.int64)),
        "g_3d": spec(np.arange(6, dtype=np.float32).reshape(2, 1, 3)),
    }
    safetensors.serialize_file(tensors, path,
                               metadata={"format": "pt", "source": "make_testdata.py"})


def gpt2_value(name, n):
    """value[j] = ((7 j + 3 len(name)) mod 23) / 8 - 1: exact in f32, f16 and bf16."""
    j = np.arange(n, dtype=np.int64)
    return (((7 * j + 3 * len(name)) % 23).astype(np.float32) * 0.125 - 1.0)


def gpt2_file(path):
    """A tiny GPT-2 laid out as transformers' GPT2LMHeadModel saves it: "transformer." prefix,
    Conv1D weights [in, out], attention-mask buffers, an lm_head tied to wte. Mixed dtypes: wte
    BF16, ln_1 F16, lm_head and the rest F32."""
    vocab, positions, hidden, layers = 11, 6, 4, 2
    shapes = {"wte.weight": (vocab, hidden), "wpe.weight": (positions, hidden)}
    for i in range(layers):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (hidden,), p + "ln_1.bias": (hidden,),
            p + "attn.c_attn.weight": (hidden, 3 * hidden), p + "attn.c_attn.bias": (3 * hidden,),
            p + "attn.c_proj.weight": (hidden, hidden), p + "attn.c_proj.bias": (hidden,),
            p + "ln_2.weight": (hidden,), p + "ln_2.bias": (hidden,),
            p + "mlp.c_fc.weight": (hidden, 4 * hidden), p + "mlp.c_fc.bias": (4 * hidden,),
            p + "mlp.c_proj.weight": (4 * hidden, hidden), p + "mlp.c_proj.bias": (hidden,),
        })
    shapes.update({"ln_f.weight": (hidden,), "ln_f.bias": (hidden,)})
    tensors = {}
    for name, shape in shapes.items():
        values = gpt2_value(name, int(np.prod(shape))).reshape(shape)
        if name == "wte.weight":
            bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # exact: low bits are zero
            tensors["transformer." + name] = spec(bits, dtype="bfloat16")
        elif ".ln_1." in name:
            tensors["transformer." + name] = spec(values.astype(np.float16))
        else:
            tensors["transformer." + name] = spec(values)
    for i in range(layers):
        mask = np.tril(np.ones((positions, positions), dtype=np.float32)).reshape(
            1, 1, positions, positions)
        tensors[f"transformer.h.{i}.attn.bias"] = spec(mask)
        tensors[f"transformer.h.{i}.attn.masked_bias"] = spec(np.array(-1e4, dtype=np.float32))
    tensors["lm_head.weight"] = spec(gpt2_value("wte.weight", vocab * hidden).reshape(vocab, hidden))
    safetensors.serialize_file(tensors, path, metadata={"format": "pt"})


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    reference_file(os.path.join(out, "python_reference.safetensors"))
    gpt2_file(os.path.join(out, "python_gpt2_tiny.safetensors"))
    print("safetensors", safetensors.__version__, "numpy", np.__version__)


if __name__ == "__main__":
    main()
