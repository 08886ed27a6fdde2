// Where a Llama-architecture training step's GEMM time goes, operator by operator (issue #38,
// "GEMMs nearer the peak"): every GEMM class of one layer (q/k/v/o, gate/up/down), the LoRA
// adapters' rank-r side GEMMs and the LM head's vocabulary tiles, each timed alone at the step's
// shape through the kernels the model runs (model/kernels/matmul.h MatmulForward[Bf16] /
// MatmulBackward[Bf16], lora.h LoraForward / LoraBackward, and the LM head tiles' GEMMs of
// internal/blas.h Gemm or internal/bf16_gemm.h GemmBf16), on the caller's thread pool, with its
// GFLOP/s and that rate's fraction of the GEMM probe (the caller measures the probe in the same
// run, so load on a shared machine hits both alike).
//
// Each row is one kernel call at one shape; "calls per step" counts the forward, the recomputed
// forward under activation checkpointing, and the backward, times the layers. A frozen base's
// backward computes dX only (no dW); the adapters are f32 (their kernels' dtype in the model).
#ifndef PATRICKSTAR_BENCHMARKS_INTERNAL_GEMM_BREAKDOWN_H_
#define PATRICKSTAR_BENCHMARKS_INTERNAL_GEMM_BREAKDOWN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "base/thread_pool.h"

namespace ps::benchmarks_internal {

struct GemmBreakdownShape {
  int64_t rows = 0;           // tokens per step: micro batch x sequence
  int64_t hidden = 0;         // C
  int64_t q_dim = 0;          // heads x head_dim
  int64_t kv_dim = 0;         // key/value heads x head_dim
  int64_t intermediate = 0;   // the MLP's width
  int64_t vocab = 0;          // the LM head's rows
  int64_t vocab_tile = 2048;  // the LM head's tile of vocabulary rows (GptModelOptions)
  int64_t row_tile = 256;     // the LM head's tile of token rows
  int64_t layers = 1;
  bool bf16 = false;         // base weights bf16 (the model's bf16 GEMMs) or f32
  bool frozen_base = false;  // LoRA: the base's backward computes dX only
  bool activation_checkpointing = false;
  int64_t lora_rank = 0;                  // 0: no adapters
  std::vector<std::string> lora_targets;  // q_proj, k_proj, v_proj, o_proj, gate_proj, ...
};

struct GemmBreakdownRow {
  std::string op;      // e.g. "q_proj forward", "LoRA q_proj backward", "LM head logits"
  std::string shape;   // the GEMMs' m x n x k
  int64_t calls = 0;   // per step
  double flops = 0;    // per call (multiply-add = 2)
  double seconds = 0;  // per call, best of the repetitions
};

// Times every row (a warm-up call, then the best of `reps`) on `pool` (may be null).
std::vector<GemmBreakdownRow> TimeLlamaGemms(const GemmBreakdownShape& shape, int reps,
                                             ThreadPool* pool);

// The skinny-GEMM grid of issue #38 against the grid before it, in the same run: each distinct
// sgemm shape of the step (the base projections forward and dX, the LM head tiles; f32 operands,
// as the f32 kernels and the bf16 fallback hand OpenBLAS) computed alternately by
// kernels_internal::Gemm (one row block of all m <= 256 rows) and by the former grid (64-row
// blocks, the same column blocks, each block one GemmSingleCall), `reps` times each after a
// warm-up; best times. Prints a Markdown table and "gemm_grid_ab: ..." and returns the
// FLOP-weighted speedup (former time / current time over all shapes, weighted by calls per step).
double PrintSkinnyGridAb(const GemmBreakdownShape& shape, int reps, ThreadPool* pool);

// Prints the rows as a Markdown table with each row's fraction of `peak_flops` (FLOP/s), the
// per-step totals, and one machine-readable line "gemm_breakdown: op=seconds_per_step,fraction
// ...". Returns the rows' seconds per step summed.
double PrintGemmBreakdown(const std::vector<GemmBreakdownRow>& rows, double peak_flops,
                          const std::string& peak_name);

}  // namespace ps::benchmarks_internal

#endif  // PATRICKSTAR_BENCHMARKS_INTERNAL_GEMM_BREAKDOWN_H_
