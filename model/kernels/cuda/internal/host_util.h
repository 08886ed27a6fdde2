// Host-side helpers of the model/kernels/cuda API: null-pointer checks and
// launch status.
#ifndef PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_HOST_UTIL_H_
#define PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_HOST_UTIL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "memory/cuda/cuda_status.h"
#include "model/kernels/cuda/workspace_sizes.h"

namespace ps::cuda_internal {

// InvalidArgument naming the first null pointer among (name, pointer) pairs.
[[nodiscard]] inline absl::Status CheckNotNull(
    absl::string_view kernel,
    std::initializer_list<std::pair<absl::string_view, const void*>> pointers) {
  for (const auto& [name, p] : pointers) {
    if (p == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", name, " is null"));
  }
  return absl::OkStatus();
}

// InvalidArgument unless 0 < value <= limit (a CUDA grid dimension, say),
// naming the limit.
[[nodiscard]] inline absl::Status CheckAtMost(absl::string_view kernel, absl::string_view name,
                                              int64_t value, int64_t limit, absl::string_view why) {
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": ", name, " is ", value, ", above the limit ", limit, " (", why, ")"));
}

// The launch result of `kernel` as a Status.
[[nodiscard]] inline absl::Status LaunchStatus(cudaError_t error, absl::string_view kernel) {
  return CudaStatus(error, absl::StrCat(kernel, " launch"));
}

// Bytes rounded up to 256 (cudaMalloc's alignment), for carving workspaces.
inline constexpr int64_t AlignBytes(int64_t bytes) { return ::ps::cuda::AlignWorkspaceBytes(bytes); }

}  // namespace ps::cuda_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_CUDA_INTERNAL_HOST_UTIL_H_
