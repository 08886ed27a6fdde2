// optimizer.overlap through the whole trainer (docs/pipeline.md): a run with the key on must
// report the same losses, gradient norms and loss scales, and write the same checkpoint files and
// exported weights, byte for byte, as the run with it off — for ZeRO over two thread ranks (the
// chunks each rank owns are updated after their group's reduce-scatter, inside backward), the
// disk tier for the optimizer state, gradient accumulation (which falls back to the serialized
// step), and fp16; each with gradient clipping engaged on some steps.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "comm/communicator.h"
#include "comm/testing/thread_communicator.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "trainer/config.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

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
  c.steps = 6;
  c.chunk.size_elems = 24 * 1024 + 7;
  c.accelerator.memory_bytes = 0;  // the plan's minimum: chunks move
  c.threads = 1;
  c.checkpoint = CheckpointConfig{};
  c.checkpoint.every = 3;
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 2;
  return c;
}

struct RankResult {
  absl::Status status;
  std::vector<StepMetrics> history;
};

std::vector<RankResult> RunRanks(const TrainConfig& config, int world) {
  std::vector<std::unique_ptr<Communicator>> comms =
      world > 1 ? CreateThreadCommunicators(world, absl::Seconds(120))
                : std::vector<std::unique_ptr<Communicator>>();
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      TrainerEnvironment env;
      if (world > 1) {
        env.communicator = comms[r].get();
        env.comm_timeout = absl::Seconds(120);
      }
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, env);
      if (!trainer.ok()) {
        results[r].status = trainer.status();
        return;
      }
      results[r].status = (*trainer)->Run();
      results[r].history = (*trainer)->history();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

std::map<std::string, std::string> ReadTree(const std::string& dir) {
  std::map<std::string, std::string> files;
  if (!std::filesystem::exists(dir)) return files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    files[std::filesystem::relative(entry.path(), dir).string()] = bytes.str();
  }
  return files;
}

// The median gradient norm of an unclipped run: a threshold that clips some steps.
double MedianNorm(TrainConfig config, int world, const std::string& dir) {
  config.gradient_clipping = 0;
  config.checkpoint = CheckpointConfig{};
  if (config.zero_optimization.offload_optimizer.device == OffloadDevice::kNvme) {
    config.zero_optimization.offload_optimizer.nvme_path = dir + "/median_swap";
    std::filesystem::create_directories(config.zero_optimization.offload_optimizer.nvme_path);
  }
  const std::vector<RankResult> r = RunRanks(config, world);
  EXPECT_OK(r[0].status);
  std::vector<double> norms;
  for (const StepMetrics& m : r[0].history) {
    if (!m.skipped && std::isfinite(m.grad_norm)) norms.push_back(m.grad_norm);
  }
  std::sort(norms.begin(), norms.end());
  return norms.empty() ? 1.0 : norms[norms.size() / 2];
}

// Runs `config` with optimizer.overlap off and on and compares everything.
void ExpectSameOnAndOff(TrainConfig config, int world, const std::string& name) {
  SCOPED_TRACE(name);
  const std::string dir = trainer_testing::FreshTempDir("overlap_trainer_test", name);
  config.gradient_clipping = MedianNorm(config, world, dir);
  std::map<bool, std::vector<RankResult>> results;
  std::map<bool, std::map<std::string, std::string>> files;
  for (const bool overlap : {false, true}) {
    TrainConfig c = config;
    c.optimizer.overlap = overlap;
    const std::string sub = absl::StrCat(dir, overlap ? "/on" : "/off");
    std::filesystem::create_directories(sub);
    c.checkpoint.dir = sub + "/ckpt";
    c.checkpoint.export_path = sub + "/export.safetensors";
    if (c.zero_optimization.offload_optimizer.device == OffloadDevice::kNvme) {
      c.zero_optimization.offload_optimizer.nvme_path = sub + "/swap";
      std::filesystem::create_directories(c.zero_optimization.offload_optimizer.nvme_path);
    }
    results[overlap] = RunRanks(c, world);
    files[overlap] = ReadTree(c.checkpoint.dir);
    // The manifests hold the run's config, whose paths name the run's directory.
    for (auto& [path, bytes] : files[overlap]) {
      if (absl::EndsWith(path, "manifest.json")) bytes = absl::StrReplaceAll(bytes, {{sub, dir}});
    }
    // A LoRA run exports an adapter directory; a full run one file.
    if (std::filesystem::is_directory(c.checkpoint.export_path)) {
      for (auto& [path, bytes] : ReadTree(c.checkpoint.export_path)) {
        files[overlap]["export/" + path] = std::move(bytes);
      }
    } else {
      files[overlap]["export.safetensors"] = trainer_testing::ReadFile(c.checkpoint.export_path);
    }
  }
  int clipped = 0;
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<RankResult>& off = results[false];
    const std::vector<RankResult>& on = results[true];
    ASSERT_OK(off[r].status);
    ASSERT_OK(on[r].status);
    ASSERT_EQ(off[r].history.size(), on[r].history.size());
    ASSERT_EQ(off[r].history.size(), static_cast<size_t>(config.steps));
    for (size_t s = 0; s < off[r].history.size(); ++s) {
      const StepMetrics& a = off[r].history[s];
      const StepMetrics& b = on[r].history[s];
      EXPECT_EQ(a.loss, b.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << s;
      EXPECT_EQ(a.skipped, b.skipped) << "step " << s;
      clipped += !a.skipped && a.grad_norm >= config.gradient_clipping;
    }
  }
  EXPECT_GT(clipped, 0) << "clipping engaged on no step";
  int skipped = 0;
  for (const StepMetrics& m : results[false][0].history) skipped += m.skipped;
  LOG(INFO) << name << ": clipping engaged " << clipped << " times, " << skipped << " skipped";
  EXPECT_GT(files[false].size(), 2u) << "checkpoints were written";
  EXPECT_EQ(files[false].size(), files[true].size());
  for (const auto& [path, bytes] : files[false]) {
    EXPECT_FALSE(bytes.empty()) << path;
    EXPECT_TRUE(bytes == files[true][path]) << path << " differs with optimizer.overlap on";
  }
}

TEST(OverlapTrainer, ZeroTwoRanks) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    TrainConfig c = TinyConfig();
    c.bf16 = bf16;
    ExpectSameOnAndOff(c, 2, bf16 ? "zero_bf16" : "zero_f32");
  }
}

TEST(OverlapTrainer, DiskTier) {
  TrainConfig c = TinyConfig();
  c.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
  // Room for three chunk indices' master, momentum and variance: the rest lives in the swap.
  c.zero_optimization.offload_optimizer.host_budget_bytes = 3 * 3 * 4 * c.chunk.size_elems + 4096;
  ExpectSameOnAndOff(c, 1, "disk");
}

TEST(OverlapTrainer, GradientAccumulationAndFp16) {
  TrainConfig c = TinyConfig();
  c.gradient_accumulation_steps = 2;
  ExpectSameOnAndOff(c, 1, "accumulation");
  TrainConfig h = TinyConfig();
  h.fp16.enabled = true;
  h.fp16.initial_scale_power = 18;  // may overflow first, then comes down
  h.steps = 8;
  h.fp16.hysteresis = 1;
  ExpectSameOnAndOff(h, 1, "fp16");
}

TEST(OverlapTrainer, LoraWithActivationCheckpointing) {
  // Frozen base chunks are never speculated (no gradients); the adapters' chunks are, while the
  // recomputed forward passes run inside backward.
  TrainConfig c = TinyConfig();
  c.model.activation_checkpointing = true;
  c.optimizer.lr = 1e-2;
  LoraSettings lora;
  lora.r = 4;
  lora.lora_alpha = 8;
  lora.target_modules = {"c_attn", "c_proj"};
  c.lora = lora;
  ExpectSameOnAndOff(c, 1, "lora");
}

}  // namespace
}  // namespace ps
