#include "model/kernels/cuda/rmsnorm.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/llama_launchers.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/rmsnorm.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckPositive;

absl::Status CheckShape(const char* kernel, const RmsNormShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  if (!(s.eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": eps (rms_norm_eps) must be positive, got ", s.eps));
  }
  // One warp per row in a 1-D grid of 8-row blocks.
  return cuda_internal::CheckAtMost(kernel, "rows", s.rows, int64_t{INT32_MAX} * 8,
                                    "a CUDA grid dimension");
}

}  // namespace

absl::Status RmsNormForward(const RmsNormShape& shape, const float* x, const float* w, float* y,
                            float* rstd, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::RmsNormForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"w", w}, {"y", y}, {"rstd", rstd}}));
  return LaunchStatus(
      cuda_internal::LaunchRmsNormForward(shape.rows, shape.channels, static_cast<float>(shape.eps),
                                          static_cast<float>(shape.weight_offset), x, w, y, rstd,
                                          stream),
      kKernel);
}

absl::Status RmsNormBackward(const RmsNormShape& shape, const float* x, const float* w,
                             const float* rstd, const float* dy, float* dx, float* dw,
                             cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::RmsNormBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(
      kKernel, {{"x", x}, {"w", w}, {"rstd", rstd}, {"dy", dy}, {"dx", dx}}));  // dw: optional
  return LaunchStatus(cuda_internal::LaunchRmsNormBackward(
                          shape.rows, shape.channels, static_cast<float>(shape.weight_offset), x,
                          w, rstd, dy, dx, dw, stream),
                      kKernel);
}

}  // namespace ps::cuda
