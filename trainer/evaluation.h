// The validation loss of a training run: the mean loss over the first data.eval_batches batches of
// the validation data (in order, never shuffled), averaged over ranks. An example file as
// validation data is scored whole instead: the mean over the trained targets of all its rows
// (every rank's; data.eval_batches does not apply), as the training loss of one step over them. The training loop
// (trainer/training_loop.h) calls it before the first step and every data.eval_every steps.
#ifndef PATRICKSTAR_TRAINER_EVALUATION_H_
#define PATRICKSTAR_TRAINER_EVALUATION_H_

#include "absl/status/statusor.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// The validation loss (forward passes only: no gradients, no optimizer state changes). Uses
// `batch` (run.batch) as its batch buffers. Under ZeRO every rank must call it (the mean is a
// collective).
// InvalidArgument when validation rows of an example file have no trained target at all.
// REQUIRES: run.data.val_loader or run.data.val_packed has a value.
absl::StatusOr<double> EvaluateValidation(const TrainRun& run, BatchBuffers& batch);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_EVALUATION_H_
