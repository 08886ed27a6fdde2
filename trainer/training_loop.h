// A training run's loop (Trainer::Run): train_steps optimizer steps, each of
// gradient_accumulation_steps micro-batches (one ChunkManager iteration each, through TrainStep:
// trainer/train_step.h), then per step the metrics line (profile.metrics), the progress line,
// validation every data.eval_every steps (trainer/evaluation.h), checkpoints
// (trainer/run_checkpoints.h) and the stop request agreed over ranks; after the last step the
// export (trainer/export.h) and the summary (run.progress.summary, printed by trainer/console.h).
#ifndef PATRICKSTAR_TRAINER_TRAINING_LOOP_H_
#define PATRICKSTAR_TRAINER_TRAINING_LOOP_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Trains from run.progress.step up to train_steps (see trainer/trainer.h), appending to
// run.progress.history and filling run.progress.summary (the loop writes run.progress and
// run.batch, and moves the training loader). Errors of the layers below, with their messages;
// OutOfRange when the loss or (fp16) the parameters are no longer finite. The metrics and trace
// files are flushed and closed in every case. REQUIRES: WireRun(run) succeeded; called once.
[[nodiscard]] absl::Status RunTraining(TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_TRAINING_LOOP_H_
