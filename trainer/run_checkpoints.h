// A training run's checkpoints (trainer/checkpoint.h): resuming from the newest one
// (checkpoint.resume; under ZeRO the newest step every rank has) and writing one
// (checkpoint.every steps, at the last step and on a stop request). A checkpoint holds the
// optimizer state, the loss scaler, the data cursor and the run's identity, per rank.
#ifndef PATRICKSTAR_TRAINER_RUN_CHECKPOINTS_H_
#define PATRICKSTAR_TRAINER_RUN_CHECKPOINTS_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Restores the model, the optimizer, the loss scaler and the data cursor from the newest
// checkpoint under checkpoint.dir (every rank from the same step), and sets run.progress.step and
// run.progress.last_loss (and seeks run.data.train_loader). Errors: NotFound, DataLoss,
// FailedPrecondition for a checkpoint of another model or world size (naming the rank and the
// directory). REQUIRES: WireRun(run) has built the model, the optimizer and the loaders.
[[nodiscard]] absl::Status Resume(TrainRun& run);

// Writes this rank's checkpoint of step progress.step (keeping checkpoint.keep_last), and records
// it in progress.summary (checkpoints_written, checkpoint_s) and the trace. `progress` is
// run.progress.
// REQUIRES: checkpoint.dir is set.
[[nodiscard]] absl::Status SaveCheckpoint(const TrainRun& run, RunProgress& progress);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_RUN_CHECKPOINTS_H_
