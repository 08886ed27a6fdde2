#!/usr/bin/env python3
"""Tiny Hugging Face directories saved pre-quantized in 4 bits, as transformers + bitsandbytes write
them, and the values they dequantize to: reference vectors for model/quant4_import_test.cc.

What a 4-bit save looks like (read in transformers 4.57.6 and bitsandbytes at commit 95f9af30):
  - config.json: model.config.to_diff_dict() with quantization_config = BitsAndBytesConfig.to_dict()
    (transformers/configuration_utils.py to_diff_dict; utils/quantization_config.py
    BitsAndBytesConfig.to_dict: every attribute, including _load_in_4bit/_load_in_8bit,
    bnb_4bit_compute_dtype and bnb_4bit_quant_storage as strings, quant_method "bitsandbytes").
  - for each converted linear (integrations/bitsandbytes.py _replace_with_bnb_linear: nn.Linear and
    Conv1D outside modules_to_not_convert; lm_head stays), bitsandbytes/nn/modules.py
    Linear4bit._save_to_state_dict writes "<prefix>weight" (Params4bit data: uint8
    [(n + 1) // 2, 1], backends/cuda/ops.py quantize_4bit) and "<prefix>weight." + each key of
    QuantState.as_dict(packed=True) (bitsandbytes/functional.py): absmax (f32 [blocks]; uint8
    [blocks] when nested), quant_map (get_4bit_type(quant_type): the 16 levels divided by their
    max |.|, f32; note fp4's entry 8 is +0.0, the Python list says -0, an int), nested_absmax (f32
    [ceil(blocks / 256)]), nested_quant_map (create_dynamic_map(), f32 [256]) and
    "quant_state.bitsandbytes__<quant_type>": utils.py pack_dict_to_tensor, i.e. uint8 of
    json.dumps({"quant_type", "blocksize", "dtype", "shape", ["nested_blocksize", "nested_dtype",
    "nested_offset"]}) with dtype str(torch dtype).strip("torch.") and shape the [out, in] of the
    quantized weight (Conv1D: transposed before quantization, quantizer_bnb_4bit.py
    create_quantized_param).
  - save_pretrained writes the state dict with safetensors (metadata {"format": "pt"}).
bitsandbytes cannot be installed here (no network), so the Linear4bit state dict is built here by
that recipe, the codes and scales by model/kernels/testdata/nf4/make_nf4_vectors.py (bitsandbytes'
CUDA arithmetic re-implemented in numpy), and the directory is then written by transformers' own
save_pretrained (state_dict=...) from a model whose config carries a real BitsAndBytesConfig
(created with importlib.metadata.version patched to report bitsandbytes 0.48.0, as its post_init
checks the installed version).

Written (under the output directory):
  llama_nf4_nested/   LlamaForCausalLM, 2 layers, hidden 30, 3 heads of 10, 1 kv head,
                      intermediate 45, vocab 32, f32; nf4 with double quantization. Weights of 300
                      to 1350 values (blocks with tails of 44 and 6 values).
  gpt2_fp4/           GPT2LMHeadModel, 2 layers, n_embd 21, 3 heads, n_inner 84, vocab 32,
                      16 positions, bf16; fp4, plain absmax. Conv1D weights quantized transposed:
                      shapes [63, 21], [21, 21], [84, 21], [21, 84], odd element counts.
  <variant>.expected.safetensors: for every 4-bit weight (its name in the file), its dequantized
                      values as f32 [out, in] (level[code] * absmax, nested absmax as
                      map[q] * absmax2 + offset, all in numpy float32), and "<name>.nested_offset"
                      (f32 [1]) for nested variants.

Recorded run (the files checked in were made by it):
  /work/venv-peftnew/bin/python model/testdata/nf4_prequant/make_prequant_dir.py \
      model/testdata/nf4_prequant
  # torch 2.15.0, transformers 4.57.6, safetensors 0.8.0, numpy 2.4.6 (Python 3.11)
"""
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'kernels',
                                'testdata', 'nf4'))
import make_nf4_vectors as nf4  # noqa: E402

_real_version = importlib.metadata.version


def _version(name):
  return '0.48.0' if name == 'bitsandbytes' else _real_version(name)


importlib.metadata.version = _version

import transformers  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

F32 = np.float32


def get_4bit_type(quant_type):
  """bitsandbytes.functional.get_4bit_type: the list, torch.tensor (float32), divided by max |.|."""
  if quant_type == 'nf4':
    data = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
            -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
            0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
            0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
  else:
    data = [0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0,
            -3.0]
  t = torch.tensor(data)
  t.div_(t.abs().max())
  return t


def quantize(w, quant_type, nested, dtype_name):
  """Linear4bit's state dict entries for weight w ([out, in], float32 values) and the expected
  dequantized values. Returns (entries: name suffix -> torch tensor, expected f32 [out, in],
  offset or None)."""
  x = np.ascontiguousarray(w, dtype=F32).reshape(-1)
  n = x.size
  quant_one = nf4.quantize_nf4 if quant_type == 'nf4' else nf4.quantize_fp4
  levels = nf4.NF4_LEVELS if quant_type == 'nf4' else nf4.FP4_LEVELS
  absmax, codes, pad_code = nf4.blockwise(x, 64, quant_one)
  packed = np.frombuffer(nf4.pack(codes, pad_code), dtype=np.uint8).copy()
  assert packed.size == (n + 1) // 2
  entries = {'': torch.from_numpy(packed.reshape(-1, 1))}
  state = {'quant_type': quant_type, 'blocksize': 64, 'dtype': dtype_name,
           'shape': [int(w.shape[0]), int(w.shape[1])]}
  used_absmax = absmax
  offset = None
  if nested:
    offset = F32(np.mean(absmax.astype(np.float64)))
    d = (absmax - offset).astype(F32)
    absmax2, q, _ = nf4.blockwise(d, 256, lambda v: nf4.dquantize(nf4.DYNAMIC_MAP, v))
    used_absmax = np.array([F32(F32(nf4.DYNAMIC_MAP[qi] * absmax2[i // 256]) + offset)
                            for i, qi in enumerate(q)], dtype=F32)
    entries['.absmax'] = torch.tensor(q, dtype=torch.uint8)
    entries['.quant_map'] = get_4bit_type(quant_type)
    entries['.nested_absmax'] = torch.from_numpy(absmax2.copy())
    entries['.nested_quant_map'] = torch.from_numpy(nf4.DYNAMIC_MAP.copy())
    state.update({'nested_blocksize': 256, 'nested_dtype': 'float32',
                  'nested_offset': float(offset)})
  else:
    entries['.absmax'] = torch.from_numpy(absmax.copy())
    entries['.quant_map'] = get_4bit_type(quant_type)
  entries['.quant_state.bitsandbytes__' + quant_type] = torch.tensor(
      list(json.dumps(state).encode('utf-8')), dtype=torch.uint8)
  expected = np.array([F32(levels[c] * used_absmax[i // 64]) for i, c in enumerate(codes)],
                      dtype=F32).reshape(w.shape)
  return entries, expected, offset


def make_variant(out_dir, name, model, quantized, bnb, rng, torch_dtype):
  """quantized: names of the Linear/Conv1D modules converted; Conv1D weights are transposed."""
  model.config.quantization_config = bnb
  # Not copied: save_pretrained finds a tied lm_head by shared storage and leaves it out.
  sd = dict(model.state_dict())
  expected = {}
  dtype_name = str(torch_dtype).strip('torch.')
  for module, conv1d in quantized:
    key = module + '.weight'
    w = sd.pop(key).to(torch.float32).numpy()
    if conv1d:
      w = w.T
    # Random values of mixed scales per 64-block (as trained weights vary between rows).
    flat = rng.standard_normal(w.size) * np.repeat(10.0 ** rng.uniform(-2.5, -0.5, w.size // 64 + 1),
                                                   64)[:w.size]
    w = flat.reshape(w.shape).astype(F32)
    if torch_dtype == torch.bfloat16:  # the 16-bit weight bitsandbytes quantized
      w = torch.from_numpy(w).to(torch.bfloat16).to(torch.float32).numpy()
    entries, exp, offset = quantize(w, bnb.bnb_4bit_quant_type, bnb.bnb_4bit_use_double_quant,
                                    dtype_name)
    for suffix, t in entries.items():
      sd[key + suffix] = t
    expected[key] = exp
    if offset is not None:
      expected[key + '.nested_offset'] = np.array([offset], dtype=F32)
  target = os.path.join(out_dir, name)
  if os.path.exists(target):
    shutil.rmtree(target)
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
    os.makedirs(target)
    for f in ('config.json', 'model.safetensors'):
      shutil.copy(os.path.join(tmp, f), os.path.join(target, f))
  # What save_pretrained wrote is the state dict we gave it (it drops a tied lm_head only).
  written = load_file(os.path.join(target, 'model.safetensors'))
  tied = model.config.tie_word_embeddings
  assert set(written) == set(sd) - ({'lm_head.weight'} if tied else set()), sorted(written)
  save_file(expected, os.path.join(out_dir, name + '.expected.safetensors'))


def main():
  out_dir = sys.argv[1]
  rng = np.random.default_rng(3737)
  torch.manual_seed(37)
  # 1. Llama, nf4, double quantization, f32.
  bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4',
                                        bnb_4bit_use_double_quant=True,
                                        bnb_4bit_compute_dtype=torch.float32)
  cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=30, intermediate_size=45,
                                 num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                                 max_position_embeddings=64, tie_word_embeddings=False,
                                 torch_dtype=torch.float32)
  model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
  lin = []
  for i in range(2):
    for p in ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj',
              'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'):
      lin.append(('model.layers.%d.%s' % (i, p), False))
  make_variant(out_dir, 'llama_nf4_nested', model, lin, bnb, rng, torch.float32)
  # 2. GPT-2, fp4, plain absmax, bf16 (Conv1D weights quantized transposed).
  bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='fp4',
                                        bnb_4bit_use_double_quant=False,
                                        bnb_4bit_compute_dtype=torch.float32)
  cfg = transformers.GPT2Config(vocab_size=32, n_embd=21, n_layer=2, n_head=3, n_positions=16,
                                torch_dtype=torch.bfloat16)
  model = transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16)
  lin = []
  for i in range(2):
    for p in ('attn.c_attn', 'attn.c_proj', 'mlp.c_fc', 'mlp.c_proj'):
      lin.append(('transformer.h.%d.%s' % (i, p), True))
  make_variant(out_dir, 'gpt2_fp4', model, lin, bnb, rng, torch.bfloat16)


if __name__ == '__main__':
  with np.errstate(all='ignore'):
    main()
