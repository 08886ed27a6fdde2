#include "model/kernels/kernels.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "memory/dtype.h"
#include "model/kernels/internal/kernel_arg_checks.h"

namespace ps {
namespace {

// Workspaces are carved by the CUDA kernels at 256-byte boundaries; every allocator of the
// project returns such pointers (kAllocationAlignment).
constexpr int64_t kWorkspaceAlignment = 256;

using kernels_internal::BlasDim;
using kernels_internal::Bytes;
using kernels_internal::CheckShape;
using kernels_internal::kF32;
using kernels_internal::kI32;
using kernels_internal::NoOverlap;
using kernels_internal::Overlap;
using kernels_internal::Positive;
using kernels_internal::ValidDType;

// --- Shapes (the rules of the CPU kernels, so no implementation ever gets a shape a kernel
// would refuse) ---------------------------------------------------------------------------------

absl::Status CheckShape(absl::string_view op, const EncoderShape& s) {
  RETURN_IF_ERROR(Positive(op, "batch", s.batch));
  RETURN_IF_ERROR(Positive(op, "seq_len", s.seq_len));
  RETURN_IF_ERROR(Positive(op, "channels", s.channels));
  RETURN_IF_ERROR(Positive(op, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(Positive(op, "max_seq_len", s.max_seq_len));
  if (s.seq_len > s.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": seq_len ", s.seq_len,
                                                   " exceeds max_seq_len ", s.max_seq_len,
                                                   " (the rows of wpe, n_positions)"));
  }
  return absl::OkStatus();
}

absl::Status CheckEps(absl::string_view op, double eps) {
  if (eps > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": eps must be positive, got ", eps));
}

absl::Status CheckShape(absl::string_view op, const LayerNormShape& s) {
  RETURN_IF_ERROR(Positive(op, "rows", s.rows));
  RETURN_IF_ERROR(Positive(op, "channels", s.channels));
  return CheckEps(op, s.eps);
}

absl::Status CheckShape(absl::string_view op, const RmsNormShape& s) {
  RETURN_IF_ERROR(Positive(op, "rows", s.rows));
  RETURN_IF_ERROR(Positive(op, "channels", s.channels));
  return CheckEps(op, s.eps);
}

absl::Status CheckShape(absl::string_view op, const LinearShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(BlasDim(op, "in_features", s.in_features));
  return BlasDim(op, "out_features", s.out_features);
}

// A row stride: 0 (packed) or at least the packed row.
absl::Status RowStride(absl::string_view op, absl::string_view name, int64_t stride, int64_t row,
                       absl::string_view row_formula) {
  if (stride == 0 || stride >= row) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", stride,
                                                 " is shorter than a row (", row_formula, " = ",
                                                 row, "); use 0 for packed rows"));
}

absl::Status CheckShape(absl::string_view op, const GqaAttentionShape& s) {
  RETURN_IF_ERROR(Positive(op, "batch", s.batch));
  RETURN_IF_ERROR(Positive(op, "seq_len", s.seq_len));
  RETURN_IF_ERROR(Positive(op, "num_heads", s.num_heads));
  RETURN_IF_ERROR(Positive(op, "num_kv_heads", s.num_kv_heads));
  RETURN_IF_ERROR(Positive(op, "head_dim", s.head_dim));
  RETURN_IF_ERROR(Positive(op, "tile", s.tile));
  if (s.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": sliding_window ", s.sliding_window,
                                                   " is negative; use 0 for no window"));
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_attention_heads ", s.num_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   s.num_kv_heads));
  }
  RETURN_IF_ERROR(RowStride(op, "q_row_stride", s.q_row_stride, s.num_heads * s.head_dim,
                            "num_heads*head_dim"));
  return RowStride(op, "kv_row_stride", s.kv_row_stride, s.num_kv_heads * s.head_dim,
                   "num_kv_heads*head_dim");
}

absl::Status CheckShape(absl::string_view op, const LmHeadCrossEntropyShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(BlasDim(op, "channels", s.channels));
  RETURN_IF_ERROR(BlasDim(op, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(BlasDim(op, "row_tile", s.row_tile));
  return BlasDim(op, "vocab_tile", s.vocab_tile);
}

absl::Status CheckShape(absl::string_view op, const RopeShape& s) {
  RETURN_IF_ERROR(Positive(op, "batch", s.batch));
  RETURN_IF_ERROR(Positive(op, "seq_len", s.seq_len));
  RETURN_IF_ERROR(Positive(op, "num_heads", s.num_heads));
  RETURN_IF_ERROR(Positive(op, "head_dim", s.head_dim));
  RETURN_IF_ERROR(Positive(op, "table_positions", s.table_positions));
  if (s.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head_dim ", s.head_dim, " is odd; RoPE rotates pairs"));
  }
  if (s.rotary_dim < 0 || s.rotary_dim > s.head_dim || s.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rotary_dim ", s.rotary_dim,
                                                   " must be even and in [0, head_dim=", s.head_dim,
                                                   "] (0: the whole head)"));
  }
  if (s.seq_len > s.table_positions) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": seq_len ", s.seq_len,
                                                   " exceeds the cos/sin tables' ",
                                                   s.table_positions, " positions"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(absl::string_view op, const EmbeddingShape& s) {
  RETURN_IF_ERROR(Positive(op, "rows", s.rows));
  RETURN_IF_ERROR(Positive(op, "channels", s.channels));
  RETURN_IF_ERROR(Positive(op, "vocab_size", s.vocab_size));
  if (s.padding_idx < -1 || s.padding_idx >= s.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": padding_idx ", s.padding_idx,
                     " is neither -1 nor in [0, vocab_size=", s.vocab_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(absl::string_view op, const GemmShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "m", s.m));
  RETURN_IF_ERROR(BlasDim(op, "n", s.n));
  RETURN_IF_ERROR(BlasDim(op, "k", s.k));
  if (!ValidDType(s.ab_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ab_dtype ", static_cast<int>(s.ab_dtype), " is not f32, f16 or bf16"));
  }
  struct Ld {
    const char* name;
    int64_t ld;
    int64_t row;
  };
  for (const Ld& ld : {Ld{"lda", s.lda, s.trans_a ? s.m : s.k},
                       Ld{"ldb", s.ldb, s.trans_b ? s.k : s.n}, Ld{"ldc", s.ldc, s.n}}) {
    if (ld.ld < ld.row || ld.ld > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", ld.name, " is ", ld.ld,
                                                     ", less than the row length ", ld.row,
                                                     " of its matrix (or >= 2^31)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShape(absl::string_view op, const LoraShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(BlasDim(op, "in_features", s.in_features));
  RETURN_IF_ERROR(BlasDim(op, "out_features", s.out_features));
  RETURN_IF_ERROR(BlasDim(op, "rank", s.rank));
  if (!std::isfinite(s.scale)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": scale ", s.scale, " is not finite"));
  }
  return absl::OkStatus();
}

absl::Status CheckDropoutP(absl::string_view op, float p) {
  if (p >= 0.0f && p < 1.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": dropout probability p must be in [0, 1), got ", p));
}

// Bytes of a row-major matrix of `rows` rows of `cols` elements, `ld` apart.
absl::StatusOr<int64_t> MatrixBytes(absl::string_view op, absl::string_view name, int64_t rows,
                                    int64_t cols, int64_t ld, int64_t elem_bytes) {
  ASSIGN_OR_RETURN(const int64_t full_rows, Bytes(op, name, {rows - 1, ld}, elem_bytes));
  return full_rows + cols * elem_bytes;
}

}  // namespace

absl::Status Kernels::CheckBuffer(absl::string_view, const BufferArg&) { return absl::OkStatus(); }

absl::Status Kernels::CheckBuffers(absl::string_view op, std::initializer_list<BufferArg> buffers,
                                   int64_t align) {
  for (const BufferArg& buffer : buffers) {
    if (buffer.ptr == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", buffer.name, " is null"));
    }
    if (reinterpret_cast<uintptr_t>(buffer.ptr) % static_cast<uintptr_t>(align) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", buffer.name, " is not ", align,
                                                     "-byte aligned (its element size)"));
    }
    RETURN_IF_ERROR(CheckBuffer(op, buffer));
  }
  return absl::OkStatus();
}

absl::Status Kernels::CheckOptionalPerToken(absl::string_view op, absl::string_view name,
                                            const int32_t* values, int64_t batch, int64_t seq_len) {
  if (values == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(op, name, {batch, seq_len}, kI32));
  return CheckBuffers(op, {{name, values, bytes}}, kI32);
}

absl::Status Kernels::CheckWorkspace(absl::string_view op, const void* workspace,
                                     int64_t workspace_bytes, int64_t needed_bytes) {
  if (workspace_bytes < needed_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": workspace has ", workspace_bytes, " bytes, needs ", needed_bytes,
                     " (ask ", op, "'s WorkspaceBytes query of this implementation)"));
  }
  if (needed_bytes == 0) return absl::OkStatus();
  if (workspace == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": workspace is null"));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": workspace must be ", kWorkspaceAlignment,
                     "-byte aligned (as every allocator of memory/ returns memory)"));
  }
  return CheckBuffer(op, BufferArg{"workspace", workspace, workspace_bytes});
}

// --- Memory ------------------------------------------------------------------------------------

absl::Status Kernels::Zero(Stream& stream, void* dst, int64_t bytes) {
  constexpr char kOp[] = "Zero";
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative size ", bytes));
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dst", dst, bytes}}, 1));
  return DoZero(stream, dst, bytes);
}

absl::Status Kernels::Convert(Stream& stream, DType src_dtype, const void* src, DType dst_dtype,
                              void* dst, int64_t num_elems) {
  constexpr char kOp[] = "Convert";
  if (!ValidDType(src_dtype) || !ValidDType(dst_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": dtypes ", static_cast<int>(src_dtype),
                                                   " -> ", static_cast<int>(dst_dtype),
                                                   " are not f32, f16 or bf16"));
  }
  if (num_elems < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative size ", num_elems));
  }
  if (num_elems == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t src_bytes, Bytes(kOp, "src", {num_elems}, SizeOf(src_dtype)));
  ASSIGN_OR_RETURN(const int64_t dst_bytes, Bytes(kOp, "dst", {num_elems}, SizeOf(dst_dtype)));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"src", src, src_bytes}}, SizeOf(src_dtype)));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dst", dst, dst_bytes}}, SizeOf(dst_dtype)));
  if (Overlap(src, src_bytes, dst, dst_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": src and dst overlap; convert into a separate buffer"));
  }
  return DoConvert(stream, src_dtype, src, dst_dtype, dst, num_elems);
}

absl::Status Kernels::Gemm(Stream& stream, const GemmShape& shape, float alpha, const void* a,
                           const void* b, float beta, float* c, void* workspace,
                           int64_t workspace_bytes) {
  constexpr char kOp[] = "Gemm";
  RETURN_IF_ERROR(CheckShape(kOp, shape));
  const int64_t e = SizeOf(shape.ab_dtype);
  ASSIGN_OR_RETURN(const int64_t a_bytes,
                   MatrixBytes(kOp, "a", shape.trans_a ? shape.k : shape.m,
                               shape.trans_a ? shape.m : shape.k, shape.lda, e));
  ASSIGN_OR_RETURN(const int64_t b_bytes,
                   MatrixBytes(kOp, "b", shape.trans_b ? shape.n : shape.k,
                               shape.trans_b ? shape.k : shape.n, shape.ldb, e));
  ASSIGN_OR_RETURN(const int64_t c_bytes, MatrixBytes(kOp, "c", shape.m, shape.n, shape.ldc, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"a", a, a_bytes}, {"b", b, b_bytes}}, e));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"c", c, c_bytes}}, kF32));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, GemmWorkspaceBytes(shape)));
  return DoGemm(stream, shape, alpha, a, b, beta, c, workspace, workspace_bytes);
}

// --- GPT-2 -------------------------------------------------------------------------------------

absl::Status Kernels::EncoderForward(Stream& stream, const EncoderShape& s, const int32_t* tokens,
                                     const float* wte, const float* wpe, float* out) {
  constexpr char kOp[] = "EncoderForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t tokens_bytes, Bytes(kOp, "tokens", {s.batch, s.seq_len}, kI32));
  ASSIGN_OR_RETURN(const int64_t wte_bytes, Bytes(kOp, "wte", {s.vocab_size, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t wpe_bytes, Bytes(kOp, "wpe", {s.max_seq_len, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t out_bytes,
                   Bytes(kOp, "out", {s.batch, s.seq_len, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"tokens", tokens, tokens_bytes},
                                {"wte", wte, wte_bytes},
                                {"wpe", wpe, wpe_bytes},
                                {"out", out, out_bytes}},
                               kF32));
  return DoEncoderForward(stream, s, tokens, wte, wpe, out);
}

absl::Status Kernels::EncoderBackward(Stream& stream, const EncoderShape& s, const int32_t* tokens,
                                      const float* dout, float* dwte, float* dwpe) {
  constexpr char kOp[] = "EncoderBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t tokens_bytes, Bytes(kOp, "tokens", {s.batch, s.seq_len}, kI32));
  ASSIGN_OR_RETURN(const int64_t wte_bytes, Bytes(kOp, "dwte", {s.vocab_size, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t wpe_bytes, Bytes(kOp, "dwpe", {s.max_seq_len, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t out_bytes,
                   Bytes(kOp, "dout", {s.batch, s.seq_len, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"tokens", tokens, tokens_bytes},
                                {"dout", dout, out_bytes},
                                {"dwte", dwte, wte_bytes},
                                {"dwpe", dwpe, wpe_bytes}},
                               kF32));
  return DoEncoderBackward(stream, s, tokens, dout, dwte, dwpe);
}

absl::Status Kernels::LayerNormForward(Stream& stream, const LayerNormShape& s, const float* x,
                                       const float* w, const float* b, float* y, float* mean,
                                       float* rstd) {
  constexpr char kOp[] = "LayerNormForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.channels}, kF32));
  const int64_t c_bytes = s.channels * kF32, n_bytes = s.rows * kF32;
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"x", x, x_bytes},
                                {"w", w, c_bytes},
                                {"b", b, c_bytes},
                                {"y", y, x_bytes},
                                {"mean", mean, n_bytes},
                                {"rstd", rstd, n_bytes}},
                               kF32));
  return DoLayerNormForward(stream, s, x, w, b, y, mean, rstd);
}

absl::Status Kernels::LayerNormBackward(Stream& stream, const LayerNormShape& s, const float* x,
                                        const float* w, const float* mean, const float* rstd,
                                        const float* dy, float* dx, float* dw, float* db) {
  constexpr char kOp[] = "LayerNormBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.channels}, kF32));
  const int64_t c_bytes = s.channels * kF32, n_bytes = s.rows * kF32;
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"x", x, x_bytes},
                                {"w", w, c_bytes},
                                {"mean", mean, n_bytes},
                                {"rstd", rstd, n_bytes},
                                {"dy", dy, x_bytes},
                                {"dx", dx, x_bytes}},
                               kF32));
  // dw and db are optional (a frozen norm computes only dx).
  if (dw != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"dw", dw, c_bytes}}, kF32));
  if (db != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"db", db, c_bytes}}, kF32));
  return DoLayerNormBackward(stream, s, x, w, mean, rstd, dy, dx, dw, db);
}

absl::Status Kernels::MatmulForward(Stream& stream, const MatmulShape& s, const float* x,
                                    const float* w, const float* b, float* y, void* workspace,
                                    int64_t workspace_bytes) {
  constexpr char kOp[] = "MatmulForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t w_bytes, Bytes(kOp, "w", {s.in_features, s.out_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "y", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp,
      {{"x", x, x_bytes}, {"w", w, w_bytes}, {"b", b, s.out_features * kF32}, {"y", y, y_bytes}},
      kF32));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, MatmulWorkspaceBytes(s)));
  return DoMatmulForward(stream, s, x, w, b, y, workspace, workspace_bytes);
}

absl::Status Kernels::MatmulBackward(Stream& stream, const MatmulShape& s, const float* x,
                                     const float* w, const float* dy, float* dx, float* dw,
                                     float* db, void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "MatmulBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t w_bytes, Bytes(kOp, "w", {s.in_features, s.out_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "dy", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp, {{"x", x, x_bytes}, {"w", w, w_bytes}, {"dy", dy, y_bytes}, {"dx", dx, x_bytes}}, kF32));
  // dw and db are optional (a frozen projection computes only dx).
  if (dw != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"dw", dw, w_bytes}}, kF32));
  if (db != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"db", db, s.out_features * kF32}}, kF32));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, MatmulWorkspaceBytes(s)));
  return DoMatmulBackward(stream, s, x, w, dy, dx, dw, db, workspace, workspace_bytes);
}

absl::Status Kernels::GeluForward(Stream& stream, int64_t n, const float* x, float* y) {
  constexpr char kOp[] = "GeluForward";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "x", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"x", x, bytes}, {"y", y, bytes}}, kF32));
  return DoGeluForward(stream, n, x, y);
}

absl::Status Kernels::GeluBackward(Stream& stream, int64_t n, const float* x, const float* dy,
                                   float* dx) {
  constexpr char kOp[] = "GeluBackward";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "x", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"x", x, bytes}, {"dy", dy, bytes}, {"dx", dx, bytes}}, kF32));
  return DoGeluBackward(stream, n, x, dy, dx);
}

absl::Status Kernels::ResidualForward(Stream& stream, int64_t n, const float* a, const float* b,
                                      float* out) {
  constexpr char kOp[] = "ResidualForward";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "a", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"a", a, bytes}, {"b", b, bytes}, {"out", out, bytes}}, kF32));
  return DoResidualForward(stream, n, a, b, out);
}

absl::Status Kernels::ResidualBackward(Stream& stream, int64_t n, const float* dout, float* da,
                                       float* db) {
  constexpr char kOp[] = "ResidualBackward";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "dout", {n}, kF32));
  RETURN_IF_ERROR(
      CheckBuffers(kOp, {{"dout", dout, bytes}, {"da", da, bytes}, {"db", db, bytes}}, kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "da", da, "db", db, bytes));
  return DoResidualBackward(stream, n, dout, da, db);
}

absl::Status Kernels::ScaleInPlace(Stream& stream, int64_t n, float alpha, float* x) {
  constexpr char kOp[] = "ScaleInPlace";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "x", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"x", x, bytes}}, kF32));
  return DoScaleInPlace(stream, n, alpha, x);
}

absl::Status Kernels::LmHeadCrossEntropyForward(Stream& stream, const LmHeadCrossEntropyShape& s,
                                                const float* h, const float* wte,
                                                const int32_t* targets, float* lse, double* loss,
                                                void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "LmHeadCrossEntropyForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t h_bytes, Bytes(kOp, "h", {s.rows, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t wte_bytes, Bytes(kOp, "wte", {s.vocab_size, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"h", h, h_bytes},
                                {"wte", wte, wte_bytes},
                                {"targets", targets, s.rows * kI32},
                                {"lse", lse, s.rows * kF32}},
                               kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"loss", loss, sizeof(double)}}, sizeof(double)));
  RETURN_IF_ERROR(
      CheckWorkspace(kOp, workspace, workspace_bytes, LmHeadCrossEntropyWorkspaceBytes(s)));
  return DoLmHeadCrossEntropyForward(stream, s, h, wte, targets, lse, loss, workspace,
                                     workspace_bytes);
}

absl::Status Kernels::LmHeadCrossEntropyBackward(Stream& stream, const LmHeadCrossEntropyShape& s,
                                                 const float* h, const float* wte,
                                                 const int32_t* targets, const float* lse,
                                                 double loss_grad, float* dh, float* dwte,
                                                 void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "LmHeadCrossEntropyBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t h_bytes, Bytes(kOp, "h", {s.rows, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t wte_bytes, Bytes(kOp, "wte", {s.vocab_size, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"h", h, h_bytes},
                                {"wte", wte, wte_bytes},
                                {"targets", targets, s.rows * kI32},
                                {"lse", lse, s.rows * kF32},
                                {"dh", dh, h_bytes},
                                {"dwte", dwte, wte_bytes}},
                               kF32));
  RETURN_IF_ERROR(
      CheckWorkspace(kOp, workspace, workspace_bytes, LmHeadCrossEntropyWorkspaceBytes(s)));
  return DoLmHeadCrossEntropyBackward(stream, s, h, wte, targets, lse, loss_grad, dh, dwte,
                                      workspace, workspace_bytes);
}

// --- Llama / Qwen2 / Mistral -------------------------------------------------------------------

absl::Status Kernels::RmsNormForward(Stream& stream, const RmsNormShape& s, const float* x,
                                     const float* w, float* y, float* rstd) {
  constexpr char kOp[] = "RmsNormForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"x", x, x_bytes},
                                {"w", w, s.channels * kF32},
                                {"y", y, x_bytes},
                                {"rstd", rstd, s.rows * kF32}},
                               kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "x", x, "y", y, x_bytes));
  return DoRmsNormForward(stream, s, x, w, y, rstd);
}

absl::Status Kernels::RmsNormBackward(Stream& stream, const RmsNormShape& s, const float* x,
                                      const float* w, const float* rstd, const float* dy, float* dx,
                                      float* dw) {
  constexpr char kOp[] = "RmsNormBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"x", x, x_bytes},
                                {"w", w, s.channels * kF32},
                                {"rstd", rstd, s.rows * kF32},
                                {"dy", dy, x_bytes},
                                {"dx", dx, x_bytes}},
                               kF32));
  // dw is optional (a frozen norm computes only dx).
  if (dw != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"dw", dw, s.channels * kF32}}, kF32));
  return DoRmsNormBackward(stream, s, x, w, rstd, dy, dx, dw);
}

absl::Status Kernels::RopeForward(Stream& stream, const RopeShape& s, const float* cos,
                                  const float* sin, float* x, const int32_t* positions) {
  constexpr char kOp[] = "RopeForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t table_bytes,
                   Bytes(kOp, "cos", {s.table_positions, s.head_dim / 2}, kF32));
  ASSIGN_OR_RETURN(const int64_t x_bytes,
                   Bytes(kOp, "x", {s.batch, s.seq_len, s.num_heads, s.head_dim}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp, {{"cos", cos, table_bytes}, {"sin", sin, table_bytes}, {"x", x, x_bytes}}, kF32));
  RETURN_IF_ERROR(CheckOptionalPerToken(kOp, "positions", positions, s.batch, s.seq_len));
  return DoRopeForward(stream, s, cos, sin, x, positions);
}

absl::Status Kernels::RopeBackward(Stream& stream, const RopeShape& s, const float* cos,
                                   const float* sin, float* dx, const int32_t* positions) {
  constexpr char kOp[] = "RopeBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t table_bytes,
                   Bytes(kOp, "cos", {s.table_positions, s.head_dim / 2}, kF32));
  ASSIGN_OR_RETURN(const int64_t x_bytes,
                   Bytes(kOp, "dx", {s.batch, s.seq_len, s.num_heads, s.head_dim}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp, {{"cos", cos, table_bytes}, {"sin", sin, table_bytes}, {"dx", dx, x_bytes}}, kF32));
  RETURN_IF_ERROR(CheckOptionalPerToken(kOp, "positions", positions, s.batch, s.seq_len));
  return DoRopeBackward(stream, s, cos, sin, dx, positions);
}

absl::Status Kernels::SwiGluForward(Stream& stream, int64_t n, const float* g, const float* u,
                                    float* h, GateActivation act) {
  constexpr char kOp[] = "SwiGluForward";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "g", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"g", g, bytes}, {"u", u, bytes}, {"h", h, bytes}}, kF32));
  return DoSwiGluForward(stream, n, g, u, h, act);
}

absl::Status Kernels::SwiGluBackward(Stream& stream, int64_t n, const float* g, const float* u,
                                     const float* dh, float* dg, float* du, GateActivation act) {
  constexpr char kOp[] = "SwiGluBackward";
  RETURN_IF_ERROR(Positive(kOp, "num_elems", n));
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "g", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp,
      {{"g", g, bytes}, {"u", u, bytes}, {"dh", dh, bytes}, {"dg", dg, bytes}, {"du", du, bytes}},
      kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "dg", dg, "du", du, bytes));
  for (const auto& [name, in] :
       {std::pair<const char*, const float*>{"g", g}, {"u", u}, {"dh", dh}}) {
    RETURN_IF_ERROR(NoOverlap(kOp, "dg", dg, name, in, bytes));
    RETURN_IF_ERROR(NoOverlap(kOp, "du", du, name, in, bytes));
  }
  return DoSwiGluBackward(stream, n, g, u, dh, dg, du, act);
}

absl::Status Kernels::GqaAttentionForward(Stream& stream, const GqaAttentionShape& s,
                                          const float* q, const float* k, const float* v,
                                          float* out, float* lse, void* workspace,
                                          int64_t workspace_bytes, const int32_t* key_start) {
  constexpr char kOp[] = "GqaAttentionForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t out_bytes,
                   Bytes(kOp, "out", {s.batch, s.seq_len, s.num_heads, s.head_dim}, kF32));
  ASSIGN_OR_RETURN(const int64_t q_bytes, Bytes(kOp, "q", {GqaAttentionQElems(s)}, kF32));
  ASSIGN_OR_RETURN(const int64_t kv_bytes, Bytes(kOp, "k", {GqaAttentionKvElems(s)}, kF32));
  ASSIGN_OR_RETURN(const int64_t lse_bytes,
                   Bytes(kOp, "lse", {s.batch, s.num_heads, s.seq_len}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"q", q, q_bytes},
                                {"k", k, kv_bytes},
                                {"v", v, kv_bytes},
                                {"out", out, out_bytes},
                                {"lse", lse, lse_bytes}},
                               kF32));
  RETURN_IF_ERROR(
      CheckWorkspace(kOp, workspace, workspace_bytes, GqaAttentionForwardWorkspaceBytes(s)));
  RETURN_IF_ERROR(CheckOptionalPerToken(kOp, "key_start", key_start, s.batch, s.seq_len));
  return DoGqaAttentionForward(stream, s, q, k, v, out, lse, workspace, workspace_bytes, key_start);
}

absl::Status Kernels::GqaAttentionBackward(Stream& stream, const GqaAttentionShape& s,
                                           const float* q, const float* k, const float* v,
                                           const float* out, const float* lse, const float* dout,
                                           float* dq, float* dk, float* dv, void* workspace,
                                           int64_t workspace_bytes, const int32_t* key_start) {
  constexpr char kOp[] = "GqaAttentionBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t out_bytes,
                   Bytes(kOp, "out", {s.batch, s.seq_len, s.num_heads, s.head_dim}, kF32));
  ASSIGN_OR_RETURN(const int64_t q_bytes, Bytes(kOp, "q", {GqaAttentionQElems(s)}, kF32));
  ASSIGN_OR_RETURN(const int64_t kv_bytes, Bytes(kOp, "k", {GqaAttentionKvElems(s)}, kF32));
  ASSIGN_OR_RETURN(const int64_t lse_bytes,
                   Bytes(kOp, "lse", {s.batch, s.num_heads, s.seq_len}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"q", q, q_bytes},
                                {"k", k, kv_bytes},
                                {"v", v, kv_bytes},
                                {"out", out, out_bytes},
                                {"lse", lse, lse_bytes},
                                {"dout", dout, out_bytes},
                                {"dq", dq, q_bytes},
                                {"dk", dk, kv_bytes},
                                {"dv", dv, kv_bytes}},
                               kF32));
  RETURN_IF_ERROR(
      CheckWorkspace(kOp, workspace, workspace_bytes, GqaAttentionBackwardWorkspaceBytes(s)));
  RETURN_IF_ERROR(CheckOptionalPerToken(kOp, "key_start", key_start, s.batch, s.seq_len));
  return DoGqaAttentionBackward(stream, s, q, k, v, out, lse, dout, dq, dk, dv, workspace,
                                workspace_bytes, key_start);
}

absl::Status Kernels::LinearForward(Stream& stream, const LinearShape& s, const float* x,
                                    const float* w, const float* b, float* y, void* workspace,
                                    int64_t workspace_bytes) {
  constexpr char kOp[] = "LinearForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t w_bytes, Bytes(kOp, "w", {s.out_features, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "y", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(
      CheckBuffers(kOp, {{"x", x, x_bytes}, {"w", w, w_bytes}, {"y", y, y_bytes}}, kF32));
  if (s.bias) RETURN_IF_ERROR(CheckBuffers(kOp, {{"b", b, s.out_features * kF32}}, kF32));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, LinearWorkspaceBytes(s)));
  return DoLinearForward(stream, s, x, w, s.bias ? b : nullptr, y, workspace, workspace_bytes);
}

absl::Status Kernels::LinearBackward(Stream& stream, const LinearShape& s, const float* x,
                                     const float* w, const float* dy, float* dx, float* dw,
                                     float* db, void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "LinearBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t w_bytes, Bytes(kOp, "w", {s.out_features, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "dy", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp, {{"x", x, x_bytes}, {"w", w, w_bytes}, {"dy", dy, y_bytes}, {"dx", dx, x_bytes}}, kF32));
  // dw and db are optional (a frozen projection computes only dx).
  if (dw != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"dw", dw, w_bytes}}, kF32));
  if (s.bias && db != nullptr) {
    RETURN_IF_ERROR(CheckBuffers(kOp, {{"db", db, s.out_features * kF32}}, kF32));
  }
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, LinearWorkspaceBytes(s)));
  return DoLinearBackward(stream, s, x, w, dy, dx, dw, s.bias ? db : nullptr, workspace,
                          workspace_bytes);
}

absl::Status Kernels::EmbeddingForward(Stream& stream, const EmbeddingShape& s,
                                       const int32_t* tokens, const float* wte, float* out) {
  constexpr char kOp[] = "EmbeddingForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t wte_bytes, Bytes(kOp, "wte", {s.vocab_size, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t out_bytes, Bytes(kOp, "out", {s.rows, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp, {{"tokens", tokens, s.rows * kI32}, {"wte", wte, wte_bytes}, {"out", out, out_bytes}},
      kF32));
  return DoEmbeddingForward(stream, s, tokens, wte, out);
}

absl::Status Kernels::EmbeddingBackward(Stream& stream, const EmbeddingShape& s,
                                        const int32_t* tokens, const float* dout, float* dwte) {
  constexpr char kOp[] = "EmbeddingBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t wte_bytes, Bytes(kOp, "dwte", {s.vocab_size, s.channels}, kF32));
  ASSIGN_OR_RETURN(const int64_t out_bytes, Bytes(kOp, "dout", {s.rows, s.channels}, kF32));
  RETURN_IF_ERROR(CheckBuffers(
      kOp,
      {{"tokens", tokens, s.rows * kI32}, {"dout", dout, out_bytes}, {"dwte", dwte, wte_bytes}},
      kF32));
  return DoEmbeddingBackward(stream, s, tokens, dout, dwte);
}

// --- LoRA adapters ------------------------------------------------------------------------------

absl::Status Kernels::LoraForward(Stream& stream, const LoraShape& s, const float* x,
                                  const float* a, const float* b, float* h, float* y,
                                  void* workspace, int64_t workspace_bytes) {
  constexpr char kOp[] = "LoraForward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t a_bytes, Bytes(kOp, "a", {s.rank, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t b_bytes, Bytes(kOp, "b", {s.out_features, s.rank}, kF32));
  ASSIGN_OR_RETURN(const int64_t h_bytes, Bytes(kOp, "h", {s.rows, s.rank}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "y", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"x", x, x_bytes},
                                {"a", a, a_bytes},
                                {"b", b, b_bytes},
                                {"h", h, h_bytes},
                                {"y", y, y_bytes}},
                               kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "h", h, h_bytes, "y", y, y_bytes));
  for (const BufferArg& in :
       {BufferArg{"x", x, x_bytes}, BufferArg{"a", a, a_bytes}, BufferArg{"b", b, b_bytes}}) {
    RETURN_IF_ERROR(NoOverlap(kOp, "h", h, h_bytes, in.name, in.ptr, in.bytes));
    RETURN_IF_ERROR(NoOverlap(kOp, "y", y, y_bytes, in.name, in.ptr, in.bytes));
  }
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, LoraForwardWorkspaceBytes(s)));
  return DoLoraForward(stream, s, x, a, b, h, y, workspace, workspace_bytes);
}

absl::Status Kernels::LoraBackward(Stream& stream, const LoraShape& s, const float* x,
                                   const float* a, const float* b, const float* h, const float* dy,
                                   float* dx, float* da, float* db, void* workspace,
                                   int64_t workspace_bytes) {
  constexpr char kOp[] = "LoraBackward";
  RETURN_IF_ERROR(CheckShape(kOp, s));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t a_bytes, Bytes(kOp, "a", {s.rank, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t b_bytes, Bytes(kOp, "b", {s.out_features, s.rank}, kF32));
  ASSIGN_OR_RETURN(const int64_t h_bytes, Bytes(kOp, "h", {s.rows, s.rank}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "dy", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp,
                               {{"x", x, x_bytes},
                                {"a", a, a_bytes},
                                {"b", b, b_bytes},
                                {"h", h, h_bytes},
                                {"dy", dy, y_bytes},
                                {"da", da, a_bytes},
                                {"db", db, b_bytes}},
                               kF32));
  // dx is optional (no input gradient wanted).
  if (dx != nullptr) RETURN_IF_ERROR(CheckBuffers(kOp, {{"dx", dx, x_bytes}}, kF32));
  const BufferArg outs[] = {
      {"dx", dx, dx != nullptr ? x_bytes : 0}, {"da", da, a_bytes}, {"db", db, b_bytes}};
  const BufferArg ins[] = {{"x", x, x_bytes},
                           {"a", a, a_bytes},
                           {"b", b, b_bytes},
                           {"h", h, h_bytes},
                           {"dy", dy, y_bytes}};
  for (int i = 0; i < 3; ++i) {
    if (outs[i].ptr == nullptr) continue;
    for (int j = i + 1; j < 3; ++j) {
      if (outs[j].ptr == nullptr) continue;
      RETURN_IF_ERROR(NoOverlap(kOp, outs[i].name, outs[i].ptr, outs[i].bytes, outs[j].name,
                                outs[j].ptr, outs[j].bytes));
    }
    for (const BufferArg& in : ins) {
      RETURN_IF_ERROR(
          NoOverlap(kOp, outs[i].name, outs[i].ptr, outs[i].bytes, in.name, in.ptr, in.bytes));
    }
  }
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes, LoraBackwardWorkspaceBytes(s)));
  return DoLoraBackward(stream, s, x, a, b, h, dy, dx, da, db, workspace, workspace_bytes);
}

absl::Status Kernels::DropoutForward(Stream& stream, int64_t n, float p, uint64_t seed,
                                     const float* x, float* y) {
  constexpr char kOp[] = "DropoutForward";
  RETURN_IF_ERROR(CheckDropoutP(kOp, p));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative size ", n));
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "x", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"x", x, bytes}, {"y", y, bytes}}, kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "x", x, "y", y, bytes));
  return DoDropoutForward(stream, n, p, seed, x, y);
}

absl::Status Kernels::DropoutBackward(Stream& stream, int64_t n, float p, uint64_t seed,
                                      const float* dy, float* dx) {
  constexpr char kOp[] = "DropoutBackward";
  RETURN_IF_ERROR(CheckDropoutP(kOp, p));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative size ", n));
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t bytes, Bytes(kOp, "dy", {n}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dy", dy, bytes}, {"dx", dx, bytes}}, kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "dy", dy, "dx", dx, bytes));
  return DoDropoutBackward(stream, n, p, seed, dy, dx);
}

}  // namespace ps
