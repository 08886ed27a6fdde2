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
#include "trainer/data/data_loader.h"
#include "trainer/data/synthetic_corpus.h"
#include "trainer/data/token_file.h"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/io/metrics_writer.h"
#include "trainer/io/run_paths.h"
#include "trainer/io/trace_writer.h"
#include "trainer/profiler.h"
#include "trainer/train_step.h"

#if PS_WITH_CUDA
#include "optimizer/cuda/cuda_adam.h"
#endif

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

// What the process has used so far (every thread): wall clock, CPU time, page faults. Differences
// around each step go into the summary (issue #24: the emulated accelerator once spent more
// system time than user time faulting in freshly mapped pages).
struct ProcessUsage {
  Clock::time_point wall;
  double user_s = 0, system_s = 0;
  int64_t minor_faults = 0, major_faults = 0;
};

ProcessUsage ReadProcessUsage() {
  ProcessUsage u;
  u.wall = Clock::now();
  struct rusage r {};
  if (getrusage(RUSAGE_SELF, &r) == 0) {
    u.user_s = static_cast<double>(r.ru_utime.tv_sec) + 1e-6 * r.ru_utime.tv_usec;
    u.system_s = static_cast<double>(r.ru_stime.tv_sec) + 1e-6 * r.ru_stime.tv_usec;
    u.minor_faults = r.ru_minflt;
    u.major_faults = r.ru_majflt;
  }
  return u;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
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

AcceleratorReserve PlanAcceleratorReserve(AcceleratorKind kind, bool device_communicator, int world,
                                          int64_t chunk_elems, DType dtype, bool exports) {
  AcceleratorReserve r;
  if (kind == AcceleratorKind::kCuda) r.adam_bytes = kCudaAdamDeviceBytes;
  if (device_communicator && world > 1) {
    r.comm_staging_bytes = CommCollectives::DeviceStagingBytes(world, chunk_elems, dtype);
    // A tensor (or row block) lies inside one chunk: no tile needs more than one chunk of f32.
    if (exports) {
      r.export_tile_bytes =
          std::min(kExportTileBytes, chunk_elems * static_cast<int64_t>(sizeof(float)));
    }
  }
  return r;
}

int64_t DefaultAcceleratorBudget(AcceleratorKind kind, int64_t configured_bytes,
                                 int64_t cuda_usable_bytes, int world) {
  if (configured_bytes > 0) return configured_bytes;
  if (kind == AcceleratorKind::kCuda && world == 1 && cuda_usable_bytes > 0) {
    return cuda_usable_bytes;
  }
  return 0;
}

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

class Trainer::Impl {
 public:
  Impl(const TrainConfig& config, TrainerEnvironment env) : config_(config), env_(std::move(env)) {}
  ~Impl();

  absl::Status Build();
  absl::Status Run();
  std::string SummaryText() const;

  TrainSummary summary_;
  std::vector<StepMetrics> history_;

 private:
  // No output may overwrite an input or another output (trainer/io/run_paths.h).
  absl::Status CheckPaths() const;
  // The model from the model section, or from the Hugging Face directory checkpoint.init_from
  // names (a differing model section is refused naming both).
  absl::Status ResolveModel();
  // Whether checkpoint.export writes a Hugging Face directory (the model came from one) rather
  // than a GPT-2 safetensors file.
  bool ExportsHfDirectory() const;
  absl::Status LoadData();
  // The pre-flight memory plan (model/gpt_activation_profile.h): the chunk size, the budget and
  // its slack; refuses a run that does not fit before anything is allocated.
  absl::Status PlanMemoryOrRefuse();
  absl::Status InitializeWeights();
  absl::Status Step(StepMetrics& m);
  // fp16, after a skipped step: OutOfRange when any f16 parameter (every rank's) is Inf/NaN.
  absl::Status CheckF16ParametersFinite(int64_t step);
  absl::StatusOr<double> EvaluateValidation();
  absl::Status SaveCheckpoint();
  void PrintHeader();
  void PrintProgress(const StepMetrics& m);
  void WriteMetrics(const StepMetrics& m);
  CheckpointIdentity Identity() const;
  absl::Status CloseOutputs();
  // The mean of `value` over ranks (itself for a world of one).
  absl::StatusOr<double> MeanOverRanks(double value);
  // Whether any rank's `flag` is set.
  absl::StatusOr<bool> AnyRank(bool flag);
  // Resumes from the newest checkpoint step every rank has.
  absl::Status Resume();
  // Writes checkpoint.export_path, gathering every master weight to rank 0 under ZeRO.
  absl::Status Export(const std::string& path);
  // Broadcasts `values` from `owner` to every rank (in place), through a device tile when the
  // communicator takes device memory only.
  absl::Status BroadcastFromOwner(std::vector<float>& values, int owner);
  // Whether the communicator of a world > 1 takes device memory only (nccl, or the test hook).
  bool DeviceCommunicator() const;

  // Progress output: rank 0 only.
  std::ostream* out() const { return rank_ == 0 ? env_.out : nullptr; }

  const TrainConfig config_;
  const TrainerEnvironment env_;
  // The data-parallel world; collectives_ (below) only for world_ > 1.
  int rank_ = 0;
  int world_ = 1;
  // What the plan reserves on the accelerator beside chunks and activations.
  AcceleratorReserve reserve_;
  // The workspace sizes the run's kernels will ask for (the plan replays them): the CPU kernels'
  // for threads_, or CudaKernels' for the GPU (cuBLAS's workspace by its compute capability).
  std::shared_ptr<const KernelWorkspaces> kernel_workspaces_;
  // The model: model_config_ (any architecture); gpt_ its GPT-2 view (ModelConfig's common
  // dimensions) for the data and checkpoint checks. hf_ is the Hugging Face directory of
  // checkpoint.init_from, when it names one.
  GptConfig gpt_;
  ModelConfig model_config_;
  std::optional<HfCheckpoint> hf_;
  int64_t seq_len_ = 0;
  int64_t micro_batch_ = 0;
  int64_t accumulation_steps_ = 1;  // micro-batches per optimizer step
  int threads_ = 1;
  DType dtype_ = DType::kF32;
  int64_t chunk_elems_ = 0;
  std::string chunk_size_note_;
  GptRunPlan plan_;

  // Data.
  std::optional<TokenFile> train_file_, val_file_;
  std::vector<uint16_t> synthetic_train_, synthetic_val_;
  std::optional<double> unigram_entropy_, entropy_rate_;
  std::optional<DataLoader> train_loader_, val_loader_;
  std::vector<int32_t> tokens_, targets_;

  // Memory, chunks, runtime, model, optimizer (destroyed in reverse: the model and manager
  // before the store, the store before the memories, the memories before the backend).
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceMemory> accelerator_;
  std::unique_ptr<DeviceMemory> host_;
  // The test hook's stand-in for env_.communicator, when set; collectives_ go through it
  // (collectives_->communicator()). Declared after the memories: the collectives' device staging
  // goes back to the accelerator's scratch before it is destroyed.
  std::unique_ptr<Communicator> test_communicator_;
  std::unique_ptr<CommCollectives> collectives_;
  // The accelerator-side Adam on a GPU (CudaAdam); null on the emulated accelerator.
  std::unique_ptr<AdamKernels> accelerator_adam_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<TraceWriter> trace_;
  std::unique_ptr<TraceProfiler> profiler_;
  // The stream the model's kernels run on; the manager orders its chunk moves after it.
  std::unique_ptr<Stream> compute_stream_;
  std::unique_ptr<ChunkManager> manager_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<CpuAdam> cpu_adam_;
  std::unique_ptr<HybridAdam> adam_;
  std::optional<LrSchedule> schedule_;
  std::unique_ptr<MetricsWriter> metrics_;
  TrackId steps_track_ = 0;

  int64_t step_ = 0;      // steps taken
  int device_index_ = 0;  // the accelerator's device (Build)
  // cuda: the device's free memory minus the margin (Build, before the plan).
  int64_t cuda_usable_bytes_ = 0;
  double last_loss_ = 0;
  bool closed_ = false;
};

Trainer::Impl::~Impl() {
  if (!closed_) {
    if (absl::Status s = CloseOutputs(); !s.ok()) LOG(WARNING) << s;
  }
}

absl::Status Trainer::Impl::Build() {
  if (env_.communicator != nullptr) {
    rank_ = env_.communicator->rank();
    world_ = env_.communicator->world_size();
  }
  RETURN_IF_ERROR(CheckCommunicatorFitsAccelerator(config_.accelerator.kind,
                                                   world_ > 1 ? env_.communicator : nullptr,
                                                   env_.device_communicator_for_test != nullptr));
  // The GPU: the device communicator's (nccl picks each rank's by its node-local rank), else
  // accelerator.device.
  device_index_ = config_.accelerator.device_index;
  if (env_.communicator != nullptr && env_.communicator->cuda_device() >= 0) {
    device_index_ = env_.communicator->cuda_device();
  }
  RETURN_IF_ERROR(ValidateTrainConfig(config_, world_));
  RETURN_IF_ERROR(ResolveModel());
  seq_len_ = ResolveSeqLen(config_, gpt_);
  micro_batch_ = config_.train_micro_batch_size_per_gpu;
  accumulation_steps_ = config_.gradient_accumulation_steps;
  threads_ = ResolveThreads(config_.threads);
  dtype_ = ComputeDType(config_.precision());
  if (config_.accelerator.kind == AcceleratorKind::kCuda) {
    // What the machine says first, before any work: no CUDA in this build, or no usable GPU (the
    // backend's message names the fix).
    BackendOptions probe;
    probe.kind = "cuda";
    probe.device_index = device_index_;
    probe.cuda_margin_bytes = CudaMarginBytes(world_ > 1 && DeviceCommunicator());
    // The configured cap, checked against the free memory minus the margin (the backend refuses
    // a larger one, naming accelerator.memory and the most that fits: memory/cuda_capacity.h).
    probe.capacity_bytes = config_.accelerator.memory_bytes;
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(probe);
    if (!cuda.ok()) {
      return absl::Status(cuda.status().code(),
                          absl::StrCat("accelerator.backend \"cuda\": ", cuda.status().message()));
    }
    // With no cap configured, the probe's capacity is what this run can use: free memory minus
    // the margin (DefaultAcceleratorBudget plans with it).
    cuda_usable_bytes_ = (*cuda)->capacity_bytes();
    // The GPU's kernel workspaces, for the plan: the model's CudaKernels (CreateKernels with the
    // same defaults) will ask for exactly these.
    absl::StatusOr<std::unique_ptr<KernelWorkspaces>> workspaces =
        CreateKernelWorkspaces(cuda->get(), threads_);
    if (!workspaces.ok()) {
      return absl::Status(workspaces.status().code(), absl::StrCat("accelerator.backend \"cuda\": ",
                                                                   workspaces.status().message()));
    }
    kernel_workspaces_ = *std::move(workspaces);
  } else {
    kernel_workspaces_ = std::make_shared<const CpuKernelWorkspaces>(threads_);
  }
  RETURN_IF_ERROR(CheckPaths());
  // Before anything sizeable is allocated (the data too): the plan.
  RETURN_IF_ERROR(PlanMemoryOrRefuse());
  RETURN_IF_ERROR(LoadData());

  const std::vector<OperatorSpec> ops = ModelOperators(model_config_, plan_.vocab);

  // Memory: the accelerator (the emulated one, or the GPU) under its cap, pinned host memory
  // under the host cap; one chunk pool per block size (16-bit param chunks take 16-bit blocks).
  const bool cuda = config_.accelerator.kind == AcceleratorKind::kCuda;
  BackendOptions backend_options;
  backend_options.kind = cuda ? "cuda" : "cpu";
  backend_options.device_index = device_index_;
  // The plan already kept the whole margin out of the budget (Build's probe); the backend checks
  // the cap again against the free memory now, which the probe's cuBLAS handle and lazily loaded
  // modules may have lowered since: half the margin is left for that re-check.
  backend_options.cuda_margin_bytes = CudaMarginBytes(world_ > 1 && DeviceCommunicator()) / 2;
  backend_options.capacity_bytes = plan_.accelerator_bytes;
  // (ValidateTrainConfig refuses accelerator.copy_bandwidth with "cuda".)
  if (!cuda) {
    backend_options.copy_bandwidth_bytes_per_s = config_.accelerator.copy_bandwidth_bytes_per_s;
  }
  {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_options);
    if (!backend.ok()) {
      return absl::Status(backend.status().code(),
                          absl::StrCat("accelerator.backend \"", backend_options.kind, "\" with ",
                                       FormatBytes(plan_.accelerator_bytes),
                                       " (accelerator.memory, or the plan's minimum when unset): ",
                                       backend.status().message()));
    }
    backend_ = *std::move(backend);
  }
  if (env_.stop_requested_async && backend_options.copy_bandwidth_bytes_per_s > 0) {
    RETURN_IF_ERROR(SetCpuLinkInterrupt(*backend_, env_.stop_requested_async));
  }
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = chunk_elems_ * static_cast<int64_t>(sizeof(float));
  if (SizeOf(dtype_) != static_cast<int64_t>(sizeof(float))) {
    memory_options.more_chunk_block_bytes = {chunk_elems_ * SizeOf(dtype_)};
  }
  DeviceMemoryOptions host_options = memory_options;
  // Activations come from the caching allocator in segments sized to the budget; the plan
  // measured what they strand and the manager's slack below covers it.
  memory_options.scratch = plan_.scratch;
  // CudaAdam's device bytes come from the backend beside the pools (see trainer.h).
  if (reserve_.adam_bytes > 0) {
    memory_options.capacity_bytes = plan_.accelerator_bytes - reserve_.adam_bytes;
  }
  ASSIGN_OR_RETURN(accelerator_, CreateAcceleratorMemory(backend_.get(), memory_options));
  if (config_.accelerator.host_memory_bytes > 0) {
    host_options.capacity_bytes = config_.accelerator.host_memory_bytes;
  }
  ASSIGN_OR_RETURN(host_, CreateHostMemory(backend_.get(), host_options));

  // The ZeRO collectives: a device-memory communicator stages in the accelerator's scratch from
  // here on (the plan reserved it: reserve_.comm_staging_bytes).
  if (world_ > 1) {
    Communicator* comm = env_.communicator;
    if (env_.device_communicator_for_test) {
      test_communicator_ = env_.device_communicator_for_test(env_.communicator, backend_.get());
      if (test_communicator_ == nullptr || test_communicator_->memory() == CommMemory::kHost ||
          test_communicator_->rank() != rank_ || test_communicator_->world_size() != world_) {
        return absl::InvalidArgumentError(
            "TrainerEnvironment::device_communicator_for_test must return a device-memory "
            "communicator of the same rank and world");
      }
      comm = test_communicator_.get();
    }
    CommCollectivesOptions collectives_options;
    collectives_options.timeout = env_.comm_timeout;
    collectives_options.backend = backend_.get();
    collectives_options.accelerator = accelerator_.get();
    collectives_options.chunk_elems = chunk_elems_;
    collectives_options.dtype = dtype_;
    ASSIGN_OR_RETURN(collectives_, CommCollectives::Create(comm, collectives_options));
  }

  ChunkLayoutOptions layout_options;
  layout_options.capacity_elems = chunk_elems_;
  layout_options.world_size = world_;
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build(layout_options, ops));
  ChunkStoreOptions store_options;
  store_options.compute_dtype = dtype_;
  store_options.rank = rank_;
  ASSIGN_OR_RETURN(store_, ChunkStore::Create(std::move(layout), store_options));

  // Outputs are opened only once everything above has been checked, by rank 0 only (each rank
  // creates its checkpoint root now, so that a directory that cannot be created fails here, not
  // at the first checkpoint after hours of training).
  if (!config_.checkpoint.dir.empty()) {
    const std::string root = RankCheckpointRoot(config_.checkpoint.dir, rank_);
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint.dir (--save_dir): cannot create '", root, "': ", ec.message()));
    }
  }
  if (!config_.profile.trace_path.empty() && rank_ == 0) {
    TraceWriterOptions trace_options;
    trace_options.process_name = absl::StrCat("patrickstar_cc train (", gpt_.name, ")");
    ASSIGN_OR_RETURN(trace_, TraceWriter::Create(config_.profile.trace_path, trace_options));
    profiler_ = std::make_unique<TraceProfiler>(trace_.get());
    steps_track_ = trace_->Track("steps");
  }
  ChunkManagerOptions manager_options;
  if (profiler_ != nullptr) manager_options.listener = profiler_.get();
  // Room for what the activation segments strand (the plan replayed them), and a warm-up share
  // that leaves the highest activation peak room: the warm-up needs no pressure eviction.
  manager_options.nonmodel_slack_bytes = plan_.plan.slack_bytes;
  manager_options.warmup_chunk_fraction = plan_.plan.warmup_chunk_fraction;
  manager_options.collectives = collectives_.get();
  // The export's broadcast tile (device-memory communicator) is allocated after the last step.
  manager_options.comm_buffer_bytes = reserve_.export_tile_bytes;
  ASSIGN_OR_RETURN(compute_stream_, backend_->CreateStream());
  manager_options.compute_stream = compute_stream_.get();
  ASSIGN_OR_RETURN(manager_, ChunkManager::Create(store_.get(), backend_.get(), accelerator_.get(),
                                                  host_.get(), manager_options));
  GptModelOptions model_options;
  model_options.batch = micro_batch_;
  model_options.seq_len = seq_len_;
  model_options.activation_checkpointing = config_.model.activation_checkpointing;
  model_options.seed = config_.seed;
  model_options.threads = threads_;
  // The model creates the backend's kernels over its own pool of `threads` threads.
  model_options.compute_stream = compute_stream_.get();
  ASSIGN_OR_RETURN(model_, TransformerModel::Create(model_config_, store_.get(), manager_.get(),
                                                    accelerator_.get(), model_options));

  CpuAdamOptions cpu_adam_options;
  cpu_adam_options.num_threads = threads_;
  ASSIGN_OR_RETURN(cpu_adam_, CpuAdam::Create(cpu_adam_options));
  ASSIGN_OR_RETURN(HybridAdamOptions adam_options, MakeHybridAdamOptions(config_));
  if (collectives_ != nullptr) {
    CommCollectives* collectives = collectives_.get();
    adam_options.grad_stats_reducer = [collectives](GradStats& stats) {
      return collectives->ReduceGradStats(stats.sum_squares, stats.nonfinite_elems);
    };
  }
  HybridAdamKernels kernels;
  kernels.host = cpu_adam_.get();
  if (cuda) {
    ASSIGN_OR_RETURN(accelerator_adam_, CreateCudaAdam(*backend_));
    kernels.accelerator = accelerator_adam_.get();
    // Pinned, so CudaAdam accumulates GPU chunks' gradients into it in place (mapped memory)
    // instead of through synchronous pageable round trips.
    kernels.pinned_accumulator_backend = backend_.get();
  } else {
    kernels.accelerator = cpu_adam_.get();  // the emulated accelerator's memory is host memory
  }
  ASSIGN_OR_RETURN(
      adam_, HybridAdam::Create(store_->layout(), rank_, dtype_, std::move(adam_options), kernels));
  ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(MakeLrScheduleOptions(config_)));
  schedule_.emplace(schedule);

  RETURN_IF_ERROR(InitializeWeights());

  if (!config_.profile.metrics_path.empty() && rank_ == 0) {
    // Appending on resume keeps the earlier steps' lines.
    ASSIGN_OR_RETURN(metrics_, MetricsWriter::Open(config_.profile.metrics_path,
                                                   config_.checkpoint.resume && step_ > 0
                                                       ? MetricsFileMode::kAppend
                                                       : MetricsFileMode::kTruncate));
  }
  tokens_.assign(static_cast<size_t>(micro_batch_ * seq_len_), 0);
  targets_.assign(tokens_.size(), 0);
  // Peaks from now on.
  accelerator_->tracker()->SnapshotAndResetIntervalPeaks();
  host_->tracker()->SnapshotAndResetIntervalPeaks();
  return absl::OkStatus();
}

absl::Status Trainer::Impl::ResolveModel() {
  const std::string& init_from = config_.checkpoint.init_from;
  std::error_code ec;
  if (init_from.empty() || !std::filesystem::is_directory(init_from, ec)) {
    // The model section (a GPT-2 or Llama-family preset, or GPT-2 dimensions); init_from, if
    // any, is a GPT-2 safetensors file.
    ASSIGN_OR_RETURN(model_config_, ResolveTrainModel(config_.model));
    gpt_ = GptConfigView(model_config_);
    return absl::OkStatus();
  }
  // A Hugging Face model directory: the model is its config.json's.
  absl::StatusOr<HfCheckpoint> hf = HfCheckpoint::Open(init_from);
  if (!hf.ok()) {
    return absl::Status(hf.status().code(), absl::StrCat("checkpoint.init_from (--init_from): ",
                                                         hf.status().message()));
  }
  hf_.emplace(*std::move(hf));
  model_config_ = hf_->config();
  gpt_ = GptConfigView(model_config_);
  if (config_.data.seq_len > gpt_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("`data.seq_len` (--seq_len) = ", config_.data.seq_len, " exceeds ", init_from,
                     "/config.json's max_position_embeddings (", gpt_.max_seq_len,
                     "); use at most ", gpt_.max_seq_len));
  }
  // A model section other than the default one must agree with config.json.
  TrainModelConfig defaults = DefaultTrainConfig().model, given = config_.model;
  defaults.activation_checkpointing = given.activation_checkpointing = false;
  if (given == defaults || given == TrainModelConfig{}) return absl::OkStatus();
  ASSIGN_OR_RETURN(const GptConfig section, ResolveModelConfig(config_.model));
  const std::string json = absl::StrCat(init_from, "/config.json");
  const std::pair<const char*, std::pair<int64_t, int64_t>> keys[] = {
      {"vocab_size", {section.vocab_size, gpt_.vocab_size}},
      {"n_positions", {section.max_seq_len, gpt_.max_seq_len}},
      {"n_embd", {section.hidden, gpt_.hidden}},
      {"n_layer", {section.num_layers, gpt_.num_layers}},
      {"n_head", {section.num_heads, gpt_.num_heads}}};
  const char* hf_keys[] = {"vocab_size", "max_position_embeddings", "hidden_size",
                           "num_hidden_layers", "num_attention_heads"};
  for (size_t i = 0; i < std::size(keys); ++i) {
    if (keys[i].second.first != keys[i].second.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the config's model section (model.", keys[i].first, " = ", keys[i].second.first,
          config_.model.preset.empty()
              ? ""
              : absl::StrCat(", model.preset \"", config_.model.preset, "\""),
          ") contradicts ", json, " (", hf_keys[i], " = ", keys[i].second.second,
          ") of checkpoint.init_from (--init_from); the model comes from the Hugging Face "
          "directory: remove the model section (or --model)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::Impl::CheckPaths() const {
  const RunInput inputs[] = {{env_.config_path, "the config file (--config)"},
                             {config_.data.train_path, "data.train (--train_data)"},
                             {config_.data.val_path, "data.val (--val_data)"},
                             {config_.checkpoint.init_from, "checkpoint.init_from (--init_from)"}};
  const RunOutput outputs[] = {
      {config_.profile.metrics_path, "profile.metrics (--metrics_out)"},
      {config_.profile.trace_path, "profile.trace (--trace_out)"},
      {config_.checkpoint.export_path, "checkpoint.export",
       ExportsHfDirectory() ? RunOutputKind::kReplacedDirectory : RunOutputKind::kFile},
      {config_.checkpoint.dir, "checkpoint.dir (--save_dir)", RunOutputKind::kCheckpointRoot}};
  return CheckRunPaths(inputs, outputs);
}

absl::Status Trainer::Impl::LoadData() {
  DataLoaderOptions options;
  options.batch_size = micro_batch_;
  options.seq_len = seq_len_;
  options.vocab_size = gpt_.vocab_size;
  options.shuffle = config_.data.shuffle;
  options.seed = config_.data.seed;
  options.rank = rank_;
  options.world_size = world_;
  TokenSpan train, val;
  if (config_.data.train_path.empty()) {
    if (gpt_.vocab_size < SyntheticCorpus::kVocabSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("the built-in synthetic corpus is byte-level (", SyntheticCorpus::kVocabSize,
                       " tokens) but model.vocab_size is ", gpt_.vocab_size,
                       "; use vocab_size >= 256 or give data.train (--train_data)"));
    }
    SyntheticCorpusOptions corpus_options;
    corpus_options.seed = config_.data.seed;
    ASSIGN_OR_RETURN(SyntheticCorpus corpus, GenerateSyntheticCorpus(corpus_options));
    synthetic_train_ = std::move(corpus.train);
    synthetic_val_ = std::move(corpus.val);
    unigram_entropy_ = corpus.train_unigram_entropy_nats;
    entropy_rate_ = corpus.entropy_rate_nats;
    train = synthetic_train_;
    if (config_.data.val_path.empty()) val = synthetic_val_;
  } else {
    ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(config_.data.train_path));
    RETURN_IF_ERROR(file.CheckVocabSize(gpt_.vocab_size));
    train_file_.emplace(std::move(file));
    train = train_file_->tokens();
  }
  if (!config_.data.val_path.empty()) {
    ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(config_.data.val_path));
    RETURN_IF_ERROR(file.CheckVocabSize(gpt_.vocab_size));
    val_file_.emplace(std::move(file));
    val = val_file_->tokens();
  }
  {
    absl::StatusOr<DataLoader> loader = DataLoader::Create(train, options);
    if (!loader.ok()) {
      return absl::Status(loader.status().code(),
                          absl::StrCat("training data: ", loader.status().message()));
    }
    train_loader_.emplace(std::move(*loader));
  }
  if (!val.empty()) {
    DataLoaderOptions val_options = options;
    val_options.shuffle = false;
    absl::StatusOr<DataLoader> loader = DataLoader::Create(val, val_options);
    if (!loader.ok()) {
      return absl::Status(loader.status().code(),
                          absl::StrCat("validation data: ", loader.status().message()));
    }
    val_loader_.emplace(std::move(*loader));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Impl::PlanMemoryOrRefuse() {
  GptRunPlanOptions o;
  o.config = gpt_;
  o.model_config = model_config_;
  o.model.batch = micro_batch_;
  o.model.seq_len = seq_len_;
  o.model.activation_checkpointing = config_.model.activation_checkpointing;
  o.model.threads = threads_;
  o.kernel_workspaces = kernel_workspaces_;
  o.compute_dtype = dtype_;
  o.world_size = world_;
  o.rank = rank_;
  o.gradient_accumulation_steps = static_cast<int>(config_.gradient_accumulation_steps);
  o.chunk_elems = config_.chunk.size_elems;
  o.accelerator_bytes = DefaultAcceleratorBudget(
      config_.accelerator.kind, config_.accelerator.memory_bytes, cuda_usable_bytes_, world_);
  if (config_.accelerator.host_memory_bytes > 0) {
    o.host_cap_bytes = config_.accelerator.host_memory_bytes;
  }
  // What the OS can still give (MemAvailable, or the memory cgroup's limit if lower); unreadable
  // /proc: unchecked.
  if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
    o.host_available_bytes = info->available_bytes();
  } else {
    LOG(WARNING) << "host memory not checked: " << info.status();
  }
  // Beside the pools: the data loader's corpus, thread stacks and BLAS buffers.
  o.host_overhead_bytes = 256 * kMiB;
  // Export gathers every tensor as f32 at the end.
  if (!config_.checkpoint.export_path.empty()) {
    o.host_workspace_bytes =
        ModelParameterCount(model_config_) * static_cast<int64_t>(sizeof(float));
  }
  // Checkpoints and the export read accelerator payloads through the model's pinned staging
  // buffer (model/gpt_model.h, GptModelOptions::payload_staging_bytes).
  if (!config_.checkpoint.export_path.empty() || !config_.checkpoint.dir.empty()) {
    o.host_workspace_bytes += kPayloadStagingBytes;
  }
  // The emulated accelerator's memory is host memory; a GPU's is not.
  const AcceleratorKind kind = config_.accelerator.kind;
  o.accelerator_in_host_memory = kind == AcceleratorKind::kCpu;
  // What the run holds on the accelerator beside chunks and activations (trainer.h), reserved.
  const bool exports = !config_.checkpoint.export_path.empty();
  reserve_ =
      PlanAcceleratorReserve(kind, DeviceCommunicator(), world_, o.chunk_elems, dtype_, exports);
  o.comm_buffer_bytes = reserve_.total_bytes();
  absl::StatusOr<GptRunPlan> plan = PlanGptRun(o);
  if (plan.ok() && DeviceCommunicator() && o.chunk_elems == 0) {
    // chunk.size "auto": the collectives' staging is sized by the chunk the search picked; plan
    // that chunk size again with its staging reserved.
    const std::string note = plan->chunk_note;
    o.chunk_elems = plan->plan.chunk_elems;
    reserve_ = PlanAcceleratorReserve(kind, true, world_, o.chunk_elems, dtype_, exports);
    o.comm_buffer_bytes = reserve_.total_bytes();
    plan = PlanGptRun(o);
    if (plan.ok()) plan->chunk_note = note;
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("memory plan: ", plan.status().message()));
  }
  // (Host memory is always enforced: a run the OS would kill is never started.)
  if (env_.enforce_memory_plan || !plan->plan.fits_host) {
    RETURN_IF_ERROR(CheckGptRunFits(o, *plan));
  }
  plan_ = *std::move(plan);
  chunk_elems_ = plan_.plan.chunk_elems;
  chunk_size_note_ = plan_.chunk_note;
  return absl::OkStatus();
}

CheckpointIdentity Trainer::Impl::Identity() const {
  CheckpointIdentity id;
  id.vocab_size = gpt_.vocab_size;
  id.max_seq_len = gpt_.max_seq_len;
  id.hidden = gpt_.hidden;
  id.num_layers = gpt_.num_layers;
  id.num_heads = gpt_.num_heads;
  id.compute_dtype = dtype_;
  id.world_size = world_;
  id.micro_batch = micro_batch_;
  id.seq_len = seq_len_;
  id.shuffle = config_.data.shuffle;
  id.data_seed = config_.data.seed;
  return id;
}

absl::Status Trainer::Impl::InitializeWeights() {
  if (config_.checkpoint.resume) return Resume();
  if (hf_.has_value()) {
    RETURN_IF_ERROR(model_->LoadHfCheckpoint(*hf_));
    if (out() != nullptr) {
      *out() << "initialized from the Hugging Face " << ModelFamilyName(model_config_.family)
             << " model in " << config_.checkpoint.init_from << "\n";
    }
    return absl::OkStatus();
  }
  if (!config_.checkpoint.init_from.empty()) {
    ASSIGN_OR_RETURN(Gpt2Checkpoint checkpoint, Gpt2Checkpoint::Open(config_.checkpoint.init_from));
    RETURN_IF_ERROR(model_->LoadGpt2Checkpoint(checkpoint));
    if (out() != nullptr) *out() << "initialized from " << config_.checkpoint.init_from << "\n";
    return absl::OkStatus();
  }
  return model_->InitializeParameters(config_.seed);
}

bool Trainer::Impl::DeviceCommunicator() const {
  if (world_ <= 1) return false;
  return env_.device_communicator_for_test != nullptr ||
         env_.communicator->memory() != CommMemory::kHost;
}

absl::Status Trainer::Impl::BroadcastFromOwner(std::vector<float>& values, int owner) {
  const int64_t elems = static_cast<int64_t>(values.size());
  if (!collectives_->on_device()) {
    ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                     collectives_->communicator()->BroadcastAsync(values.data(), values.data(),
                                                                  elems, CommDType::kF32, owner));
    return request->Wait(env_.comm_timeout);
  }
  // Device memory only: tile by tile through a scratch buffer the manager kept free
  // (reserve_.export_tile_bytes), the owner copying each tile in and every rank copying it out.
  const int64_t tile_elems =
      std::max<int64_t>(1, reserve_.export_tile_bytes / static_cast<int64_t>(sizeof(float)));
  const int64_t tile_bytes = std::min(elems, tile_elems) * static_cast<int64_t>(sizeof(float));
  if (tile_bytes == 0) return absl::OkStatus();
  // The copies go on the compute stream (after any compute still queued), not a stream created
  // per tensor.
  Stream* stream = compute_stream_.get();
  ASSIGN_OR_RETURN(void* tile, accelerator_->scratch()->Allocate(tile_bytes));
  absl::Status s = absl::OkStatus();
  for (int64_t first = 0; first < elems && s.ok(); first += tile_elems) {
    const int64_t n = std::min(tile_elems, elems - first);
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    if (owner == rank_) {
      s = stream->MemcpyAsync(tile, values.data() + first, bytes, CopyKind::kHostToDevice);
      if (s.ok()) s = stream->Synchronize();
      if (!s.ok()) break;
    }
    absl::StatusOr<std::unique_ptr<CommRequest>> request =
        collectives_->communicator()->BroadcastAsync(tile, tile, n, CommDType::kF32, owner);
    s = request.ok() ? (*request)->Wait(env_.comm_timeout) : request.status();
    if (!s.ok()) break;
    s = stream->MemcpyAsync(values.data() + first, tile, bytes, CopyKind::kDeviceToHost);
    if (s.ok()) s = stream->Synchronize();
  }
  s.Update(accelerator_->scratch()->Deallocate(tile, tile_bytes));
  return s;
}

absl::StatusOr<double> Trainer::Impl::MeanOverRanks(double value) {
  if (collectives_ == nullptr) return value;
  return collectives_->AllReduceMean(value);
}

absl::StatusOr<bool> Trainer::Impl::AnyRank(bool flag) {
  if (collectives_ == nullptr) return flag;
  ASSIGN_OR_RETURN(std::vector<int64_t> flags, collectives_->AllGatherInt64(flag ? 1 : 0));
  return std::any_of(flags.begin(), flags.end(), [](int64_t f) { return f != 0; });
}

absl::Status Trainer::Impl::Resume() {
  const std::string root = RankCheckpointRoot(config_.checkpoint.dir, rank_);
  absl::StatusOr<std::string> latest = LatestTrainingCheckpoint(root);
  std::string dir;
  if (collectives_ == nullptr) {
    ASSIGN_OR_RETURN(dir, std::move(latest));
  } else {
    // Agree on the newest step every rank has (-1: none, -2: unreadable), so that either every
    // rank resumes from the same step or every rank fails.
    int64_t step = -1;
    if (latest.ok()) {
      ASSIGN_OR_RETURN(std::vector<CheckpointRef> refs, ListCheckpoints(root));
      step = refs.empty() ? -1 : refs.back().step;
    } else if (!absl::IsNotFound(latest.status())) {
      step = -2;
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, collectives_->AllGatherInt64(step));
    for (int r = 0; r < world_; ++r) {
      if (steps[r] < 0) {
        if (r == rank_ && !latest.ok()) return latest.status();
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot resume: rank ", r, " of ", world_, " has no readable checkpoint under '",
            RankCheckpointRoot(config_.checkpoint.dir, r),
            "' (checkpoints of a ZeRO run are per rank; resume with the world size that wrote "
            "them)"));
      }
    }
    const int64_t common = *std::min_element(steps.begin(), steps.end());
    ASSIGN_OR_RETURN(dir, TrainingCheckpointAtStep(root, common));
  }
  ASSIGN_OR_RETURN(TrainingCheckpointState state,
                   ReadTrainingCheckpoint(dir, Identity(), model_.get()));
  adam_->set_step(state.adam_step);
  adam_->set_consecutive_skipped_steps(state.consecutive_skipped_steps);
  // The state's values were read from the checkpoint's manifest: an error names it.
  const auto in_manifest = [&dir](absl::Status s) {
    if (s.ok()) return s;
    return absl::Status(s.code(),
                        absl::StrCat("checkpoint ", dir, "/manifest.json: ", s.message()));
  };
  RETURN_IF_ERROR(in_manifest(adam_->loss_scaler().Restore(state.loss_scaler)));
  RETURN_IF_ERROR(in_manifest(train_loader_->Seek(state.data_cursor)));
  step_ = state.step;
  last_loss_ = state.last_loss;
  if (out() != nullptr) {
    *out() << "resumed from " << dir << " at step " << step_ << " (data "
           << DataCursorString(state.data_cursor) << ")"
           << (world_ > 1 ? absl::StrCat(", with every rank's checkpoint of that step") : "")
           << "\n";
  }
  return absl::OkStatus();
}

bool Trainer::Impl::ExportsHfDirectory() const {
  // A Llama-family model (from a preset or a directory) has no single-file GPT-2 format.
  if (model_config_.architecture() != ModelArchitecture::kGpt2) return true;
  std::error_code ec;
  const bool hf_dir = !config_.checkpoint.init_from.empty() &&
                      std::filesystem::is_directory(config_.checkpoint.init_from, ec);
  return hf_dir;
}

absl::Status Trainer::Impl::Export(const std::string& path) {
  HfExportOptions hf_options;
  if (hf_.has_value()) hf_options.base_config_json = hf_->config_json();
  if (collectives_ == nullptr) {
    if (ExportsHfDirectory()) return model_->SaveHfCheckpoint(path, DType::kF32, hf_options);
    return model_->SaveGpt2Safetensors(path, DType::kF32);
  }
  // Gather: each tensor is broadcast from its owner, in checkpoint order; rank 0 keeps them.
  const ChunkLayout& layout = store_->layout();
  std::map<std::string, std::vector<float>> gathered;
  for (const std::string& name : model_->ParameterNames()) {
    ASSIGN_OR_RETURN(TensorId t, layout.FindTensor(name));
    const int owner = layout.owner_of(layout.tensor(t).chunk_index);
    std::vector<float> values(static_cast<size_t>(layout.tensor(t).numel), 0.0f);
    if (owner == rank_) {
      ASSIGN_OR_RETURN(values, model_->ReadTensor(ChunkType::kMaster, name));
    }
    RETURN_IF_ERROR(BroadcastFromOwner(values, owner));
    if (rank_ == 0) gathered.emplace(name, std::move(values));
  }
  absl::Status written = absl::OkStatus();
  if (rank_ == 0 && ExportsHfDirectory()) {
    // Element ranges of the gathered tensors (whole, or assembled from row blocks).
    const int64_t hidden = model_config_.hidden_size;
    written = WriteHfCheckpoint(
        path, model_config_, DType::kF32,
        ConvertingFill(
            [&](const TensorSpec& tensor, int64_t first, absl::Span<float> dst) -> absl::Status {
              const int64_t n = static_cast<int64_t>(dst.size());
              if (auto it = gathered.find(tensor.name); it != gathered.end()) {
                if (first + n > static_cast<int64_t>(it->second.size())) {
                  return absl::InternalError(absl::StrCat("export: '", tensor.name, "' range"));
                }
                std::copy(it->second.begin() + first, it->second.begin() + first + n, dst.begin());
                return absl::OkStatus();
              }
              int64_t filled = 0;
              for (const auto& [stored, values] : gathered) {
                const std::optional<RowBlockName> block = ParseRowBlockName(stored);
                if (!block.has_value() || block->base != tensor.name) continue;
                const int64_t lo = std::max(first, block->row_begin * hidden);
                const int64_t hi = std::min(
                    first + n, block->row_begin * hidden + static_cast<int64_t>(values.size()));
                if (lo >= hi) continue;
                std::copy(values.begin() + (lo - block->row_begin * hidden),
                          values.begin() + (hi - block->row_begin * hidden),
                          dst.begin() + (lo - first));
                filled += hi - lo;
              }
              if (filled != n) {
                return absl::InternalError(
                    absl::StrCat("export: tensor '", tensor.name, "' not gathered"));
              }
              return absl::OkStatus();
            },
            DType::kF32),
        hf_options);
  } else if (rank_ == 0) {
    written = WriteGpt2Safetensors(
        path, model_->dims(), DType::kF32,
        [&](absl::string_view name, absl::Span<float> out) -> absl::Status {
          auto it = gathered.find(std::string(name));
          if (it != gathered.end() && it->second.size() == out.size()) {
            std::copy(it->second.begin(), it->second.end(), out.begin());
            return absl::OkStatus();
          }
          // A tensor held in row blocks ("wte.weight[r0:r1]"): assembled.
          int64_t filled = 0;
          for (const auto& [stored, values] : gathered) {
            const std::optional<RowBlockName> block = ParseRowBlockName(stored);
            if (!block.has_value() || block->base != name) continue;
            const int64_t first = block->row_begin * gpt_.hidden;
            if (first + static_cast<int64_t>(values.size()) > static_cast<int64_t>(out.size())) {
              return absl::InternalError(absl::StrCat("export: block '", stored, "' out of range"));
            }
            std::copy(values.begin(), values.end(), out.begin() + first);
            filled += static_cast<int64_t>(values.size());
          }
          if (filled != static_cast<int64_t>(out.size())) {
            return absl::InternalError(absl::StrCat("export: tensor '", name, "' not gathered"));
          }
          return absl::OkStatus();
        });
  }
  // Every rank learns whether rank 0 wrote the file.
  ASSIGN_OR_RETURN(const bool failed, AnyRank(!written.ok()));
  RETURN_IF_ERROR(written);
  if (failed) return absl::InternalError("export: rank 0 failed to write the file");
  return absl::OkStatus();
}

absl::Status Trainer::Impl::Step(StepMetrics& m) {
  m.step = step_ + 1;
  m.lr = schedule_->LearningRate(step_);
  adam_->SetLearningRate(m.lr);
  m.loss_scale = adam_->loss_scaler().scale();
  m.warmup = manager_->metronome().is_warmup();
  const ChunkManagerCounters c0 = manager_->counters();
  const int64_t trace_t0 = trace_ != nullptr ? trace_->NowNs() : 0;
  // One optimizer step: gradient_accumulation_steps micro-batches, each one iteration of the
  // manager; all but the last add their gradients into the optimizer's accumulator. TrainStep
  // uses the loss scale read above (the optimizer's, unchanged until its step). The loss is the
  // mean of the micro-batches' means (each over the same number of tokens: the mean of the
  // whole batch).
  TrainStepResult r;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accumulation_steps_; ++micro) {
    RETURN_IF_ERROR(train_loader_->Next(absl::MakeSpan(tokens_), absl::MakeSpan(targets_)));
    const bool last = micro + 1 == accumulation_steps_;
    ASSIGN_OR_RETURN(const TrainStepResult mr,
                     TrainStep(*model_, *manager_, *adam_, tokens_, targets_,
                               last ? OptimizerCall::kStep : OptimizerCall::kAccumulate));
    loss_sum += mr.loss;
    r.adam = mr.adam;
    r.forward_backward_ns += mr.forward_backward_ns;
    r.optimizer_ns += mr.optimizer_ns;
    r.forward_backward_stall_ns += mr.forward_backward_stall_ns;
    r.optimizer_stall_ns += mr.optimizer_stall_ns;
  }
  r.loss = loss_sum / static_cast<double>(accumulation_steps_);
  const ChunkManagerCounters c1 = manager_->counters();

  ASSIGN_OR_RETURN(m.loss, MeanOverRanks(r.loss));
  m.grad_norm = r.adam.grad_norm;
  m.skipped = r.adam.skipped;
  if (dtype_ == DType::kF16 && m.skipped) {
    // A skip is a loss-scale event only while the f16 parameters are finite: a lower scale
    // cures gradients that overflowed, not weights that did.
    RETURN_IF_ERROR(CheckF16ParametersFinite(m.step));
  }
  // A non-finite loss is divergence unless it came with a skipped fp16 step (a loss-scale event).
  // (Non-finite gradients already stopped the optimizer: HybridAdam.) Nothing is saved for it.
  if (!std::isfinite(m.loss) && !(dtype_ == DType::kF16 && m.skipped)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "the loss of step %d is %f (%s): training diverged or the data or weights are bad, and "
        "training stops; no checkpoint is written for this step. Lower the learning rate "
        "(optimizer.params.lr), enable gradient clipping (gradient_clipping, e.g. 1.0), and "
        "check the training data",
        m.step, m.loss, DTypeName(dtype_)));
  }
  const double step_s = static_cast<double>(r.forward_backward_ns + r.optimizer_ns) * 1e-9;
  m.step_ms = step_s * 1e3;
  m.tokens_per_s = static_cast<double>(micro_batch_ * accumulation_steps_ * seq_len_ * world_) /
                   std::max(1e-9, step_s);
  const auto ms = [](int64_t ns) { return static_cast<double>(std::max<int64_t>(0, ns)) * 1e-6; };
  m.copy_wait_ms = ms(r.forward_backward_stall_ns + r.optimizer_stall_ns);
  m.compute_ms = ms(r.forward_backward_ns - r.forward_backward_stall_ns);
  m.optimizer_ms = ms(r.optimizer_ns - r.optimizer_stall_ns);
  const MemoryTrackerSnapshot a = accelerator_->tracker()->SnapshotAndResetIntervalPeaks();
  const MemoryTrackerSnapshot h = host_->tracker()->SnapshotAndResetIntervalPeaks();
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

  if (trace_ != nullptr) {
    const int64_t trace_t2 = trace_->NowNs();
    trace_->Complete(steps_track_, absl::StrCat("step ", m.step), "step", trace_t0,
                     trace_t2 - trace_t0,
                     {{"loss", m.loss}, {"lr", m.lr}, {"loaded_bytes", m.loaded_bytes}});
    if (m.warmup) {
      trace_->MarkRegion("warm-up iteration", trace_t0, trace_t2 - trace_t0, {{"step", m.step}});
    }
  }
  ++step_;
  last_loss_ = m.loss;
  return absl::OkStatus();
}

absl::Status Trainer::Impl::CheckF16ParametersFinite(int64_t step) {
  // The parameters were restored from the master weights (rounded to f16) by the skip: a master
  // weight that is not finite, or beyond f16's range, is an Inf in the parameters every
  // forward reads.
  std::string first;
  int64_t bad = 0;
  for (const std::string& name : model_->ParameterNames()) {
    if (!model_->HoldsTrainingState(name)) continue;
    ASSIGN_OR_RETURN(const std::vector<float> master, model_->ReadTensor(ChunkType::kMaster, name));
    for (size_t i = 0; i < master.size(); ++i) {
      if ((FloatToHalfBits(master[i]) & 0x7c00u) != 0x7c00u) continue;
      if (bad++ == 0) {
        first = absl::StrFormat("%s element %d (master weight %g)", name, i, master[i]);
      }
    }
  }
  ASSIGN_OR_RETURN(const bool any, AnyRank(bad > 0));
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

absl::StatusOr<double> Trainer::Impl::EvaluateValidation() {
  const int64_t batches = std::min(config_.data.eval_batches, val_loader_->batches_per_epoch());
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    DataCursor cursor;
    cursor.epoch = 0;
    cursor.batch_in_epoch = b;
    RETURN_IF_ERROR(
        val_loader_->BatchAt(cursor, absl::MakeSpan(tokens_), absl::MakeSpan(targets_)));
    ASSIGN_OR_RETURN(const double loss, model_->Evaluate(tokens_, targets_));
    sum += loss;
  }
  return MeanOverRanks(sum / static_cast<double>(std::max<int64_t>(batches, 1)));
}

absl::Status Trainer::Impl::SaveCheckpoint() {
  const Clock::time_point t0 = Clock::now();
  const int64_t trace_t0 = trace_ != nullptr ? trace_->NowNs() : 0;
  TrainingCheckpointState state;
  state.step = step_;
  state.adam_step = adam_->step();
  state.loss_scaler = adam_->loss_scaler().state();
  state.data_cursor = train_loader_->cursor();
  state.last_loss = last_loss_;
  state.consecutive_skipped_steps = adam_->consecutive_skipped_steps();
  state.identity = Identity();
  state.config_json = TrainConfigToJson(config_);
  ASSIGN_OR_RETURN(const std::string dir,
                   WriteTrainingCheckpoint(RankCheckpointRoot(config_.checkpoint.dir, rank_),
                                           config_.checkpoint.keep_last, state, *model_));
  summary_.checkpoints_written.push_back(dir);
  summary_.checkpoint_s += Seconds(t0, Clock::now());
  if (trace_ != nullptr) {
    trace_->Complete(steps_track_, "checkpoint", "checkpoint", trace_t0, trace_->NowNs() - trace_t0,
                     {{"step", step_}, {"dir", dir}});
  }
  if (out() != nullptr) *out() << "checkpoint: " << dir << "\n";
  return absl::OkStatus();
}

void Trainer::Impl::PrintHeader() {
  if (out() == nullptr) return;
  const ChunkLayout& layout = store_->layout();
  const int64_t params = ModelParameterCount(model_config_);
  const int64_t model_data = params * ModelDataBytesPerParam(dtype_);
  *out() << absl::StrFormat(
      "model %s: %d layers, %d heads, hidden %d, vocab %d, %.2fM parameters, %s of model data "
      "(%s)\n",
      gpt_.name, gpt_.num_layers, gpt_.num_heads, gpt_.hidden, gpt_.vocab_size, params / 1e6,
      FormatBytes(model_data), DTypeName(dtype_));
  *out() << absl::StrFormat(
      "chunks: %d per type (param, master, momentum, variance) of %d elements (%s) (%s)\n",
      layout.num_chunks(), chunk_elems_, FormatBytes(chunk_elems_ * 4), chunk_size_note_);
  *out() << absl::StrFormat(
      "accelerator: %s, cap %s%s; host memory %s\n", backend_->name(),
      FormatBytes(backend_->capacity_bytes()),
      config_.accelerator.copy_bandwidth_bytes_per_s > 0
          ? absl::StrCat(
                ", link ",
                FormatBytes(static_cast<int64_t>(config_.accelerator.copy_bandwidth_bytes_per_s)),
                "/s")
          : std::string(),
      config_.accelerator.host_memory_bytes > 0
          ? absl::StrCat("cap ", FormatBytes(config_.accelerator.host_memory_bytes))
          : std::string("uncapped"));
  if (config_.accelerator.kind != AcceleratorKind::kCuda) {
    // What the CPU kernels dispatch to on this machine: losses are bit-identical run to run and
    // for any `threads` on one CPU kind, and differ in the last bits between kinds.
    std::string bf16;
    if (dtype_ == DType::kBF16) {
      kernels_internal::Bf16GemmBackend backend;
      const absl::Status s = kernels_internal::ResolveBf16GemmBackend(&backend);
      bf16 = s.ok() ? absl::StrCat("; bf16 GEMMs: ", kernels_internal::Bf16GemmBackendName(backend),
                                   " (", kernels_internal::OneDnnBf16Description(), ")")
                    : absl::StrCat("; bf16 GEMMs: ", s.message());
    }
    *out() << absl::StrFormat("cpu kernels: SIMD %s; OpenBLAS %s kernels%s\n",
                              DescribeSimdDispatch(), kernels_internal::OpenBlasCoreName(), bf16);
  }
  *out() << absl::StrFormat(
      "data: %s, %d tokens; batch %d x %d tokens; %d batches per epoch%s\n",
      config_.data.train_path.empty() ? std::string("built-in synthetic corpus")
                                      : config_.data.train_path,
      train_loader_->num_tokens(), micro_batch_, seq_len_, train_loader_->batches_per_epoch(),
      unigram_entropy_.has_value()
          ? absl::StrFormat("; unigram entropy %.3f nats%s", *unigram_entropy_,
                            entropy_rate_.has_value()
                                ? absl::StrFormat(", entropy rate %.3f", *entropy_rate_)
                                : std::string())
          : std::string());
  if (val_loader_.has_value() && config_.data.eval_every == 0) {
    *out() << "validation: off (data.eval_every = 0; N > 0 validates every N steps)\n";
  }
  *out() << absl::StrFormat("training %d steps from step %d with %d threads\n", config_.steps,
                            step_, threads_);
  if (accumulation_steps_ > 1) {
    *out() << absl::StrFormat(
        "gradient accumulation: %d micro-batches of %d sequences per optimizer step; f32 "
        "accumulator %s of host memory on this rank\n",
        accumulation_steps_, micro_batch_,
        FormatBytes(GradientAccumulatorBytes(adam_->owned_param_elems(), accumulation_steps_)));
  }
  if (world_ > 1) {
    *out() << absl::StrFormat(
        "data parallel (ZeRO): %d ranks; global batch %d x %d tokens; model data per rank %s "
        "(rank 0)\n",
        world_, micro_batch_ * accumulation_steps_ * world_, seq_len_,
        FormatBytes(store_->layout().RankModelDataBytes(dtype_, 0)));
  }
}

void Trainer::Impl::PrintProgress(const StepMetrics& m) {
  if (out() == nullptr) return;
  *out() << absl::StrFormat(
      "step %5d/%d | loss %.4f | lr %.3e | scale %g | %7.0f tok/s | %7.1f ms | accel model %s "
      "non-model %s | moved %s%s%s\n",
      m.step, config_.steps, m.loss, m.lr, m.loss_scale, m.tokens_per_s, m.step_ms,
      FormatBytes(m.accelerator_peak_model_bytes), FormatBytes(m.accelerator_peak_non_model_bytes),
      FormatBytes(m.loaded_bytes + m.written_back_bytes), m.warmup ? " (warm-up)" : "",
      m.skipped ? " (skipped: overflow)" : "");
  if (m.val_loss.has_value()) {
    *out() << absl::StrFormat("step %5d validation loss %.4f\n", m.step, *m.val_loss);
  }
}

void Trainer::Impl::WriteMetrics(const StepMetrics& m) {
  if (metrics_ == nullptr) return;
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
  if (absl::Status s = metrics_->Write(j); !s.ok()) {
    LOG(WARNING) << "metrics: " << s;
  }
}

absl::Status Trainer::Impl::CloseOutputs() {
  closed_ = true;
  absl::Status status;
  if (metrics_ != nullptr) status.Update(metrics_->Close());
  if (trace_ != nullptr) status.Update(trace_->Close());
  return status;
}

absl::Status Trainer::Impl::Run() {
  PrintHeader();
  summary_.first_step = step_;
  const Clock::time_point start = Clock::now();
  const int64_t eval_every = config_.data.eval_every;
  // data.eval_every 0: never validate.
  const bool validates = val_loader_.has_value() && eval_every > 0;
  absl::Status status = [&]() -> absl::Status {
    if (validates) {
      const Clock::time_point e0 = Clock::now();
      ASSIGN_OR_RETURN(const double v, EvaluateValidation());
      summary_.eval_s += Seconds(e0, Clock::now());
      summary_.first_val_loss = v;
      if (out() != nullptr) {
        *out() << absl::StrFormat("step %5d validation loss %.4f\n", step_, v);
      }
    }
    while (step_ < config_.steps) {
      StepMetrics m;
      const ProcessUsage u0 = ReadProcessUsage();
      RETURN_IF_ERROR(Step(m));
      const ProcessUsage u1 = ReadProcessUsage();
      summary_.steps_wall_s += Seconds(u0.wall, u1.wall);
      summary_.steps_user_s += u1.user_s - u0.user_s;
      summary_.steps_system_s += u1.system_s - u0.system_s;
      summary_.steps_minor_faults += u1.minor_faults - u0.minor_faults;
      summary_.steps_major_faults += u1.major_faults - u0.major_faults;
      const bool last = step_ == config_.steps;
      ASSIGN_OR_RETURN(const bool stop, AnyRank(env_.stop_requested && env_.stop_requested()));
      if (validates && (step_ % eval_every == 0 || last || stop)) {
        const Clock::time_point e0 = Clock::now();
        const int64_t trace_e0 = trace_ != nullptr ? trace_->NowNs() : 0;
        ASSIGN_OR_RETURN(const double v, EvaluateValidation());
        summary_.eval_s += Seconds(e0, Clock::now());
        if (trace_ != nullptr) {
          trace_->Complete(steps_track_, "validation", "eval", trace_e0, trace_->NowNs() - trace_e0,
                           {{"val_loss", v}});
        }
        m.val_loss = v;
        summary_.last_val_loss = v;
      }
      history_.push_back(m);
      WriteMetrics(m);
      if (m.step % std::max<int64_t>(config_.steps_per_print, 1) == 0 || last ||
          m.step == summary_.first_step + 1 || m.val_loss.has_value()) {
        PrintProgress(m);
      }
      const bool checkpoint_due =
          !config_.checkpoint.dir.empty() &&
          ((config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0) || last || stop);
      if (checkpoint_due) RETURN_IF_ERROR(SaveCheckpoint());
      if (stop && !last) {
        summary_.stopped_by_request = true;
        if (out() != nullptr) {
          *out() << "stop requested: stopped after step " << step_ << "\n";
        }
        break;
      }
    }
    if (!config_.checkpoint.export_path.empty()) {
      RETURN_IF_ERROR(Export(config_.checkpoint.export_path));
      if (out() != nullptr) {
        *out() << "exported Hugging Face "
               << (ExportsHfDirectory()
                       ? absl::StrCat(ModelFamilyName(model_config_.family), " model directory")
                       : std::string("GPT-2 weights"))
               << " to " << config_.checkpoint.export_path << "\n";
      }
    }
    return absl::OkStatus();
  }();
  summary_.seconds = Seconds(start, Clock::now());
  summary_.last_step = step_;
  if (!history_.empty()) {
    summary_.first_loss = history_.front().loss;
    summary_.last_loss = history_.back().loss;
    const size_t n = std::min<size_t>(10, history_.size());
    double sum = 0;
    for (size_t i = history_.size() - n; i < history_.size(); ++i) sum += history_[i].loss;
    summary_.final_mean_loss = sum / static_cast<double>(n);
  }
  summary_.tokens = static_cast<int64_t>(history_.size()) * micro_batch_ * accumulation_steps_ *
                    seq_len_ * world_;
  for (const StepMetrics& m : history_) {
    summary_.compute_s += m.compute_ms * 1e-3;
    summary_.copy_wait_s += m.copy_wait_ms * 1e-3;
    summary_.optimizer_s += m.optimizer_ms * 1e-3;
    summary_.accelerator_peak_model_bytes =
        std::max(summary_.accelerator_peak_model_bytes, m.accelerator_peak_model_bytes);
    summary_.accelerator_peak_non_model_bytes =
        std::max(summary_.accelerator_peak_non_model_bytes, m.accelerator_peak_non_model_bytes);
    summary_.accelerator_peak_total_bytes =
        std::max(summary_.accelerator_peak_total_bytes, m.accelerator_peak_total_bytes);
    summary_.host_peak_model_bytes =
        std::max(summary_.host_peak_model_bytes, m.host_peak_model_bytes);
    summary_.host_peak_non_model_bytes =
        std::max(summary_.host_peak_non_model_bytes, m.host_peak_non_model_bytes);
  }
  const double train_s = summary_.compute_s + summary_.copy_wait_s + summary_.optimizer_s;
  summary_.tokens_per_s = train_s > 0 ? static_cast<double>(summary_.tokens) / train_s : 0;
  const ChunkManagerCounters c = manager_->counters();
  const TransferCounters t = c.Total();
  summary_.loaded_bytes = t.load_bytes;
  summary_.written_back_bytes = t.write_back_bytes;
  summary_.loads = t.loads;
  summary_.write_backs = t.write_backs;
  summary_.clean_evictions = t.clean_evictions;
  summary_.prefetches = c.prefetches;
  summary_.prefetch_hits = c.prefetch_hits;
  summary_.write_behinds = c.write_behinds;
  summary_.pressure_evictions = c.pressure_evictions;
  summary_.pressure_reclaims = c.pressure_reclaims;
  summary_.world_size = world_;
  summary_.rank_model_data_bytes =
      store_->PayloadBytesOn(Device::Host()) + store_->PayloadBytesOn(accelerator_->device());
  summary_.all_gather_bytes = c.all_gather_bytes;
  summary_.reduce_scatter_bytes = c.reduce_scatter_bytes;
  summary_.comm_s = static_cast<double>(c.comm_ns) * 1e-9;
  if (absl::StatusOr<CpuBackendMemoryStats> m = GetCpuBackendMemoryStats(*backend_); m.ok()) {
    summary_.accelerator_allocations = m->allocations;
    summary_.accelerator_cache_hits = m->reuses();
    summary_.accelerator_peak_mapped_bytes = m->peak_mapped_bytes;
  }
  if (out() != nullptr && !history_.empty()) *out() << SummaryText();
  status.Update(CloseOutputs());
  return status;
}

std::string Trainer::Impl::SummaryText() const {
  const TrainSummary& s = summary_;
  std::ostringstream os;
  const int64_t steps = s.last_step - s.first_step;
  os << "== summary ==\n";
  os << absl::StrFormat("steps %d..%d in %.1f s; %d tokens, %.0f tokens/s of training\n",
                        s.first_step + 1, s.last_step, s.seconds, s.tokens, s.tokens_per_s);
  if (s.tokens_per_s > 0 && seq_len_ > 0) {
    // The model FLOP rate (the numerator of MFU): the useful FLOPs of the tokens trained.
    const double per_token =
        ModelTrainingFlops(model_config_, 1, seq_len_).Total() / static_cast<double>(seq_len_);
    const double rate = per_token * s.tokens_per_s;  // over the training time, as tokens/s
    os << absl::StrFormat(
        "model compute %s (%.4g MFLOP per token: linear layers, LM head and causal attention, "
        "forward and backward; model/model_config.h ModelTrainingFlops)\n",
        rate >= 1e12 ? absl::StrFormat("%.4g TFLOP/s", rate / 1e12)
                     : absl::StrFormat("%.4g GFLOP/s", rate / 1e9),
        per_token / 1e6);
  }
  os << absl::StrFormat("loss %.4f -> %.4f (mean of the last %d steps %.4f)", s.first_loss,
                        s.last_loss, std::min<int64_t>(10, steps), s.final_mean_loss);
  if (unigram_entropy_.has_value()) {
    os << absl::StrFormat("; corpus unigram entropy %.4f nats", *unigram_entropy_);
    if (entropy_rate_.has_value()) os << absl::StrFormat(", entropy rate %.4f", *entropy_rate_);
  }
  os << "\n";
  if (s.first_val_loss.has_value() && s.last_val_loss.has_value()) {
    os << absl::StrFormat("validation loss %.4f -> %.4f\n", *s.first_val_loss, *s.last_val_loss);
  }
  const double total = std::max(1e-9, s.seconds);
  const double other = std::max(
      0.0, s.seconds - s.compute_s - s.copy_wait_s - s.optimizer_s - s.eval_s - s.checkpoint_s);
  os << absl::StrFormat(
      "time: compute %.1f s (%.0f%%), waiting for chunk copies %.1f s (%.0f%%), optimizer %.1f s "
      "(%.0f%%), validation %.1f s, checkpoints %.1f s, other %.1f s\n",
      s.compute_s, 100 * s.compute_s / total, s.copy_wait_s, 100 * s.copy_wait_s / total,
      s.optimizer_s, 100 * s.optimizer_s / total, s.eval_s, s.checkpoint_s, other);
  os << absl::StrFormat("accelerator %s (cap %s): peak model data %s, peak non-model %s\n",
                        accelerator_->device().ToString(), FormatBytes(backend_->capacity_bytes()),
                        FormatBytes(s.accelerator_peak_model_bytes),
                        FormatBytes(s.accelerator_peak_non_model_bytes));
  os << absl::StrFormat("host: peak model data %s, peak non-model %s\n",
                        FormatBytes(s.host_peak_model_bytes),
                        FormatBytes(s.host_peak_non_model_bytes));
  os << absl::StrFormat("model data held%s after the last step: %s (%d bytes)\n",
                        s.world_size > 1 ? " by rank 0" : "", FormatBytes(s.rank_model_data_bytes),
                        s.rank_model_data_bytes);
  os << absl::StrFormat(
      "chunk traffic: loaded %s in %d loads (%d prefetched, %d prefetch hits), written back %s "
      "in %d write-backs (%d started early, write-behind), %d clean evictions (no copy)%s\n",
      FormatBytes(s.loaded_bytes), s.loads, s.prefetches, s.prefetch_hits,
      FormatBytes(s.written_back_bytes), s.write_backs, s.write_behinds, s.clean_evictions,
      s.pressure_evictions > 0 ? absl::StrFormat(", %d evicted under memory pressure (%d reclaims)",
                                                 s.pressure_evictions, s.pressure_reclaims)
                               : std::string());
  if (s.world_size > 1) {
    os << absl::StrFormat(
        "ZeRO over %d ranks (rank 0's numbers): all-gathered %s, reduce-scattered %s, %.1f s in "
        "collectives\n",
        s.world_size, FormatBytes(s.all_gather_bytes), FormatBytes(s.reduce_scatter_bytes),
        s.comm_s);
  }
  if (s.steps_wall_s > 0) {
    os << absl::StrFormat(
        "host CPU in the steps (every thread): user %.1f s, system %.1f s (%.1f%% of the steps' "
        "%.1f s); page faults %d minor, %d major\n",
        s.steps_user_s, s.steps_system_s, 100 * s.steps_system_s / s.steps_wall_s, s.steps_wall_s,
        s.steps_minor_faults, s.steps_major_faults);
  }
  if (s.accelerator_allocations > 0) {
    os << absl::StrFormat(
        "emulated accelerator memory: %d of %d allocations reused a cached block; at most %s "
        "mapped\n",
        s.accelerator_cache_hits, s.accelerator_allocations,
        FormatBytes(s.accelerator_peak_mapped_bytes));
  }
  if (s.stopped_by_request) os << "stopped early on request (signal)\n";
  return os.str();
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         TrainerEnvironment env) {
  auto impl = std::make_unique<Impl>(config, std::move(env));
  RETURN_IF_ERROR(impl->Build());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::Status Trainer::Run() { return impl_->Run(); }
const TrainSummary& Trainer::summary() const { return impl_->summary_; }
const std::vector<StepMetrics>& Trainer::history() const { return impl_->history_; }
std::string Trainer::SummaryText() const { return impl_->SummaryText(); }

}  // namespace ps
