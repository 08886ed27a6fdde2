// Training on example files (issue #36: trainer/run_data.h, the loss normalization of
// trainer/training_loop.cc) end to end through the Trainer, in-process on the emulated accelerator:
//  - a GPT-2 (learned positions) and a Llama (RoPE) train on packed and unpacked example files,
//    LoRA too; the console and the metrics report the step's trained targets, checked against a
//    count made here from the examples (unpacked, unshuffled rows are the examples in order);
//  - the loss is the mean over the step's trained targets: 2 micro-batches of 1 row train like 1
//    micro-batch of 2 rows, and 2 ZeRO ranks of 1 row like 1 rank of 2 rows (f32: losses within
//    2e-6 relative — summation order only — on step 1, and within 1e-4 after updates whose
//    rounding differs);
//  - stop and resume gives the losses and weights of an unbroken run bit for bit;
//  - refusals: a token-file checkpoint resumed on an example file, another packing, another
//    seq_len (each naming both values); an example file whose tokens exceed the vocabulary; an
//    example file without examples; validation rows without trained targets. data.packing on a
//    token file changes nothing (bit-identical losses).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/config.h"
#include "trainer/data/example_file.h"
#include "trainer/data/token_file.h"
#include "trainer/testing/rank_runs.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::ps::trainer_testing::FreshTempDir;
using ::ps::trainer_testing::ReadFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kSeqLen = 32;

// `count` examples of 3..45 tokens (some longer than kSeqLen: truncated) over tokens < `vocab`,
// each a masked "prompt" of 1..5 tokens, then a trained "answer" that follows a learnable rule
// (next = (7 * token + 3) mod vocab) — with, now and then, a masked token inside it.
struct Examples {
  std::vector<uint16_t> tokens;
  std::vector<int64_t> starts = {0};
  std::vector<uint8_t> trained;
  ExamplesView view() const {
    return {.tokens = TokenSpan(tokens), .starts = starts, .trained = trained};
  }
};

Examples MakeExamples(uint64_t seed, int count, int vocab) {
  std::mt19937_64 gen(seed);
  Examples ex;
  for (int e = 0; e < count; ++e) {
    const int len = 3 + static_cast<int>(gen() % 43);
    const int prompt = 1 + static_cast<int>(gen() % 5);
    uint32_t t = static_cast<uint32_t>(gen() % vocab);
    for (int i = 0; i < len; ++i) {
      ex.tokens.push_back(static_cast<uint16_t>(t));
      ex.trained.push_back(i >= prompt && gen() % 11 != 0 ? 1 : 0);
      t = i < prompt ? static_cast<uint32_t>(gen() % vocab) : (7 * t + 3) % vocab;
    }
    ex.trained[ex.trained.size() - static_cast<size_t>(len)] = 0;
    ex.starts.push_back(static_cast<int64_t>(ex.tokens.size()));
  }
  return ex;
}

// Trained targets of example e in a row of kSeqLen: positions 1..min(len, T)-1 that are trained.
int64_t TrainedOf(const Examples& ex, int64_t e) {
  const int64_t b = ex.starts[e], len = std::min<int64_t>(ex.starts[e + 1] - b, kSeqLen);
  int64_t n = 0;
  for (int64_t i = 1; i < len; ++i) n += ex.trained[static_cast<size_t>(b + i)];
  return n;
}

std::string WriteExamples(const std::string& dir, const std::string& name, const Examples& ex) {
  const std::string path = absl::StrCat(dir, "/", name, ".bin");
  const absl::Status s = WriteExampleFile(path, ex.view());
  CHECK(s.ok()) << s;
  return path;
}

// The tiny GPT-2 of grad_accumulation_test (vocab 256, 32 positions), f32, no validation.
TrainConfig TinyConfig(const std::string& train, int64_t micro_batch, int64_t accumulation) {
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{};
  c.model.vocab_size = 256;
  c.model.max_seq_len = 32;
  c.model.hidden = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.data = DataConfig{};
  c.data.train_path = train;
  c.data.seq_len = kSeqLen;
  c.data.eval_every = 0;
  c.train_micro_batch_size_per_gpu = micro_batch;
  c.gradient_accumulation_steps = accumulation;
  c.train_batch_size = 0;
  c.steps = 5;
  c.chunk.size_elems = 24 * 1024;
  c.accelerator.memory_bytes = 64 * kMiB;
  c.threads = 2;
  c.steps_per_print = 1;
  c.checkpoint = CheckpointConfig{};
  c.profile = ProfileConfig{};
  c.optimizer.lr = 3e-3;
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 0;
  return c;
}

absl::StatusOr<std::unique_ptr<Trainer>> Train(const TrainConfig& config,
                                               TrainerEnvironment env = {}) {
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, env));
  RETURN_IF_ERROR(trainer->Run());
  return trainer;
}

std::vector<double> Losses(const Trainer& t) { return trainer_testing::Losses(t); }

// GPT-2 and llama-tiny, packed and one example per row: trains (losses finite; the validation loss
// on the training examples, scored whole, falls over a few epochs), the start line describes the
// file, every progress line and metrics line gives the step's trained targets; unpacked and
// unshuffled, those are the examples' own counts.
TEST(ExampleDataTraining, TrainsPackedAndUnpackedWithTrainedTargetsReported) {
  const std::string dir = FreshTempDir("example_data_train_test", "trains");
  // 8 examples: 4 batches of 2 rows per epoch unpacked, so 8 steps are 2 epochs.
  const Examples ex = MakeExamples(1, 8, 200);
  const std::string train = WriteExamples(dir, "train", ex);
  const std::string val = train;
  for (const std::string preset : {"", "llama-tiny"}) {
    for (bool packing : {true, false}) {
      SCOPED_TRACE(absl::StrCat(preset.empty() ? "gpt2" : preset, " packing ", packing));
      TrainConfig c = TinyConfig(train, 2, 1);
      if (!preset.empty()) {
        c.model = TrainModelConfig{};
        c.model.preset = preset;
        c.chunk.size_elems = 0;
      }
      c.data.packing = packing;
      c.data.val_path = val;
      c.data.eval_every = 4;
      c.steps = 8;
      c.optimizer.lr = 2e-2;
      c.profile.metrics_path = absl::StrCat(dir, "/m_", preset, packing, ".jsonl");
      std::ostringstream out;
      TrainerEnvironment env;
      env.out = &out;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c, env));
      ASSERT_EQ(t->history().size(), 8u);
      EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("data: ", train, ", example file: 8 examples")));
      EXPECT_THAT(out.str(), HasSubstr(packing ? "(packing on)" : "(packing off)"));
      EXPECT_THAT(out.str(), HasSubstr("examples truncated to seq_len"));
      EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("validation data: ", val, ", example file")));
      const std::vector<std::string> lines =
          absl::StrSplit(ReadFile(c.profile.metrics_path), '\n', absl::SkipEmpty());
      ASSERT_EQ(lines.size(), 8u);
      for (size_t s = 0; s < 8; ++s) {
        const StepMetrics& m = t->history()[s];
        EXPECT_TRUE(std::isfinite(m.loss));
        ASSERT_TRUE(m.trained_targets.has_value());
        EXPECT_GT(*m.trained_targets, 0);
        EXPECT_EQ(nlohmann::json::parse(lines[s])["trained_targets"], *m.trained_targets);
        EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("over ", *m.trained_targets, " targets")));
        if (!packing) {
          // Rows 2s and 2s + 1 (mod 8) are examples 2s and 2s + 1 (mod 8).
          EXPECT_EQ(*m.trained_targets, TrainedOf(ex, (2 * s) % 8) + TrainedOf(ex, (2 * s + 1) % 8));
        }
      }
      EXPECT_TRUE(t->history()[3].val_loss.has_value());
      ASSERT_TRUE(t->summary().first_val_loss.has_value());
      EXPECT_LT(*t->summary().last_val_loss, 0.9 * *t->summary().first_val_loss);
    }
  }
}

// The whole step's trained targets normalize the loss: k = 2 micro-batches of 1 row is 1
// micro-batch of 2 rows (the same rows), and so are 2 ZeRO ranks of 1 row. A mean of per-batch
// means would differ whenever the rows' trained counts differ (checked: they do).
TEST(ExampleDataTraining, LossIsTheMeanOverTheStepsTrainedTargets) {
  const std::string dir = FreshTempDir("example_data_train_test", "normalization");
  const Examples ex = MakeExamples(3, 30, 200);
  const std::string train = WriteExamples(dir, "train", ex);
  TrainConfig large = TinyConfig(train, 2, 1);
  large.data.shuffle = true;
  large.optimizer.lr = 1e-2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> one, Train(large));
  TrainConfig accumulated = TinyConfig(train, 1, 2);
  accumulated.data.shuffle = true;
  accumulated.optimizer.lr = 1e-2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> acc, Train(accumulated));
  TrainConfig rank = TinyConfig(train, 1, 1);
  rank.data.shuffle = true;
  rank.optimizer.lr = 1e-2;
  const std::vector<trainer_testing::RankRun> ranks = trainer_testing::RunRanks(rank, 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (const trainer_testing::RankRun& r : ranks) ASSERT_OK(r.status);
  const std::vector<double> a = Losses(*one), b = Losses(*acc), z = ranks[0].losses;
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  ASSERT_EQ(z.size(), 5u);
  EXPECT_EQ(ranks[1].losses, z) << "every rank reports the step's loss";
  for (size_t s = 0; s < 5; ++s) {
    const double tol = (s == 0 ? 2e-6 : 1e-4) * a[s];
    EXPECT_NEAR(b[s], a[s], tol) << "step " << s + 1;
    EXPECT_NEAR(z[s], a[s], tol) << "step " << s + 1;
    EXPECT_EQ(one->history()[s].trained_targets, acc->history()[s].trained_targets);
    // The gradient is the step's too (weighting the micro-batches equally moves it by ~10%).
    EXPECT_NEAR(acc->history()[s].grad_norm, one->history()[s].grad_norm,
                1e-4 * one->history()[s].grad_norm)
        << "step " << s + 1;
  }
  // The rows of step 1 have different trained counts, so a mean of the two micro-batches' means
  // is not the step's loss: the comparison above could fail.
  TrainConfig single = TinyConfig(train, 1, 1);
  single.data.shuffle = true;
  single.steps = 2;
  single.optimizer.lr = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> s, Train(single));
  const double mean_of_means = (s->history()[0].loss + s->history()[1].loss) / 2;
  ASSERT_NE(*s->history()[0].trained_targets, *s->history()[1].trained_targets);
  EXPECT_GT(std::abs(mean_of_means - a[0]), 1e-4 * a[0]);
  const double weighted =
      (s->history()[0].loss * static_cast<double>(*s->history()[0].trained_targets) +
       s->history()[1].loss * static_cast<double>(*s->history()[1].trained_targets)) /
      static_cast<double>(*s->history()[0].trained_targets + *s->history()[1].trained_targets);
  EXPECT_NEAR(weighted, a[0], 2e-6 * a[0]);
}

// LoRA on an example file (llama-tiny, adapters on the attention): trains.
TEST(ExampleDataTraining, LoraTrainsOnAnExampleFile) {
  const std::string dir = FreshTempDir("example_data_train_test", "lora");
  const std::string train = WriteExamples(dir, "train", MakeExamples(4, 30, 200));
  TrainConfig c = TinyConfig(train, 2, 2);
  c.model = TrainModelConfig{};
  c.model.preset = "llama-tiny";
  c.model.activation_checkpointing = true;
  c.chunk.size_elems = 0;
  c.steps = 6;
  c.optimizer.lr = 2e-2;
  LoraSettings lora;
  lora.r = 4;
  lora.lora_alpha = 8;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  c.lora = lora;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Train(c));
  ASSERT_EQ(t->history().size(), 6u);
  for (const StepMetrics& m : t->history()) {
    EXPECT_TRUE(std::isfinite(m.loss));
    EXPECT_TRUE(m.trained_targets.has_value());
  }
  EXPECT_LT(t->history().back().loss, t->history().front().loss);
}

// Stop after 3 steps, resume to 6: the losses and exported weights of 6 unbroken steps, bit for
// bit (packed, shuffled, accumulation 2).
TEST(ExampleDataTraining, ResumeContinuesThePackedStreamBitForBit) {
  const std::string dir = FreshTempDir("example_data_train_test", "resume");
  const std::string train = WriteExamples(dir, "train", MakeExamples(5, 25, 200));
  TrainConfig straight = TinyConfig(train, 2, 2);
  straight.data.shuffle = true;
  straight.data.seed = 9;
  straight.steps = 6;  // 25 examples pack into fewer rows than 6 steps read: epochs wrap
  straight.checkpoint.export_path = dir + "/straight.safetensors";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> a, Train(straight));

  TrainConfig first = straight;
  first.checkpoint.dir = dir + "/split";
  first.checkpoint.export_path = "";
  first.steps = 3;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b1, Train(first));
  const nlohmann::json m =
      nlohmann::json::parse(ReadFile(dir + "/split/step-00000003/manifest.json"));
  EXPECT_EQ(m["state"]["identity"]["data_format"], "examples");
  EXPECT_EQ(m["state"]["identity"]["packing"], true);
  TrainConfig second = first;
  second.steps = 6;
  second.checkpoint.resume = true;
  second.checkpoint.export_path = dir + "/split.safetensors";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b2, Train(second));
  std::vector<double> split = Losses(*b1);
  for (double l : Losses(*b2)) split.push_back(l);
  EXPECT_EQ(Losses(*a), split);
  const std::string wa = ReadFile(straight.checkpoint.export_path);
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == ReadFile(second.checkpoint.export_path)) << "exported weights differ";

  // Another packing, another seq_len, or a token file: refused naming both values.
  TrainConfig unpacked = second;
  unpacked.data.packing = false;
  EXPECT_THAT(Train(unpacked).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("packing true (this run: false)")));
  TrainConfig shorter = second;
  shorter.data.seq_len = 16;
  EXPECT_THAT(Train(shorter).status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                HasSubstr("seq_len 32 (this run: 16)")));
}

// A checkpoint of a token-file run is refused by an example-file run, naming both kinds.
TEST(ExampleDataTraining, TokenFileCheckpointIsRefusedOnAnExampleFile) {
  const std::string dir = FreshTempDir("example_data_train_test", "kinds");
  const std::string examples = WriteExamples(dir, "train", MakeExamples(6, 20, 200));
  std::vector<uint16_t> tokens(4096);
  std::mt19937_64 gen(6);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(gen() % 200);
  const std::string token_file = dir + "/tokens.bin";
  ASSERT_OK(WriteTokenFile(token_file, tokens));
  TrainConfig on_tokens = TinyConfig(token_file, 2, 1);
  on_tokens.steps = 2;
  on_tokens.checkpoint.dir = dir + "/ckpt";
  ASSERT_OK(Train(on_tokens).status());
  TrainConfig on_examples = on_tokens;
  on_examples.data.train_path = examples;
  on_examples.steps = 4;
  on_examples.checkpoint.resume = true;
  EXPECT_THAT(Train(on_examples).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("data_format \"llm.c tokens\" (this run: \"examples\")")));
}

// data.packing means nothing to a token file: the losses are bit-identical either way.
TEST(ExampleDataTraining, PackingIsIgnoredForTokenFiles) {
  const std::string dir = FreshTempDir("example_data_train_test", "tokens");
  std::vector<uint16_t> tokens(4096);
  std::mt19937_64 gen(7);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(gen() % 200);
  const std::string token_file = dir + "/tokens.bin";
  ASSERT_OK(WriteTokenFile(token_file, tokens));
  TrainConfig c = TinyConfig(token_file, 2, 1);
  c.steps = 3;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> on, Train(c));
  c.data.packing = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> off, Train(c));
  EXPECT_EQ(Losses(*on), Losses(*off));
  EXPECT_FALSE(on->history()[0].trained_targets.has_value());
}

TEST(ExampleDataTraining, BadExampleFilesAreRefused) {
  const std::string dir = FreshTempDir("example_data_train_test", "bad");
  // A token beyond the model's vocabulary (256): named with the file.
  const std::string wide = WriteExamples(dir, "wide", MakeExamples(8, 10, 300));
  EXPECT_THAT(Trainer::Create(TinyConfig(wide, 2, 1), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(wide)));
  // No examples at all.
  Examples none;
  const std::string empty = WriteExamples(dir, "empty", none);
  EXPECT_THAT(Trainer::Create(TinyConfig(empty, 2, 1), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("training data"), HasSubstr(empty))));
  // Validation rows without a trained target: no validation loss.
  Examples masked = MakeExamples(9, 4, 200);
  std::fill(masked.trained.begin(), masked.trained.end(), 0);
  TrainConfig c = TinyConfig(WriteExamples(dir, "train", MakeExamples(10, 10, 200)), 2, 1);
  c.data.val_path = WriteExamples(dir, "masked", masked);
  c.data.eval_every = 1;
  EXPECT_THAT(Train(c).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("has no trained target")));
}

}  // namespace
}  // namespace ps
