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
#include "trainer/io/metrics_writer.h"
#include "trainer/io/run_paths.h"
#include "trainer/io/trace_writer.h"
#include "trainer/model_resolution.h"
#include "trainer/profiler.h"
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
absl::Status JoinWorld(TrainRun& run) {
  if (run.env.communicator != nullptr) {
    run.rank = run.env.communicator->rank();
    run.world = run.env.communicator->world_size();
  }
  RETURN_IF_ERROR(CheckCommunicatorFitsAccelerator(
      run.config.accelerator.kind, run.world > 1 ? run.env.communicator : nullptr,
      run.env.device_communicator_for_test != nullptr));
  run.device_index = run.config.accelerator.device_index;
  if (run.env.communicator != nullptr && run.env.communicator->cuda_device() >= 0) {
    run.device_index = run.env.communicator->cuda_device();
  }
  return absl::OkStatus();
}

// The run's shape: sequence length, micro-batch, accumulation steps, threads, compute dtype.
void ResolveShape(TrainRun& run) {
  run.seq_len = ResolveSeqLen(run.config, run.gpt);
  run.micro_batch = run.config.train_micro_batch_size_per_gpu;
  run.accumulation_steps = run.config.gradient_accumulation_steps;
  run.threads = ResolveThreads(run.config.threads);
  run.dtype = ComputeDType(run.config.precision());
}

// On cuda, what the machine says first, before any work (no CUDA in this build, no usable GPU, a
// cap above its free memory), the memory this run can use, and the GPU kernels' workspaces; on
// the emulated accelerator, the CPU kernels' workspaces. The plan replays these workspaces.
absl::Status ProbeAccelerator(TrainRun& run) {
  if (run.config.accelerator.kind == AcceleratorKind::kCuda) {
    // The backend's message names the fix.
    BackendOptions probe;
    probe.kind = "cuda";
    probe.device_index = run.device_index;
    probe.cuda_margin_bytes = CudaMarginBytes(run.world > 1 && run.DeviceCommunicator());
    // The configured cap, checked against the free memory minus the margin (the backend refuses
    // a larger one, naming accelerator.memory and the most that fits: memory/cuda_capacity.h).
    probe.capacity_bytes = run.config.accelerator.memory_bytes;
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(probe);
    if (!cuda.ok()) {
      return absl::Status(cuda.status().code(),
                          absl::StrCat("accelerator.backend \"cuda\": ", cuda.status().message()));
    }
    // With no cap configured, the probe's capacity is what this run can use: free memory minus
    // the margin (DefaultAcceleratorBudget plans with it).
    run.cuda_usable_bytes = (*cuda)->capacity_bytes();
    // The GPU's kernel workspaces, for the plan: the model's CudaKernels (CreateKernels with the
    // same defaults) will ask for exactly these.
    absl::StatusOr<std::unique_ptr<KernelWorkspaces>> workspaces =
        CreateKernelWorkspaces(cuda->get(), run.threads);
    if (!workspaces.ok()) {
      return absl::Status(workspaces.status().code(), absl::StrCat("accelerator.backend \"cuda\": ",
                                                                   workspaces.status().message()));
    }
    run.kernel_workspaces = *std::move(workspaces);
  } else {
    run.kernel_workspaces = std::make_shared<const CpuKernelWorkspaces>(run.threads);
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
  const bool export_dir = run.lora.has_value() || ExportsHfDirectory(run);
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
absl::Status CreateMemory(TrainRun& run) {
  // The accelerator (the emulated one, or the GPU) under its cap, pinned host memory under the
  // host cap; one chunk pool per block size (16-bit param chunks take 16-bit blocks).
  const bool cuda = run.config.accelerator.kind == AcceleratorKind::kCuda;
  BackendOptions backend_options;
  backend_options.kind = cuda ? "cuda" : "cpu";
  backend_options.device_index = run.device_index;
  // The plan already kept the whole margin out of the budget (ProbeAccelerator); the backend checks
  // the cap again against the free memory now, which the probe's cuBLAS handle and lazily loaded
  // modules may have lowered since: half the margin is left for that re-check.
  backend_options.cuda_margin_bytes =
      CudaMarginBytes(run.world > 1 && run.DeviceCommunicator()) / 2;
  backend_options.capacity_bytes = run.plan.accelerator_bytes;
  // (ValidateTrainConfig refuses accelerator.copy_bandwidth with "cuda".)
  if (!cuda) {
    backend_options.copy_bandwidth_bytes_per_s = run.config.accelerator.copy_bandwidth_bytes_per_s;
  }
  {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_options);
    if (!backend.ok()) {
      return absl::Status(backend.status().code(),
                          absl::StrCat("accelerator.backend \"", backend_options.kind, "\" with ",
                                       FormatBytes(run.plan.accelerator_bytes),
                                       " (accelerator.memory, or the plan's minimum when unset): ",
                                       backend.status().message()));
    }
    run.backend = *std::move(backend);
  }
  if (run.env.stop_requested_async && backend_options.copy_bandwidth_bytes_per_s > 0) {
    RETURN_IF_ERROR(SetCpuLinkInterrupt(*run.backend, run.env.stop_requested_async));
  }
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = run.chunk_elems * static_cast<int64_t>(sizeof(float));
  if (SizeOf(run.dtype) != static_cast<int64_t>(sizeof(float))) {
    memory_options.more_chunk_block_bytes = {run.chunk_elems * SizeOf(run.dtype)};
  }
  DeviceMemoryOptions host_options = memory_options;
  // Activations come from the caching allocator in segments sized to the budget; the plan
  // measured what they strand and the manager's slack below covers it.
  memory_options.scratch = run.plan.scratch;
  // CudaAdam's device bytes come from the backend beside the pools (see trainer.h).
  if (run.reserve.adam_bytes > 0) {
    memory_options.capacity_bytes = run.plan.accelerator_bytes - run.reserve.adam_bytes;
  }
  ASSIGN_OR_RETURN(run.accelerator, CreateAcceleratorMemory(run.backend.get(), memory_options));
  if (run.config.accelerator.host_memory_bytes > 0) {
    host_options.capacity_bytes = run.config.accelerator.host_memory_bytes;
  }
  ASSIGN_OR_RETURN(run.host, CreateHostMemory(run.backend.get(), host_options));
  return absl::OkStatus();
}

// The ZeRO collectives (world > 1 only): a device-memory communicator stages in the
// accelerator's scratch from here on (the plan reserved it: run.reserve.comm_staging_bytes).
absl::Status CreateCollectives(TrainRun& run) {
  if (run.world <= 1) return absl::OkStatus();
  Communicator* comm = run.env.communicator;
  if (run.env.device_communicator_for_test) {
    run.test_communicator =
        run.env.device_communicator_for_test(run.env.communicator, run.backend.get());
    if (run.test_communicator == nullptr || run.test_communicator->memory() == CommMemory::kHost ||
        run.test_communicator->rank() != run.rank ||
        run.test_communicator->world_size() != run.world) {
      return absl::InvalidArgumentError(
          "TrainerEnvironment::device_communicator_for_test must return a device-memory "
          "communicator of the same rank and world");
    }
    comm = run.test_communicator.get();
  }
  CommCollectivesOptions collectives_options;
  collectives_options.timeout = run.env.comm_timeout;
  collectives_options.backend = run.backend.get();
  collectives_options.accelerator = run.accelerator.get();
  collectives_options.chunk_elems = run.chunk_elems;
  collectives_options.dtype = run.dtype;
  ASSIGN_OR_RETURN(run.collectives, CommCollectives::Create(comm, collectives_options));
  return absl::OkStatus();
}

// The model's tensors laid out in chunks of the planned size (sharded over the world), and the
// store of their payloads.
absl::Status CreateChunkStore(TrainRun& run) {
  // With LoRA: the frozen base's operators, then the adapters' (trainable) in their own chunks.
  const std::vector<OperatorSpec> ops =
      ModelOperatorsFor(run.model_config, run.lora, run.plan.vocab);

  ChunkLayoutOptions layout_options;
  layout_options.capacity_elems = run.chunk_elems;
  layout_options.world_size = run.world;
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build(layout_options, ops));
  ChunkStoreOptions store_options;
  store_options.compute_dtype = run.dtype;
  store_options.rank = run.rank;
  ASSIGN_OR_RETURN(run.store, ChunkStore::Create(std::move(layout), store_options));
  return absl::OkStatus();
}

// Outputs are opened only once everything above has been checked, by rank 0 only (each rank
// creates its checkpoint root now, so that a directory that cannot be created fails here, not at
// the first checkpoint after hours of training). The trace; the metrics file opens in
// StartFirstStep (it appends on resume, once the step is known).
absl::Status OpenOutputs(TrainRun& run) {
  if (!run.config.checkpoint.dir.empty()) {
    const std::string root = RankCheckpointRoot(run.config.checkpoint.dir, run.rank);
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint.dir (--save_dir): cannot create '", root, "': ", ec.message()));
    }
  }
  if (!run.config.profile.trace_path.empty() && run.rank == 0) {
    TraceWriterOptions trace_options;
    trace_options.process_name = absl::StrCat("patrickstar_cc train (", run.gpt.name, ")");
    ASSIGN_OR_RETURN(run.trace, TraceWriter::Create(run.config.profile.trace_path, trace_options));
    run.profiler = std::make_unique<TraceProfiler>(run.trace.get());
    run.steps_track = run.trace->Track("steps");
  }
  return absl::OkStatus();
}

// The disk tier (offload_optimizer.device "nvme"): opens the swap files (claiming nvme_path for
// this rank: disk/swap_dir.h), then measures the disk there through the swap's own I/O path (the
// bandwidth the console and the metrics compare the run's state I/O with), and hands the swap to
// the manager with the plan's host budget. The claim comes first, so a second run on a directory
// in use is refused before its probe writes anything there.
constexpr int64_t kDiskProbeBytes = 256 * kMiB;

absl::Status OpenDiskTier(TrainRun& run, ChunkManagerOptions& manager_options) {
  const OffloadOptimizerConfig& offload = run.config.zero_optimization.offload_optimizer;
  if (offload.device != OffloadDevice::kNvme) return absl::OkStatus();
  FileChunkSwapOptions swap_options;
  swap_options.dir = offload.nvme_path;
  swap_options.rank = run.rank;
  swap_options.block_size = run.config.aio.block_size_bytes;
  swap_options.queue_depth = static_cast<int>(run.config.aio.queue_depth);
  swap_options.thread_count = static_cast<int>(run.config.aio.thread_count);
  swap_options.single_submit = run.config.aio.single_submit;
  swap_options.overlap_events = run.config.aio.overlap_events;
  const auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("the disk tier under ", offload.nvme_path,
                                               " (zero_optimization.offload_optimizer.nvme_path, "
                                               "--nvme_path): ",
                                               s.message()));
  };
  // Enough to cover the disk's latency and reach its sequential rate, small beside the state.
  const int64_t probe_bytes = std::min<int64_t>(
      kDiskProbeBytes, std::max<int64_t>(run.plan.plan.state_chunk_bytes, 16 * kMiB));
  FileChunkSwapOptions open_options = swap_options;
  open_options.wrap_engine_for_test = run.env.wrap_disk_engine_for_test;
  absl::StatusOr<std::unique_ptr<ChunkSwap>> swap = OpenFileChunkSwap(std::move(open_options));
  if (!swap.ok()) return named(swap.status());
  run.swap = *std::move(swap);
  absl::StatusOr<DiskBandwidth> bandwidth =
      MeasureDiskBandwidth(offload.nvme_path, swap_options, probe_bytes);
  if (!bandwidth.ok()) return named(bandwidth.status());
  run.disk_bandwidth = *std::move(bandwidth);
  manager_options.disk = DiskTierOptions{.swap = run.swap.get(),
                                         .host_budget_bytes = run.plan.disk_host_budget_bytes,
                                         .read_ahead = offload.buffer_count};
  return absl::OkStatus();
}

// The compute stream, the tide-aware ChunkManager over it and the model computing on it.
absl::Status CreateManagerAndModel(TrainRun& run) {
  ChunkManagerOptions manager_options;
  if (run.profiler != nullptr) manager_options.listener = run.profiler.get();
  // Room for what the activation segments strand (the plan replayed them), and a warm-up share
  // that leaves the highest activation peak room: the warm-up needs no pressure eviction.
  manager_options.nonmodel_slack_bytes = run.plan.plan.slack_bytes;
  manager_options.warmup_chunk_fraction = run.plan.plan.warmup_chunk_fraction;
  manager_options.collectives = run.collectives.get();
  // The export's broadcast tile (device-memory communicator) is allocated after the last step.
  manager_options.comm_buffer_bytes = run.reserve.export_tile_bytes;
  ASSIGN_OR_RETURN(run.compute_stream, run.backend->CreateStream());
  manager_options.compute_stream = run.compute_stream.get();
  RETURN_IF_ERROR(OpenDiskTier(run, manager_options));
  ASSIGN_OR_RETURN(run.manager,
                   ChunkManager::Create(run.store.get(), run.backend.get(), run.accelerator.get(),
                                        run.host.get(), manager_options));
  GptModelOptions model_options;
  model_options.batch = run.micro_batch;
  model_options.seq_len = run.seq_len;
  model_options.activation_checkpointing = run.config.model.activation_checkpointing;
  model_options.seed = run.config.seed;
  model_options.threads = run.threads;
  // The model creates the backend's kernels over its own pool of `threads` threads.
  model_options.compute_stream = run.compute_stream.get();
  model_options.lora = run.lora;
  ASSIGN_OR_RETURN(run.model,
                   TransformerModel::Create(run.model_config, run.store.get(), run.manager.get(),
                                            run.accelerator.get(), model_options));
  return absl::OkStatus();
}

// HybridAdam (CpuAdam for the host's chunks; for the accelerator's, CpuAdam on the emulated one
// and CudaAdam on a GPU), its gradient statistics summed over ranks, and the learning-rate
// schedule.
absl::Status CreateOptimizer(TrainRun& run) {
  const bool cuda = run.config.accelerator.kind == AcceleratorKind::kCuda;
  CpuAdamOptions cpu_adam_options;
  cpu_adam_options.num_threads = run.threads;
  ASSIGN_OR_RETURN(run.cpu_adam, CpuAdam::Create(cpu_adam_options));
  ASSIGN_OR_RETURN(HybridAdamOptions adam_options, MakeHybridAdamOptions(run.config));
  if (run.collectives != nullptr) {
    CommCollectives* collectives = run.collectives.get();
    adam_options.grad_stats_reducer = [collectives](GradStats& stats) {
      return collectives->ReduceGradStats(stats.sum_squares, stats.nonfinite_elems);
    };
  }
  HybridAdamKernels kernels;
  kernels.host = run.cpu_adam.get();
  if (cuda) {
    ASSIGN_OR_RETURN(run.accelerator_adam, CreateCudaAdam(*run.backend));
    kernels.accelerator = run.accelerator_adam.get();
    // Pinned, so CudaAdam accumulates GPU chunks' gradients into it in place (mapped memory)
    // instead of through synchronous pageable round trips.
    kernels.pinned_accumulator_backend = run.backend.get();
  } else {
    kernels.accelerator = run.cpu_adam.get();  // the emulated accelerator's memory is host memory
  }
  ASSIGN_OR_RETURN(run.adam, HybridAdam::Create(run.store->layout(), run.rank, run.dtype,
                                                std::move(adam_options), kernels));
  ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(MakeLrScheduleOptions(run.config)));
  run.schedule.emplace(schedule);
  return absl::OkStatus();
}

// The base weights: a Hugging Face directory or GPT-2 safetensors file (checkpoint.init_from),
// or the seed. With LoRA, `init_adapters` first initializes the whole model from the seed (A
// Kaiming-uniform, B zero: the adapters' only initializer) before init_from replaces the base.
absl::Status LoadBase(TrainRun& run, bool init_adapters) {
  if (!run.hf.has_value() && run.config.checkpoint.init_from.empty()) {
    return run.model->InitializeParameters(run.config.seed);
  }
  if (init_adapters) RETURN_IF_ERROR(run.model->InitializeParameters(run.config.seed));
  if (run.hf.has_value()) {
    RETURN_IF_ERROR(run.model->LoadHfCheckpoint(*run.hf));
    if (run.out() != nullptr) {
      *run.out() << "initialized " << (run.lora.has_value() ? "the frozen base " : "")
                 << "from the Hugging Face " << ModelFamilyName(run.model_config.family)
                 << " model in " << run.config.checkpoint.init_from << "\n";
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Gpt2Checkpoint checkpoint,
                   Gpt2Checkpoint::Open(run.config.checkpoint.init_from));
  RETURN_IF_ERROR(run.model->LoadGpt2Checkpoint(checkpoint));
  if (run.out() != nullptr) {
    *run.out() << "initialized " << (run.lora.has_value() ? "the frozen base " : "") << "from "
               << run.config.checkpoint.init_from << "\n";
  }
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
  if (!run.lora.has_value()) {
    if (run.config.checkpoint.resume) return Resume(run);
    return LoadBase(run, /*init_adapters=*/false);
  }
  const std::string& adapter_dir = run.config.lora->init_from;
  const bool adapters_loaded = run.config.checkpoint.resume || !adapter_dir.empty();
  RETURN_IF_ERROR(LoadBase(run, /*init_adapters=*/!adapters_loaded));
  if (!run.config.checkpoint.dir.empty() && run.world == 1) {
    ASSIGN_OR_RETURN(run.base_fingerprint, run.model->BaseFingerprint());
  }
  if (run.config.checkpoint.resume) {
    if (!adapter_dir.empty() && run.out() != nullptr) {
      *run.out() << "lora.init_from " << adapter_dir
                 << " not read: resuming from the checkpoint's adapters\n";
    }
    return Resume(run);
  }
  if (!adapter_dir.empty()) {
    if (absl::Status s = run.model->LoadPeftAdapter(adapter_dir); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("lora.init_from (--lora_init_from) '", adapter_dir,
                                                 "': ", s.message()));
    }
    if (run.out() != nullptr) *run.out() << "LoRA adapters from " << adapter_dir << "\n";
  }
  return absl::OkStatus();
}

// The metrics file, the batch buffers, and the memory peaks measured from here on.
absl::Status StartFirstStep(TrainRun& run) {
  if (!run.config.profile.metrics_path.empty() && run.rank == 0) {
    // Appending on resume keeps the earlier steps' lines.
    ASSIGN_OR_RETURN(run.metrics, MetricsWriter::Open(run.config.profile.metrics_path,
                                                      run.config.checkpoint.resume && run.step > 0
                                                          ? MetricsFileMode::kAppend
                                                          : MetricsFileMode::kTruncate));
  }
  run.summary.planned_accelerator_bytes = run.plan.accelerator_bytes;
  run.summary.planned_min_accelerator_bytes = run.plan.plan.min_accelerator_bytes;
  run.summary.planned_accelerator_peak_bytes = run.plan.plan.predicted_accelerator_peak_bytes;
  run.summary.planned_host_model_data_bytes = run.plan.plan.host_model_data_bytes;
  run.summary.planned_host_peak_bytes = run.plan.plan.host_peak_bytes;
  run.tokens.assign(static_cast<size_t>(run.micro_batch * run.seq_len), 0);
  run.targets.assign(run.tokens.size(), 0);
  // Peaks from now on.
  run.accelerator->tracker()->SnapshotAndResetIntervalPeaks();
  run.host->tracker()->SnapshotAndResetIntervalPeaks();
  return absl::OkStatus();
}

}  // namespace

absl::Status WireRun(TrainRun& run) {
  RETURN_IF_ERROR(JoinWorld(run));
  RETURN_IF_ERROR(ValidateTrainConfig(run.config, run.world));
  RETURN_IF_ERROR(ResolveModel(run));
  RETURN_IF_ERROR(ResolveLora(run));
  ResolveShape(run);
  RETURN_IF_ERROR(ProbeAccelerator(run));
  RETURN_IF_ERROR(CheckPaths(run));
  // Before anything sizeable is allocated (the data too): the plan.
  RETURN_IF_ERROR(PlanMemoryOrRefuse(run));
  RETURN_IF_ERROR(LoadData(run));
  RETURN_IF_ERROR(CreateMemory(run));
  RETURN_IF_ERROR(CreateCollectives(run));
  RETURN_IF_ERROR(CreateChunkStore(run));
  RETURN_IF_ERROR(OpenOutputs(run));
  RETURN_IF_ERROR(CreateManagerAndModel(run));
  RETURN_IF_ERROR(CreateOptimizer(run));
  RETURN_IF_ERROR(InitializeWeights(run));
  return StartFirstStep(run);
}

}  // namespace trainer_internal
}  // namespace ps
