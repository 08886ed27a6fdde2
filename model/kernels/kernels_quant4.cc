// The Kernels operations over 4-bit frozen weights (QLoRA's base): dequantization and the
// dequantizing nn.Linear (forward and input gradient) — their argument checks, then the call of the
// implementation's Do* method. The contract is kernels.h's; kernels.cc has the other operations.
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "memory/dtype.h"
#include "model/kernels/internal/kernel_arg_checks.h"
#include "model/kernels/kernels.h"
#include "model/kernels/nf4.h"

namespace ps {
namespace {

using kernels_internal::BlasDim;
using kernels_internal::Bytes;
using kernels_internal::kF32;
using kernels_internal::NoOverlap;
using kernels_internal::ValidDType;

absl::Status CheckLinearShape(absl::string_view op, const LinearShape& s) {
  RETURN_IF_ERROR(BlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(BlasDim(op, "in_features", s.in_features));
  return BlasDim(op, "out_features", s.out_features);
}

// bnb_4bit_compute_dtype: f32, bf16 or f16.
absl::Status CheckComputeDType(absl::string_view op, DType compute_dtype) {
  if (ValidDType(compute_dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": compute_dtype ",
                                                 static_cast<int>(compute_dtype),
                                                 " is not f32, bf16 or f16"));
}

// The weight holds exactly W [out, in].
absl::Status CheckWeightElems(absl::string_view op, const LinearShape& s, const Quant4Tensor& w) {
  if (w.num_elems == s.out_features * s.in_features) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": the 4-bit weight w holds ", w.num_elems,
                   " values, expected out_features*in_features = ", s.out_features, "*",
                   s.in_features, " = ", s.out_features * s.in_features));
}

}  // namespace

absl::Status Kernels::CheckQuant4Buffers(absl::string_view op, const Quant4Tensor& w) {
  if (w.type != Quant4Type::kNf4 && w.type != Quant4Type::kFp4) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": w has an unknown 4-bit type ",
                                                   static_cast<int>(w.type), " (nf4 or fp4)"));
  }
  if (w.num_elems < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": w has a negative element count ", w.num_elems));
  }
  if (w.num_elems == 0) return absl::OkStatus();
  const int64_t blocks = Quant4NumBlocks(w.num_elems);
  RETURN_IF_ERROR(CheckBuffers(op, {{"w.codes", w.codes, Quant4CodeBytes(w.num_elems)}}, 1));
  if (!w.nested()) {
    return CheckBuffers(op, {{"w.absmax", w.absmax, blocks * kF32}}, kF32);
  }
  RETURN_IF_ERROR(
      CheckBuffers(op, {{"w.nested_codes (w.absmax is null)", w.nested_codes, blocks}}, 1));
  return CheckBuffers(
      op, {{"w.nested_absmax", w.nested_absmax, Quant4NestedNumBlocks(blocks) * kF32}}, kF32);
}

absl::Status Kernels::Dequantize4Bit(Stream& stream, const Quant4Tensor& w, int64_t begin,
                                     int64_t count, DType dst_dtype, void* dst) {
  constexpr char kOp[] = "Dequantize4Bit";
  RETURN_IF_ERROR(CheckQuant4Buffers(kOp, w));
  if (begin < 0 || count < 0 || begin > w.num_elems || count > w.num_elems - begin) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": range [", begin, ", ", begin, " + ",
                                                   count, ") is outside the 4-bit tensor's ",
                                                   w.num_elems, " values"));
  }
  if (!ValidDType(dst_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dst_dtype ", static_cast<int>(dst_dtype), " is not f32, f16 or bf16"));
  }
  if (count == 0) return absl::OkStatus();
  const int64_t e = SizeOf(dst_dtype);
  ASSIGN_OR_RETURN(const int64_t dst_bytes, Bytes(kOp, "dst", {count}, e));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dst", dst, dst_bytes}}, e));
  return DoDequantize4Bit(stream, w, begin, count, dst_dtype, dst);
}

absl::Status Kernels::Quant4LinearForward(Stream& stream, const LinearShape& s, const float* x,
                                          const Quant4Tensor& w, const float* b, float* y,
                                          void* workspace, int64_t workspace_bytes,
                                          DType compute_dtype) {
  constexpr char kOp[] = "Quant4LinearForward";
  RETURN_IF_ERROR(CheckComputeDType(kOp, compute_dtype));
  RETURN_IF_ERROR(CheckLinearShape(kOp, s));
  RETURN_IF_ERROR(CheckWeightElems(kOp, s, w));
  RETURN_IF_ERROR(CheckQuant4Buffers(kOp, w));
  ASSIGN_OR_RETURN(const int64_t x_bytes, Bytes(kOp, "x", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t y_bytes, Bytes(kOp, "y", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"x", x, x_bytes}, {"y", y, y_bytes}}, kF32));
  if (s.bias) RETURN_IF_ERROR(CheckBuffers(kOp, {{"b", b, s.out_features * kF32}}, kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "x", x, x_bytes, "y", y, y_bytes));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes,
                                 Quant4LinearWorkspaceBytes(s, compute_dtype)));
  return DoQuant4LinearForward(stream, s, x, w, s.bias ? b : nullptr, y, workspace,
                               workspace_bytes, compute_dtype);
}

absl::Status Kernels::Quant4LinearBackwardInput(Stream& stream, const LinearShape& s,
                                                const Quant4Tensor& w, const float* dy, float* dx,
                                                void* workspace, int64_t workspace_bytes,
                                                DType compute_dtype) {
  constexpr char kOp[] = "Quant4LinearBackwardInput";
  RETURN_IF_ERROR(CheckComputeDType(kOp, compute_dtype));
  RETURN_IF_ERROR(CheckLinearShape(kOp, s));
  RETURN_IF_ERROR(CheckWeightElems(kOp, s, w));
  RETURN_IF_ERROR(CheckQuant4Buffers(kOp, w));
  ASSIGN_OR_RETURN(const int64_t dx_bytes, Bytes(kOp, "dx", {s.rows, s.in_features}, kF32));
  ASSIGN_OR_RETURN(const int64_t dy_bytes, Bytes(kOp, "dy", {s.rows, s.out_features}, kF32));
  RETURN_IF_ERROR(CheckBuffers(kOp, {{"dy", dy, dy_bytes}, {"dx", dx, dx_bytes}}, kF32));
  RETURN_IF_ERROR(NoOverlap(kOp, "dy", dy, dy_bytes, "dx", dx, dx_bytes));
  RETURN_IF_ERROR(CheckWorkspace(kOp, workspace, workspace_bytes,
                                 Quant4LinearWorkspaceBytes(s, compute_dtype)));
  return DoQuant4LinearBackwardInput(stream, s, w, dy, dx, workspace, workspace_bytes,
                                     compute_dtype);
}

}  // namespace ps
