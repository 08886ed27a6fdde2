// The two row-parallel passes over one [R, Vt] logits tile that the LM head + cross-entropy
// kernels share (lm_head_cross_entropy.cc over the whole vocabulary, vocab_blocks.cc over one row
// block of it): the forward's online-softmax update and the backward's logit gradient. Internal to
// model/kernels.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_LOGIT_TILES_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_LOGIT_TILES_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/thread_pool.h"
#include "model/kernels/cross_entropy_math.h"
#include "model/kernels/internal/kernel_util.h"
#include "model/kernels/internal/simd.h"
#include "model/kernels/softmax_math.h"

namespace ps::kernels_internal {

// The forward's pass over one logits tile z [R, Vt] (vocabulary columns v0 ...): per row, the
// online softmax state (run_max, run_sum) moves on by the tile, and the target's logit is picked
// up if it lies in the tile. Rows in fixed ranges on `pool`.
template <typename T>
void SoftmaxTile(const int32_t* targets, int64_t R, int64_t v0, int64_t Vt, const T* z, T* run_max,
                 T* run_sum, T* target_logit, ThreadPool* pool) {
  const int64_t grain = RowsPerTask(Vt, 8192);
  ParallelFor(pool, NumTasks(R, grain), [&](int64_t task) {
    const int64_t end = std::min(R, (task + 1) * grain);
    for (int64_t i = task * grain; i < end; ++i) {
      const T* zi = z + i * Vt;
      T tile_max = zi[0];
      if constexpr (std::is_same_v<T, float>) {
        tile_max = kernels_internal::simd::Max(zi, Vt);
      } else {
        for (int64_t v = 1; v < Vt; ++v) tile_max = MaxOf(tile_max, zi[v]);
      }
      const T new_max = MaxOf(run_max[i], tile_max);
      T sum = run_sum[i] * SoftmaxRescale(run_max[i], new_max);  // 0 on the first tile
      if constexpr (std::is_same_v<T, float>) {
        sum += kernels_internal::simd::SumExpMinus(zi, new_max, Vt);
      } else {
        for (int64_t v = 0; v < Vt; ++v) sum += SoftmaxWeight(zi[v], new_max);
      }
      run_max[i] = new_max;
      run_sum[i] = sum;
      const int64_t t = targets[i];
      if (t >= v0 && t < v0 + Vt) target_logit[i] = zi[t - v0];
    }
  });
}

// The backward's pass over one logits tile: dz = scale * (softmax - onehot), in place; zero for
// ignored rows.
template <typename T>
void LogitGradTile(const int32_t* targets, const T* lse, int32_t ignore_index, T scale, int64_t R,
                   int64_t v0, int64_t Vt, T* dz, ThreadPool* pool) {
  const int64_t grain = RowsPerTask(Vt, 8192);
  ParallelFor(pool, NumTasks(R, grain), [&](int64_t task) {
    const int64_t end = std::min(R, (task + 1) * grain);
    for (int64_t i = task * grain; i < end; ++i) {
      T* zi = dz + i * Vt;
      const int64_t t = targets[i];
      if (t == ignore_index) {
        std::fill(zi, zi + Vt, T{0});
        continue;
      }
      const T row_lse = lse[i];
      if constexpr (std::is_same_v<T, float>) {
        // CrossEntropyLogitGrad: scale * exp(z - lse), minus scale at the target.
        kernels_internal::simd::ScaledExpMinus(scale, row_lse, zi, Vt);
        if (t >= v0 && t < v0 + Vt) zi[t - v0] -= scale;
      } else {
        for (int64_t v = 0; v < Vt; ++v) {
          zi[v] = CrossEntropyLogitGrad(zi[v], row_lse, scale, v0 + v == t);
        }
      }
    }
  });
}

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_LOGIT_TILES_H_
