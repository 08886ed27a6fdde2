// The reference schedule of the CPU attention kernels (model/kernels/attention.h): the loops as
// first written, one simd::Dot / simd::Axpy / simd::Scale call per score and per key (scalar loops
// for double). attention.cc runs them for double; for float it runs internal/attention_simd.h,
// which computes the same bits faster, and attention_test compares the two bit for bit.
//
// Both functions assume the shapes and buffer sizes were checked (attention.cc does). Threading
// and determinism as attention.h describes.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_REFERENCE_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_REFERENCE_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "model/kernels/attention.h"
#include "model/kernels/attention_math.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"
#include "model/kernels/softmax_math.h"

namespace ps::kernels_internal {
namespace attention_reference {

// The inner loops: vectorized for float (internal/simd.h), scalar for double.
template <typename T>
inline T DotProduct(const T* a, const T* b, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return kernels_internal::simd::Dot(a, b, n);
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// y += alpha x.
template <typename T>
inline void Axpy(T alpha, const T* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    kernels_internal::simd::Axpy(alpha, x, y, n);
  } else {
    for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
  }
}

// y *= alpha.
template <typename T>
inline void ScaleInPlace(T alpha, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    kernels_internal::simd::Scale(alpha, y, n);
  } else {
    for (int64_t d = 0; d < n; ++d) y[d] *= alpha;
  }
}

// Decodes a work item (b, h, tile index) from its number.
struct Item {
  int64_t b, h, tile;
};
inline Item DecodeItem(int64_t item, int64_t num_heads, int64_t num_tiles) {
  return {item / (num_heads * num_tiles), (item / num_tiles) % num_heads, item % num_tiles};
}

}  // namespace attention_reference

// Forward: out and lse from qkv, workspace as AttentionWorkspaceElems.
template <typename T>
void AttentionForwardReference(const AttentionShape& shape, absl::Span<const T> qkv,
                               absl::Span<T> out, absl::Span<T> lse, absl::Span<T> workspace,
                               ThreadPool* pool) {
  using attention_reference::Axpy;
  using attention_reference::DecodeItem;
  using attention_reference::DotProduct;
  using attention_reference::Item;
  using attention_reference::ScaleInPlace;
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels, H = shape.num_heads;
  const int64_t hd = C / H, tile = shape.tile;
  const int num_slots = pool == nullptr ? 1 : pool->num_threads();
  const T scale = AttentionScale<T>(hd);
  const int64_t num_tiles = NumTasks(L, tile);
  const int64_t num_items = B * H * num_tiles;
  // Slot s runs items s, s + num_slots, ... with its own score row and output row.
  ParallelFor(pool, num_slots, [&](int64_t slot) {
    T* scores = workspace.data() + slot * (tile + hd);
    T* acc = scores + tile;
    for (int64_t item = slot; item < num_items; item += num_slots) {
      const Item it = DecodeItem(item, H, num_tiles);
      const T* base = qkv.data() + it.b * L * 3 * C;
      const int64_t i0 = it.tile * tile, i1 = std::min(L, i0 + tile);
      for (int64_t i = i0; i < i1; ++i) {
        const T* q = base + i * 3 * C + it.h * hd;
        T m = NegativeInfinity<T>(), l = 0;
        std::fill(acc, acc + hd, T{0});
        for (int64_t j0 = 0; j0 <= i; j0 += tile) {
          const int64_t j1 = std::min(i + 1, j0 + tile);  // causal: keys j <= i
          T tile_max = NegativeInfinity<T>();
          for (int64_t j = j0; j < j1; ++j) {
            const T s = scale * DotProduct(q, base + j * 3 * C + C + it.h * hd, hd);
            scores[j - j0] = s;
            tile_max = MaxOf(tile_max, s);
          }
          const T new_m = MaxOf(m, tile_max);
          const T correction = SoftmaxRescale(m, new_m);  // 0 on the first tile (m = -inf)
          l *= correction;
          ScaleInPlace(correction, acc, hd);
          for (int64_t j = j0; j < j1; ++j) {
            const T p = SoftmaxWeight(scores[j - j0], new_m);
            l += p;
            Axpy(p, base + j * 3 * C + 2 * C + it.h * hd, acc, hd);
          }
          m = new_m;
        }
        T* o = out.data() + (it.b * L + i) * C + it.h * hd;
        const T inv_l = T{1} / l;
        for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv_l;
        lse[(it.b * H + it.h) * L + i] = SoftmaxLogSumExp(SoftmaxState<T>{m, l});
      }
    }
  });
}

// Backward: dqkv += the gradient.
template <typename T>
void AttentionBackwardReference(const AttentionShape& shape, absl::Span<const T> qkv,
                                absl::Span<const T> out, absl::Span<const T> lse,
                                absl::Span<const T> dout, absl::Span<T> dqkv, ThreadPool* pool) {
  using attention_reference::Axpy;
  using attention_reference::DecodeItem;
  using attention_reference::DotProduct;
  using attention_reference::Item;
  const int64_t B = shape.batch, L = shape.seq_len, C = shape.channels, H = shape.num_heads;
  const int64_t hd = C / H, tile = shape.tile;
  const T scale = AttentionScale<T>(hd);
  const int64_t num_tiles = NumTasks(L, tile);
  const int64_t num_items = B * H * num_tiles;
  // Pointers into row t of batch b, head h.
  auto q_of = [&](int64_t b, int64_t h, int64_t t) {
    return qkv.data() + (b * L + t) * 3 * C + h * hd;
  };
  auto row_of = [&](int64_t b, int64_t h, int64_t t) { return (b * L + t) * C + h * hd; };

  // Pass A: dk, dv for the keys of one tile, summing over queries i >= j in increasing order.
  ParallelFor(pool, num_items, [&](int64_t item) {
    const Item it = DecodeItem(item, H, num_tiles);
    const int64_t j0 = it.tile * tile, j1 = std::min(L, j0 + tile);
    for (int64_t i = j0; i < L; ++i) {
      const T* q = q_of(it.b, it.h, i);
      const T* o = out.data() + row_of(it.b, it.h, i);
      const T* dout_i = dout.data() + row_of(it.b, it.h, i);
      const T D = DotProduct(dout_i, o, hd);
      const T row_lse = lse[(it.b * H + it.h) * L + i];
      const int64_t j_end = std::min(j1, i + 1);
      for (int64_t j = j0; j < j_end; ++j) {
        const T* k = q_of(it.b, it.h, j) + C;
        const T* v = k + C;
        const T p = AttentionProbability(scale * DotProduct(q, k, hd), row_lse);
        const T dS = AttentionScoreGrad(p, DotProduct(dout_i, v, hd), D);
        T* dk = dqkv.data() + (it.b * L + j) * 3 * C + C + it.h * hd;
        T* dv = dk + C;
        Axpy(scale * dS, q, dk, hd);
        Axpy(p, dout_i, dv, hd);
      }
    }
  });
  // Pass B: dq for the queries of one tile, summing over keys j <= i in increasing order.
  ParallelFor(pool, num_items, [&](int64_t item) {
    const Item it = DecodeItem(item, H, num_tiles);
    const int64_t i0 = it.tile * tile, i1 = std::min(L, i0 + tile);
    for (int64_t i = i0; i < i1; ++i) {
      const T* q = q_of(it.b, it.h, i);
      const T* dout_i = dout.data() + row_of(it.b, it.h, i);
      const T D = DotProduct(dout_i, out.data() + row_of(it.b, it.h, i), hd);
      const T row_lse = lse[(it.b * H + it.h) * L + i];
      T* dq = dqkv.data() + (it.b * L + i) * 3 * C + it.h * hd;
      for (int64_t j = 0; j <= i; ++j) {
        const T* k = q_of(it.b, it.h, j) + C;
        const T* v = k + C;
        const T p = AttentionProbability(scale * DotProduct(q, k, hd), row_lse);
        const T dS = AttentionScoreGrad(p, DotProduct(dout_i, v, hd), D);
        Axpy(scale * dS, k, dq, hd);
      }
    }
  });
}

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_REFERENCE_H_
