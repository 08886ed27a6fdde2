// ZeRO data parallelism end to end: the real train binary under `mpirun -np 2` against a single
// process, on the emulated accelerator. Every launch has a watchdog.
//
//  - Same global batch, same model: 1 rank with micro-batch 2B and 2 ranks with micro-batch B
//    (f32) give the same loss at every step within 1e-5 relative (they differ only in the order
//    gradients are summed), and the same gradient norms.
//  - Each of 2 ranks holds about half the model data of the single rank (measured: the chunk
//    payloads held after the last step).
//  - Checkpoint and resume under 2 ranks is bit-exact: 2 steps, stop, resume to 4 gives the
//    losses of 4 straight steps exactly; resuming on 1 rank is refused naming world_size.
//  - Gradient accumulation: 2 ranks x 2 micro-batches of 2 train like 1 rank with batch 8 and
//    like 2 ranks with micro-batch 4 (losses 1e-5, gradient norms 1e-4 relative, same lr).
//  - DeepSpeed's train_batch_size = micro x accumulation x world size holds under 2 ranks (with
//    and without gradient_accumulation_steps), a mismatch exits 2 naming the numbers.
//  - Killing one rank (SIGKILL) makes the job exit non-zero, before the watchdog would end it.
//  - A Hugging Face Llama directory (--init_from=DIR): 2 ranks train like 1 rank, and the export
//    gathers every rank's tensors into the directory (bit-exact after a step at lr 0).
//  - LoRA (--lora_r): 2 ranks train the adapters like 1 rank over a frozen base, and the PEFT
//    export gathers the adapters into one directory equal to the single rank's.
//
// mpirun flags as comm/mpi_multiprocess_test.cc (offline, as root, 2 cores, TMPDIR=/tmp).
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/test_files.h"
#include "trainer/testing/train_process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using trainer_testing::HeldModelBytes;
using trainer_testing::ReadMetrics;
using trainer_testing::RunProgram;
using trainer_testing::RunSingle;

std::string TrainBinary() { return trainer_testing::Runfile("trainer/train"); }

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A small f32 run: 2 layers, hidden 64, sequences of 32 tokens, a cap that makes chunks move.
std::vector<std::string> Flags(int64_t micro_batch, int64_t steps) {
  return {"--model=tiny", absl::StrCat("--micro_batch_size=", micro_batch),
          absl::StrCat("--steps=", steps), "--seq_len=32", "--accelerator_memory=64MiB"};
}

SubprocessResult RunMpi(int np, std::vector<std::string> program, absl::Duration timeout) {
  std::vector<std::string> argv = {FindMpirun(), "--allow-run-as-root", "--oversubscribe",
                                   "-np",        absl::StrCat(np),      "--mca",
                                   "btl",        "self,vader"};
  argv.insert(argv.end(), program.begin(), program.end());
  return RunProgram(argv, timeout);
}

TEST(ZeroTraining, TwoRanksTrainLikeOneRankWithHalfTheModelData) {
  const std::string dir = TempDir();
  const std::string m1 = dir + "/one.jsonl", m2 = dir + "/two.jsonl";
  std::vector<std::string> one = Flags(4, 5);
  one.push_back("--metrics_out=" + m1);
  const SubprocessResult r1 = RunSingle(one, absl::Seconds(300));
  ASSERT_EQ(r1.exit_code, 0) << DescribeExit(r1) << "\n" << r1.output;
  std::vector<std::string> two = {TrainBinary()};
  for (const std::string& f : Flags(2, 5)) two.push_back(f);
  two.push_back("--metrics_out=" + m2);
  const SubprocessResult r2 = RunMpi(2, two, absl::Seconds(300));
  ASSERT_EQ(r2.exit_code, 0) << DescribeExit(r2) << "\n" << r2.output;
  EXPECT_THAT(r2.output, HasSubstr("data parallel (ZeRO): 2 ranks"));
  // Rank 0 prints, rank 1 does not.
  EXPECT_EQ(r2.output.find("== summary =="), r2.output.rfind("== summary =="));

  const std::vector<nlohmann::json> a = ReadMetrics(m1), b = ReadMetrics(m2);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["loss"], lb = b[i]["loss"];
    EXPECT_LE(std::abs(la - lb), 1e-5 * std::abs(la))
        << "step " << i + 1 << ": " << la << " vs " << lb;
    const double ga = a[i]["grad_norm"], gb = b[i]["grad_norm"];
    EXPECT_LE(std::abs(ga - gb), 1e-4 * std::abs(ga)) << "step " << i + 1;
    EXPECT_EQ(a[i]["skipped"], b[i]["skipped"]);
  }
  const int64_t single = HeldModelBytes(r1.output), rank0 = HeldModelBytes(r2.output);
  ASSERT_GT(single, 0) << r1.output;
  ASSERT_GT(rank0, 0) << r2.output;
  const double share = static_cast<double>(rank0) / static_cast<double>(single);
  EXPECT_GT(share, 0.35) << single << " vs " << rank0;
  EXPECT_LT(share, 0.65) << single << " vs " << rank0;
}

// Gradient accumulation under ZeRO: 2 ranks x 2 micro-batches of 2 sequences train like one rank
// with one batch of 8 (the same 8 windows per step: rank r reads global batches r, r + 2, ...),
// and like 2 ranks with micro-batches of 4. Gradients are reduce-scattered once per micro-batch
// (the owner accumulates its averaged shard), so the reduce-scattered bytes double with k = 2.
TEST(ZeroTraining, AccumulationUnderTwoRanksTrainsLikeOneLargeBatch) {
  const std::string dir = TempDir() + "/accumulation";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string m1 = dir + "/one.jsonl", m2 = dir + "/two_acc.jsonl", m3 = dir + "/two.jsonl";
  std::vector<std::string> one = Flags(8, 4);
  one.push_back("--metrics_out=" + m1);
  const SubprocessResult r1 = RunSingle(one, absl::Seconds(300));
  ASSERT_EQ(r1.exit_code, 0) << DescribeExit(r1) << "\n" << r1.output;
  auto two_ranks = [&](int64_t micro, int64_t k, const std::string& metrics) {
    std::vector<std::string> p = {TrainBinary()};
    for (const std::string& f : Flags(micro, 4)) p.push_back(f);
    p.push_back(absl::StrCat("--gradient_accumulation_steps=", k));
    p.push_back("--metrics_out=" + metrics);
    return RunMpi(2, p, absl::Seconds(300));
  };
  const SubprocessResult r2 = two_ranks(2, 2, m2);
  ASSERT_EQ(r2.exit_code, 0) << DescribeExit(r2) << "\n" << r2.output;
  EXPECT_THAT(r2.output, HasSubstr("global batch 8 x 32 tokens"));
  EXPECT_THAT(r2.output, HasSubstr("gradient accumulation: 2 micro-batches of 2 sequences"));
  const SubprocessResult r3 = two_ranks(4, 1, m3);
  ASSERT_EQ(r3.exit_code, 0) << DescribeExit(r3) << "\n" << r3.output;

  const std::vector<nlohmann::json> a = ReadMetrics(m1), b = ReadMetrics(m2), c = ReadMetrics(m3);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    for (const std::vector<nlohmann::json>* other : {&b, &c}) {
      const double la = a[i]["loss"], lb = (*other)[i]["loss"];
      EXPECT_LE(std::abs(la - lb), 1e-5 * std::abs(la))
          << "step " << i + 1 << ": " << la << " vs " << lb;
      const double ga = a[i]["grad_norm"], gb = (*other)[i]["grad_norm"];
      EXPECT_LE(std::abs(ga - gb), 1e-4 * std::abs(ga)) << "step " << i + 1;
      EXPECT_EQ((*other)[i]["lr"], a[i]["lr"]);
      EXPECT_EQ((*other)[i]["step"], a[i]["step"]);
    }
  }
  // "reduce-scattered X" of the summary: k = 2 moves twice the gradient bytes of k = 1.
  auto reduce_scattered = [](const std::string& out) {
    const size_t at = out.find("reduce-scattered ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find(',', at) - at);
  };
  std::cout << "k=2: " << reduce_scattered(r2.output) << "; k=1: " << reduce_scattered(r3.output)
            << "\n";
  EXPECT_FALSE(reduce_scattered(r2.output).empty()) << r2.output;
}

TEST(ZeroTraining, CheckpointAndResumeUnderTwoRanksIsBitExact) {
  const std::string dir = TempDir() + "/resume";
  std::filesystem::remove_all(dir);
  const std::string straight = dir + "/straight.jsonl", resumed = dir + "/resumed.jsonl";
  std::filesystem::create_directories(dir);
  auto program = [&](int64_t steps, const std::vector<std::string>& extra) {
    std::vector<std::string> p = {TrainBinary()};
    for (const std::string& f : Flags(2, steps)) p.push_back(f);
    p.insert(p.end(), extra.begin(), extra.end());
    return p;
  };
  SubprocessResult r = RunMpi(2, program(4, {"--metrics_out=" + straight}), absl::Seconds(300));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  r = RunMpi(2, program(2, {"--metrics_out=" + resumed, "--save_dir=" + dir + "/ckpt"}),
             absl::Seconds(300));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/step-00000002/manifest.json")) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/rank-1/step-00000002/manifest.json"))
      << r.output;
  r = RunMpi(2, program(4, {"--metrics_out=" + resumed, "--save_dir=" + dir + "/ckpt", "--resume"}),
             absl::Seconds(300));
  ASSERT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("resumed from"));
  const std::vector<nlohmann::json> a = ReadMetrics(straight), b = ReadMetrics(resumed);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(static_cast<double>(a[i]["loss"]), static_cast<double>(b[i]["loss"]))
        << "step " << i + 1;
  }
  // Another world size is refused, naming the field.
  std::vector<std::string> single = Flags(2, 6);
  single.push_back("--save_dir=" + dir + "/ckpt");
  single.push_back("--resume");
  r = RunSingle(single, absl::Seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("world_size 2 (this run: 1)"));
}

// DeepSpeed's batch arithmetic, train_batch_size = micro x accumulation x world size, checked
// once the ranks have joined: a config written for two ranks trains under `mpirun -np 2`, with
// and without gradient_accumulation_steps (absent: 1, which is what DeepSpeed derives here,
// 8 / 4 / 2); a real mismatch is refused (exit 2) naming the three numbers and the world size,
// before any step; and one process still checks the product with world size 1.
TEST(ZeroTraining, DeepSpeedBatchSizeIsCheckedWithTheWorldSize) {
  const std::string dir = TempDir() + "/batch";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto config = [&](const std::string& name, const std::string& batch_keys) {
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << R"({"model": {"preset": "tiny"}, "train_steps": 1,
        "data": {"seq_len": 32}, "accelerator": {"memory": "64MiB"}, )"
                        << batch_keys << "}";
    return path;
  };
  const std::string without_accumulation =
      config("two_ranks", R"("train_batch_size": 8, "train_micro_batch_size_per_gpu": 4)");
  const std::string with_accumulation =
      config("two_ranks_acc", R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2)");
  for (const std::string& path : {without_accumulation, with_accumulation}) {
    SCOPED_TRACE(path);
    const SubprocessResult r =
        RunMpi(2, {TrainBinary(), "--config=" + path}, absl::Seconds(300));
    EXPECT_EQ(r.exit_code, 0) << DescribeExit(r) << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("data parallel (ZeRO): 2 ranks"));
    EXPECT_THAT(r.output, HasSubstr("step     1/1"));
  }
  // A mismatch only the world size shows: 12 is a multiple of 4 x 1, but not 4 x 1 x 2.
  const std::string mismatch =
      config("mismatch", R"("train_batch_size": 12, "train_micro_batch_size_per_gpu": 4)");
  SubprocessResult r = RunMpi(2, {TrainBinary(), "--config=" + mismatch}, absl::Seconds(300));
  EXPECT_EQ(r.exit_code, 2) << DescribeExit(r) << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("12 != 4 * 1 * 2"));
  EXPECT_THAT(r.output, HasSubstr("world size (2)"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("step     1/")));  // no training step ran
  // One no world size satisfies is refused before the ranks join.
  const std::string never =
      config("never", R"("train_batch_size": 10, "train_micro_batch_size_per_gpu": 4)");
  r = RunMpi(2, {TrainBinary(), "--config=" + never}, absl::Seconds(300));
  EXPECT_EQ(r.exit_code, 2) << DescribeExit(r) << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("`train_batch_size` = 10 is not a multiple of"));
  // One process: the world size is 1, known from the start.
  r = RunSingle({"--config=" + without_accumulation}, absl::Seconds(300));
  EXPECT_EQ(r.exit_code, 2) << DescribeExit(r) << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("8 != 4 * 1 * 1"));
}

TEST(ZeroTraining, KillingOneRankEndsTheJob) {
  // Rank 1 is SIGKILLed 4 s after it starts (the shell's pid is the trainer's after exec).
  const std::string script =
      absl::StrCat("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then (sleep 4; kill -9 $$) & fi; exec ",
                   TrainBinary(), " --model=tiny --micro_batch_size=2 --seq_len=32 --steps=100000");
  // Ended by the kill (100000 steps cannot finish first), not by the watchdog. How fast it ends is
  // not asserted: on shared cores that measures the machine, not the job.
  const SubprocessResult r = RunMpi(2, {"/bin/sh", "-c", script}, absl::Seconds(120));
  EXPECT_FALSE(r.timed_out) << "the surviving rank hung:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("signal 9"));
}

// A tiny untied Llama (vocabulary 256 for the built-in corpus), GQA, llama3 rope scaling.
void WriteTinyLlama(const std::string& dir) {
  ModelConfig c;
  c.name = "tiny-llama";
  c.family = ModelFamily::kLlama;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.max_position_embeddings = 128;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64};
  c.hidden_act = HiddenAct::kSilu;
  const absl::Status s = WriteHfCheckpoint(
      dir, c, DType::kF32,
      ConvertingFill(
          [](const TensorSpec& t, int64_t first, absl::Span<float> out) -> absl::Status {
            const bool norm = t.name.find("norm") != std::string::npos;
            std::mt19937_64 gen(std::hash<std::string>()(t.name) ^ static_cast<uint64_t>(first));
            std::normal_distribution<double> normal(0.0, 0.02);
            for (float& v : out) v = norm ? 1.0f : static_cast<float>(normal(gen));
            return absl::OkStatus();
          },
          DType::kF32));
  ASSERT_TRUE(s.ok()) << s;
}

TEST(ZeroTraining, HuggingFaceLlamaDirectoryTrainsAndExportsUnderTwoRanks) {
  const std::string dir = TempDir() + "/hf_llama";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = dir + "/model";
  WriteTinyLlama(model);
  auto flags = [&](int64_t micro, int64_t steps, const std::string& tag) {
    const std::string config = absl::StrCat(dir, "/", tag, ".json");
    // No model section: the model is config.json's. The warm-up starts at lr 0.
    nlohmann::json json;
    json["checkpoint"]["export"] = absl::StrCat(dir, "/export_", tag);
    json["scheduler"] = {
        {"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 1e-3}, {"warmup_num_steps", 4}}}};
    std::ofstream(config) << json.dump();
    return std::vector<std::string>{"--init_from=" + model,
                                    "--config=" + config,
                                    absl::StrCat("--micro_batch_size=", micro),
                                    absl::StrCat("--steps=", steps),
                                    "--seq_len=32",
                                    "--accelerator_memory=64MiB",
                                    absl::StrCat("--metrics_out=", dir, "/", tag, ".jsonl")};
  };
  const SubprocessResult r1 = RunSingle(flags(4, 3, "one"), absl::Seconds(300));
  ASSERT_EQ(r1.exit_code, 0) << DescribeExit(r1) << "\n" << r1.output;
  std::vector<std::string> two = {TrainBinary()};
  for (const std::string& f : flags(2, 3, "two")) two.push_back(f);
  const SubprocessResult r2 = RunMpi(2, two, absl::Seconds(300));
  ASSERT_EQ(r2.exit_code, 0) << DescribeExit(r2) << "\n" << r2.output;
  const std::vector<nlohmann::json> a = ReadMetrics(dir + "/one.jsonl"),
                                    b = ReadMetrics(dir + "/two.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["loss"], lb = b[i]["loss"];
    EXPECT_LE(std::abs(la - lb), 1e-5 * std::abs(la)) << "step " << i + 1;
  }
  // One step at lr 0 under 2 ranks: the gathered export equals the imported files.
  std::vector<std::string> zero_lr = {TrainBinary()};
  for (const std::string& f : flags(2, 1, "lr0")) zero_lr.push_back(f);
  const SubprocessResult r3 = RunMpi(2, zero_lr, absl::Seconds(300));
  ASSERT_EQ(r3.exit_code, 0) << DescribeExit(r3) << "\n" << r3.output;
  ASSERT_EQ(ReadMetrics(dir + "/lr0.jsonl").at(0)["lr"], 0.0);
  for (const auto& entry : std::filesystem::directory_iterator(model)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(trainer_testing::ReadFile(entry.path().string()),
              trainer_testing::ReadFile(dir + "/export_lr0/" + name))
        << name;
  }
}

TEST(ZeroTraining, LoraTwoRanksTrainLikeOneRankAndGatherTheAdapter) {
  const std::string dir = TempDir() + "/lora";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto flags = [&](int64_t micro, const std::string& tag) {
    const std::string config = absl::StrCat(dir, "/", tag, ".json");
    nlohmann::json json;
    json["checkpoint"]["export"] = absl::StrCat(dir, "/adapter_", tag);
    json["optimizer"] = {{"type", "Adam"}, {"params", {{"lr", 1e-2}}}};
    std::ofstream(config) << json.dump();
    std::vector<std::string> f = Flags(micro, 3);
    for (const std::string& x : {"--config=" + config, std::string("--lora_r=4"),
                                 std::string("--lora_target_modules=c_attn,c_proj"),
                                 absl::StrCat("--metrics_out=", dir, "/", tag, ".jsonl")}) {
      f.push_back(x);
    }
    return f;
  };
  const SubprocessResult r1 = RunSingle(flags(4, "one"), absl::Seconds(300));
  ASSERT_EQ(r1.exit_code, 0) << DescribeExit(r1) << "\n" << r1.output;
  std::vector<std::string> two = {TrainBinary()};
  for (const std::string& f : flags(2, "two")) two.push_back(f);
  const SubprocessResult r2 = RunMpi(2, two, absl::Seconds(300));
  ASSERT_EQ(r2.exit_code, 0) << DescribeExit(r2) << "\n" << r2.output;
  const std::vector<nlohmann::json> a = ReadMetrics(dir + "/one.jsonl"),
                                    b = ReadMetrics(dir + "/two.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["loss"], lb = b[i]["loss"];
    EXPECT_LE(std::abs(la - lb), 1e-5 * std::abs(la)) << "step " << i + 1;
  }
  absl::StatusOr<ModelConfig> model = ModelPreset("tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<PeftAdapter> one = ReadPeftAdapter(dir + "/adapter_one", *model);
  absl::StatusOr<PeftAdapter> gathered = ReadPeftAdapter(dir + "/adapter_two", *model);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_EQ(gathered->lora, one->lora);
  ASSERT_EQ(gathered->tensors.size(), one->tensors.size());
  bool b_trained = false;
  for (const auto& [name, want] : one->tensors) {
    const std::vector<float>& got = gathered->tensors.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-4 * std::abs(want[i])) << name << "[" << i << "]";
      b_trained |= name.find("lora_B") != std::string::npos && want[i] != 0.0f;
    }
  }
  EXPECT_TRUE(b_trained);
}

}  // namespace
}  // namespace ps
