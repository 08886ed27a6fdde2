// The arithmetic of rotary position embeddings (see model/kernels/rope.h), as PS_HOST_DEVICE
// functions shared by the CPU kernel, the CUDA kernel (model/kernels/cuda/) and the tests.
//
// Rotation. Hugging Face's apply_rotary_pos_emb (modeling_llama.py) computes
//   q_embed = q * cos + rotate_half(q) * sin,   rotate_half(x) = cat(-x[D/2:], x[:D/2])
// with cos/sin = cat(cos(freqs), cos(freqs)) duplicated over the two halves. Element i < D/2 of a
// head and its partner i + D/2 therefore rotate as the pair (x1, x2) by the angle of frequency i:
//   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin
// (the "half-split" layout, NOT interleaved neighbours (2i, 2i+1) as in Meta's original code —
// Hugging Face checkpoints permute q_proj/k_proj rows so that the half-split form is right).
// The map is a rotation, so its transpose (the backward) is the rotation by the negative angle:
//   dx1 = dy1 cos + dy2 sin,   dx2 = dy2 cos - dy1 sin
//
// Frequencies (transformers' modeling_rope_utils.py), for head dim D and base theta:
//   inv_freq_i = 1 / theta^(2i / D),   i = 0 .. D/2 - 1                  ("default")
// and, for rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings = L0} (_compute_llama3_parameters), with wavelen = 2 pi / f:
//   wavelen > L0 / low_freq_factor            f / factor                (low frequencies)
//   wavelen < L0 / high_freq_factor           f                         (high frequencies)
//   otherwise                                 (1 - a) f / factor + a f,
//                                             a = (L0 / wavelen - low_freq_factor)
//                                                 / (high_freq_factor - low_freq_factor)
// and, for "longrope" (Phi-3), inv_freq_i = 1 / (ext_i theta^(2i / D)) with per-frequency factors
// ext (rope_scaling's short_factor, or long_factor for sequences longer than
// original_max_position_embeddings), cos and sin then multiplied by an attention factor.
// The angle of position p is p * inv_freq_i. RopeInverseFrequency<float> rounds every step to f32
// in transformers' order (torch computes these tensors in f32: 2*pi / x as reciprocal(x) * 2pi,
// Python-scalar operands rounded to f32), so the tables agree with Hugging Face's to an ulp or
// two; RopeInverseFrequency<double> is the same formula in double.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_ROPE_MATH_H_
#define PATRICKSTAR_MODEL_KERNELS_ROPE_MATH_H_

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace ps {

template <typename T>
struct RopePair {
  T first;   // element i of the head
  T second;  // element i + D/2
};

// The forward rotation of (x1, x2) = (x_i, x_{i+D/2}) by the angle with cosine c and sine s.
// Written as Hugging Face writes it: x * cos + rotate_half(x) * sin.
template <typename T>
PS_HOST_DEVICE RopePair<T> RopeRotate(T x1, T x2, T c, T s) {
  return RopePair<T>{x1 * c + (-x2) * s, x2 * c + x1 * s};
}

// The transpose (inverse) rotation: the backward of RopeRotate applied to the gradient pair.
template <typename T>
PS_HOST_DEVICE RopePair<T> RopeRotateInverse(T dy1, T dy2, T c, T s) {
  return RopePair<T>{dy1 * c + dy2 * s, dy2 * c - dy1 * s};
}

// The scaling rule of rope_scaling type "llama3" (see the file comment), as plain numbers.
struct RopeLlama3Params {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// inv_freq_i = 1 / theta^(2i / D): the exponent 2i / D and the power rounded to T, then the
// reciprocal in T. The power is taken in double and rounded once (within an ulp of torch's f32
// pow).
template <typename T>
PS_HOST_DEVICE T RopeDefaultInverseFrequency(double theta, int64_t i, int64_t head_dim) {
  const T exponent = static_cast<T>(2 * i) / static_cast<T>(head_dim);
  const T power = static_cast<T>(
      std::pow(static_cast<double>(static_cast<T>(theta)), static_cast<double>(exponent)));
  return T{1} / power;
}

// rope_scaling type "longrope" (Phi-3, Phi-4-mini; transformers' _compute_longrope_parameters):
// inv_freq_i = 1 / (ext_i * theta^(2i / D)), ext the short or the long factor of frequency i, the
// power as RopeDefaultInverseFrequency's, the product and the reciprocal rounded to T.
template <typename T>
PS_HOST_DEVICE T RopeLongRopeInverseFrequency(double theta, int64_t i, int64_t head_dim,
                                              double ext) {
  const T exponent = static_cast<T>(2 * i) / static_cast<T>(head_dim);
  const T power = static_cast<T>(
      std::pow(static_cast<double>(static_cast<T>(theta)), static_cast<double>(exponent)));
  return T{1} / (static_cast<T>(ext) * power);
}

// transformers' _compute_llama3_parameters for one frequency, step by step in T.
template <typename T>
PS_HOST_DEVICE T RopeLlama3InverseFrequency(T inv_freq, const RopeLlama3Params& p) {
  const double low_freq_wavelen = p.original_max_position_embeddings / p.low_freq_factor;
  const double high_freq_wavelen = p.original_max_position_embeddings / p.high_freq_factor;
  const T two_pi = static_cast<T>(6.283185307179586);
  const T wavelen = (T{1} / inv_freq) * two_pi;  // torch: 2*pi / x = reciprocal(x) * 2pi
  const T factor = static_cast<T>(p.factor);
  const T scaled = wavelen > static_cast<T>(low_freq_wavelen) ? inv_freq / factor : inv_freq;
  const bool is_medium = !(wavelen < static_cast<T>(high_freq_wavelen)) &&
                         !(wavelen > static_cast<T>(low_freq_wavelen));
  if (!is_medium) return scaled;
  const T smooth = ((T{1} / wavelen) * static_cast<T>(p.original_max_position_embeddings) -
                    static_cast<T>(p.low_freq_factor)) /
                   static_cast<T>(p.high_freq_factor - p.low_freq_factor);
  return (T{1} - smooth) * scaled / factor + smooth * scaled;
}

// The rotation angle of `position` for a frequency: position * inv_freq, rounded to T (torch's
// f32 matmul of inv_freq by the position ids, one product per element).
template <typename T>
PS_HOST_DEVICE T RopeAngle(int64_t position, T inv_freq) {
  return inv_freq * static_cast<T>(position);
}

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_ROPE_MATH_H_
