#include "trainer/train_step.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"
#include "trainer/scheduled_chunk_access.h"

namespace ps {

absl::StatusOr<TrainStepResult> TrainStep(GptModel& model, ChunkManager& manager, HybridAdam& adam,
                                          absl::Span<const int32_t> tokens,
                                          absl::Span<const int32_t> targets, OptimizerCall call,
                                          uint64_t dropout_seed) {
  return TrainStep(model, manager, adam, ModelInputs{.tokens = tokens, .targets = targets}, call,
                   dropout_seed, 1.0);
}

absl::StatusOr<TrainStepResult> TrainStep(GptModel& model, ChunkManager& manager, HybridAdam& adam,
                                          const ModelInputs& batch, OptimizerCall call,
                                          uint64_t dropout_seed, double loss_weight) {
  if (!(loss_weight > 0) || !std::isfinite(loss_weight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: loss_weight must be positive and finite, got ", loss_weight));
  }
  RETURN_IF_ERROR(model.CheckInputs(batch));
  // The manager's clock, which also times the stalls counted inside each phase.
  const MonotonicClock clock = manager.clock();
  const int64_t t0 = clock.now_ns();
  const int64_t stall0 = manager.counters().stall_ns;
  RETURN_IF_ERROR(manager.BeginIteration());
  TrainStepResult result;
  int64_t t1 = t0;
  int64_t stall1 = stall0;
  // optimizer.overlap (docs/pipeline.md): owned chunks are updated speculatively as their
  // gradients become final in backward; HybridAdam::Step validates (commit, or roll back and run
  // the serialized step). The hook runs on this thread, inside the manager's BWD Release.
  BackwardChunkAccess backward_access(manager, manager.store());
  const bool speculating = call == OptimizerCall::kStep && adam.BeginSpeculation();
  if (speculating) {
    manager.SetGradientsFinalHook([&](int64_t chunk_index) -> absl::Status {
      // Chunks whose update the placement runs on a GPU wait for the verdict (GPU Adam inside
      // backward is not done); the emulated accelerator's memory is host RAM.
      if (manager.AdamPlacedOnAccelerator(chunk_index) && !manager.accelerator_in_host_memory()) {
        return absl::OkStatus();
      }
      const int64_t h0 = clock.now_ns();
      const absl::Status s = adam.SpeculateChunk(backward_access, chunk_index);
      result.backward_optimizer_ns += clock.now_ns() - h0;
      return s;
    });
  }
  absl::Status status = [&]() -> absl::Status {
    // loss_weight 1 multiplies exactly: the scale is the loss scaler's, bit for bit.
    absl::StatusOr<double> loss =
        model.ForwardBackward(batch, adam.loss_scaler().scale() * loss_weight, dropout_seed);
    manager.SetGradientsFinalHook(nullptr);
    RETURN_IF_ERROR(loss.status());
    result.loss = *loss;
    t1 = clock.now_ns();
    stall1 = manager.counters().stall_ns;
    ASSIGN_OR_RETURN(AdamPlacement placement, manager.BeginAdam());
    ScheduledChunkAccess access(manager, manager.store(), manager.accelerator_device(),
                                std::move(placement));
    if (call == OptimizerCall::kAccumulate) {
      ASSIGN_OR_RETURN(result.adam, adam.Accumulate(access));
    } else {
      ASSIGN_OR_RETURN(result.adam, adam.Step(access));
    }
    return absl::OkStatus();
  }();
  manager.SetGradientsFinalHook(nullptr);
  if (!status.ok() && adam.speculating()) {
    // Put the speculated chunks back: the failed step leaves the state it found.
    if (absl::Status undone = adam.AbortSpeculation(backward_access); !undone.ok()) {
      status = absl::Status(status.code(), absl::StrCat(status.message(),
                                                        " (and undoing the speculative updates: ",
                                                        undone.message(), ")"));
    }
  }
  const absl::Status ended = manager.EndIteration();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(ended);
  const int64_t t2 = clock.now_ns();
  const int64_t stall2 = manager.counters().stall_ns;
  result.forward_backward_ns = t1 - t0;
  result.optimizer_ns = t2 - t1;
  result.forward_backward_stall_ns = stall1 - stall0;
  result.optimizer_stall_ns = stall2 - stall1;
  return result;
}

uint64_t LoraDropoutSeed(uint64_t seed, int64_t step, int64_t accumulation_steps, int64_t micro,
                         int world_size, int rank) {
  const uint64_t index = (static_cast<uint64_t>(step) * static_cast<uint64_t>(accumulation_steps) +
                          static_cast<uint64_t>(micro)) *
                             static_cast<uint64_t>(world_size) +
                         static_cast<uint64_t>(rank);
  return DeriveSeed(DeriveSeed(seed, kLoraDropoutStream), index);
}

}  // namespace ps
