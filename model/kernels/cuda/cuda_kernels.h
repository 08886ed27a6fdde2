// CudaKernels: the Kernels interface (model/kernels/kernels.h) on an NVIDIA GPU, over the CUDA
// launchers of model/kernels/cuda and cuBLAS. Built only under --config=cuda.
//
// Each operation, after the interface's argument checks (plus: every buffer must be device or
// managed memory, checked with cudaPointerGetAttributes unless turned off, and the CUDA kernels'
// own limits such as head_dim <= 128), makes the backend's GPU current on the calling thread and
// enqueues the kernels on the stream's cudaStream_t. Nothing allocates or synchronizes.
//
// cuBLAS's workspace is the caller's: every operation that runs a cuBLAS GEMM (Gemm, Matmul*,
// Linear*, LmHeadCrossEntropy*, LmHeadBlock*, Lora*, Quant4Linear*) counts `cublas_workspace_bytes`
// in its WorkspaceBytes query and hands that part of the workspace to cuBLAS (cublasSetWorkspace),
// so cuBLAS never allocates on its own and its scratch counts against the accelerator's cap and
// the tide like any other scratch.
// (cublasCreate itself still takes a little device memory, once, outside the cap.)
//
// Precision: f32 operators with f32 accumulation and no TF32 (see each kernel's header for how it
// rounds differently from the CPU). Gemm with f16/bf16 operands runs cublasGemmEx with
// CUBLAS_COMPUTE_32F on tensor cores: exact products, f32 sums, f32 output.
//
// Data errors: tokens and targets outside the vocabulary are not reported (that would need a copy
// and a synchronization); the affected rows come out NaN (see cuda/elementwise.h,
// cuda/lm_head_cross_entropy.h).
//
// Thread safety: thread-safe (the cuBLAS handle is used under a lock). The object must outlive
// nothing enqueued: the GPU does not call back into it.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_CUDA_KERNELS_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "memory/backend.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels.h"

namespace ps::cuda {

struct CudaKernelsOptions {
  // The cuBLAS workspace each GEMM-running operation gets from its caller; 0 picks NVIDIA's
  // recommendation for the GPU: 32 MiB on Hopper (compute capability 9.x) and newer, 4 MiB on
  // earlier GPUs. Must be 0 or a positive multiple of 256.
  int64_t cublas_workspace_bytes = 0;
  // Check at enqueue that every buffer is device memory (cudaPointerGetAttributes, about a
  // microsecond per buffer): a host pointer is then InvalidArgument instead of a sticky illegal-
  // address error. Turn off only once a model is known to pass only device memory.
  bool check_device_pointers = true;
};

class CudaKernels final : public Kernels {
 public:
  // `backend` must be a cuda backend (InvalidArgument otherwise) and outlive this object.
  // Unavailable without a usable GPU; the cuBLAS error if cublasCreate fails.
  static absl::StatusOr<std::unique_ptr<CudaKernels>> Create(
      Backend* backend, const CudaKernelsOptions& options = {});

  absl::string_view name() const override { return "cuda"; }
  int64_t cublas_workspace_bytes() const { return workspaces_.cublas_workspace_bytes(); }

  // CudaKernelWorkspaces over cublas_workspace_bytes(): the sizes a plan gets from
  // CreateKernelWorkspaces (kernels_factory.h) for this GPU.
  const KernelWorkspaces& workspaces() const override { return workspaces_; }

  // The cuBLAS workspace CudaKernels uses on `device` for CudaKernelsOptions.cublas_workspace_bytes
  // = `requested_bytes`: that, or for 0 CudaKernelWorkspaces::DefaultCublasWorkspaceBytes of the
  // GPU's compute capability. InvalidArgument unless 0 or a positive multiple of 256; the CUDA
  // error if the device cannot be asked.
  static absl::StatusOr<int64_t> CublasWorkspaceBytes(int device, int64_t requested_bytes);

 private:
  CudaKernels(int device_index, CublasHandle handle, int64_t cublas_workspace_bytes,
              bool check_device_pointers)
      : device_index_(device_index),
        workspaces_(cublas_workspace_bytes),
        check_device_pointers_(check_device_pointers),
        cublas_(std::move(handle)) {}

  // The stream's cudaStream_t, with the GPU made current on this thread. InvalidArgument for a
  // stream of another backend.
  absl::StatusOr<cudaStream_t> Prepare(Stream& stream);
  // Runs `fn` with the handle bound to cuBLAS workspace [workspace, workspace + bytes).
  template <typename Fn>
  absl::Status WithCublas(void* workspace, int64_t bytes, Fn fn);

  absl::Status CheckBuffer(absl::string_view op, const BufferArg& buffer) override;

  absl::Status DoZero(Stream& stream, void* dst, int64_t bytes) override;
  absl::Status DoConvert(Stream& stream, DType src_dtype, const void* src, DType dst_dtype,
                         void* dst, int64_t num_elems) override;
  absl::Status DoGemm(Stream& stream, const GemmShape& shape, float alpha, const void* a,
                      const void* b, float beta, float* c, void* workspace,
                      int64_t workspace_bytes) override;
  absl::Status DoEncoderForward(Stream& stream, const EncoderShape& shape, const int32_t* tokens,
                                const float* wte, const float* wpe, float* out) override;
  absl::Status DoEncoderBackward(Stream& stream, const EncoderShape& shape, const int32_t* tokens,
                                 const float* dout, float* dwte, float* dwpe) override;
  absl::Status DoLayerNormForward(Stream& stream, const LayerNormShape& shape, const float* x,
                                  const float* w, const float* b, float* y, float* mean,
                                  float* rstd) override;
  absl::Status DoLayerNormBackward(Stream& stream, const LayerNormShape& shape, const float* x,
                                   const float* w, const float* mean, const float* rstd,
                                   const float* dy, float* dx, float* dw, float* db) override;
  absl::Status DoMatmulForward(Stream& stream, const MatmulShape& shape, const float* x,
                               const float* w, const float* b, float* y, void* workspace,
                               int64_t workspace_bytes) override;
  absl::Status DoMatmulBackward(Stream& stream, const MatmulShape& shape, const float* x,
                                const float* w, const float* dy, float* dx, float* dw, float* db,
                                void* workspace, int64_t workspace_bytes) override;
  absl::Status DoGeluForward(Stream& stream, int64_t n, const float* x, float* y) override;
  absl::Status DoGeluBackward(Stream& stream, int64_t n, const float* x, const float* dy,
                              float* dx) override;
  absl::Status DoResidualForward(Stream& stream, int64_t n, const float* a, const float* b,
                                 float* out) override;
  absl::Status DoResidualBackward(Stream& stream, int64_t n, const float* dout, float* da,
                                  float* db) override;
  absl::Status DoScaleInPlace(Stream& stream, int64_t n, float alpha, float* x) override;
  absl::Status DoLmHeadCrossEntropyForward(Stream& stream, const LmHeadCrossEntropyShape& shape,
                                           const float* h, const float* wte, const int32_t* targets,
                                           float* lse, double* loss, void* workspace,
                                           int64_t workspace_bytes) override;
  absl::Status DoLmHeadCrossEntropyBackward(Stream& stream, const LmHeadCrossEntropyShape& shape,
                                            const float* h, const float* wte,
                                            const int32_t* targets, const float* lse,
                                            double loss_grad, float* dh, float* dwte,
                                            void* workspace, int64_t workspace_bytes) override;
  absl::Status DoRmsNormForward(Stream& stream, const RmsNormShape& shape, const float* x,
                                const float* w, float* y, float* rstd) override;
  absl::Status DoRmsNormBackward(Stream& stream, const RmsNormShape& shape, const float* x,
                                 const float* w, const float* rstd, const float* dy, float* dx,
                                 float* dw) override;
  absl::Status DoRopeForward(Stream& stream, const RopeShape& shape, const float* cos,
                             const float* sin, float* x, const int32_t* positions) override;
  absl::Status DoRopeBackward(Stream& stream, const RopeShape& shape, const float* cos,
                              const float* sin, float* dx, const int32_t* positions) override;
  absl::Status DoSwiGluForward(Stream& stream, int64_t n, const float* g, const float* u, float* h,
                               GateActivation act) override;
  absl::Status DoSwiGluBackward(Stream& stream, int64_t n, const float* g, const float* u,
                                const float* dh, float* dg, float* du, GateActivation act) override;
  absl::Status DoGqaAttentionForward(Stream& stream, const GqaAttentionShape& shape, const float* q,
                                     const float* k, const float* v, float* out, float* lse,
                                     void* workspace, int64_t workspace_bytes,
                                     const int32_t* key_start) override;
  absl::Status DoGqaAttentionBackward(Stream& stream, const GqaAttentionShape& shape,
                                      const float* q, const float* k, const float* v,
                                      const float* out, const float* lse, const float* dout,
                                      float* dq, float* dk, float* dv, void* workspace,
                                      int64_t workspace_bytes, const int32_t* key_start) override;
  absl::Status DoLinearForward(Stream& stream, const LinearShape& shape, const float* x,
                               const float* w, const float* b, float* y, void* workspace,
                               int64_t workspace_bytes) override;
  absl::Status DoLinearBackward(Stream& stream, const LinearShape& shape, const float* x,
                                const float* w, const float* dy, float* dx, float* dw, float* db,
                                void* workspace, int64_t workspace_bytes) override;
  absl::Status DoEmbeddingForward(Stream& stream, const EmbeddingShape& shape,
                                  const int32_t* tokens, const float* wte, float* out) override;
  absl::Status DoEmbeddingBackward(Stream& stream, const EmbeddingShape& shape,
                                   const int32_t* tokens, const float* dout, float* dwte) override;
  absl::Status DoMatmulForwardBf16(Stream& stream, const MatmulShape& shape, const float* x,
                                   const uint16_t* w, const float* b, float* y, void* workspace,
                                   int64_t workspace_bytes) override;
  absl::Status DoMatmulBackwardBf16(Stream& stream, const MatmulShape& shape, const float* x,
                                    const uint16_t* w, const float* dy, float* dx, float* dw,
                                    float* db, void* workspace, int64_t workspace_bytes) override;
  absl::Status DoEmbeddingBlockForward(Stream& stream, const VocabBlockShape& shape,
                                       const int32_t* tokens, DType block_dtype, const void* block,
                                       float* out) override;
  absl::Status DoScatterRowsAdd(Stream& stream, const TouchedRowsShape& shape, int64_t num_tokens,
                                const int32_t* tokens, const int32_t* slot_of_token,
                                const float* dout, float* slot_rows) override;
  absl::Status DoCopyRowsToSlots(Stream& stream, const TouchedRowsShape& shape, int64_t row_begin,
                                 int64_t rows, const int32_t* slot_of_token, const float* src,
                                 float* slot_rows) override;
  absl::Status DoCopySlotsToRows(Stream& stream, const TouchedRowsShape& shape, int64_t row_begin,
                                 int64_t rows, const int32_t* slot_of_token, const float* slot_rows,
                                 DType dst_dtype, void* dst) override;
  absl::Status DoPositionEmbeddingForward(Stream& stream, int64_t batch, int64_t seq_len,
                                          int64_t channels, int64_t max_seq_len, const float* wpe,
                                          float* out, const int32_t* positions) override;
  absl::Status DoPositionEmbeddingBackward(Stream& stream, int64_t batch, int64_t seq_len,
                                           int64_t channels, int64_t max_seq_len, const float* dout,
                                           float* dwpe, const int32_t* positions) override;
  absl::Status DoLmHeadStateInit(Stream& stream, const VocabBlockShape& shape,
                                 float* state) override;
  absl::Status DoLmHeadBlockForward(Stream& stream, const VocabBlockShape& shape, const float* h,
                                    DType block_dtype, const void* block, const int32_t* targets,
                                    float* state, void* workspace,
                                    int64_t workspace_bytes) override;
  absl::Status DoLmHeadFinish(Stream& stream, const VocabBlockShape& shape, const int32_t* targets,
                              const float* state, float* lse, double* loss) override;
  absl::Status DoLmHeadBlockBackward(Stream& stream, const VocabBlockShape& shape, const float* h,
                                     DType block_dtype, const void* block, const int32_t* targets,
                                     const float* lse, double loss_grad, float* dh, float* dblock,
                                     void* workspace, int64_t workspace_bytes) override;
  absl::Status DoDequantize4Bit(Stream& stream, const Quant4Tensor& w, int64_t begin, int64_t count,
                                DType dst_dtype, void* dst) override;
  absl::Status DoQuant4LinearForward(Stream& stream, const LinearShape& shape, const float* x,
                                     const Quant4Tensor& w, const float* b, float* y,
                                     void* workspace, int64_t workspace_bytes,
                                     DType compute_dtype) override;
  absl::Status DoQuant4LinearBackwardInput(Stream& stream, const LinearShape& shape,
                                           const Quant4Tensor& w, const float* dy, float* dx,
                                           void* workspace, int64_t workspace_bytes,
                                           DType compute_dtype) override;
  absl::Status DoLoraForward(Stream& stream, const LoraShape& shape, const float* x, const float* a,
                             const float* b, float* h, float* y, void* workspace,
                             int64_t workspace_bytes) override;
  absl::Status DoLoraBackward(Stream& stream, const LoraShape& shape, const float* x,
                              const float* a, const float* b, const float* h, const float* dy,
                              float* dx, float* da, float* db, void* workspace,
                              int64_t workspace_bytes) override;
  absl::Status DoDropoutForward(Stream& stream, int64_t num_elems, float p, uint64_t seed,
                                const float* x, float* y) override;
  absl::Status DoDropoutBackward(Stream& stream, int64_t num_elems, float p, uint64_t seed,
                                 const float* dy, float* dx) override;

  const int device_index_;
  const CudaKernelWorkspaces workspaces_;
  const bool check_device_pointers_;
  Mutex cublas_mu_;
  CublasHandle cublas_ ABSL_GUARDED_BY(cublas_mu_);
};

}  // namespace ps::cuda

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_CUDA_KERNELS_H_
