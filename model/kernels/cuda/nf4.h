// The 4-bit (NF4/FP4) weight codec's dequantization and the dequantizing nn.Linear on the GPU: the
// CUDA twin of model/kernels/nf4.h and nf4_linear.h. Tensors' pointers are device memory.
//
// Dequantize4Bit gives the CPU codec's values bit for bit (one float32 product per value). The
// Linear GEMMs dequantize tiles of W into the caller's f32 workspace (one kernel per tile) and
// multiply them with cuBLAS (f32, CUBLAS_COMPUTE_32F), in stream order, so one workspace serves
// every tile: forward tiles are rows of W ([rows_per_tile, in]), input-gradient tiles columns
// ([out, cols_per_tile]); a larger workspace means fewer, larger GEMMs. The GEMMs round as cuBLAS
// does (not the CPU's OpenBLAS grid).
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_NF4_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_NF4_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "memory/dtype.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/linear.h"
#include "model/kernels/nf4.h"

namespace ps::cuda {

// Values [begin, begin + count) of t into dst as dst_dtype (f32; bf16 / f16: the f32 value
// rounded to nearest even), bit for bit the CPU codec's. InvalidArgument on a bad tensor, range or
// dtype.
[[nodiscard]] absl::Status Dequantize4Bit(const Quant4Tensor& t, int64_t begin, int64_t count,
                                          DType dst_dtype, void* dst, cudaStream_t stream);
inline absl::Status Dequantize4Bit(const Quant4Tensor& t, int64_t begin, int64_t count, float* dst,
                                   cudaStream_t stream) {
  return Dequantize4Bit(t, begin, count, DType::kF32, dst, stream);
}

// The smallest workspace (f32 elements) the GEMMs accept: one row of W (forward) or one column
// (input gradient), whichever is larger.
inline int64_t Quant4LinearMinWorkspaceElems(const LinearShape& s) {
  return s.in_features > s.out_features ? s.in_features : s.out_features;
}

// y = x dequant(W)^T + b (b null when !shape.bias), y overwritten.
[[nodiscard]] absl::Status Quant4LinearForward(const CublasHandle& cublas, const LinearShape& shape,
                                               const float* x, const Quant4Tensor& w,
                                               const float* b, float* y, float* workspace,
                                               int64_t workspace_elems, cudaStream_t stream);

// dx += dy dequant(W).
[[nodiscard]] absl::Status Quant4LinearBackwardInput(const CublasHandle& cublas,
                                                     const LinearShape& shape,
                                                     const Quant4Tensor& w, const float* dy,
                                                     float* dx, float* workspace,
                                                     int64_t workspace_elems, cudaStream_t stream);

// The same computing in bf16 or f16 (bnb_4bit_compute_dtype; model/kernels/nf4_linear.h has the
// semantics): x (dy) rounded to compute_dtype into the workspace, tiles dequantized to it (the f32
// product rounded to nearest even), cublasGemmEx on the 16-bit operands with CUBLAS_COMPUTE_32F;
// forward: the bias rounded before the GEMM adds to it, y rounded after; backward: each tile's
// f32 product rounded, then added to dx. The workspace is Quant4LinearLayout(shape, compute_dtype)
// (workspace_sizes.h): at least its `bytes`. InvalidArgument for a compute dtype other than bf16
// or f16 (f32 is the functions above), a smaller workspace, or the errors above.
[[nodiscard]] absl::Status Quant4LinearForward16(const CublasHandle& cublas,
                                                 const LinearShape& shape, const float* x,
                                                 const Quant4Tensor& w, const float* b, float* y,
                                                 DType compute_dtype, void* workspace,
                                                 int64_t workspace_bytes, cudaStream_t stream);
[[nodiscard]] absl::Status Quant4LinearBackwardInput16(const CublasHandle& cublas,
                                                       const LinearShape& shape,
                                                       const Quant4Tensor& w, const float* dy,
                                                       float* dx, DType compute_dtype,
                                                       void* workspace, int64_t workspace_bytes,
                                                       cudaStream_t stream);

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_NF4_H_
