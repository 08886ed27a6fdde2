#include "model/kernels/testing/extra_workspace_kernels.h"

#include <memory>
#include <utility>

#include "model/kernels/kernels_factory.h"

namespace ps::kernel_testing {

const char* WorkspaceQueryName(WorkspaceQuery query) {
  switch (query) {
    case WorkspaceQuery::kGemm:
      return "Gemm";
    case WorkspaceQuery::kMatmul:
      return "Matmul";
    case WorkspaceQuery::kLinear:
      return "Linear";
    case WorkspaceQuery::kGqaAttentionForward:
      return "GqaAttentionForward";
    case WorkspaceQuery::kGqaAttentionBackward:
      return "GqaAttentionBackward";
    case WorkspaceQuery::kLmHeadCrossEntropy:
      return "LmHeadCrossEntropy";
    case WorkspaceQuery::kMatmulBf16Forward:
      return "MatmulBf16Forward";
    case WorkspaceQuery::kMatmulBf16Backward:
      return "MatmulBf16Backward";
    case WorkspaceQuery::kLmHeadBlockForward:
      return "LmHeadBlockForward";
    case WorkspaceQuery::kLmHeadBlockBackward:
      return "LmHeadBlockBackward";
    case WorkspaceQuery::kLoraForward:
      return "LoraForward";
    case WorkspaceQuery::kLoraBackward:
      return "LoraBackward";
    case WorkspaceQuery::kQuant4Linear:
      return "Quant4Linear";
  }
  return "?";
}

int64_t SingleQueryWorkspaces::Answer(WorkspaceQuery query,
                                      std::initializer_list<int64_t> dims) const {
  if (query != query_) return 0;
  constexpr int64_t kWeights[] = {1, 2, 3, 5, 7, 11};
  int64_t sum = 0, i = 0;
  for (int64_t d : dims) sum += kWeights[i++] * d;
  return base_ + 256 * sum;
}

int64_t SingleQueryWorkspaces::GemmWorkspaceBytes(const GemmShape& s) const {
  return Answer(WorkspaceQuery::kGemm, {s.m, s.n, s.k, s.trans_a, s.trans_b});
}
int64_t SingleQueryWorkspaces::MatmulWorkspaceBytes(const MatmulShape& s) const {
  return Answer(WorkspaceQuery::kMatmul, {s.rows, s.in_features, s.out_features});
}
int64_t SingleQueryWorkspaces::LinearWorkspaceBytes(const LinearShape& s) const {
  return Answer(WorkspaceQuery::kLinear, {s.rows, s.in_features, s.out_features, s.bias});
}
int64_t SingleQueryWorkspaces::GqaAttentionForwardWorkspaceBytes(const GqaAttentionShape& s) const {
  return Answer(WorkspaceQuery::kGqaAttentionForward,
                {s.batch, s.seq_len, s.num_heads, s.num_kv_heads, s.head_dim, s.tile});
}
int64_t SingleQueryWorkspaces::GqaAttentionBackwardWorkspaceBytes(
    const GqaAttentionShape& s) const {
  return Answer(WorkspaceQuery::kGqaAttentionBackward,
                {s.batch, s.seq_len, s.num_heads, s.num_kv_heads, s.head_dim, s.tile});
}
int64_t SingleQueryWorkspaces::LmHeadCrossEntropyWorkspaceBytes(
    const LmHeadCrossEntropyShape& s) const {
  return Answer(WorkspaceQuery::kLmHeadCrossEntropy,
                {s.rows, s.channels, s.vocab_size, s.row_tile, s.vocab_tile});
}
int64_t SingleQueryWorkspaces::MatmulBf16ForwardWorkspaceBytes(const MatmulShape& s) const {
  return Answer(WorkspaceQuery::kMatmulBf16Forward, {s.rows, s.in_features, s.out_features});
}
int64_t SingleQueryWorkspaces::MatmulBf16BackwardWorkspaceBytes(const MatmulShape& s) const {
  return Answer(WorkspaceQuery::kMatmulBf16Backward, {s.rows, s.in_features, s.out_features});
}
int64_t SingleQueryWorkspaces::LmHeadBlockForwardWorkspaceBytes(const VocabBlockShape& s,
                                                                DType d) const {
  return Answer(WorkspaceQuery::kLmHeadBlockForward,
                {s.rows, s.channels, s.row_begin, s.block_rows, SizeOf(d), s.vocab_tile});
}
int64_t SingleQueryWorkspaces::LmHeadBlockBackwardWorkspaceBytes(const VocabBlockShape& s,
                                                                 DType d) const {
  return Answer(WorkspaceQuery::kLmHeadBlockBackward,
                {s.rows, s.channels, s.row_begin, s.block_rows, SizeOf(d), s.vocab_tile});
}
int64_t SingleQueryWorkspaces::LoraForwardWorkspaceBytes(const LoraShape& s) const {
  return Answer(WorkspaceQuery::kLoraForward, {s.rows, s.in_features, s.out_features, s.rank});
}
int64_t SingleQueryWorkspaces::LoraBackwardWorkspaceBytes(const LoraShape& s) const {
  return Answer(WorkspaceQuery::kLoraBackward, {s.rows, s.in_features, s.out_features, s.rank});
}

int64_t SingleQueryWorkspaces::Quant4LinearWorkspaceBytes(const LinearShape& s, DType d) const {
  return Answer(WorkspaceQuery::kQuant4Linear,
                {s.rows, s.in_features, s.out_features, s.bias, static_cast<int64_t>(d)});
}

absl::StatusOr<std::unique_ptr<ExtraWorkspaceKernels>> ExtraWorkspaceKernels::OverCpuKernels(
    Backend* backend, int threads, const KernelWorkspaces& extra) {
  auto pool = std::make_unique<ThreadPool>(threads);
  absl::StatusOr<std::unique_ptr<Kernels>> inner = CreateKernels(backend, {.cpu_pool = pool.get()});
  if (!inner.ok()) return inner.status();
  return std::unique_ptr<ExtraWorkspaceKernels>(
      new ExtraWorkspaceKernels(std::move(pool), *std::move(inner), extra));
}

// Each operation runs on the inner kernels, which check the arguments again against their own
// (smaller) workspace and enqueue on the same stream.
absl::Status ExtraWorkspaceKernels::DoZero(Stream& stream, void* dst, int64_t bytes) {
  return inner_.Zero(stream, dst, bytes);
}

absl::Status ExtraWorkspaceKernels::DoConvert(Stream& stream, DType src_dtype, const void* src,
                                              DType dst_dtype, void* dst, int64_t num_elems) {
  return inner_.Convert(stream, src_dtype, src, dst_dtype, dst, num_elems);
}

absl::Status ExtraWorkspaceKernels::DoGemm(Stream& stream, const GemmShape& shape, float alpha,
                                           const void* a, const void* b, float beta, float* c,
                                           void* workspace, int64_t workspace_bytes) {
  return inner_.Gemm(stream, shape, alpha, a, b, beta, c, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoEncoderForward(Stream& stream, const EncoderShape& shape,
                                                     const int32_t* tokens, const float* wte,
                                                     const float* wpe, float* out) {
  return inner_.EncoderForward(stream, shape, tokens, wte, wpe, out);
}

absl::Status ExtraWorkspaceKernels::DoEncoderBackward(Stream& stream, const EncoderShape& shape,
                                                      const int32_t* tokens, const float* dout,
                                                      float* dwte, float* dwpe) {
  return inner_.EncoderBackward(stream, shape, tokens, dout, dwte, dwpe);
}

absl::Status ExtraWorkspaceKernels::DoLayerNormForward(Stream& stream, const LayerNormShape& shape,
                                                       const float* x, const float* w,
                                                       const float* b, float* y, float* mean,
                                                       float* rstd) {
  return inner_.LayerNormForward(stream, shape, x, w, b, y, mean, rstd);
}

absl::Status ExtraWorkspaceKernels::DoLayerNormBackward(Stream& stream, const LayerNormShape& shape,
                                                        const float* x, const float* w,
                                                        const float* mean, const float* rstd,
                                                        const float* dy, float* dx, float* dw,
                                                        float* db) {
  return inner_.LayerNormBackward(stream, shape, x, w, mean, rstd, dy, dx, dw, db);
}

absl::Status ExtraWorkspaceKernels::DoMatmulForward(Stream& stream, const MatmulShape& shape,
                                                    const float* x, const float* w, const float* b,
                                                    float* y, void* workspace,
                                                    int64_t workspace_bytes) {
  return inner_.MatmulForward(stream, shape, x, w, b, y, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoMatmulBackward(Stream& stream, const MatmulShape& shape,
                                                     const float* x, const float* w,
                                                     const float* dy, float* dx, float* dw,
                                                     float* db, void* workspace,
                                                     int64_t workspace_bytes) {
  return inner_.MatmulBackward(stream, shape, x, w, dy, dx, dw, db, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoGeluForward(Stream& stream, int64_t num_elems, const float* x,
                                                  float* y) {
  return inner_.GeluForward(stream, num_elems, x, y);
}

absl::Status ExtraWorkspaceKernels::DoGeluBackward(Stream& stream, int64_t num_elems,
                                                   const float* x, const float* dy, float* dx) {
  return inner_.GeluBackward(stream, num_elems, x, dy, dx);
}

absl::Status ExtraWorkspaceKernels::DoResidualForward(Stream& stream, int64_t num_elems,
                                                      const float* a, const float* b, float* out) {
  return inner_.ResidualForward(stream, num_elems, a, b, out);
}

absl::Status ExtraWorkspaceKernels::DoResidualBackward(Stream& stream, int64_t num_elems,
                                                       const float* dout, float* da, float* db) {
  return inner_.ResidualBackward(stream, num_elems, dout, da, db);
}

absl::Status ExtraWorkspaceKernels::DoScaleInPlace(Stream& stream, int64_t num_elems, float alpha,
                                                   float* x) {
  return inner_.ScaleInPlace(stream, num_elems, alpha, x);
}

absl::Status ExtraWorkspaceKernels::DoLmHeadCrossEntropyForward(
    Stream& stream, const LmHeadCrossEntropyShape& shape, const float* h, const float* wte,
    const int32_t* targets, float* lse, double* loss, void* workspace, int64_t workspace_bytes) {
  return inner_.LmHeadCrossEntropyForward(stream, shape, h, wte, targets, lse, loss, workspace,
                                          workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoLmHeadCrossEntropyBackward(
    Stream& stream, const LmHeadCrossEntropyShape& shape, const float* h, const float* wte,
    const int32_t* targets, const float* lse, double loss_grad, float* dh, float* dwte,
    void* workspace, int64_t workspace_bytes) {
  return inner_.LmHeadCrossEntropyBackward(stream, shape, h, wte, targets, lse, loss_grad, dh, dwte,
                                           workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoRmsNormForward(Stream& stream, const RmsNormShape& shape,
                                                     const float* x, const float* w, float* y,
                                                     float* rstd) {
  return inner_.RmsNormForward(stream, shape, x, w, y, rstd);
}

absl::Status ExtraWorkspaceKernels::DoRmsNormBackward(Stream& stream, const RmsNormShape& shape,
                                                      const float* x, const float* w,
                                                      const float* rstd, const float* dy, float* dx,
                                                      float* dw) {
  return inner_.RmsNormBackward(stream, shape, x, w, rstd, dy, dx, dw);
}

absl::Status ExtraWorkspaceKernels::DoRopeForward(Stream& stream, const RopeShape& shape,
                                                  const float* cos, const float* sin, float* x,
                                                  const int32_t* positions) {
  return inner_.RopeForward(stream, shape, cos, sin, x, positions);
}

absl::Status ExtraWorkspaceKernels::DoRopeBackward(Stream& stream, const RopeShape& shape,
                                                   const float* cos, const float* sin, float* dx,
                                                   const int32_t* positions) {
  return inner_.RopeBackward(stream, shape, cos, sin, dx, positions);
}

absl::Status ExtraWorkspaceKernels::DoSwiGluForward(Stream& stream, int64_t num_elems,
                                                    const float* g, const float* u, float* h,
                                                    GateActivation act) {
  return inner_.SwiGluForward(stream, num_elems, g, u, h, act);
}

absl::Status ExtraWorkspaceKernels::DoSwiGluBackward(Stream& stream, int64_t num_elems,
                                                     const float* g, const float* u,
                                                     const float* dh, float* dg, float* du,
                                                     GateActivation act) {
  return inner_.SwiGluBackward(stream, num_elems, g, u, dh, dg, du, act);
}

absl::Status ExtraWorkspaceKernels::DoGqaAttentionForward(
    Stream& stream, const GqaAttentionShape& shape, const float* q, const float* k, const float* v,
    float* out, float* lse, void* workspace, int64_t workspace_bytes, const int32_t* key_start) {
  return inner_.GqaAttentionForward(stream, shape, q, k, v, out, lse, workspace, workspace_bytes,
                                    key_start);
}

absl::Status ExtraWorkspaceKernels::DoGqaAttentionBackward(
    Stream& stream, const GqaAttentionShape& shape, const float* q, const float* k, const float* v,
    const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv,
    void* workspace, int64_t workspace_bytes, const int32_t* key_start) {
  return inner_.GqaAttentionBackward(stream, shape, q, k, v, out, lse, dout, dq, dk, dv, workspace,
                                     workspace_bytes, key_start);
}

absl::Status ExtraWorkspaceKernels::DoLinearForward(Stream& stream, const LinearShape& shape,
                                                    const float* x, const float* w, const float* b,
                                                    float* y, void* workspace,
                                                    int64_t workspace_bytes) {
  return inner_.LinearForward(stream, shape, x, w, b, y, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoLinearBackward(Stream& stream, const LinearShape& shape,
                                                     const float* x, const float* w,
                                                     const float* dy, float* dx, float* dw,
                                                     float* db, void* workspace,
                                                     int64_t workspace_bytes) {
  return inner_.LinearBackward(stream, shape, x, w, dy, dx, dw, db, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoEmbeddingForward(Stream& stream, const EmbeddingShape& shape,
                                                       const int32_t* tokens, const float* wte,
                                                       float* out) {
  return inner_.EmbeddingForward(stream, shape, tokens, wte, out);
}

absl::Status ExtraWorkspaceKernels::DoEmbeddingBackward(Stream& stream, const EmbeddingShape& shape,
                                                        const int32_t* tokens, const float* dout,
                                                        float* dwte) {
  return inner_.EmbeddingBackward(stream, shape, tokens, dout, dwte);
}

absl::Status ExtraWorkspaceKernels::DoMatmulForwardBf16(Stream& stream, const MatmulShape& shape,
                                                        const float* x, const uint16_t* w,
                                                        const float* b, float* y, void* workspace,
                                                        int64_t workspace_bytes) {
  return inner_.MatmulForwardBf16(stream, shape, x, w, b, y, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoMatmulBackwardBf16(Stream& stream, const MatmulShape& shape,
                                                         const float* x, const uint16_t* w,
                                                         const float* dy, float* dx, float* dw,
                                                         float* db, void* workspace,
                                                         int64_t workspace_bytes) {
  return inner_.MatmulBackwardBf16(stream, shape, x, w, dy, dx, dw, db, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoEmbeddingBlockForward(Stream& stream,
                                                            const VocabBlockShape& shape,
                                                            const int32_t* tokens,
                                                            DType block_dtype, const void* block,
                                                            float* out) {
  return inner_.EmbeddingBlockForward(stream, shape, tokens, block_dtype, block, out);
}

absl::Status ExtraWorkspaceKernels::DoScatterRowsAdd(Stream& stream, const TouchedRowsShape& shape,
                                                     int64_t num_tokens, const int32_t* tokens,
                                                     const int32_t* slot_of_token,
                                                     const float* dout, float* slot_rows) {
  return inner_.ScatterRowsAdd(stream, shape, num_tokens, tokens, slot_of_token, dout, slot_rows);
}

absl::Status ExtraWorkspaceKernels::DoCopyRowsToSlots(Stream& stream, const TouchedRowsShape& shape,
                                                      int64_t row_begin, int64_t rows,
                                                      const int32_t* slot_of_token,
                                                      const float* src, float* slot_rows) {
  return inner_.CopyRowsToSlots(stream, shape, row_begin, rows, slot_of_token, src, slot_rows);
}

absl::Status ExtraWorkspaceKernels::DoCopySlotsToRows(Stream& stream, const TouchedRowsShape& shape,
                                                      int64_t row_begin, int64_t rows,
                                                      const int32_t* slot_of_token,
                                                      const float* slot_rows, DType dst_dtype,
                                                      void* dst) {
  return inner_.CopySlotsToRows(stream, shape, row_begin, rows, slot_of_token, slot_rows, dst_dtype,
                                dst);
}

absl::Status ExtraWorkspaceKernels::DoPositionEmbeddingForward(Stream& stream, int64_t batch,
                                                               int64_t seq_len, int64_t channels,
                                                               int64_t max_seq_len,
                                                               const float* wpe, float* out,
                                                               const int32_t* positions) {
  return inner_.PositionEmbeddingForward(stream, batch, seq_len, channels, max_seq_len, wpe, out,
                                         positions);
}

absl::Status ExtraWorkspaceKernels::DoPositionEmbeddingBackward(Stream& stream, int64_t batch,
                                                                int64_t seq_len, int64_t channels,
                                                                int64_t max_seq_len,
                                                                const float* dout, float* dwpe,
                                                                const int32_t* positions) {
  return inner_.PositionEmbeddingBackward(stream, batch, seq_len, channels, max_seq_len, dout, dwpe,
                                          positions);
}

absl::Status ExtraWorkspaceKernels::DoLmHeadStateInit(Stream& stream, const VocabBlockShape& shape,
                                                      float* state) {
  return inner_.LmHeadStateInit(stream, shape, state);
}

absl::Status ExtraWorkspaceKernels::DoLmHeadBlockForward(Stream& stream,
                                                         const VocabBlockShape& shape,
                                                         const float* h, DType block_dtype,
                                                         const void* block, const int32_t* targets,
                                                         float* state, void* workspace,
                                                         int64_t workspace_bytes) {
  return inner_.LmHeadBlockForward(stream, shape, h, block_dtype, block, targets, state, workspace,
                                   workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoLmHeadFinish(Stream& stream, const VocabBlockShape& shape,
                                                   const int32_t* targets, const float* state,
                                                   float* lse, double* loss) {
  return inner_.LmHeadFinish(stream, shape, targets, state, lse, loss);
}

absl::Status ExtraWorkspaceKernels::DoLmHeadBlockBackward(
    Stream& stream, const VocabBlockShape& shape, const float* h, DType block_dtype,
    const void* block, const int32_t* targets, const float* lse, double loss_grad, float* dh,
    float* dblock, void* workspace, int64_t workspace_bytes) {
  return inner_.LmHeadBlockBackward(stream, shape, h, block_dtype, block, targets, lse, loss_grad,
                                    dh, dblock, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoLoraForward(Stream& stream, const LoraShape& shape,
                                                  const float* x, const float* a, const float* b,
                                                  float* h, float* y, void* workspace,
                                                  int64_t workspace_bytes) {
  return inner_.LoraForward(stream, shape, x, a, b, h, y, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoLoraBackward(Stream& stream, const LoraShape& shape,
                                                   const float* x, const float* a, const float* b,
                                                   const float* h, const float* dy, float* dx,
                                                   float* da, float* db, void* workspace,
                                                   int64_t workspace_bytes) {
  return inner_.LoraBackward(stream, shape, x, a, b, h, dy, dx, da, db, workspace, workspace_bytes);
}

absl::Status ExtraWorkspaceKernels::DoDequantize4Bit(Stream& stream, const Quant4Tensor& w,
                                                     int64_t begin, int64_t count, DType dst_dtype,
                                                     void* dst) {
  return inner_.Dequantize4Bit(stream, w, begin, count, dst_dtype, dst);
}

absl::Status ExtraWorkspaceKernels::DoQuant4LinearForward(Stream& stream, const LinearShape& shape,
                                                          const float* x, const Quant4Tensor& w,
                                                          const float* b, float* y,
                                                          void* workspace, int64_t workspace_bytes,
                                                          DType compute_dtype) {
  return inner_.Quant4LinearForward(stream, shape, x, w, b, y, workspace, workspace_bytes,
                                    compute_dtype);
}

absl::Status ExtraWorkspaceKernels::DoQuant4LinearBackwardInput(
    Stream& stream, const LinearShape& shape, const Quant4Tensor& w, const float* dy, float* dx,
    void* workspace, int64_t workspace_bytes, DType compute_dtype) {
  return inner_.Quant4LinearBackwardInput(stream, shape, w, dy, dx, workspace, workspace_bytes,
                                          compute_dtype);
}

absl::Status ExtraWorkspaceKernels::DoDropoutForward(Stream& stream, int64_t n, float p,
                                                     uint64_t seed, const float* x, float* y) {
  return inner_.DropoutForward(stream, n, p, seed, x, y);
}

absl::Status ExtraWorkspaceKernels::DoDropoutBackward(Stream& stream, int64_t n, float p,
                                                      uint64_t seed, const float* dy, float* dx) {
  return inner_.DropoutBackward(stream, n, p, seed, dy, dx);
}

}  // namespace ps::kernel_testing
