#include "model/kernels/vocab_blocks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "memory/convert.h"
#include "model/kernels/cross_entropy_math.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/logit_tiles.h"
#include "model/kernels/internal/simd.h"
#include "model/kernels/softmax_math.h"

namespace ps {
namespace {

using kernels_internal::Bf16GemmBackend;
using kernels_internal::CheckBlasDim;
using kernels_internal::CheckElems;
using kernels_internal::CheckPositive;
using kernels_internal::CheckWorkspace;
using kernels_internal::FallbackScratch;
using kernels_internal::FallbackTileGrads;
using kernels_internal::FallbackTileLogits;
using kernels_internal::Gemm;
using kernels_internal::GemmBf16;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::ResolveBf16GemmBackend;
using kernels_internal::RoundToBf16;
using kernels_internal::RoundToBf16Transposed;
using kernels_internal::RoundToBf16Values;
using kernels_internal::RowsPerTask;
using kernels_internal::WidenBf16;

// Channels per task of the scatters: enough to amortize the walk over the tokens.
constexpr int64_t kChannelsPerTask = 64;

absl::Status CheckBlock(const char* kernel, const VocabBlockShape& s) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "block_rows", s.block_rows));
  if (s.row_begin < 0 || s.row_begin + s.block_rows > s.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": block rows [", s.row_begin, ", ", s.row_begin + s.block_rows,
                     ") are not inside [0, vocab_size=", s.vocab_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckTokens(const char* kernel, absl::string_view what,
                         absl::Span<const int32_t> tokens, int64_t vocab_size,
                         std::optional<int32_t> ignore_index) {
  for (int64_t n = 0; n < static_cast<int64_t>(tokens.size()); ++n) {
    const int32_t t = tokens[n];
    if (ignore_index.has_value() && t == *ignore_index) continue;
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          kernel, ": ", what, " ", t, " at row ", n, " is outside [0, vocab_size=", vocab_size, ")",
          ignore_index.has_value() ? absl::StrCat(" and is not ignore_index ", *ignore_index)
                                   : std::string()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLmHead(const char* kernel, const VocabBlockShape& s,
                         absl::Span<const int32_t> targets, int64_t h_elems, int64_t block_elems,
                         int64_t workspace_elems, int64_t needed_workspace_elems) {
  RETURN_IF_ERROR(CheckBlock(kernel, s));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "row_tile", s.row_tile));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "vocab_tile", s.vocab_tile));
  if (s.row_begin % s.vocab_tile != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": the block starts at row ", s.row_begin, ", not a multiple of vocab_tile ",
        s.vocab_tile,
        "; blocks must hold whole vocabulary tiles (all but the last block a multiple of "
        "vocab_tile rows) so that the tiles, and the results, are those of the whole matrix"));
  }
  if (h_elems != s.rows * s.channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": h has ", h_elems, " elements, expected rows*channels = ", s.rows * s.channels));
  }
  if (block_elems != s.block_rows * s.channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": the block has ", block_elems,
                     " elements, expected block_rows*channels = ", s.block_rows * s.channels));
  }
  RETURN_IF_ERROR(CheckElems(kernel, "targets", targets, s.rows, "rows"));
  if (workspace_elems < needed_workspace_elems) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": workspace has ", workspace_elems,
                                                   " elements, needs ", needed_workspace_elems));
  }
  return CheckTokens(kernel, "target", targets, s.vocab_size, s.ignore_index);
}

// The GEMMs of one vocabulary tile (rows [v0, v0 + Vt) of the block, `local_row` = v0 - row_begin),
// behind one interface so that the f32/f64/f16 and the bf16 blocks share the tiling and the
// softmax code (as lm_head_cross_entropy.cc's BlasGemms / Bf16Gemms):
//   BeginTile: makes the tile's weight rows available;
//   Logits:    z[R, Vt] = h[r0:r0+R] w^T, packed with row stride Vt;
//   Grads:     dh[r0:r0+R] += dz w;  dw[Vt, C] += dz^T h[r0:r0+R].
// f32/f64 blocks: the rows themselves; f16 blocks: the tile widened exactly into `scratch`.
// Both run OpenBLAS in T.
template <typename T>
struct BlasTileGemms {
  const T* h;
  const T* block;   // T blocks, or null
  Block16 block16;  // f16 (or, for tests of the widened path, bf16) blocks
  int64_t C;
  T* scratch;            // Vt * C elements (16-bit blocks)
  ThreadPool* pool;      // runs the GEMM grid (internal/blas.h)
  const T* w = nullptr;  // the current tile's rows
  absl::Status BeginTile(int64_t local_row, int64_t Vt) {
    if (block != nullptr) {
      w = block + local_row * C;
      return absl::OkStatus();
    }
    if constexpr (std::is_same_v<T, float>) {
      RETURN_IF_ERROR(
          Convert(block16.dtype, block16.data + local_row * C, DType::kF32, scratch, Vt * C));
      w = scratch;
      return absl::OkStatus();
    }
    return absl::InternalError("BlasTileGemms: 16-bit block for a non-f32 kernel");
  }
  absl::Status Logits(int64_t r0, int64_t R, int64_t Vt, T* z) const {
    Gemm(false, true, R, Vt, C, T{1}, h + r0 * C, C, w, C, T{0}, z, Vt, pool);
    return absl::OkStatus();
  }
  absl::Status Grads(int64_t r0, int64_t R, int64_t Vt, const T* dz, T* dh, T* dw) const {
    Gemm(false, false, R, C, Vt, T{1}, dz, Vt, w, C, T{1}, dh + r0 * C, C, pool);
    Gemm(true, false, Vt, C, R, T{1}, dz, Vt, h + r0 * C, C, T{1}, dw, C, pool);
    return absl::OkStatus();
  }
};

// bf16 blocks: bf16 x bf16 GEMMs with f32 accumulation (internal/bf16_gemm.h), exactly the calls
// of LmHeadCrossEntropy*Bf16 for the same tile: h rounded to bf16 once per call (hb), the block's
// rows used in place, dz rounded to bf16 per tile as dzb [R, Vt] for dh and transposed as dzbt
// [Vt, R] for dw (plain layouts for oneDNN).
struct Bf16TileGemms {
  const uint16_t* hb;
  const uint16_t* block;
  int64_t C;
  uint16_t* dzb;   // R * Vt values
  uint16_t* dzbt;  // the same, transposed
  ThreadPool* pool;
  const uint16_t* w = nullptr;
  absl::Status BeginTile(int64_t local_row, int64_t) {
    w = block + local_row * C;
    return absl::OkStatus();
  }
  absl::Status Logits(int64_t r0, int64_t R, int64_t Vt, float* z) const {
    return GemmBf16({.trans_b = true,
                     .m = R,
                     .n = Vt,
                     .k = C,
                     .a = hb + r0 * C,
                     .lda = C,
                     .b = w,
                     .ldb = C,
                     .c = z,
                     .ldc = Vt},
                    pool);
  }
  absl::Status Grads(int64_t r0, int64_t R, int64_t Vt, const float* dz, float* dh,
                     float* dw) const {
    RoundToBf16(dz, dzb, R * Vt, pool);
    RoundToBf16Transposed(dz, R, Vt, dzbt, pool);
    RETURN_IF_ERROR(GemmBf16({.m = R,
                              .n = C,
                              .k = Vt,
                              .a = dzb,
                              .lda = Vt,
                              .b = w,
                              .ldb = C,
                              .accumulate = true,
                              .c = dh + r0 * C,
                              .ldc = C},
                             pool));
    return GemmBf16({.m = Vt,
                     .n = C,
                     .k = R,
                     .a = dzbt,
                     .lda = R,
                     .b = hb + r0 * C,
                     .ldb = C,
                     .accumulate = true,
                     .c = dw,
                     .ldc = C},
                    pool);
  }
};

// The fallback of Bf16TileGemms (no native bf16 GEMM on this CPU, internal/bf16_gemm.h): the same
// products through sgemm on f32 operands that hold bf16 values: h rounded once per call (hr), the
// tile's rows widened once per tile (wf, for its logits and its gradients), dz rounded per tile
// (dzr); sgemm reads the transposes itself (no transposed copies, no bf16 round trips).
struct Bf16FallbackTileGemms {
  const float* hr;  // rows * C
  const uint16_t* block;
  int64_t C;
  float* wf;   // vocab_tile * C
  float* dzr;  // row_tile * vocab_tile
  ThreadPool* pool;
  absl::Status BeginTile(int64_t local_row, int64_t Vt) {
    WidenBf16(block + local_row * C, wf, Vt * C, pool);
    return absl::OkStatus();
  }
  absl::Status Logits(int64_t r0, int64_t R, int64_t Vt, float* z) const {
    FallbackTileLogits(hr + r0 * C, wf, R, Vt, C, z, pool);
    return absl::OkStatus();
  }
  absl::Status Grads(int64_t r0, int64_t R, int64_t Vt, const float* dz, float* dh,
                     float* dw) const {
    FallbackTileGrads(hr + r0 * C, wf, dz, dzr, R, Vt, C, dh + r0 * C, dw, pool);
    return absl::OkStatus();
  }
};

// Bf16FallbackTileGemms over the thread's fallback scratch (internal/bf16_gemm.h), h rounded in.
Bf16FallbackTileGemms MakeBf16FallbackTileGemms(const VocabBlockShape& s, const float* h,
                                                const uint16_t* block, ThreadPool* pool) {
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.block_rows, s.vocab_tile);
  float* hr = FallbackScratch(0, s.rows * s.channels);
  RoundToBf16Values(h, hr, s.rows * s.channels, pool);
  return Bf16FallbackTileGemms{
      hr, block, s.channels, FallbackScratch(1, v * s.channels), FallbackScratch(2, r * v), pool};
}

// Where the bf16 path's buffers lie in a 16-bit workspace: after `f32_elems` f32 elements, hb
// (N * C values), then (backward) dzb and dzbt, each 64-byte aligned as in the header's sizes.
struct Bf16Buffers {
  uint16_t* hb;
  uint16_t* dzb;
  uint16_t* dzbt;
};
Bf16Buffers Bf16BuffersAt(const VocabBlockShape& s, float* workspace, int64_t f32_elems) {
  using vocab_blocks_internal::Bf16AsF32Elems;
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.block_rows, s.vocab_tile);
  float* base = workspace + f32_elems;
  float* dzb = base + Bf16AsF32Elems(s.rows * s.channels);
  return {reinterpret_cast<uint16_t*>(base), reinterpret_cast<uint16_t*>(dzb),
          reinterpret_cast<uint16_t*>(dzb + Bf16AsF32Elems(r * v))};
}

template <typename T, typename Gemms>
absl::Status LmHeadForwardImpl(const VocabBlockShape& s, Gemms& gemms,
                               absl::Span<const int32_t> targets, absl::Span<T> state, T* workspace,
                               ThreadPool* pool) {
  const int64_t N = s.rows;
  const int64_t row_tile = std::min(N, s.row_tile);
  const int64_t vocab_tile = std::min(s.vocab_size, s.vocab_tile);
  const int64_t row_end = s.row_begin + s.block_rows;
  T* z = workspace;
  T* run_max = state.data();
  T* run_sum = run_max + N;
  T* target_logit = run_sum + N;
  for (int64_t v0 = s.row_begin; v0 < row_end; v0 += vocab_tile) {
    const int64_t Vt = std::min(vocab_tile, row_end - v0);
    RETURN_IF_ERROR(gemms.BeginTile(v0 - s.row_begin, Vt));
    for (int64_t r0 = 0; r0 < N; r0 += row_tile) {
      const int64_t R = std::min(row_tile, N - r0);
      RETURN_IF_ERROR(gemms.Logits(r0, R, Vt, z));
      kernels_internal::SoftmaxTile(targets.data() + r0, R, v0, Vt, z, run_max + r0, run_sum + r0,
                                    target_logit + r0, pool);
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Gemms>
absl::Status LmHeadBackwardImpl(const VocabBlockShape& s, Gemms& gemms,
                                absl::Span<const int32_t> targets, const T* lse, double loss_grad,
                                T* dh, T* workspace, VocabTileGradFn<T> on_tile, ThreadPool* pool) {
  const int64_t N = s.rows, C = s.channels;
  const int64_t row_tile = std::min(N, s.row_tile);
  const int64_t vocab_tile = std::min(s.vocab_size, s.vocab_tile);
  const int64_t row_end = s.row_begin + s.block_rows;
  const int64_t block_tile = std::min(s.block_rows, vocab_tile);
  T* dz = workspace;
  T* dw = dz + row_tile * block_tile;
  int64_t num_valid = 0;
  for (int64_t n = 0; n < N; ++n) num_valid += targets[n] != s.ignore_index;
  // With no valid target the loss is the constant 0: every gradient is zero.
  const T scale =
      num_valid == 0 ? T{0} : static_cast<T>(loss_grad / static_cast<double>(num_valid));
  for (int64_t v0 = s.row_begin; v0 < row_end; v0 += vocab_tile) {
    const int64_t Vt = std::min(vocab_tile, row_end - v0);
    std::fill(dw, dw + Vt * C, T{0});
    if (num_valid > 0) {
      RETURN_IF_ERROR(gemms.BeginTile(v0 - s.row_begin, Vt));
      for (int64_t r0 = 0; r0 < N; r0 += row_tile) {
        const int64_t R = std::min(row_tile, N - r0);
        bool any_valid = false;
        for (int64_t i = 0; i < R; ++i) any_valid |= targets[r0 + i] != s.ignore_index;
        if (!any_valid) continue;
        RETURN_IF_ERROR(gemms.Logits(r0, R, Vt, dz));
        // dz = scale * (softmax - onehot), in place over the logits tile.
        kernels_internal::LogitGradTile(targets.data() + r0, lse + r0, s.ignore_index, scale, R, v0,
                                        Vt, dz, pool);
        // dh[r0:r0+R] += dz w;  dw += dz^T h[r0:r0+R].
        RETURN_IF_ERROR(gemms.Grads(r0, R, Vt, dz, dh, dw));
      }
    }
    RETURN_IF_ERROR(on_tile(v0, Vt, dw));
  }
  return absl::OkStatus();
}

// out[n, :] = row of tokens[n] for the block's tokens; `copy_row(local_row, dst)` writes one row.
template <typename T, typename CopyRow>
absl::Status EmbeddingForwardImpl(const VocabBlockShape& s, absl::Span<const int32_t> tokens,
                                  const CopyRow& copy_row, absl::Span<T> out, ThreadPool* pool) {
  const int64_t N = s.rows, C = s.channels;
  const int64_t row_end = s.row_begin + s.block_rows;
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
    const int64_t end = std::min(N, (task + 1) * grain);
    for (int64_t n = task * grain; n < end; ++n) {
      const int64_t t = tokens[n];
      if (t < s.row_begin || t >= row_end) continue;
      copy_row(t - s.row_begin, out.data() + n * C);
    }
  });
  return absl::OkStatus();
}

// Per-token positions of the learned position embedding: empty, or [B*T] within [0, rows).
absl::Status CheckPositionIds(const char* kernel, int64_t batch, int64_t seq_len, int64_t rows,
                              absl::Span<const int32_t> positions) {
  if (positions.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(positions.size()) != batch * seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": positions has ", positions.size(),
                                                   " elements, expected B*T = ", batch * seq_len,
                                                   " (or none for positions 0 .. T-1)"));
  }
  for (int64_t i = 0; i < batch * seq_len; ++i) {
    if (positions[i] < 0 || positions[i] >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(kernel, ": positions[b=", i / seq_len, ", t=", i % seq_len,
                       "] = ", positions[i], " is outside the position table's [0, ", rows, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// --- Embedding ---------------------------------------------------------------------------------

template <typename T>
absl::Status EmbeddingBlockForward(const VocabBlockShape& shape, absl::Span<const int32_t> tokens,
                                   absl::Span<const T> block, absl::Span<T> out, ThreadPool* pool) {
  constexpr char kKernel[] = "EmbeddingBlockForward";
  RETURN_IF_ERROR(CheckBlock(kKernel, shape));
  const int64_t C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "tokens", tokens, shape.rows, "rows"));
  RETURN_IF_ERROR(CheckElems(kKernel, "block", block, shape.block_rows * C, "block_rows*C"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, shape.rows * C, "rows*C"));
  RETURN_IF_ERROR(CheckTokens(kKernel, "token", tokens, shape.vocab_size, std::nullopt));
  return EmbeddingForwardImpl<T>(
      shape, tokens,
      [&](int64_t local_row, T* dst) {
        std::memcpy(dst, block.data() + local_row * C, static_cast<size_t>(C) * sizeof(T));
      },
      out, pool);
}

absl::Status EmbeddingBlockForward(const VocabBlockShape& shape, absl::Span<const int32_t> tokens,
                                   Block16 block, absl::Span<float> out, ThreadPool* pool) {
  constexpr char kKernel[] = "EmbeddingBlockForward";
  RETURN_IF_ERROR(CheckBlock(kKernel, shape));
  const int64_t C = shape.channels;
  if (block.data == nullptr || (block.dtype != DType::kF16 && block.dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kKernel, ": a 16-bit block needs data and dtype f16 or bf16"));
  }
  RETURN_IF_ERROR(CheckElems(kKernel, "tokens", tokens, shape.rows, "rows"));
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, shape.rows * C, "rows*C"));
  RETURN_IF_ERROR(CheckTokens(kKernel, "token", tokens, shape.vocab_size, std::nullopt));
  return EmbeddingForwardImpl<float>(
      shape, tokens,
      [&](int64_t local_row, float* dst) {
        // Convert cannot fail for these dtypes and sizes (checked above).
        (void)Convert(block.dtype, block.data + local_row * C, DType::kF32, dst, C);
      },
      out, pool);
}

template <typename T>
absl::Status ScatterRowsAdd(int64_t channels, absl::Span<const int32_t> tokens,
                            absl::Span<const int32_t> slot_of_token, absl::Span<const T> dout,
                            absl::Span<T> rows, ThreadPool* pool) {
  constexpr char kKernel[] = "ScatterRowsAdd";
  RETURN_IF_ERROR(CheckPositive(kKernel, "channels", channels));
  const int64_t N = static_cast<int64_t>(tokens.size()), C = channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dout, N * C, "tokens*channels"));
  if (static_cast<int64_t>(rows.size()) % C != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": rows has ", rows.size(),
                                                   " elements, not a multiple of channels ", C));
  }
  const int64_t num_slots = static_cast<int64_t>(rows.size()) / C;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = tokens[n];
    if (t < 0 || t >= static_cast<int64_t>(slot_of_token.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kKernel, ": token ", t, " at row ", n, " is outside [0, ", slot_of_token.size(), ")"));
    }
    if (slot_of_token[t] >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          kKernel, ": token ", t, " has slot ", slot_of_token[t], " but rows holds ", num_slots));
    }
  }
  ParallelFor(pool, NumTasks(C, kChannelsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kChannelsPerTask;
    const int64_t c1 = std::min(C, c0 + kChannelsPerTask);
    for (int64_t n = 0; n < N; ++n) {
      const int32_t slot = slot_of_token[tokens[n]];
      if (slot < 0) continue;
      const T* d = dout.data() + n * C;
      T* r = rows.data() + static_cast<int64_t>(slot) * C;
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::simd::AddTo(d + c0, r + c0, c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c) r[c] += d[c];
      }
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status PositionEmbeddingForward(int64_t batch, int64_t seq_len, int64_t channels,
                                      absl::Span<const T> wpe, absl::Span<T> out, ThreadPool* pool,
                                      absl::Span<const int32_t> positions) {
  constexpr char kKernel[] = "PositionEmbeddingForward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "batch", batch));
  RETURN_IF_ERROR(CheckPositive(kKernel, "seq_len", seq_len));
  RETURN_IF_ERROR(CheckPositive(kKernel, "channels", channels));
  const int64_t C = channels, rows = batch * seq_len;
  if (static_cast<int64_t>(wpe.size()) < seq_len * C || wpe.size() % C != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kKernel, ": wpe has ", wpe.size(),
                                                   " elements, not [max_seq_len >= ", seq_len, ", ",
                                                   C, "]"));
  }
  RETURN_IF_ERROR(CheckElems(kKernel, "out", out, rows * C, "B*T*C"));
  RETURN_IF_ERROR(
      CheckPositionIds(kKernel, batch, seq_len, static_cast<int64_t>(wpe.size()) / C, positions));
  const int64_t grain = RowsPerTask(C);
  ParallelFor(pool, NumTasks(rows, grain), [&](int64_t task) {
    const int64_t end = std::min(rows, (task + 1) * grain);
    for (int64_t row = task * grain; row < end; ++row) {
      const int64_t position = positions.empty() ? row % seq_len : positions[row];
      const T* pe = wpe.data() + position * C;
      T* o = out.data() + row * C;
      if constexpr (std::is_same_v<T, float>) {
        kernels_internal::simd::AddTo(pe, o, C);
      } else {
        for (int64_t c = 0; c < C; ++c) o[c] += pe[c];
      }
    }
  });
  return absl::OkStatus();
}

template <typename T>
absl::Status PositionEmbeddingBackward(int64_t batch, int64_t seq_len, int64_t channels,
                                       absl::Span<const T> dout, absl::Span<T> dwpe,
                                       ThreadPool* pool, absl::Span<const int32_t> positions) {
  constexpr char kKernel[] = "PositionEmbeddingBackward";
  RETURN_IF_ERROR(CheckPositive(kKernel, "batch", batch));
  RETURN_IF_ERROR(CheckPositive(kKernel, "seq_len", seq_len));
  RETURN_IF_ERROR(CheckPositive(kKernel, "channels", channels));
  const int64_t C = channels, B = batch, L = seq_len;
  if (static_cast<int64_t>(dwpe.size()) < L * C || dwpe.size() % C != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kKernel, ": dwpe has ", dwpe.size(), " elements, not [max_seq_len >= ", L, ", ", C, "]"));
  }
  RETURN_IF_ERROR(CheckElems(kKernel, "dout", dout, B * L * C, "B*T*C"));
  RETURN_IF_ERROR(
      CheckPositionIds(kKernel, B, L, static_cast<int64_t>(dwpe.size()) / C, positions));
  ParallelFor(pool, NumTasks(C, kChannelsPerTask), [&](int64_t task) {
    const int64_t c0 = task * kChannelsPerTask;
    const int64_t c1 = std::min(C, c0 + kChannelsPerTask);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < L; ++t) {
        const T* d = dout.data() + (b * L + t) * C;
        T* pe = dwpe.data() + (positions.empty() ? t : positions[b * L + t]) * C;
        if constexpr (std::is_same_v<T, float>) {
          kernels_internal::simd::AddTo(d + c0, pe + c0, c1 - c0);
        } else {
          for (int64_t c = c0; c < c1; ++c) pe[c] += d[c];
        }
      }
    }
  });
  return absl::OkStatus();
}

// --- LM head ------------------------------------------------------------------------------------

template <typename T>
void LmHeadStateInit(absl::Span<T> state) {
  const size_t n = state.size() / 3;
  std::fill(state.begin(), state.begin() + n, NegativeInfinity<T>());
  std::fill(state.begin() + n, state.end(), T{0});
}

template <typename T>
absl::Status LmHeadBlockForward(const VocabBlockShape& shape, absl::Span<const T> h,
                                absl::Span<const T> block, absl::Span<const int32_t> targets,
                                absl::Span<T> state, absl::Span<T> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadBlockForward";
  RETURN_IF_ERROR(CheckLmHead(kKernel, shape, targets, h.size(), block.size(), workspace.size(),
                              LmHeadBlockForwardWorkspaceElems(shape, false)));
  RETURN_IF_ERROR(CheckElems(kKernel, "state", state, LmHeadStateElems(shape), "3*rows"));
  BlasTileGemms<T> gemms{h.data(), block.data(), {}, shape.channels, nullptr, pool};
  return LmHeadForwardImpl<T>(shape, gemms, targets, state, workspace.data(), pool);
}

absl::Status LmHeadBlockForward(const VocabBlockShape& shape, absl::Span<const float> h,
                                Block16 block, absl::Span<const int32_t> targets,
                                absl::Span<float> state, absl::Span<float> workspace,
                                ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadBlockForward";
  if (block.data == nullptr || (block.dtype != DType::kF16 && block.dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kKernel, ": a 16-bit block needs data and dtype f16 or bf16"));
  }
  RETURN_IF_ERROR(CheckLmHead(kKernel, shape, targets, h.size(), shape.block_rows * shape.channels,
                              workspace.size(), LmHeadBlockForwardWorkspaceElems(shape, true)));
  RETURN_IF_ERROR(CheckElems(kKernel, "state", state, LmHeadStateElems(shape), "3*rows"));
  // The f32 part (LmHeadBlockForwardWorkspaceElems(shape, false)), then the 16-bit part.
  const int64_t f32_elems =
      vocab_blocks_internal::AlignF32Elems(LmHeadBlockForwardWorkspaceElems(shape, false));
  if (block.dtype == DType::kBF16) {
    Bf16GemmBackend backend;
    RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
    if (backend == Bf16GemmBackend::kFallback) {
      Bf16FallbackTileGemms gemms = MakeBf16FallbackTileGemms(shape, h.data(), block.data, pool);
      return LmHeadForwardImpl<float>(shape, gemms, targets, state, workspace.data(), pool);
    }
    const Bf16Buffers b = Bf16BuffersAt(shape, workspace.data(), f32_elems);
    RoundToBf16(h.data(), b.hb, shape.rows * shape.channels, pool);
    Bf16TileGemms gemms{b.hb, block.data, shape.channels, nullptr, nullptr, pool};
    return LmHeadForwardImpl<float>(shape, gemms, targets, state, workspace.data(), pool);
  }
  BlasTileGemms<float> gemms{h.data(), nullptr, block, shape.channels, workspace.data() + f32_elems,
                             pool};
  return LmHeadForwardImpl<float>(shape, gemms, targets, state, workspace.data(), pool);
}

template <typename T>
absl::StatusOr<double> LmHeadFinish(const VocabBlockShape& shape, absl::Span<const int32_t> targets,
                                    absl::Span<const T> state, absl::Span<T> lse) {
  constexpr char kKernel[] = "LmHeadFinish";
  const int64_t N = shape.rows;
  RETURN_IF_ERROR(CheckElems(kKernel, "targets", targets, N, "rows"));
  RETURN_IF_ERROR(CheckElems(kKernel, "state", state, 3 * N, "3*rows"));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, N, "rows"));
  const T* run_max = state.data();
  const T* run_sum = run_max + N;
  const T* target_logit = run_sum + N;
  double loss_sum = 0;
  int64_t num_valid = 0;
  for (int64_t n = 0; n < N; ++n) {
    lse[n] = SoftmaxLogSumExp(SoftmaxState<T>{run_max[n], run_sum[n]});
    if (targets[n] != shape.ignore_index) {
      loss_sum += CrossEntropyRowLoss(lse[n], target_logit[n]);
      ++num_valid;
    }
  }
  return num_valid == 0 ? 0.0 : loss_sum / static_cast<double>(num_valid);
}

template <typename T>
absl::Status LmHeadBlockBackward(const VocabBlockShape& shape, absl::Span<const T> h,
                                 absl::Span<const T> block, absl::Span<const int32_t> targets,
                                 absl::Span<const T> lse, double loss_grad, absl::Span<T> dh,
                                 absl::Span<T> workspace, VocabTileGradFn<T> on_tile,
                                 ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadBlockBackward";
  RETURN_IF_ERROR(CheckLmHead(kKernel, shape, targets, h.size(), block.size(), workspace.size(),
                              LmHeadBlockBackwardWorkspaceElems(shape, false)));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, shape.rows, "rows"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dh", dh, shape.rows * shape.channels, "rows*channels"));
  BlasTileGemms<T> gemms{h.data(), block.data(), {}, shape.channels, nullptr, pool};
  return LmHeadBackwardImpl<T>(shape, gemms, targets, lse.data(), loss_grad, dh.data(),
                               workspace.data(), on_tile, pool);
}

absl::Status LmHeadBlockBackward(const VocabBlockShape& shape, absl::Span<const float> h,
                                 Block16 block, absl::Span<const int32_t> targets,
                                 absl::Span<const float> lse, double loss_grad,
                                 absl::Span<float> dh, absl::Span<float> workspace,
                                 VocabTileGradFn<float> on_tile, ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadBlockBackward";
  if (block.data == nullptr || (block.dtype != DType::kF16 && block.dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kKernel, ": a 16-bit block needs data and dtype f16 or bf16"));
  }
  RETURN_IF_ERROR(CheckLmHead(kKernel, shape, targets, h.size(), shape.block_rows * shape.channels,
                              workspace.size(), LmHeadBlockBackwardWorkspaceElems(shape, true)));
  RETURN_IF_ERROR(CheckElems(kKernel, "lse", lse, shape.rows, "rows"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dh", dh, shape.rows * shape.channels, "rows*channels"));
  // The f32 part (LmHeadBlockBackwardWorkspaceElems(shape, false)), then the 16-bit part.
  const int64_t f32_elems =
      vocab_blocks_internal::AlignF32Elems(LmHeadBlockBackwardWorkspaceElems(shape, false));
  if (block.dtype == DType::kBF16) {
    Bf16GemmBackend backend;
    RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
    if (backend == Bf16GemmBackend::kFallback) {
      Bf16FallbackTileGemms gemms = MakeBf16FallbackTileGemms(shape, h.data(), block.data, pool);
      return LmHeadBackwardImpl<float>(shape, gemms, targets, lse.data(), loss_grad, dh.data(),
                                       workspace.data(), on_tile, pool);
    }
    const Bf16Buffers b = Bf16BuffersAt(shape, workspace.data(), f32_elems);
    RoundToBf16(h.data(), b.hb, shape.rows * shape.channels, pool);
    Bf16TileGemms gemms{b.hb, block.data, shape.channels, b.dzb, b.dzbt, pool};
    return LmHeadBackwardImpl<float>(shape, gemms, targets, lse.data(), loss_grad, dh.data(),
                                     workspace.data(), on_tile, pool);
  }
  BlasTileGemms<float> gemms{h.data(), nullptr, block, shape.channels, workspace.data() + f32_elems,
                             pool};
  return LmHeadBackwardImpl<float>(shape, gemms, targets, lse.data(), loss_grad, dh.data(),
                                   workspace.data(), on_tile, pool);
}

#define PS_VOCAB_BLOCKS_INSTANTIATE_(T)                                                            \
  template absl::Status EmbeddingBlockForward<T>(const VocabBlockShape&,                           \
                                                 absl::Span<const int32_t>, absl::Span<const T>,   \
                                                 absl::Span<T>, ThreadPool*);                      \
  template absl::Status ScatterRowsAdd<T>(int64_t, absl::Span<const int32_t>,                      \
                                          absl::Span<const int32_t>, absl::Span<const T>,          \
                                          absl::Span<T>, ThreadPool*);                             \
  template absl::Status PositionEmbeddingForward<T>(int64_t, int64_t, int64_t,                     \
                                                    absl::Span<const T>, absl::Span<T>,            \
                                                    ThreadPool*, absl::Span<const int32_t>);       \
  template absl::Status PositionEmbeddingBackward<T>(int64_t, int64_t, int64_t,                    \
                                                     absl::Span<const T>, absl::Span<T>,           \
                                                     ThreadPool*, absl::Span<const int32_t>);      \
  template void LmHeadStateInit<T>(absl::Span<T>);                                                 \
  template absl::Status LmHeadBlockForward<T>(const VocabBlockShape&, absl::Span<const T>,         \
                                              absl::Span<const T>, absl::Span<const int32_t>,      \
                                              absl::Span<T>, absl::Span<T>, ThreadPool*);          \
  template absl::StatusOr<double> LmHeadFinish<T>(                                                 \
      const VocabBlockShape&, absl::Span<const int32_t>, absl::Span<const T>, absl::Span<T>);      \
  template absl::Status LmHeadBlockBackward<T>(                                                    \
      const VocabBlockShape&, absl::Span<const T>, absl::Span<const T>, absl::Span<const int32_t>, \
      absl::Span<const T>, double, absl::Span<T>, absl::Span<T>, VocabTileGradFn<T>, ThreadPool*)
PS_VOCAB_BLOCKS_INSTANTIATE_(float);
PS_VOCAB_BLOCKS_INSTANTIATE_(double);
#undef PS_VOCAB_BLOCKS_INSTANTIATE_

}  // namespace ps
