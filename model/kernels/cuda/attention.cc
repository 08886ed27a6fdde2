#include "model/kernels/cuda/attention.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/attention.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckAtMost;
using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckPositive;

absl::Status CheckShape(const char* kernel, const AttentionShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_heads", s.num_heads));
  if (s.channels % s.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": channels ", s.channels, " is not a multiple of num_heads ", s.num_heads));
  }
  RETURN_IF_ERROR(CheckAtMost(kernel, "head dim (channels / num_heads)", s.channels / s.num_heads,
                              cuda_internal::kAttentionMaxHeadDim,
                              "registers per lane in the GPU kernel"));
  RETURN_IF_ERROR(CheckAtMost(kernel, "batch", s.batch, 65535, "a CUDA grid dimension"));
  RETURN_IF_ERROR(CheckAtMost(kernel, "num_heads", s.num_heads, 65535, "a CUDA grid dimension"));
  return CheckAtMost(kernel, "seq_len", s.seq_len,
                     int64_t{INT32_MAX} * cuda_internal::kAttentionQueriesPerBlock,
                     "a CUDA grid dimension");
}

}  // namespace

absl::Status AttentionForward(const AttentionShape& shape, const float* qkv, float* out, float* lse,
                              cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::AttentionForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"qkv", qkv}, {"out", out}, {"lse", lse}}));
  return LaunchStatus(
      cuda_internal::LaunchAttentionForward(shape.batch, shape.seq_len, shape.channels,
                                            shape.num_heads, qkv, out, lse, stream),
      kKernel);
}

absl::Status AttentionBackward(const AttentionShape& shape, const float* qkv, const float* out,
                               const float* lse, const float* dout, float* dqkv, void* workspace,
                               int64_t workspace_bytes, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::AttentionBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"qkv", qkv},
                                         {"out", out},
                                         {"lse", lse},
                                         {"dout", dout},
                                         {"dqkv", dqkv},
                                         {"workspace", workspace}}));
  const int64_t needed = AttentionBackwardWorkspaceBytes(shape);
  if (workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": workspace has ", workspace_bytes,
                                                   " bytes, needs ", needed, " (B*H*T floats)"));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % alignof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": workspace is not 4-byte aligned"));
  }
  return LaunchStatus(cuda_internal::LaunchAttentionBackward(
                          shape.batch, shape.seq_len, shape.channels, shape.num_heads, qkv, out,
                          lse, dout, static_cast<float*>(workspace), dqkv, stream),
                      kKernel);
}

}  // namespace ps::cuda
