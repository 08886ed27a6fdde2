// The memory cost of gradient accumulation (gradient_accumulation_steps > 1), for memory plans.
//
// With k > 1 micro-batches per optimizer step, HybridAdam (optimizer/hybrid_adam.h) keeps one f32
// accumulator element per parameter of the chunks this rank owns (ZeRO: about 1/N of the model on
// each of N ranks), in host memory, for the whole run; nothing when k == 1. Chunk payloads are
// unchanged.
//
// Thread safety: pure function.
#ifndef PATRICKSTAR_OPTIMIZER_GRAD_ACCUMULATOR_H_
#define PATRICKSTAR_OPTIMIZER_GRAD_ACCUMULATOR_H_

#include <cstdint>

namespace ps {

// Host bytes of the gradient accumulator of a rank owning `owned_param_elems` parameters (the
// tensors in the chunks whose master payload it holds; HybridAdam::owned_param_elems()) with
// `accumulation_steps` micro-batches per step: 4 * owned_param_elems when accumulation_steps > 1,
// else 0. REQUIRES: owned_param_elems >= 0 (negative values count as 0).
constexpr int64_t GradientAccumulatorBytes(int64_t owned_param_elems, int64_t accumulation_steps) {
  if (accumulation_steps <= 1 || owned_param_elems <= 0) return 0;
  return owned_param_elems * static_cast<int64_t>(sizeof(float));
}

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_GRAD_ACCUMULATOR_H_
