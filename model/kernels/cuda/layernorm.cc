#include "model/kernels/cuda/layernorm.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/layernorm.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckPositive;

absl::Status CheckShape(const char* kernel, const LayerNormShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  if (!(s.eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": eps must be positive, got ", s.eps));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LayerNormForward(const LayerNormShape& shape, const float* x, const float* w,
                              const float* b, float* y, float* mean, float* rstd,
                              cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LayerNormForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(
      kKernel, {{"x", x}, {"w", w}, {"b", b}, {"y", y}, {"mean", mean}, {"rstd", rstd}}));
  return LaunchStatus(cuda_internal::LaunchLayerNormForward(shape.rows, shape.channels,
                                                            static_cast<float>(shape.eps), x, w, b,
                                                            y, mean, rstd, stream),
                      kKernel);
}

absl::Status LayerNormBackward(const LayerNormShape& shape, const float* x, const float* w,
                               const float* mean, const float* rstd, const float* dy, float* dx,
                               float* dw, float* db, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::LayerNormBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x},
                                         {"w", w},
                                         {"mean", mean},
                                         {"rstd", rstd},
                                         {"dy", dy},
                                         {"dx", dx}}));  // dw, db: optional
  return LaunchStatus(cuda_internal::LaunchLayerNormBackward(shape.rows, shape.channels, x, w, mean,
                                                             rstd, dy, dx, dw, db, stream),
                      kKernel);
}

}  // namespace ps::cuda
