// The reference schedule of the CPU attention kernel (model/kernels/gqa_attention.h): the loops
// as first written, one simd::Dot / simd::Axpy / simd::Scale call per score and per key (scalar
// loops for double). gqa_attention.cc runs them for double; for float it runs
// internal/attention_simd.h, which computes the same bits faster, and gqa_attention_test compares
// the two bit for bit.
//
// Both functions assume the shapes and buffer sizes were checked (gqa_attention.cc does).
// Threading and determinism as gqa_attention.h describes.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_REFERENCE_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_REFERENCE_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "model/kernels/attention_math.h"
#include "model/kernels/gqa_attention.h"
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

// A work item (b, head, tile index) from its number; `heads` is Hq or Hkv depending on the pass.
struct Item {
  int64_t b, h, tile;
};
inline Item DecodeItem(int64_t item, int64_t heads, int64_t num_tiles) {
  return {item / (heads * num_tiles), (item / num_tiles) % heads, item % num_tiles};
}

// Element offsets of head rows: q (dq) and k, v (dk, dv) with their strides, out and dout packed.
struct Rows {
  int64_t L, Hq, D, q_stride, kv_stride;
  int64_t Q(int64_t b, int64_t t, int64_t h) const { return (b * L + t) * q_stride + h * D; }
  int64_t KV(int64_t b, int64_t t, int64_t g) const { return (b * L + t) * kv_stride + g * D; }
  int64_t Out(int64_t b, int64_t t, int64_t h) const { return ((b * L + t) * Hq + h) * D; }
  int64_t Lse(int64_t b, int64_t h, int64_t t) const { return (b * Hq + h) * L + t; }
};
inline Rows RowsOf(const GqaAttentionShape& s) {
  return {s.seq_len, s.num_heads, s.head_dim, GqaQRowStride(s), GqaKvRowStride(s)};
}

// The visible keys of query (b, i): [First(b, i), i]. key_start empty: plain causal (and window).
struct Mask {
  absl::Span<const int32_t> key_start;  // [B*T] or empty
  int64_t L, window;
  int64_t First(int64_t b, int64_t i) const {
    return AttentionFirstKey(i, key_start.empty() ? 0 : key_start[b * L + i], window);
  }
};

}  // namespace attention_reference

// Forward: out and lse from q, k, v; workspace as GqaAttentionWorkspaceElems.
template <typename T>
void GqaAttentionForwardReference(const GqaAttentionShape& shape, absl::Span<const T> q,
                                  absl::Span<const T> k, absl::Span<const T> v, absl::Span<T> out,
                                  absl::Span<T> lse, absl::Span<T> workspace, ThreadPool* pool,
                                  absl::Span<const int32_t> key_start = {}) {
  using attention_reference::Axpy;
  using attention_reference::DecodeItem;
  using attention_reference::DotProduct;
  using attention_reference::Item;
  using attention_reference::ScaleInPlace;
  const int64_t B = shape.batch, L = shape.seq_len, Hq = shape.num_heads, Hkv = shape.num_kv_heads,
                D = shape.head_dim, tile = shape.tile;
  const attention_reference::Rows rows = attention_reference::RowsOf(shape);
  const attention_reference::Mask mask{key_start, L, shape.sliding_window};
  const int num_slots = pool == nullptr ? 1 : pool->num_threads();
  const int64_t group = Hq / Hkv;
  const T scale = AttentionScale<T>(D);
  const int64_t num_tiles = NumTasks(L, tile);
  const int64_t num_items = B * Hq * num_tiles;
  // Slot s runs items s, s + num_slots, ... with its own score row and output row.
  ParallelFor(pool, num_slots, [&](int64_t slot) {
    T* scores = workspace.data() + slot * (tile + D);
    T* acc = scores + tile;
    for (int64_t item = slot; item < num_items; item += num_slots) {
      const Item it = DecodeItem(item, Hq, num_tiles);
      const int64_t g = it.h / group;
      const int64_t i0 = it.tile * tile, i1 = std::min(L, i0 + tile);
      for (int64_t i = i0; i < i1; ++i) {
        const T* qi = q.data() + rows.Q(it.b, i, it.h);
        T m = NegativeInfinity<T>(), l = 0;
        std::fill(acc, acc + D, T{0});
        // Key tiles from the first visible key: keys before it are never touched.
        for (int64_t j0 = mask.First(it.b, i); j0 <= i; j0 += tile) {
          const int64_t j1 = std::min(i + 1, j0 + tile);  // causal: keys j <= i
          T tile_max = NegativeInfinity<T>();
          for (int64_t j = j0; j < j1; ++j) {
            const T s = scale * DotProduct(qi, k.data() + rows.KV(it.b, j, g), D);
            scores[j - j0] = s;
            tile_max = MaxOf(tile_max, s);
          }
          const T new_m = MaxOf(m, tile_max);
          const T correction = SoftmaxRescale(m, new_m);  // 0 on the first tile (m = -inf)
          l *= correction;
          ScaleInPlace(correction, acc, D);
          for (int64_t j = j0; j < j1; ++j) {
            const T p = SoftmaxWeight(scores[j - j0], new_m);
            l += p;
            Axpy(p, v.data() + rows.KV(it.b, j, g), acc, D);
          }
          m = new_m;
        }
        T* o = out.data() + rows.Out(it.b, i, it.h);
        const T inv_l = T{1} / l;
        for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv_l;
        lse[rows.Lse(it.b, it.h, i)] = SoftmaxLogSumExp(SoftmaxState<T>{m, l});
      }
    }
  });
}

// Backward: dq, dk, dv += the gradients.
template <typename T>
void GqaAttentionBackwardReference(const GqaAttentionShape& shape, absl::Span<const T> q,
                                   absl::Span<const T> k, absl::Span<const T> v,
                                   absl::Span<const T> out, absl::Span<const T> lse,
                                   absl::Span<const T> dout, absl::Span<T> dq, absl::Span<T> dk,
                                   absl::Span<T> dv, ThreadPool* pool,
                                   absl::Span<const int32_t> key_start = {}) {
  using attention_reference::Axpy;
  using attention_reference::DecodeItem;
  using attention_reference::DotProduct;
  using attention_reference::Item;
  const int64_t B = shape.batch, L = shape.seq_len, Hq = shape.num_heads, Hkv = shape.num_kv_heads,
                D = shape.head_dim, tile = shape.tile;
  const attention_reference::Rows rows = attention_reference::RowsOf(shape);
  const attention_reference::Mask mask{key_start, L, shape.sliding_window};
  const int64_t group = Hq / Hkv;
  const T scale = AttentionScale<T>(D);
  const int64_t num_tiles = NumTasks(L, tile);

  // Pass A: dk, dv for the keys of one tile of kv head g, summing over the group's query heads
  // (increasing) and, for each, over the queries i >= j that see j (increasing). The first visible
  // key never decreases with i, so the first query that sees none of the tile ends the walk.
  ParallelFor(pool, B * Hkv * num_tiles, [&](int64_t item) {
    const Item it = DecodeItem(item, Hkv, num_tiles);
    const int64_t g = it.h;
    const int64_t j0 = it.tile * tile, j1 = std::min(L, j0 + tile);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = j0; i < L; ++i) {
        const int64_t first = mask.First(it.b, i);
        if (first >= j1) break;
        const T* qi = q.data() + rows.Q(it.b, i, h);
        const T* dout_i = dout.data() + rows.Out(it.b, i, h);
        const T Di = DotProduct(dout_i, out.data() + rows.Out(it.b, i, h), D);
        const T row_lse = lse[rows.Lse(it.b, h, i)];
        const int64_t j_end = std::min(j1, i + 1);
        for (int64_t j = std::max(j0, first); j < j_end; ++j) {
          const int64_t kv = rows.KV(it.b, j, g);
          const T p = AttentionProbability(scale * DotProduct(qi, k.data() + kv, D), row_lse);
          const T dS = AttentionScoreGrad(p, DotProduct(dout_i, v.data() + kv, D), Di);
          Axpy(scale * dS, qi, dk.data() + kv, D);
          Axpy(p, dout_i, dv.data() + kv, D);
        }
      }
    }
  });
  // Pass B: dq for the queries of one tile of query head h, summing over its visible keys in
  // order.
  ParallelFor(pool, B * Hq * num_tiles, [&](int64_t item) {
    const Item it = DecodeItem(item, Hq, num_tiles);
    const int64_t g = it.h / group;
    const int64_t i0 = it.tile * tile, i1 = std::min(L, i0 + tile);
    for (int64_t i = i0; i < i1; ++i) {
      const T* qi = q.data() + rows.Q(it.b, i, it.h);
      const T* dout_i = dout.data() + rows.Out(it.b, i, it.h);
      const T Di = DotProduct(dout_i, out.data() + rows.Out(it.b, i, it.h), D);
      const T row_lse = lse[rows.Lse(it.b, it.h, i)];
      T* dqi = dq.data() + rows.Q(it.b, i, it.h);
      for (int64_t j = mask.First(it.b, i); j <= i; ++j) {
        const T* kj = k.data() + rows.KV(it.b, j, g);
        const T p = AttentionProbability(scale * DotProduct(qi, kj, D), row_lse);
        const T dS =
            AttentionScoreGrad(p, DotProduct(dout_i, v.data() + rows.KV(it.b, j, g), D), Di);
        Axpy(scale * dS, kj, dqi, D);
      }
    }
  });
}

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_ATTENTION_REFERENCE_H_
