// A training run's pre-flight memory plan (model/gpt_activation_profile.h): before anything
// sizeable is allocated, the chunk size, the accelerator budget and the slack the chunk manager
// keeps, with what the run holds on the accelerator beside chunks and activations reserved
// (AcceleratorReserve, trainer/plan_options.h). The options come from trainer/plan_options.h's
// PlanRunFromConfig, the one conversion of a config that tools/plan uses too. A run that does not
// fit is refused here, naming what to change.
#ifndef PATRICKSTAR_TRAINER_RUN_PLAN_H_
#define PATRICKSTAR_TRAINER_RUN_PLAN_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Plans the run and sets memory.plan, memory.reserve, memory.chunk_elems and
// memory.chunk_size_note (`memory` is run.memory: this file writes that part of the run); with a
// RAM-backed nvme_path (tmpfs), says on the console that its swap is counted as host memory.
// Errors: the swap directory's (naming nvme_path); the plan's (prefixed "memory plan: ");
// TrainerEnvironment::inspect_plan_for_test's; ResourceExhausted when the run does not fit the
// accelerator (unless TrainerEnvironment::enforce_memory_plan is off), host memory (always) or
// the swap's disk (always).
// REQUIRES: ResolveModel succeeded; run.shape (micro_batch, seq_len, threads, dtype, rank, world)
// and run.probe.kernel_workspaces set, and on cuda run.probe.cuda_usable_bytes.
[[nodiscard]] absl::Status PlanMemoryOrRefuse(const TrainRun& run, RunMemoryPlan& memory);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_RUN_PLAN_H_
