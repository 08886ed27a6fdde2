#include "trainer/run_plan.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "trainer/plan_options.h"
#include "trainer/trainer.h"

namespace ps {
namespace trainer_internal {

absl::Status PlanMemoryOrRefuse(const TrainRun& run, RunMemoryPlan& memory) {
  // What only the run knows (the resolved model, the world, the kernels, the GPU), then the
  // machine; the conversion of the config is trainer/plan_options.h's, as for tools/plan.
  PlanContext context;
  context.model = run.resolved.model_config;
  context.world = run.shape.world;
  context.rank = run.shape.rank;
  context.device_communicator = run.DeviceCommunicator();
  context.threads = run.shape.threads;
  context.kernel_workspaces = run.probe.kernel_workspaces;
  context.cuda_usable_bytes = run.probe.cuda_usable_bytes;
  RETURN_IF_ERROR(ReadPlanMachine(run.config, context));
  if (run.env.plan_machine_for_test) run.env.plan_machine_for_test(context);
  ASSIGN_OR_RETURN(RunPlan plan, PlanRunFromConfig(run.config, context));
  if (run.env.inspect_plan_for_test) RETURN_IF_ERROR(run.env.inspect_plan_for_test(plan));
  RETURN_IF_ERROR(CheckRunPlan(plan, run.env.enforce_memory_plan));
  // A swap on tmpfs is host memory: said once, never silently trusted as disk.
  if (const std::string note = RamBackedSwapNote(plan); !note.empty() && run.out() != nullptr) {
    *run.out() << note << "\n";
  }
  memory.reserve = plan.reserve;
  memory.token_metadata = plan.options.model.token_metadata;
  memory.plan = std::move(plan.plan);
  memory.chunk_elems = memory.plan.plan.chunk_elems;
  memory.chunk_size_note = memory.plan.chunk_note;
  return absl::OkStatus();
}

}  // namespace trainer_internal
}  // namespace ps
