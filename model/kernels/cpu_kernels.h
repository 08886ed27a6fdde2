// CpuKernels: the Kernels interface (model/kernels/kernels.h) on the emulated accelerator — the CPU
// kernels of model/kernels/*.h run the way a GPU runs kernels.
//
// Each operation validates its arguments (kernels.h, plus: every buffer must lie inside a live
// device allocation of the cpu backend, which catches host memory passed where device memory is
// meant and buffers too small for their shape), captures them by value, and enqueues the CPU
// kernel on the stream with LaunchCheckedHostFunc (memory/cpu_backend.h). The host returns at once;
// the kernel runs later, in stream order, on the stream's worker thread. It computes exactly what
// calling the kernel directly computes (the same function on the same inputs: bit for bit). An
// error the kernel finds while running (a token or target outside the vocabulary, known only from
// device data) becomes the stream's asynchronous error, returned by its next Synchronize.
//
// Threads. The stream's worker thread is the calling thread of the kernel: it runs the kernel's
// ParallelFor on `pool` together with the pool's workers, and calls OpenBLAS. The rules, and why
// they cannot deadlock:
//  - One pool may serve several streams and the host (e.g. CPU Adam): ThreadPool serializes
//    ParallelFor callers, so kernels of two streams take turns on the pool instead of
//    oversubscribing the cores. A ParallelFor waits only for its own tasks, and pool tasks never
//    block (no kernel task waits on a stream, an event or a lock), so every ParallelFor finishes.
//  - Therefore nobody may block inside a pool task, and no host function on a stream may call
//    ParallelFor on a pool whose current caller waits for that stream (e.g. host code that calls
//    Stream::Synchronize from inside a ParallelFor task). Kernels enqueued here never do.
//  - GEMMs are grids of single-threaded OpenBLAS calls run as tasks of `pool` (internal/blas.h;
//    OpenBLAS's own thread count is pinned to 1, and Debian's pthread build is thread-safe for
//    concurrent single-threaded calls), so results do not depend on the pool's size.
//
// Thread safety: thread-safe. The pool (not owned) must outlive all work enqueued through this
// object; the object itself may be destroyed while that work is still queued.
#ifndef PATRICKSTAR_MODEL_KERNELS_CPU_KERNELS_H_
#define PATRICKSTAR_MODEL_KERNELS_CPU_KERNELS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "memory/backend.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels.h"

namespace ps {

struct CpuKernelsOptions {
  // Threads each kernel's ParallelFor runs on, with the stream's worker thread; null: the worker
  // thread alone. Not owned.
  ThreadPool* pool = nullptr;
};

class CpuKernels final : public Kernels {
 public:
  // `backend` must be a cpu backend (InvalidArgument otherwise) and outlive this object; its
  // streams are the ones operations are enqueued on, its device memory the only memory accepted.
  static absl::StatusOr<std::unique_ptr<CpuKernels>> Create(Backend* backend,
                                                            const CpuKernelsOptions& options = {});

  absl::string_view name() const override { return "cpu"; }
  ThreadPool* pool() const { return pool_; }

  // CpuKernelWorkspaces for the pool's thread count (1 without a pool).
  const KernelWorkspaces& workspaces() const override { return workspaces_; }

 private:
  CpuKernels(Backend* backend, const CpuKernelsOptions& options)
      : backend_(backend),
        pool_(options.pool),
        workspaces_(pool_ == nullptr ? 1 : pool_->num_threads()) {}

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

  Backend* const backend_;
  ThreadPool* const pool_;
  const CpuKernelWorkspaces workspaces_;
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
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_CPU_KERNELS_H_
