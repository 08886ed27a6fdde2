// TrainRun: the state of one training run, shared by the parts of the Trainer (trainer/trainer.h).
//
// The Trainer (trainer/trainer.cc) is a thin façade over a TrainRun and the files that work on
// it, one concern each:
//   trainer/run_wiring.h        builds the run from its config in named steps: backends,
//                               memories, chunks, manager, model, optimizer, outputs
//                               (Trainer::Create);
//   trainer/model_resolution.h  the model: the model section or a Hugging Face directory;
//   trainer/run_plan.h          the pre-flight memory plan and what it reserves on the
//                               accelerator;
//   trainer/run_data.h          the training and validation data and their loaders;
//   trainer/run_checkpoints.h   training checkpoints: resume, save;
//   trainer/training_loop.h     the step loop (Trainer::Run): micro-batches, metrics lines, the
//                               summary's numbers;
//   trainer/evaluation.h        the validation loss;
//   trainer/export.h            checkpoint.export at the end (gathered to rank 0 under ZeRO);
//   trainer/console.h           the console: header, progress lines, the summary text (long
//                               phases and the steps' status line through a ProgressMeter,
//                               trainer/progress_meter.h).
// Private to //trainer:trainer (listed in its srcs): no other target can include it.
//
// Thread safety: thread-compatible; one thread owns a TrainRun.
#ifndef PATRICKSTAR_TRAINER_INTERNAL_TRAIN_RUN_H_
#define PATRICKSTAR_TRAINER_INTERNAL_TRAIN_RUN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chunk/chunk_store.h"
#include "comm/communicator.h"
#include "disk/chunk_swap.h"
#include "disk/disk_probe.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/lr_schedule.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/comm_collectives.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/data/data_loader.h"
#include "trainer/data/example_file.h"
#include "trainer/data/packed_loader.h"
#include "trainer/data/token_file.h"
#include "trainer/io/metrics_writer.h"
#include "trainer/io/trace_writer.h"
#include "trainer/profiler.h"
#include "trainer/progress_meter.h"
#include "trainer/trainer.h"

namespace ps {
namespace trainer_internal {

// Seconds from reading `a_ns` to reading `b_ns` of one MonotonicClock (base/clock.h).
inline double Seconds(int64_t a_ns, int64_t b_ns) {
  return 1e-9 * static_cast<double>(b_ns - a_ns);
}

// A TrainRun is divided into parts, one per writer: each part is assigned by the file named on it
// and only read elsewhere (its objects' own state, a loader's cursor or a chunk's payload, changes
// as the run uses them). A writer takes the run as `const TrainRun&` and the part it writes as its
// one mutable argument where that is simple (e.g. LoadData(run, run.data)); readers take
// `const TrainRun&` (the console, the export). Only the steps that write several parts take a
// mutable TrainRun: WireRun and its InitializeWeights (resolved.base_fingerprint, then Resume) and
// StartFirstStep (runtime.metrics, batch, progress.summary's planned_* numbers); Resume (progress,
// the training loader's cursor); the loop's RunTraining and Step (progress, batch, the loader).

// The run's shape: written by the wiring (trainer/run_wiring.cc: JoinWorld sets rank, world and
// device_index; ResolveShape the rest).
struct RunShape {
  // The data-parallel world; collectives (Runtime) only for world > 1.
  int rank = 0;
  int world = 1;
  int device_index = 0;  // the accelerator's device
  int threads = 1;
  DType dtype = DType::kF32;
  int64_t seq_len = 0;
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step
};

// The model the run trains: written by trainer/model_resolution.cc (ResolveModel: model_config,
// gpt, hf; ResolveLora: lora; ResolveQuant4: quant4), except base_fingerprint, written by the wiring where it is computed
// (InitializeWeights, trainer/run_wiring.cc).
struct ResolvedModel {
  // model_config (any architecture); gpt its GPT-2 view (ModelConfig's common dimensions) for the
  // data and checkpoint checks. hf is the Hugging Face directory of checkpoint.init_from, when it
  // names one.
  GptConfig gpt;
  ModelConfig model_config;
  std::optional<HfCheckpoint> hf;
  // LoRA (the lora section, converted by ResolveLora and checked against model_config): the
  // model's and the plan's GptModelOptions::lora. nullopt: full training.
  std::optional<LoraConfig> lora;
  // QLoRA's 4-bit base (the quantization section when load_in_4bit, converted by ResolveQuant4 and
  // checked against model_config and lora): the model's and the plan's GptModelOptions::quant4.
  // nullopt: the base in the compute dtype.
  std::optional<Quant4Config> quant4;
  // checkpoint.init_from saved pre-quantized: the console's line saying how it loads (as it is,
  // or dequantized without a lora section: PrequantizedBaseLine); empty otherwise.
  std::string prequantized_line;
  // LoRA: GptModel::BaseFingerprint of the base this run trains on, computed once the weights are
  // set (InitializeWeights) and only when checkpoints are written or read (checkpoint.dir);
  // empty otherwise, and under ZeRO (no rank holds the whole base: not checked).
  std::string base_fingerprint;
};

// What the accelerator said before the plan: written by the wiring (ProbeAccelerator,
// trainer/run_wiring.cc); the plan reads it.
struct AcceleratorProbe {
  // The workspace sizes the run's kernels will ask for (the plan replays them): the CPU kernels'
  // for `threads`, or CudaKernels' for the GPU (cuBLAS's workspace by its compute capability).
  std::shared_ptr<const KernelWorkspaces> kernel_workspaces;
  // cuda: the device's free memory minus the margin.
  int64_t cuda_usable_bytes = 0;
};

// The pre-flight memory plan: written by trainer/run_plan.cc (PlanMemoryOrRefuse).
struct RunMemoryPlan {
  // What the plan reserves on the accelerator beside chunks and activations.
  AcceleratorReserve reserve;
  // Whether the plan (and so the model) holds per-token positions and key_start on the
  // accelerator: an example file among the data (GptModelOptions::token_metadata).
  bool token_metadata = false;
  GptRunPlan plan;
  int64_t chunk_elems = 0;
  std::string chunk_size_note;
};

// The data: written by trainer/run_data.cc (LoadData). The loaders' cursors move as the run reads
// them (the training loop; Resume seeks the training loader). Each of training and validation is
// read by one loader: a DataLoader over tokens (an llm.c token file or the synthetic corpus), or a
// PackedLoader over an example file (trainer/data/packed_loader.h), whose rows carry positions,
// key_start and the trained targets.
struct RunData {
  std::optional<TokenFile> train_file, val_file;
  std::optional<ExampleFile> train_examples, val_examples;
  std::vector<uint16_t> synthetic_train, synthetic_val;
  std::optional<double> unigram_entropy, entropy_rate;
  std::optional<DataLoader> train_loader, val_loader;
  std::optional<PackedLoader> train_packed, val_packed;

  bool has_val() const { return val_loader.has_value() || val_packed.has_value(); }
  // The training loader's cursor, whichever loader it is; Seek likewise.
  DataCursor train_cursor() const {
    return train_packed.has_value() ? train_packed->cursor() : train_loader->cursor();
  }
  absl::Status SeekTrain(const DataCursor& cursor) {
    return train_packed.has_value() ? train_packed->Seek(cursor) : train_loader->Seek(cursor);
  }
};

// The micro-batch buffers: sized by the wiring (StartFirstStep), filled by the training loop and
// the validation (trainer/evaluation.cc) before each forward. Example files: `packed` holds the
// step's micro-batches (the loop reads them all first: the loss's denominator is their trained
// targets over every rank) and the validation's batch.
struct BatchBuffers {
  std::vector<int32_t> tokens, targets;
  std::vector<PackedBatch> packed;
};

// The runtime objects: created by the wiring (trainer/run_wiring.cc) and only used elsewhere.
// Memory, chunks, runtime, model, optimizer (destroyed in reverse: the model and manager
// before the store, the store before the memories, the memories before the backend).
struct Runtime {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  // The test hook's stand-in for env.communicator, when set; collectives go through it
  // (collectives->communicator()). Declared after the memories: the collectives' device staging
  // goes back to the accelerator's scratch before it is destroyed.
  std::unique_ptr<Communicator> test_communicator;
  std::unique_ptr<CommCollectives> collectives;
  // The accelerator-side Adam on a GPU (CudaAdam); null on the emulated accelerator.
  std::unique_ptr<AdamKernels> accelerator_adam;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<TraceWriter> trace;
  std::unique_ptr<TraceProfiler> profiler;
  // The stream the model's kernels run on; the manager orders its chunk moves after it.
  std::unique_ptr<Stream> compute_stream;
  // The disk tier (offload_optimizer.device "nvme"): the swap files the manager spills optimizer
  // state to (declared before the manager, which uses it until destroyed), and the bandwidth
  // measured under nvme_path when the run started. Null / unset without the tier.
  std::unique_ptr<ChunkSwap> swap;
  std::optional<DiskBandwidth> disk_bandwidth;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<CpuAdam> cpu_adam;
  std::unique_ptr<HybridAdam> adam;
  std::optional<LrSchedule> schedule;
  std::unique_ptr<MetricsWriter> metrics;
  TrackId steps_track = 0;
};

// The run's progress: written by the training loop (trainer/training_loop.cc) and the checkpoints
// (trainer/run_checkpoints.cc: Resume sets step and last_loss, SaveCheckpoint records its
// checkpoint in summary); the wiring's StartFirstStep sets summary's planned_* numbers.
struct RunProgress {
  int64_t step = 0;  // steps taken
  double last_loss = 0;
  TrainSummary summary;
  std::vector<StepMetrics> history;
};

// What the console shows while the run is set up, and how long the setup took: written by the
// wiring (trainer/run_wiring.cc: WireRun creates the meter once the rank is known and records the
// setup's phases) and the loop (trainer/training_loop.cc: the validation before the first step,
// then the first step closes the time to first step, TrainSummary::time_to_first_step_s).
struct RunConsole {
  // The console's meter over out() (so silent on ranks > 0 and without an output stream), on
  // env.clock, a terminal's when env.out_is_terminal. Set by WireRun right after JoinWorld.
  std::unique_ptr<ProgressMeter> meter;
  // A reading of env.clock where the time to first step starts: env.start_ns, else the moment
  // the TrainRun was made (Trainer::Create).
  int64_t start_ns = 0;
  // The setup's phases in the order first seen, seconds each (TrainSummary::setup_phases).
  std::vector<std::pair<std::string, double>> phases;

  // Adds `seconds` to phase `name` (a new phase goes last).
  void AddPhase(absl::string_view name, double seconds) {
    for (auto& [n, s] : phases) {
      if (n == name) {
        s += seconds;
        return;
      }
    }
    phases.emplace_back(std::string(name), seconds);
  }
};

struct TrainRun {
  TrainRun(const TrainConfig& config, TrainerEnvironment env)
      : config(config), env(std::move(env)) {
    console.start_ns = this->env.start_ns.value_or(this->env.clock.now_ns());
  }

  // A reading of the run's one clock, the manager's (ChunkManager::clock; TrainStep times its
  // phases on it too): the summary's wall times (TrainSummary::seconds, eval_s, checkpoint_s,
  // steps_wall_s). REQUIRES: the manager exists.
  int64_t NowNs() const { return runtime.manager->clock().now_ns(); }
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  // Progress output: rank 0 only (null elsewhere, and when TrainerEnvironment::out is null).
  // Lines written here directly are the caller's to flush; a status line may show on a terminal
  // (console.meter->Print clears it first).
  std::ostream* out() const { return shape.rank == 0 ? env.out : nullptr; }
  // A reading of env.clock (usable before the manager exists: the setup's phases).
  int64_t EnvNowNs() const { return env.clock.now_ns(); }
  // Whether the communicator of a world > 1 takes device memory only (nccl, or the test hook).
  bool DeviceCommunicator() const;
  // The mean of `value` over ranks (itself for a world of one).
  absl::StatusOr<double> MeanOverRanks(double value) const;
  // Whether any rank's `flag` is set.
  absl::StatusOr<bool> AnyRank(bool flag) const;
  // What a checkpoint of this run must match to be resumed by it.
  CheckpointIdentity Identity() const;
  // Flushes and closes the metrics and trace files (once; the Trainer's destructor closes them if
  // Run() did not). Sets `closed`.
  absl::Status CloseOutputs();

  const TrainConfig config;
  const TrainerEnvironment env;
  // The parts, in the order they are written, and destroyed in reverse: the progress, then the
  // runtime objects (in Runtime's order, above), then the values they were built from (which hold
  // nothing of one another; the loaders, which read the token files, go before them).
  RunConsole console;
  RunShape shape;
  ResolvedModel resolved;
  AcceleratorProbe probe;
  RunMemoryPlan memory;
  RunData data;
  BatchBuffers batch;
  Runtime runtime;
  RunProgress progress;
  // Written by CloseOutputs only.
  bool closed = false;
};

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_INTERNAL_TRAIN_RUN_H_
