#include "trainer/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/simd_targets.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "memory/backend.h"
#include "memory/backend_factory.h"
#include "memory/cpu_backend.h"
#include "memory/cuda_capacity.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "memory/host_memory_info.h"
#include "memory/memory_tracker.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels_factory.h"
#include "model/model_config.h"
#include "nlohmann/json.hpp"
#include "optimizer/cpu_adam.h"
#include "optimizer/cuda_adam_footprint.h"
#include "optimizer/grad_accumulator.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/lr_schedule.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/comm_collectives.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/config_json.h"
#include "trainer/config_optimizer.h"
#include "trainer/config_validate.h"
#include "trainer/console.h"
#include "trainer/data/data_loader.h"
#include "trainer/data/synthetic_corpus.h"
#include "trainer/data/token_file.h"
#include "trainer/evaluation.h"
#include "trainer/export.h"
#include "trainer/internal/train_run.h"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/io/metrics_writer.h"
#include "trainer/io/run_paths.h"
#include "trainer/io/trace_writer.h"
#include "trainer/model_resolution.h"
#include "trainer/profiler.h"
#include "trainer/run_checkpoints.h"
#include "trainer/run_data.h"
#include "trainer/run_plan.h"
#include "trainer/train_step.h"

#if PS_WITH_CUDA
#include "optimizer/cuda/cuda_adam.h"
#endif

namespace ps {
namespace {

// What the process has used so far (every thread): wall clock, CPU time, page faults. Differences
// around each step go into the summary (issue #24: the emulated accelerator once spent more
// system time than user time faulting in freshly mapped pages).
struct ProcessUsage {
  trainer_internal::RunClock::time_point wall;
  double user_s = 0, system_s = 0;
  int64_t minor_faults = 0, major_faults = 0;
};

ProcessUsage ReadProcessUsage() {
  ProcessUsage u;
  u.wall = trainer_internal::RunClock::now();
  struct rusage r {};
  if (getrusage(RUSAGE_SELF, &r) == 0) {
    u.user_s = static_cast<double>(r.ru_utime.tv_sec) + 1e-6 * r.ru_utime.tv_usec;
    u.system_s = static_cast<double>(r.ru_stime.tv_sec) + 1e-6 * r.ru_stime.tv_usec;
    u.minor_faults = r.ru_minflt;
    u.major_faults = r.ru_majflt;
  }
  return u;
}

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

}  // namespace

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

// Defined below, in the order WireRun and RunTraining use them.
absl::Status CheckPaths(const TrainRun& run);
absl::Status InitializeWeights(TrainRun& run);
absl::Status Step(TrainRun& run, StepMetrics& m);
absl::Status CheckF16ParametersFinite(TrainRun& run, int64_t step);
void WriteMetrics(const TrainRun& run, const StepMetrics& m);
absl::Status WireRun(TrainRun& run);
absl::Status RunTraining(TrainRun& run);

absl::Status WireRun(TrainRun& run) {
  if (run.env.communicator != nullptr) {
    run.rank = run.env.communicator->rank();
    run.world = run.env.communicator->world_size();
  }
  RETURN_IF_ERROR(CheckCommunicatorFitsAccelerator(
      run.config.accelerator.kind, run.world > 1 ? run.env.communicator : nullptr,
      run.env.device_communicator_for_test != nullptr));
  // The GPU: the device communicator's (nccl picks each rank's by its node-local rank), else
  // accelerator.device.
  run.device_index = run.config.accelerator.device_index;
  if (run.env.communicator != nullptr && run.env.communicator->cuda_device() >= 0) {
    run.device_index = run.env.communicator->cuda_device();
  }
  RETURN_IF_ERROR(ValidateTrainConfig(run.config, run.world));
  RETURN_IF_ERROR(ResolveModel(run));
  run.seq_len = ResolveSeqLen(run.config, run.gpt);
  run.micro_batch = run.config.train_micro_batch_size_per_gpu;
  run.accumulation_steps = run.config.gradient_accumulation_steps;
  run.threads = ResolveThreads(run.config.threads);
  run.dtype = ComputeDType(run.config.precision());
  if (run.config.accelerator.kind == AcceleratorKind::kCuda) {
    // What the machine says first, before any work: no CUDA in this build, or no usable GPU (the
    // backend's message names the fix).
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
  RETURN_IF_ERROR(CheckPaths(run));
  // Before anything sizeable is allocated (the data too): the plan.
  RETURN_IF_ERROR(PlanMemoryOrRefuse(run));
  RETURN_IF_ERROR(LoadData(run));

  const std::vector<OperatorSpec> ops = ModelOperators(run.model_config, run.plan.vocab);

  // Memory: the accelerator (the emulated one, or the GPU) under its cap, pinned host memory
  // under the host cap; one chunk pool per block size (16-bit param chunks take 16-bit blocks).
  const bool cuda = run.config.accelerator.kind == AcceleratorKind::kCuda;
  BackendOptions backend_options;
  backend_options.kind = cuda ? "cuda" : "cpu";
  backend_options.device_index = run.device_index;
  // The plan already kept the whole margin out of the budget (Build's probe); the backend checks
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

  // The ZeRO collectives: a device-memory communicator stages in the accelerator's scratch from
  // here on (the plan reserved it: run.reserve.comm_staging_bytes).
  if (run.world > 1) {
    Communicator* comm = run.env.communicator;
    if (run.env.device_communicator_for_test) {
      run.test_communicator =
          run.env.device_communicator_for_test(run.env.communicator, run.backend.get());
      if (run.test_communicator == nullptr ||
          run.test_communicator->memory() == CommMemory::kHost ||
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
  }

  ChunkLayoutOptions layout_options;
  layout_options.capacity_elems = run.chunk_elems;
  layout_options.world_size = run.world;
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build(layout_options, ops));
  ChunkStoreOptions store_options;
  store_options.compute_dtype = run.dtype;
  store_options.rank = run.rank;
  ASSIGN_OR_RETURN(run.store, ChunkStore::Create(std::move(layout), store_options));

  // Outputs are opened only once everything above has been checked, by rank 0 only (each rank
  // creates its checkpoint root now, so that a directory that cannot be created fails here, not
  // at the first checkpoint after hours of training).
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
  ASSIGN_OR_RETURN(run.model,
                   TransformerModel::Create(run.model_config, run.store.get(), run.manager.get(),
                                            run.accelerator.get(), model_options));

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

  RETURN_IF_ERROR(InitializeWeights(run));

  if (!run.config.profile.metrics_path.empty() && run.rank == 0) {
    // Appending on resume keeps the earlier steps' lines.
    ASSIGN_OR_RETURN(run.metrics, MetricsWriter::Open(run.config.profile.metrics_path,
                                                      run.config.checkpoint.resume && run.step > 0
                                                          ? MetricsFileMode::kAppend
                                                          : MetricsFileMode::kTruncate));
  }
  run.tokens.assign(static_cast<size_t>(run.micro_batch * run.seq_len), 0);
  run.targets.assign(run.tokens.size(), 0);
  // Peaks from now on.
  run.accelerator->tracker()->SnapshotAndResetIntervalPeaks();
  run.host->tracker()->SnapshotAndResetIntervalPeaks();
  return absl::OkStatus();
}

absl::Status CheckPaths(const TrainRun& run) {
  const RunInput inputs[] = {
      {run.env.config_path, "the config file (--config)"},
      {run.config.data.train_path, "data.train (--train_data)"},
      {run.config.data.val_path, "data.val (--val_data)"},
      {run.config.checkpoint.init_from, "checkpoint.init_from (--init_from)"}};
  const RunOutput outputs[] = {
      {run.config.profile.metrics_path, "profile.metrics (--metrics_out)"},
      {run.config.profile.trace_path, "profile.trace (--trace_out)"},
      {run.config.checkpoint.export_path, "checkpoint.export",
       ExportsHfDirectory(run) ? RunOutputKind::kReplacedDirectory : RunOutputKind::kFile},
      {run.config.checkpoint.dir, "checkpoint.dir (--save_dir)", RunOutputKind::kCheckpointRoot}};
  return CheckRunPaths(inputs, outputs);
}

absl::Status InitializeWeights(TrainRun& run) {
  if (run.config.checkpoint.resume) return Resume(run);
  if (run.hf.has_value()) {
    RETURN_IF_ERROR(run.model->LoadHfCheckpoint(*run.hf));
    if (run.out() != nullptr) {
      *run.out() << "initialized from the Hugging Face " << ModelFamilyName(run.model_config.family)
                 << " model in " << run.config.checkpoint.init_from << "\n";
    }
    return absl::OkStatus();
  }
  if (!run.config.checkpoint.init_from.empty()) {
    ASSIGN_OR_RETURN(Gpt2Checkpoint checkpoint,
                     Gpt2Checkpoint::Open(run.config.checkpoint.init_from));
    RETURN_IF_ERROR(run.model->LoadGpt2Checkpoint(checkpoint));
    if (run.out() != nullptr)
      *run.out() << "initialized from " << run.config.checkpoint.init_from << "\n";
    return absl::OkStatus();
  }
  return run.model->InitializeParameters(run.config.seed);
}

absl::Status Step(TrainRun& run, StepMetrics& m) {
  m.step = run.step + 1;
  m.lr = run.schedule->LearningRate(run.step);
  run.adam->SetLearningRate(m.lr);
  m.loss_scale = run.adam->loss_scaler().scale();
  m.warmup = run.manager->metronome().is_warmup();
  const ChunkManagerCounters c0 = run.manager->counters();
  const int64_t trace_t0 = run.trace != nullptr ? run.trace->NowNs() : 0;
  // One optimizer step: gradient_accumulation_steps micro-batches, each one iteration of the
  // manager; all but the last add their gradients into the optimizer's accumulator. TrainStep
  // uses the loss scale read above (the optimizer's, unchanged until its step). The loss is the
  // mean of the micro-batches' means (each over the same number of tokens: the mean of the
  // whole batch).
  TrainStepResult r;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < run.accumulation_steps; ++micro) {
    RETURN_IF_ERROR(
        run.train_loader->Next(absl::MakeSpan(run.tokens), absl::MakeSpan(run.targets)));
    const bool last = micro + 1 == run.accumulation_steps;
    ASSIGN_OR_RETURN(const TrainStepResult mr,
                     TrainStep(*run.model, *run.manager, *run.adam, run.tokens, run.targets,
                               last ? OptimizerCall::kStep : OptimizerCall::kAccumulate));
    loss_sum += mr.loss;
    r.adam = mr.adam;
    r.forward_backward_ns += mr.forward_backward_ns;
    r.optimizer_ns += mr.optimizer_ns;
    r.forward_backward_stall_ns += mr.forward_backward_stall_ns;
    r.optimizer_stall_ns += mr.optimizer_stall_ns;
  }
  r.loss = loss_sum / static_cast<double>(run.accumulation_steps);
  const ChunkManagerCounters c1 = run.manager->counters();

  ASSIGN_OR_RETURN(m.loss, run.MeanOverRanks(r.loss));
  m.grad_norm = r.adam.grad_norm;
  m.skipped = r.adam.skipped;
  if (run.dtype == DType::kF16 && m.skipped) {
    // A skip is a loss-scale event only while the f16 parameters are finite: a lower scale
    // cures gradients that overflowed, not weights that did.
    RETURN_IF_ERROR(CheckF16ParametersFinite(run, m.step));
  }
  // A non-finite loss is divergence unless it came with a skipped fp16 step (a loss-scale event).
  // (Non-finite gradients already stopped the optimizer: HybridAdam.) Nothing is saved for it.
  if (!std::isfinite(m.loss) && !(run.dtype == DType::kF16 && m.skipped)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the loss of step %d is %f (%s): training diverged or the data or weights are bad, and "
        "training stops; no checkpoint is written for this step. Lower the learning rate "
        "(optimizer.params.lr), enable gradient clipping (gradient_clipping, e.g. 1.0), and "
        "check the training data",
        m.step, m.loss, DTypeName(run.dtype)));
  }
  const double step_s = static_cast<double>(r.forward_backward_ns + r.optimizer_ns) * 1e-9;
  m.step_ms = step_s * 1e3;
  m.tokens_per_s =
      static_cast<double>(run.micro_batch * run.accumulation_steps * run.seq_len * run.world) /
      std::max(1e-9, step_s);
  const auto ms = [](int64_t ns) { return static_cast<double>(std::max<int64_t>(0, ns)) * 1e-6; };
  m.copy_wait_ms = ms(r.forward_backward_stall_ns + r.optimizer_stall_ns);
  m.compute_ms = ms(r.forward_backward_ns - r.forward_backward_stall_ns);
  m.optimizer_ms = ms(r.optimizer_ns - r.optimizer_stall_ns);
  const MemoryTrackerSnapshot a = run.accelerator->tracker()->SnapshotAndResetIntervalPeaks();
  const MemoryTrackerSnapshot h = run.host->tracker()->SnapshotAndResetIntervalPeaks();
  m.accelerator_peak_model_bytes = a.peak_model_bytes;
  m.accelerator_peak_non_model_bytes = a.peak_non_model_bytes;
  m.accelerator_peak_total_bytes = a.peak_total_bytes;
  m.host_peak_model_bytes = h.peak_model_bytes;
  m.host_peak_non_model_bytes = h.peak_non_model_bytes;
  const TransferCounters d = c1.Minus(c0).Total();
  m.loaded_bytes = d.load_bytes;
  m.written_back_bytes = d.write_back_bytes;
  m.evictions = d.write_backs + d.clean_evictions;
  m.pressure_reclaims = c1.pressure_reclaims - c0.pressure_reclaims;

  if (run.trace != nullptr) {
    const int64_t trace_t2 = run.trace->NowNs();
    run.trace->Complete(run.steps_track, absl::StrCat("step ", m.step), "step", trace_t0,
                        trace_t2 - trace_t0,
                        {{"loss", m.loss}, {"lr", m.lr}, {"loaded_bytes", m.loaded_bytes}});
    if (m.warmup) {
      run.trace->MarkRegion("warm-up iteration", trace_t0, trace_t2 - trace_t0, {{"step", m.step}});
    }
  }
  ++run.step;
  run.last_loss = m.loss;
  return absl::OkStatus();
}

absl::Status CheckF16ParametersFinite(TrainRun& run, int64_t step) {
  // The parameters were restored from the master weights (rounded to f16) by the skip: a master
  // weight that is not finite, or beyond f16's range, is an Inf in the parameters every
  // forward reads.
  std::string first;
  int64_t bad = 0;
  for (const std::string& name : run.model->ParameterNames()) {
    if (!run.model->HoldsTrainingState(name)) continue;
    ASSIGN_OR_RETURN(const std::vector<float> master,
                     run.model->ReadTensor(ChunkType::kMaster, name));
    for (size_t i = 0; i < master.size(); ++i) {
      if ((FloatToHalfBits(master[i]) & 0x7c00u) != 0x7c00u) continue;
      if (bad++ == 0) {
        first = absl::StrFormat("%s element %d (master weight %g)", name, i, master[i]);
      }
    }
  }
  ASSIGN_OR_RETURN(const bool any, run.AnyRank(bad > 0));
  if (!any) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "fp16: the parameters are no longer finite at step ", step, " (",
      bad > 0
          ? absl::StrCat(bad, " f16 weight", bad == 1 ? "" : "s", " Inf or NaN; the first: ", first)
          : std::string("on another rank"),
      "): no loss-scale reduction can cure weights, so training diverged and stops; no "
      "checkpoint is written for this step. Lower the learning rate (optimizer.params.lr), enable "
      "gradient clipping (gradient_clipping, e.g. 1.0), or train in bf16 (bf16.enabled), whose "
      "range is f32's"));
}

void WriteMetrics(const TrainRun& run, const StepMetrics& m) {
  if (run.metrics == nullptr) return;
  nlohmann::json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["loss_scale"] = m.loss_scale;
  j["grad_norm"] = m.grad_norm;
  j["skipped"] = m.skipped;
  j["warmup"] = m.warmup;
  j["tokens_per_s"] = m.tokens_per_s;
  j["step_ms"] = m.step_ms;
  j["compute_ms"] = m.compute_ms;
  j["copy_wait_ms"] = m.copy_wait_ms;
  j["optimizer_ms"] = m.optimizer_ms;
  j["accelerator"] = {{"peak_model_bytes", m.accelerator_peak_model_bytes},
                      {"peak_non_model_bytes", m.accelerator_peak_non_model_bytes}};
  j["host"] = {{"peak_model_bytes", m.host_peak_model_bytes},
               {"peak_non_model_bytes", m.host_peak_non_model_bytes}};
  j["loaded_bytes"] = m.loaded_bytes;
  j["written_back_bytes"] = m.written_back_bytes;
  j["evictions"] = m.evictions;
  j["pressure_reclaims"] = m.pressure_reclaims;
  if (m.val_loss.has_value()) j["val_loss"] = *m.val_loss;
  if (absl::Status s = run.metrics->Write(j); !s.ok()) {
    LOG(WARNING) << "metrics: " << s;
  }
}

absl::Status RunTraining(TrainRun& run) {
  PrintHeader(run);
  run.summary.first_step = run.step;
  const RunClock::time_point start = RunClock::now();
  const int64_t eval_every = run.config.data.eval_every;
  // data.eval_every 0: never validate.
  const bool validates = run.val_loader.has_value() && eval_every > 0;
  absl::Status status = [&]() -> absl::Status {
    if (validates) {
      const RunClock::time_point e0 = RunClock::now();
      ASSIGN_OR_RETURN(const double v, EvaluateValidation(run));
      run.summary.eval_s += Seconds(e0, RunClock::now());
      run.summary.first_val_loss = v;
      if (run.out() != nullptr) {
        *run.out() << absl::StrFormat("step %5d validation loss %.4f\n", run.step, v);
      }
    }
    while (run.step < run.config.steps) {
      StepMetrics m;
      const ProcessUsage u0 = ReadProcessUsage();
      RETURN_IF_ERROR(Step(run, m));
      const ProcessUsage u1 = ReadProcessUsage();
      run.summary.steps_wall_s += Seconds(u0.wall, u1.wall);
      run.summary.steps_user_s += u1.user_s - u0.user_s;
      run.summary.steps_system_s += u1.system_s - u0.system_s;
      run.summary.steps_minor_faults += u1.minor_faults - u0.minor_faults;
      run.summary.steps_major_faults += u1.major_faults - u0.major_faults;
      const bool last = run.step == run.config.steps;
      ASSIGN_OR_RETURN(const bool stop,
                       run.AnyRank(run.env.stop_requested && run.env.stop_requested()));
      if (validates && (run.step % eval_every == 0 || last || stop)) {
        const RunClock::time_point e0 = RunClock::now();
        const int64_t trace_e0 = run.trace != nullptr ? run.trace->NowNs() : 0;
        ASSIGN_OR_RETURN(const double v, EvaluateValidation(run));
        run.summary.eval_s += Seconds(e0, RunClock::now());
        if (run.trace != nullptr) {
          run.trace->Complete(run.steps_track, "validation", "eval", trace_e0,
                              run.trace->NowNs() - trace_e0, {{"val_loss", v}});
        }
        m.val_loss = v;
        run.summary.last_val_loss = v;
      }
      run.history.push_back(m);
      WriteMetrics(run, m);
      if (m.step % std::max<int64_t>(run.config.steps_per_print, 1) == 0 || last ||
          m.step == run.summary.first_step + 1 || m.val_loss.has_value()) {
        PrintProgress(run, m);
      }
      const bool checkpoint_due =
          !run.config.checkpoint.dir.empty() &&
          ((run.config.checkpoint.every > 0 && run.step % run.config.checkpoint.every == 0) ||
           last || stop);
      if (checkpoint_due) RETURN_IF_ERROR(SaveCheckpoint(run));
      if (stop && !last) {
        run.summary.stopped_by_request = true;
        if (run.out() != nullptr) {
          *run.out() << "stop requested: stopped after step " << run.step << "\n";
        }
        break;
      }
    }
    if (!run.config.checkpoint.export_path.empty()) {
      RETURN_IF_ERROR(Export(run, run.config.checkpoint.export_path));
      if (run.out() != nullptr) {
        *run.out() << "exported Hugging Face "
                   << (ExportsHfDirectory(run)
                           ? absl::StrCat(ModelFamilyName(run.model_config.family),
                                          " model directory")
                           : std::string("GPT-2 weights"))
                   << " to " << run.config.checkpoint.export_path << "\n";
      }
    }
    return absl::OkStatus();
  }();
  run.summary.seconds = Seconds(start, RunClock::now());
  run.summary.last_step = run.step;
  if (!run.history.empty()) {
    run.summary.first_loss = run.history.front().loss;
    run.summary.last_loss = run.history.back().loss;
    const size_t n = std::min<size_t>(10, run.history.size());
    double sum = 0;
    for (size_t i = run.history.size() - n; i < run.history.size(); ++i) sum += run.history[i].loss;
    run.summary.final_mean_loss = sum / static_cast<double>(n);
  }
  run.summary.tokens = static_cast<int64_t>(run.history.size()) * run.micro_batch *
                       run.accumulation_steps * run.seq_len * run.world;
  for (const StepMetrics& m : run.history) {
    run.summary.compute_s += m.compute_ms * 1e-3;
    run.summary.copy_wait_s += m.copy_wait_ms * 1e-3;
    run.summary.optimizer_s += m.optimizer_ms * 1e-3;
    run.summary.accelerator_peak_model_bytes =
        std::max(run.summary.accelerator_peak_model_bytes, m.accelerator_peak_model_bytes);
    run.summary.accelerator_peak_non_model_bytes =
        std::max(run.summary.accelerator_peak_non_model_bytes, m.accelerator_peak_non_model_bytes);
    run.summary.accelerator_peak_total_bytes =
        std::max(run.summary.accelerator_peak_total_bytes, m.accelerator_peak_total_bytes);
    run.summary.host_peak_model_bytes =
        std::max(run.summary.host_peak_model_bytes, m.host_peak_model_bytes);
    run.summary.host_peak_non_model_bytes =
        std::max(run.summary.host_peak_non_model_bytes, m.host_peak_non_model_bytes);
  }
  const double train_s = run.summary.compute_s + run.summary.copy_wait_s + run.summary.optimizer_s;
  run.summary.tokens_per_s = train_s > 0 ? static_cast<double>(run.summary.tokens) / train_s : 0;
  const ChunkManagerCounters c = run.manager->counters();
  const TransferCounters t = c.Total();
  run.summary.loaded_bytes = t.load_bytes;
  run.summary.written_back_bytes = t.write_back_bytes;
  run.summary.loads = t.loads;
  run.summary.write_backs = t.write_backs;
  run.summary.clean_evictions = t.clean_evictions;
  run.summary.prefetches = c.prefetches;
  run.summary.prefetch_hits = c.prefetch_hits;
  run.summary.write_behinds = c.write_behinds;
  run.summary.pressure_evictions = c.pressure_evictions;
  run.summary.pressure_reclaims = c.pressure_reclaims;
  run.summary.world_size = run.world;
  run.summary.rank_model_data_bytes = run.store->PayloadBytesOn(Device::Host()) +
                                      run.store->PayloadBytesOn(run.accelerator->device());
  run.summary.all_gather_bytes = c.all_gather_bytes;
  run.summary.reduce_scatter_bytes = c.reduce_scatter_bytes;
  run.summary.comm_s = static_cast<double>(c.comm_ns) * 1e-9;
  if (absl::StatusOr<CpuBackendMemoryStats> m = GetCpuBackendMemoryStats(*run.backend); m.ok()) {
    run.summary.accelerator_allocations = m->allocations;
    run.summary.accelerator_cache_hits = m->reuses();
    run.summary.accelerator_peak_mapped_bytes = m->peak_mapped_bytes;
  }
  if (run.out() != nullptr && !run.history.empty()) *run.out() << SummaryText(run);
  status.Update(run.CloseOutputs());
  return status;
}

}  // namespace trainer_internal

class Trainer::Impl {
 public:
  Impl(const TrainConfig& config, TrainerEnvironment env) : run(config, std::move(env)) {}
  ~Impl() {
    if (!run.closed) {
      if (absl::Status s = run.CloseOutputs(); !s.ok()) LOG(WARNING) << s;
    }
  }

  trainer_internal::TrainRun run;
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         TrainerEnvironment env) {
  auto impl = std::make_unique<Impl>(config, std::move(env));
  RETURN_IF_ERROR(trainer_internal::WireRun(impl->run));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::Status Trainer::Run() { return trainer_internal::RunTraining(impl_->run); }
const TrainSummary& Trainer::summary() const { return impl_->run.summary; }
const std::vector<StepMetrics>& Trainer::history() const { return impl_->run.history; }
std::string Trainer::SummaryText() const { return trainer_internal::SummaryText(impl_->run); }

}  // namespace ps
