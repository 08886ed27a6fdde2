#!/usr/bin/env python3
"""Reference vectors for model/kernels/nf4_test.cc: bitsandbytes' 4-bit (NF4/FP4) blockwise codec.

Written from bitsandbytes' published algorithm (github.com/bitsandbytes-foundation/bitsandbytes,
read at commit 95f9af30): the CUDA kernels in csrc/kernels.cu (kQuantizeBlockwiseSmall for 4-bit
blocks of 64, kQuantizeBlockwise<float, 256, 2, 0, General8bit> for the nested absmax,
kDequantizeBlockwise, dQuantizeNF4, dQuantizeFP4, dQuantize, nf4/fp4_dequantization_lut) and
bitsandbytes/functional.py (quantize_4bit / dequantize_4bit with compress_statistics, i.e. double
quantization: offset = absmax.mean(), quantize_blockwise(absmax - offset, blocksize=256) with
create_dynamic_map(); dequantized absmax = code[q] * absmax2 + offset). The bitsandbytes package
itself cannot be installed here (no network; it is not in the local package lists), so this script
re-implements that arithmetic in numpy float32 (IEEE, round to nearest even) and torch is used only
where bitsandbytes uses torch: create_dynamic_map's torch.linspace in float32.

Arithmetic, as the CUDA kernels do it:
  absmax_b   = max |x| over the 64 values of block b (the tail block: over its values and the zero
               padding, which changes nothing)
  inv_b      = 1.0f / absmax_b                    (a zero block: inf, and 0 * inf = NaN)
  code       = tree(x * inv_b)                    (dQuantizeNF4 / dQuantizeFP4: comparisons `>`
                                                   against the published float constants, so a
                                                   value equal to a threshold takes the lower code,
                                                   and NaN takes code 0 (NF4) / 0 or 8 (FP4))
  byte k     = code(2k) << 4 | code(2k+1)         (first value in the high nibble; an odd count's
                                                   last low nibble is the code of the zero padding)
  dequant    = level[code] * absmax_b             (float32 product; bf16 output: that product
                                                   rounded to nearest even)
Double quantization (nested): offset = mean(absmax) (here: the float64 mean rounded to float32;
torch's CUDA mean sums in float32 in its own order, so a real bitsandbytes offset may differ in the
last bit — importing a pre-quantized checkpoint reads its offset, so dequantization is unaffected),
d = absmax - offset (float32), blocks of 256: absmax2 = max |d|, q = dQuantize(map, d * (1/absmax2))
(the kernel's binary search with midpoint ties), dequantized absmax = map[q] * absmax2 + offset
(two float32 roundings, no fused multiply-add).

Deviations of real bitsandbytes builds that no CPU can reproduce, stated in model/kernels/nf4.h:
bitsandbytes compiles its CUDA code with --use_fast_math, so there 1.0f/absmax is the approximate
reciprocal (within 1 ulp) and denormals are flushed to zero. These vectors use the exact
reciprocal and keep denormals (IEEE). NaN and Inf inputs are refused by our quantizer (a weight
that is not finite is a broken checkpoint), so no vector has them.

Output: one text file; each line is `<case>.<field> <values...>`, values as hex bit patterns
(f32: 8 hex digits, bf16/f16: 4, codes: one hex string of bytes). `dynamic_map` holds the 256
float32 values of create_dynamic_map().

Recorded run (the file checked in was made by it):
  /work/venv-peftnew/bin/python model/kernels/testdata/nf4/make_nf4_vectors.py \
      model/kernels/testdata/nf4/nf4_vectors.txt
  # numpy 2.4.6, torch 2.15.0 (Python 3.11)
"""
import fractions
import sys

import numpy as np
import torch

F32 = np.float32


def lit(text):
  """The float32 value of a C float literal `text`f: the decimal rounded once to nearest float32
  (np.float32(float(text)) would round twice, through double, and differs for some constants)."""
  exact = fractions.Fraction(text)
  d = F32(float(exact))
  best = None
  for c in (np.nextafter(d, F32(-np.inf)), d, np.nextafter(d, F32(np.inf))):
    err = abs(fractions.Fraction(float(c)) - exact)
    even = (int(np.asarray(c, F32).view(np.uint32)) & 1) == 0
    if best is None or err < best[0] or (err == best[0] and even):
      best = (err, c)
  return F32(best[1])

NF4_LEVELS = np.array([lit(v) for v in (
    '-1.0', '-0.6961928009986877', '-0.5250730514526367', '-0.39491748809814453',
    '-0.28444138169288635', '-0.18477343022823334', '-0.09105003625154495', '0.0',
    '0.07958029955625534', '0.16093020141124725', '0.24611230194568634', '0.33791524171829224',
    '0.44070982933044434', '0.5626170039176941', '0.7229568362236023', '1.0')], dtype=F32)
FP4_MAG = np.array([lit(v) for v in ('0.0', '0.005208333333', '0.66666667', '1.0', '0.33333333',
                                     '0.5', '0.16666667', '0.25')], dtype=F32)
# fp4 level of code c: FP4_MAG[c & 7] * (1 - 2 * (c >> 3)), a float32 product (sign exact).
FP4_LEVELS = np.concatenate([FP4_MAG, FP4_MAG * F32(-1.0)]).astype(F32)

# dQuantizeNF4's thresholds (float literals in csrc/kernels.cu).
T = {k: lit(v) for k, v in dict(
    root='0.03979014977812767', p1='0.3893125355243683', p11='0.6427869200706482',
    p111='0.8614784181118011', p110='0.5016634166240692', p10='0.2035212516784668',
    p101='0.2920137718319893', p100='0.1202552504837513', n0='-0.33967943489551544',
    n01='-0.13791173323988914', n011='-0.045525018125772476', n010='-0.23460740596055984',
    n00='-0.6106329262256622', n001='-0.4599952697753906', n000='-0.8480964004993439').items()}
FP4_T = [lit(v) for v in ('0.29166667', '0.583333', '0.8333333', '0.4166667', '0.0859375',
                          '0.20833333', '0.00260417')]


def quantize_nf4(x):
  x = F32(x)
  if x > T['root']:
    if x > T['p1']:
      if x > T['p11']:
        return 0b1111 if x > T['p111'] else 0b1110
      return 0b1101 if x > T['p110'] else 0b1100
    if x > T['p10']:
      return 0b1011 if x > T['p101'] else 0b1010
    return 0b1001 if x > T['p100'] else 0b1000
  if x > T['n0']:
    if x > T['n01']:
      return 0b0111 if x > T['n011'] else 0b0110
    return 0b0101 if x > T['n010'] else 0b0100
  if x > T['n00']:
    return 0b0011 if x > T['n001'] else 0b0010
  return 0b0001 if x > T['n000'] else 0b0000


def quantize_fp4(x):
  x = F32(x)
  sign = 0b1000 if x < 0 else 0
  a = F32(abs(x))
  t = FP4_T
  if a > t[0]:
    if a > t[1]:
      return (0b0011 if a > t[2] else 0b0010) + sign
    return (0b101 if a > t[3] else 0b100) + sign
  if a > t[4]:
    return (0b0111 if a > t[5] else 0b0110) + sign
  return (0b0001 if a > t[6] else 0b0000) + sign


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
  """bitsandbytes.functional.create_dynamic_map, as published (torch float32 linspace)."""
  data = []
  non_sign_bits = total_bits - 1
  additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
  for i in range(max_exponent_bits):
    fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed else
                         2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
    boundaries = torch.linspace(0.1, 1, fraction_items, dtype=torch.float32)
    means = (boundaries[:-1] + boundaries[1:]) / 2.0
    data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if signed:
      data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
  if additional_items > 0:
    boundaries = torch.linspace(0.1, 1, additional_items + 1, dtype=torch.float32)
    means = (boundaries[:-1] + boundaries[1:]) / 2.0
    data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if signed:
      data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
  data.append(0)
  data.append(1.0)
  assert len(data) == 2 ** total_bits
  data += [0] * (256 - len(data))
  data.sort()
  return np.array(torch.tensor(data, dtype=torch.float32).numpy(), dtype=F32)


def dquantize(code, x):
  """csrc/kernels.cu dQuantize<0>: binary search, then the nearer neighbour by midpoint."""
  x = F32(x)
  pivot, upper_pivot, lower_pivot = 127, 255, 0
  lower, upper = F32(-1.0), F32(1.0)
  val = code[pivot]
  i = 64
  while i > 0:
    if x > val:
      lower_pivot, lower = pivot, val
      pivot += i
    else:
      upper_pivot, upper = pivot, val
      pivot -= i
    val = code[pivot]
    i >>= 1
  if upper_pivot == 255:
    upper = code[upper_pivot]
  if lower_pivot == 0:
    lower = code[lower_pivot]
  if x > val:
    midpoint = F32((upper + val) * F32(0.5))
    return upper_pivot if x > midpoint else pivot
  midpoint = F32((lower + val) * F32(0.5))
  return lower_pivot if x < midpoint else pivot


def blockwise(x, block, quant_one):
  """Absmax per block, codes per value (x * (1/absmax)), as kQuantizeBlockwise(Small)."""
  n = len(x)
  nb = (n + block - 1) // block
  absmax = np.zeros(nb, dtype=F32)
  codes = []
  pad_code = None
  for b in range(nb):
    v = x[b * block:(b + 1) * block]
    am = F32(np.max(np.abs(v)))
    absmax[b] = am
    inv = F32(F32(1.0) / am)
    codes += [quant_one(F32(e * inv)) for e in v]
    pad_code = quant_one(F32(F32(0.0) * inv))
  return absmax, codes, pad_code


def pack(codes, pad_code):
  if len(codes) % 2:
    codes = codes + [pad_code]
  return bytes((codes[k] << 4) | codes[k + 1] for k in range(0, len(codes), 2))


def bf16_bits(f):
  """float32 -> bf16 bits, round to nearest even (inputs here are never NaN)."""
  u = np.asarray(f, dtype=F32).view(np.uint32).astype(np.uint64)
  r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
  return r.astype(np.uint16)


def hex32(a):
  return ' '.join('%08x' % v for v in np.asarray(a, dtype=F32).view(np.uint32))


def hex16(a):
  return ' '.join('%04x' % v for v in np.asarray(a, dtype=np.uint16))


def make_case(out, name, quant_type, src_dtype, values, nested):
  """values: float32 array (already representable in src_dtype)."""
  x = np.asarray(values, dtype=F32)
  if src_dtype == 'bf16':
    bits = bf16_bits(x)
    x = (bits.astype(np.uint32) << 16).view(F32)
    input_hex = hex16(bits)
  elif src_dtype == 'f16':
    h = x.astype(np.float16)
    x = h.astype(F32)
    input_hex = hex16(h.view(np.uint16))
  else:
    input_hex = hex32(x)
  quant_one = quantize_nf4 if quant_type == 'nf4' else quantize_fp4
  levels = NF4_LEVELS if quant_type == 'nf4' else FP4_LEVELS
  absmax, codes, pad_code = blockwise(x, 64, quant_one)
  packed = pack(codes, pad_code)
  out.append('%s.meta %s %s %d %d' % (name, quant_type, src_dtype, len(x), int(nested)))
  out.append('%s.input %s' % (name, input_hex))
  out.append('%s.codes %s' % (name, packed.hex()))
  out.append('%s.absmax %s' % (name, hex32(absmax)))
  used_absmax = absmax
  if nested:
    offset = F32(np.mean(absmax.astype(np.float64)))
    d = (absmax - offset).astype(F32)
    absmax2, q, _ = blockwise(d, 256, lambda v: dquantize(DYNAMIC_MAP, v))
    used_absmax = np.array([F32(F32(DYNAMIC_MAP[qi] * absmax2[i // 256]) + offset)
                            for i, qi in enumerate(q)], dtype=F32)
    out.append('%s.offset %s' % (name, hex32([offset])))
    out.append('%s.nested_codes %s' % (name, bytes(q).hex()))
    out.append('%s.nested_absmax %s' % (name, hex32(absmax2)))
    out.append('%s.absmax_dequantized %s' % (name, hex32(used_absmax)))
  deq = np.array([F32(levels[c] * used_absmax[i // 64]) for i, c in enumerate(codes)], dtype=F32)
  out.append('%s.dequant_f32 %s' % (name, hex32(deq)))
  out.append('%s.dequant_bf16 %s' % (name, hex16(bf16_bits(deq))))


def tie_values(thresholds):
  """Each threshold t and its float32 neighbours, with a 1.0 so that absmax = 1 and x * inv = x."""
  v = [F32(1.0)]
  for t in thresholds:
    v += [t, np.nextafter(t, F32(2)), np.nextafter(t, F32(-2))]
  return np.array(v, dtype=F32)


DYNAMIC_MAP = create_dynamic_map()


def main():
  rng = np.random.default_rng(37)
  out = ['dynamic_map %s' % hex32(DYNAMIC_MAP)]
  nf4_t = list(T.values())
  nf4_t += [-t for t in nf4_t]
  fp4_t = FP4_T + [-t for t in FP4_T]
  # 1. Random normal weights of mixed scales, a tail block of 37 (odd count), f32.
  w = (rng.standard_normal(64 * 8 + 37) * np.repeat(
      10.0 ** rng.uniform(-3, 1, 9), 64)[:64 * 8 + 37]).astype(F32)
  for qt in ('nf4', 'fp4'):
    make_case(out, qt + '_f32_random', qt, 'f32', w, False)
    make_case(out, qt + '_bf16_random', qt, 'bf16', w, False)
    make_case(out, qt + '_f16_random', qt, 'f16', np.clip(w, -60000, 60000), False)
  # 2. Ties: values exactly at the decision thresholds and one ulp either side (absmax 1, then
  #    scaled by 2 and by 0.75, the latter inexact), +-absmax, a zero block, a zero tail.
  for qt, th in (('nf4', nf4_t), ('fp4', fp4_t)):
    t = tie_values(th)
    parts = [np.concatenate([t, np.zeros((-len(t)) % 64, F32)]), 2 * t[:64],
             np.concatenate([F32(0.75) * t[:40], np.full(24, 0.5, F32)]),
             np.zeros(64, F32),
             np.array([3.5, -3.5] * 32, F32),
             np.array([-2.0, 1.0, 2.0, -1.0] * 16, F32),
             np.zeros(9, F32)]
    make_case(out, qt + '_ties', qt, 'f32', np.concatenate(parts), False)
  # 3. Denormals: a block of denormals only (1/absmax overflows to inf), denormals next to normal
  #    values (x * inv underflows), tiny normal absmax (dequantized values denormal), a huge block.
  tiny = np.array([1e-45, -3e-42, 5e-39, -1e-40] * 16, F32)
  mixed = np.concatenate([rng.standard_normal(60).astype(F32), tiny[:4]])
  small_normal = (rng.standard_normal(64) * 1e-37).astype(F32)
  huge = (rng.standard_normal(64) * 1e37).astype(F32)
  huge[5] = F32(3.4e38)
  den = np.concatenate([tiny, mixed, small_normal, huge, tiny[:17]])
  for qt in ('nf4', 'fp4'):
    make_case(out, qt + '_denormals', qt, 'f32', den, False)
  # 4. Double quantization: 271 blocks -> nested blocks of 256 and 15; 41 blocks (bf16, fp4) -> one;
  #    and a tensor whose blocks all share one absmax (every nested value is 0: 0 * inf = NaN
  #    takes map code 0).
  big = (rng.standard_normal(64 * 270 + 10) * np.repeat(
      10.0 ** rng.uniform(-2, 0, 271), 64)[:64 * 270 + 10]).astype(F32)
  make_case(out, 'nf4_nested', 'nf4', 'f32', big, True)
  make_case(out, 'fp4_nested_bf16', 'fp4', 'bf16', big[:64 * 40 + 3], True)
  same = rng.uniform(-1, 1, 64 * 5).astype(F32)
  same[::64] = F32(1.5)
  make_case(out, 'nf4_nested_uniform', 'nf4', 'f32', same, True)
  with open(sys.argv[1], 'w') as f:
    f.write('# Made by make_nf4_vectors.py (see its docstring); do not edit.\n')
    f.write('\n'.join(out) + '\n')


if __name__ == '__main__':
  with np.errstate(all='ignore'):
    main()
