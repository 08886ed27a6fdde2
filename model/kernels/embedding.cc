#include "model/kernels/embedding.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"

namespace ps {
namespace {

using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::RowsPerTask;

// Channels per backward task: enough to amortize the walk over the tokens.
constexpr int64_t kBackwardChannelsPerTask = 64;

absl::Status CheckShape(const char* kernel, const EmbeddingShape& s,
                        absl::Span<const int32_t> tokens) {
  RETURN_IF_ERROR(CheckPositive(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckPositive(kernel, "vocab_size", s.vocab_size));
  if (s.padding_idx < -1 || s.padding_idx >= s.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": padding_idx ", s.padding_idx,
                     " is neither -1 nor in [0, vocab_size=", s.vocab_size, ")"));
  }
  RETURN_IF_ERROR(CheckElems(kernel, "tokens", tokens, s.rows, "rows"));
  for (int64_t i = 0; i < s.rows; ++i) {
    if (tokens[i] < 0 || tokens[i] >= s.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": token ", tokens[i], " at index ", i,
                                                     " is outside [0, vocab_size=", s.vocab_size,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status EmbeddingForward(const EmbeddingShape& shape, absl::Span<const int32_t> tokens,
                              absl::Span<const T> wte, absl::Span<T> out, ThreadPool* pool) {
  constexpr char kKernel[] = "EmbeddingForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape, tokens));
  const int64_t N = shape.rows, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "wte", wte, shape.vocab_size * C, "V*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, N * C, "rows*C"));
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t r = task * grain; r < end; ++r) {
      const T* row = wte.data() + static_cast<int64_t>(tokens[r]) * C;
      std::copy(row, row + C, out.data() + r * C);
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status EmbeddingBackward(const EmbeddingShape& shape, absl::Span<const int32_t> tokens,
                               absl::Span<const T> dout, absl::Span<T> dwte, ThreadPool* pool) {
  constexpr char kKernel[] = "EmbeddingBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape, tokens));
  const int64_t N = shape.rows, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dout, N * C, "rows*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwte", dwte, shape.vocab_size * C, "V*C"));
  // Each task owns channels [c0, c1) of every row of dwte.
  ParallelFor(pool, NumTasks(C, kBackwardChannelsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kBackwardChannelsPerTask;
    const int64_t c1 = std::min(C, c0 + kBackwardChannelsPerTask);
    for (int64_t r = 0; r < N; ++r) {
      if (tokens[r] == shape.padding_idx) continue;
      const T* d = dout.data() + r * C;
      T* te = dwte.data() + static_cast<int64_t>(tokens[r]) * C;
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::simd::AddTo(d + c0, te + c0, c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c) te[c] += d[c];
      }
    }
  });
  return absl::OkStatus();
}

#define PS_EMBEDDING_INSTANTIATE_(T)                                                           \
  template absl::Status EmbeddingForward<T>(const EmbeddingShape&, absl::Span<const int32_t>,  \
                                            absl::Span<const T>, absl::Span<T>, ThreadPool*);  \
  template absl::Status EmbeddingBackward<T>(const EmbeddingShape&, absl::Span<const int32_t>, \
                                             absl::Span<const T>, absl::Span<T>, ThreadPool*)
PS_EMBEDDING_INSTANTIATE_(float);
PS_EMBEDDING_INSTANTIATE_(double);
#undef PS_EMBEDDING_INSTANTIATE_

}  // namespace ps
