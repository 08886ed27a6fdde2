#include "model/kernels/cuda/gqa_attention.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/llama_launchers.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckAtMost;
using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckPositive;

absl::Status CheckShape(const char* kernel, const GqaAttentionShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_heads", s.num_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_kv_heads", s.num_kv_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "head_dim", s.head_dim));
  if (s.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": sliding_window ", s.sliding_window,
                                                   " is negative; use 0 for no window"));
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": num_attention_heads ", s.num_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   s.num_kv_heads));
  }
  if (s.q_row_stride != 0 && s.q_row_stride < s.num_heads * s.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": q_row_stride ", s.q_row_stride,
        " is shorter than a row (Hq*D = ", s.num_heads * s.head_dim, "); use 0 for packed rows"));
  }
  if (s.kv_row_stride != 0 && s.kv_row_stride < s.num_kv_heads * s.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": kv_row_stride ", s.kv_row_stride, " is shorter than a row (Hkv*D = ",
        s.num_kv_heads * s.head_dim, "); use 0 for packed rows"));
  }
  RETURN_IF_ERROR(CheckAtMost(kernel, "head_dim", s.head_dim, cuda_internal::kGqaMaxHeadDim,
                              "registers per lane in the GPU kernel"));
  RETURN_IF_ERROR(CheckAtMost(kernel, "batch", s.batch, 65535, "a CUDA grid dimension"));
  RETURN_IF_ERROR(CheckAtMost(kernel, "num_heads", s.num_heads, 65535, "a CUDA grid dimension"));
  return CheckAtMost(kernel, "seq_len", s.seq_len,
                     int64_t{INT32_MAX} * cuda_internal::kGqaRowsPerBlock, "a CUDA grid dimension");
}

}  // namespace

absl::Status GqaAttentionForward(const GqaAttentionShape& shape, const float* q, const float* k,
                                 const float* v, float* out, float* lse, cudaStream_t stream,
                                 const int32_t* key_start) {
  constexpr char kKernel[] = "cuda::GqaAttentionForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(
      CheckNotNull(kKernel, {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}}));
  return LaunchStatus(cuda_internal::LaunchGqaAttentionForward(
                          shape.batch, shape.seq_len, shape.num_heads, shape.num_kv_heads,
                          shape.head_dim, GqaQRowStride(shape), GqaKvRowStride(shape),
                          shape.sliding_window, key_start, q, k, v, out, lse, stream),
                      kKernel);
}

absl::Status GqaAttentionBackward(const GqaAttentionShape& shape, const float* q, const float* k,
                                  const float* v, const float* out, const float* lse,
                                  const float* dout, float* dq, float* dk, float* dv,
                                  void* workspace, int64_t workspace_bytes, cudaStream_t stream,
                                  const int32_t* key_start) {
  constexpr char kKernel[] = "cuda::GqaAttentionBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"q", q},
                                         {"k", k},
                                         {"v", v},
                                         {"out", out},
                                         {"lse", lse},
                                         {"dout", dout},
                                         {"dq", dq},
                                         {"dk", dk},
                                         {"dv", dv},
                                         {"workspace", workspace}}));
  const int64_t needed = GqaAttentionBackwardWorkspaceBytes(shape);
  if (workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": workspace has ", workspace_bytes,
                                                   " bytes, needs ", needed, " (B*Hq*T floats)"));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % alignof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": workspace is not 4-byte aligned"));
  }
  return LaunchStatus(
      cuda_internal::LaunchGqaAttentionBackward(
          shape.batch, shape.seq_len, shape.num_heads, shape.num_kv_heads, shape.head_dim,
          GqaQRowStride(shape), GqaKvRowStride(shape), shape.sliding_window, key_start, q, k, v,
          out, lse, dout, static_cast<float*>(workspace), dq, dk, dv, stream),
      kKernel);
}

}  // namespace ps::cuda
