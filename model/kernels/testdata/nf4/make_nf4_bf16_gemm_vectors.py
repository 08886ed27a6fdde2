#!/usr/bin/env python3
"""Reference vectors for the 16-bit compute of Quant4LinearForward / Quant4LinearBackwardInput
(model/kernels/nf4_linear_test.cc): what bitsandbytes' Linear4bit computes with
bnb_4bit_compute_dtype bfloat16 (or float16), taken from torch itself.

bitsandbytes (github.com/bitsandbytes-foundation/bitsandbytes, bitsandbytes/nn/modules.py
Linear4bit.forward and bitsandbytes/autograd/_functions.py MatMul4Bit, read at commit 012c6606):
Linear4bit casts the input and the bias to compute_dtype, and for training shapes MatMul4Bit runs
  forward:   torch.nn.functional.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t(), bias)
  backward:  grad_A = torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state).to(grad_output.dtype).t())
(B is the stored weight transposed, so both are y = x W^T + b and dx = dy W with W [out, in]).
The bitsandbytes package cannot be installed here (no network), so the 4-bit weight comes from
make_nf4_vectors.py's numpy re-implementation of its codec (imported, not copied), and torch does
the rest exactly as the lines above: W dequantized in float32 (level * absmax), .to(dtype)
(round to nearest even), x / dy / bias .to(dtype), F.linear and torch.matmul on CPU tensors of
that dtype. torch's CPU 16-bit GEMMs multiply exactly and accumulate in float32, then round the
result (with the bias added to the f32 accumulator) once to the 16-bit dtype; the C++ test holds
our results within one 16-bit ulp of torch's (the f32 sums run in another order).

Cases: awkward shapes (in not a multiple of 64, odd element counts, N = 1, more than one column
block of the CPU GEMM grid), NF4 and FP4, plain and nested absmax, with and without bias; bf16,
and two f16 cases.

Output: one text file; each line is `<case>.<field> <values...>`: `meta quant_type dtype N in out
bias nested`, `codes` (hex bytes), `absmax` or `offset` / `nested_codes` / `nested_absmax`, the
f32 inputs `x`, `b` (when bias), `dy` (8-hex-digit bit patterns), and torch's `y` and `dx` as
16-bit bit patterns (4 hex digits).

Recorded run (the file checked in was made by it):
  /work/venv-peftnew/bin/python model/kernels/testdata/nf4/make_nf4_bf16_gemm_vectors.py \
      model/kernels/testdata/nf4/nf4_bf16_gemm_vectors.txt
  # numpy 2.4.6, torch 2.15.0 (Python 3.11), CPU
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_nf4_vectors as codec  # noqa: E402  (the numpy bitsandbytes codec)

F32 = np.float32
DTYPES = {'bf16': torch.bfloat16, 'f16': torch.float16}


def quantize(values, quant_type, nested, out, name):
  """Quantizes values (float32) as bitsandbytes does; writes the state; returns the f32 dequant."""
  quant_one = codec.quantize_nf4 if quant_type == 'nf4' else codec.quantize_fp4
  levels = codec.NF4_LEVELS if quant_type == 'nf4' else codec.FP4_LEVELS
  absmax, codes, pad_code = codec.blockwise(values, 64, quant_one)
  out.append('%s.codes %s' % (name, codec.pack(codes, pad_code).hex()))
  used = absmax
  if nested:
    offset = F32(np.mean(absmax.astype(np.float64)))
    d = (absmax - offset).astype(F32)
    absmax2, q, _ = codec.blockwise(d, 256, lambda v: codec.dquantize(codec.DYNAMIC_MAP, v))
    used = np.array([F32(F32(codec.DYNAMIC_MAP[qi] * absmax2[i // 256]) + offset)
                     for i, qi in enumerate(q)], dtype=F32)
    out.append('%s.offset %s' % (name, codec.hex32([offset])))
    out.append('%s.nested_codes %s' % (name, bytes(q).hex()))
    out.append('%s.nested_absmax %s' % (name, codec.hex32(absmax2)))
  else:
    out.append('%s.absmax %s' % (name, codec.hex32(absmax)))
  return np.array([F32(levels[c] * used[i // 64]) for i, c in enumerate(codes)], dtype=F32)


def bits16(t):
  return codec.hex16(t.contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1))


def make_case(out, rng, name, quant_type, dtype, n, i, o, bias, nested):
  out.append('%s.meta %s %s %d %d %d %d %d' % (name, quant_type, dtype, n, i, o, int(bias),
                                               int(nested)))
  w = (rng.standard_normal(o * i) * 0.05).astype(F32)
  deq = quantize(w, quant_type, nested, out, name)
  x = rng.standard_normal(n * i).astype(F32)
  dy = rng.standard_normal(n * o).astype(F32)
  b = rng.standard_normal(o).astype(F32) if bias else None
  out.append('%s.x %s' % (name, codec.hex32(x)))
  out.append('%s.dy %s' % (name, codec.hex32(dy)))
  if bias:
    out.append('%s.b %s' % (name, codec.hex32(b)))
  dt = DTYPES[dtype]
  wt = torch.from_numpy(deq.reshape(o, i)).to(dt)
  xt = torch.from_numpy(x.reshape(n, i)).to(dt)
  bt = torch.from_numpy(b).to(dt) if bias else None
  y = torch.nn.functional.linear(xt, wt, bt)
  dx = torch.matmul(torch.from_numpy(dy.reshape(n, o)).to(dt), wt)
  assert y.dtype == dt and dx.dtype == dt
  out.append('%s.y %s' % (name, bits16(y)))
  out.append('%s.dx %s' % (name, bits16(dx)))


def main():
  torch.set_num_threads(1)
  rng = np.random.default_rng(4096)
  out = []
  #          name               type   dtype   N    in   out  bias   nested
  cases = [('nf4_tiny_bias', 'nf4', 'bf16', 3, 37, 5, True, False),
           ('fp4_nested', 'fp4', 'bf16', 17, 129, 70, False, True),
           ('nf4_nested_grid', 'nf4', 'bf16', 40, 136, 257, True, True),
           ('nf4_one_row', 'nf4', 'bf16', 1, 513, 33, True, False),
           ('nf4_tall', 'nf4', 'bf16', 130, 96, 300, False, False),
           ('nf4_f16_bias', 'nf4', 'f16', 9, 130, 65, True, False),
           ('fp4_f16_nested', 'fp4', 'f16', 33, 64, 129, False, True)]
  for case in cases:
    make_case(out, rng, *case)
  with open(sys.argv[1], 'w') as f:
    f.write('# Made by make_nf4_bf16_gemm_vectors.py (see its docstring); do not edit.\n')
    f.write('\n'.join(out) + '\n')


if __name__ == '__main__':
  with np.errstate(all='ignore'):
    main()
