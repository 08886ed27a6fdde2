#include "trainer/run_wiring.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/operator_spec.h"
#include "comm/communicator.h"
#include "disk/chunk_swap.h"
#include "disk/disk_probe.h"
#include "disk/file_chunk_swap.h"
#include "disk/swap_options.h"
#include "memory/backend.h"
#include "memory/backend_factory.h"
#include "memory/cpu_backend.h"
#include "memory/cuda_capacity.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_model.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels_factory.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "optimizer/adam_kernels.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/lr_schedule.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/comm_collectives.h"
#include "scheduler/disk_tier.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/config_optimizer.h"
#include "trainer/config_validate.h"
#include "trainer/console.h"
#include "trainer/io/metrics_writer.h"
#include "trainer/io/run_paths.h"
#include "trainer/io/trace_writer.h"
#include "trainer/model_resolution.h"
#include "trainer/profiler.h"
#include "trainer/progress_meter.h"
#include "trainer/run_checkpoints.h"
#include "trainer/run_data.h"
#include "trainer/run_plan.h"
#include "trainer/trainer.h"

#if PS_WITH_CUDA
#include "optimizer/cuda/cuda_adam.h"
#endif

namespace ps {

absl::Status CheckCommunicatorFitsAccelerator(AcceleratorKind kind,
                                              const Communicator* communicator,
                                              bool device_communicator_for_test) {
  if (kind != AcceleratorKind::kCuda || communicator == nullptr ||
      communicator->world_size() <= 1 || device_communicator_for_test ||
      communicator->memory() != CommMemory::kHost) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "accelerator.backend \"cuda\" with the host-memory communicator \"", communicator->name(),
      "\" (", communicator->world_size(),
      " ranks) hands GPU memory to a host communicator: the ZeRO chunk payloads live on the GPU. "
      "Use --comm=nccl (or --comm=auto, which picks nccl for --accelerator=cuda under mpirun)"));
}

namespace trainer_internal {
namespace {

// config.threads, or one per hardware thread when it is 0.
int ResolveThreads(int configured) {
  if (configured > 0) return configured;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// The total seconds of the setup's phases so far.
double PhaseSeconds(const RunConsole& console) {
  double total = 0;
  for (const auto& [name, seconds] : console.phases) total += seconds;
  return total;
}

// Runs `step` (a callable returning absl::Status) and adds the time it took to the setup phase
// `name`, less the time of the phases it recorded itself (a Phase inside it).
template <typename Step>
absl::Status Timed(const TrainRun& run, RunConsole& console, absl::string_view name, Step&& step) {
  const double inner0 = PhaseSeconds(console);
  const int64_t t0 = run.EnvNowNs();
  absl::Status status = step();
  const double inner = PhaseSeconds(console) - inner0;
  console.AddPhase(name, std::max(0.0, Seconds(t0, run.EnvNowNs()) - inner));
  return status;
}

// A long phase of the setup, shown on the console: "<label> ..." when it starts, its progress
// (through the ProgressFn `work` is given, in `unit`), and "done in S s" (or "failed after S s")
// when it ends; its time goes to the setup phase `name`. `work` is a callable taking a
// ProgressFn and returning absl::Status.
template <typename Work>
absl::Status Phase(const TrainRun& run, RunConsole& console, absl::string_view name,
                   absl::string_view label, ProgressUnit unit, Work&& work) {
  ProgressMeter& meter = *console.meter;
  const int64_t t0 = run.EnvNowNs();
  meter.Begin(label, unit);
  absl::Status status = work(meter.Fn());
  if (status.ok()) {
    meter.End();
  } else {
    meter.Fail();
  }
  console.AddPhase(name, Seconds(t0, run.EnvNowNs()));
  return status;
}

// The accelerator-side Adam of a cuda backend: CudaAdam (only in a --config=cuda build, the only
// one that can create a cuda backend).
absl::StatusOr<std::unique_ptr<AdamKernels>> CreateCudaAdam(Backend& backend) {
#if PS_WITH_CUDA
  ASSIGN_OR_RETURN(std::unique_ptr<CudaAdam> adam, CudaAdam::Create(backend));
  return std::unique_ptr<AdamKernels>(std::move(adam));
#else
  (void)backend;
  return absl::FailedPreconditionError(
      "accelerator.backend \"cuda\": this binary was built without CUDA support; rebuild with "
      "--config=cuda");
#endif
}

// The data-parallel world (rank, size) and the GPU this rank uses: the device communicator's
// (nccl picks each rank's by its node-local rank), else accelerator.device. A host communicator
// under a cuda accelerator is refused here, before anything else.
absl::Status JoinWorld(const TrainRun& run, RunShape& shape) {
  if (run.env.communicator != nullptr) {
    shape.rank = run.env.communicator->rank();
    shape.world = run.env.communicator->world_size();
  }
  RETURN_IF_ERROR(CheckCommunicatorFitsAccelerator(
      run.config.accelerator.kind, shape.world > 1 ? run.env.communicator : nullptr,
      run.env.device_communicator_for_test != nullptr));
  shape.device_index = run.config.accelerator.device_index;
  if (run.env.communicator != nullptr && run.env.communicator->cuda_device() >= 0) {
    shape.device_index = run.env.communicator->cuda_device();
  }
  return absl::OkStatus();
}

// The run's shape: sequence length, micro-batch, accumulation steps, threads, compute dtype.
void ResolveShape(const TrainRun& run, RunShape& shape) {
  shape.seq_len = ResolveSeqLen(run.config, run.resolved.gpt);
  shape.micro_batch = run.config.train_micro_batch_size_per_gpu;
  shape.accumulation_steps = run.config.gradient_accumulation_steps;
  shape.threads = ResolveThreads(run.config.threads);
  shape.dtype = ComputeDType(run.config.precision());
}

// On cuda, what the machine says first, before any work (no CUDA in this build, no usable GPU, a
// cap above its free memory), the memory this run can use, and the GPU kernels' workspaces; on
// the emulated accelerator, the CPU kernels' workspaces. The plan replays these workspaces.
absl::Status ProbeAccelerator(const TrainRun& run, AcceleratorProbe& probe) {
  if (run.config.accelerator.kind == AcceleratorKind::kCuda) {
    // The backend's message names the fix.
    BackendOptions probe_options;
    probe_options.kind = "cuda";
    probe_options.device_index = run.shape.device_index;
    probe_options.cuda_margin_bytes =
        CudaMarginBytes(run.shape.world > 1 && run.DeviceCommunicator());
    // The configured cap, checked against the free memory minus the margin (the backend refuses
    // a larger one, naming accelerator.memory and the most that fits: memory/cuda_capacity.h).
    probe_options.capacity_bytes = run.config.accelerator.memory_bytes;
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(probe_options);
    if (!cuda.ok()) {
      return absl::Status(cuda.status().code(),
                          absl::StrCat("accelerator.backend \"cuda\": ", cuda.status().message()));
    }
    // With no cap configured, the probe's capacity is what this run can use: free memory minus
    // the margin (DefaultAcceleratorBudget plans with it).
    probe.cuda_usable_bytes = (*cuda)->capacity_bytes();
    // The GPU's kernel workspaces, for the plan: the model's CudaKernels (CreateKernels with the
    // same defaults) will ask for exactly these.
    absl::StatusOr<std::unique_ptr<KernelWorkspaces>> workspaces =
        CreateKernelWorkspaces(cuda->get(), run.shape.threads);
    if (!workspaces.ok()) {
      return absl::Status(workspaces.status().code(), absl::StrCat("accelerator.backend \"cuda\": ",
                                                                   workspaces.status().message()));
    }
    probe.kernel_workspaces = *std::move(workspaces);
  } else {
    probe.kernel_workspaces = std::make_shared<const CpuKernelWorkspaces>(run.shape.threads);
  }
  return absl::OkStatus();
}

// No output may overwrite an input or another output (trainer/io/run_paths.h).
absl::Status CheckPaths(const TrainRun& run) {
  const RunInput inputs[] = {
      {run.env.config_path, "the config file (--config)"},
      {run.config.data.train_path, "data.train (--train_data)"},
      {run.config.data.val_path, "data.val (--val_data)"},
      {run.config.checkpoint.init_from, "checkpoint.init_from (--init_from)"},
      {run.config.lora.has_value() ? run.config.lora->init_from : std::string(),
       "lora.init_from (--lora_init_from)"}};
  // With LoRA, checkpoint.export is a PEFT adapter directory.
  const bool export_dir = run.resolved.lora.has_value() || ExportsHfDirectory(run);
  const RunOutput outputs[] = {
      {run.config.profile.metrics_path, "profile.metrics (--metrics_out)"},
      {run.config.profile.trace_path, "profile.trace (--trace_out)"},
      {run.config.checkpoint.export_path, "checkpoint.export",
       export_dir ? RunOutputKind::kReplacedDirectory : RunOutputKind::kFile},
      {run.config.checkpoint.export_merged, "checkpoint.export_merged (--export_merged)",
       RunOutputKind::kReplacedDirectory},
      {run.config.checkpoint.dir, "checkpoint.dir (--save_dir)", RunOutputKind::kCheckpointRoot}};
  return CheckRunPaths(inputs, outputs);
}

// The backend under the plan's budget, the accelerator's memory (chunk pools and the activations'
// scratch) and pinned host memory.
absl::Status CreateMemory(const TrainRun& run, Runtime& runtime) {
  // The accelerator (the emulated one, or the GPU) under its cap, pinned host memory under the
  // host cap; one chunk pool per block size (16-bit param chunks take 16-bit blocks).
  const bool cuda = run.config.accelerator.kind == AcceleratorKind::kCuda;
  BackendOptions backend_options;
  backend_options.kind = cuda ? "cuda" : "cpu";
  backend_options.device_index = run.shape.device_index;
  // The plan already kept the whole margin out of the budget (ProbeAccelerator); the backend checks
  // the cap again against the free memory now, which the probe's cuBLAS handle and lazily loaded
  // modules may have lowered since: half the margin is left for that re-check.
  backend_options.cuda_margin_bytes =
      CudaMarginBytes(run.shape.world > 1 && run.DeviceCommunicator()) / 2;
  backend_options.capacity_bytes = run.memory.plan.accelerator_bytes;
  // (ValidateTrainConfig refuses accelerator.copy_bandwidth with "cuda".)
  if (!cuda) {
    backend_options.copy_bandwidth_bytes_per_s = run.config.accelerator.copy_bandwidth_bytes_per_s;
  }
  {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_options);
    if (!backend.ok()) {
      return absl::Status(backend.status().code(),
                          absl::StrCat("accelerator.backend \"", backend_options.kind, "\" with ",
                                       FormatBytes(run.memory.plan.accelerator_bytes),
                                       " (accelerator.memory, or the plan's minimum when unset): ",
                                       backend.status().message()));
    }
    runtime.backend = *std::move(backend);
  }
  if (run.env.stop_requested_async && backend_options.copy_bandwidth_bytes_per_s > 0) {
    RETURN_IF_ERROR(SetCpuLinkInterrupt(*runtime.backend, run.env.stop_requested_async));
  }
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = run.memory.chunk_elems * static_cast<int64_t>(sizeof(float));
  if (SizeOf(run.shape.dtype) != static_cast<int64_t>(sizeof(float))) {
    memory_options.more_chunk_block_bytes = {run.memory.chunk_elems * SizeOf(run.shape.dtype)};
  }
  DeviceMemoryOptions host_options = memory_options;
  // Activations come from the caching allocator in segments sized to the budget; the plan
  // measured what they strand and the manager's slack below covers it.
  memory_options.scratch = run.memory.plan.scratch;
  // CudaAdam's device bytes come from the backend beside the pools (see trainer.h).
  if (run.memory.reserve.adam_bytes > 0) {
    memory_options.capacity_bytes =
        run.memory.plan.accelerator_bytes - run.memory.reserve.adam_bytes;
  }
  ASSIGN_OR_RETURN(runtime.accelerator,
                   CreateAcceleratorMemory(runtime.backend.get(), memory_options));
  if (run.config.accelerator.host_memory_bytes > 0) {
    host_options.capacity_bytes = run.config.accelerator.host_memory_bytes;
  }
  ASSIGN_OR_RETURN(runtime.host, CreateHostMemory(runtime.backend.get(), host_options));
  return absl::OkStatus();
}

// The ZeRO collectives (world > 1 only): a device-memory communicator stages in the
// accelerator's scratch from here on (the plan reserved it: run.memory.reserve.comm_staging_bytes).
absl::Status CreateCollectives(const TrainRun& run, Runtime& runtime) {
  if (run.shape.world <= 1) return absl::OkStatus();
  Communicator* comm = run.env.communicator;
  if (run.env.device_communicator_for_test) {
    runtime.test_communicator =
        run.env.device_communicator_for_test(run.env.communicator, runtime.backend.get());
    if (runtime.test_communicator == nullptr ||
        runtime.test_communicator->memory() == CommMemory::kHost ||
        runtime.test_communicator->rank() != run.shape.rank ||
        runtime.test_communicator->world_size() != run.shape.world) {
      return absl::InvalidArgumentError(
          "TrainerEnvironment::device_communicator_for_test must return a device-memory "
          "communicator of the same rank and world");
    }
    comm = runtime.test_communicator.get();
  }
  CommCollectivesOptions collectives_options;
  collectives_options.timeout = run.env.comm_timeout;
  collectives_options.backend = runtime.backend.get();
  collectives_options.accelerator = runtime.accelerator.get();
  collectives_options.chunk_elems = run.memory.chunk_elems;
  collectives_options.dtype = run.shape.dtype;
  ASSIGN_OR_RETURN(runtime.collectives, CommCollectives::Create(comm, collectives_options));
  return absl::OkStatus();
}

// The model's tensors laid out in chunks of the planned size (sharded over the world), and the
// store of their payloads.
absl::Status CreateChunkStore(const TrainRun& run, Runtime& runtime) {
  // With LoRA: the frozen base's operators, then the adapters' (trainable) in their own chunks;
  // with a 4-bit base its block linears at their blobs' size, each blob 16-byte aligned.
  const std::vector<OperatorSpec> ops =
      ModelOperatorsFor(run.resolved.model_config, run.resolved.lora, run.memory.plan.vocab,
                        run.resolved.quant4, run.shape.dtype);

  ChunkLayoutOptions layout_options;
  layout_options.capacity_elems = run.memory.chunk_elems;
  layout_options.world_size = run.shape.world;
  if (run.resolved.quant4.has_value()) {
    layout_options.tensor_alignment_elems = Quant4AlignmentElems(run.shape.dtype);
  }
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build(layout_options, ops));
  ChunkStoreOptions store_options;
  store_options.compute_dtype = run.shape.dtype;
  store_options.rank = run.shape.rank;
  ASSIGN_OR_RETURN(runtime.store, ChunkStore::Create(std::move(layout), store_options));
  return absl::OkStatus();
}

// Outputs are opened only once everything above has been checked, by rank 0 only (each rank
// creates its checkpoint root now, so that a directory that cannot be created fails here, not at
// the first checkpoint after hours of training). The trace; the metrics file opens in
// StartFirstStep (it appends on resume, once the step is known).
absl::Status OpenOutputs(const TrainRun& run, Runtime& runtime) {
  if (!run.config.checkpoint.dir.empty()) {
    const std::string root = RankCheckpointRoot(run.config.checkpoint.dir, run.shape.rank);
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint.dir (--save_dir): cannot create '", root, "': ", ec.message()));
    }
  }
  if (!run.config.profile.trace_path.empty() && run.shape.rank == 0) {
    TraceWriterOptions trace_options;
    trace_options.process_name = absl::StrCat("patrickstar_cc train (", run.resolved.gpt.name, ")");
    ASSIGN_OR_RETURN(runtime.trace,
                     TraceWriter::Create(run.config.profile.trace_path, trace_options));
    runtime.profiler = std::make_unique<TraceProfiler>(runtime.trace.get());
    runtime.steps_track = runtime.trace->Track("steps");
  }
  return absl::OkStatus();
}

// The disk tier (offload_optimizer.device "nvme", offload_param.device "nvme", or both: one swap
// under nvme_path): opens the swap files (claiming nvme_path for this rank: disk/swap_dir.h),
// then measures the disk there through the swap's own I/O path (the bandwidth the console and the
// metrics compare the run's I/O with), and hands the swap to the manager with the plan's host
// budgets (the optimizer state's; the frozen base's). The claim comes first, so a second run on a
// directory in use is refused before its probe writes anything there.
constexpr int64_t kDiskProbeBytes = 256 * kMiB;

absl::Status OpenDiskTier(const TrainRun& run, Runtime& runtime,
                          ChunkManagerOptions& manager_options, RunConsole& console) {
  const ZeroOptimizationConfig& zero = run.config.zero_optimization;
  if (!UsesDiskTier(zero)) return absl::OkStatus();
  const OffloadOptimizerConfig& offload = zero.offload_optimizer;
  const OffloadParamConfig& param = zero.offload_param;
  const std::string& dir = DiskTierDir(zero);
  FileChunkSwapOptions swap_options;
  swap_options.dir = dir;
  swap_options.rank = run.shape.rank;
  swap_options.block_size = run.config.aio.block_size_bytes;
  swap_options.queue_depth = static_cast<int>(run.config.aio.queue_depth);
  swap_options.thread_count = static_cast<int>(run.config.aio.thread_count);
  swap_options.single_submit = run.config.aio.single_submit;
  swap_options.overlap_events = run.config.aio.overlap_events;
  const auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("the disk tier under ", dir, " (",
                                               DiskTierDirKey(zero), "): ", s.message()));
  };
  // Enough to cover the disk's latency and reach its sequential rate, small beside the state.
  const MemoryPlan& p = run.memory.plan.plan;
  const int64_t probe_bytes = std::min<int64_t>(
      kDiskProbeBytes,
      std::max<int64_t>({p.state_chunk_bytes, p.param_chunk_bytes, 16 * kMiB}));
  FileChunkSwapOptions open_options = swap_options;
  open_options.wrap_engine_for_test = run.env.wrap_disk_engine_for_test;
  absl::StatusOr<std::unique_ptr<ChunkSwap>> swap = OpenFileChunkSwap(std::move(open_options));
  if (!swap.ok()) return named(swap.status());
  runtime.swap = *std::move(swap);
  absl::Status measured =
      Phase(run, console, "disk probe",
            absl::StrCat("measuring the disk under ", dir, " (", FormatBytes(probe_bytes),
                         " written and read)"),
            ProgressUnit::kBytes, [&](const ProgressFn&) -> absl::Status {
              ASSIGN_OR_RETURN(runtime.disk_bandwidth,
                               MeasureDiskBandwidth(dir, swap_options, probe_bytes));
              return absl::OkStatus();
            });
  if (!measured.ok()) return named(measured);
  DiskTierOptions disk{.swap = runtime.swap.get(),
                       .host_budget_bytes = run.memory.plan.disk_host_budget_bytes,
                       .read_ahead = offload.buffer_count,
                       .optimizer_state = offload.device == OffloadDevice::kNvme};
  if (param.device == OffloadDevice::kNvme) {
    disk.frozen_params = true;
    disk.frozen_host_budget_bytes = p.disk_frozen_host_budget_bytes;
    disk.frozen_read_ahead = param.buffer_count;
  }
  manager_options.disk = disk;
  return absl::OkStatus();
}

// The compute stream, the tide-aware ChunkManager over it and the model computing on it. The disk
// tier's measurement is a phase of `console`.
absl::Status CreateManagerAndModel(const TrainRun& run, Runtime& runtime, RunConsole& console) {
  ChunkManagerOptions manager_options;
  // One clock for the run: the manager's timings, the steps', the setup's.
  manager_options.clock = run.env.clock;
  if (runtime.profiler != nullptr) manager_options.listener = runtime.profiler.get();
  // Room for what the activation segments strand (the plan replayed them), and a warm-up share
  // that leaves the highest activation peak room: the warm-up needs no pressure eviction.
  manager_options.nonmodel_slack_bytes = run.memory.plan.plan.slack_bytes;
  manager_options.warmup_chunk_fraction = run.memory.plan.plan.warmup_chunk_fraction;
  manager_options.collectives = runtime.collectives.get();
  // The export's broadcast tile (device-memory communicator) is allocated after the last step.
  manager_options.comm_buffer_bytes = run.memory.reserve.export_tile_bytes;
  ASSIGN_OR_RETURN(runtime.compute_stream, runtime.backend->CreateStream());
  manager_options.compute_stream = runtime.compute_stream.get();
  RETURN_IF_ERROR(OpenDiskTier(run, runtime, manager_options, console));
  ASSIGN_OR_RETURN(runtime.manager, ChunkManager::Create(runtime.store.get(), runtime.backend.get(),
                                                         runtime.accelerator.get(),
                                                         runtime.host.get(), manager_options));
  GptModelOptions model_options;
  model_options.batch = run.shape.micro_batch;
  model_options.seq_len = run.shape.seq_len;
  model_options.activation_checkpointing = run.config.model.activation_checkpointing;
  model_options.seed = run.config.seed;
  model_options.threads = run.shape.threads;
  // The model creates the backend's kernels over its own pool of `threads` threads.
  model_options.compute_stream = runtime.compute_stream.get();
  model_options.lora = run.resolved.lora;
  model_options.quant4 = run.resolved.quant4;
  // Example files: positions and key_start on the accelerator, as planned.
  model_options.token_metadata = run.memory.token_metadata;
  ASSIGN_OR_RETURN(
      runtime.model,
      TransformerModel::Create(run.resolved.model_config, runtime.store.get(),
                               runtime.manager.get(), runtime.accelerator.get(), model_options));
  return absl::OkStatus();
}

// HybridAdam (CpuAdam for the host's chunks; for the accelerator's, CpuAdam on the emulated one
// and CudaAdam on a GPU), its gradient statistics summed over ranks, and the learning-rate
// schedule.
absl::Status CreateOptimizer(const TrainRun& run, Runtime& runtime) {
  const bool cuda = run.config.accelerator.kind == AcceleratorKind::kCuda;
  CpuAdamOptions cpu_adam_options;
  cpu_adam_options.num_threads = run.shape.threads;
  ASSIGN_OR_RETURN(runtime.cpu_adam, CpuAdam::Create(cpu_adam_options));
  ASSIGN_OR_RETURN(HybridAdamOptions adam_options, MakeHybridAdamOptions(run.config));
  if (runtime.collectives != nullptr) {
    CommCollectives* collectives = runtime.collectives.get();
    adam_options.grad_stats_reducer = [collectives](GradStats& stats) {
      return collectives->ReduceGradStats(stats.sum_squares, stats.nonfinite_elems);
    };
  }
  HybridAdamKernels kernels;
  kernels.host = runtime.cpu_adam.get();
  if (cuda) {
    ASSIGN_OR_RETURN(runtime.accelerator_adam, CreateCudaAdam(*runtime.backend));
    kernels.accelerator = runtime.accelerator_adam.get();
    // Pinned, so CudaAdam accumulates GPU chunks' gradients into it in place (mapped memory)
    // instead of through synchronous pageable round trips.
    kernels.pinned_accumulator_backend = runtime.backend.get();
  } else {
    kernels.accelerator =
        runtime.cpu_adam.get();  // the emulated accelerator's memory is host memory
  }
  ASSIGN_OR_RETURN(runtime.adam,
                   HybridAdam::Create(runtime.store->layout(), run.shape.rank, run.shape.dtype,
                                      std::move(adam_options), kernels));
  ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(MakeLrScheduleOptions(run.config)));
  runtime.schedule.emplace(schedule);
  return absl::OkStatus();
}

// The seeded initialization as a phase: "initializing 124.4M parameters from seed 42 ...", its
// progress in elements. With LoRA the adapters are initialized too; `adapters_only`: only they are
// (InitializeOptions::adapters_only: the base is then loaded from a Hugging Face directory, so
// seeding it first would be work thrown away; the adapters' values are the same either way).
absl::Status InitializeFromSeed(const TrainRun& run, RunConsole& console, bool adapters_only) {
  std::string what;
  if (adapters_only) {
    what = "the LoRA adapters";
  } else {
    what = absl::StrCat(
        FormatCount(static_cast<double>(ModelParameterCount(run.resolved.model_config))),
        " parameters");
    if (run.resolved.lora.has_value()) absl::StrAppend(&what, " and the LoRA adapters");
    if (run.resolved.quant4.has_value()) {
      absl::StrAppend(&what, ", quantizing the base's block linear layers to 4 bits,");
    }
  }
  return Phase(run, console, "init",
               absl::StrCat("initializing ", what, " from seed ", run.config.seed),
               ProgressUnit::kElements, [&](const ProgressFn& progress) {
                 InitializeOptions options;
                 options.adapters_only = adapters_only;
                 options.progress = progress;
                 return run.runtime.model->InitializeParameters(run.config.seed, options);
               });
}

// The base weights: a Hugging Face directory or GPT-2 safetensors file (checkpoint.init_from),
// or the seed. With LoRA, `init_adapters` first initializes the adapters from the seed (A
// Kaiming-uniform, B zero: the adapters' only initializer) before init_from sets the base: only
// the adapters before a Hugging Face directory (LoadHfCheckpoint sets every base tensor), the
// whole model before a GPT-2 file.
// Each is a phase of the console (a line when it starts, how long it took when it ends).
absl::Status LoadBase(const TrainRun& run, RunConsole& console, bool init_adapters) {
  if (!run.resolved.hf.has_value() && run.config.checkpoint.init_from.empty()) {
    return InitializeFromSeed(run, console, /*adapters_only=*/false);
  }
  if (init_adapters) {
    RETURN_IF_ERROR(
        InitializeFromSeed(run, console, /*adapters_only=*/run.resolved.hf.has_value()));
  }
  const std::string& from = run.config.checkpoint.init_from;
  if (run.resolved.hf.has_value()) {
    const HfCheckpoint& hf = *run.resolved.hf;
    RETURN_IF_ERROR(
        Phase(run, console, "load",
              absl::StrCat("loading ", from, " (", FormatBytes(hf.weights().total_size_bytes()),
                           run.resolved.quant4.has_value()
                               ? ", quantizing the base's block linear layers to 4 bits"
                               : "",
                           ")"),
              ProgressUnit::kBytes, [&](const ProgressFn& progress) {
                return run.runtime.model->LoadHfCheckpoint(hf, progress);
              }));
    PrintLine(run,
              absl::StrCat("initialized ", run.resolved.lora.has_value() ? "the frozen base " : "",
                           "from the Hugging Face ",
                           ModelFamilyName(run.resolved.model_config.family), " model in ", from));
    return absl::OkStatus();
  }
  std::error_code ec;
  const std::uintmax_t file_bytes = std::filesystem::file_size(from, ec);
  RETURN_IF_ERROR(Phase(
      run, console, "load",
      absl::StrCat("loading ", from,
                   ec ? std::string()
                      : absl::StrCat(" (", FormatBytes(static_cast<int64_t>(file_bytes)), ")")),
      ProgressUnit::kBytes, [&](const ProgressFn&) -> absl::Status {
        ASSIGN_OR_RETURN(Gpt2Checkpoint checkpoint, Gpt2Checkpoint::Open(from));
        return run.runtime.model->LoadGpt2Checkpoint(checkpoint);
      }));
  PrintLine(run,
            absl::StrCat("initialized ", run.resolved.lora.has_value() ? "the frozen base " : "",
                         "from ", from));
  return absl::OkStatus();
}

// The initial weights: a checkpoint (checkpoint.resume), a Hugging Face directory or GPT-2
// safetensors file (checkpoint.init_from), or the seed.
//
// LoRA: a checkpoint holds only the adapters (and modules_to_save), so the base is always loaded
// as a fresh run loads it (checkpoint.init_from, or the seed), then the adapters come from the
// checkpoint (resume; as with init_from, resume wins over lora.init_from, which is then unused),
// from lora.init_from (a PEFT adapter directory), or from the seed (A Kaiming-uniform, B zero).
// The base's fingerprint is taken before a checkpoint is read or written (checkpoint.dir set,
// one process), so that resuming against another base is refused.
absl::Status InitializeWeights(TrainRun& run) {
  const auto resume = [&run] { return Resume(run); };
  if (!run.resolved.lora.has_value()) {
    if (run.config.checkpoint.resume) return Timed(run, run.console, "resume", resume);
    return LoadBase(run, run.console, /*init_adapters=*/false);
  }
  const std::string& adapter_dir = run.config.lora->init_from;
  const bool adapters_loaded = run.config.checkpoint.resume || !adapter_dir.empty();
  RETURN_IF_ERROR(LoadBase(run, run.console, /*init_adapters=*/!adapters_loaded));
  if (!run.config.checkpoint.dir.empty() && run.shape.world == 1) {
    ASSIGN_OR_RETURN(run.resolved.base_fingerprint, run.runtime.model->BaseFingerprint());
  }
  if (run.config.checkpoint.resume) {
    if (!adapter_dir.empty()) {
      PrintLine(run, absl::StrCat("lora.init_from ", adapter_dir,
                                  " not read: resuming from the checkpoint's adapters"));
    }
    return Timed(run, run.console, "resume", resume);
  }
  if (!adapter_dir.empty()) {
    RETURN_IF_ERROR(Timed(run, run.console, "adapters", [&]() -> absl::Status {
      if (absl::Status s = run.runtime.model->LoadPeftAdapter(adapter_dir); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("lora.init_from (--lora_init_from) '",
                                                   adapter_dir, "': ", s.message()));
      }
      return absl::OkStatus();
    }));
    PrintLine(run, absl::StrCat("LoRA adapters from ", adapter_dir));
  }
  return absl::OkStatus();
}

// The metrics file, the batch buffers, and the memory peaks measured from here on.
absl::Status StartFirstStep(TrainRun& run) {
  if (!run.config.profile.metrics_path.empty() && run.shape.rank == 0) {
    // Appending on resume keeps the earlier steps' lines.
    ASSIGN_OR_RETURN(run.runtime.metrics,
                     MetricsWriter::Open(run.config.profile.metrics_path,
                                         run.config.checkpoint.resume && run.progress.step > 0
                                             ? MetricsFileMode::kAppend
                                             : MetricsFileMode::kTruncate));
  }
  run.progress.summary.planned_accelerator_bytes = run.memory.plan.accelerator_bytes;
  run.progress.summary.planned_min_accelerator_bytes = run.memory.plan.plan.min_accelerator_bytes;
  run.progress.summary.planned_accelerator_peak_bytes =
      run.memory.plan.plan.predicted_accelerator_peak_bytes;
  run.progress.summary.planned_host_model_data_bytes = run.memory.plan.plan.host_model_data_bytes;
  run.progress.summary.planned_host_peak_bytes = run.memory.plan.plan.host_peak_bytes;
  run.batch.tokens.assign(static_cast<size_t>(run.shape.micro_batch * run.shape.seq_len), 0);
  run.batch.targets.assign(run.batch.tokens.size(), 0);
  // Peaks from now on.
  run.runtime.accelerator->tracker()->SnapshotAndResetIntervalPeaks();
  run.runtime.host->tracker()->SnapshotAndResetIntervalPeaks();
  return absl::OkStatus();
}

}  // namespace

absl::Status WireRun(TrainRun& run) {
  RunConsole& console = run.console;
  if (run.env.start_ns.has_value()) {
    console.AddPhase("startup", Seconds(*run.env.start_ns, run.EnvNowNs()));
  }
  RETURN_IF_ERROR(Timed(run, console, "checks", [&] { return JoinWorld(run, run.shape); }));
  ProgressMeterOptions meter_options;
  meter_options.is_terminal = run.env.out_is_terminal;
  meter_options.clock = run.env.clock;
  console.meter = std::make_unique<ProgressMeter>(run.out(), meter_options);
  RETURN_IF_ERROR(Timed(run, console, "checks", [&]() -> absl::Status {
    RETURN_IF_ERROR(ValidateTrainConfig(run.config, run.shape.world));
    RETURN_IF_ERROR(ResolveModel(run, run.resolved));
    RETURN_IF_ERROR(ResolveLora(run, run.resolved));
    RETURN_IF_ERROR(ResolveQuant4(run, run.resolved));
    ResolveShape(run, run.shape);
    RETURN_IF_ERROR(ProbeAccelerator(run, run.probe));
    return CheckPaths(run);
  }));
  // Before anything sizeable is allocated (the data too): the plan.
  RETURN_IF_ERROR(Timed(run, console, "plan", [&] { return PlanMemoryOrRefuse(run, run.memory); }));
  RETURN_IF_ERROR(Timed(run, console, "data", [&] { return LoadData(run, run.data); }));
  RETURN_IF_ERROR(Timed(run, console, "memory", [&]() -> absl::Status {
    RETURN_IF_ERROR(CreateMemory(run, run.runtime));
    RETURN_IF_ERROR(CreateCollectives(run, run.runtime));
    RETURN_IF_ERROR(CreateChunkStore(run, run.runtime));
    return OpenOutputs(run, run.runtime);
  }));
  // The header, before the work it describes (the disk's measurement, the weights).
  PrintHeader(run);
  RETURN_IF_ERROR(Timed(run, console, "model", [&]() -> absl::Status {
    RETURN_IF_ERROR(CreateManagerAndModel(run, run.runtime, console));
    PrintDiskTier(run);
    return CreateOptimizer(run, run.runtime);
  }));
  RETURN_IF_ERROR(InitializeWeights(run));
  return StartFirstStep(run);
}

}  // namespace trainer_internal
}  // namespace ps
