// KernelWorkspaces: how many bytes of device workspace each operation of a Kernels implementation
// (model/kernels/kernels.h) asks its caller for, as a value that exists without a backend, a
// stream or a GPU. The pre-flight memory plan runs before any accelerator memory exists
// (model/gpt_activation_profile.h) and must replay the workspaces of the implementation the run
// will use, not the CPU's: the CUDA kernels hand cuBLAS a workspace of the caller's in every GEMM
// (32 MiB on Hopper), and need workspaces on paths where the CPU kernels need none.
//
// One source of truth. Every Kernels implementation answers its workspace queries from one of
// these (Kernels::workspaces()): CpuKernels from CpuKernelWorkspaces over its pool's thread count,
// CudaKernels from CudaKernelWorkspaces over its cuBLAS workspace size. So the plan, built from
// CreateKernelWorkspaces (kernels_factory.h) for the run's backend, and the model, asking its
// kernels at run time, get the same numbers by construction.
//
// Thread safety: immutable after construction; pure functions.
#ifndef PATRICKSTAR_MODEL_KERNELS_KERNEL_WORKSPACES_H_
#define PATRICKSTAR_MODEL_KERNELS_KERNEL_WORKSPACES_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "memory/dtype.h"
#include "model/kernels/gemm_shape.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/lora.h"
#include "model/kernels/matmul.h"
#include "model/kernels/vocab_blocks.h"

namespace ps {

class KernelWorkspaces {
 public:
  virtual ~KernelWorkspaces() = default;

  // The implementation whose sizes these are: "cpu" or "cuda".
  virtual absl::string_view name() const = 0;

  // Bytes of device workspace each operation needs (0 when none). Kernels forwards its
  // `...WorkspaceBytes` queries here; see kernels.h for the operations.
  virtual int64_t GemmWorkspaceBytes(const GemmShape& shape) const = 0;
  virtual int64_t MatmulWorkspaceBytes(const MatmulShape& shape) const = 0;  // fwd and bwd
  virtual int64_t LinearWorkspaceBytes(const LinearShape& shape) const = 0;  // fwd and bwd
  virtual int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& shape) const = 0;
  virtual int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& shape) const = 0;
  // Forward and backward.
  virtual int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& shape) const = 0;
  virtual int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& shape) const = 0;
  virtual int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& shape) const = 0;
  // For a vocabulary block stored as `block_dtype`.
  virtual int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& shape,
                                                   DType block_dtype) const = 0;
  virtual int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& shape,
                                                    DType block_dtype) const = 0;
  // LoRA adapters (model/kernels/lora.h).
  virtual int64_t LoraForwardWorkspaceBytes(const LoraShape& shape) const = 0;
  virtual int64_t LoraBackwardWorkspaceBytes(const LoraShape& shape) const = 0;
  // nn.Linear over a 4-bit weight (model/kernels/nf4_linear.h), forward and input gradient,
  // computing in `compute_dtype` (f32, bf16 or f16: bnb_4bit_compute_dtype).
  virtual int64_t Quant4LinearWorkspaceBytes(const LinearShape& shape,
                                             DType compute_dtype) const = 0;
  int64_t Quant4LinearWorkspaceBytes(const LinearShape& shape) const {  // f32 compute
    return Quant4LinearWorkspaceBytes(shape, DType::kF32);
  }
};

// The CPU kernels' (CpuKernels) for a pool of `threads` threads (the attention kernels keep one
// tile of scores per thread; everything else is independent of it). REQUIRES: threads >= 1.
class CpuKernelWorkspaces final : public KernelWorkspaces {
 public:
  explicit CpuKernelWorkspaces(int threads);

  absl::string_view name() const override { return "cpu"; }
  int threads() const { return threads_; }

  int64_t GemmWorkspaceBytes(const GemmShape& shape) const override;
  int64_t MatmulWorkspaceBytes(const MatmulShape&) const override { return 0; }
  int64_t LinearWorkspaceBytes(const LinearShape&) const override { return 0; }
  int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& shape) const override;
  int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape&) const override { return 0; }
  int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& shape) const override;
  int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& shape) const override;
  int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& shape) const override;
  int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& shape,
                                           DType block_dtype) const override;
  int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& shape,
                                            DType block_dtype) const override;
  int64_t LoraForwardWorkspaceBytes(const LoraShape& shape) const override;
  int64_t LoraBackwardWorkspaceBytes(const LoraShape& shape) const override;
  // One dequantized tile per thread (Quant4LinearWorkspaceElems(shape, threads, compute_dtype):
  // 16-bit compute adds the rounded activations).
  using KernelWorkspaces::Quant4LinearWorkspaceBytes;
  int64_t Quant4LinearWorkspaceBytes(const LinearShape& shape, DType compute_dtype) const override;

 private:
  int threads_;
};

// The CUDA kernels' (CudaKernels, model/kernels/cuda/cuda_kernels.h) with a cuBLAS workspace of
// `cublas_workspace_bytes` in every operation that runs a cuBLAS GEMM (Gemm, Matmul*, Linear*,
// LmHeadCrossEntropy*, LmHeadBlock*), after the kernels' own part (model/kernels/cuda/
// workspace_sizes.h). Portable: no CUDA is needed to ask, so a plan (or a test on the emulated
// accelerator) can model a GPU run's workspaces. REQUIRES: cublas_workspace_bytes >= 0.
class CudaKernelWorkspaces final : public KernelWorkspaces {
 public:
  // NVIDIA's recommended cuBLAS workspace: 32 MiB on Hopper (compute capability 9.x) and newer,
  // 4 MiB on earlier GPUs. CudaKernels uses it when not told otherwise.
  static constexpr int64_t kHopperCublasWorkspaceBytes = int64_t{32} << 20;
  static constexpr int64_t kPreHopperCublasWorkspaceBytes = int64_t{4} << 20;
  static constexpr int64_t DefaultCublasWorkspaceBytes(int compute_capability_major) {
    return compute_capability_major >= 9 ? kHopperCublasWorkspaceBytes
                                         : kPreHopperCublasWorkspaceBytes;
  }

  explicit CudaKernelWorkspaces(int64_t cublas_workspace_bytes);

  absl::string_view name() const override { return "cuda"; }
  int64_t cublas_workspace_bytes() const { return cublas_workspace_bytes_; }

  int64_t GemmWorkspaceBytes(const GemmShape& shape) const override;
  int64_t MatmulWorkspaceBytes(const MatmulShape& shape) const override;
  int64_t LinearWorkspaceBytes(const LinearShape& shape) const override;
  int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& shape) const override;
  int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& shape) const override;
  int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& shape) const override;
  int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& shape) const override;
  int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& shape) const override;
  int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& shape,
                                           DType block_dtype) const override;
  int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& shape,
                                            DType block_dtype) const override;
  int64_t LoraForwardWorkspaceBytes(const LoraShape& shape) const override;
  int64_t LoraBackwardWorkspaceBytes(const LoraShape& shape) const override;
  // The dequantized tile (cuda::Quant4LinearWorkspaceBytes; 16-bit compute: the 16-bit tile, the
  // rounded activations and an f32 product), then cuBLAS's.
  using KernelWorkspaces::Quant4LinearWorkspaceBytes;
  int64_t Quant4LinearWorkspaceBytes(const LinearShape& shape, DType compute_dtype) const override;

 private:
  int64_t cublas_workspace_bytes_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_KERNEL_WORKSPACES_H_
