// Trainer: the training program's engine — everything `bazel run //trainer:train` does, as a
// library so that tests drive it in-process and other projects can embed it.
//
// From a validated TrainConfig (trainer/config.h) it builds the whole stack, bottom up:
//   data       the token files (trainer/data/token_file.h) or the built-in synthetic corpus
//              (trainer/data/synthetic_corpus.h), cut into batches by a DataLoader;
//   memory     the accelerator backend — the emulated `cpu` one under its memory cap and link
//              bandwidth, or `cuda` (a GPU, accelerator.device) — its DeviceMemory, and pinned
//              host memory;
//   chunks     the layout of GPT-2's parameters in chunks of chunk.size elements (or the size
//              the chunk-size search picks, chunk/chunk_size_search.h), and the ChunkStore;
//   runtime    the tide-aware ChunkManager (scheduler/chunk_manager.h);
//   model      GptModel (model/gpt_model.h) computing with the backend's kernels
//              (model/kernels/kernels_factory.h: CpuKernels or CudaKernels) on one compute stream
//              shared with the ChunkManager, initialized from the seed, an HF GPT-2 safetensors
//              file (checkpoint.init_from) or a checkpoint (checkpoint.resume);
//   optimizer  HybridAdam — CpuAdam for the chunks on the host; for the accelerator's chunks
//              CpuAdam on the emulated accelerator, CudaAdam on a GPU — the loss scaler and the
//              learning-rate schedule.
//
// Accelerator memory on cuda. accelerator.memory (or the plan's minimum when unset) caps the
// backend: everything the run allocates on the GPU through it. CudaAdam's staging tile and
// workspace (optimizer/cuda_adam_footprint.h) are allocated from the backend beside the
// DeviceMemory, whose budget is the cap minus them; the plan counts them as reserved bytes
// (GptRunPlanOptions::comm_buffer_bytes). cuBLAS's handle (CudaKernels, once) and the CUDA
// context are outside the cap.
// Run() then trains for train_steps steps: each step is one ChunkManager iteration (the first is
// the warm-up that learns the tide), forward and backward of one micro-batch, and the optimizer
// step. It prints a progress line every steps_per_print steps, writes one JSON object per step to
// profile.metrics, traces operators, chunk copies and the memory tide to profile.trace, evaluates
// on the validation data every data.eval_every steps, writes checkpoints every checkpoint.every
// steps (trainer/checkpoint.h), and ends with a summary. A stop request (SIGINT/SIGTERM, via
// TrainerEnvironment::stop_requested) finishes the current step, writes a checkpoint when a
// directory is configured, and returns OK.
//
// Determinism: for the same config (seed, data, batch shape) the losses are bit-identical from
// run to run, whatever the memory cap, the chunk moves and the thread count (the kernels are
// deterministic), and a run resumed from a checkpoint continues exactly as the straight run.
//
// Data parallelism (ZeRO): with TrainerEnvironment::communicator of world size N > 1 (train.cc
// uses the mpi communicator when started by mpirun), each rank is one process of the same run:
//  - chunks are sharded ZeRO-style (scheduler/chunk_manager.h): a rank keeps the param chunks it
//    owns and their master/momentum/variance (14/N or 16/N bytes per parameter plus the gathered
//    group buffers); the chunk size search and the layout take the world size;
//  - data: rank r reads global batches r, r + N, ... (trainer/data/data_loader.h), so one step
//    trains on N micro-batches; train_batch_size = micro x N. Gradients are averaged over ranks
//    by the reduce-scatters, and the optimizer's Inf/NaN count and gradient norm are summed over
//    ranks (CommCollectives::ReduceGradStats), so every rank makes the same step/skip and clipping
//    decision. With the same global batch, N ranks train the same model as one rank with an N
//    times larger micro-batch (up to floating-point summation order);
//  - the reported loss (and validation loss) is the mean over ranks; only rank 0 prints and
//    writes the metrics and trace files;
//  - a stop request on any rank stops every rank after the same step (the flags are all-reduced);
//  - checkpoints are per rank (trainer/checkpoint.h: RankCheckpointRoot), resumed on the same
//    world size only; the export (checkpoint.export_path) gathers every master weight to rank 0,
//    one tensor at a time (rank 0 holds the f32 model once while writing the file).
// Every collective waits at most TrainerEnvironment::comm_timeout, so a rank whose peer died
// fails instead of hanging (under mpirun, mpirun ends the job first).
// A device-memory communicator (nccl; CommMemory other than kHost) is handed device buffers only:
// the ZeRO collectives stage in the accelerator's scratch (CommCollectives::Create, its
// DeviceStagingBytes counted by the plan as reserved bytes), the scalar agreement (loss, flags,
// Inf/NaN count, gradient norm) goes through CommCollectives' device scalar word, and the export
// broadcasts each tensor through a device tile (AcceleratorReserve::export_tile_bytes) the
// manager keeps free.
//
// Thread safety: thread-compatible. One thread calls Run().
#ifndef PATRICKSTAR_TRAINER_TRAINER_H_
#define PATRICKSTAR_TRAINER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "comm/communicator.h"
#include "disk/io_engine.h"
#include "memory/backend.h"
#include "memory/dtype.h"
#include "model/gpt_model.h"
#include "trainer/config.h"
#include "trainer/plan_options.h"

namespace ps {

// AcceleratorReserve, PlanAcceleratorReserve, DefaultAcceleratorBudget and kExportTileBytes:
// trainer/plan_options.h (the plan's one conversion of a config, shared with tools/plan).

// InvalidArgument naming --comm=nccl when a multi-rank `communicator` (null for a world of one)
// works on host memory while the accelerator is "cuda": the ZeRO chunk payloads would live on the
// GPU, and a host communicator (mpi) or its memcpy would dereference device pointers. A test's
// device-memory stand-in (`device_communicator_for_test`) is accepted.
[[nodiscard]] absl::Status CheckCommunicatorFitsAccelerator(AcceleratorKind kind,
                                                            const Communicator* communicator,
                                                            bool device_communicator_for_test);

struct TrainerEnvironment {
  // Progress lines and the summary. Null: nothing is printed. Every line is flushed as it is
  // written (a `tee`d log shows the run as it goes); the header is printed before the weights are
  // initialized or loaded, and each long phase (the disk's measurement, the seeded init, a load)
  // prints a line when it starts and how long it took when it ends (trainer/progress_meter.h).
  std::ostream* out = nullptr;
  // Whether `out` is a terminal (train.cc: isatty(STDOUT_FILENO)): a long phase's progress and
  // the steps' status line (step, loss, tokens/s, ETA) rewrite themselves in place ("\r", clear
  // to the end of the line). False: plain lines only, a long phase's at most one per 10 s.
  bool out_is_terminal = false;
  // The run's clock (base/clock.h): the setup's phases and the time to first step, the progress
  // lines, and everything the chunk manager and the step time (ChunkManagerOptions::clock).
  MonotonicClock clock = kSteadyClock;
  // A reading of `clock` when the program started (train.cc reads it first thing in main), so
  // that the time to first step counts the flags, the config and the communicator too. Unset:
  // the time to first step counts from Trainer::Create.
  std::optional<int64_t> start_ns;
  // Checked after every step; true ends the run after a checkpoint (if checkpoint.dir is set).
  std::function<bool()> stop_requested = nullptr;
  // The same request, readable from any thread at any time (an atomic load: train.cc passes
  // trainer/io/signal_flag.h's StopRequested). The emulated accelerator's copy engine polls it
  // while a copy sleeps out its link time (accelerator.copy_bandwidth), and a stop ends the link
  // emulation, so the current step finishes and the checkpoint is written in seconds however
  // slow the link (memory/cpu_backend.h SetCpuLinkInterrupt). Null: copies are never cut short.
  std::function<bool()> stop_requested_async = nullptr;
  // The data-parallel world (see the file comment). Null: a world of one. Not owned; must
  // outlive the Trainer and be used by no one else meanwhile.
  Communicator* communicator = nullptr;
  // Bound on every wait for a collective.
  absl::Duration comm_timeout = absl::Minutes(10);
  // Refuse a run the pre-flight memory plan says does not fit (model/gpt_activation_profile.h).
  // Only benchmarks that probe below the plan's minimum (benchmarks/capacity_benchmark) turn it
  // off; the run may then fail mid-way with an out-of-memory error. A run that does not fit host
  // memory is refused either way.
  bool enforce_memory_plan = true;
  // The config file the run was loaded from (--config), if any: an input no output may overwrite
  // (trainer/io/run_paths.h).
  std::string config_path;
  // Tests only: stands a device-memory communicator in for `communicator` on the emulated
  // accelerator. Called once the accelerator's backend exists, with `communicator` and that
  // backend; the result (e.g. scheduler/testing/device_checking_communicator.h over
  // `communicator`) must report device memory (CommMemory other than kHost) and is used for every
  // collective, exactly as the nccl communicator is on a GPU. Null: `communicator` itself.
  std::function<std::unique_ptr<Communicator>(Communicator* communicator, Backend* backend)>
      device_communicator_for_test = nullptr;
  // Tests only: the disk tier's I/O seam (offload_optimizer.device "nvme"). Called once with the
  // swap files' opened engine (after the disk was measured, so only the swap's own I/O goes
  // through it); the result (e.g. disk/testing/faulty_io_engine.h around it) does every read,
  // write and fallocate of the swap (FileChunkSwapOptions::wrap_engine_for_test). Null: the
  // engine itself.
  std::function<std::unique_ptr<IoEngine>(std::unique_ptr<IoEngine>)> wrap_disk_engine_for_test =
      nullptr;
  // Tests only: the pre-flight plan (trainer/plan_options.h). `plan_machine_for_test` is called
  // with the context once the machine has been read (ReadPlanMachine) and may replace those
  // readings (host_available_bytes, disk_free_bytes, ...), so that a test plans against the same
  // machine as tools/plan. `inspect_plan_for_test` is called with the plan before it is checked;
  // an error it returns ends Trainer::Create with that error (a test's plan-only run).
  std::function<void(PlanContext& context)> plan_machine_for_test = nullptr;
  std::function<absl::Status(const RunPlan& plan)> inspect_plan_for_test = nullptr;
};

// One step, as the metrics file has it.
struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps taken after this one
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;
  double grad_norm = 0;
  bool skipped = false;
  bool warmup = false;  // the scheduler's warm-up iteration
  double step_ms = 0;
  double tokens_per_s = 0;
  // Time inside the step: forward+backward compute, waits for chunk copies, the optimizer.
  double compute_ms = 0;
  double copy_wait_ms = 0;
  double optimizer_ms = 0;
  // Peaks over the step, per device.
  int64_t accelerator_peak_model_bytes = 0;
  int64_t accelerator_peak_non_model_bytes = 0;
  int64_t accelerator_peak_total_bytes = 0;  // model + non-model at once
  int64_t host_peak_model_bytes = 0;
  int64_t host_peak_non_model_bytes = 0;
  // Chunk traffic of the step.
  int64_t loaded_bytes = 0;
  int64_t written_back_bytes = 0;
  int64_t evictions = 0;  // write-backs and clean evictions
  // Times the accelerator ran out of memory between accesses and the chunk manager evicted under
  // pressure (0 when the plan's slack held).
  int64_t pressure_reclaims = 0;
  // The disk tier (zero without it): optimizer-state bytes read from and written to the swap
  // files during the step, and the time the step waited for them.
  int64_t disk_read_bytes = 0;
  int64_t disk_write_bytes = 0;
  // Example files (packed conversation data): the step's trained targets over every micro-batch
  // and rank (N_step, the loss's denominator); unset for token files, where every target trains.
  std::optional<int64_t> trained_targets;
  double disk_wait_ms = 0;
  std::optional<double> val_loss;
};

struct TrainSummary {
  int64_t first_step = 0;  // steps already taken when the run started (resume)
  int64_t last_step = 0;
  double first_loss = 0;
  double last_loss = 0;
  // Mean loss of the last min(10, steps) steps (less noisy than the last one).
  double final_mean_loss = 0;
  std::optional<double> first_val_loss;
  std::optional<double> last_val_loss;
  double seconds = 0;
  int64_t tokens = 0;
  double tokens_per_s = 0;
  double compute_s = 0, copy_wait_s = 0, optimizer_s = 0, eval_s = 0, checkpoint_s = 0;
  int64_t accelerator_peak_model_bytes = 0;
  int64_t accelerator_peak_non_model_bytes = 0;
  int64_t accelerator_peak_total_bytes = 0;  // model + non-model at once
  int64_t host_peak_model_bytes = 0;
  int64_t host_peak_non_model_bytes = 0;
  int64_t loaded_bytes = 0, written_back_bytes = 0;
  int64_t loads = 0, write_backs = 0, write_behinds = 0, clean_evictions = 0, prefetches = 0,
          prefetch_hits = 0, pressure_evictions = 0, pressure_reclaims = 0;
  // LoRA (the lora section): bytes of the frozen base's param chunks ever copied from the
  // accelerator to the host (ChunkManagerCounters::frozen_writeback_bytes; 0 when the engine
  // keeps its promise that a frozen chunk is never written back, and 0 without LoRA).
  int64_t frozen_writeback_bytes = 0;
  // LoRA: the trainable elements (adapters and modules_to_save) and the frozen base's elements
  // of the layout (ChunkLayout::trainable_elems / frozen_elems; padding excluded). Without LoRA
  // frozen_params is 0.
  int64_t trainable_params = 0, frozen_params = 0;
  // The pre-flight plan's predictions for this rank (scheduler/memory_plan.h MemoryPlan), beside
  // the measured peaks above: the accelerator's budget and its peak there
  // (predicted_accelerator_peak_bytes), the host's chunk blocks (host_model_data_bytes) and the
  // whole process's safe bound (host_peak_bytes).
  int64_t planned_accelerator_bytes = 0;      // the budget the run got (GptRunPlan)
  int64_t planned_min_accelerator_bytes = 0;  // the least budget the plan accepts at that budget
  int64_t planned_accelerator_peak_bytes = 0;
  int64_t planned_host_model_data_bytes = 0;
  int64_t planned_host_peak_bytes = 0;
  bool stopped_by_request = false;
  // The disk tier (zero / empty without it): its traffic over the run (initialization and
  // checkpoints included), the time the run waited for it, read-ahead hits, the most host bytes
  // its chunks held at once; and the disk as measured under nvme_path at the start (engine,
  // direct I/O, sequential bytes per second).
  int64_t disk_reads = 0, disk_writes = 0, disk_read_bytes = 0, disk_write_bytes = 0;
  int64_t disk_read_ahead_hits = 0, disk_peak_host_bytes = 0;
  // offload_param "nvme": the most host bytes the frozen base's chunks held at once, and their
  // budget (DiskTier::frozen_peak_host_bytes, frozen_host_budget_bytes).
  int64_t disk_frozen_peak_host_bytes = 0, disk_frozen_host_budget_bytes = 0;
  double disk_read_wait_s = 0, disk_write_wait_s = 0;
  double disk_measured_read_bytes_per_s = 0, disk_measured_write_bytes_per_s = 0;
  std::string disk_engine;
  // Chunk payload bytes this rank holds (host and accelerator) after the last step: its share of
  // the model data (under ZeRO, the chunks it owns).
  int64_t rank_model_data_bytes = 0;
  // The data-parallel world, and the ZeRO collectives of this rank.
  int world_size = 1;
  int64_t all_gather_bytes = 0, reduce_scatter_bytes = 0;
  double comm_s = 0;
  // The process's usage over the training steps (getrusage, every thread; validation and
  // checkpoints excluded): wall time of the steps, CPU time, page faults.
  double steps_wall_s = 0, steps_user_s = 0, steps_system_s = 0;
  int64_t steps_minor_faults = 0, steps_major_faults = 0;
  // The emulated accelerator (cpu backend; zero otherwise): device allocations, how many reused
  // a freed block kept mapped, the most host memory its blocks held at once (live + cached).
  int64_t accelerator_allocations = 0, accelerator_cache_hits = 0;
  int64_t accelerator_peak_mapped_bytes = 0;
  std::vector<std::string> checkpoints_written;
  // Time to first step (issue #38): from the program's start (TrainerEnvironment::start_ns, else
  // Trainer::Create) to the end of the first step this process took; setup_s is the part before
  // that step began, setup_phases its parts in order (seconds each: "startup" before
  // Trainer::Create, "checks" (config, model, accelerator, paths), "plan", "data", "memory",
  // "disk probe", "model" (manager, model, optimizer), "init" (seeded), "load" (checkpoint.
  // init_from), "adapters" (lora.init_from), "resume", "validation" (before the first step),
  // whichever the run had; what no phase covers is setup_s minus their sum), and first_step_s the
  // step itself. Zero / empty until a step is taken.
  double time_to_first_step_s = 0, setup_s = 0, first_step_s = 0;
  std::vector<std::pair<std::string, double>> setup_phases;
};

class Trainer {
 public:
  // Validates `config` (ValidateTrainConfig) and builds everything (see the file comment),
  // including loading the data, the initial weights or the checkpoint to resume from.
  // Errors: InvalidArgument for a bad config (naming the key), or for outputs that would overwrite
  // an input or each other or cannot be created (trainer/io/run_paths.h, checked before anything
  // is opened); the data's errors (NotFound,
  // DataLoss naming the file); for accelerator.backend "cuda", the backend's error
  // before any work (FailedPrecondition "rebuild with --config=cuda" in a build without CUDA,
  // Unavailable "no CUDA device is available" without a GPU); ResourceExhausted when the model
  // cannot fit host memory or the accelerator (the plan); the checkpoint's errors (NotFound,
  // DataLoss, FailedPrecondition for a checkpoint of another model). Nothing is written before
  // everything is checked. Prints the header and the setup's long phases to env.out (see
  // TrainerEnvironment::out); Run() prints the rest.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                         TrainerEnvironment env = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains up to train_steps (see the file comment). Errors of the layers below, with their
  // messages; metrics and trace files are flushed and closed in every case.
  [[nodiscard]] absl::Status Run();

  const TrainSummary& summary() const;
  const std::vector<StepMetrics>& history() const;
  // The model being trained, for inspection between Create and Run and after Run (tests read
  // tensors through it: GptModel::ReadTensor, BaseFingerprint). Not during Run. The reference is
  // valid as long as the Trainer.
  const GptModel& model() const;
  // The summary as printed at the end of Run().
  std::string SummaryText() const;

 private:
  class Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_TRAINER_H_
