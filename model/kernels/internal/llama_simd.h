// Vectorized f32 loops of the Llama-family CPU kernels (RMSNorm, RoPE, SwiGLU), with Highway's
// run-time dispatch exactly as internal/simd.h (which holds the loops shared with GPT-2: Dot,
// Axpy, Scale, ...). Each element-wise function computes the scalar formula of the corresponding
// *_math.h function lane-wise; the differences from the scalar code are fused multiply-adds where
// the target has them and Highway's exp (within 1 ulp of libm's). The reduction keeps four vector
// accumulators combined pairwise and then across lanes (a different summation order than a
// left-to-right loop). Tails are padded into one more vector with neutral values, so every element
// sees the same arithmetic whatever its position.
//
// Determinism: for a given instruction set the result depends only on the inputs.
// Thread safety: pure functions. REQUIRES: n >= 0 and the arrays valid for n elements; outputs may
// alias inputs only where stated.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_LLAMA_SIMD_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_LLAMA_SIMD_H_

#include <cstdint>

namespace ps::kernels_internal::llama_simd {

// RMSNorm rows (model/kernels/rmsnorm_math.h).
// y[c] = RmsNormOutput(x[c], rstd, w[c]); y may alias x.
void RmsNormOutputRow(const float* x, float rstd, const float* w, float* y, int64_t n);
// sum_c RmsNormGradTerm(dy[c], w[c], x[c], rstd).
float RmsNormGradSumRow(const float* dy, const float* w, const float* x, float rstd, int64_t n);
// dx[c] += RmsNormInputGrad(dy[c], w[c], x[c], rstd, g_xhat_mean).
void RmsNormInputGradRow(const float* dy, const float* w, const float* x, float rstd,
                         float g_xhat_mean, float* dx, int64_t n);
// dw_acc[c] += RmsNormWeightGradTerm(dy[c], x[c], rstd).
void RmsNormParamGradRow(const float* dy, const float* x, float rstd, float* dw_acc, int64_t n);

// RoPE (model/kernels/rope_math.h), in place over one head of 2 * half elements:
// (x[i], x[i + half]) = RopeRotate(x[i], x[i + half], cos[i], sin[i]) for i < half, or
// RopeRotateInverse when `inverse`.
void RopeRotateHead(float* x, const float* cos, const float* sin, int64_t half, bool inverse);

// SwiGLU (model/kernels/swiglu_math.h): h[i] = SwiGlu(g[i], u[i]) (h may alias g or u);
// dg[i] += SwiGluBackwardTerms(...).dg, du[i] += ....du. `gelu`: GeGLU instead
// (GatedActivation with GateActivation::kGeluTanh, the tanh GELU of gelu_math.h).
void SwiGluForward(const float* g, const float* u, float* h, int64_t n, bool gelu = false);
void SwiGluBackward(const float* g, const float* u, const float* dh, float* dg, float* du,
                    int64_t n, bool gelu = false);

}  // namespace ps::kernels_internal::llama_simd

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_LLAMA_SIMD_H_
