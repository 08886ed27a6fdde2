// optimizer.overlap (docs/pipeline.md): Adam inside backward must give the serialized step's
// bits. Each test trains the same tiny GPT twice through TrainStep on the emulated accelerator —
// HybridAdam::overlap off, then on — and compares every loss, every step report (norm, clip
// coefficient, skipped, loss scale), and at the end every parameter, master weight, momentum and
// variance bit for bit, plus the bytes of a training checkpoint written from each. The cases:
// f32, bf16 and fp16 (with forced overflows), clipping never / sometimes / always engaged, a
// snapshot budget that holds only some chunks, chunks evicted under a tight device budget, the
// disk tier for the optimizer state, and f32/bf16 divergence errors. Each on-run also checks that
// speculation happened (chunks updated inside backward, commits and rollbacks where expected),
// and a last test corrupts one snapshotted value before a rollback to show that a wrong rollback
// is caught by these comparisons.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "disk/testing/memory_chunk_swap.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "memory/backend.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "optimizer/cpu_adam.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/loss_scaler.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/disk_tier.h"
#include "trainer/checkpoint.h"
#include "trainer/scheduled_chunk_access.h"
#include "trainer/testing/test_files.h"
#include "trainer/train_step.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

GptConfig TinyConfig() {
  return GptConfig{.name = "tiny",
                   .vocab_size = 64,
                   .max_seq_len = 16,
                   .hidden = 32,
                   .num_layers = 2,
                   .num_heads = 4};
}

// Several chunks: the largest operator (mlp.c_fc, 4224 elements) fits one.
constexpr int64_t kChunkElems = 5120;

struct Options {
  DType dtype = DType::kF32;
  double max_grad_norm = 0;
  bool overlap = false;
  int64_t snapshot_bytes = int64_t{256} << 20;
  // fp16: a dynamic loss scale from 2^initial_scale_power.
  int initial_scale_power = 12;
  // ChunkManagerOptions::device_budget_bytes (unset: roomy).
  std::optional<int64_t> device_budget_bytes;
  // The disk tier for the optimizer state, with this host budget in index-sets (0: none).
  int64_t disk_indices = 0;
  double lr = 1e-2;
  bool activation_checkpointing = false;
  // Steps whose micro-batch runs at loss_weight 1e300 (an Inf/NaN gradient: fp16 skips, f32/bf16
  // stop).
  std::vector<int> overflow_steps;
};

struct Rig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<MemoryChunkSwap> swap;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<CpuAdam> cpu_adam;
  std::unique_ptr<HybridAdam> adam;
};

GptModelOptions ModelOptions(const Options& o) {
  GptModelOptions m{.batch = 2, .seq_len = 16, .threads = 2};
  m.activation_checkpointing = o.activation_checkpointing;
  return m;
}

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(const GptConfig& config, const Options& o) {
  auto rig = std::make_unique<Rig>();
  ASSIGN_OR_RETURN(rig->backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout,
                   ChunkLayout::Build({.capacity_elems = kChunkElems}, GptOperators(config)));
  ASSIGN_OR_RETURN(rig->store, ChunkStore::Create(std::move(layout), {.compute_dtype = o.dtype}));
  ChunkManagerOptions manager_options;
  manager_options.device_budget_bytes = o.device_budget_bytes;
  manager_options.warmup_chunk_fraction = o.device_budget_bytes.has_value() ? 0.01 : 0.2;
  if (o.disk_indices > 0) {
    rig->swap = std::make_unique<MemoryChunkSwap>();
    manager_options.disk = DiskTierOptions{
        .swap = rig->swap.get(), .host_budget_bytes = o.disk_indices * 3 * kChunkElems * 4};
  }
  ASSIGN_OR_RETURN(rig->manager,
                   ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                        rig->accelerator.get(), rig->host.get(), manager_options));
  ASSIGN_OR_RETURN(
      rig->model,
      GptModel::Create(config, rig->store.get(), rig->manager.get(), rig->accelerator.get(),
                       ModelOptions(o)));
  ASSIGN_OR_RETURN(rig->cpu_adam, CpuAdam::Create({.num_threads = 2}));
  HybridAdamOptions adam_options;
  adam_options.groups = {ParamGroupOptions{.name = "default", .lr = o.lr, .weight_decay = 0.0}};
  adam_options.max_grad_norm = o.max_grad_norm;
  adam_options.overlap = o.overlap;
  adam_options.overlap_snapshot_bytes = o.snapshot_bytes;
  if (o.dtype == DType::kF16) {
    ASSIGN_OR_RETURN(adam_options.loss_scaler,
                     LossScaler::Dynamic({.initial_scale_power = o.initial_scale_power,
                                          .loss_scale_window = 2,
                                          .hysteresis = 1}));
  }
  ASSIGN_OR_RETURN(rig->adam, HybridAdam::Create(rig->store->layout(), 0, o.dtype, adam_options,
                                                 {.host = rig->cpu_adam.get(),
                                                  .accelerator = rig->cpu_adam.get()}));
  return rig;
}

std::vector<std::string> ParamNames(const GptConfig& config) {
  std::vector<std::string> names;
  for (const OperatorSpec& op : GptOperators(config)) {
    for (const TensorSpec& t : op.tensors) names.push_back(t.name);
  }
  return names;
}

struct RunResult {
  absl::Status status;  // the first error (the run stops there)
  std::vector<double> losses;
  std::vector<AdamStepReport> reports;
  // type -> every tensor's values, after the run.
  std::map<ChunkType, std::vector<std::vector<float>>> state;
  // Relative path -> bytes of the checkpoint written after the run.
  std::map<std::string, std::string> checkpoint;
  int64_t speculated_chunks = 0;
  int64_t commits = 0;    // steps that kept their speculative updates
  int64_t rollbacks = 0;  // steps that undid them
  int64_t owned_chunks = 0;
};

std::map<std::string, std::string> ReadTree(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    files[std::filesystem::relative(entry.path(), dir).string()] = bytes.str();
  }
  return files;
}

// `steps` steps of TrainStep, each on its own random batch.
RunResult Train(const Options& o, int steps, const std::string& name) {
  const GptConfig config = TinyConfig();
  RunResult run;
  absl::StatusOr<std::unique_ptr<Rig>> made = MakeRig(config, o);
  if (!made.ok()) {
    run.status = made.status();
    return run;
  }
  Rig& rig = **made;
  run.owned_chunks = static_cast<int64_t>(rig.adam->owned_chunks().size());
  run.status = rig.model->InitializeParameters(5);
  for (int step = 0; step < steps && run.status.ok(); ++step) {
    std::mt19937 gen(100 + step);
    std::vector<int32_t> tokens(33);
    for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % 64);
    std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
    tokens.pop_back();
    const bool overflow =
        std::find(o.overflow_steps.begin(), o.overflow_steps.end(), step) != o.overflow_steps.end();
    absl::StatusOr<TrainStepResult> result = TrainStep(
        *rig.model, *rig.manager, *rig.adam, ModelInputs{.tokens = tokens, .targets = targets},
        OptimizerCall::kStep, 0, overflow ? 1e300 : 1.0);
    if (!result.ok()) {
      run.status = result.status();
      break;
    }
    run.losses.push_back(result->loss);
    run.reports.push_back(result->adam);
    run.speculated_chunks += result->adam.speculated_chunks;
    if (result->adam.speculated_chunks > 0) {
      (result->adam.speculation_rolled_back ? run.rollbacks : run.commits)++;
    }
  }
  for (ChunkType type :
       {ChunkType::kParam, ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
    for (const std::string& tensor : ParamNames(config)) {
      absl::StatusOr<std::vector<float>> values = rig.model->ReadTensor(type, tensor);
      EXPECT_TRUE(values.ok()) << values.status();
      if (values.ok()) run.state[type].push_back(*std::move(values));
    }
  }
  const std::string root = trainer_testing::FreshTempDir("overlap_exactness_test", name);
  TrainingCheckpointState state;
  state.step = static_cast<int64_t>(run.losses.size());
  state.adam_step = rig.adam->step();
  state.loss_scaler = rig.adam->loss_scaler().state();
  state.consecutive_skipped_steps = rig.adam->consecutive_skipped_steps();
  absl::StatusOr<std::string> dir = WriteTrainingCheckpoint(root, 1, state, *rig.model);
  EXPECT_TRUE(dir.ok()) << dir.status();
  if (dir.ok()) run.checkpoint = ReadTree(*dir);
  return run;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Everything the two runs produced, bit for bit.
void ExpectSame(const RunResult& off, const RunResult& on) {
  EXPECT_EQ(off.status, on.status);
  ASSERT_EQ(off.losses.size(), on.losses.size());
  for (size_t i = 0; i < off.losses.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    EXPECT_EQ(off.losses[i], on.losses[i]);
    const AdamStepReport& a = off.reports[i];
    const AdamStepReport& b = on.reports[i];
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(a.clip_coef, b.clip_coef);
    if (!a.skipped) {
      EXPECT_EQ(a.grad_norm, b.grad_norm);
    }
    EXPECT_EQ(a.loss_scale, b.loss_scale);
    EXPECT_EQ(a.next_loss_scale, b.next_loss_scale);
    EXPECT_EQ(a.nonfinite_grads, b.nonfinite_grads);
    EXPECT_EQ(a.first_nonfinite, b.first_nonfinite);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.host_chunks + a.accelerator_chunks, b.host_chunks + b.accelerator_chunks);
  }
  for (const auto& [type, tensors] : off.state) {
    const auto it = on.state.find(type);
    ASSERT_NE(it, on.state.end());
    ASSERT_EQ(tensors.size(), it->second.size());
    for (size_t t = 0; t < tensors.size(); ++t) {
      EXPECT_TRUE(BitEqual(tensors[t], it->second[t]))
          << ChunkTypeName(type) << " of tensor " << t << " differs";
    }
  }
  EXPECT_FALSE(off.checkpoint.empty());
  EXPECT_EQ(off.checkpoint.size(), on.checkpoint.size());
  for (const auto& [path, bytes] : off.checkpoint) {
    const auto it = on.checkpoint.find(path);
    ASSERT_NE(it, on.checkpoint.end()) << path;
    EXPECT_TRUE(bytes == it->second) << "checkpoint file " << path << " differs";
  }
}

// Overlap off, then on; returns the on-run.
RunResult Compare(Options o, int steps, const std::string& name) {
  o.overlap = false;
  const RunResult off = Train(o, steps, name + "_off");
  o.overlap = true;
  RunResult on = Train(o, steps, name + "_on");
  ExpectSame(off, on);
  LOG(INFO) << name << ": " << on.speculated_chunks << " chunks speculated, " << on.commits
            << " commits, " << on.rollbacks << " rollbacks, " << on.owned_chunks << " owned";
  return on;
}

// The median of the gradient norms of an unclipped run: a threshold that clips some steps.
double MedianNorm(Options o, int steps) {
  o.overlap = false;
  o.max_grad_norm = 0;
  const RunResult run = Train(o, steps, "median");
  std::vector<double> norms;
  for (const AdamStepReport& r : run.reports) norms.push_back(r.grad_norm);
  std::sort(norms.begin(), norms.end());
  return norms.empty() ? 1.0 : norms[norms.size() / 2];
}

Options With(DType dtype) {
  Options o;
  o.dtype = dtype;
  return o;
}

class OverlapExactness : public ::testing::TestWithParam<DType> {};

TEST_P(OverlapExactness, ClippingNeverCommitsEveryStepInsideBackward) {
  Options o = With(GetParam());
  const RunResult on = Compare(o, 5, "never");
  ASSERT_TRUE(on.status.ok()) << on.status;
  EXPECT_EQ(on.commits, 5);
  EXPECT_EQ(on.rollbacks, 0);
  // Every owned chunk's gradients became final inside backward.
  EXPECT_EQ(on.speculated_chunks, 5 * on.owned_chunks);
}

TEST_P(OverlapExactness, ClippingSometimesRollsBackTheClippedSteps) {
  Options o = With(GetParam());
  o.max_grad_norm = MedianNorm(o, 8);
  const RunResult on = Compare(o, 8, "sometimes");
  ASSERT_TRUE(on.status.ok()) << on.status;
  int clipped = 0;
  for (const AdamStepReport& r : on.reports) clipped += r.clip_coef != 1.0;
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, 8);
  EXPECT_GT(on.commits, 0);
  EXPECT_GT(on.rollbacks, 0);
}

TEST_P(OverlapExactness, ClippingAlwaysSpeculatesOnceThenStops) {
  Options o = With(GetParam());
  o.max_grad_norm = 1e-6;
  const RunResult on = Compare(o, 5, "always");
  ASSERT_TRUE(on.status.ok()) << on.status;
  for (const AdamStepReport& r : on.reports) EXPECT_LT(r.clip_coef, 1.0);
  // The predictor: after the first clipped step, no step speculates.
  EXPECT_EQ(on.rollbacks, 1);
  EXPECT_EQ(on.commits, 0);
}

TEST_P(OverlapExactness, SnapshotBudgetForSomeChunksOnly) {
  // Room for two of the chunks: the rest wait for the verdict.
  const int64_t chunk_bytes = OverlapSnapshotBytes(kChunkElems, GetParam());
  Options o = With(GetParam());
  o.snapshot_bytes = 2 * chunk_bytes;
  const RunResult on = Compare(o, 4, "budget");
  ASSERT_TRUE(on.status.ok()) << on.status;
  EXPECT_GT(on.speculated_chunks, 0);
  EXPECT_LT(on.speculated_chunks, 4 * on.owned_chunks);
  Options none = With(GetParam());
  none.snapshot_bytes = 0;
  const RunResult zero = Compare(none, 3, "no_budget");
  EXPECT_EQ(zero.speculated_chunks, 0);
}

TEST_P(OverlapExactness, ChunksEvictedUnderATightDeviceBudget) {
  Options o = With(GetParam());
  o.device_budget_bytes = 3 * kChunkElems * 4 + 2 * kMiB;
  o.max_grad_norm = MedianNorm(o, 6);
  const RunResult on = Compare(o, 6, "tight");
  ASSERT_TRUE(on.status.ok()) << on.status;
  EXPECT_GT(on.speculated_chunks, 0);
}

TEST_P(OverlapExactness, DiskTierForTheOptimizerState) {
  Options o = With(GetParam());
  o.disk_indices = 2;
  o.max_grad_norm = MedianNorm(o, 6);
  const RunResult on = Compare(o, 6, "disk");
  ASSERT_TRUE(on.status.ok()) << on.status;
  EXPECT_GT(on.commits, 0);
  EXPECT_GT(on.rollbacks, 0);
}

TEST_P(OverlapExactness, ActivationCheckpointing) {
  // Recomputed forward passes run inside backward: a chunk is final only after every operator in
  // it finished its backward.
  Options o = With(GetParam());
  o.activation_checkpointing = true;
  o.max_grad_norm = MedianNorm(o, 6);
  const RunResult on = Compare(o, 6, "recompute");
  ASSERT_TRUE(on.status.ok()) << on.status;
  EXPECT_GT(on.commits, 0);
}

TEST_P(OverlapExactness, ForcedOverflow) {
  Options o = With(GetParam());
  o.overflow_steps = {1, 2, 4};
  const RunResult on = Compare(o, 6, "overflow");
  if (GetParam() == DType::kF16) {
    // Skipped and restored exactly; the loss scale comes down the same way.
    ASSERT_TRUE(on.status.ok()) << on.status;
    EXPECT_TRUE(on.reports[1].skipped);
    EXPECT_TRUE(on.reports[2].skipped);
    EXPECT_TRUE(on.reports[4].skipped);
    EXPECT_GT(on.commits, 0);
  } else {
    // f32/bf16: divergence stops the run at step 1 with the same error, state restored.
    EXPECT_EQ(on.status.code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(std::string(on.status.message()), HasSubstr("non-finite gradients"));
    EXPECT_EQ(on.losses.size(), 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OverlapExactness,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// A rollback that puts back one wrong bit is caught: the same comparisons fail.
TEST(OverlapExactnessCanFail, ACorruptedSnapshotChangesTheResult) {
  const GptConfig config = TinyConfig();
  Options o = With(DType::kF32);
  o.max_grad_norm = 1e-6;
  const auto master_after_one_step = [&](bool overlap,
                                         bool corrupt) -> std::vector<std::vector<float>> {
    o.overlap = overlap;
    std::unique_ptr<Rig> rig = *MakeRig(config, o);
    EXPECT_OK(rig->model->InitializeParameters(5));
    std::vector<int32_t> tokens(32), targets(32);
    for (int i = 0; i < 32; ++i) {
      tokens[i] = (7 * i + 3) % 64;
      targets[i] = (5 * i + 1) % 64;
    }
    // TrainStep's sequence, with the snapshot corrupted between backward and the verdict.
    EXPECT_OK(rig->manager->BeginIteration());
    BackwardChunkAccess backward(*rig->manager, *rig->store);
    EXPECT_EQ(rig->adam->BeginSpeculation(), overlap);
    rig->manager->SetGradientsFinalHook(
        [&](int64_t chunk) { return rig->adam->SpeculateChunk(backward, chunk); });
    EXPECT_OK(rig->model->ForwardBackward(tokens, targets).status());
    rig->manager->SetGradientsFinalHook(nullptr);
    if (corrupt) {
      EXPECT_TRUE(rig->adam->CorruptSnapshotForTesting());
    }
    AdamPlacement placement = *rig->manager->BeginAdam();
    ScheduledChunkAccess access(*rig->manager, *rig->store, rig->backend->device(), placement);
    absl::StatusOr<AdamStepReport> report = rig->adam->Step(access);
    EXPECT_OK(report.status());
    if (report.ok()) {
      EXPECT_EQ(report->speculation_rolled_back, overlap);
    }
    EXPECT_OK(rig->manager->EndIteration());
    std::vector<std::vector<float>> master;
    for (const std::string& name : ParamNames(config)) {
      master.push_back(*rig->model->ReadTensor(ChunkType::kMaster, name));
    }
    return master;
  };
  const auto off = master_after_one_step(false, false);
  const auto on = master_after_one_step(true, false);
  const auto wrong = master_after_one_step(true, true);
  ASSERT_EQ(off.size(), on.size());
  ASSERT_EQ(off.size(), wrong.size());
  int differing = 0;
  for (size_t t = 0; t < off.size(); ++t) {
    EXPECT_TRUE(BitEqual(off[t], on[t])) << "tensor " << t;
    differing += !BitEqual(off[t], wrong[t]);
  }
  EXPECT_EQ(differing, 1) << "one flipped bit in the snapshot changes exactly one tensor";
}

}  // namespace
}  // namespace ps
