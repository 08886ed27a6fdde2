// The training run's console: the header (model, chunks, accelerator, kernels, data), printed by
// the wiring once they are known and before the weights are initialized or loaded, the disk
// tier's lines after its measurement, the run's start line, the progress and validation lines of
// the steps, the steps' status line on a terminal, the stop and export lines, and the summary text
// printed at the end (Trainer::SummaryText), with the time to first step. Only rank 0 prints
// (TrainRun::out()); every function prints nothing without an output stream. Every line is
// flushed, and goes through run.console.meter (trainer/progress_meter.h) so that a status line is
// cleared first. Lines that report what one step of the wiring did are printed there: the long
// phases ("initializing ...", "loading ...", "measuring the disk ...") and "initialized from"
// (trainer/run_wiring.cc), "resumed from" and "checkpoint:" (trainer/run_checkpoints.cc). The
// metrics file is written by the training loop (trainer/training_loop.h).
#ifndef PATRICKSTAR_TRAINER_CONSOLE_H_
#define PATRICKSTAR_TRAINER_CONSOLE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "trainer/internal/train_run.h"
#include "trainer/trainer.h"

namespace ps {
namespace trainer_internal {

// Prints the run's header to run.out(), if any: model, chunks, LoRA, accelerator, kernels, data.
// REQUIRES: the wiring has the data, the memory and the chunk store (WireRun prints it then).
void PrintHeader(const TrainRun& run);

// The disk tier's lines (nothing without it). REQUIRES: the tier is open and measured.
void PrintDiskTier(const TrainRun& run);

// "training N steps from step S with T threads", and the accumulation and data-parallel lines.
// REQUIRES: WireRun(run) succeeded (run.progress.step is the step a resume starts from).
void PrintRunStart(const TrainRun& run);

// Prints step `m`'s progress line (and its validation loss, when it has one) to run.out(), if any.
void PrintProgress(const TrainRun& run, const StepMetrics& m);

// On a terminal, the status line after step `m`: "step N/T | loss L | R tok/s | S/step | ETA E"
// (`eta_s` unset: "?"); it stays until the next line is printed. Nothing in plain output.
void PrintStepStatus(const TrainRun& run, const StepMetrics& m, std::optional<double> eta_s);

// Prints `line` and a newline (after clearing a status line), flushed.
void PrintLine(const TrainRun& run, absl::string_view line);

// Removes the status line, if one shows (before another file writes to run.out()).
void ClearStatus(const TrainRun& run);

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

// "time to first step S s (setup A s: init B s, load C s, ..., other D s; first step F s)": the
// phases of setup_phases of 0.05 s and more, the rest as "other".
std::string TimeToFirstStepLine(const TrainSummary& summary);

// The summary of run.progress.summary as printed at the end of Run().
// REQUIRES: WireRun(run) succeeded.
std::string SummaryText(const TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONSOLE_H_
