// The GPT-2 input encoder: token embedding plus learned position embedding.
//
// Math. For tokens x[b,t] in [0, V) and positions t in [0, T):
//   out[b,t,:] = wte[x[b,t], :] + wpe[t, :]
// (Hugging Face GPT2Model with default position ids 0..T-1; no dropout.) The map is linear in the
// two tables, so the backward pass scatters the output gradient back to the rows that were read:
//   dwte[v, :] += sum over (b,t) with x[b,t] == v of dout[b,t,:]
//   dwpe[t, :] += sum over b of dout[b,t,:]
// Several (b,t) may hit the same vocabulary row, so the scatter is a reduction. It is made
// deterministic and race-free by giving each task a slice of channels: the task walks all (b,t) in
// order and adds into its own slice of every row, so no two tasks write the same element and the
// summation order is fixed.
//
// Layouts (row-major): tokens [B,T] int32, wte [V,C], wpe [max_T,C], out/dout [B,T,C].
// Gradients accumulate (+=): callers zero them before the first micro-batch.
// Needs no workspace. Thread safety: the functions are reentrant; buffers must not be written
// concurrently by others.
#ifndef PATRICKSTAR_MODEL_KERNELS_ENCODER_H_
#define PATRICKSTAR_MODEL_KERNELS_ENCODER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct EncoderShape {
  int64_t batch = 0;        // B
  int64_t seq_len = 0;      // T; REQUIRES: T <= max_seq_len
  int64_t channels = 0;     // C
  int64_t vocab_size = 0;   // V, rows of wte
  int64_t max_seq_len = 0;  // rows of wpe (n_positions)
};

// Workspace the encoder needs: none.
inline int64_t EncoderWorkspaceBytes(const EncoderShape&) { return 0; }

// out = wte[tokens] + wpe[0..T). InvalidArgument for a bad shape, a buffer of the wrong size or a
// token outside [0, V). `pool` may be null (run on the calling thread).
template <typename T>
[[nodiscard]] absl::Status EncoderForward(const EncoderShape& shape,
                                          absl::Span<const int32_t> tokens, absl::Span<const T> wte,
                                          absl::Span<const T> wpe, absl::Span<T> out,
                                          ThreadPool* pool);

// dwte += scatter(dout by token), dwpe[0..T) += sum over batch of dout. Same checks as forward.
// EncoderForward with wte as bf16 bit patterns (a bf16 param chunk, read in place): each row read
// is widened to f32 (exactly) into `out` before wpe is added, so the result is bit-identical to
// EncoderForward<float> on the widened table, without converting the whole table.
[[nodiscard]] absl::Status EncoderForwardBf16(const EncoderShape& shape,
                                              absl::Span<const int32_t> tokens,
                                              absl::Span<const uint16_t> wte,
                                              absl::Span<const float> wpe, absl::Span<float> out,
                                              ThreadPool* pool);

template <typename T>
[[nodiscard]] absl::Status EncoderBackward(const EncoderShape& shape,
                                           absl::Span<const int32_t> tokens,
                                           absl::Span<const T> dout, absl::Span<T> dwte,
                                           absl::Span<T> dwpe, ThreadPool* pool);

extern template absl::Status EncoderForward<float>(const EncoderShape&, absl::Span<const int32_t>,
                                                   absl::Span<const float>, absl::Span<const float>,
                                                   absl::Span<float>, ThreadPool*);
extern template absl::Status EncoderForward<double>(const EncoderShape&, absl::Span<const int32_t>,
                                                    absl::Span<const double>,
                                                    absl::Span<const double>, absl::Span<double>,
                                                    ThreadPool*);
extern template absl::Status EncoderBackward<float>(const EncoderShape&, absl::Span<const int32_t>,
                                                    absl::Span<const float>, absl::Span<float>,
                                                    absl::Span<float>, ThreadPool*);
extern template absl::Status EncoderBackward<double>(const EncoderShape&, absl::Span<const int32_t>,
                                                     absl::Span<const double>, absl::Span<double>,
                                                     absl::Span<double>, ThreadPool*);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_ENCODER_H_
