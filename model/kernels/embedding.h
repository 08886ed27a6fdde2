// Token embedding without position embedding (Llama/Qwen2/Mistral's embed_tokens, a
// torch.nn.Embedding): positions enter through RoPE inside attention instead
// (model/kernels/rope.h). GPT-2's token + learned position embedding is model/kernels/encoder.h.
//
// Math. For tokens x[r] in [0, V), r < N = B*T:
//   out[r, :] = wte[x[r], :]
//   dwte[v, :] += sum over r with x[r] == v (and v != padding_idx) of dout[r, :]
// padding_idx (nn.Embedding's; config.json's pad_token_id when the model passes it) receives no
// gradient, exactly as in PyTorch; -1 means none. When the LM head is tied to the embedding
// (tie_word_embeddings), the LM head's gradient (lm_head_cross_entropy.h) and this scatter add into
// the same dwte.
//
// The scatter is a reduction (tokens repeat); it is deterministic and race-free as in the encoder:
// each task owns a slice of channels and walks all rows in order.
//
// Layouts (row-major): tokens [N] int32, wte [V,C], out/dout [N,C]. Gradients accumulate (+=).
// Needs no workspace. f32 and f64 (f16/bf16 tables are converted by the caller). Thread safety:
// reentrant; buffers must not be written concurrently by others.
#ifndef PATRICKSTAR_MODEL_KERNELS_EMBEDDING_H_
#define PATRICKSTAR_MODEL_KERNELS_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps {

struct EmbeddingShape {
  int64_t rows = 0;          // N = B*T tokens
  int64_t channels = 0;      // C (hidden_size)
  int64_t vocab_size = 0;    // V, rows of wte
  int64_t padding_idx = -1;  // a token id in [0, V) whose row gets no gradient, or -1 for none
};

// Workspace the embedding needs: none.
inline int64_t EmbeddingWorkspaceBytes(const EmbeddingShape&) { return 0; }

// out = wte[tokens]. InvalidArgument for a bad shape, a buffer of the wrong size or a token outside
// [0, V) (naming its index). `pool` may be null.
template <typename T>
[[nodiscard]] absl::Status EmbeddingForward(const EmbeddingShape& shape,
                                            absl::Span<const int32_t> tokens,
                                            absl::Span<const T> wte, absl::Span<T> out,
                                            ThreadPool* pool);

// dwte += scatter(dout by token), skipping padding_idx. Same checks as forward.
template <typename T>
[[nodiscard]] absl::Status EmbeddingBackward(const EmbeddingShape& shape,
                                             absl::Span<const int32_t> tokens,
                                             absl::Span<const T> dout, absl::Span<T> dwte,
                                             ThreadPool* pool);

#define PS_EMBEDDING_EXTERN_(T)                                                                    \
  extern template absl::Status EmbeddingForward<T>(const EmbeddingShape&,                          \
                                                   absl::Span<const int32_t>, absl::Span<const T>, \
                                                   absl::Span<T>, ThreadPool*);                    \
  extern template absl::Status EmbeddingBackward<T>(                                               \
      const EmbeddingShape&, absl::Span<const int32_t>, absl::Span<const T>, absl::Span<T>,        \
      ThreadPool*)
PS_EMBEDDING_EXTERN_(float);
PS_EMBEDDING_EXTERN_(double);
#undef PS_EMBEDDING_EXTERN_

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_EMBEDDING_H_
