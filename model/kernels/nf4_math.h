// The arithmetic of bitsandbytes' 4-bit blockwise quantization (QLoRA's NF4 and FP4) and of its
// 8-bit "dynamic" quantization of the absmax values (double quantization), shared by the CPU codec
// (model/kernels/nf4.h) and the CUDA kernels (model/kernels/cuda/nf4_kernels.cu), so both run the
// same decisions and the same float32 roundings.
//
// Source: bitsandbytes' CUDA kernels (csrc/kernels.cu: dQuantizeNF4, dQuantizeFP4, dQuantize<0>,
// nf4_dequantization_lut, fp4_dequantization_lut, kQuantizeBlockwise(Small), kDequantizeBlockwise)
// and bitsandbytes/functional.py (create_dynamic_map, quantize_4bit with compress_statistics). The
// thresholds and levels below are those published constants, written here as the float32 values
// the CUDA compiler makes of them. model/kernels/testdata/nf4/make_nf4_vectors.py re-implements
// the same algorithm in numpy; nf4_test.cc holds this code to its vectors bit for bit.
//
// 4-bit (blocks of 64 consecutive values of the flattened tensor):
//   absmax = max |x| over the block;  inv = 1.0f / absmax;  code = Quantize{Nf4,Fp4}(x * inv)
//   value  = level[code] * absmax                        (one float32 product)
// The quantizers are decision trees on float32 thresholds with `>`: a scaled value equal to a
// threshold takes the lower code, NaN (0 * inf, a zero block) takes code 0 (NF4: level -1.0,
// dequantized as -1.0 * 0 = -0.0) or 0/8 (FP4: level 0). Two codes per byte, the first value in the
// high nibble.
//
// Nested absmax (blocks of 256 absmax values, after subtracting their mean `offset`):
//   absmax2 = max |d| over the block;  q = QuantizeDynamic8(d * (1.0f / absmax2))
//   absmax  = kDynamicMap8[q] * absmax2 + offset          (two roundings, never a fused FMA)
#ifndef PATRICKSTAR_MODEL_KERNELS_NF4_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_NF4_MATH_H_

#include <cstdint>

#include "base/host_device.h"

namespace ps {

// bnb_4bit_quant_type.
enum class Quant4Type : uint8_t { kNf4 = 0, kFp4 = 1 };

// Values per 4-bit block (bitsandbytes' default and QLoRA's; the only size this codec supports).
inline constexpr int64_t kQuant4BlockElems = 64;
// Absmax values per block of the nested (8-bit) quantization (quantize_4bit's blocksize=256).
inline constexpr int64_t kQuant4NestedBlockElems = 256;

// The 16 NF4 levels (nf4_dequantization_lut), code order.
#define PS_NF4_LEVELS                                                                              \
  -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f, \
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f,                    \
      0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f,      \
      0.5626170039176941f, 0.7229568362236023f, 1.0f

// The 16 FP4 levels: fp4_dequantization_lut[c & 7] times the sign bit's -1 (dDequantizeFP4Tree;
// the sign product is exact, so level * absmax equals bitsandbytes' lut * sign * absmax).
#define PS_FP4_LEVELS                                                                     \
  0.0f, 0.005208333333f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f, -0.0f, \
      -0.005208333333f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), sorted: the float32 values
// bitsandbytes computes with torch (checked against make_nf4_vectors.py's by nf4_test.cc).
#define PS_DYNAMIC_MAP_8BIT                                                                        \
  -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f,                 \
      -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f,             \
      -0x1.b46666p-1f, -0x1.ad3334p-1f, -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f,             \
      -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f, -0x1.7accccp-1f, -0x1.73999ap-1f,             \
      -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f, -0x1.4f999ap-1f,             \
      -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f,             \
      -0x1.246668p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f,             \
      -0x1.006666p-1f, -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f,             \
      -0x1.b8ccccp-2f, -0x1.aa6666p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f,             \
      -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f, -0x1.459998p-2f, -0x1.373334p-2f,             \
      -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f, -0x1.de6666p-3f,             \
      -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f,             \
      -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f,              \
      -0x1.8851eep-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f,           \
      -0x1.4eb854p-4f, -0x1.433334p-4f, -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f,         \
      -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f,         \
      -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f, -0x1.5ae146p-5f,              \
      -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f, -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f,          \
      -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f,         \
      -0x1.75c29p-7f, -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f,           \
      -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f,         \
      -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f, -0x1.851eb8p-9f, -0x1.3b645ap-9f,         \
      -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,      \
      -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,    \
      -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f,    \
      -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f, 0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, \
      0x1.64840cp-16f, 0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f,         \
      0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f,           \
      0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f, 0x1.e353f8p-10f, 0x1.3b645ap-9f,          \
      0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f,              \
      0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,              \
      0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f,                \
      0x1.170a3ep-6f, 0x1.451ebap-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c2ap-6f,              \
      0x1.fd70a4p-6f, 0x1.15c29p-5f, 0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f,               \
      0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f, 0x1.e51ebap-5f,   \
      0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f, 0x1.20a3d6p-4f, 0x1.2c28f6p-4f,              \
      0x1.37ae14p-4f, 0x1.433334p-4f, 0x1.4eb854p-4f, 0x1.5a3d7p-4f, 0x1.65c29p-4f,                \
      0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f, 0x1.fp-4f,   \
      0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3334p-3f, 0x1.88p-3f, 0x1.a4ccccp-3f,  \
      0x1.c1999ap-3f, 0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f, 0x1.28ccccp-2f,  \
      0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626666p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f,  \
      0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f, 0x1.d59998p-2f,  \
      0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, 0x1.079998p-1f, 0x1.0eccccp-1f, 0x1.16p-1f,      \
      0x1.1d3334p-1f, 0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f, 0x1.413334p-1f,  \
      0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f, 0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f,  \
      0x1.73999ap-1f, 0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f, 0x1.97999ap-1f,  \
      0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f, 0x1.bb999ap-1f, 0x1.c2ccccp-1f,  \
      0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f, 0x1.eep-1f,      \
      0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f

// dQuantizeNF4: the code of a value scaled into [-1, 1].
PS_HOST_DEVICE uint8_t QuantizeNf4(float x) {
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 0b1111 : 0b1110;
      return x > 0.5016634166240692f ? 0b1101 : 0b1100;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 0b1011 : 0b1010;
    return x > 0.1202552504837513f ? 0b1001 : 0b1000;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 0b0111 : 0b0110;
    return x > -0.23460740596055984f ? 0b0101 : 0b0100;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 0b0011 : 0b0010;
  return x > -0.8480964004993439f ? 0b0001 : 0b0000;
}

// dQuantizeFP4: sign bit 8 (for x < 0), magnitude by a tree on |x|.
PS_HOST_DEVICE uint8_t QuantizeFp4(float x) {
  const uint8_t sign = x < 0 ? 0b1000 : 0;
  const float a = x < 0 ? -x : x;  // fabsf; NaN stays NaN and falls through to code 0
  uint8_t m;
  if (a > 0.29166667f) {
    if (a > 0.583333f) {
      m = a > 0.8333333f ? 0b0011 : 0b0010;
    } else {
      m = a > 0.4166667f ? 0b0101 : 0b0100;
    }
  } else if (a > 0.0859375f) {
    m = a > 0.20833333f ? 0b0111 : 0b0110;
  } else {
    m = a > 0.00260417f ? 0b0001 : 0b0000;
  }
  return static_cast<uint8_t>(m + sign);
}

PS_HOST_DEVICE uint8_t Quantize4(Quant4Type type, float scaled) {
  return type == Quant4Type::kNf4 ? QuantizeNf4(scaled) : QuantizeFp4(scaled);
}

// dQuantize<0>: the code of x in the sorted 256-entry `map`: a binary search over pivots, then the
// nearer of the two neighbours by their float32 midpoint (a tie above keeps the pivot, a tie below
// keeps the pivot too: `x > mid` / `x < mid`).
PS_HOST_DEVICE uint8_t QuantizeDynamic8(const float* map, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = map[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = map[pivot];
  }
  if (upper_pivot == 255) upper = map[upper_pivot];
  if (lower_pivot == 0) lower = map[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

// The dequantized absmax of a nested code: map[q] * absmax2, rounded, plus offset, rounded.
PS_HOST_DEVICE float DequantizeNestedAbsmax(const float* map, uint8_t q, float absmax2,
                                            float offset) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(map[q], absmax2), offset);
#else
  // Two statements, and the files that include this are compiled with -ffp-contract=off.
  const float scaled = map[q] * absmax2;
  return scaled + offset;
#endif
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_NF4_MATH_H_
