// The training run's console: the header printed before the first step (model, chunks,
// accelerator, kernels, data, the run's shape), the progress line of a step, and the summary text
// printed at the end (Trainer::SummaryText). Only rank 0 prints (TrainRun::out()); the metrics
// file is written by the training loop (trainer/training_loop.h).
#ifndef PATRICKSTAR_TRAINER_CONSOLE_H_
#define PATRICKSTAR_TRAINER_CONSOLE_H_

#include <string>

#include "trainer/internal/train_run.h"
#include "trainer/trainer.h"

namespace ps {
namespace trainer_internal {

// Prints the run's header to run.out(), if any.
// REQUIRES: WireRun(run) succeeded.
void PrintHeader(const TrainRun& run);

// Prints step `m`'s progress line (and its validation loss, when it has one) to run.out(), if any.
void PrintProgress(const TrainRun& run, const StepMetrics& m);

// The summary of run.summary as printed at the end of Run().
// REQUIRES: WireRun(run) succeeded.
std::string SummaryText(const TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONSOLE_H_
