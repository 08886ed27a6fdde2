#include "model/kernels/encoder.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "memory/convert.h"
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

absl::Status CheckShape(const char* kernel, const EncoderShape& s,
                        absl::Span<const int32_t> tokens) {
  RETURN_IF_ERROR(CheckPositive(kernel, "batch", s.batch));
  RETURN_IF_ERROR(CheckPositive(kernel, "seq_len", s.seq_len));
  RETURN_IF_ERROR(CheckPositive(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckPositive(kernel, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(CheckPositive(kernel, "max_seq_len", s.max_seq_len));
  if (s.seq_len > s.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": seq_len ", s.seq_len, " exceeds max_seq_len ", s.max_seq_len));
  }
  RETURN_IF_ERROR(CheckElems(kernel, "tokens", tokens, s.batch * s.seq_len, "B*T"));
  for (int64_t i = 0; i < static_cast<int64_t>(tokens.size()); ++i) {
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
absl::Status EncoderForward(const EncoderShape& shape, absl::Span<const int32_t> tokens,
                            absl::Span<const T> wte, absl::Span<const T> wpe, absl::Span<T> out,
                            ThreadPool* pool) {
  constexpr char kKernel[] = "EncoderForward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape, tokens));
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "wte", wte, shape.vocab_size * C, "V*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "wpe", wpe, shape.max_seq_len * C, "max_seq_len*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, B * L * C, "B*T*C"));
  const int64_t rows = B * L;
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(rows, grain), [&](int64_t task) {
    const int64_t end = std::min(rows, (task + 1) * grain);
    for (int64_t row = task * grain; row < end; ++row) {
      const T* te = wte.data() + static_cast<int64_t>(tokens[row]) * C;
      const T* pe = wpe.data() + (row % L) * C;
      T* o = out.data() + row * C;
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::simd::Add(te, pe, o, C);
      } else {
        for (int64_t c = 0; c < C; ++c) o[c] = te[c] + pe[c];
      }
    }
  });
  return absl::OkStatus();
}

absl::Status EncoderForwardBf16(const EncoderShape& shape, absl::Span<const int32_t> tokens,
                                absl::Span<const uint16_t> wte, absl::Span<const float> wpe,
                                absl::Span<float> out, ThreadPool* pool) {
  constexpr char kKernel[] = "EncoderForwardBf16";
  RETURN_IF_ERROR(CheckShape(kKernel, shape, tokens));
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "wte", wte, shape.vocab_size * C, "V*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "wpe", wpe, shape.max_seq_len * C, "max_seq_len*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, B * L * C, "B*T*C"));
  const int64_t rows = B * L;
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(rows, grain), [&](int64_t task) {
    const int64_t end = std::min(rows, (task + 1) * grain);
    for (int64_t row = task * grain; row < end; ++row) {
      float* o = out.data() + row * C;
      ConvertBF16ToF32(wte.data() + static_cast<int64_t>(tokens[row]) * C, o, C);
      kernels_internal::simd::Add(o, wpe.data() + (row % L) * C, o, C);
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status EncoderBackward(const EncoderShape& shape, absl::Span<const int32_t> tokens,
                             absl::Span<const T> dout, absl::Span<T> dwte, absl::Span<T> dwpe,
                             ThreadPool* pool) {
  constexpr char kKernel[] = "EncoderBackward";
  RETURN_IF_ERROR(CheckShape(kKernel, shape, tokens));
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dout, B * L * C, "B*T*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwte", dwte, shape.vocab_size * C, "V*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwpe", dwpe, shape.max_seq_len * C, "max_seq_len*C"));
  // Each task owns channels [c0, c1) of every row of dwte and dwpe.
  ParallelFor(pool, NumTasks(C, kBackwardChannelsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kBackwardChannelsPerTask;
    const int64_t c1 = std::min(C, c0 + kBackwardChannelsPerTask);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < L; ++t) {
        const int64_t row = b * L + t;
        const T* d = dout.data() + row * C;
        T* te = dwte.data() + static_cast<int64_t>(tokens[row]) * C;
        T* pe = dwpe.data() + t * C;
        if constexpr (std::is_same_v<T, float>) {
          kernels_internal::simd::AddTo(d + c0, te + c0, c1 - c0);
          kernels_internal::simd::AddTo(d + c0, pe + c0, c1 - c0);
        } else {
          for (int64_t c = c0; c < c1; ++c) {
            te[c] += d[c];
            pe[c] += d[c];
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

template absl::Status EncoderForward<float>(const EncoderShape&, absl::Span<const int32_t>,
                                            absl::Span<const float>, absl::Span<const float>,
                                            absl::Span<float>, ThreadPool*);
template absl::Status EncoderForward<double>(const EncoderShape&, absl::Span<const int32_t>,
                                             absl::Span<const double>, absl::Span<const double>,
                                             absl::Span<double>, ThreadPool*);
template absl::Status EncoderBackward<float>(const EncoderShape&, absl::Span<const int32_t>,
                                             absl::Span<const float>, absl::Span<float>,
                                             absl::Span<float>, ThreadPool*);
template absl::Status EncoderBackward<double>(const EncoderShape&, absl::Span<const int32_t>,
                                              absl::Span<const double>, absl::Span<double>,
                                              absl::Span<double>, ThreadPool*);

}  // namespace ps
