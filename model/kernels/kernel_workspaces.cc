#include "model/kernels/kernel_workspaces.h"

#include <cstdint>

#include "glog/logging.h"
#include "model/kernels/cuda/workspace_sizes.h"
#include "model/kernels/nf4_linear.h"

namespace ps {
namespace {

constexpr int64_t kF32 = sizeof(float);

}  // namespace

// --- CPU
// ------------------------------------------------------------------------------------------

CpuKernelWorkspaces::CpuKernelWorkspaces(int threads) : threads_(threads) {
  CHECK_GE(threads, 1) << "CpuKernelWorkspaces: threads";
}

int64_t CpuKernelWorkspaces::GemmWorkspaceBytes(const GemmShape& s) const {
  if (s.ab_dtype == DType::kF32) return 0;
  // bf16: the product, for alpha != 1 or beta not in {0, 1} (GemmBf16 writes or adds to C only).
  if (s.ab_dtype == DType::kBF16) return s.m * s.n * kF32;
  // f16: both operands widened to f32 (stored shapes: A [m,k] or [k,m], B [k,n] or [n,k]).
  return (s.m * s.k + s.k * s.n) * kF32;
}

int64_t CpuKernelWorkspaces::GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& s) const {
  return GqaAttentionWorkspaceBytes<float>(s, threads_);
}

int64_t CpuKernelWorkspaces::LmHeadCrossEntropyWorkspaceBytes(
    const LmHeadCrossEntropyShape& s) const {
  return ::ps::LmHeadCrossEntropyWorkspaceBytes<float>(s);
}

int64_t CpuKernelWorkspaces::MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) const {
  return MatmulBf16ForwardWorkspaceElems(s) * kF32;
}

int64_t CpuKernelWorkspaces::MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) const {
  return MatmulBf16BackwardWorkspaceElems(s) * kF32;
}

int64_t CpuKernelWorkspaces::LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s,
                                                              DType block_dtype) const {
  return LmHeadBlockForwardWorkspaceElems(s, block_dtype != DType::kF32) * kF32;
}

int64_t CpuKernelWorkspaces::LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s,
                                                               DType block_dtype) const {
  return LmHeadBlockBackwardWorkspaceElems(s, block_dtype != DType::kF32) * kF32;
}

int64_t CpuKernelWorkspaces::LoraForwardWorkspaceBytes(const LoraShape&) const { return 0; }

// g [rows, rank] f32.
int64_t CpuKernelWorkspaces::LoraBackwardWorkspaceBytes(const LoraShape& s) const {
  return LoraBackwardWorkspaceElems(s) * kF32;
}

int64_t CpuKernelWorkspaces::Quant4LinearWorkspaceBytes(const LinearShape& s,
                                                        DType compute_dtype) const {
  return Quant4LinearWorkspaceElems(s, threads_, compute_dtype) * kF32;
}

// --- CUDA
// -----------------------------------------------------------------------------------------
// Operations that run a cuBLAS GEMM: the kernels' own part (aligned), then cuBLAS's.

CudaKernelWorkspaces::CudaKernelWorkspaces(int64_t cublas_workspace_bytes)
    : cublas_workspace_bytes_(cublas_workspace_bytes) {
  CHECK_GE(cublas_workspace_bytes, 0) << "CudaKernelWorkspaces: cublas_workspace_bytes";
}

int64_t CudaKernelWorkspaces::GemmWorkspaceBytes(const GemmShape&) const {
  return cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::MatmulWorkspaceBytes(const MatmulShape&) const {
  return cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::LinearWorkspaceBytes(const LinearShape&) const {
  return cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& s) const {
  return cuda::GqaAttentionForwardWorkspaceBytes(s);
}

int64_t CudaKernelWorkspaces::GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& s) const {
  return cuda::GqaAttentionBackwardWorkspaceBytes(s);
}

int64_t CudaKernelWorkspaces::LmHeadCrossEntropyWorkspaceBytes(
    const LmHeadCrossEntropyShape& s) const {
  return cuda::AlignWorkspaceBytes(cuda::LmHeadCrossEntropyWorkspaceBytes(s)) +
         cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) const {
  return cuda::AlignWorkspaceBytes(cuda::MatmulBf16ForwardWorkspaceBytes(s)) +
         cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) const {
  return cuda::AlignWorkspaceBytes(cuda::MatmulBf16BackwardWorkspaceBytes(s)) +
         cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s,
                                                               DType block_dtype) const {
  return cuda::AlignWorkspaceBytes(cuda::LmHeadBlockForwardWorkspaceBytes(s, block_dtype)) +
         cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s,
                                                                DType block_dtype) const {
  return cuda::AlignWorkspaceBytes(cuda::LmHeadBlockBackwardWorkspaceBytes(s, block_dtype)) +
         cublas_workspace_bytes_;
}

// The forward's two GEMMs need only cuBLAS's workspace; the backward keeps g [rows, rank] f32
// before it.
int64_t CudaKernelWorkspaces::LoraForwardWorkspaceBytes(const LoraShape&) const {
  return cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::LoraBackwardWorkspaceBytes(const LoraShape& s) const {
  return cuda::AlignWorkspaceBytes(LoraBackwardWorkspaceElems(s) * kF32) + cublas_workspace_bytes_;
}

int64_t CudaKernelWorkspaces::Quant4LinearWorkspaceBytes(const LinearShape& s,
                                                         DType compute_dtype) const {
  return cuda::AlignWorkspaceBytes(cuda::Quant4LinearWorkspaceBytes(s, compute_dtype)) +
         cublas_workspace_bytes_;
}

}  // namespace ps
