// Highway implementation of model/kernels/internal/attention_simd.h, compiled once per SIMD target
// (hwy/foreach_target.h) and dispatched at run time, like internal/simd.cc. See the header for why
// the results equal the reference loops of internal/attention_reference.h bit for bit; the comments
// below point at the reference statement each step mirrors.
#include "model/kernels/internal/attention_simd.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "model/kernels/attention_math.h"
#include "model/kernels/softmax_math.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/kernels/internal/attention_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h: per-target, re-included with each HWY_TARGET.
#include "model/kernels/internal/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ps::kernels_internal::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The accumulations below keep one register per vector chunk of the row, four chunks at a time,
// so that four independent multiply-add chains run side by side (one chain per chunk would wait
// on the FMA latency at every key). Per lane the operations and their order are the reference's.

// acc[0, n) = correction * acc + sum_j p[j] * rows[j][0, n) for j in [0, count), per lane in key
// order: the reference's ScaleInPlace(correction, acc) followed by one Axpy(p[j], row j, acc) per
// key. Row j starts at rows + j * stride.
HWY_INLINE void RescaleAndAccumulate(D d, float correction, const float* p, const float* rows,
                                     int64_t stride, int64_t count, float* acc, size_t n) {
  const size_t N = hn::Lanes(d);
  const V c = hn::Set(d, correction);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    V a0 = hn::Mul(c, hn::LoadU(d, acc + i));
    V a1 = hn::Mul(c, hn::LoadU(d, acc + i + N));
    V a2 = hn::Mul(c, hn::LoadU(d, acc + i + 2 * N));
    V a3 = hn::Mul(c, hn::LoadU(d, acc + i + 3 * N));
    for (int64_t j = 0; j < count; ++j) {
      const V w = hn::Set(d, p[j]);
      const float* r = rows + j * stride + i;
      a0 = hn::MulAdd(w, hn::LoadU(d, r), a0);
      a1 = hn::MulAdd(w, hn::LoadU(d, r + N), a1);
      a2 = hn::MulAdd(w, hn::LoadU(d, r + 2 * N), a2);
      a3 = hn::MulAdd(w, hn::LoadU(d, r + 3 * N), a3);
    }
    hn::StoreU(a0, d, acc + i);
    hn::StoreU(a1, d, acc + i + N);
    hn::StoreU(a2, d, acc + i + 2 * N);
    hn::StoreU(a3, d, acc + i + 3 * N);
  }
  for (; i + N <= n; i += N) {
    V a = hn::Mul(c, hn::LoadU(d, acc + i));
    for (int64_t j = 0; j < count; ++j) {
      a = hn::MulAdd(hn::Set(d, p[j]), hn::LoadU(d, rows + j * stride + i), a);
    }
    hn::StoreU(a, d, acc + i);
  }
  if (i < n) {
    const size_t r = n - i;
    TailBuffers t;
    V a = hn::Mul(c, LoadTail(d, acc + i, r, 0.0f, t.in));
    for (int64_t j = 0; j < count; ++j) {
      a = hn::MulAdd(hn::Set(d, p[j]), LoadTail(d, rows + j * stride + i, r, 0.0f, t.in), a);
    }
    StoreTail(d, a, acc + i, r, t.out);
  }
}

// acc[0, n) += sum_j w[j * w_stride] * rows[j][0, n) for j in [0, count), per lane in j order
// (one reference Axpy per j). Row j starts at rows + j * stride.
HWY_INLINE void Accumulate(D d, const float* w, int64_t w_stride, const float* rows, int64_t stride,
                           int64_t count, float* acc, size_t n) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    V a0 = hn::LoadU(d, acc + i);
    V a1 = hn::LoadU(d, acc + i + N);
    V a2 = hn::LoadU(d, acc + i + 2 * N);
    V a3 = hn::LoadU(d, acc + i + 3 * N);
    for (int64_t j = 0; j < count; ++j) {
      const V wj = hn::Set(d, w[j * w_stride]);
      const float* r = rows + j * stride + i;
      a0 = hn::MulAdd(wj, hn::LoadU(d, r), a0);
      a1 = hn::MulAdd(wj, hn::LoadU(d, r + N), a1);
      a2 = hn::MulAdd(wj, hn::LoadU(d, r + 2 * N), a2);
      a3 = hn::MulAdd(wj, hn::LoadU(d, r + 3 * N), a3);
    }
    hn::StoreU(a0, d, acc + i);
    hn::StoreU(a1, d, acc + i + N);
    hn::StoreU(a2, d, acc + i + 2 * N);
    hn::StoreU(a3, d, acc + i + 3 * N);
  }
  for (; i + N <= n; i += N) {
    V a = hn::LoadU(d, acc + i);
    for (int64_t j = 0; j < count; ++j) {
      a = hn::MulAdd(hn::Set(d, w[j * w_stride]), hn::LoadU(d, rows + j * stride + i), a);
    }
    hn::StoreU(a, d, acc + i);
  }
  if (i < n) {
    const size_t r = n - i;
    TailBuffers t;
    V a = LoadTail(d, acc + i, r, 0.0f, t.in);
    for (int64_t j = 0; j < count; ++j) {
      a = hn::MulAdd(hn::Set(d, w[j * w_stride]), LoadTail(d, rows + j * stride + i, r, 0.0f, t.in),
                     a);
    }
    StoreTail(d, a, acc + i, r, t.out);
  }
}

void AttentionForwardRowsImpl(const AttentionHeadView& head, int64_t tile, int64_t i0, int64_t i1,
                              float* out, int64_t out_stride, float* lse, float* scores,
                              float* acc) {
  const D d;
  const size_t hd = static_cast<size_t>(head.head_dim);
  const int64_t kv_stride = head.kv_stride;
  const float scale = head.scale;
  for (int64_t i = i0; i < i1; ++i) {
    const float* q = head.q + i * head.q_stride;
    float m = NegativeInfinity<float>(), l = 0;
    std::fill(acc, acc + hd, 0.0f);
    for (int64_t j0 = head.FirstKey(i); j0 <= i; j0 += tile) {
      const int64_t j1 = std::min(i + 1, j0 + tile);  // causal: keys j <= i
      float tile_max = NegativeInfinity<float>();
      for (int64_t j = j0; j < j1; ++j) {
        const float s = scale * DotExact(d, q, head.k + j * kv_stride, hd);
        scores[j - j0] = s;
        tile_max = MaxOf(tile_max, s);
      }
      const float new_m = MaxOf(m, tile_max);
      const float correction = SoftmaxRescale(m, new_m);  // 0 on the first tile (m = -inf)
      l *= correction;
      // The weights replace the scores; l sums them in key order, as the reference does.
      for (int64_t j = j0; j < j1; ++j) {
        const float p = SoftmaxWeight(scores[j - j0], new_m);
        l += p;
        scores[j - j0] = p;
      }
      RescaleAndAccumulate(d, correction, scores, head.v + j0 * kv_stride, kv_stride, j1 - j0, acc,
                           hd);
      m = new_m;
    }
    float* o = out + i * out_stride;
    const float inv_l = 1.0f / l;
    for (size_t c = 0; c < hd; ++c) o[c] = acc[c] * inv_l;
    lse[i] = SoftmaxLogSumExp(SoftmaxState<float>{m, l});
  }
}

void AttentionBackwardHeadImpl(const AttentionHeadView& head, const float* out, const float* dout,
                               int64_t out_stride, const float* lse, float* dq, float* dk,
                               float* dv) {
  constexpr int64_t kB = kAttentionBlock;
  const D d;
  const size_t hd = static_cast<size_t>(head.head_dim);
  const int64_t L = head.seq_len, q_stride = head.q_stride, kv_stride = head.kv_stride;
  const float scale = head.scale;
  // P_ij and scale * dS_ij of one (query block, key block), row-major by query.
  HWY_ALIGN float p_block[kB * kB];
  HWY_ALIGN float g_block[kB * kB];
  for (int64_t j0 = 0; j0 < L; j0 += kB) {
    const int64_t j1 = std::min(L, j0 + kB);
    // Query blocks from the key block on: earlier queries see none of these keys; and once a
    // block's first query starts after the key block, so do all later ones (the first visible key
    // never decreases).
    for (int64_t i0 = j0; i0 < L && head.FirstKey(i0) < j1; i0 += kB) {
      const int64_t i1 = std::min(L, i0 + kB);
      for (int64_t i = i0; i < i1; ++i) {
        const float* q = head.q + i * q_stride;
        const float* dout_i = dout + i * out_stride;
        const float D_i = DotExact(d, dout_i, out + i * out_stride, hd);
        const float row_lse = lse[i];
        float* p_row = p_block + (i - i0) * kB;
        float* g_row = g_block + (i - i0) * kB;
        const int64_t j_begin = std::max(j0, head.FirstKey(i)), j_end = std::min(j1, i + 1);
        // In three passes over the row's keys, so that independent dot products (and then the
        // exp calls) overlap instead of waiting on each other: the scores into p_row, the dP
        // values into g_row, then P and scale * dS in place. Keys the row does not see are left
        // unset and never read.
        for (int64_t j = j_begin; j < j_end; ++j) {
          p_row[j - j0] = scale * DotExact(d, q, head.k + j * kv_stride, hd);
        }
        for (int64_t j = j_begin; j < j_end; ++j) {
          g_row[j - j0] = DotExact(d, dout_i, head.v + j * kv_stride, hd);
        }
        for (int64_t j = j_begin; j < j_end; ++j) {
          const float p = AttentionProbability(p_row[j - j0], row_lse);
          const float dS = AttentionScoreGrad(p, g_row[j - j0], D_i);
          p_row[j - j0] = p;
          g_row[j - j0] = scale * dS;
        }
      }
      // dk_j += scale dS_ij q_i and dv_j += P_ij dO_i over the block's queries that see j,
      // ascending: i >= j, and i below i_stop, the block's first query whose first visible key
      // is after j (it only moves forward as j grows).
      int64_t i_stop = i0;
      for (int64_t j = j0; j < j1; ++j) {
        while (i_stop < i1 && head.FirstKey(i_stop) <= j) ++i_stop;
        const int64_t i_begin = std::max(i0, j);
        if (i_begin >= i_stop) continue;
        const int64_t col = j - j0, row = i_begin - i0;
        Accumulate(d, g_block + row * kB + col, kB, head.q + i_begin * q_stride, q_stride,
                   i_stop - i_begin, dk + j * kv_stride, hd);
        Accumulate(d, p_block + row * kB + col, kB, dout + i_begin * out_stride, out_stride,
                   i_stop - i_begin, dv + j * kv_stride, hd);
      }
      // dq_i += scale dS_ij k_j over the block's keys that query i sees, ascending.
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t j_begin = std::max(j0, head.FirstKey(i)), j_end = std::min(j1, i + 1);
        if (j_begin >= j_end) continue;
        Accumulate(d, g_block + (i - i0) * kB + (j_begin - j0), 1, head.k + j_begin * kv_stride,
                   kv_stride, j_end - j_begin, dq + i * q_stride, hd);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace ps::kernels_internal::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ps::kernels_internal::simd {

HWY_EXPORT(AttentionForwardRowsImpl);
HWY_EXPORT(AttentionBackwardHeadImpl);

void AttentionForwardRows(const AttentionHeadView& head, int64_t tile, int64_t i0, int64_t i1,
                          float* out, int64_t out_stride, float* lse, float* scores, float* acc) {
  HWY_DYNAMIC_DISPATCH(AttentionForwardRowsImpl)
  (head, tile, i0, i1, out, out_stride, lse, scores, acc);
}

void AttentionBackwardHead(const AttentionHeadView& head, const float* out, const float* dout,
                           int64_t out_stride, const float* lse, float* dq, float* dk, float* dv) {
  HWY_DYNAMIC_DISPATCH(AttentionBackwardHeadImpl)(head, out, dout, out_stride, lse, dq, dk, dv);
}

}  // namespace ps::kernels_internal::simd
#endif  // HWY_ONCE
