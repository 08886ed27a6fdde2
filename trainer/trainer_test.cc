// End-to-end tests of the Trainer, in-process, on tiny models on the emulated accelerator.
#include "trainer/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "comm/communicator.h"
#include "comm/testing/thread_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/data/token_file.h"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/testing/test_files.h"

namespace ps {
namespace {

using ::ps::trainer_testing::ReadFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A tiny GPT (about 120K parameters, 1.9 MB of f32 model data in 24 Ki-element chunks) on the
// synthetic corpus, with an accelerator cap (1.5 MiB) below the model data and the activations:
// every step moves chunks.
TrainConfig TinyConfig() {
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{};
  c.model.vocab_size = 256;
  c.model.max_seq_len = 32;
  c.model.hidden = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.data.seq_len = 32;
  c.train_micro_batch_size_per_gpu = 2;
  c.train_batch_size = 0;
  c.steps = 8;
  c.chunk.size_elems = 24 * 1024;
  c.accelerator.memory_bytes = 1536 * kKiB;
  c.threads = 2;
  c.data.eval_every = 0;
  c.data.eval_batches = 2;
  c.steps_per_print = 1;
  c.checkpoint = CheckpointConfig{};
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 2;
  return c;
}

absl::StatusOr<std::unique_ptr<Trainer>> Train(const TrainConfig& config,
                                               TrainerEnvironment env = {}) {
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, env));
  RETURN_IF_ERROR(trainer->Run());
  return trainer;
}

std::vector<double> Losses(const Trainer& t) {
  std::vector<double> losses;
  for (const StepMetrics& m : t.history()) losses.push_back(m.loss);
  return losses;
}

TEST(Trainer, LossFallsAndChunksMove) {
  TrainConfig c = TinyConfig();
  c.steps = 60;
  c.data.eval_every = 60;  // before the first step and after the last
  std::ostringstream out;
  TrainerEnvironment env;
  env.out = &out;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c, env));
  const TrainSummary& s = t->summary();
  EXPECT_EQ(s.last_step, 60);
  EXPECT_NEAR(s.first_loss, std::log(256.0), 0.3);
  EXPECT_LT(s.final_mean_loss, s.first_loss - 1.0) << out.str();
  EXPECT_GT(s.loaded_bytes, 0) << "the cap is below the model data: chunks must move";
  EXPECT_LE(s.accelerator_peak_model_bytes + s.accelerator_peak_non_model_bytes,
            c.accelerator.memory_bytes);
  ASSERT_TRUE(s.first_val_loss.has_value());
  ASSERT_TRUE(s.last_val_loss.has_value());
  EXPECT_LT(*s.last_val_loss, *s.first_val_loss - 1.0);
  // Progress lines and the summary.
  EXPECT_THAT(out.str(), HasSubstr("step    60/60 | loss"));
  EXPECT_THAT(out.str(), HasSubstr("== summary =="));
  EXPECT_THAT(out.str(), HasSubstr("chunk traffic: loaded"));
  EXPECT_THAT(out.str(), HasSubstr("waiting for chunk copies"));
  // The process's usage over the steps, and the emulated accelerator's reuse of freed blocks.
  EXPECT_GT(s.steps_wall_s, 0);
  EXPECT_LE(s.steps_wall_s, s.seconds);
  EXPECT_GT(s.steps_user_s + s.steps_system_s, 0);
  EXPECT_GE(s.steps_minor_faults, 0);
  EXPECT_GE(s.steps_major_faults, 0);
  EXPECT_THAT(out.str(), HasSubstr("host CPU in the steps"));
  EXPECT_THAT(out.str(), HasSubstr("minor,"));
  EXPECT_GT(s.accelerator_allocations, 0);
  // The chunk pools keep their blocks, so the backend sees few allocations here.
  EXPECT_LE(s.accelerator_cache_hits, s.accelerator_allocations);
  EXPECT_LE(s.accelerator_peak_mapped_bytes, c.accelerator.memory_bytes);
  EXPECT_THAT(out.str(), HasSubstr("allocations reused a cached block"));
}

// The memory cap changes where chunks are, never the numbers.
TEST(Trainer, LossesDoNotDependOnTheMemoryCapOrThreads) {
  TrainConfig tight = TinyConfig();
  TrainConfig roomy = TinyConfig();
  roomy.accelerator.memory_bytes = 64 * kMiB;
  roomy.threads = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> a, Train(tight));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b, Train(roomy));
  EXPECT_EQ(Losses(*a), Losses(*b));
  EXPECT_GT(a->summary().loaded_bytes, b->summary().loaded_bytes);
}

TEST(Trainer, ResumeIsBitExactAndExportsTheSameWeights) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "resume");
  TrainConfig straight = TinyConfig();
  straight.steps = 8;
  straight.data.shuffle = true;
  straight.checkpoint.dir = dir + "/straight";
  straight.checkpoint.export_path = dir + "/straight.safetensors";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> a, Train(straight));

  // The same run interrupted after 4 steps (as by a signal), then resumed.
  TrainConfig first = straight;
  first.checkpoint.dir = dir + "/split";
  first.checkpoint.export_path = "";
  int steps_seen = 0;
  TrainerEnvironment env;
  env.stop_requested = [&] { return ++steps_seen >= 4; };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b1, Train(first, env));
  ASSERT_EQ(b1->summary().last_step, 4);
  TrainConfig second = first;
  second.checkpoint.resume = true;
  second.checkpoint.export_path = dir + "/split.safetensors";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b2, Train(second));

  std::vector<double> split = Losses(*b1);
  for (double l : Losses(*b2)) split.push_back(l);
  EXPECT_EQ(Losses(*a), split);
  EXPECT_EQ(b2->summary().first_step, 4);
  const std::string wa = ReadFile(straight.checkpoint.export_path);
  const std::string wb = ReadFile(second.checkpoint.export_path);
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "exported weights differ";
}

TEST(Trainer, StopRequestWritesACheckpointAndReturnsOk) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "stop");
  TrainConfig c = TinyConfig();
  c.steps = 50;
  c.checkpoint.dir = dir;
  int calls = 0;
  TrainerEnvironment env;
  env.stop_requested = [&] { return ++calls >= 3; };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c, env));
  EXPECT_TRUE(t->summary().stopped_by_request);
  EXPECT_EQ(t->summary().last_step, 3);
  ASSERT_OK_AND_ASSIGN(CheckpointRef latest, LatestCheckpoint(dir));
  EXPECT_EQ(latest.step, 3);
}

TEST(Trainer, KeepsTheLastKCheckpoints) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "keep");
  TrainConfig c = TinyConfig();
  c.steps = 6;
  c.checkpoint.dir = dir;
  c.checkpoint.every = 1;
  c.checkpoint.keep_last = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c));
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointRef> refs, ListCheckpoints(dir));
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].step, 5);
  EXPECT_EQ(refs[1].step, 6);
  EXPECT_EQ(t->summary().checkpoints_written.size(), 6u);
}

TEST(Trainer, RefusesMissingMismatchingAndCorruptCheckpoints) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "refuse");
  TrainConfig c = TinyConfig();
  c.steps = 2;
  c.checkpoint.dir = dir + "/run";
  c.checkpoint.resume = true;
  EXPECT_THAT(Trainer::Create(c).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no checkpoint to resume from")));

  c.checkpoint.resume = false;
  ASSERT_OK(Train(c).status());
  ASSERT_OK_AND_ASSIGN(CheckpointRef latest, LatestCheckpoint(c.checkpoint.dir));
  const std::string state_file = latest.path + "/state.safetensors";
  const std::string original = ReadFile(state_file);

  // Another model.
  TrainConfig other = c;
  other.checkpoint.resume = true;
  other.steps = 4;
  other.model.hidden = 32;
  EXPECT_THAT(Trainer::Create(other).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("belongs to another run"), HasSubstr("n_embd 64"))));
  // Another batch shape.
  other = c;
  other.checkpoint.resume = true;
  other.steps = 4;
  other.train_micro_batch_size_per_gpu = 3;
  other.accelerator.memory_bytes = 4 * kMiB;  // the larger batch's activations (the plan)
  EXPECT_THAT(Trainer::Create(other).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("micro_batch 2")));
  // Nothing was touched by the refusals.
  EXPECT_EQ(ReadFile(state_file), original);

  // A flipped byte.
  std::string corrupt = original;
  corrupt[corrupt.size() / 2] ^= 0x40;
  {
    std::ofstream f(state_file, std::ios::binary | std::ios::trunc);
    f << corrupt;
  }
  other = c;
  other.checkpoint.resume = true;
  other.steps = 4;
  EXPECT_THAT(Trainer::Create(other).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("state.safetensors")));
}

// --- Divergence (issue #15) -------------------------------------------------------------------

// An absurd learning rate: the weights blow up after the first real update, the next step's
// gradients are Inf/NaN. In f32 and bf16 that stops the run with OutOfRange naming the tensor and
// what to do; the checkpoints written before stay, nothing is written for the failing step.
TEST(Trainer, NonFiniteGradientsStopF32AndBf16RunsWithoutSavingThem) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    const std::string dir =
        trainer_testing::FreshTempDir("trainer_test", bf16 ? "diverge_bf16" : "diverge_f32");
    TrainConfig c = TinyConfig();
    c.bf16 = bf16;
    c.steps = 10;
    c.optimizer.lr = 1e30;
    c.gradient_clipping = 0;
    c.checkpoint.dir = dir;
    c.checkpoint.every = 1;
    c.checkpoint.keep_last = 10;
    c.profile.metrics_path = dir + "/metrics.jsonl";
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Trainer::Create(c));
    EXPECT_THAT(t->Run(), StatusIs(absl::StatusCode::kOutOfRange,
                                   AllOf(HasSubstr("non-finite gradients at optimizer step"),
                                         HasSubstr("the first in "), HasSubstr("learning rate"))));
    const int64_t failed_step = t->summary().last_step + 1;
    ASSERT_OK_AND_ASSIGN(std::vector<CheckpointRef> refs, ListCheckpoints(dir));
    ASSERT_FALSE(refs.empty());
    EXPECT_EQ(refs.back().step, failed_step - 1) << "no checkpoint of the failing step";
    for (const CheckpointRef& ref : refs) EXPECT_OK(OpenCheckpoint(ref.path).status());
    int lines = 0;
    std::ifstream metrics(c.profile.metrics_path);
    for (std::string line; std::getline(metrics, line);) ++lines;
    EXPECT_EQ(lines, failed_step - 1);
  }
}

// fp16: skipped steps are loss-scale events up to fp16.max_consecutive_skipped_steps in a row;
// one more stops the run. The count is in the checkpoint, so a resume continues it. (The skips
// come from a static loss scale of 2^60, which overflows every gradient while the weights stay
// finite: weights that overflow f16 stop the run at their first skip instead, see
// train_binary_test.)
TEST(Trainer, TooManySkippedFp16StepsStopTheRunAcrossAResume) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "skips");
  TrainConfig c = TinyConfig();
  c.fp16.enabled = true;
  c.fp16.loss_scale = 1152921504606846976.0;  // 2^60
  c.fp16.max_consecutive_skipped_steps = 3;
  c.steps = 20;
  c.checkpoint.dir = dir;
  c.checkpoint.every = 1;
  c.checkpoint.keep_last = 20;
  std::ostringstream out;
  TrainerEnvironment env;
  env.out = &out;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Trainer::Create(c, env));
  EXPECT_THAT(t->Run(), StatusIs(absl::StatusCode::kOutOfRange,
                                 AllOf(HasSubstr("4 optimizer steps in a row"),
                                       HasSubstr("fp16.max_consecutive_skipped_steps = 3"))));
  EXPECT_THAT(out.str(), HasSubstr("(skipped: overflow)"));
  const std::vector<StepMetrics>& h = t->history();
  ASSERT_GE(h.size(), 3u);
  for (size_t i = h.size() - 3; i < h.size(); ++i) EXPECT_TRUE(h[i].skipped) << i;
  ASSERT_OK_AND_ASSIGN(CheckpointRef latest, LatestCheckpoint(dir));
  EXPECT_EQ(latest.step, static_cast<int64_t>(h.size()));
  ASSERT_OK_AND_ASSIGN(Checkpoint ckpt, OpenCheckpoint(latest.path));
  EXPECT_EQ(ckpt.state["consecutive_skipped_steps"], 3);

  // Resumed, the first step skips again: the fourth in a row.
  c.checkpoint.resume = true;
  ASSERT_OK_AND_ASSIGN(t, Trainer::Create(c));
  EXPECT_THAT(t->Run(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("4 optimizer steps in a row")));
  EXPECT_TRUE(t->history().empty());
  ASSERT_OK_AND_ASSIGN(CheckpointRef after, LatestCheckpoint(dir));
  EXPECT_EQ(after.step, latest.step);
}

// Weights with a NaN are refused before training, naming the tensor.
TEST(Trainer, RefusesNonFiniteInitialWeights) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "nan_init");
  TrainConfig c = TinyConfig();
  c.steps = 2;
  c.checkpoint.export_path = dir + "/w.safetensors";
  ASSERT_OK(Train(c).status());
  // Patch one value of h.1.attn.c_attn.weight ([64, 192], f32) in a copy of the exported file,
  // found by its first bytes.
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(c.checkpoint.export_path));
  const SafetensorsTensorInfo* info = file.Find("h.1.attn.c_attn.weight");
  ASSERT_NE(info, nullptr);
  std::string bytes = ReadFile(c.checkpoint.export_path);
  const std::string needle(reinterpret_cast<const char*>(file.Bytes(*info).data()), 64);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  const float nan = std::nanf("");
  std::memcpy(&bytes[at + 4 * (1 * 192 + 2)], &nan, 4);
  {
    std::ofstream f(dir + "/nan.safetensors", std::ios::binary);
    f << bytes;
  }
  TrainConfig from = TinyConfig();
  from.checkpoint.init_from = dir + "/nan.safetensors";
  from.profile.metrics_path = dir + "/m.jsonl";
  EXPECT_THAT(Trainer::Create(from).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("nan.safetensors"),
                             HasSubstr("'h.1.attn.c_attn.weight' holds NaN at [1, 2]"))));
  EXPECT_FALSE(std::filesystem::exists(from.profile.metrics_path));
}

// --accelerator=cuda says what the machine lacks before any work: a binary built without CUDA,
// or no usable GPU (the backend's own message). On a GPU the run is built.
TEST(Trainer, CudaWithoutAGpuSaysSo) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "cuda");
  TrainConfig c = TinyConfig();
  c.accelerator.kind = AcceleratorKind::kCuda;
  c.accelerator.copy_bandwidth_bytes_per_s = 0;
  c.profile.metrics_path = dir + "/m.jsonl";
  BackendOptions probe;
  probe.kind = "cuda";
  const bool gpu = CreateBackend(probe).ok();
  const absl::Status status = Trainer::Create(c).status();
  if (gpu) {
    EXPECT_THAT(status, IsOk());
    return;
  }
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("accelerator.backend \"cuda\""));
  EXPECT_FALSE(std::filesystem::exists(c.profile.metrics_path)) << "no output before the checks";
  if (!CudaBackendCompiledIn()) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("built without CUDA support")));
  } else {
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device is available")));
  }
}

// `mpirun -np N train --accelerator=cuda --comm=mpi` would give the GPU-resident ZeRO payloads to
// MPI and memcpy (a segfault at the first all-gather): refused before any work, naming the fix,
// with or without a GPU.
TEST(Trainer, CudaWithAMultiRankHostCommunicatorIsRefused) {
  std::vector<std::unique_ptr<Communicator>> two = CreateThreadCommunicators(2);
  ASSERT_EQ(two[0]->memory(), CommMemory::kHost);
  TrainConfig c = TinyConfig();
  c.accelerator.kind = AcceleratorKind::kCuda;
  c.accelerator.copy_bandwidth_bytes_per_s = 0;
  TrainerEnvironment env;
  env.communicator = two[0].get();
  EXPECT_THAT(Trainer::Create(c, env).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("accelerator.backend \"cuda\""),
                             HasSubstr("host-memory communicator"), HasSubstr("--comm=nccl"))));

  EXPECT_THAT(CheckCommunicatorFitsAccelerator(AcceleratorKind::kCuda, two[1].get(), false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--comm=nccl")));
  // What stays accepted: the emulated accelerator (its memory is host memory), a world of one,
  // and a test's device-memory stand-in.
  EXPECT_THAT(CheckCommunicatorFitsAccelerator(AcceleratorKind::kCpu, two[0].get(), false), IsOk());
  EXPECT_THAT(CheckCommunicatorFitsAccelerator(AcceleratorKind::kCuda, nullptr, false), IsOk());
  std::vector<std::unique_ptr<Communicator>> one = CreateThreadCommunicators(1);
  EXPECT_THAT(CheckCommunicatorFitsAccelerator(AcceleratorKind::kCuda, one[0].get(), false),
              IsOk());
  EXPECT_THAT(CheckCommunicatorFitsAccelerator(AcceleratorKind::kCuda, two[0].get(), true), IsOk());
}

// Without accelerator.memory a cuda run plans with the GPU (free memory minus the margin), not a
// 4 GiB guess; a set value wins; the emulated accelerator and multi-rank cuda runs (the budget
// picks the chunk size, which every rank must share) keep the plan's minimum.
TEST(DefaultAcceleratorBudgetTest, CudaUsesTheCardWhenUnset) {
  const int64_t usable = 78 * kGiB;
  EXPECT_EQ(DefaultAcceleratorBudget(AcceleratorKind::kCuda, 0, usable, 1), usable);
  EXPECT_EQ(DefaultAcceleratorBudget(AcceleratorKind::kCuda, 2 * kGiB, usable, 1), 2 * kGiB);
  EXPECT_EQ(DefaultAcceleratorBudget(AcceleratorKind::kCuda, 0, usable, 2), 0);
  EXPECT_EQ(DefaultAcceleratorBudget(AcceleratorKind::kCuda, 3 * kGiB, usable, 2), 3 * kGiB);
  EXPECT_EQ(DefaultAcceleratorBudget(AcceleratorKind::kCpu, 0, 0, 1), 0);
  EXPECT_EQ(DefaultAcceleratorBudget(AcceleratorKind::kCpu, kGiB, 0, 4), kGiB);
}

// What a run holds on the accelerator beside chunks and activations, which the plan reserves:
// CudaAdam's device bytes on cuda only; the collectives' device staging and the export tile only
// with a device-memory communicator of world > 1.
TEST(PlanAcceleratorReserveTest, CountsWhatEachBackendAndCommunicatorAllocates) {
  const int64_t chunk = 24 * 1024 + 3;  // not a multiple of the alignment
  AcceleratorReserve r =
      PlanAcceleratorReserve(AcceleratorKind::kCpu, false, 1, chunk, DType::kF32, true);
  EXPECT_EQ(r.total_bytes(), 0);
  r = PlanAcceleratorReserve(AcceleratorKind::kCpu, false, 4, chunk, DType::kF32, true);
  EXPECT_EQ(r.total_bytes(), 0) << "a host communicator stages in host memory";
  r = PlanAcceleratorReserve(AcceleratorKind::kCuda, false, 1, chunk, DType::kBF16, true);
  EXPECT_EQ(r.adam_bytes, (1 << 20) + AlignUp(1024 * 8 + 8, 256));
  EXPECT_EQ(r.total_bytes(), r.adam_bytes);
  r = PlanAcceleratorReserve(AcceleratorKind::kCuda, true, 1, chunk, DType::kBF16, true);
  EXPECT_EQ(r.total_bytes(), r.adam_bytes) << "a world of one runs no collective";
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    r = PlanAcceleratorReserve(AcceleratorKind::kCuda, true, 3, chunk, dtype, false);
    // Three chunks of the compute dtype, then the scalar word (3 slots of 16 bytes), each aligned.
    EXPECT_EQ(r.comm_staging_bytes, AlignUp(3 * chunk * SizeOf(dtype), 256) + 256);
    EXPECT_EQ(r.export_tile_bytes, 0);
    r = PlanAcceleratorReserve(AcceleratorKind::kCuda, true, 3, chunk, dtype, true);
    EXPECT_EQ(r.export_tile_bytes, chunk * 4) << "one chunk of f32 at most";
    EXPECT_EQ(r.total_bytes(), r.adam_bytes + r.comm_staging_bytes + r.export_tile_bytes);
  }
  r = PlanAcceleratorReserve(AcceleratorKind::kCpu, true, 2, 64 << 20, DType::kF32, true);
  EXPECT_EQ(r.adam_bytes, 0);
  EXPECT_EQ(r.export_tile_bytes, kExportTileBytes);
}

TEST(Trainer, RejectsBadInputsBeforeAnyWork) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "bad");
  TrainConfig c = TinyConfig();
  c.steps = 0;
  EXPECT_THAT(Trainer::Create(c).status(), StatusIs(absl::StatusCode::kInvalidArgument));

  c = TinyConfig();
  c.data.train_path = dir + "/missing.bin";
  c.profile.metrics_path = dir + "/metrics.jsonl";
  EXPECT_THAT(Trainer::Create(c).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir + "/metrics.jsonl")) << "no output before the checks";

  // A token file with tokens the model's vocabulary does not have.
  std::vector<uint16_t> tokens(4096, 7);
  tokens[1000] = 300;
  ASSERT_OK(WriteTokenFile(dir + "/big_vocab.bin", tokens));
  c = TinyConfig();
  c.data.train_path = dir + "/big_vocab.bin";
  EXPECT_THAT(Trainer::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("300")));

  // A file too short for one batch.
  ASSERT_OK(WriteTokenFile(dir + "/short.bin", std::vector<uint16_t>(20, 1)));
  c.data.train_path = dir + "/short.bin";
  EXPECT_THAT(Trainer::Create(c).status(), StatusIs(absl::StatusCode::kInvalidArgument));

  // A foreign file.
  {
    std::ofstream f(dir + "/text.bin");
    f << "hello, this is not a token file\n";
  }
  c.data.train_path = dir + "/text.bin";
  EXPECT_THAT(Trainer::Create(c).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("text.bin")));

  // accelerator.backend "cuda": Trainer.CudaWithoutAGpuSaysSo.

  // A cap too small for one operator and the activations: a clear error from the first step.
  c = TinyConfig();
  c.accelerator.memory_bytes = 256 * kKiB;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(c);
  if (t.ok()) {
    EXPECT_THAT((*t)->Run(), StatusIs(absl::StatusCode::kResourceExhausted));
  } else {
    EXPECT_THAT(t.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  }
}

TEST(Trainer, TrainsOnATokenFile) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "file");
  // A repeating pattern is easy to learn.
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 20000; ++i) tokens.push_back(static_cast<uint16_t>("abcdefgh"[i % 8]));
  ASSERT_OK(WriteTokenFile(dir + "/train.bin", tokens));
  ASSERT_OK(WriteTokenFile(dir + "/val.bin",
                           std::vector<uint16_t>(tokens.begin(), tokens.begin() + 2000)));
  TrainConfig c = TinyConfig();
  c.steps = 80;
  c.data.eval_every = 80;
  c.data.train_path = dir + "/train.bin";
  c.data.val_path = dir + "/val.bin";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c));
  // ln 8 = 2.08 for a model that knows the letters but not their order.
  EXPECT_LT(t->summary().final_mean_loss, 0.5);
  ASSERT_TRUE(t->summary().last_val_loss.has_value());
  EXPECT_LT(*t->summary().last_val_loss, 0.5);
}

TEST(Trainer, MetricsAndTraceFilesHoldWhatIsPromised) {
  const std::string dir = trainer_testing::FreshTempDir("trainer_test", "files");
  TrainConfig c = TinyConfig();
  c.steps = 5;
  c.data.eval_every = 2;
  c.profile.metrics_path = dir + "/metrics.jsonl";
  c.profile.trace_path = dir + "/trace.json";
  ASSERT_OK(Train(c).status());

  std::ifstream metrics(c.profile.metrics_path);
  std::string line;
  int n = 0, with_val = 0;
  while (std::getline(metrics, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j["step"].get<int64_t>(), n);
    for (const char* key : {"loss", "lr", "loss_scale", "tokens_per_s", "step_ms", "loaded_bytes",
                            "written_back_bytes", "evictions", "accelerator", "host"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    }
    EXPECT_GT(j["accelerator"]["peak_model_bytes"].get<int64_t>(), 0);
    EXPECT_GT(j["accelerator"]["peak_non_model_bytes"].get<int64_t>(), 0);
    with_val += j.contains("val_loss") ? 1 : 0;
  }
  EXPECT_EQ(n, 5);
  EXPECT_EQ(with_val, 3);  // steps 2, 4 and the last

  const nlohmann::json trace = nlohmann::json::parse(ReadFile(c.profile.trace_path));
  ASSERT_TRUE(trace.is_array());
  std::set<std::string> threads;
  int counters = 0, loads = 0, steps = 0, warmup = 0, ops = 0;
  for (const nlohmann::json& e : trace) {
    const std::string ph = e.value("ph", "");
    const std::string name = e.value("name", "");
    if (ph == "M" && name == "thread_name") threads.insert(e["args"]["name"].get<std::string>());
    if (ph == "C" && name == "accelerator memory") ++counters;
    if (ph == "X" && absl::StartsWith(name, "load ")) ++loads;
    if (ph == "X" && absl::StartsWith(name, "step ")) ++steps;
    if (ph == "X" && name == "warm-up iteration") ++warmup;
    if (ph == "X" && absl::StrContains(name, "mlp.c_fc")) ++ops;
  }
  for (const char* track : {"operators", "optimizer", "copies h2d", "copies d2h", "steps"}) {
    EXPECT_TRUE(threads.contains(track)) << track;
  }
  EXPECT_GT(counters, 10);
  EXPECT_GT(loads, 0);
  EXPECT_EQ(steps, 5);
  EXPECT_EQ(warmup, 1);
  EXPECT_GT(ops, 0);
}

}  // namespace
}  // namespace ps
