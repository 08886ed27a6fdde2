// The vocabulary matrix of a language model ([V, C]: GPT-2's tied wte, Llama's embed_tokens and
// lm_head) used one block of rows at a time, so that a model can keep it in chunk-sized row blocks
// (model/gpt_config.h, GptLayoutOptions) and no operator ever needs the whole [V, C] matrix, or a
// [V, C] gradient, at once. Block k holds rows [row_begin, row_begin + block_rows).
//
// Token embedding (every use of the matrix is row-separable):
//   EmbeddingBlockForward   out[n, :] = block[tokens[n] - row_begin, :] for the tokens in the
//                           block (the rows of other blocks are left alone: after every block,
//                           each row holds its token's row)
//   ScatterRowsAdd          rows[slot(tokens[n]), :] += dout[n, :] for the tokens in a set,
//                           in increasing n — the embedding's gradient, accumulated into a
//                           buffer of the rows the batch touches (see below)
//   PositionEmbeddingForward / Backward   GPT-2's learned positions: out[b, t, :] += wpe[t, :]
//                           (after the token rows: the same sum as EncoderForward's);
//                           dwpe[t, :] += sum over b of dout[b, t, :] (in increasing b); with
//                           per-token positions p(b, t), wpe[p(b, t)] and dwpe[p(b, t)] instead
//
// LM head and cross-entropy (model/kernels/lm_head_cross_entropy.h's math, whose loops run over
// [row_tile, vocab_tile] logits tiles): the online softmax state of every row (running max,
// running sum of exp, the target's logit) lives in a caller's buffer across blocks:
//   LmHeadStateInit, then LmHeadBlockForward for every block in increasing row order, then
//   LmHeadFinish (lse[n] and the mean loss); backward: LmHeadBlockBackward for every block in
//   increasing row order, which adds the block's part of dh and hands each vocabulary tile's
//   d(block) to a callback as soon as it is complete.
// Bit-identity. When every block but the last has a multiple of vocab_tile rows, the tiles are
// exactly those of the unsplit kernel (tile boundaries at multiples of vocab_tile from row 0), and
// every output element gets the same operations in the same order: the logits tile is the same
// GEMM, each row's softmax state is updated tile by tile in increasing vocabulary order, dh's
// rows receive their tiles' GEMMs in increasing vocabulary order, and each vocabulary tile's
// gradient sums the row tiles in increasing order. So losses, lse, dh and d(wte) equal
// LmHeadCrossEntropyForward/Backward bit for bit (tested), whatever the block size. Blocks not
// aligned that way are refused (InvalidArgument), so a layout can never change results.
//
// Storage. A block may be f32/f64 (T) or, for T = float, f16/bf16 (`Block16`). f16 rows are
// widened tile by tile into the workspace (exactly, as a whole-matrix conversion would) and
// multiplied in f32. bf16 blocks run the GEMMs as bf16 x bf16 with f32 accumulation
// (internal/bf16_gemm.h, --bf16_gemm): h rounded to bf16 once per call, the block's rows used in
// place, each dlogits tile rounded to bf16 before the two gradient GEMMs — exactly the calls of
// LmHeadCrossEntropy{Forward,Backward}Bf16, so bf16 blocks equal those kernels on the whole bf16
// matrix bit for bit (and the same bits for any pool size). A 16-bit block never needs an f32
// copy of itself: the workspace is a few tiles plus h in bf16.
//
// Tied weights. The LM head's d(wte) and the embedding's are added before the one write into the
// gradient slot (model/gpt_model.h): rows the batch touches keep the LM head's f32 part in a
// buffer of |unique tokens| x C (ScatterRowsAdd adds the embedding's part in the same order as
// EncoderBackward), so 16-bit gradients are rounded once, exactly as when both parts were summed
// in one [V, C] f32 buffer.
//
// Threading as the other kernels: fixed task splits, results independent of the pool.
// Thread safety: reentrant.
#ifndef PATRICKSTAR_MODEL_KERNELS_VOCAB_BLOCKS_H_
#define PATRICKSTAR_MODEL_KERNELS_VOCAB_BLOCKS_H_

#include <algorithm>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "memory/dtype.h"

namespace ps {

struct VocabBlockShape {
  int64_t rows = 0;        // N = B*T positions (tokens)
  int64_t channels = 0;    // C
  int64_t vocab_size = 0;  // V, rows of the whole matrix
  // The block: rows [row_begin, row_begin + block_rows) of the matrix.
  int64_t row_begin = 0;
  int64_t block_rows = 0;
  // LM head tiles (lm_head_cross_entropy.h): row_begin must be a multiple of vocab_tile.
  int64_t row_tile = 256;
  int64_t vocab_tile = 2048;
  int32_t ignore_index = -100;
};

// A 16-bit block: `data` holds block_rows x C elements of `dtype` (kF16 or kBF16).
struct Block16 {
  const uint16_t* data = nullptr;
  DType dtype = DType::kBF16;
};

// --- Embedding ---------------------------------------------------------------------------------

// out[n, :] = block[tokens[n] - row_begin, :] for every n whose token is in the block (16-bit rows
// widened exactly).
// InvalidArgument for a bad shape or buffer size or a token outside [0, V). `pool` may be null.
template <typename T>
[[nodiscard]] absl::Status EmbeddingBlockForward(const VocabBlockShape& shape,
                                                 absl::Span<const int32_t> tokens,
                                                 absl::Span<const T> block, absl::Span<T> out,
                                                 ThreadPool* pool);
[[nodiscard]] absl::Status EmbeddingBlockForward(const VocabBlockShape& shape,
                                                 absl::Span<const int32_t> tokens, Block16 block,
                                                 absl::Span<float> out, ThreadPool* pool);

// rows[slot_of_token[tokens[n]], :] += dout[n, :] for every n (increasing) whose token has a slot
// (slot_of_token[token] >= 0); rows is [num slots, C]. Each task owns a slice of channels and
// walks the tokens in order, as EncoderBackward does, so every element receives its additions in
// the same order. InvalidArgument for sizes that do not match or a slot outside rows.
template <typename T>
[[nodiscard]] absl::Status ScatterRowsAdd(int64_t channels, absl::Span<const int32_t> tokens,
                                          absl::Span<const int32_t> slot_of_token,
                                          absl::Span<const T> dout, absl::Span<T> rows,
                                          ThreadPool* pool);

// out[b, t, :] += wpe[p(b, t), :] for out [B, T, C], wpe [max_T, C] (T <= max_T), where
// p(b, t) = positions[b*T + t], or t when `positions` is empty (packed rows restart their
// positions at every document). InvalidArgument naming the first (b, t) whose position is
// outside [0, max_T).
template <typename T>
[[nodiscard]] absl::Status PositionEmbeddingForward(int64_t batch, int64_t seq_len,
                                                    int64_t channels, absl::Span<const T> wpe,
                                                    absl::Span<T> out, ThreadPool* pool,
                                                    absl::Span<const int32_t> positions = {});
// dwpe[p(b, t), :] += dout[b, t, :] for (b, t) in increasing b, then t — so each row of dwpe
// receives its additions in one fixed order (for empty positions: b = 0, 1, ...).
template <typename T>
[[nodiscard]] absl::Status PositionEmbeddingBackward(int64_t batch, int64_t seq_len,
                                                     int64_t channels, absl::Span<const T> dout,
                                                     absl::Span<T> dwpe, ThreadPool* pool,
                                                     absl::Span<const int32_t> positions = {});

// --- LM head and cross-entropy ----------------------------------------------------------------

// Elements of the per-row state (running max, running sum, target logit): 3 N.
inline int64_t LmHeadStateElems(const VocabBlockShape& s) { return 3 * s.rows; }
// Sets the state of every row to "no tile seen yet". REQUIRES: state holds LmHeadStateElems.
template <typename T>
void LmHeadStateInit(absl::Span<T> state);

namespace vocab_blocks_internal {
// `elems` rounded up to a multiple of 16 (64 bytes of f32).
inline int64_t AlignF32Elems(int64_t elems) { return (elems + 15) / 16 * 16; }
// f32 elements that hold `bf16_elems` bf16 values, rounded up to 64 bytes.
inline int64_t Bf16AsF32Elems(int64_t bf16_elems) { return AlignF32Elems((bf16_elems + 1) / 2); }
}  // namespace vocab_blocks_internal
// Workspace elements the forward needs: one logits tile, plus (16-bit blocks) the larger of one
// widened vocabulary tile (f16) and h rounded to bf16 (bf16).
inline int64_t LmHeadBlockForwardWorkspaceElems(const VocabBlockShape& s, bool sixteen_bit) {
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.block_rows, s.vocab_tile);
  if (!sixteen_bit) return r * v;
  return vocab_blocks_internal::AlignF32Elems(r * v) +
         std::max(v * s.channels, vocab_blocks_internal::Bf16AsF32Elems(s.rows * s.channels));
}
// The backward: one logits tile and one vocabulary tile's gradient, plus (16-bit blocks) the
// larger of one widened vocabulary tile (f16) and h, a dz tile and its transpose in bf16 (bf16).
inline int64_t LmHeadBlockBackwardWorkspaceElems(const VocabBlockShape& s, bool sixteen_bit) {
  using vocab_blocks_internal::AlignF32Elems;
  using vocab_blocks_internal::Bf16AsF32Elems;
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.block_rows, s.vocab_tile);
  if (!sixteen_bit) return r * v + v * s.channels;
  return AlignF32Elems(r * v + v * s.channels) +
         std::max(v * s.channels, Bf16AsF32Elems(s.rows * s.channels) + 2 * Bf16AsF32Elems(r * v));
}

// Updates the state with the block's logits h block^T. h [N, C], targets [N] in [0, V) or
// ignore_index, state from LmHeadStateInit (earlier blocks applied). InvalidArgument for a bad
// shape, buffer size, target, or a row_begin that is not a multiple of vocab_tile.
// bf16 blocks: also the errors of ResolveBf16GemmBackend (FailedPrecondition for
// --bf16_gemm=onednn on a CPU without native bf16 GEMMs), before anything is written, and
// Internal if oneDNN fails.
template <typename T>
[[nodiscard]] absl::Status LmHeadBlockForward(const VocabBlockShape& shape, absl::Span<const T> h,
                                              absl::Span<const T> block,
                                              absl::Span<const int32_t> targets,
                                              absl::Span<T> state, absl::Span<T> workspace,
                                              ThreadPool* pool);
[[nodiscard]] absl::Status LmHeadBlockForward(const VocabBlockShape& shape,
                                              absl::Span<const float> h, Block16 block,
                                              absl::Span<const int32_t> targets,
                                              absl::Span<float> state, absl::Span<float> workspace,
                                              ThreadPool* pool);

// After every block: lse[n] and the mean cross-entropy over the valid targets (0 if none), summed
// in double in row order (as LmHeadCrossEntropyForward). `shape` needs rows and ignore_index.
template <typename T>
[[nodiscard]] absl::StatusOr<double> LmHeadFinish(const VocabBlockShape& shape,
                                                  absl::Span<const int32_t> targets,
                                                  absl::Span<const T> state, absl::Span<T> lse);

// Receives d(block) rows [v0, v0 + rows) (global row numbers), [rows, C] row-major, complete.
template <typename T>
using VocabTileGradFn = absl::FunctionRef<absl::Status(int64_t v0, int64_t rows, const T* grad)>;

// dh += dloss/dh * loss_grad for this block's part of the vocabulary, and the block's gradient
// dloss/dblock * loss_grad handed over tile by tile (`on_tile`, in increasing row order). lse from
// LmHeadFinish. Errors as the forward, and those `on_tile` returns.
template <typename T>
[[nodiscard]] absl::Status LmHeadBlockBackward(const VocabBlockShape& shape, absl::Span<const T> h,
                                               absl::Span<const T> block,
                                               absl::Span<const int32_t> targets,
                                               absl::Span<const T> lse, double loss_grad,
                                               absl::Span<T> dh, absl::Span<T> workspace,
                                               VocabTileGradFn<T> on_tile, ThreadPool* pool);
[[nodiscard]] absl::Status LmHeadBlockBackward(const VocabBlockShape& shape,
                                               absl::Span<const float> h, Block16 block,
                                               absl::Span<const int32_t> targets,
                                               absl::Span<const float> lse, double loss_grad,
                                               absl::Span<float> dh, absl::Span<float> workspace,
                                               VocabTileGradFn<float> on_tile, ThreadPool* pool);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_KERNELS_VOCAB_BLOCKS_H_
