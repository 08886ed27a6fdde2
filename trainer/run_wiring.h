// Wiring a training run (Trainer::Create): from a TrainConfig and the TrainerEnvironment to a run
// ready for its first step, in named steps —
//   JoinWorld             rank, world size and GPU; a host communicator under cuda refused;
//   ValidateTrainConfig   the config (trainer/config_validate.h);
//   ResolveModel          the model (trainer/model_resolution.h);
//   ResolveLora           the lora section as a LoraConfig, checked against the model;
//   ResolveShape          sequence length, micro-batch, accumulation, threads, compute dtype;
//   ProbeAccelerator      on cuda the GPU's answer and usable memory; the kernels' workspaces;
//   CheckPaths            no output overwrites an input or another output;
//   PlanMemoryOrRefuse    the pre-flight memory plan (trainer/run_plan.h);
//   LoadData              the data and its loaders (trainer/run_data.h);
//   CreateMemory          the backend, the accelerator's memory, pinned host memory;
//   CreateCollectives     the ZeRO collectives (world > 1);
//   CreateChunkStore      the chunk layout and the store;
//   OpenOutputs           the checkpoint root and the trace;
//   CreateManagerAndModel the compute stream, the ChunkManager, the model;
//   CreateOptimizer       HybridAdam and the learning-rate schedule;
//   InitializeWeights     a checkpoint (trainer/run_checkpoints.h), init_from, or the seed;
//                         LoRA: the base (init_from or the seed), its fingerprint, then the
//                         adapters (a checkpoint, lora.init_from, or the seed);
//   StartFirstStep        the metrics file, the batch buffers, the memory peaks from here on.
// Nothing is written before everything is checked. (CheckCommunicatorFitsAccelerator, declared
// in trainer/trainer.h, is defined in run_wiring.cc.)
#ifndef PATRICKSTAR_TRAINER_RUN_WIRING_H_
#define PATRICKSTAR_TRAINER_RUN_WIRING_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Builds everything `run` needs to train (see the file comment), with the errors Trainer::Create
// documents (trainer/trainer.h).
// REQUIRES: `run` is freshly constructed; called once.
[[nodiscard]] absl::Status WireRun(TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_RUN_WIRING_H_
