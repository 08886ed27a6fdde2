// Vectorized f32 loops of the CPU kernels (model/kernels), with Highway's run-time dispatch: each
// call runs the best instruction set this CPU supports (AVX-512, AVX2, SSE4, ...; no -march flags),
// as memory/convert.h does. The kernels' f64 instantiations stay scalar (they are the exact
// references of the finite-difference tests).
//
// Results. Every element-wise function computes the scalar formula of the corresponding
// *_math.h function lane-wise; the only differences from the scalar code are fused multiply-adds
// where the target has them, and Highway's exp (within 1 ulp) instead of libm's. Reductions (Dot,
// Sum, SumSquaredDeviation, Max is exact, SumExpMinus) keep four vector accumulators, combined
// pairwise and then across lanes: a different summation order than a left-to-right loop, so sums
// differ from the scalar code by rounding (relative ~n * 6e-8 worst case, usually far less).
// Tails (n not a multiple of the vector length) are padded into one more vector with a neutral
// value, so every element goes through the same arithmetic whatever its position.
//
// Determinism: for a given instruction set the result depends only on the inputs (no threads, no
// dependence on alignment), so the kernels' thread-count independence is preserved. Different
// instruction sets may round differently.
//
// Thread safety: pure functions. REQUIRES: n >= 0 and the arrays valid for n elements; output
// arrays may alias inputs only where stated.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_H_

#include <cstdint>

namespace ps::kernels_internal::simd {

// sum_i a[i] b[i].
float Dot(const float* a, const float* b, int64_t n);
// sum_i x[i].
float Sum(const float* x, int64_t n);
// sum_i (x[i] - mean)^2.
float SumSquaredDeviation(const float* x, float mean, int64_t n);
// max_i x[i]; -inf for n == 0.
float Max(const float* x, int64_t n);
// sum_i exp(z[i] - m), REQUIRES z[i] <= m or z[i] - m < 88 (no overflow).
float SumExpMinus(const float* z, float m, int64_t n);

// y[i] += alpha x[i].
void Axpy(float alpha, const float* x, float* y, int64_t n);
// y[i] *= alpha.
void Scale(float alpha, float* y, int64_t n);
// out[i] = a[i] + b[i]; out may alias a or b.
void Add(const float* a, const float* b, float* out, int64_t n);
// y[i] += x[i].
void AddTo(const float* x, float* y, int64_t n);
// z[i] = scale * exp(z[i] - lse)  (CrossEntropyLogitGrad without the target's -scale).
void ScaledExpMinus(float scale, float lse, float* z, int64_t n);

// GELU (model/kernels/gelu_math.h): y = GeluTanh(x) (y may alias x); dx += dy *
// GeluTanhDerivative(x).
void GeluForward(const float* x, float* y, int64_t n);
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n);

// LayerNorm rows (model/kernels/layernorm_math.h).
// y[c] = LayerNormOutput(x[c], mean, rstd, w[c], b[c]).
void LayerNormOutputRow(const float* x, float mean, float rstd, const float* w, const float* b,
                        float* y, int64_t n);
// *g_sum = sum_c dy[c] w[c]; *g_xhat_sum = sum_c LayerNormBackwardTerms(...).g_xhat.
void LayerNormGradSumsRow(const float* dy, const float* w, const float* x, float mean, float rstd,
                          int64_t n, float* g_sum, float* g_xhat_sum);
// dx[c] += LayerNormInputGrad(dy[c], w[c], x[c], mean, rstd, g_mean, g_xhat_mean).
void LayerNormInputGradRow(const float* dy, const float* w, const float* x, float mean, float rstd,
                           float g_mean, float g_xhat_mean, float* dx, int64_t n);
// dw_acc[c] += LayerNormWeightGradTerm(dy[c], x[c], mean, rstd); db_acc[c] += dy[c].
void LayerNormParamGradRow(const float* dy, const float* x, float mean, float rstd, float* dw_acc,
                           float* db_acc, int64_t n);

// The instruction set the calls above dispatch to (e.g. "AVX2").
const char* TargetName();

}  // namespace ps::kernels_internal::simd

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_SIMD_H_
