// The Kernels operations of the model's vocabulary-sized and bf16-weight paths: the bf16-weight
// GEMMs, the vocabulary in row blocks (embedding and LM-head blocks, touched rows, position
// embeddings) — their argument checks, then the call of the implementation's Do* method. The
// contract is kernels.h's; kernels.cc has the other operations.
#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "memory/dtype.h"
#include "model/kernels/internal/kernel_arg_checks.h"
#include "model/kernels/kernels.h"

namespace ps {
namespace {

using kernels_internal::BlasDim;
using kernels_internal::Bytes;
using kernels_internal::CheckShape;
using kernels_internal::kF32;
using kernels_internal::kI32;
using kernels_internal::NoOverlap;
using kernels_internal::Positive;
using kernels_internal::ValidDType;

absl::Status CheckShape(absl::string_view op, const TouchedRowsShape& s) {
  RETURN_IF_ERROR(Positive(op, "channels", s.channels));
  RETURN_IF_ERROR(Positive(op, "vocab_size", s.vocab_size));
  return Positive(op, "num_slots", s.num_slots);
}

// A vocabulary block (vocab_blocks.h's rules, so no implementation gets a block the CPU kernels
// would refuse).
absl::Status CheckShape(absl::string_view op, const VocabBlockShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(BlasDim(op, "channels", s.channels));
  RETURN_IF_ERROR(BlasDim(op, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(BlasDim(op, "block_rows", s.block_rows));
  if (s.row_begin < 0 || s.row_begin + s.block_rows > s.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": block rows [", s.row_begin, ", ", s.row_begin + s.block_rows,
                     ") are not inside [0, vocab_size=", s.vocab_size, ")"));
  }
  return absl::OkStatus();
}

// The LM head's blocks in addition: tiles, and a block made of whole vocabulary tiles.
absl::Status CheckLmHeadShape(absl::string_view op, const VocabBlockShape& s) {
  RETURN_IF_ERROR(CheckShape(op, s));
  RETURN_IF_ERROR(BlasDim(op, "row_tile", s.row_tile));
  RETURN_IF_ERROR(BlasDim(op, "vocab_tile", s.vocab_tile));
  if (s.row_begin % s.vocab_tile != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the block starts at row ", s.row_begin, ", not a multiple of vocab_tile ",
        s.vocab_tile,
        "; blocks must hold whole vocabulary tiles (all but the last block a multiple of "
        "vocab_tile rows) so that the tiles, and the results, are those of the whole matrix"));
  }
  return absl::OkStatus();
}

absl::Status CheckDType(absl::string_view op, absl::string_view name, DType dtype) {
  if (ValidDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " ", static_cast<int>(dtype), " is not f32, f16 or bf16"));
}

// A row range [row_begin, row_begin + rows) of the vocabulary.
absl::Status CheckRowRange(absl::string_view op, const TouchedRowsShape& s, int64_t row_begin,
                           int64_t rows) {
  RETURN_IF_ERROR(Positive(op, "rows", rows));
  if (row_begin < 0 || row_begin > s.vocab_size - rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rows [", row_begin, ", ", row_begin + rows,
                     ") are not inside [0, vocab_size=", s.vocab_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

// --- bf16-weight GEMMs ---------------------------------------------------------------------------

absl::Status Kernels::MatmulForwardBf16(Stream& stream, const MatmulShape& s, const float* x,
                                        const uint16_t* w, const float* b, float* y,
                                        void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "MatmulForwardBf16";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t w_bytes,
                   Bytes(kOp, "w", {s.in_features, s.out_features}, sizeof(uint16_t)));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "y", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp, {{"x", x, x_bytes}, {"b", b, s.out_features * kF32}, {"y", y, y_bytes}}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"w", w, w_bytes}}, sizeof(uint16_t)));
  RETURN_IF_ERROR(
      CheckWorkspace(kOp, workspace, workspace_bytes, MatmulBf16ForwardWorkspaceBytes(s)));
  return DoMatmulForwardBf16(stream, s, x, w, b, y, workspace, workspace_bytes);
}

absl::Status Kernels::MatmulBackwardBf16(Stream& stream, const MatmulShape& s, const float* x,
                                         const uint16_t* w, const float* dy, float* dx, float* dw,
                                         float* db, void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "MatmulBackwardBf16";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t w_bytes,
                   Bytes(kOp, "w", {s.in_features, s.out_features}, sizeof(uint16_t)));
  ASSIGN_OR_RETURN(const int64_t dw_bytes, Bytes(kOp, "dw", {s.in_features, s.out_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "dy", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(
      CheckBuffers(kOp, {{"x", x, x_bytes}, {"dy", dy, y_bytes}, {"dx", dx, x_bytes}}, kF32));
  // dw and db are optional (a frozen projection computes only dx).
  if (dw != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"dw", dw, dw_bytes}}, kF32));
  if (db != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"db", db, s.out_features * kF32}}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"w", w, w_bytes}}, sizeof(uint16_t)));
  RETURN_IF_ERROR(
      CheckWorkspace(kOp, workspace, workspace_bytes, MatmulBf16BackwardWorkspaceBytes(s)));
  return DoMatmulBackwardBf16(stream, s, x, w, dy, dx, dw, db, workspace, workspace_bytes);
}

// --- The vocabulary in row blocks ----------------------------------------------------------------

absl::Status Kernels::EmbeddingBlockForward(Stream& stream, const VocabBlockShape& s,
                                            const int32_t* tokens, DType block_dtype,
                                            const void* block, float* out) {
  constexpr char kOp[] = "EmbeddingBlockForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  RETURN_IF_ERROR(CheckDType(kOp, "block_dtype", block_dtype));
  ASSIGN_OR_RETURN(const int64_t block_bytes,
                   Bytes(kOp, "block", {s.block_rows, s.channels}, SizeOf(block_dtype)));
  ASSIGN_OR_RETURN(const int64_t out_bytes, Bytes(kOp, "out", {s.rows, s.channels}, kF32));
  RETURN_IF_ERROR(
      CheckBuffers(kOp, {{"tokens", tokens, s.rows * kI32}, {"out", out, out_bytes}}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"block", block, block_bytes}}, SizeOf(block_dtype)));
  return DoEmbeddingBlockForward(stream, s, tokens, block_dtype, block, out);
}

absl::Status Kernels::ScatterRowsAdd(Stream& stream, const TouchedRowsShape& s, int64_t num_tokens,
                                     const int32_t* tokens, const int32_t* slot_of_token,
                                     const float* dout, float* slot_rows) {
  constexpr char kOp[] = "ScatterRowsAdd";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  RETURN_IF_ERROR(Positive(kOp, "num_tokens", num_tokens));
  ASSIGN_OR_RETURN(const int64_t dout_bytes, Bytes(kOp, "dout", {num_tokens, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t rows_bytes,
                   Bytes(kOp, "slot_rows", {s.num_slots, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"tokens", tokens, num_tokens * kI32},
                                {"slot_of_token", slot_of_token, s.vocab_size * kI32},
                                {"dout", dout, dout_bytes},
                                {"slot_rows", slot_rows, rows_bytes}},
                               kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "dout", dout, dout_bytes, "slot_rows", slot_rows, rows_bytes));
  return DoScatterRowsAdd(stream, s, num_tokens, tokens, slot_of_token, dout, slot_rows);
}

absl::Status Kernels::CopyRowsToSlots(Stream& stream, const TouchedRowsShape& s, int64_t row_begin,
                                      int64_t rows, const int32_t* slot_of_token, const float* src,
                                      float* slot_rows) {
  constexpr char kOp[] = "CopyRowsToSlots";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  RETURN_IF_ERROR(CheckRowRange(kOp, s, row_begin, rows));
  ASSIGN_OR_RETURN(const int64_t src_bytes, Bytes(kOp, "src", {rows, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t rows_bytes,
                   Bytes(kOp, "slot_rows", {s.num_slots, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"slot_of_token", slot_of_token, s.vocab_size * kI32},
                                {"src", src, src_bytes},
                                {"slot_rows", slot_rows, rows_bytes}},
                               kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "src", src, src_bytes, "slot_rows", slot_rows, rows_bytes));
  return DoCopyRowsToSlots(stream, s, row_begin, rows, slot_of_token, src, slot_rows);
}

absl::Status Kernels::CopySlotsToRows(Stream& stream, const TouchedRowsShape& s, int64_t row_begin,
                                      int64_t rows, const int32_t* slot_of_token,
                                      const float* slot_rows, DType dst_dtype, void* dst) {
  constexpr char kOp[] = "CopySlotsToRows";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  RETURN_IF_ERROR(CheckRowRange(kOp, s, row_begin, rows));
  RETURN_IF_ERROR(CheckDType(kOp, "dst_dtype", dst_dtype));
  ASSIGN_OR_RETURN(const int64_t dst_bytes,
                   Bytes(kOp, "dst", {rows, s.channels}, SizeOf(dst_dtype)));
  ASSIGN_OR_RETURN(const int64_t rows_bytes,
                   Bytes(kOp, "slot_rows", {s.num_slots, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp,
      {{"slot_of_token", slot_of_token, s.vocab_size * kI32}, {"slot_rows", slot_rows, rows_bytes}},
      kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dst", dst, dst_bytes}}, SizeOf(dst_dtype)));
  RETURN_IF_ERROR(NoOverlap(kOp, "slot_rows", slot_rows, rows_bytes, "dst", dst, dst_bytes));
  return DoCopySlotsToRows(stream, s, row_begin, rows, slot_of_token, slot_rows, dst_dtype, dst);
}

namespace {
absl::Status CheckPositions(absl::string_view op, int64_t batch, int64_t seq_len, int64_t channels,
                            int64_t max_seq_len) {
  RETURN_IF_ERROR(Positive(op, "batch", batch));
  RETURN_IF_ERROR(Positive(op, "seq_len", seq_len));
  RETURN_IF_ERROR(Positive(op, "channels", channels));
  RETURN_IF_ERROR(Positive(op, "max_seq_len", max_seq_len));
  if (seq_len > max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": seq_len ", seq_len,
                                                   " exceeds max_seq_len ", max_seq_len,
                                                   " (the rows of wpe, n_positions)"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status Kernels::PositionEmbeddingForward(Stream& stream, int64_t batch, int64_t seq_len,
                                               int64_t channels, int64_t max_seq_len,
                                               const float* wpe, float* out,
                                               const int32_t* positions) {
  constexpr char kOp[] = "PositionEmbeddingForward";
  RETURN_IF_ERROR(CheckPositions(kOp, batch, seq_len, channels, max_seq_len));
  ASSIGN_OR_RETURN(const int64_t wpe_bytes, Bytes(kOp, "wpe", {max_seq_len, channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t out_bytes, Bytes(kOp, "out", {batch, seq_len, channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"wpe", wpe, wpe_bytes}, {"out", out, out_bytes}}, kF32));
  RETURN_IF_ERROR(CheckOptionalPerToken(kOp, "positions", positions, batch, seq_len));
  return DoPositionEmbeddingForward(stream, batch, seq_len, channels, max_seq_len, wpe, out,
                                    positions);
}

absl::Status Kernels::PositionEmbeddingBackward(Stream& stream, int64_t batch, int64_t seq_len,
                                                int64_t channels, int64_t max_seq_len,
                                                const float* dout, float* dwpe,
                                                const int32_t* positions) {
  constexpr char kOp[] = "PositionEmbeddingBackward";
  RETURN_IF_ERROR(CheckPositions(kOp, batch, seq_len, channels, max_seq_len));
  ASSIGN_OR_RETURN(const int64_t wpe_bytes, Bytes(kOp, "dwpe", {max_seq_len, channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t out_bytes, Bytes(kOp, "dout", {batch, seq_len, channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dout", dout, out_bytes}, {"dwpe", dwpe, wpe_bytes}}, kF32));
  RETURN_IF_ERROR(CheckOptionalPerToken(kOp, "positions", positions, batch, seq_len));
  return DoPositionEmbeddingBackward(stream, batch, seq_len, channels, max_seq_len, dout, dwpe,
                                     positions);
}

absl::Status Kernels::LmHeadStateInit(Stream& stream, const VocabBlockShape& s, float* state) {
  constexpr char kOp[] = "LmHeadStateInit";
  RETURN_IF_ERROR(BlasDim(kOp, "rows", s.rows));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"state", state, LmHeadStateElems(s) * kF32}}, kF32));
  return DoLmHeadStateInit(stream, s, state);
}

absl::Status Kernels::LmHeadBlockForward(Stream& stream, const VocabBlockShape& s, const float* h,
                                         DType block_dtype, const void* block,
                                         const int32_t* targets, float* state, void* workspace,
                                         int64_t workspace_bytes) {
  constexpr char kOp[] = "LmHeadBlockForward";
  RETURN_IF_ERROR(CheckLmHeadShape(kOp, s));
  RETURN_IF_ERROR(CheckDType(kOp, "block_dtype", block_dtype));
  ASSIGN_OR_RETURN(const int64_t h_bytes, Bytes(kOp, "h", {s.rows, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t block_bytes,
                   Bytes(kOp, "block", {s.block_rows, s.channels}, SizeOf(block_dtype)));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"h", h, h_bytes},
                                {"targets", targets, s.rows * kI32},
                                {"state", state, LmHeadStateElems(s) * kF32}},
                               kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"block", block, block_bytes}}, SizeOf(block_dtype)));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes,
                                 LmHeadBlockForwardWorkspaceBytes(s, block_dtype)));
  return DoLmHeadBlockForward(stream, s, h, block_dtype, block, targets, state, workspace,
                              workspace_bytes);
}

absl::Status Kernels::LmHeadFinish(Stream& stream, const VocabBlockShape& s, const int32_t* targets,
                                   const float* state, float* lse, double* loss) {
  constexpr char kOp[] = "LmHeadFinish";
  RETURN_IF_ERROR(BlasDim(kOp, "rows", s.rows));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"targets", targets, s.rows * kI32},
                                {"state", state, LmHeadStateElems(s) * kF32},
                                {"lse", lse, s.rows * kF32}},
                               kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"loss", loss, sizeof(double)}}, sizeof(double)));
  return DoLmHeadFinish(stream, s, targets, state, lse, loss);
}

absl::Status Kernels::LmHeadBlockBackward(Stream& stream, const VocabBlockShape& s, const float* h,
                                          DType block_dtype, const void* block,
                                          const int32_t* targets, const float* lse,
                                          double loss_grad, float* dh, float* dblock,
                                          void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "LmHeadBlockBackward";
  RETURN_IF_ERROR(CheckLmHeadShape(kOp, s));
  RETURN_IF_ERROR(CheckDType(kOp, "block_dtype", block_dtype));
  ASSIGN_OR_RETURN(const int64_t h_bytes, Bytes(kOp, "h", {s.rows, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t block_bytes,
                   Bytes(kOp, "block", {s.block_rows, s.channels}, SizeOf(block_dtype)));
  ASSIGN_OR_RETURN(const int64_t dblock_bytes,
                   Bytes(kOp, "dblock", {s.block_rows, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"h", h, h_bytes},
                                {"targets", targets, s.rows * kI32},
                                {"lse", lse, s.rows * kF32},
                                {"dh", dh, h_bytes}},
                               kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"block", block, block_bytes}}, SizeOf(block_dtype)));
  // dblock is optional (a frozen LM head computes only dh).
  if (dblock != nullptr) {
    RETURN_IF_ERROR(CheckBuffers(kOp, {{"dblock", dblock, dblock_bytes}}, kF32));
    RETURN_IF_ERROR(NoOverlap(kOp, "dh", dh, h_bytes, "dblock", dblock, dblock_bytes));
  }
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes,
                                 LmHeadBlockBackwardWorkspaceBytes(s, block_dtype)));
  return DoLmHeadBlockBackward(stream, s, h, block_dtype, block, targets, lse, loss_grad, dh,
                               dblock, workspace, workspace_bytes);
}

}  // namespace ps
