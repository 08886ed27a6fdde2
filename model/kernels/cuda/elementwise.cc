#include "model/kernels/cuda/elementwise.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/launchers.h"
#include "model/kernels/encoder.h"
#include "model/kernels/internal/kernel_util.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckPositive;

absl::Status CheckEncoderShape(const char* kernel, const EncoderShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckPositive(kernel, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(CheckPositive(kernel, "max_seq_len", s.max_seq_len));
  if (s.seq_len > s.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": seq_len ", s.seq_len, " exceeds max_seq_len ", s.max_seq_len));
  }
  // Token ids are int32 and compared against V on the device.
  return cuda_internal::CheckAtMost(kernel, "vocab_size", s.vocab_size, INT32_MAX,
                                    "tokens are int32");
}

}  // namespace

absl::Status EncoderForward(const EncoderShape& shape, const int32_t* tokens, const float* wte,
                            const float* wpe, float* out, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::EncoderForward";
  RETURN_IF_ERROR(CheckEncoderShape(kKernel, shape));
  RETURN_IF_ERROR(
      CheckNotNull(kKernel, {{"tokens", tokens}, {"wte", wte}, {"wpe", wpe}, {"out", out}}));
  return LaunchStatus(
      cuda_internal::LaunchEncoderForward(shape.batch, shape.seq_len, shape.channels,
                                          shape.vocab_size, tokens, wte, wpe, out, stream),
      kKernel);
}

absl::Status EncoderBackward(const EncoderShape& shape, const int32_t* tokens, const float* dout,
                             float* dwte, float* dwpe, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::EncoderBackward";
  RETURN_IF_ERROR(CheckEncoderShape(kKernel, shape));
  RETURN_IF_ERROR(
      CheckNotNull(kKernel, {{"tokens", tokens}, {"dout", dout}, {"dwte", dwte}, {"dwpe", dwpe}}));
  return LaunchStatus(
      cuda_internal::LaunchEncoderBackward(shape.batch, shape.seq_len, shape.channels,
                                           shape.vocab_size, tokens, dout, dwte, dwpe, stream),
      kKernel);
}

absl::Status GeluForward(int64_t n, const float* x, float* y, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::GeluForward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"y", y}}));
  return LaunchStatus(cuda_internal::LaunchGeluForward(n, x, y, stream), kKernel);
}

absl::Status GeluBackward(int64_t n, const float* x, const float* dy, float* dx,
                          cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::GeluBackward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}, {"dy", dy}, {"dx", dx}}));
  return LaunchStatus(cuda_internal::LaunchGeluBackward(n, x, dy, dx, stream), kKernel);
}

absl::Status ResidualForward(int64_t n, const float* a, const float* b, float* out,
                             cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::ResidualForward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"a", a}, {"b", b}, {"out", out}}));
  return LaunchStatus(cuda_internal::LaunchResidualForward(n, a, b, out, stream), kKernel);
}

absl::Status ScaleInPlace(int64_t n, float alpha, float* x, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::ScaleInPlace";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"x", x}}));
  return LaunchStatus(cuda_internal::LaunchScaleInPlace(n, alpha, x, stream), kKernel);
}

absl::Status ResidualBackward(int64_t n, const float* dout, float* da, float* db,
                              cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::ResidualBackward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"dout", dout}, {"da", da}, {"db", db}}));
  if (da == db) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": da and db are the same buffer"));
  }
  return LaunchStatus(cuda_internal::LaunchResidualBackward(n, dout, da, db, stream), kKernel);
}

}  // namespace ps::cuda
