#include "model/kernels/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/cuda/convert_kernels.h"
#include "memory/cuda/cuda_status.h"
#include "model/kernels/cuda/elementwise.h"
#include "model/kernels/cuda/gqa_attention.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/layernorm.h"
#include "model/kernels/cuda/linear.h"
#include "model/kernels/cuda/llama_elementwise.h"
#include "model/kernels/cuda/lm_head_cross_entropy.h"
#include "model/kernels/cuda/lora.h"
#include "model/kernels/cuda/matmul.h"
#include "model/kernels/cuda/nf4.h"
#include "model/kernels/cuda/rmsnorm.h"
#include "model/kernels/cuda/vocab_blocks.h"

namespace ps::cuda {
namespace {

using cuda_internal::AlignBytes;

GemmOperand OperandOf(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return GemmOperand::kF16;
    case DType::kBF16:
      return GemmOperand::kBF16;
    case DType::kF32:
      break;
  }
  return GemmOperand::kF32;
}

absl::Status ConvertStatus(cudaError_t error) {
  return cuda_internal::LaunchStatus(error, "cuda::Convert");
}

}  // namespace

absl::StatusOr<int64_t> CudaKernels::CublasWorkspaceBytes(int device, int64_t requested_bytes) {
  if (requested_bytes < 0 || requested_bytes % 256 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaKernelsOptions.cublas_workspace_bytes must be 0 (NVIDIA's default) or a "
                     "positive multiple of 256, got ",
                     requested_bytes));
  }
  if (requested_bytes > 0) return requested_bytes;
  int major = 0;
  PS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(major);
}

absl::StatusOr<std::unique_ptr<CudaKernels>> CudaKernels::Create(
    Backend* backend, const CudaKernelsOptions& options) {
  if (backend == nullptr) return absl::InvalidArgumentError("CudaKernels: the backend is null");
  if (backend->name() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaKernels: run on the cuda backend, not on the ", backend->name(),
                     " backend; use CreateKernels to pick the implementation"));
  }
  const int device = backend->device().index;
  ASSIGN_OR_RETURN(const int64_t workspace_bytes,
                   CublasWorkspaceBytes(device, options.cublas_workspace_bytes));
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  // No workspace of its own: every call attaches the caller's.
  ASSIGN_OR_RETURN(CublasHandle handle, CublasHandle::Create(/*workspace_bytes=*/0));
  return std::unique_ptr<CudaKernels>(
      new CudaKernels(device, std::move(handle), workspace_bytes, options.check_device_pointers));
}

absl::StatusOr<cudaStream_t> CudaKernels::Prepare(Stream& stream) {
  auto* native = static_cast<cudaStream_t>(stream.native_handle());
  if (native == nullptr) {
    return absl::InvalidArgumentError(
        "CudaKernels: the stream is not a cuda stream (was it created by the cpu backend?)");
  }
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index_));
  return native;
}

template <typename Fn>
absl::Status CudaKernels::WithCublas(void* workspace, int64_t bytes, Fn fn) {
  MutexLock lock(&cublas_mu_);
  cublas_.UseExternalWorkspace(workspace, bytes);
  return fn(static_cast<const CublasHandle&>(cublas_));
}

absl::Status CudaKernels::CheckBuffer(absl::string_view op, const BufferArg& buffer) {
  if (!check_device_pointers_) return absl::OkStatus();
  cudaPointerAttributes attributes;
  const cudaError_t error = cudaPointerGetAttributes(&attributes, buffer.ptr);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", buffer.name,
        " is not device memory (cudaPointerGetAttributes: ", cudaGetErrorString(error), ")"));
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", buffer.name, " is host memory; kernels take device memory of the accelerator"));
  }
  return absl::OkStatus();
}

// --- Memory and GEMM
// ------------------------------------------------------------------------------

absl::Status CudaKernels::DoZero(Stream& stream, void* dst, int64_t bytes) {
  RETURN_IF_ERROR(Prepare(stream).status());
  return stream.MemsetAsync(dst, 0, bytes);
}

absl::Status CudaKernels::DoConvert(Stream& stream, DType from, const void* src, DType to,
                                    void* dst, int64_t n) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  if (from == to) {
    return stream.MemcpyAsync(dst, src, n * SizeOf(from), CopyKind::kDeviceToDevice);
  }
  const auto* u16 = static_cast<const uint16_t*>(src);
  auto* o16 = static_cast<uint16_t*>(dst);
  if (from == DType::kF32) {
    const auto* f = static_cast<const float*>(src);
    return ConvertStatus(to == DType::kF16 ? LaunchConvertF32ToF16(f, o16, n, s)
                                           : LaunchConvertF32ToBF16(f, o16, n, s));
  }
  if (to == DType::kF32) {
    auto* f = static_cast<float*>(dst);
    return ConvertStatus(from == DType::kF16 ? LaunchConvertF16ToF32(u16, f, n, s)
                                             : LaunchConvertBF16ToF32(u16, f, n, s));
  }
  return ConvertStatus(from == DType::kF16 ? LaunchConvertF16ToBF16(u16, o16, n, s)
                                           : LaunchConvertBF16ToF16(u16, o16, n, s));
}

absl::Status CudaKernels::DoGemm(Stream& stream, const GemmShape& g, float alpha, const void* a,
                                 const void* b, float beta, float* c, void* workspace,
                                 int64_t workspace_bytes) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return WithCublas(workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::Gemm(h, s, g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, OperandOf(g.ab_dtype),
                            a, g.lda, b, g.ldb, beta, c, g.ldc);
  });
}

// --- GPT-2
// ----------------------------------------------------------------------------------------

absl::Status CudaKernels::DoEncoderForward(Stream& stream, const EncoderShape& shape,
                                           const int32_t* tokens, const float* wte,
                                           const float* wpe, float* out) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::EncoderForward(shape, tokens, wte, wpe, out, s);
}

absl::Status CudaKernels::DoEncoderBackward(Stream& stream, const EncoderShape& shape,
                                            const int32_t* tokens, const float* dout, float* dwte,
                                            float* dwpe) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::EncoderBackward(shape, tokens, dout, dwte, dwpe, s);
}

absl::Status CudaKernels::DoLayerNormForward(Stream& stream, const LayerNormShape& shape,
                                             const float* x, const float* w, const float* b,
                                             float* y, float* mean, float* rstd) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::LayerNormForward(shape, x, w, b, y, mean, rstd, s);
}

absl::Status CudaKernels::DoLayerNormBackward(Stream& stream, const LayerNormShape& shape,
                                              const float* x, const float* w, const float* mean,
                                              const float* rstd, const float* dy, float* dx,
                                              float* dw, float* db) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::LayerNormBackward(shape, x, w, mean, rstd, dy, dx, dw, db, s);
}

absl::Status CudaKernels::DoMatmulForward(Stream& stream, const MatmulShape& shape, const float* x,
                                          const float* w, const float* b, float* y, void* workspace,
                                          int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return WithCublas(workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::MatmulForward(h, shape, x, w, b, y, s);
  });
}

absl::Status CudaKernels::DoMatmulBackward(Stream& stream, const MatmulShape& shape, const float* x,
                                           const float* w, const float* dy, float* dx, float* dw,
                                           float* db, void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return WithCublas(workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::MatmulBackward(h, shape, x, w, dy, dx, dw, db, s);
  });
}

absl::Status CudaKernels::DoGeluForward(Stream& stream, int64_t n, const float* x, float* y) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::GeluForward(n, x, y, s);
}

absl::Status CudaKernels::DoGeluBackward(Stream& stream, int64_t n, const float* x, const float* dy,
                                         float* dx) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::GeluBackward(n, x, dy, dx, s);
}

absl::Status CudaKernels::DoResidualForward(Stream& stream, int64_t n, const float* a,
                                            const float* b, float* out) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::ResidualForward(n, a, b, out, s);
}

absl::Status CudaKernels::DoResidualBackward(Stream& stream, int64_t n, const float* dout,
                                             float* da, float* db) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::ResidualBackward(n, dout, da, db, s);
}

absl::Status CudaKernels::DoScaleInPlace(Stream& stream, int64_t n, float alpha, float* x) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::ScaleInPlace(n, alpha, x, s);
}

absl::Status CudaKernels::DoLmHeadCrossEntropyForward(Stream& stream,
                                                      const LmHeadCrossEntropyShape& shape,
                                                      const float* h, const float* wte,
                                                      const int32_t* targets, float* lse,
                                                      double* loss, void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::LmHeadCrossEntropyWorkspaceBytes(shape));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& hd) {
    return ::ps::cuda::LmHeadCrossEntropyForward(hd, shape, h, wte, targets, lse, loss, workspace,
                                                 own, s);
  });
}

absl::Status CudaKernels::DoLmHeadCrossEntropyBackward(Stream& stream,
                                                       const LmHeadCrossEntropyShape& shape,
                                                       const float* h, const float* wte,
                                                       const int32_t* targets, const float* lse,
                                                       double loss_grad, float* dh, float* dwte,
                                                       void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::LmHeadCrossEntropyWorkspaceBytes(shape));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& hd) {
    return ::ps::cuda::LmHeadCrossEntropyBackward(hd, shape, h, wte, targets, lse, loss_grad, dh,
                                                  dwte, workspace, own, s);
  });
}

// --- Llama / Qwen2 / Mistral
// ----------------------------------------------------------------------

absl::Status CudaKernels::DoRmsNormForward(Stream& stream, const RmsNormShape& shape,
                                           const float* x, const float* w, float* y, float* rstd) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::RmsNormForward(shape, x, w, y, rstd, s);
}

absl::Status CudaKernels::DoRmsNormBackward(Stream& stream, const RmsNormShape& shape,
                                            const float* x, const float* w, const float* rstd,
                                            const float* dy, float* dx, float* dw) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::RmsNormBackward(shape, x, w, rstd, dy, dx, dw, s);
}

absl::Status CudaKernels::DoRopeForward(Stream& stream, const RopeShape& shape, const float* cos,
                                        const float* sin, float* x, const int32_t* positions) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::RopeForward(shape, cos, sin, x, s, positions);
}

absl::Status CudaKernels::DoRopeBackward(Stream& stream, const RopeShape& shape, const float* cos,
                                         const float* sin, float* dx, const int32_t* positions) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::RopeBackward(shape, cos, sin, dx, s, positions);
}

absl::Status CudaKernels::DoSwiGluForward(Stream& stream, int64_t n, const float* g, const float* u,
                                          float* h, GateActivation act) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::SwiGluForward(n, g, u, h, s, act);
}

absl::Status CudaKernels::DoSwiGluBackward(Stream& stream, int64_t n, const float* g,
                                           const float* u, const float* dh, float* dg, float* du,
                                           GateActivation act) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::SwiGluBackward(n, g, u, dh, dg, du, s, act);
}

absl::Status CudaKernels::DoGqaAttentionForward(Stream& stream, const GqaAttentionShape& shape,
                                                const float* q, const float* k, const float* v,
                                                float* out, float* lse, void*, int64_t,
                                                const int32_t* key_start) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::GqaAttentionForward(shape, q, k, v, out, lse, s, key_start);
}

absl::Status CudaKernels::DoGqaAttentionBackward(Stream& stream, const GqaAttentionShape& shape,
                                                 const float* q, const float* k, const float* v,
                                                 const float* out, const float* lse,
                                                 const float* dout, float* dq, float* dk, float* dv,
                                                 void* workspace, int64_t workspace_bytes,
                                                 const int32_t* key_start) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::GqaAttentionBackward(shape, q, k, v, out, lse, dout, dq, dk, dv, workspace,
                                          workspace_bytes, s, key_start);
}

absl::Status CudaKernels::DoLinearForward(Stream& stream, const LinearShape& shape, const float* x,
                                          const float* w, const float* b, float* y, void* workspace,
                                          int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return WithCublas(workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::LinearForward(h, shape, x, w, b, y, s);
  });
}

absl::Status CudaKernels::DoLinearBackward(Stream& stream, const LinearShape& shape, const float* x,
                                           const float* w, const float* dy, float* dx, float* dw,
                                           float* db, void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return WithCublas(workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::LinearBackward(h, shape, x, w, dy, dx, dw, db, s);
  });
}

absl::Status CudaKernels::DoEmbeddingForward(Stream& stream, const EmbeddingShape& shape,
                                             const int32_t* tokens, const float* wte, float* out) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::EmbeddingForward(shape, tokens, wte, out, s);
}

absl::Status CudaKernels::DoEmbeddingBackward(Stream& stream, const EmbeddingShape& shape,
                                              const int32_t* tokens, const float* dout,
                                              float* dwte) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::EmbeddingBackward(shape, tokens, dout, dwte, s);
}

// --- bf16-weight GEMMs and the vocabulary in row blocks ------------------------------------------
// Operations with a workspace: the kernels' own part first, cuBLAS's after it.

absl::Status CudaKernels::DoMatmulForwardBf16(Stream& stream, const MatmulShape& shape,
                                              const float* x, const uint16_t* w, const float* b,
                                              float* y, void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::MatmulBf16ForwardWorkspaceBytes(shape));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::MatmulForwardBf16(h, shape, x, w, b, y, workspace, own, s);
  });
}

absl::Status CudaKernels::DoMatmulBackwardBf16(Stream& stream, const MatmulShape& shape,
                                               const float* x, const uint16_t* w, const float* dy,
                                               float* dx, float* dw, float* db, void* workspace,
                                               int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::MatmulBf16BackwardWorkspaceBytes(shape));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    return ::ps::cuda::MatmulBackwardBf16(h, shape, x, w, dy, dx, dw, db, workspace, own, s);
  });
}

absl::Status CudaKernels::DoEmbeddingBlockForward(Stream& stream, const VocabBlockShape& shape,
                                                  const int32_t* tokens, DType block_dtype,
                                                  const void* block, float* out) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::EmbeddingBlockForward(shape, tokens, block_dtype, block, out, s);
}

absl::Status CudaKernels::DoScatterRowsAdd(Stream& stream, const TouchedRowsShape& shape,
                                           int64_t num_tokens, const int32_t* tokens,
                                           const int32_t* slot_of_token, const float* dout,
                                           float* slot_rows) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::ScatterRowsAdd(shape.channels, shape.vocab_size, shape.num_slots, num_tokens,
                                    tokens, slot_of_token, dout, slot_rows, s);
}

absl::Status CudaKernels::DoCopyRowsToSlots(Stream& stream, const TouchedRowsShape& shape,
                                            int64_t row_begin, int64_t rows,
                                            const int32_t* slot_of_token, const float* src,
                                            float* slot_rows) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::CopyRowsToSlots(shape.channels, shape.vocab_size, shape.num_slots, row_begin,
                                     rows, slot_of_token, src, slot_rows, s);
}

absl::Status CudaKernels::DoCopySlotsToRows(Stream& stream, const TouchedRowsShape& shape,
                                            int64_t row_begin, int64_t rows,
                                            const int32_t* slot_of_token, const float* slot_rows,
                                            DType dst_dtype, void* dst) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::CopySlotsToRows(shape.channels, shape.vocab_size, shape.num_slots, row_begin,
                                     rows, slot_of_token, slot_rows, dst_dtype, dst, s);
}

absl::Status CudaKernels::DoPositionEmbeddingForward(Stream& stream, int64_t batch, int64_t seq_len,
                                                     int64_t channels, int64_t max_seq_len,
                                                     const float* wpe, float* out,
                                                     const int32_t* positions) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::PositionEmbeddingForward(batch, seq_len, channels, wpe, out, s, positions,
                                              max_seq_len);
}

absl::Status CudaKernels::DoPositionEmbeddingBackward(Stream& stream, int64_t batch,
                                                      int64_t seq_len, int64_t channels,
                                                      int64_t max_seq_len, const float* dout,
                                                      float* dwpe, const int32_t* positions) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::PositionEmbeddingBackward(batch, seq_len, channels, dout, dwpe, s, positions,
                                               max_seq_len);
}

absl::Status CudaKernels::DoLmHeadStateInit(Stream& stream, const VocabBlockShape& shape,
                                            float* state) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::LmHeadStateInit(shape.rows, state, s);
}

absl::Status CudaKernels::DoLmHeadBlockForward(Stream& stream, const VocabBlockShape& shape,
                                               const float* h, DType block_dtype, const void* block,
                                               const int32_t* targets, float* state,
                                               void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::LmHeadBlockForwardWorkspaceBytes(shape, block_dtype));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& hd) {
    return ::ps::cuda::LmHeadBlockForward(hd, shape, h, block_dtype, block, targets, state,
                                          workspace, own, s);
  });
}

absl::Status CudaKernels::DoLmHeadFinish(Stream& stream, const VocabBlockShape& shape,
                                         const int32_t* targets, const float* state, float* lse,
                                         double* loss) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::LmHeadFinish(shape, targets, state, lse, loss, s);
}

absl::Status CudaKernels::DoLmHeadBlockBackward(Stream& stream, const VocabBlockShape& shape,
                                                const float* h, DType block_dtype,
                                                const void* block, const int32_t* targets,
                                                const float* lse, double loss_grad, float* dh,
                                                float* dblock, void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::LmHeadBlockBackwardWorkspaceBytes(shape, block_dtype));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& hd) {
    return ::ps::cuda::LmHeadBlockBackward(hd, shape, h, block_dtype, block, targets, lse,
                                           loss_grad, dh, dblock, workspace, own, s);
  });
}

// --- 4-bit weights -------------------------------------------------------------------------------
// The Linear GEMMs: the dequantized tile (cuda::Quant4LinearWorkspaceBytes; 16-bit compute: its
// Quant4LinearLayout) first, cuBLAS's after.

absl::Status CudaKernels::DoDequantize4Bit(Stream& stream, const Quant4Tensor& w, int64_t begin,
                                           int64_t count, DType dst_dtype, void* dst) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::Dequantize4Bit(w, begin, count, dst_dtype, dst, s);
}

absl::Status CudaKernels::DoQuant4LinearForward(Stream& stream, const LinearShape& shape,
                                                const float* x, const Quant4Tensor& w,
                                                const float* b, float* y, void* workspace,
                                                int64_t, DType compute_dtype) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own_bytes = ::ps::cuda::Quant4LinearWorkspaceBytes(shape, compute_dtype);
  void* cublas_workspace = static_cast<char*>(workspace) + AlignBytes(own_bytes);
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    if (compute_dtype != DType::kF32) {
      return ::ps::cuda::Quant4LinearForward16(h, shape, x, w, b, y, compute_dtype, workspace,
                                               own_bytes, s);
    }
    return ::ps::cuda::Quant4LinearForward(h, shape, x, w, b, y, static_cast<float*>(workspace),
                                           ::ps::cuda::Quant4LinearTileElems(shape), s);
  });
}

absl::Status CudaKernels::DoQuant4LinearBackwardInput(Stream& stream, const LinearShape& shape,
                                                      const Quant4Tensor& w, const float* dy,
                                                      float* dx, void* workspace, int64_t,
                                                      DType compute_dtype) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own_bytes = ::ps::cuda::Quant4LinearWorkspaceBytes(shape, compute_dtype);
  void* cublas_workspace = static_cast<char*>(workspace) + AlignBytes(own_bytes);
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& h) {
    if (compute_dtype != DType::kF32) {
      return ::ps::cuda::Quant4LinearBackwardInput16(h, shape, w, dy, dx, compute_dtype,
                                                     workspace, own_bytes, s);
    }
    return ::ps::cuda::Quant4LinearBackwardInput(h, shape, w, dy, dx,
                                                 static_cast<float*>(workspace),
                                                 ::ps::cuda::Quant4LinearTileElems(shape), s);
  });
}

// --- LoRA adapters ------------------------------------------------------------------------------

absl::Status CudaKernels::DoLoraForward(Stream& stream, const LoraShape& shape, const float* x,
                                        const float* a, const float* b, float* h, float* y,
                                        void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return WithCublas(workspace, cublas_workspace_bytes(), [&](const CublasHandle& hd) {
    return ::ps::cuda::LoraForward(hd, shape, x, a, b, h, y, s);
  });
}

absl::Status CudaKernels::DoLoraBackward(Stream& stream, const LoraShape& shape, const float* x,
                                         const float* a, const float* b, const float* h,
                                         const float* dy, float* dx, float* da, float* db,
                                         void* workspace, int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  const int64_t own = AlignBytes(::ps::cuda::LoraBackwardWorkspaceBytes(shape));
  void* cublas_workspace = static_cast<char*>(workspace) + own;
  return WithCublas(cublas_workspace, cublas_workspace_bytes(), [&](const CublasHandle& hd) {
    return ::ps::cuda::LoraBackward(hd, shape, x, a, b, h, dy, dx, da, db, workspace, own, s);
  });
}

absl::Status CudaKernels::DoDropoutForward(Stream& stream, int64_t n, float p, uint64_t seed,
                                           const float* x, float* y) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::DropoutForward(n, p, seed, x, y, s);
}

absl::Status CudaKernels::DoDropoutBackward(Stream& stream, int64_t n, float p, uint64_t seed,
                                            const float* dy, float* dx) {
  ASSIGN_OR_RETURN(cudaStream_t s, Prepare(stream));
  return ::ps::cuda::DropoutBackward(n, p, seed, dy, dx, s);
}

}  // namespace ps::cuda
