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
  // optimizer.overlap: the part of forward_backward_ns spent in speculative optimizer updates
  // inside backward (HybridAdam::SpeculateChunk, with its chunk accesses).
  int64_t backward_optimizer_ns = 0;
};

// One whole training iteration of `model` on one batch (`tokens`, `targets` as
// GptModel::ForwardBackward takes them). REQUIRES: `model` computes through `manager` (both over
// the same ChunkStore), `adam` was created for that store's layout, rank and compute dtype, and
// no iteration is open. The batch is checked before the iteration begins (InvalidArgument, nothing
// accessed); otherwise the errors of the calls above, after the iteration was ended. `call`
// chooses Step or Accumulate (the optimizer checks the micro-batch count: FailedPrecondition).
// `dropout_seed` seeds this micro-batch's LoRA dropout masks (GptModel::ForwardBackward; ignored
// without LoRA dropout): the trainer derives it from its seed and the global micro-batch index
// (LoraDropoutSeed), so a resumed run draws the masks an uninterrupted one would.
[[nodiscard]] absl::StatusOr<TrainStepResult> TrainStep(GptModel& model, ChunkManager& manager,
                                                        HybridAdam& adam,
                                                        absl::Span<const int32_t> tokens,
                                                        absl::Span<const int32_t> targets,
                                                        OptimizerCall call = OptimizerCall::kStep,
                                                        uint64_t dropout_seed = 0);

// The same for a batch that may carry positions and key_start (GptModel's ModelInputs), with the
// micro-batch's gradient weighted by `loss_weight` (> 0, finite): the model runs at loss scale
// loss_scaler().scale() * loss_weight, so the optimizer (which unscales by the loss scale and,
// with accumulation, averages the k micro-batches; ZeRO averages the ranks) sees
// loss_weight * d(loss)/d(param). The training loop weights micro-batch m of an example file by
// n_m * k * world / N_step (trainer/training_loop.cc): the step's gradient is then that of the
// mean over all its trained targets. loss_weight 1 is the overload above, bit for bit.
[[nodiscard]] absl::StatusOr<TrainStepResult> TrainStep(GptModel& model, ChunkManager& manager,
                                                        HybridAdam& adam, const ModelInputs& batch,
                                                        OptimizerCall call, uint64_t dropout_seed,
                                                        double loss_weight);

// The dropout seed of a micro-batch: DeriveSeed(DeriveSeed(seed, kLoraDropoutStream),
// micro_batch_index) (base/splitmix64.h), where micro_batch_index counts the micro-batches of
// the whole run across ranks: (step * accumulation_steps + micro) * world_size + rank, `step`
// being the optimizer steps taken before this one. Depends on nothing else, so a resumed run
// draws the same masks as an uninterrupted one, and each rank (each its own data) its own.
inline constexpr uint64_t kLoraDropoutStream = 0x4C6F524144726F70ULL;  // "LoRADrop"
uint64_t LoraDropoutSeed(uint64_t seed, int64_t step, int64_t accumulation_steps, int64_t micro,
                         int world_size, int rank);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_TRAIN_STEP_H_
