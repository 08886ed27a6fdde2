// The training run's console: the header printed before the first step (model, chunks,
// accelerator, kernels, data, the run's shape), the progress and validation lines of the steps,
// the stop and export lines, and the summary text printed at the end (Trainer::SummaryText). Only
// rank 0 prints (TrainRun::out()); every function prints nothing without an output stream. Lines
// that report what one step of the wiring did are printed there: "initialized from"
// (trainer/run_wiring.cc), "resumed from" and "checkpoint:" (trainer/run_checkpoints.cc). The
// metrics file is written by the training loop (trainer/training_loop.h).
#ifndef PATRICKSTAR_TRAINER_CONSOLE_H_
#define PATRICKSTAR_TRAINER_CONSOLE_H_

#include <cstdint>
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

// Prints "step N validation loss L".
void PrintValidationLoss(const TrainRun& run, int64_t step, double loss);

// Prints that a stop request ended the run after run.progress.step.
void PrintStopped(const TrainRun& run);

// Prints where checkpoint.export wrote the model, and in which format.
void PrintExported(const TrainRun& run);
// LoRA: the merged export's line.
void PrintExportedMerged(const TrainRun& run);

// Prints SummaryText(run) (nothing when no step was taken).
void PrintSummary(const TrainRun& run);

// The summary of run.progress.summary as printed at the end of Run().
// REQUIRES: WireRun(run) succeeded.
std::string SummaryText(const TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONSOLE_H_
