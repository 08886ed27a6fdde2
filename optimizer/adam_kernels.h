// AdamKernels: the three kernels an optimizer step runs on the memory of one device, behind one
// interface so the hybrid optimizer (optimizer/hybrid_adam.h) can run each chunk where its master
// payload lives. Implementations:
//   - CpuAdam (optimizer/cpu_adam.h): host memory, and the emulated accelerator of the cpu backend
//     (whose device memory is host RAM).
//   - CudaAdam (optimizer/cuda/cuda_adam.h, --config=cuda): CUDA device memory.
//
// The three kernels of one step (and a fourth, AccumulateGradients, for gradient accumulation):
//   1. GradientStats: the sum of squares of the stored (loss-scaled) gradients and the number of
//      Inf/NaN among them, over every chunk, before anything is updated: the overflow decision and
//      the global norm for clipping are global, so they must precede the first update.
//   2. Step: the fused Adam update (optimizer/adam_math.h) of each segment: reads the gradient in
//      the compute dtype, unscales and clips it, updates master/momentum/variance, and writes the
//      new parameter, rounded to the compute dtype, over the gradient in the param chunk.
//   3. RestoreParams: after an overflow the step is skipped and the param chunks, whose slots hold
//      gradients, get their parameters back from the master copy.
//
// Segments name raw memory; their pointers must be valid on the implementation's device.
// Lengths are in elements. Pointers need only be aligned to their element size.
#ifndef PATRICKSTAR_OPTIMIZER_ADAM_KERNELS_H_
#define PATRICKSTAR_OPTIMIZER_ADAM_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"
#include "optimizer/adam_math.h"

namespace ps {

// n_elems gradients of `dtype` at `grad`.
struct GradSegment {
  DType dtype = DType::kF16;
  const void* grad = nullptr;
  int64_t n_elems = 0;
};

// What GradientStats found. Adding the stats of disjoint sets of gradients gives the stats of
// their union (so ranks can all-reduce them by summing).
struct GradStats {
  // Sum of g * g over the finite stored gradients (still multiplied by the loss scale), in double.
  double sum_squares = 0.0;
  // Number of gradients that are Inf or NaN.
  int64_t nonfinite_elems = 0;

  bool finite() const { return nonfinite_elems == 0; }
  // The L2 norm of the unscaled gradients: sqrt(sum_squares) / loss_scale.
  double Norm(double loss_scale) const { return std::sqrt(sum_squares) / loss_scale; }
  GradStats& operator+=(const GradStats& other) {
    sum_squares += other.sum_squares;
    nonfinite_elems += other.nonfinite_elems;
    return *this;
  }
};

// One contiguous run of parameters sharing one set of step constants: element i of the run is
// grad[i]/param[i] (dtype `dtype`, the compute dtype) and master[i]/exp_avg[i]/exp_avg_sq[i]
// (f32). `param` may equal `grad` (the usual case: the gradient sits in the parameter's slot and
// is overwritten by the new parameter); otherwise the arrays must not overlap. With dtype f32,
// `param` may be null (only the master copy is updated).
struct AdamSegment {
  AdamStepScalars scalars;
  DType dtype = DType::kF16;
  const void* grad = nullptr;
  void* param = nullptr;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t n_elems = 0;
};

// What Step saw: the number of effective gradients (after unscaling and clipping) that were Inf
// or NaN. Their elements' new values are meaningless; callers skip steps with non-finite
// gradients using GradientStats beforehand, so a non-zero count here means the gradients changed
// in between (a bug), or the caller chose not to check.
struct AdamStepResult {
  int64_t nonfinite_elems = 0;
};

// param[i] = master[i] rounded to `dtype` (round-to-nearest-even; a copy for f32).
struct ParamRestoreSegment {
  const float* master = nullptr;
  DType dtype = DType::kF16;
  void* param = nullptr;
  int64_t n_elems = 0;
};

// Gradient accumulation (gradient_accumulation_steps > 1): acc[i] += grad[i] widened to f32
// (exact: f16 and bf16 are subsets of f32; optimizer/grad_accumulate_math.h is the arithmetic),
// grad of `dtype` on the kernels' device, acc f32. `acc` is host memory
// (optimizer/grad_accumulator.h) for every chunk, wherever its gradients are: a chunk may be
// stepped on the host in one micro-batch and on the accelerator in the next (the scheduler's
// warm-up), and the accumulator serves both without moving.
struct GradAccumulateSegment {
  DType dtype = DType::kF16;
  const void* grad = nullptr;
  float* acc = nullptr;
  int64_t n_elems = 0;
};

class AdamKernels {
 public:
  virtual ~AdamKernels() = default;

  // "cpu(AVX3, 2 threads)", "cuda".
  virtual std::string name() const = 0;

  // Errors for all three: InvalidArgument for n_elems < 0, an unknown dtype, or (n_elems > 0) a
  // null or misaligned pointer; nothing is computed or written then. Implementations may run
  // asynchronously only if they say so; results returned are final.
  [[nodiscard]] virtual absl::StatusOr<GradStats> GradientStats(
      absl::Span<const GradSegment> segments) = 0;
  [[nodiscard]] virtual absl::StatusOr<AdamStepResult> Step(
      absl::Span<const AdamSegment> segments) = 0;
  [[nodiscard]] virtual absl::Status RestoreParams(
      absl::Span<const ParamRestoreSegment> segments) = 0;
  // Adds each segment's gradients (on the implementation's device) into its f32 accumulator
  // (host memory; see GradAccumulateSegment). Same errors as above. CudaAdam reaches the host
  // accumulator through a staging tile or, when it is pinned, in place
  // (optimizer/cuda/cuda_adam.h).
  [[nodiscard]] virtual absl::Status AccumulateGradients(
      absl::Span<const GradAccumulateSegment> segments) = 0;
};

// The argument checks every implementation makes (the errors listed above), for reuse.
// `kernel` names the caller in messages. Step also rejects loss_scale <= 0 or non-finite step
// constants.
[[nodiscard]] absl::Status ValidateGradSegments(absl::string_view kernel,
                                                absl::Span<const GradSegment> segments);
[[nodiscard]] absl::Status ValidateAdamSegments(absl::string_view kernel,
                                                absl::Span<const AdamSegment> segments);
[[nodiscard]] absl::Status ValidateRestoreSegments(absl::string_view kernel,
                                                   absl::Span<const ParamRestoreSegment> segments);
[[nodiscard]] absl::Status ValidateAccumulateSegments(
    absl::string_view kernel, absl::Span<const GradAccumulateSegment> segments);

}  // namespace ps

#endif  // PATRICKSTAR_OPTIMIZER_ADAM_KERNELS_H_
