// A training run's pre-flight memory plan (model/gpt_activation_profile.h): before anything
// sizeable is allocated, the chunk size, the accelerator budget and the slack the chunk manager
// keeps, with what the run holds on the accelerator beside chunks and activations reserved
// (AcceleratorReserve, trainer/trainer.h). A run that does not fit is refused here, naming what to
// change. (PlanAcceleratorReserve and DefaultAcceleratorBudget, declared in trainer/trainer.h,
// are defined in run_plan.cc.)
#ifndef PATRICKSTAR_TRAINER_RUN_PLAN_H_
#define PATRICKSTAR_TRAINER_RUN_PLAN_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Plans the run and sets run.plan, run.reserve, run.chunk_elems and run.chunk_size_note.
// Errors: the plan's (prefixed "memory plan: "); ResourceExhausted when the run does not fit the
// accelerator (unless TrainerEnvironment::enforce_memory_plan is off) or host memory (always).
// REQUIRES: ResolveModel(run) succeeded; run's shape (micro_batch, seq_len, threads, dtype, rank,
// world) and run.kernel_workspaces set, and on cuda run.cuda_usable_bytes.
[[nodiscard]] absl::Status PlanMemoryOrRefuse(TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_RUN_PLAN_H_
