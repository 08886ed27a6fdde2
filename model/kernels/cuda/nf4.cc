#include "model/kernels/cuda/nf4.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/nf4_launchers.h"
#include "model/kernels/cuda/workspace_sizes.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;

cudaError_t LaunchDequantize(const Quant4Tensor& t, int64_t e0, int64_t rows, int64_t cols,
                             int64_t ld, void* dst, cudaStream_t stream,
                             cuda_internal::Quant4Out out = cuda_internal::Quant4Out::kF32) {
  return cuda_internal::LaunchDequantize4Bit(t.type == Quant4Type::kNf4 ? 0 : 1, t.codes, t.absmax,
                                             t.nested_codes, t.nested_absmax, t.nested_offset, e0,
                                             rows, cols, ld, out, dst, stream);
}

absl::Status CheckLinear(const char* op, const LinearShape& s, const Quant4Tensor& w,
                         const float* workspace, int64_t workspace_elems) {
  if (s.rows <= 0 || s.in_features <= 0 || s.out_features <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(op,
                                                   ": rows, in_features and out_features must "
                                                   "be positive"));
  }
  RETURN_IF_ERROR(CheckQuant4Tensor(op, w));
  if (w.num_elems != s.out_features * s.in_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the 4-bit weight holds ", w.num_elems,
        " values, expected out_features*in_features = ", s.out_features * s.in_features));
  }
  if (workspace == nullptr || workspace_elems < Quant4LinearMinWorkspaceElems(s)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": workspace has ", workspace_elems,
                                                   " f32 elements, needs at least ",
                                                   Quant4LinearMinWorkspaceElems(s)));
  }
  return absl::OkStatus();
}

// The 16-bit compute's checks; the Quant4Out and GEMM operand type of compute_dtype.
absl::Status Check16(const char* op, const LinearShape& s, const Quant4Tensor& w,
                     DType compute_dtype, const void* workspace, int64_t workspace_bytes,
                     cuda_internal::Quant4Out* out, GemmOperand* operand) {
  if (compute_dtype == DType::kBF16) {
    *out = cuda_internal::Quant4Out::kBF16;
    *operand = GemmOperand::kBF16;
  } else if (compute_dtype == DType::kF16) {
    *out = cuda_internal::Quant4Out::kF16;
    *operand = GemmOperand::kF16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": compute_dtype ", static_cast<int>(compute_dtype), " is not bf16 or f16"));
  }
  // The f32 checks with the minimum tile (the layout's tile is never smaller).
  RETURN_IF_ERROR(CheckLinear(op, s, w, static_cast<const float*>(workspace),
                              Quant4LinearMinWorkspaceElems(s)));
  const int64_t needed = Quant4LinearLayout(s, compute_dtype).bytes;
  if (workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": workspace has ", workspace_bytes,
                                                   " bytes, needs ", needed,
                                                   " (Quant4LinearLayout for compute dtype ",
                                                   DTypeName(compute_dtype), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Dequantize4Bit(const Quant4Tensor& t, int64_t begin, int64_t count, DType dst_dtype,
                            void* dst, cudaStream_t stream) {
  constexpr char kOp[] = "cuda::Dequantize4Bit";
  RETURN_IF_ERROR(CheckQuant4Tensor(kOp, t));
  if (begin < 0 || count < 0 || begin > t.num_elems || count > t.num_elems - begin) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": range [", begin, ", ", begin, " + ",
                                                   count, ") is outside the tensor's ", t.num_elems,
                                                   " values"));
  }
  cuda_internal::Quant4Out out;
  switch (dst_dtype) {
    case DType::kF32:
      out = cuda_internal::Quant4Out::kF32;
      break;
    case DType::kBF16:
      out = cuda_internal::Quant4Out::kBF16;
      break;
    case DType::kF16:
      out = cuda_internal::Quant4Out::kF16;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": dst_dtype ", static_cast<int>(dst_dtype), " is not f32, bf16, f16"));
  }
  if (count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, {{"dst", dst}}));
  return LaunchStatus(LaunchDequantize(t, begin, 1, count, count, dst, stream, out), kOp);
}

absl::Status Quant4LinearForward(const CublasHandle& cublas, const LinearShape& shape,
                                 const float* x, const Quant4Tensor& w, const float* b, float* y,
                                 float* workspace, int64_t workspace_elems, cudaStream_t stream) {
  constexpr char kOp[] = "cuda::Quant4LinearForward";
  RETURN_IF_ERROR(CheckLinear(kOp, shape, w, workspace, workspace_elems));
  RETURN_IF_ERROR(CheckNotNull(kOp, {{"x", x}, {"y", y}}));
  if (shape.bias) RETURN_IF_ERROR(CheckNotNull(kOp, {{"b", b}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  float beta = 0.0f;
  if (shape.bias) {
    RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchBroadcastRows(b, N, O, y, stream), kOp));
    beta = 1.0f;
  }
  const int64_t tile_rows = std::min(O, workspace_elems / I);
  for (int64_t o0 = 0; o0 < O; o0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, O - o0);
    RETURN_IF_ERROR(LaunchStatus(LaunchDequantize(w, o0 * I, rows, I, I, workspace, stream), kOp));
    // y[:, o0:o0+rows] (= or +=) x tile^T.
    RETURN_IF_ERROR(
        Gemm(cublas, stream, false, true, N, rows, I, 1.0f, x, I, workspace, I, beta, y + o0, O));
  }
  return absl::OkStatus();
}

absl::Status Quant4LinearBackwardInput(const CublasHandle& cublas, const LinearShape& shape,
                                       const Quant4Tensor& w, const float* dy, float* dx,
                                       float* workspace, int64_t workspace_elems,
                                       cudaStream_t stream) {
  constexpr char kOp[] = "cuda::Quant4LinearBackwardInput";
  RETURN_IF_ERROR(CheckLinear(kOp, shape, w, workspace, workspace_elems));
  RETURN_IF_ERROR(CheckNotNull(kOp, {{"dy", dy}, {"dx", dx}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  const int64_t tile_cols = std::min(I, workspace_elems / O);
  for (int64_t i0 = 0; i0 < I; i0 += tile_cols) {
    const int64_t cols = std::min(tile_cols, I - i0);
    RETURN_IF_ERROR(LaunchStatus(LaunchDequantize(w, i0, O, cols, I, workspace, stream), kOp));
    // dx[:, i0:i0+cols] += dy tile.
    RETURN_IF_ERROR(Gemm(cublas, stream, false, false, N, cols, O, 1.0f, dy, O, workspace, cols,
                         1.0f, dx + i0, I));
  }
  return absl::OkStatus();
}

absl::Status Quant4LinearForward16(const CublasHandle& cublas, const LinearShape& shape,
                                   const float* x, const Quant4Tensor& w, const float* b, float* y,
                                   DType compute_dtype, void* workspace, int64_t workspace_bytes,
                                   cudaStream_t stream) {
  constexpr char kOp[] = "cuda::Quant4LinearForward16";
  cuda_internal::Quant4Out out;
  GemmOperand operand;
  RETURN_IF_ERROR(Check16(kOp, shape, w, compute_dtype, workspace, workspace_bytes, &out,
                          &operand));
  RETURN_IF_ERROR(CheckNotNull(kOp, {{"x", x}, {"y", y}}));
  if (shape.bias) RETURN_IF_ERROR(CheckNotNull(kOp, {{"b", b}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  const Quant4LinearWorkspaceLayout layout = Quant4LinearLayout(shape, compute_dtype);
  char* base = static_cast<char*>(workspace);
  auto* tile = reinterpret_cast<uint16_t*>(base + layout.tile);
  auto* xh = reinterpret_cast<uint16_t*>(base + layout.activations);
  RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchRoundTo16Bits(x, N * I, out, xh, stream), kOp));
  float beta = 0.0f;
  if (shape.bias) {  // y = the bias rounded; the GEMMs add their f32 sums to it
    RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchBroadcastRows(b, N, O, y, stream), kOp));
    RETURN_IF_ERROR(LaunchStatus(cuda_internal::LaunchRound16InPlace(y, N * O, out, stream), kOp));
    beta = 1.0f;
  }
  const int64_t tile_rows = std::min(O, Quant4LinearTileElems(shape) / I);
  for (int64_t o0 = 0; o0 < O; o0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, O - o0);
    RETURN_IF_ERROR(
        LaunchStatus(LaunchDequantize(w, o0 * I, rows, I, I, tile, stream, out), kOp));
    RETURN_IF_ERROR(Gemm(cublas, stream, false, true, N, rows, I, 1.0f, operand, xh, I, tile, I,
                         beta, y + o0, O));
  }
  return LaunchStatus(cuda_internal::LaunchRound16InPlace(y, N * O, out, stream), kOp);
}

absl::Status Quant4LinearBackwardInput16(const CublasHandle& cublas, const LinearShape& shape,
                                         const Quant4Tensor& w, const float* dy, float* dx,
                                         DType compute_dtype, void* workspace,
                                         int64_t workspace_bytes, cudaStream_t stream) {
  constexpr char kOp[] = "cuda::Quant4LinearBackwardInput16";
  cuda_internal::Quant4Out out;
  GemmOperand operand;
  RETURN_IF_ERROR(Check16(kOp, shape, w, compute_dtype, workspace, workspace_bytes, &out,
                          &operand));
  RETURN_IF_ERROR(CheckNotNull(kOp, {{"dy", dy}, {"dx", dx}}));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  const Quant4LinearWorkspaceLayout layout = Quant4LinearLayout(shape, compute_dtype);
  char* base = static_cast<char*>(workspace);
  auto* tile = reinterpret_cast<uint16_t*>(base + layout.tile);
  auto* dyh = reinterpret_cast<uint16_t*>(base + layout.activations);
  auto* g = reinterpret_cast<float*>(base + layout.product);
  RETURN_IF_ERROR(
      LaunchStatus(cuda_internal::LaunchRoundTo16Bits(dy, N * O, out, dyh, stream), kOp));
  const int64_t tile_cols = Quant4LinearTileColumns(shape);
  for (int64_t i0 = 0; i0 < I; i0 += tile_cols) {
    const int64_t cols = std::min(tile_cols, I - i0);
    RETURN_IF_ERROR(LaunchStatus(LaunchDequantize(w, i0, O, cols, I, tile, stream, out), kOp));
    // g = dy tile (f32 sums), then dx[:, i0:i0+cols] += g rounded.
    RETURN_IF_ERROR(Gemm(cublas, stream, false, false, N, cols, O, 1.0f, operand, dyh, O, tile,
                         cols, 0.0f, g, cols));
    RETURN_IF_ERROR(LaunchStatus(
        cuda_internal::LaunchAddRounded16(g, N, cols, out, dx + i0, I, stream), kOp));
  }
  return absl::OkStatus();
}

}  // namespace ps::cuda
