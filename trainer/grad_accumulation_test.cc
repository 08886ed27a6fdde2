// Gradient accumulation end to end through the Trainer (in-process, one rank; the two-rank runs
// are in zero_multiprocess_test.cc): k micro-batches of b sequences train like one batch of k*b
// (f32: losses, gradient norms, learning rates and the final master weights within f32 rounding,
// on the synthetic corpus with shuffling, under an accelerator cap below the model data); a
// resume at a step boundary is bit-exact; f16 and bf16 runs train; steps, tokens and the data
// cursor count optimizer steps.
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gpt2_checkpoint.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::ps::trainer_testing::ReadFile;
using ::testing::HasSubstr;

// trainer_test.cc's tiny model (2 layers, hidden 64, 32-token sequences) under a 1.5 MiB cap,
// below its model data: every micro-batch moves chunks.
TrainConfig TinyConfig(int64_t micro_batch, int64_t accumulation) {
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{};
  c.model.vocab_size = 256;
  c.model.max_seq_len = 32;
  c.model.hidden = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.data.seq_len = 32;
  c.data.shuffle = true;
  c.data.eval_every = 0;
  c.train_micro_batch_size_per_gpu = micro_batch;
  c.gradient_accumulation_steps = accumulation;
  c.train_batch_size = 0;
  c.steps = 6;
  c.chunk.size_elems = 24 * 1024;
  c.accelerator.memory_bytes = 1536 * kKiB;
  c.threads = 2;
  c.steps_per_print = 1;
  c.checkpoint = CheckpointConfig{};
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 3;
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

// Every tensor of an exported GPT-2 file, by name.
std::vector<std::pair<std::string, std::vector<float>>> ReadWeights(const std::string& path) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  absl::StatusOr<Gpt2Checkpoint> ckpt = Gpt2Checkpoint::Open(path);
  EXPECT_OK(ckpt.status());
  if (!ckpt.ok()) return out;
  for (const Gpt2TensorSpec& s : ckpt->specs()) {
    absl::StatusOr<std::vector<float>> v = ckpt->ReadF32(s.name);
    EXPECT_OK(v.status());
    if (v.ok()) out.emplace_back(s.name, std::move(*v));
  }
  return out;
}

TEST(GradientAccumulation, MicroBatchesTrainLikeOneLargeBatchInF32) {
  const std::string dir = trainer_testing::FreshTempDir("grad_accumulation_test", "f32");
  for (const auto& [b, k] : {std::pair<int64_t, int64_t>{2, 3}, {1, 4}}) {
    SCOPED_TRACE(absl::StrCat(k, " x ", b));
    // The large batch's activations do not fit under the cap the micro-batches train in (what
    // accumulation is for); the cap never changes the numbers (trainer_test.cc).
    TrainConfig large = TinyConfig(k * b, 1);
    large.accelerator.memory_bytes = 64 * kMiB;
    large.checkpoint.export_path = absl::StrCat(dir, "/large_", k, ".safetensors");
    TrainConfig accumulated = TinyConfig(b, k);
    accumulated.checkpoint.export_path = absl::StrCat(dir, "/accumulated_", k, ".safetensors");
    std::ostringstream out;
    TrainerEnvironment env;
    env.out = &out;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> one, Train(large));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> acc, Train(accumulated, env));
    EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("gradient accumulation: ", k,
                                                  " micro-batches of ", b, " sequences")));
    EXPECT_GT(acc->summary().loaded_bytes, 0) << "the cap must make chunks move";
    ASSERT_EQ(one->history().size(), 6u);
    ASSERT_EQ(acc->history().size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      const StepMetrics& x = one->history()[i];
      const StepMetrics& y = acc->history()[i];
      EXPECT_EQ(y.step, static_cast<int64_t>(i) + 1);
      // The loss is computed before the update: step 1's losses differ only by summation order;
      // later ones also by the (rounding-level) differences of the updates before them.
      EXPECT_NEAR(x.loss, y.loss, 2e-6 * x.loss) << "step " << i + 1;
      EXPECT_NEAR(x.grad_norm, y.grad_norm, 1e-4 * x.grad_norm) << "step " << i + 1;
      EXPECT_EQ(x.lr, y.lr) << "the schedule counts optimizer steps";
      EXPECT_FALSE(y.skipped);
    }
    EXPECT_EQ(acc->summary().tokens, one->summary().tokens);
    EXPECT_EQ(acc->summary().tokens, 6 * k * b * 32);
    // The master weights: within f32 rounding of the update. Adam's step is lr * m / sqrt(v),
    // whose rounding-level gradient differences can move a weight by a small fraction of lr
    // per step.
    const auto wa = ReadWeights(large.checkpoint.export_path);
    const auto wb = ReadWeights(accumulated.checkpoint.export_path);
    ASSERT_EQ(wa.size(), wb.size());
    ASSERT_FALSE(wa.empty());
    double max_diff = 0, max_moved = 0;
    const auto initial = [&] {
      TrainConfig c = TinyConfig(b, k);
      c.steps = 1;
      c.optimizer.lr = 0;
      c.scheduler.warmup_num_steps = 0;
      c.checkpoint.export_path = absl::StrCat(dir, "/initial.safetensors");
      EXPECT_OK(Train(c).status());
      return ReadWeights(c.checkpoint.export_path);
    }();
    for (size_t t = 0; t < wa.size(); ++t) {
      ASSERT_EQ(wa[t].first, wb[t].first);
      ASSERT_EQ(wa[t].second.size(), wb[t].second.size());
      for (size_t e = 0; e < wa[t].second.size(); ++e) {
        max_diff = std::max<double>(max_diff, std::abs(wa[t].second[e] - wb[t].second[e]));
        if (t < initial.size()) {
          max_moved = std::max<double>(max_moved, std::abs(wa[t].second[e] - initial[t].second[e]));
        }
      }
    }
    std::cout << k << " x " << b << ": master weights differ by at most " << max_diff
              << "; the largest move over the run is " << max_moved << "\n";
    EXPECT_GT(max_moved, 1e-4) << "the run must have trained";
    EXPECT_LE(max_diff, 1e-3 * max_moved);
  }
}

// Without the division by k the accumulated run would take k times larger gradients: its
// gradient norm would be k times the large batch's (a check that the comparison above can fail).
TEST(GradientAccumulation, GradientNormIsOfTheMeanNotTheSum) {
  TrainConfig large = TinyConfig(4, 1);
  large.accelerator.memory_bytes = 64 * kMiB;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> one, Train(large));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> acc, Train(TinyConfig(1, 4)));
  const double a = one->history()[0].grad_norm, b = acc->history()[0].grad_norm;
  EXPECT_NEAR(a, b, 1e-5 * a);
  EXPECT_GT(std::abs(4 * a - b), 1.0 * a);
}

TEST(GradientAccumulation, ResumeAtAStepBoundaryIsBitExact) {
  const std::string dir = trainer_testing::FreshTempDir("grad_accumulation_test", "resume");
  TrainConfig straight = TinyConfig(1, 3);
  straight.steps = 6;
  straight.checkpoint.export_path = dir + "/straight.safetensors";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> a, Train(straight));

  TrainConfig first = straight;
  first.checkpoint.dir = dir + "/split";
  first.checkpoint.every = 3;
  first.checkpoint.export_path = "";
  first.steps = 3;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b1, Train(first));
  // The checkpoint is at a step boundary: its data cursor counts 3 steps of 3 micro-batches.
  const std::string manifest = ReadFile(dir + "/split/step-00000003/manifest.json");
  ASSERT_FALSE(manifest.empty());
  const nlohmann::json m = nlohmann::json::parse(manifest);
  EXPECT_EQ(m["step"], 3);
  EXPECT_EQ(m["state"]["adam_step"], 3);
  EXPECT_EQ(m["state"]["data_cursor"]["batch_in_epoch"], 9) << manifest;
  TrainConfig second = first;
  second.steps = 6;
  second.checkpoint.resume = true;
  second.checkpoint.export_path = dir + "/split.safetensors";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b2, Train(second));
  EXPECT_EQ(b2->summary().first_step, 3);
  std::vector<double> split = Losses(*b1);
  for (double l : Losses(*b2)) split.push_back(l);
  EXPECT_EQ(Losses(*a), split);
  const std::string wa = ReadFile(straight.checkpoint.export_path);
  const std::string wb = ReadFile(second.checkpoint.export_path);
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "exported weights differ";
}

// f16 (dynamic loss scale: the overflow check covers every micro-batch) and bf16 train with
// accumulation; the loss falls.
TEST(GradientAccumulation, F16AndBf16Train) {
  for (const bool fp16 : {true, false}) {
    SCOPED_TRACE(fp16 ? "fp16" : "bf16");
    TrainConfig c = TinyConfig(2, 2);
    c.steps = 30;
    c.optimizer.lr = 3e-3;
    c.fp16.enabled = fp16;
    c.bf16 = !fp16;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c));
    const TrainSummary& s = t->summary();
    EXPECT_EQ(s.last_step, 30);
    EXPECT_LT(s.final_mean_loss, s.first_loss - 0.5);
  }
}

}  // namespace
}  // namespace ps
