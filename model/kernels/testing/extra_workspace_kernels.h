// ExtraWorkspaceKernels: a Kernels (model/kernels/kernels.h) that runs every operation on another
// Kernels object and asks, for each operation, the inner kernels' workspace plus the workspace of
// a second KernelWorkspaces (kernel_workspaces.h) — e.g. CudaKernelWorkspaces. A model on the
// emulated accelerator then allocates (and its tide shows) workspaces of another implementation's
// sizes, non-zero on the paths where the CPU kernels need none, while computing exactly what the
// inner kernels compute (the inner kernels get the whole workspace; they use their part). Test
// support for the pre-flight plan: the profile replayed with workspaces() must match the warm-up.
//
// Thread safety: as the inner kernels. Both objects must outlive this one.
#ifndef PATRICKSTAR_MODEL_KERNELS_TESTING_EXTRA_WORKSPACE_KERNELS_H_
#define PATRICKSTAR_MODEL_KERNELS_TESTING_EXTRA_WORKSPACE_KERNELS_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "memory/backend.h"
#include "memory/dtype.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels.h"

namespace ps::kernel_testing {

// Every query: a's answer plus b's.
class SumOfWorkspaces final : public KernelWorkspaces {
 public:
  SumOfWorkspaces(const KernelWorkspaces& a, const KernelWorkspaces& b) : a_(a), b_(b) {}

  absl::string_view name() const override { return a_.name(); }
  int64_t GemmWorkspaceBytes(const GemmShape& s) const override {
    return a_.GemmWorkspaceBytes(s) + b_.GemmWorkspaceBytes(s);
  }
  int64_t MatmulWorkspaceBytes(const MatmulShape& s) const override {
    return a_.MatmulWorkspaceBytes(s) + b_.MatmulWorkspaceBytes(s);
  }
  int64_t LinearWorkspaceBytes(const LinearShape& s) const override {
    return a_.LinearWorkspaceBytes(s) + b_.LinearWorkspaceBytes(s);
  }
  int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& s) const override {
    return a_.GqaAttentionForwardWorkspaceBytes(s) + b_.GqaAttentionForwardWorkspaceBytes(s);
  }
  int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& s) const override {
    return a_.GqaAttentionBackwardWorkspaceBytes(s) + b_.GqaAttentionBackwardWorkspaceBytes(s);
  }
  int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& s) const override {
    return a_.LmHeadCrossEntropyWorkspaceBytes(s) + b_.LmHeadCrossEntropyWorkspaceBytes(s);
  }
  int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) const override {
    return a_.MatmulBf16ForwardWorkspaceBytes(s) + b_.MatmulBf16ForwardWorkspaceBytes(s);
  }
  int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) const override {
    return a_.MatmulBf16BackwardWorkspaceBytes(s) + b_.MatmulBf16BackwardWorkspaceBytes(s);
  }
  int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s, DType d) const override {
    return a_.LmHeadBlockForwardWorkspaceBytes(s, d) + b_.LmHeadBlockForwardWorkspaceBytes(s, d);
  }
  int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s, DType d) const override {
    return a_.LmHeadBlockBackwardWorkspaceBytes(s, d) + b_.LmHeadBlockBackwardWorkspaceBytes(s, d);
  }
  int64_t LoraForwardWorkspaceBytes(const LoraShape& s) const override {
    return a_.LoraForwardWorkspaceBytes(s) + b_.LoraForwardWorkspaceBytes(s);
  }
  int64_t LoraBackwardWorkspaceBytes(const LoraShape& s) const override {
    return a_.LoraBackwardWorkspaceBytes(s) + b_.LoraBackwardWorkspaceBytes(s);
  }
  using KernelWorkspaces::Quant4LinearWorkspaceBytes;
  int64_t Quant4LinearWorkspaceBytes(const LinearShape& s, DType d) const override {
    return a_.Quant4LinearWorkspaceBytes(s, d) + b_.Quant4LinearWorkspaceBytes(s, d);
  }

 private:
  const KernelWorkspaces& a_;
  const KernelWorkspaces& b_;
};

// The thirteen workspace queries of KernelWorkspaces (GPT-2's attention asks the grouped-query
// ones).
enum class WorkspaceQuery {
  kGemm,
  kMatmul,
  kLinear,
  kGqaAttentionForward,
  kGqaAttentionBackward,
  kLmHeadCrossEntropy,
  kMatmulBf16Forward,
  kMatmulBf16Backward,
  kLmHeadBlockForward,
  kLmHeadBlockBackward,
  kLoraForward,
  kLoraBackward,
  kQuant4Linear,
};
inline constexpr int kNumWorkspaceQueries = 13;
const char* WorkspaceQueryName(WorkspaceQuery query);

// Answers `base_bytes` plus 256 bytes times a weighted sum of the shape's dimensions (weights 1,
// 2, 3, 5, 7, 11: a shape with two dimensions swapped gets another size, apart by at least the
// caching allocator's 512-byte rounding) for `query`, and 0 for every other query. With a base
// larger than what a small model allocates and frees within one operator, the query's workspaces
// decide the tide wherever they are allocated: a profile that misses one, places it at another
// moment or sizes it from another shape differs from the measured tide. Keep the answers below the
// allocator's small-request limit (1 MiB by default; larger blocks may keep a tail of their
// segment, which hides size differences): a base of 64 KiB suits tiny models.
class SingleQueryWorkspaces final : public KernelWorkspaces {
 public:
  SingleQueryWorkspaces(WorkspaceQuery query, int64_t base_bytes)
      : query_(query), base_(base_bytes) {}

  absl::string_view name() const override { return WorkspaceQueryName(query_); }
  int64_t GemmWorkspaceBytes(const GemmShape& s) const override;
  int64_t MatmulWorkspaceBytes(const MatmulShape& s) const override;
  int64_t LinearWorkspaceBytes(const LinearShape& s) const override;
  int64_t GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& s) const override;
  int64_t GqaAttentionBackwardWorkspaceBytes(const GqaAttentionShape& s) const override;
  int64_t LmHeadCrossEntropyWorkspaceBytes(const LmHeadCrossEntropyShape& s) const override;
  int64_t MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) const override;
  int64_t MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) const override;
  int64_t LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s, DType d) const override;
  int64_t LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s, DType d) const override;
  int64_t LoraForwardWorkspaceBytes(const LoraShape& s) const override;
  int64_t LoraBackwardWorkspaceBytes(const LoraShape& s) const override;
  using KernelWorkspaces::Quant4LinearWorkspaceBytes;
  int64_t Quant4LinearWorkspaceBytes(const LinearShape& s, DType d) const override;

 private:
  // base + 256 * (d0 + 2 d1 + 3 d2 + 5 d3 + 7 d4 + 11 d5) when `query` is this object's query.
  int64_t Answer(WorkspaceQuery query, std::initializer_list<int64_t> dims) const;

  WorkspaceQuery query_;
  int64_t base_;
};

class ExtraWorkspaceKernels final : public Kernels {
 public:
  ExtraWorkspaceKernels(Kernels& inner, const KernelWorkspaces& extra)
      : inner_(inner), workspaces_(inner.workspaces(), extra) {}
  // Over CPU kernels of its own on `backend` (CreateKernels with a pool of `threads` threads, the
  // pool a model of `threads` threads would give its kernels). `extra` must outlive the result.
  static absl::StatusOr<std::unique_ptr<ExtraWorkspaceKernels>> OverCpuKernels(
      Backend* backend, int threads, const KernelWorkspaces& extra);

  absl::string_view name() const override { return inner_.name(); }
  // The inner kernels' workspaces plus `extra`'s.
  const KernelWorkspaces& workspaces() const override { return workspaces_; }

 private:
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
  absl::Status DoGeluForward(Stream& stream, int64_t num_elems, const float* x, float* y) override;
  absl::Status DoGeluBackward(Stream& stream, int64_t num_elems, const float* x, const float* dy,
                              float* dx) override;
  absl::Status DoResidualForward(Stream& stream, int64_t num_elems, const float* a, const float* b,
                                 float* out) override;
  absl::Status DoResidualBackward(Stream& stream, int64_t num_elems, const float* dout, float* da,
                                  float* db) override;
  absl::Status DoScaleInPlace(Stream& stream, int64_t num_elems, float alpha, float* x) override;
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
  absl::Status DoSwiGluForward(Stream& stream, int64_t num_elems, const float* g, const float* u,
                               float* h, GateActivation act) override;
  absl::Status DoSwiGluBackward(Stream& stream, int64_t num_elems, const float* g, const float* u,
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

  ExtraWorkspaceKernels(std::unique_ptr<ThreadPool> pool, std::unique_ptr<Kernels> inner,
                        const KernelWorkspaces& extra)
      : pool_(std::move(pool)),
        owned_inner_(std::move(inner)),
        inner_(*owned_inner_),
        workspaces_(inner_.workspaces(), extra) {}

  // OverCpuKernels' own pool and kernels (null otherwise).
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Kernels> owned_inner_;
  Kernels& inner_;
  const SumOfWorkspaces workspaces_;
};

}  // namespace ps::kernel_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_TESTING_EXTRA_WORKSPACE_KERNELS_H_
