#include "model/kernels/lm_head_cross_entropy.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
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
using kernels_internal::FallbackScratch;
using kernels_internal::FallbackTileGrads;
using kernels_internal::FallbackTileLogits;
using kernels_internal::Gemm;
using kernels_internal::GemmBf16;
using kernels_internal::LogitGradTile;
using kernels_internal::ResolveBf16GemmBackend;
using kernels_internal::RoundToBf16;
using kernels_internal::RoundToBf16Transposed;
using kernels_internal::RoundToBf16Values;
using kernels_internal::SoftmaxTile;
using kernels_internal::WidenBf16;

// The checks shared by all four kernels; wte's element count and the workspace's are passed
// as numbers (wte is f32/f64 or bf16).
template <typename T>
absl::Status CheckArgs(const char* kernel, const LmHeadCrossEntropyShape& s, absl::Span<const T> h,
                       size_t wte_elems, absl::Span<const int32_t> targets, absl::Span<const T> lse,
                       size_t workspace_elems, int64_t needed_elems) {
  RETURN_IF_ERROR(CheckBlasDim(kernel, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "channels", s.channels));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "vocab_size", s.vocab_size));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "row_tile", s.row_tile));
  RETURN_IF_ERROR(CheckBlasDim(kernel, "vocab_tile", s.vocab_tile));
  RETURN_IF_ERROR(CheckElems(kernel, "h", h, s.rows * s.channels, "rows*channels"));
  if (static_cast<int64_t>(wte_elems) != s.vocab_size * s.channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": wte has ", wte_elems, " elements, expected ",
                     s.vocab_size * s.channels, " (vocab_size*channels)"));
  }
  RETURN_IF_ERROR(CheckElems(kernel, "targets", targets, s.rows, "rows"));
  RETURN_IF_ERROR(CheckElems(kernel, "lse", lse, s.rows, "rows"));
  if (static_cast<int64_t>(workspace_elems) < needed_elems) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": workspace has ", workspace_elems,
                                                   " elements, needs ", needed_elems));
  }
  for (int64_t n = 0; n < s.rows; ++n) {
    const int32_t t = targets[n];
    if (t != s.ignore_index && (t < 0 || t >= s.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": target ", t, " at row ", n,
                                                     " is outside [0, vocab_size=", s.vocab_size,
                                                     ") and is not ignore_index ", s.ignore_index));
    }
  }
  return absl::OkStatus();
}

// The three GEMMs of the kernels, behind one interface so the f32/f64 (OpenBLAS) and the bf16
// (internal/bf16_gemm.h) kernels share the tiling and the softmax code:
//   Logits: z[R, Vt] = h[r0:r0+R] wte[v0:v0+Vt]^T, packed with row stride Vt;
//   Grads:  dh[r0:r0+R] += dz wte[v0:v0+Vt];  dwte[v0:v0+Vt] += dz^T h[r0:r0+R].
template <typename T>
struct BlasGemms {
  const T* h;
  const T* wte;
  int64_t C;
  ThreadPool* pool;  // runs the GEMM grid (internal/blas.h)
  absl::Status Logits(int64_t r0, int64_t R, int64_t v0, int64_t Vt, T* z) const {
    Gemm(false, true, R, Vt, C, T{1}, h + r0 * C, C, wte + v0 * C, C, T{0}, z, Vt, pool);
    return absl::OkStatus();
  }
  absl::Status Grads(int64_t r0, int64_t R, int64_t v0, int64_t Vt, const T* dz, T* dh,
                     T* dwte) const {
    Gemm(false, false, R, C, Vt, T{1}, dz, Vt, wte + v0 * C, C, T{1}, dh + r0 * C, C, pool);
    Gemm(true, false, Vt, C, R, T{1}, dz, Vt, h + r0 * C, C, T{1}, dwte + v0 * C, C, pool);
    return absl::OkStatus();
  }
};

// bf16: h was rounded to bf16 once (hb), wte is bf16; dz is rounded to bf16 per tile before its
// two GEMMs, as dzb [R, Vt] for dh and transposed as dzbt [Vt, R] for dwte (so both GEMMs read
// plain layouts; oneDNN would copy a transposed A once per output block); everything accumulates
// in f32.
struct Bf16Gemms {
  const uint16_t* hb;
  const uint16_t* wte;
  int64_t C;
  uint16_t* dzb;   // row_tile * vocab_tile bf16 values
  uint16_t* dzbt;  // the same, transposed
  ThreadPool* pool;
  absl::Status Logits(int64_t r0, int64_t R, int64_t v0, int64_t Vt, float* z) const {
    return GemmBf16({.trans_b = true,
                     .m = R,
                     .n = Vt,
                     .k = C,
                     .a = hb + r0 * C,
                     .lda = C,
                     .b = wte + v0 * C,
                     .ldb = C,
                     .c = z,
                     .ldc = Vt},
                    pool);
  }
  absl::Status Grads(int64_t r0, int64_t R, int64_t v0, int64_t Vt, const float* dz, float* dh,
                     float* dwte) const {
    RoundToBf16(dz, dzb, R * Vt, pool);
    RoundToBf16Transposed(dz, R, Vt, dzbt, pool);
    RETURN_IF_ERROR(GemmBf16({.m = R,
                              .n = C,
                              .k = Vt,
                              .a = dzb,
                              .lda = Vt,
                              .b = wte + v0 * C,
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
                     .c = dwte + v0 * C,
                     .ldc = C},
                    pool);
  }
};

// The fallback of Bf16Gemms (no native bf16 GEMM on this CPU, internal/bf16_gemm.h): the same
// products through sgemm on f32 operands that hold bf16 values: h rounded once per call (hr), the
// wte tile widened for each GEMM that reads it (wf), dz rounded per tile (dzr). sgemm reads the
// transposes itself, so nothing is copied transposed, and nothing is rounded to bf16 and widened
// back.
struct Bf16FallbackGemms {
  const float* hr;  // rows * C
  const uint16_t* wte;
  int64_t C;
  float* wf;   // vocab_tile * C
  float* dzr;  // row_tile * vocab_tile
  ThreadPool* pool;
  absl::Status Logits(int64_t r0, int64_t R, int64_t v0, int64_t Vt, float* z) const {
    WidenBf16(wte + v0 * C, wf, Vt * C, pool);
    FallbackTileLogits(hr + r0 * C, wf, R, Vt, C, z, pool);
    return absl::OkStatus();
  }
  absl::Status Grads(int64_t r0, int64_t R, int64_t v0, int64_t Vt, const float* dz, float* dh,
                     float* dwte) const {
    WidenBf16(wte + v0 * C, wf, Vt * C, pool);
    FallbackTileGrads(hr + r0 * C, wf, dz, dzr, R, Vt, C, dh + r0 * C, dwte + v0 * C, pool);
    return absl::OkStatus();
  }
};

// Bf16FallbackGemms over the thread's fallback scratch (internal/bf16_gemm.h's FallbackScratch),
// with h rounded into it.
Bf16FallbackGemms MakeBf16FallbackGemms(const LmHeadCrossEntropyShape& s, const float* h,
                                        const uint16_t* wte, ThreadPool* pool) {
  const int64_t N = s.rows, V = s.vocab_size, C = s.channels;
  const int64_t row_tile = std::min(N, s.row_tile), vocab_tile = std::min(V, s.vocab_tile);
  float* hr = FallbackScratch(0, N * C);
  RoundToBf16Values(h, hr, N * C, pool);
  return Bf16FallbackGemms{
      hr,  wte, C, FallbackScratch(1, vocab_tile * C), FallbackScratch(2, row_tile * vocab_tile),
      pool};
}

// Bf16 workspace layout (in f32 elements): the f32 workspace of LmHeadCrossEntropyWorkspaceElems,
// then h in bf16 (rows * channels values), then one dz tile in bf16 and its transpose, each
// 64-byte aligned.
int64_t AlignF32(int64_t elems) { return (elems + 15) / 16 * 16; }
int64_t Bf16AsF32(int64_t bf16_elems) { return AlignF32((bf16_elems + 1) / 2); }

// After a row tile's last vocabulary tile: its lse, and its rows' losses added in row order.
template <typename T>
void FinishRows(const LmHeadCrossEntropyShape& shape, absl::Span<const int32_t> targets, int64_t r0,
                int64_t R, const T* run_max, const T* run_sum, const T* target_logit,
                absl::Span<T> lse, double* loss_sum, int64_t* num_valid) {
  for (int64_t i = 0; i < R; ++i) {
    lse[r0 + i] = SoftmaxLogSumExp(SoftmaxState<T>{run_max[i], run_sum[i]});
    if (targets[r0 + i] != shape.ignore_index) {
      *loss_sum += CrossEntropyRowLoss(lse[r0 + i], target_logit[i]);
      ++*num_valid;
    }
  }
}

int64_t CountValid(const LmHeadCrossEntropyShape& shape, absl::Span<const int32_t> targets,
                   int64_t begin, int64_t end) {
  int64_t n = 0;
  for (int64_t i = begin; i < end; ++i) n += targets[i] != shape.ignore_index;
  return n;
}

// The forward loop over row and vocabulary tiles (see the header), with `gemms` computing the
// logits tiles into `workspace`.
template <typename T, typename Gemms>
absl::StatusOr<double> ForwardTiles(const LmHeadCrossEntropyShape& shape, const Gemms& gemms,
                                    absl::Span<const int32_t> targets, absl::Span<T> lse,
                                    T* workspace, ThreadPool* pool) {
  const int64_t N = shape.rows, V = shape.vocab_size;
  const int64_t row_tile = std::min(N, shape.row_tile), vocab_tile = std::min(V, shape.vocab_tile);
  T* z = workspace;
  T* run_max = z + row_tile * vocab_tile;
  T* run_sum = run_max + row_tile;
  T* target_logit = run_sum + row_tile;
  double loss_sum = 0;
  int64_t num_valid = 0;
  for (int64_t r0 = 0; r0 < N; r0 += row_tile) {
    const int64_t R = std::min(row_tile, N - r0);
    std::fill(run_max, run_max + R, NegativeInfinity<T>());
    std::fill(run_sum, run_sum + R, T{0});
    std::fill(target_logit, target_logit + R, T{0});
    for (int64_t v0 = 0; v0 < V; v0 += vocab_tile) {
      const int64_t Vt = std::min(vocab_tile, V - v0);
      RETURN_IF_ERROR(gemms.Logits(r0, R, v0, Vt, z));
      SoftmaxTile(targets.data() + r0, R, v0, Vt, z, run_max, run_sum, target_logit, pool);
    }
    FinishRows(shape, targets, r0, R, run_max, run_sum, target_logit, lse, &loss_sum, &num_valid);
  }
  return num_valid == 0 ? 0.0 : loss_sum / static_cast<double>(num_valid);
}

// The backward loop: per tile the logits again, dz = scale * (softmax - onehot) in place, then
// the two gradient GEMMs.
template <typename T, typename Gemms>
absl::Status BackwardTiles(const LmHeadCrossEntropyShape& shape, const Gemms& gemms,
                           absl::Span<const int32_t> targets, absl::Span<const T> lse,
                           double loss_grad, absl::Span<T> dh, absl::Span<T> dwte, T* workspace,
                           ThreadPool* pool) {
  const int64_t N = shape.rows, V = shape.vocab_size;
  const int64_t num_valid = CountValid(shape, targets, 0, N);
  if (num_valid == 0) return absl::OkStatus();  // The loss is the constant 0.
  const T scale = static_cast<T>(loss_grad / static_cast<double>(num_valid));
  const int64_t row_tile = std::min(N, shape.row_tile), vocab_tile = std::min(V, shape.vocab_tile);
  T* dz = workspace;
  for (int64_t r0 = 0; r0 < N; r0 += row_tile) {
    const int64_t R = std::min(row_tile, N - r0);
    if (CountValid(shape, targets, r0, r0 + R) == 0) continue;
    for (int64_t v0 = 0; v0 < V; v0 += vocab_tile) {
      const int64_t Vt = std::min(vocab_tile, V - v0);
      RETURN_IF_ERROR(gemms.Logits(r0, R, v0, Vt, dz));
      LogitGradTile(targets.data() + r0, lse.data() + r0, shape.ignore_index, scale, R, v0, Vt, dz,
                    pool);
      RETURN_IF_ERROR(gemms.Grads(r0, R, v0, Vt, dz, dh.data(), dwte.data()));
    }
  }
  return absl::OkStatus();
}

// Forward and backward in one sweep per row tile: the row tile's logits for the whole vocabulary
// are kept (tile after tile, each packed as ForwardTiles packs it) and turned into dz in place
// once the row tile's lse is known, instead of being computed again by the backward. The GEMMs,
// the per-element arithmetic and the order of every sum are those of ForwardTiles followed by
// BackwardTiles (dwte's tile sums run over row tiles in ascending order either way), so the
// results are the same bits.
template <typename T, typename Gemms>
absl::StatusOr<double> FusedTiles(const LmHeadCrossEntropyShape& shape, const Gemms& gemms,
                                  absl::Span<const int32_t> targets, double loss_grad,
                                  absl::Span<T> lse, absl::Span<T> dh, absl::Span<T> dwte,
                                  T* workspace, ThreadPool* pool) {
  const int64_t N = shape.rows, V = shape.vocab_size;
  const int64_t row_tile = std::min(N, shape.row_tile), vocab_tile = std::min(V, shape.vocab_tile);
  const int64_t num_valid_total = CountValid(shape, targets, 0, N);
  const T scale = num_valid_total == 0
                      ? T{0}
                      : static_cast<T>(loss_grad / static_cast<double>(num_valid_total));
  T* z_row = workspace;  // R x V logits of one row tile: vocab tile at v0 holds R x Vt at R * v0
  T* run_max = z_row + row_tile * V;
  T* run_sum = run_max + row_tile;
  T* target_logit = run_sum + row_tile;
  double loss_sum = 0;
  int64_t num_valid = 0;
  for (int64_t r0 = 0; r0 < N; r0 += row_tile) {
    const int64_t R = std::min(row_tile, N - r0);
    std::fill(run_max, run_max + R, NegativeInfinity<T>());
    std::fill(run_sum, run_sum + R, T{0});
    std::fill(target_logit, target_logit + R, T{0});
    for (int64_t v0 = 0; v0 < V; v0 += vocab_tile) {
      const int64_t Vt = std::min(vocab_tile, V - v0);
      T* z = z_row + R * v0;
      RETURN_IF_ERROR(gemms.Logits(r0, R, v0, Vt, z));
      SoftmaxTile(targets.data() + r0, R, v0, Vt, z, run_max, run_sum, target_logit, pool);
    }
    FinishRows(shape, targets, r0, R, run_max, run_sum, target_logit, lse, &loss_sum, &num_valid);
    if (num_valid_total == 0 || CountValid(shape, targets, r0, r0 + R) == 0) continue;
    for (int64_t v0 = 0; v0 < V; v0 += vocab_tile) {
      const int64_t Vt = std::min(vocab_tile, V - v0);
      T* dz = z_row + R * v0;
      LogitGradTile(targets.data() + r0, lse.data() + r0, shape.ignore_index, scale, R, v0, Vt, dz,
                    pool);
      RETURN_IF_ERROR(gemms.Grads(r0, R, v0, Vt, dz, dh.data(), dwte.data()));
    }
  }
  return num_valid == 0 ? 0.0 : loss_sum / static_cast<double>(num_valid);
}

}  // namespace

int64_t LmHeadCrossEntropyBf16WorkspaceElems(const LmHeadCrossEntropyShape& s) {
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.vocab_size, s.vocab_tile);
  return AlignF32(LmHeadCrossEntropyWorkspaceElems(s)) + Bf16AsF32(s.rows * s.channels) +
         2 * Bf16AsF32(r * v);
}

template <typename T>
absl::StatusOr<double> LmHeadCrossEntropyForward(const LmHeadCrossEntropyShape& shape,
                                                 absl::Span<const T> h, absl::Span<const T> wte,
                                                 absl::Span<const int32_t> targets,
                                                 absl::Span<T> lse, absl::Span<T> workspace,
                                                 ThreadPool* pool) {
  RETURN_IF_ERROR(CheckArgs<T>("LmHeadCrossEntropyForward", shape, h, wte.size(), targets,
                               absl::Span<const T>(lse), workspace.size(),
                               LmHeadCrossEntropyWorkspaceElems(shape)));
  return ForwardTiles<T>(shape, BlasGemms<T>{h.data(), wte.data(), shape.channels, pool}, targets,
                         lse, workspace.data(), pool);
}

template <typename T>
absl::Status LmHeadCrossEntropyBackward(const LmHeadCrossEntropyShape& shape, absl::Span<const T> h,
                                        absl::Span<const T> wte, absl::Span<const int32_t> targets,
                                        absl::Span<const T> lse, double loss_grad, absl::Span<T> dh,
                                        absl::Span<T> dwte, absl::Span<T> workspace,
                                        ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadCrossEntropyBackward";
  RETURN_IF_ERROR(CheckArgs<T>(kKernel, shape, h, wte.size(), targets, lse, workspace.size(),
                               LmHeadCrossEntropyWorkspaceElems(shape)));
  const int64_t N = shape.rows, V = shape.vocab_size, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dh", dh, N * C, "rows*channels"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwte", dwte, V * C, "vocab_size*channels"));
  return BackwardTiles<T>(shape, BlasGemms<T>{h.data(), wte.data(), C, pool}, targets, lse,
                          loss_grad, dh, dwte, workspace.data(), pool);
}

int64_t LmHeadCrossEntropyFusedWorkspaceElems(const LmHeadCrossEntropyShape& s) {
  const int64_t r = std::min(s.rows, s.row_tile);
  return r * s.vocab_size + 3 * r;
}

int64_t LmHeadCrossEntropyFusedBf16WorkspaceElems(const LmHeadCrossEntropyShape& s) {
  const int64_t r = std::min(s.rows, s.row_tile), v = std::min(s.vocab_size, s.vocab_tile);
  return AlignF32(LmHeadCrossEntropyFusedWorkspaceElems(s)) + Bf16AsF32(s.rows * s.channels) +
         2 * Bf16AsF32(r * v);
}

template <typename T>
absl::StatusOr<double> LmHeadCrossEntropyForwardBackward(
    const LmHeadCrossEntropyShape& shape, absl::Span<const T> h, absl::Span<const T> wte,
    absl::Span<const int32_t> targets, double loss_grad, absl::Span<T> lse, absl::Span<T> dh,
    absl::Span<T> dwte, absl::Span<T> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadCrossEntropyForwardBackward";
  RETURN_IF_ERROR(CheckArgs<T>(kKernel, shape, h, wte.size(), targets, absl::Span<const T>(lse),
                               workspace.size(), LmHeadCrossEntropyFusedWorkspaceElems(shape)));
  const int64_t N = shape.rows, V = shape.vocab_size, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dh", dh, N * C, "rows*channels"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwte", dwte, V * C, "vocab_size*channels"));
  return FusedTiles<T>(shape, BlasGemms<T>{h.data(), wte.data(), C, pool}, targets, loss_grad, lse,
                       dh, dwte, workspace.data(), pool);
}

absl::StatusOr<double> LmHeadCrossEntropyForwardBackwardBf16(
    const LmHeadCrossEntropyShape& shape, absl::Span<const float> h, absl::Span<const uint16_t> wte,
    absl::Span<const int32_t> targets, double loss_grad, absl::Span<float> lse,
    absl::Span<float> dh, absl::Span<float> dwte, absl::Span<float> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadCrossEntropyForwardBackwardBf16";
  RETURN_IF_ERROR(CheckArgs<float>(kKernel, shape, h, wte.size(), targets,
                                   absl::Span<const float>(lse), workspace.size(),
                                   LmHeadCrossEntropyFusedBf16WorkspaceElems(shape)));
  const int64_t N = shape.rows, V = shape.vocab_size, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dh", dh, N * C, "rows*channels"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwte", dwte, V * C, "vocab_size*channels"));
  Bf16GemmBackend backend;
  RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
  if (backend == Bf16GemmBackend::kFallback) {
    return FusedTiles<float>(shape, MakeBf16FallbackGemms(shape, h.data(), wte.data(), pool),
                             targets, loss_grad, lse, dh, dwte, workspace.data(), pool);
  }
  float* f32_end = workspace.data() + AlignF32(LmHeadCrossEntropyFusedWorkspaceElems(shape));
  const int64_t tile_elems = std::min(N, shape.row_tile) * std::min(V, shape.vocab_tile);
  uint16_t* hb = reinterpret_cast<uint16_t*>(f32_end);
  uint16_t* dzb = reinterpret_cast<uint16_t*>(f32_end + Bf16AsF32(N * C));
  uint16_t* dzbt = reinterpret_cast<uint16_t*>(f32_end + Bf16AsF32(N * C) + Bf16AsF32(tile_elems));
  RoundToBf16(h.data(), hb, N * C, pool);
  return FusedTiles<float>(shape, Bf16Gemms{hb, wte.data(), C, dzb, dzbt, pool}, targets, loss_grad,
                           lse, dh, dwte, workspace.data(), pool);
}

absl::StatusOr<double> LmHeadCrossEntropyForwardBf16(
    const LmHeadCrossEntropyShape& shape, absl::Span<const float> h, absl::Span<const uint16_t> wte,
    absl::Span<const int32_t> targets, absl::Span<float> lse, absl::Span<float> workspace,
    ThreadPool* pool) {
  RETURN_IF_ERROR(CheckArgs<float>("LmHeadCrossEntropyForwardBf16", shape, h, wte.size(), targets,
                                   absl::Span<const float>(lse), workspace.size(),
                                   LmHeadCrossEntropyBf16WorkspaceElems(shape)));
  Bf16GemmBackend backend;
  RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
  if (backend == Bf16GemmBackend::kFallback) {
    return ForwardTiles<float>(shape, MakeBf16FallbackGemms(shape, h.data(), wte.data(), pool),
                               targets, lse, workspace.data(), pool);
  }
  uint16_t* hb = reinterpret_cast<uint16_t*>(workspace.data() +
                                             AlignF32(LmHeadCrossEntropyWorkspaceElems(shape)));
  RoundToBf16(h.data(), hb, shape.rows * shape.channels, pool);
  return ForwardTiles<float>(shape,
                             Bf16Gemms{hb, wte.data(), shape.channels, nullptr, nullptr, pool},
                             targets, lse, workspace.data(), pool);
}

absl::Status LmHeadCrossEntropyBackwardBf16(
    const LmHeadCrossEntropyShape& shape, absl::Span<const float> h, absl::Span<const uint16_t> wte,
    absl::Span<const int32_t> targets, absl::Span<const float> lse, double loss_grad,
    absl::Span<float> dh, absl::Span<float> dwte, absl::Span<float> workspace, ThreadPool* pool) {
  constexpr char kKernel[] = "LmHeadCrossEntropyBackwardBf16";
  RETURN_IF_ERROR(CheckArgs<float>(kKernel, shape, h, wte.size(), targets, lse, workspace.size(),
                                   LmHeadCrossEntropyBf16WorkspaceElems(shape)));
  const int64_t N = shape.rows, V = shape.vocab_size, C = shape.channels;
  RETURN_IF_ERROR(CheckElems(kKernel, "dh", dh, N * C, "rows*channels"));
  RETURN_IF_ERROR(CheckElems(kKernel, "dwte", dwte, V * C, "vocab_size*channels"));
  Bf16GemmBackend backend;
  RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));  // before anything is written
  if (backend == Bf16GemmBackend::kFallback) {
    return BackwardTiles<float>(shape, MakeBf16FallbackGemms(shape, h.data(), wte.data(), pool),
                                targets, lse, loss_grad, dh, dwte, workspace.data(), pool);
  }
  float* f32_end = workspace.data() + AlignF32(LmHeadCrossEntropyWorkspaceElems(shape));
  uint16_t* hb = reinterpret_cast<uint16_t*>(f32_end);
  const int64_t tile_elems = std::min(N, shape.row_tile) * std::min(V, shape.vocab_tile);
  uint16_t* dzb = reinterpret_cast<uint16_t*>(f32_end + Bf16AsF32(N * C));
  uint16_t* dzbt = reinterpret_cast<uint16_t*>(f32_end + Bf16AsF32(N * C) + Bf16AsF32(tile_elems));
  RoundToBf16(h.data(), hb, N * C, pool);
  return BackwardTiles<float>(shape, Bf16Gemms{hb, wte.data(), C, dzb, dzbt, pool}, targets, lse,
                              loss_grad, dh, dwte, workspace.data(), pool);
}

#define PS_LM_HEAD_CE_INSTANTIATE_(T)                                                       \
  template absl::StatusOr<double> LmHeadCrossEntropyForwardBackward<T>(                     \
      const LmHeadCrossEntropyShape&, absl::Span<const T>, absl::Span<const T>,             \
      absl::Span<const int32_t>, double, absl::Span<T>, absl::Span<T>, absl::Span<T>,       \
      absl::Span<T>, ThreadPool*);                                                          \
  template absl::StatusOr<double> LmHeadCrossEntropyForward<T>(                             \
      const LmHeadCrossEntropyShape&, absl::Span<const T>, absl::Span<const T>,             \
      absl::Span<const int32_t>, absl::Span<T>, absl::Span<T>, ThreadPool*);                \
  template absl::Status LmHeadCrossEntropyBackward<T>(                                      \
      const LmHeadCrossEntropyShape&, absl::Span<const T>, absl::Span<const T>,             \
      absl::Span<const int32_t>, absl::Span<const T>, double, absl::Span<T>, absl::Span<T>, \
      absl::Span<T>, ThreadPool*)
PS_LM_HEAD_CE_INSTANTIATE_(float);
PS_LM_HEAD_CE_INSTANTIATE_(double);
#undef PS_LM_HEAD_CE_INSTANTIATE_

}  // namespace ps
