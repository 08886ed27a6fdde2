// Launchers of the CUDA kernels of model/kernels/cuda, one per device kernel
// (or short sequence of kernels). Plain C++ without Abseil so that nvcc
// compiles the .cu files that define them; the public host API
// (model/kernels/cuda/*.h) validates shapes and pointers, calls these and turns
// the returned cudaError_t (cudaGetLastError after the launch) into a Status.
//
// Every launcher enqueues on `stream` and returns; none allocates or
// synchronizes. Shapes are REQUIRED valid (checked by the callers); dimensions
// are element counts.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_LAUNCHERS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_LAUNCHERS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace ps::cuda_internal {

// --- Element-wise (elementwise_kernels.cu)
// ------------------------------------------------------

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; a row whose token is outside [0,
// V) becomes NaN.
cudaError_t LaunchEncoderForward(int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab,
                                 const int32_t* tokens, const float* wte, const float* wpe,
                                 float* out, cudaStream_t stream);
// dwte[tokens[r],:] += dout[r,:] (rows in order per element), dwpe[t,:] +=
// sum_b dout[b,t,:]. Rows with an out-of-range token add nothing to dwte.
cudaError_t LaunchEncoderBackward(int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab,
                                  const int32_t* tokens, const float* dout, float* dwte,
                                  float* dwpe, cudaStream_t stream);
cudaError_t LaunchGeluForward(int64_t n, const float* x, float* y, cudaStream_t stream);
cudaError_t LaunchGeluBackward(int64_t n, const float* x, const float* dy, float* dx,
                               cudaStream_t stream);
cudaError_t LaunchResidualForward(int64_t n, const float* a, const float* b, float* out,
                                  cudaStream_t stream);
cudaError_t LaunchResidualBackward(int64_t n, const float* dout, float* da, float* db,
                                   cudaStream_t stream);
// x[i] *= alpha.
cudaError_t LaunchScaleInPlace(int64_t n, float alpha, float* x, cudaStream_t stream);
// y[r,:] = bias for every row r of a [rows, cols] matrix.
cudaError_t LaunchBroadcastRows(int64_t rows, int64_t cols, const float* bias, float* y,
                                cudaStream_t stream);
// db[c] += sum over rows of dy[r,c], rows summed in a fixed order
// (deterministic).
cudaError_t LaunchColumnSums(int64_t rows, int64_t cols, const float* dy, float* db,
                             cudaStream_t stream);

// --- LoRA's input dropout (lora_kernels.cu; model/kernels/dropout_math.h's rule) -------------
// y[i] = keep(seed, i) ? x[i] * scale(p) : 0 for i < n.
cudaError_t LaunchDropoutForward(int64_t n, float p, uint64_t seed, const float* x, float* y,
                                 cudaStream_t stream);
// dx[i] += keep(seed, i) ? dy[i] * scale(p) : 0 for i < n.
cudaError_t LaunchDropoutBackward(int64_t n, float p, uint64_t seed, const float* dy, float* dx,
                                  cudaStream_t stream);

// --- LayerNorm (layernorm_kernels.cu)
// ----------------------------------------------------------

cudaError_t LaunchLayerNormForward(int64_t rows, int64_t channels, float eps, const float* x,
                                   const float* w, const float* b, float* y, float* mean,
                                   float* rstd, cudaStream_t stream);
cudaError_t LaunchLayerNormBackward(int64_t rows, int64_t channels, const float* x, const float* w,
                                    const float* mean, const float* rstd, const float* dy,
                                    float* dx, float* dw, float* db, cudaStream_t stream);

// --- Cross-entropy rows (cross_entropy_kernels.cu)
// ---------------------------------------------

// Folds the logits tile z[R, Vt] (columns v0 .. v0+Vt of rows r0 .. r0+R) into
// the running softmax states (run_max, run_sum [R]; taken as empty when v0 ==
// 0) and records each row's target logit when the target falls in the tile.
// targets points at row r0.
cudaError_t LaunchCrossEntropyForwardTile(int64_t rows, int64_t vocab_tile, int64_t v0,
                                          const float* z, const int32_t* targets, float* run_max,
                                          float* run_sum, float* target_logit, cudaStream_t stream);
// lse[i] = log-sum-exp of row i's state; row_loss[i] = lse - target logit (0 if
// ignored, NaN if the target is outside [0, vocab) and not ignore_index). lse,
// targets and row_loss point at r0.
cudaError_t LaunchCrossEntropyFinishRows(int64_t rows, int64_t vocab, int32_t ignore_index,
                                         const int32_t* targets, const float* run_max,
                                         const float* run_sum, const float* target_logit,
                                         float* lse, double* row_loss, cudaStream_t stream);
// *loss = sum(row_loss) / (number of non-ignored targets), 0 if none; summed in
// double in a fixed order (one block).
cudaError_t LaunchCrossEntropyMeanLoss(int64_t rows, int32_t ignore_index, const int32_t* targets,
                                       const double* row_loss, double* loss, cudaStream_t stream);
// *scale = loss_grad / (number of non-ignored targets) rounded to f32, 0 if
// none (one block).
cudaError_t LaunchCrossEntropyGradScale(int64_t rows, int32_t ignore_index, const int32_t* targets,
                                        double loss_grad, float* scale, cudaStream_t stream);
// In place over the logits tile: dz = CrossEntropyLogitGrad(z, lse, *scale, v
// == target), 0 for ignored rows, NaN for rows with an out-of-range target.
// targets and lse point at r0.
cudaError_t LaunchCrossEntropyBackwardTile(int64_t rows, int64_t vocab_tile, int64_t v0,
                                           int64_t vocab, int32_t ignore_index,
                                           const int32_t* targets, const float* lse,
                                           const float* scale, float* dz, cudaStream_t stream);

}  // namespace ps::cuda_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_LAUNCHERS_H_
