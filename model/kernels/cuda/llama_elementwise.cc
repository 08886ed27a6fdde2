#include "model/kernels/cuda/llama_elementwise.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/kernels/cuda/internal/host_util.h"
#include "model/kernels/cuda/internal/llama_launchers.h"
#include "model/kernels/embedding.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/rope.h"

namespace ps::cuda {
namespace {

using cuda_internal::CheckNotNull;
using cuda_internal::LaunchStatus;
using kernels_internal::CheckPositive;

absl::Status CheckRopeShape(const char* kernel, const RopeShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "num_heads", s.num_heads));
  RETURN_IF_ERROR(CheckPositive(kernel, "head_dim", s.head_dim));
  RETURN_IF_ERROR(CheckPositive(kernel, "table_positions", s.table_positions));
  if (s.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": head_dim ", s.head_dim, " is odd; RoPE rotates pairs"));
  }
  if (s.rotary_dim < 0 || s.rotary_dim > s.head_dim || s.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": rotary_dim ", s.rotary_dim,
                                                   " must be even and in [0, head_dim=", s.head_dim,
                                                   "] (0: the whole head)"));
  }
  if (s.seq_len > s.table_positions) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": seq_len ", s.seq_len,
                                                   " exceeds the cos/sin tables' ",
                                                   s.table_positions, " positions"));
  }
  return absl::OkStatus();
}

absl::Status Rope(const char* kernel, const RopeShape& shape, const float* cos, const float* sin,
                  float* x, bool inverse, cudaStream_t stream, const int32_t* positions) {
  RETURN_IF_ERROR(CheckRopeShape(kernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kernel, {{"cos", cos}, {"sin", sin}, {inverse ? "dx" : "x", x}}));
  return LaunchStatus(
      cuda_internal::LaunchRope(shape.batch, shape.seq_len, shape.num_heads, shape.head_dim,
                                shape.rotated(), shape.table_positions, cos, sin, positions, x,
                                inverse, stream),
      kernel);
}

absl::Status CheckEmbeddingShape(const char* kernel, const EmbeddingShape& s) {
  RETURN_IF_ERROR(CheckPositive(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckPositive(kernel, "vocab_size", s.vocab_size));
  if (s.padding_idx < -1 || s.padding_idx >= s.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": padding_idx ", s.padding_idx,
                     " is neither -1 nor in [0, vocab_size=", s.vocab_size, ")"));
  }
  // Token ids are int32 and compared against V on the device.
  return cuda_internal::CheckAtMost(kernel, "vocab_size", s.vocab_size, INT32_MAX,
                                    "tokens are int32");
}

}  // namespace

absl::Status RopeForward(const RopeShape& shape, const float* cos, const float* sin, float* x,
                         cudaStream_t stream, const int32_t* positions) {
  return Rope("cuda::RopeForward", shape, cos, sin, x, /*inverse=*/false, stream, positions);
}

absl::Status RopeBackward(const RopeShape& shape, const float* cos, const float* sin, float* dx,
                          cudaStream_t stream, const int32_t* positions) {
  return Rope("cuda::RopeBackward", shape, cos, sin, dx, /*inverse=*/true, stream, positions);
}

absl::Status SwiGluForward(int64_t n, const float* g, const float* u, float* h, cudaStream_t stream,
                           GateActivation act) {
  constexpr char kKernel[] = "cuda::SwiGluForward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"gate", g}, {"up", u}, {"out", h}}));
  return LaunchStatus(cuda_internal::LaunchSwiGluForward(n, g, u, h, act, stream), kKernel);
}

absl::Status SwiGluBackward(int64_t n, const float* g, const float* u, const float* dh, float* dg,
                            float* du, cudaStream_t stream, GateActivation act) {
  constexpr char kKernel[] = "cuda::SwiGluBackward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "n", n));
  RETURN_IF_ERROR(
      CheckNotNull(kKernel, {{"gate", g}, {"up", u}, {"dout", dh}, {"dgate", dg}, {"dup", du}}));
  return LaunchStatus(cuda_internal::LaunchSwiGluBackward(n, g, u, dh, dg, du, act, stream),
                      kKernel);
}

absl::Status EmbeddingForward(const EmbeddingShape& shape, const int32_t* tokens, const float* wte,
                              float* out, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::EmbeddingForward";
  RETURN_IF_ERROR(CheckEmbeddingShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"tokens", tokens}, {"wte", wte}, {"out", out}}));
  return LaunchStatus(cuda_internal::LaunchEmbeddingForward(
                          shape.rows, shape.channels, shape.vocab_size, tokens, wte, out, stream),
                      kKernel);
}

absl::Status EmbeddingBackward(const EmbeddingShape& shape, const int32_t* tokens,
                               const float* dout, float* dwte, cudaStream_t stream) {
  constexpr char kKernel[] = "cuda::EmbeddingBackward";
  RETURN_IF_ERROR(CheckEmbeddingShape(kKernel, shape));
  RETURN_IF_ERROR(CheckNotNull(kKernel, {{"tokens", tokens}, {"dout", dout}, {"dwte", dwte}}));
  return LaunchStatus(
      cuda_internal::LaunchEmbeddingBackward(shape.rows, shape.channels, shape.vocab_size,
                                             shape.padding_idx, tokens, dout, dwte, stream),
      kKernel);
}

}  // namespace ps::cuda
