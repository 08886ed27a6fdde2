#include "model/kernels/nf4_linear.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"

namespace ps {
namespace {

using kernels_internal::CheckBlasDim;
using kernels_internal::CheckElems;
using kernels_internal::GemmBlocksFor;
using kernels_internal::GemmSingleCall;
using kernels_internal::NumTasks;
using kernels_internal::ParallelFor;
using kernels_internal::ParallelForRanges;

absl::Status CheckCommon(const char* op, const LinearShape& s, const Quant4Tensor& w,
                         absl::Span<float> workspace, DType compute_dtype) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16 &&
      compute_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": compute_dtype ",
                                                   static_cast<int>(compute_dtype),
                                                   " is not f32, bf16 or f16"));
  }
  RETURN_IF_ERROR(CheckBlasDim(op, "rows", s.rows));
  RETURN_IF_ERROR(CheckBlasDim(op, "in_features", s.in_features));
  RETURN_IF_ERROR(CheckBlasDim(op, "out_features", s.out_features));
  RETURN_IF_ERROR(CheckQuant4Tensor(op, w));
  if (w.num_elems != s.out_features * s.in_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the 4-bit weight holds ", w.num_elems,
        " values, expected out_features*in_features = ", s.out_features * s.in_features));
  }
  const int64_t needed = Quant4LinearWorkspaceElems(s, 1, compute_dtype);
  if (static_cast<int64_t>(workspace.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": workspace has ", workspace.size(), " f32 elements, needs at least ", needed,
        " (one tile", compute_dtype == DType::kF32 ? "" : " and the rounded activations",
        " for compute dtype ", DTypeName(compute_dtype), "; Quant4LinearWorkspaceElems)"));
  }
  return absl::OkStatus();
}

// dst[i] = src[i] rounded to `dtype` (bf16 or f16, round-to-nearest-even as memory/convert.h) and
// widened back to f32 (exact), for i < n; dst may equal src. Through a 16-bit buffer in L1.
void RoundValues(DType dtype, const float* src, float* dst, int64_t n) {
  constexpr int64_t kPiece = 1024;
  uint16_t bits[kPiece];
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t len = std::min(kPiece, n - i);
    if (dtype == DType::kBF16) {
      ConvertF32ToBF16(src + i, bits, len);
      ConvertBF16ToF32(bits, dst + i, len);
    } else {
      ConvertF32ToF16(src + i, bits, len);
      ConvertF16ToF32(bits, dst + i, len);
    }
  }
}

// RoundValues in fixed ranges on `pool` (the bits do not depend on it).
void RoundValues(DType dtype, const float* src, float* dst, int64_t n, ThreadPool* pool) {
  ParallelForRanges(pool, n, 64 * 1024, [&](int64_t begin, int64_t end) {
    RoundValues(dtype, src + begin, dst + begin, end - begin);
  });
}

// A grid block's f32 product before it is rounded (16-bit backward): one per thread, grown as
// needed (at most 256 x 256) and kept until the thread ends.
float* BlockScratch(int64_t elems) {
  thread_local std::vector<float> block;
  if (static_cast<int64_t>(block.size()) < elems) block.resize(elems);
  return block.data();
}

// Runs the grid of C [m, n] in waves of `slots` column blocks: dequantize(tile, n0, bn) fills a
// slot's tile (returning a Status), then gemm(tile, m0, bm, n0, bn) runs each grid block of the
// wave.
template <typename Dequant, typename Block>
absl::Status RunWaves(int64_t m, int64_t n, int64_t tile_elems, absl::Span<float> workspace,
                      ThreadPool* pool, Dequant dequantize, Block gemm) {
  const kernels_internal::GemmBlocks blocks = GemmBlocksFor(m, n);
  const int64_t m_blocks = NumTasks(m, blocks.rows), n_blocks = NumTasks(n, blocks.cols);
  const int64_t slots =
      std::min<int64_t>(n_blocks, static_cast<int64_t>(workspace.size()) / tile_elems);
  for (int64_t first = 0; first < n_blocks; first += slots) {
    const int64_t wave = std::min(slots, n_blocks - first);
    std::vector<absl::Status> status(wave);
    ParallelFor(pool, wave, [&](int64_t s) {
      const int64_t n0 = (first + s) * blocks.cols;
      status[s] = dequantize(workspace.data() + s * tile_elems, n0, std::min(blocks.cols, n - n0));
    });
    for (const absl::Status& s : status) RETURN_IF_ERROR(s);
    ParallelFor(pool, wave * m_blocks, [&](int64_t task) {
      const int64_t s = task % wave, m0 = (task / wave) * blocks.rows;
      const int64_t n0 = (first + s) * blocks.cols;
      gemm(workspace.data() + s * tile_elems, m0, std::min(blocks.rows, m - m0), n0,
           std::min(blocks.cols, n - n0));
    });
  }
  return absl::OkStatus();
}

// The 16-bit compute paths (nf4_linear.h): arguments already checked. The workspace holds the
// rounded activations (rows * max(in, out) f32), then the tiles.
int64_t ActivationElems(const LinearShape& s) {
  return s.rows * std::max(s.in_features, s.out_features);
}

// Rows n0 .. n0+bn of W, dequantized and rounded to `dt`.
absl::Status DequantizeRows(const Quant4Tensor& w, int64_t I, DType dt, float* tile, int64_t n0,
                            int64_t bn) {
  RETURN_IF_ERROR(Dequantize4Bit(w, n0 * I, bn * I, DType::kF32, tile));
  RoundValues(dt, tile, tile, bn * I);
  return absl::OkStatus();
}

absl::Status Quant4LinearForward16(const LinearShape& shape, absl::Span<const float> x,
                                   const Quant4Tensor& w, absl::Span<const float> b,
                                   absl::Span<float> y, absl::Span<float> workspace,
                                   ThreadPool* pool, DType dt) {
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  const int64_t act = ActivationElems(shape);
  float* xr = workspace.data();
  RoundValues(dt, x.data(), xr, N * I, pool);
  float beta = 0.0f;
  if (shape.bias) {  // y = bias rounded, broadcast over rows; the GEMM adds its f32 sum to it
    const int64_t grain = kernels_internal::RowsPerTask(O);
    ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
      const int64_t end = std::min(N, (task + 1) * grain);
      for (int64_t r = task * grain; r < end; ++r) RoundValues(dt, b.data(), y.data() + r * O, O);
    });
    beta = 1.0f;
  }
  return RunWaves(
      N, O, Quant4LinearTileElems(shape), workspace.subspan(act), pool,
      [&](float* tile, int64_t n0, int64_t bn) { return DequantizeRows(w, I, dt, tile, n0, bn); },
      [&](const float* tile, int64_t m0, int64_t bm, int64_t n0, int64_t bn) {
        float* c = y.data() + m0 * O + n0;
        GemmSingleCall(false, true, bm, bn, I, 1.0f, xr + m0 * I, I, tile, I, beta, c, O);
        for (int64_t r = 0; r < bm; ++r) RoundValues(dt, c + r * O, c + r * O, bn);
      });
}

absl::Status Quant4LinearBackwardInput16(const LinearShape& shape, const Quant4Tensor& w,
                                         absl::Span<const float> dy, absl::Span<float> dx,
                                         absl::Span<float> workspace, ThreadPool* pool, DType dt) {
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  const int64_t act = ActivationElems(shape);
  float* dyr = workspace.data();
  RoundValues(dt, dy.data(), dyr, N * O, pool);
  return RunWaves(
      N, I, Quant4LinearTileElems(shape), workspace.subspan(act), pool,
      [&](float* tile, int64_t n0, int64_t bn) {
        for (int64_t o = 0; o < O; ++o) {
          RETURN_IF_ERROR(Dequantize4Bit(w, o * I + n0, bn, DType::kF32, tile + o * bn));
        }
        RoundValues(dt, tile, tile, O * bn);
        return absl::OkStatus();
      },
      [&](const float* tile, int64_t m0, int64_t bm, int64_t n0, int64_t bn) {
        // g = dy_r tile in f32, rounded to dt (grad_A's dtype), then added to dx in f32.
        float* g = BlockScratch(bm * bn);
        GemmSingleCall(false, false, bm, bn, O, 1.0f, dyr + m0 * O, O, tile, bn, 0.0f, g, bn);
        RoundValues(dt, g, g, bm * bn);
        for (int64_t r = 0; r < bm; ++r) {
          kernels_internal::simd::AddTo(g + r * bn, dx.data() + (m0 + r) * I + n0, bn);
        }
      });
}

}  // namespace

// A tile holds one column block of the grid (never wider than the matrix: the grid's blocks are at
// least 64 wide).
int64_t Quant4LinearTileElems(const LinearShape& s) {
  const int64_t forward =
      std::min(GemmBlocksFor(s.rows, s.out_features).cols, s.out_features) * s.in_features;
  const int64_t backward =
      std::min(GemmBlocksFor(s.rows, s.in_features).cols, s.in_features) * s.out_features;
  return std::max(forward, backward);
}

absl::Status Quant4LinearForward(const LinearShape& shape, absl::Span<const float> x,
                                 const Quant4Tensor& w, absl::Span<const float> b,
                                 absl::Span<float> y, absl::Span<float> workspace, ThreadPool* pool,
                                 DType compute_dtype) {
  constexpr char kOp[] = "Quant4LinearForward";
  RETURN_IF_ERROR(CheckCommon(kOp, shape, w, workspace, compute_dtype));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kOp, "x", x, N * I, "rows*in_features"));
  RETURN_IF_ERROR(CheckElems(kOp, "b", b, shape.bias ? O : 0,
                             shape.bias ? "out_features" : "0: the shape has no bias"));
  RETURN_IF_ERROR(CheckElems(kOp, "y", y, N * O, "rows*out_features"));
  if (compute_dtype != DType::kF32) {
    return Quant4LinearForward16(shape, x, w, b, y, workspace, pool, compute_dtype);
  }
  float beta = 0.0f;
  if (shape.bias) {  // y = b broadcast over rows, then y += x W^T (as LinearForward).
    const int64_t grain = kernels_internal::RowsPerTask(O);
    ParallelFor(pool, NumTasks(N, grain), [&](int64_t task) {
      const int64_t end = std::min(N, (task + 1) * grain);
      for (int64_t r = task * grain; r < end; ++r) std::copy(b.begin(), b.end(), y.data() + r * O);
    });
    beta = 1.0f;
  }
  return RunWaves(
      N, O, Quant4LinearTileElems(shape), workspace, pool,
      [&](float* tile, int64_t n0, int64_t bn) {
        // Rows n0 .. n0+bn of W: contiguous values.
        return Dequantize4Bit(w, n0 * I, bn * I, DType::kF32, tile);
      },
      [&](const float* tile, int64_t m0, int64_t bm, int64_t n0, int64_t bn) {
        GemmSingleCall(false, true, bm, bn, I, 1.0f, x.data() + m0 * I, I, tile, I, beta,
                       y.data() + m0 * O + n0, O);
      });
}

absl::Status Quant4LinearBackwardInput(const LinearShape& shape, const Quant4Tensor& w,
                                       absl::Span<const float> dy, absl::Span<float> dx,
                                       absl::Span<float> workspace, ThreadPool* pool,
                                       DType compute_dtype) {
  constexpr char kOp[] = "Quant4LinearBackwardInput";
  RETURN_IF_ERROR(CheckCommon(kOp, shape, w, workspace, compute_dtype));
  const int64_t N = shape.rows, I = shape.in_features, O = shape.out_features;
  RETURN_IF_ERROR(CheckElems(kOp, "dy", dy, N * O, "rows*out_features"));
  RETURN_IF_ERROR(CheckElems(kOp, "dx", dx, N * I, "rows*in_features"));
  if (compute_dtype != DType::kF32) {
    return Quant4LinearBackwardInput16(shape, w, dy, dx, workspace, pool, compute_dtype);
  }
  return RunWaves(
      N, I, Quant4LinearTileElems(shape), workspace, pool,
      [&](float* tile, int64_t n0, int64_t bn) {
        // Columns n0 .. n0+bn of W: a segment of every row, packed [O, bn].
        for (int64_t o = 0; o < O; ++o) {
          RETURN_IF_ERROR(Dequantize4Bit(w, o * I + n0, bn, DType::kF32, tile + o * bn));
        }
        return absl::OkStatus();
      },
      [&](const float* tile, int64_t m0, int64_t bm, int64_t n0, int64_t bn) {
        GemmSingleCall(false, false, bm, bn, O, 1.0f, dy.data() + m0 * O, O, tile, bn, 1.0f,
                       dx.data() + m0 * I + n0, I);
      });
}

}  // namespace ps
