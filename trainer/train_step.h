// TrainStep: one training iteration of the program — the scheduler's iteration protocol around
// the model's forward and backward and the optimizer step:
//
//   ChunkManager::BeginIteration
//   GptModel::ForwardBackward (at the loss scaler's current scale)
//   ChunkManager::BeginAdam -> the ADAM placement
//   HybridAdam::Step over ScheduledChunkAccess (trainer/scheduled_chunk_access.h): each chunk
//       updated where the placement runs it — or, for micro-batches 1..k-1 of a step with
//       gradient accumulation, HybridAdam::Accumulate (gradients added into the owner's
//       accumulator, parameters restored) over the same placement
//   ChunkManager::EndIteration (also after an error in between, so the manager is never left
//       inside an iteration)
//
// The step is the trainer's, not the model's: model/ computes (it knows the ChunkManager, which
// brackets every operator), optimizer/ updates chunks (it knows no scheduler), and this joins
// them.
//
// Thread safety: thread-compatible; one thread drives the model, its manager and the optimizer.
#ifndef PATRICKSTAR_TRAINER_TRAIN_STEP_H_
#define PATRICKSTAR_TRAINER_TRAIN_STEP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/gpt_model.h"
#include "optimizer/hybrid_adam.h"
#include "scheduler/chunk_manager.h"

namespace ps {

// Which optimizer call ends the iteration.
enum class OptimizerCall {
  kStep,        // HybridAdam::Step: the only or the last micro-batch of an optimizer step
  kAccumulate,  // HybridAdam::Accumulate: micro-batches 1..k-1 of a step
};

// What TrainStep did.
struct TrainStepResult {
  // Mean cross-entropy of the batch (before the update, unscaled).
  double loss = 0;
  AdamStepReport adam;
  // Time of the two phases (BeginIteration through backward; BeginAdam through EndIteration) on
  // the manager's clock (ChunkManager::clock), and the part of each the calling thread spent
  // waiting for chunk copies (ChunkManagerCounters::stall_ns, on the same clock).
  int64_t forward_backward_ns = 0;
  int64_t optimizer_ns = 0;
  int64_t forward_backward_stall_ns = 0;
  int64_t optimizer_stall_ns = 0;
};

// One whole training iteration of `model` on one batch (`tokens`, `targets` as
// GptModel::ForwardBackward takes them). REQUIRES: `model` computes through `manager` (both over
// the same ChunkStore), `adam` was created for that store's layout, rank and compute dtype, and
// no iteration is open. The batch is checked before the iteration begins (InvalidArgument, nothing
// accessed); otherwise the errors of the calls above, after the iteration was ended. `call`
// chooses Step or Accumulate (the optimizer checks the micro-batch count: FailedPrecondition).
[[nodiscard]] absl::StatusOr<TrainStepResult> TrainStep(GptModel& model, ChunkManager& manager,
                                                        HybridAdam& adam,
                                                        absl::Span<const int32_t> tokens,
                                                        absl::Span<const int32_t> targets,
                                                        OptimizerCall call = OptimizerCall::kStep);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_TRAIN_STEP_H_
