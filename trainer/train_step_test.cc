// The training step (trainer/train_step.h) on GptModel over the emulated accelerator: chunked
// execution with the optimizer step is exact however chunks move, a model overfits one batch in
// f32, bf16 and f16 (with loss scaling), activation checkpointing trains bit-identically with
// less memory, a training state written and loaded back continues bit for bit, and the step's
// own contract (the parameters restored even by a skipped step, phase timings on the manager's
// clock, bad batches refused before the iteration opens, the iteration ended after an error).
#include "trainer/train_step.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "base/testing/fake_clock.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/caching_allocator.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/loss_scaler.h"
#include "scheduler/activation_profile.h"
#include "scheduler/chunk_manager.h"
#include "trainer/scheduled_chunk_access.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// The reference model's default shape: vocab 64, 16 positions, 32 channels, 2 layers, 4 heads.
GptConfig SmallConfig(int64_t num_layers = 2) {
  return GptConfig{.name = "small",
                   .vocab_size = 64,
                   .max_seq_len = 16,
                   .hidden = 32,
                   .num_layers = num_layers,
                   .num_heads = 4};
}

// Chunks of 5120 elements: the largest operator of the small configs (mlp.c_fc, 4224 elements)
// fits, and the model spreads over several chunks.
constexpr int64_t kChunkElems = 5120;

struct RigOptions {
  DType dtype = DType::kF32;
  int64_t chunk_elems = kChunkElems;
  int64_t capacity_bytes = 64 * kMiB;
  // ChunkManagerOptions::device_budget_bytes (unset: the capacity).
  std::optional<int64_t> budget_bytes;
  double warmup_chunk_fraction = 0.2;
  GptModelOptions model = {.batch = 2,
                           .seq_len = 16,
                           .threads = 2,
                           .attention_tile = 5,
                           .ce_row_tile = 7,
                           .ce_vocab_tile = 24};
  double lr = 1e-2;
  // Every stream of the cpu backend held until the host waits (memory/cpu_backend.h): the model's
  // kernels, the manager's copies and the optimizer run only when the host waits for them.
  bool stall_streams_until_host_waits = false;
  // The rig creates a compute stream and gives it to the manager and the model (the trainer's
  // wiring: operators are released in stream order, the host runs ahead); otherwise the model
  // creates its own, and the host waits for it at each Release.
  bool shared_compute_stream = false;
  // ChunkManagerOptions::clock.
  MonotonicClock clock = kSteadyClock;
};

// Everything one model needs, destroyed in the right order (the store before the memories).
struct Rig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<Stream> compute_stream;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<CpuAdam> cpu_adam;
  std::unique_ptr<HybridAdam> adam;
};

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(const GptConfig& config, const RigOptions& o) {
  auto rig = std::make_unique<Rig>();
  ASSIGN_OR_RETURN(rig->backend, CreateCpuBackend({.capacity_bytes = o.capacity_bytes,
                                                   .stall_streams_until_host_waits =
                                                       o.stall_streams_until_host_waits}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = o.chunk_elems * 4;
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = o.chunk_elems}, GptOperators(config)));
  ASSIGN_OR_RETURN(rig->store, ChunkStore::Create(std::move(layout), {.compute_dtype = o.dtype}));
  ChunkManagerOptions manager_options;
  manager_options.device_budget_bytes = o.budget_bytes;
  manager_options.warmup_chunk_fraction = o.warmup_chunk_fraction;
  manager_options.clock = o.clock;
  GptModelOptions model_options = o.model;
  if (o.shared_compute_stream) {
    ASSIGN_OR_RETURN(rig->compute_stream, rig->backend->CreateStream());
    manager_options.compute_stream = rig->compute_stream.get();
    model_options.compute_stream = rig->compute_stream.get();
  }
  ASSIGN_OR_RETURN(rig->manager,
                   ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                        rig->accelerator.get(), rig->host.get(), manager_options));
  ASSIGN_OR_RETURN(rig->model, GptModel::Create(config, rig->store.get(), rig->manager.get(),
                                                rig->accelerator.get(), model_options));
  ASSIGN_OR_RETURN(rig->cpu_adam, CpuAdam::Create({.num_threads = 2}));
  HybridAdamOptions adam_options;
  adam_options.groups = {ParamGroupOptions{.name = "default", .lr = o.lr, .weight_decay = 0.0}};
  ASSIGN_OR_RETURN(rig->adam, HybridAdam::Create(rig->store->layout(), 0, o.dtype, adam_options,
                                                 {.host = rig->cpu_adam.get(),
                                                  .accelerator = rig->cpu_adam.get()}));
  return rig;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// Random tokens; targets are the next token, with a few positions ignored.
Batch RandomBatch(const GptConfig& config, int64_t batch, int64_t seq_len, uint32_t seed) {
  std::mt19937 gen(seed);
  Batch b;
  const int64_t n = batch * seq_len;
  for (int64_t i = 0; i < n + 1; ++i) {
    b.tokens.push_back(static_cast<int32_t>(gen() % static_cast<uint32_t>(config.vocab_size)));
  }
  b.targets.assign(b.tokens.begin() + 1, b.tokens.end());
  b.tokens.pop_back();
  b.targets[3] = GptModel::kIgnoreIndex;
  return b;
}

std::vector<std::string> ParamNames(const GptConfig& config) {
  std::vector<std::string> names;
  for (const OperatorSpec& op : GptOperators(config)) {
    for (const TensorSpec& t : op.tensors) names.push_back(t.name);
  }
  return names;
}

// Every parameter-chunk slot, by name (parameters before backward, gradients after).
absl::StatusOr<std::vector<std::vector<float>>> ReadAll(const GptModel& model, ChunkType type) {
  std::vector<std::vector<float>> out;
  for (const std::string& name : ParamNames(model.config())) {
    ASSIGN_OR_RETURN(std::vector<float> v, model.ReadTensor(type, name));
    out.push_back(std::move(v));
  }
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// --- 1. Chunked execution is exact -------------------------------------------------------------

struct TrainTrace {
  std::vector<double> losses;
  // Per iteration, every gradient.
  std::vector<std::vector<std::vector<float>>> grads;
  std::vector<std::vector<float>> final_master;
  ChunkManagerCounters counters;
  int64_t peak_nonmodel_bytes = 0;
  int64_t num_chunks = 0;
  // Moments of the warm-up iteration (every Access, BeginAdam and AccessChunks).
  int64_t moments_per_iteration = 0;
};

// `iterations` training iterations on one fixed batch, reading the gradients between backward and
// the optimizer step.
absl::StatusOr<TrainTrace> Train(const GptConfig& config, const RigOptions& o, int iterations) {
  ASSIGN_OR_RETURN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  RETURN_IF_ERROR(rig->model->InitializeParameters(5));
  const Batch batch = RandomBatch(config, o.model.batch, o.model.seq_len, 9);
  TrainTrace trace;
  for (int it = 0; it < iterations; ++it) {
    RETURN_IF_ERROR(rig->manager->BeginIteration());
    ASSIGN_OR_RETURN(const double loss, rig->model->ForwardBackward(batch.tokens, batch.targets));
    trace.losses.push_back(loss);
    ASSIGN_OR_RETURN(auto grads, ReadAll(*rig->model, ChunkType::kParam));
    trace.grads.push_back(std::move(grads));
    ASSIGN_OR_RETURN(AdamPlacement placement, rig->manager->BeginAdam());
    ScheduledChunkAccess access(*rig->manager, *rig->store, rig->backend->device(), placement);
    ASSIGN_OR_RETURN(AdamStepReport report, rig->adam->Step(access));
    if (report.skipped) return absl::InternalError("a finite step was skipped");
    RETURN_IF_ERROR(rig->manager->EndIteration());
  }
  ASSIGN_OR_RETURN(trace.final_master, ReadAll(*rig->model, ChunkType::kMaster));
  trace.counters = rig->manager->counters();
  trace.peak_nonmodel_bytes = rig->accelerator->scratch()->stats().peak_in_use_bytes;
  trace.num_chunks = rig->store->num_chunks();
  trace.moments_per_iteration = rig->manager->tide().total_moments();
  return trace;
}

void ExpectSameTraining(const TrainTrace& a, const TrainTrace& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t it = 0; it < a.losses.size(); ++it) {
    EXPECT_EQ(a.losses[it], b.losses[it]) << "iteration " << it;
    ASSERT_EQ(a.grads[it].size(), b.grads[it].size());
    for (size_t t = 0; t < a.grads[it].size(); ++t) {
      EXPECT_TRUE(BitEqual(a.grads[it][t], b.grads[it][t]))
          << "gradient " << t << " differs at iteration " << it;
    }
  }
  for (size_t t = 0; t < a.final_master.size(); ++t) {
    EXPECT_TRUE(BitEqual(a.final_master[t], b.final_master[t])) << "master " << t;
  }
}

TEST(GptTraining, ChunkedExecutionUnderEvictionIsExact) {
  const GptConfig config = SmallConfig();
  constexpr int kIterations = 4;
  RigOptions roomy;
  ASSERT_OK_AND_ASSIGN(TrainTrace resident, Train(config, roomy, kIterations));
  // A budget with room for the activations' peak plus one chunk: at the high tide every operator
  // access must evict the previous operator's chunk; nothing is kept beyond the working set while
  // the tide is unknown (warm-up).
  RigOptions tight;
  tight.budget_bytes = resident.peak_nonmodel_bytes + kChunkElems * 4 + 4 * kKiB;
  tight.warmup_chunk_fraction = 0.01;
  ASSERT_OK_AND_ASSIGN(TrainTrace evicting, Train(config, tight, kIterations));
  ExpectSameTraining(resident, evicting);
  // The roomy run loads each chunk in the warm-up and once more after the first optimizer step
  // (which runs on the host during the warm-up); the tight one loads every chunk again in the
  // forward and in the backward of every iteration, and writes the gradients back.
  LOG(INFO) << "roomy: " << resident.counters.DebugString();
  LOG(INFO) << "tight: " << evicting.counters.DebugString();
  const auto loads = [](const TrainTrace& t, Stage s) { return t.counters.stage(s).loads; };
  EXPECT_LE(loads(resident, Stage::kForward) + loads(resident, Stage::kBackward),
            2 * resident.num_chunks);
  EXPECT_GE(loads(evicting, Stage::kForward), kIterations * (evicting.num_chunks - 1));
  EXPECT_GE(loads(evicting, Stage::kBackward), kIterations * (evicting.num_chunks - 1));
  EXPECT_GE(evicting.counters.stage(Stage::kBackward).write_backs,
            kIterations * (evicting.num_chunks - 1));
  // Training happened.
  EXPECT_LT(resident.losses.back(), resident.losses.front());
}

// The model's kernels run on its compute stream, the manager's loads and write-backs on copy
// streams. With every stream held until the host waits, an operator released before its kernels
// ran would let a write-back copy (or a drop) take the chunk's payload before the gradients were
// converted into it, and the training would differ; under eviction at every access it must still
// be exact.
TEST(GptTraining, ChunkedExecutionUnderEvictionIsExactWithStreamsHeldUntilTheHostWaits) {
  const GptConfig config = SmallConfig();
  constexpr int kIterations = 3;
  RigOptions roomy;
  ASSERT_OK_AND_ASSIGN(TrainTrace resident, Train(config, roomy, kIterations));
  RigOptions tight;
  tight.budget_bytes = resident.peak_nonmodel_bytes + kChunkElems * 4 + 4 * kKiB;
  tight.warmup_chunk_fraction = 0.01;
  tight.stall_streams_until_host_waits = true;
  ASSERT_OK_AND_ASSIGN(TrainTrace evicting, Train(config, tight, kIterations));
  ExpectSameTraining(resident, evicting);
  EXPECT_GE(evicting.counters.stage(Stage::kBackward).write_backs,
            kIterations * (evicting.num_chunks - 1));
}

// The trainer's wiring under the same eviction and held streams: the manager orders its work by
// the model's compute stream, so the model releases operators without waiting for their kernels
// (the host runs ahead) — the write-backs and drops wait for the stream instead — and the training
// is still exact.
TEST(GptTraining, ChunkedExecutionUnderEvictionIsExactWithTheComputeStreamSharedAndHeld) {
  const GptConfig config = SmallConfig();
  constexpr int kIterations = 3;
  RigOptions roomy;
  ASSERT_OK_AND_ASSIGN(TrainTrace resident, Train(config, roomy, kIterations));
  RigOptions tight;
  tight.budget_bytes = resident.peak_nonmodel_bytes + kChunkElems * 4 + 4 * kKiB;
  tight.warmup_chunk_fraction = 0.01;
  tight.stall_streams_until_host_waits = true;
  tight.shared_compute_stream = true;
  ASSERT_OK_AND_ASSIGN(TrainTrace evicting, Train(config, tight, kIterations));
  ExpectSameTraining(resident, evicting);
  EXPECT_GE(evicting.counters.stage(Stage::kBackward).write_backs,
            kIterations * (evicting.num_chunks - 1));
}

// TrainStep with the compute stream stalled at the start of each step (the stall ends at the
// host's first wait for the backend): a probe queued first sees that the host had enqueued the
// whole forward — every scratch allocation up to the last forward access, from the activation
// profile — before the first kernel ran; the losses and the trained parameters equal the
// unstalled run's bit for bit (f32 and bf16).
void ExpectTrainStepRunsAhead(DType dtype) {
  SCOPED_TRACE(DTypeName(dtype));
  const GptConfig config = SmallConfig();
  constexpr int kSteps = 3;
  RigOptions o;
  o.dtype = dtype;
  o.shared_compute_stream = true;
  const GptMemoryModel profile = GptActivationProfile(config, o.model, dtype, {});
  int64_t forward_allocs = 0;
  int64_t forward_accesses = 0;
  {
    int64_t pending_allocs = 0;
    for (const ActivationEvent& e : profile.profile.iteration) {
      if (e.kind == ActivationEvent::Kind::kAlloc) ++pending_allocs;
      if (e.kind != ActivationEvent::Kind::kAccess) continue;
      if (e.stage != Stage::kForward) break;
      forward_allocs = pending_allocs;  // allocations before this forward access
      ++forward_accesses;
    }
  }
  ASSERT_GT(forward_accesses, 3);
  const Batch batch = RandomBatch(config, o.model.batch, o.model.seq_len, 9);
  std::vector<double> losses[2];
  std::vector<std::vector<float>> master[2];
  for (int stalled = 0; stalled < 2; ++stalled) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
    ASSERT_OK(rig->model->InitializeParameters(5));
    CachingAllocator* scratch = rig->accelerator->scratch();
    for (int step = 0; step < kSteps; ++step) {
      std::unique_ptr<CpuStreamStall> stall;
      std::atomic<int64_t> allocs_when_started{-1};
      const int64_t before = scratch->stats().total_allocations;
      if (stalled == 1) {
        ASSERT_OK_AND_ASSIGN(stall, StallCpuStream(*rig->compute_stream));
        ASSERT_OK(rig->compute_stream->LaunchHostFunc(
            [&] { allocs_when_started = scratch->stats().total_allocations - before; }));
      }
      ASSERT_OK_AND_ASSIGN(TrainStepResult r, TrainStep(*rig->model, *rig->manager, *rig->adam,
                                                        batch.tokens, batch.targets));
      losses[stalled].push_back(r.loss);
      if (stalled == 1) {
        EXPECT_GE(allocs_when_started.load(), forward_allocs)
            << "step " << step << ": the compute stream started before the host enqueued the "
            << "forward's " << forward_accesses << " accesses";
      }
    }
    ASSERT_OK_AND_ASSIGN(master[stalled], ReadAll(*rig->model, ChunkType::kMaster));
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(master[0].size(), master[1].size());
  for (size_t t = 0; t < master[0].size(); ++t) {
    EXPECT_TRUE(BitEqual(master[0][t], master[1][t])) << "master " << t;
  }
}

TEST(GptTraining, TrainStepHostRunsAheadOfAStalledComputeStream) {
  ExpectTrainStepRunsAhead(DType::kF32);
  ExpectTrainStepRunsAhead(DType::kBF16);
}

// --- 2. Overfitting one batch ------------------------------------------------------------------

// Trains on one fixed batch with TrainStep (HybridAdam) until the loss is below a tenth of the
// untrained ln(vocab), within a bounded number of steps.
void ExpectOverfitsOneBatch(DType dtype, double loss_scale) {
  const GptConfig config = SmallConfig();
  RigOptions o;
  o.dtype = dtype;
  o.lr = 1e-2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  if (loss_scale != 1.0) {
    ASSERT_OK_AND_ASSIGN(rig->adam->loss_scaler(), LossScaler::Static(loss_scale));
  }
  ASSERT_OK(rig->model->InitializeParameters(1));
  const Batch batch = RandomBatch(config, o.model.batch, o.model.seq_len, 4);
  const double target = 0.1 * std::log(static_cast<double>(config.vocab_size));
  // 31 predictable positions of random tokens: Adam at lr 1e-2 memorizes them in ~20 steps here
  // (f32); the bound leaves room for the low-precision runs.
  constexpr int kMaxSteps = 100;
  double first = 0, loss = 0;
  int steps = 0;
  for (; steps < kMaxSteps; ++steps) {
    ASSERT_OK_AND_ASSIGN(TrainStepResult r, TrainStep(*rig->model, *rig->manager, *rig->adam,
                                                      batch.tokens, batch.targets));
    ASSERT_FALSE(r.adam.skipped) << "step " << steps;
    if (steps == 0) first = r.loss;
    loss = r.loss;
    if (loss < target) break;
  }
  LOG(INFO) << DTypeName(dtype) << " overfit: loss " << first << " -> " << loss << " in " << steps
            << " steps";
  EXPECT_LT(loss, target) << "after " << steps << " steps";
  ASSERT_OK_AND_ASSIGN(const double eval, rig->model->Evaluate(batch.tokens, batch.targets));
  EXPECT_LT(eval, 2 * target);
}

TEST(GptTraining, OverfitsOneBatchWithHybridAdam) { ExpectOverfitsOneBatch(DType::kF32, 1.0); }
TEST(GptTraining, OverfitsOneBatchInBF16) { ExpectOverfitsOneBatch(DType::kBF16, 1.0); }
TEST(GptTraining, OverfitsOneBatchInF16WithLossScaling) {
  ExpectOverfitsOneBatch(DType::kF16, 1024.0);
}

// bf16 training against f32 training from the same initialization, on the same batch, on the
// default bf16 GEMM backend and on the fallback.
//
// Tolerances. Iteration 0 is a forward and backward on the same masters: bf16 rounds every
// parameter and every GEMM activation operand to 8 significant bits (relative error <= 2^-8), so a
// logit moves by at most 2 * 2^-8 of the sum of |terms| of its dot product and the loss, which
// moves by at most twice the largest logit change, by far less in practice: the errors have random
// signs (measured here: 4e-5). The bound 2e-4 leaves 5x. After an update the runs differ for a
// second reason: Adam's first updates are +-lr (m / sqrt(v) = g / |g|) whatever the gradient's
// size, so a parameter whose bf16 and f32 gradients differ in sign (small gradients) moves 2 lr
// apart. With lr 1e-2 the measured differences stay below 3.6e-3 over 8 steps while the f32 loss
// falls by ~0.25 per step; the bound 1.5e-2 leaves 4x and still fails for a broken gradient, which
// shifts the trajectory by a whole step's progress.
void ExpectBf16TracksF32() {
  const GptConfig config = SmallConfig();
  constexpr int kIterations = 8;
  RigOptions f32;
  RigOptions bf16;
  bf16.dtype = DType::kBF16;
  ASSERT_OK_AND_ASSIGN(TrainTrace a, Train(config, f32, kIterations));
  ASSERT_OK_AND_ASSIGN(TrainTrace b, Train(config, bf16, kIterations));
  for (int it = 0; it < kIterations; ++it) {
    LOG(INFO) << "iteration " << it << ": f32 loss " << a.losses[it] << ", bf16 " << b.losses[it]
              << ", difference " << b.losses[it] - a.losses[it];
    EXPECT_NEAR(b.losses[it], a.losses[it], it == 0 ? 2e-4 : 1.5e-2) << "iteration " << it;
  }
  EXPECT_LT(b.losses.back(), b.losses.front() - 1.0);  // bf16 training happened
}

TEST(GptTraining, Bf16TrainingTracksF32) { ExpectBf16TracksF32(); }
TEST(GptTraining, Bf16TrainingTracksF32WithFallbackGemms) {
  kernels_internal::SetBf16GemmBackendForTest(kernels_internal::Bf16GemmBackend::kFallback);
  ExpectBf16TracksF32();
  kernels_internal::SetBf16GemmBackendForTest(kernels_internal::Bf16GemmBackend::kAuto);
}

// --- 3. Activation checkpointing ---------------------------------------------------------------

TEST(GptTraining, ActivationCheckpointingIsExactAndSavesMemory) {
  const GptConfig config = SmallConfig(/*num_layers=*/4);
  RigOptions plain;
  RigOptions checkpointed;
  checkpointed.model.activation_checkpointing = true;
  ASSERT_OK_AND_ASSIGN(TrainTrace a, Train(config, plain, 3));
  ASSERT_OK_AND_ASSIGN(TrainTrace b, Train(config, checkpointed, 3));
  ExpectSameTraining(a, b);
  LOG(INFO) << "peak non-model bytes: " << a.peak_nonmodel_bytes << " without checkpointing, "
            << b.peak_nonmodel_bytes << " with";
  EXPECT_LT(b.peak_nonmodel_bytes, a.peak_nonmodel_bytes * 3 / 4);
  // Recomputation accesses five operators of each block again in forward (not the last
  // projection, whose output the backward does not need).
  EXPECT_EQ(b.moments_per_iteration, a.moments_per_iteration + 5 * config.num_layers);
}

// --- 4. Training state round trip (checkpoints)
// ---------------------------------------------------

TEST(GptTraining, TrainingStateRoundTripContinuesBitForBit) {
  const GptConfig config = SmallConfig();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    RigOptions o;
    o.dtype = dtype;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> a, MakeRig(config, o));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> b, MakeRig(config, o));
    ASSERT_OK(a->model->InitializeParameters(4));
    ASSERT_OK(b->model->InitializeParameters(99));  // different: the load must replace it all
    const Batch batch = RandomBatch(config, 2, 16, 3);
    for (int i = 0; i < 2; ++i) {
      ASSERT_OK(TrainStep(*a->model, *a->manager, *a->adam, batch.tokens, batch.targets).status());
    }
    std::map<std::pair<std::string, ChunkType>, std::vector<float>> state;
    ASSERT_OK(a->model->VisitTrainingState(
        [&](absl::string_view name, ChunkType type, absl::Span<const float> v) {
          state[{std::string(name), type}].assign(v.begin(), v.end());
          return absl::OkStatus();
        }));
    EXPECT_EQ(state.size(), 3 * ParamNames(config).size());
    ASSERT_OK(b->model->LoadTrainingState(
        [&](absl::string_view name, ChunkType type, absl::Span<float> out) -> absl::Status {
          auto it = state.find({std::string(name), type});
          if (it == state.end() || it->second.size() != out.size()) {
            return absl::NotFoundError(std::string(name));
          }
          std::copy(it->second.begin(), it->second.end(), out.begin());
          return absl::OkStatus();
        }));
    b->adam->set_step(a->adam->step());
    for (int i = 0; i < 2; ++i) {
      ASSERT_OK_AND_ASSIGN(TrainStepResult ra, TrainStep(*a->model, *a->manager, *a->adam,
                                                         batch.tokens, batch.targets));
      ASSERT_OK_AND_ASSIGN(TrainStepResult rb, TrainStep(*b->model, *b->manager, *b->adam,
                                                         batch.tokens, batch.targets));
      EXPECT_EQ(ra.loss, rb.loss) << "step " << i;
    }
    ASSERT_OK_AND_ASSIGN(auto ma, ReadAll(*a->model, ChunkType::kMaster));
    ASSERT_OK_AND_ASSIGN(auto mb, ReadAll(*b->model, ChunkType::kMaster));
    for (size_t t = 0; t < ma.size(); ++t) EXPECT_TRUE(BitEqual(ma[t], mb[t])) << t;
    // A fill error is returned as it is.
    EXPECT_THAT(b->model->LoadTrainingState([](absl::string_view, ChunkType, absl::Span<float>) {
      return absl::DataLossError("bad file");
    }),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad file")));
  }
}

// --- 5. The step's contract -------------------------------------------------------------------

// A skipped or finished step leaves the parameters in their slots (the optimizer writes them
// back), and the phases are timed, waiting for copies counted inside each phase's time.
TEST(TrainStep, RestoresParametersAndTimesItsPhases) {
  const GptConfig config = SmallConfig();
  RigOptions f16;
  f16.dtype = DType::kF16;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, f16));
  ASSERT_OK(rig->model->InitializeParameters(1));
  const Batch batch = RandomBatch(config, 2, 16, 1);
  ASSERT_OK_AND_ASSIGN(const double eval, rig->model->Evaluate(batch.tokens, batch.targets));
  ASSERT_OK_AND_ASSIGN(TrainStepResult step, TrainStep(*rig->model, *rig->manager, *rig->adam,
                                                       batch.tokens, batch.targets));
  EXPECT_EQ(step.loss, eval);
  EXPECT_FALSE(step.adam.skipped);
  EXPECT_GT(step.forward_backward_ns, 0);
  EXPECT_GT(step.optimizer_ns, 0);
  EXPECT_GE(step.forward_backward_stall_ns, 0);
  EXPECT_LE(step.forward_backward_stall_ns, step.forward_backward_ns);
  EXPECT_GE(step.optimizer_stall_ns, 0);
  EXPECT_LE(step.optimizer_stall_ns, step.optimizer_ns);
  EXPECT_FALSE(rig->manager->in_iteration());
  // The parameters are back in the slots: evaluation runs (on the updated weights).
  ASSERT_OK_AND_ASSIGN(const double after, rig->model->Evaluate(batch.tokens, batch.targets));
  EXPECT_NE(after, eval);

  // A step whose scaled f16 gradients overflow (2^24 times gradients of ~1e-2 exceed f16's 65504)
  // is skipped and restores the parameters from the master copies: the next evaluation sees
  // exactly the weights before it.
  ASSERT_OK_AND_ASSIGN(rig->adam->loss_scaler(), LossScaler::Static(16777216.0));
  ASSERT_OK_AND_ASSIGN(
      step, TrainStep(*rig->model, *rig->manager, *rig->adam, batch.tokens, batch.targets));
  EXPECT_TRUE(step.adam.skipped);
  EXPECT_THAT(rig->model->Evaluate(batch.tokens, batch.targets), IsOkAndHolds(after));
}

// The phases are timed on the manager's clock, as are the stalls counted inside them. With a fake
// clock that steps at every reading, the step's first reading (before BeginIteration) and its
// last (after EndIteration) span every reading the step and the manager made, so the two phases
// add up to exactly (readings - 1) steps; a phase timed on any other clock would not.
TEST(TrainStep, TimesItsPhasesOnTheManagersClock) {
  constexpr int64_t kStepNs = 1000;
  FakeClock fake(/*start_ns=*/int64_t{1} << 40, kStepNs);
  const GptConfig config = SmallConfig();
  RigOptions o;
  o.clock = fake.clock();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
  ASSERT_OK(rig->model->InitializeParameters(1));
  const Batch batch = RandomBatch(config, 2, 16, 1);
  for (int iteration = 0; iteration < 2; ++iteration) {  // the warm-up, then a planned one
    SCOPED_TRACE(iteration);
    const int64_t reads_before = fake.reads();
    const int64_t stall_before = rig->manager->counters().stall_ns;
    ASSERT_OK_AND_ASSIGN(TrainStepResult step, TrainStep(*rig->model, *rig->manager, *rig->adam,
                                                         batch.tokens, batch.targets));
    const int64_t readings = fake.reads() - reads_before;
    EXPECT_EQ(step.forward_backward_ns + step.optimizer_ns, (readings - 1) * kStepNs);
    for (const int64_t ns : {step.forward_backward_ns, step.optimizer_ns}) {
      EXPECT_GE(ns, kStepNs);
      EXPECT_EQ(ns % kStepNs, 0) << ns;
    }
    for (const int64_t ns : {step.forward_backward_stall_ns, step.optimizer_stall_ns}) {
      EXPECT_EQ(ns % kStepNs, 0) << ns;
    }
    EXPECT_LE(step.forward_backward_stall_ns, step.forward_backward_ns);
    EXPECT_LE(step.optimizer_stall_ns, step.optimizer_ns);
    EXPECT_EQ(step.forward_backward_stall_ns + step.optimizer_stall_ns,
              rig->manager->counters().stall_ns - stall_before);
  }
  // The chunks were loaded on the host's watch (no compute stream given: the host waits for each
  // load), so stalls were counted, in fake steps.
  EXPECT_GT(rig->manager->counters().stall_ns, 0);
}

// A batch the model would refuse is refused before the iteration opens: nothing is accessed, no
// moment is counted, and the manager is still before its warm-up.
TEST(TrainStep, RefusesBadBatchesBeforeTheIteration) {
  const GptConfig config = SmallConfig();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, {}));
  ASSERT_OK(rig->model->InitializeParameters(1));
  Batch bad = RandomBatch(config, 2, 16, 1);
  bad.tokens[5] = static_cast<int32_t>(config.vocab_size);
  EXPECT_THAT(TrainStep(*rig->model, *rig->manager, *rig->adam, bad.tokens, bad.targets),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 64")));
  bad.tokens.pop_back();
  EXPECT_THAT(TrainStep(*rig->model, *rig->manager, *rig->adam, bad.tokens, bad.targets),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(rig->manager->in_iteration());
  EXPECT_TRUE(rig->manager->is_warmup());
  EXPECT_EQ(rig->manager->counters().Total().loads, 0);
  const Batch good = RandomBatch(config, 2, 16, 1);
  EXPECT_OK(TrainStep(*rig->model, *rig->manager, *rig->adam, good.tokens, good.targets).status());
}

// An error inside the step (an operator that cannot fit the device budget) ends the iteration,
// so the manager is never left inside one.
TEST(TrainStep, EndsTheIterationAfterAnError) {
  const GptConfig config = SmallConfig();
  RigOptions tiny_budget;
  tiny_budget.budget_bytes = kChunkElems * 2;  // below one chunk: no operator fits
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, tiny_budget));
  ASSERT_OK(rig->model->InitializeParameters(1));
  const Batch batch = RandomBatch(config, 2, 16, 1);
  EXPECT_THAT(TrainStep(*rig->model, *rig->manager, *rig->adam, batch.tokens, batch.targets),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("wte")));
  EXPECT_FALSE(rig->manager->in_iteration());
}

}  // namespace
}  // namespace ps
