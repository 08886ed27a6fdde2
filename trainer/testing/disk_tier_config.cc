#include "trainer/testing/disk_tier_config.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"

namespace ps::trainer_testing {

TrainConfig TinyDiskConfig() {
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
  c.train_micro_batch_size_per_gpu = 2;
  c.train_batch_size = 0;
  c.steps = 4;
  c.chunk.size_elems = 24 * 1024;
  c.accelerator.memory_bytes = 0;  // the plan's minimum
  c.threads = 1;
  c.steps_per_print = 1;
  c.checkpoint = CheckpointConfig{};
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 2;
  return c;
}

TrainConfig WithDiskTier(TrainConfig config, const std::string& nvme_path,
                         int64_t host_budget_bytes, int64_t buffer_count) {
  OffloadOptimizerConfig& o = config.zero_optimization.offload_optimizer;
  o.device = OffloadDevice::kNvme;
  o.nvme_path = nvme_path;
  o.host_budget_bytes = host_budget_bytes;
  o.buffer_count = buffer_count;
  return config;
}

std::vector<TrainConfig> WithDiskTierPerRank(const TrainConfig& config, int world,
                                             const std::string& nvme_root,
                                             int64_t host_budget_bytes) {
  std::vector<TrainConfig> configs;
  for (int r = 0; r < world; ++r) {
    const std::string dir = absl::StrCat(nvme_root, "/rank", r);
    std::filesystem::create_directories(dir);
    configs.push_back(WithDiskTier(config, dir, host_budget_bytes));
  }
  return configs;
}

absl::StatusOr<int64_t> DiskTierMinimumBudget(const TrainConfig& c, int world) {
  GptRunPlanOptions o;
  o.config.name = "custom";
  o.config.vocab_size = c.model.vocab_size;
  o.config.max_seq_len = c.model.max_seq_len;
  o.config.hidden = c.model.hidden;
  o.config.num_layers = c.model.num_layers;
  o.config.num_heads = c.model.num_heads;
  o.model.batch = c.train_micro_batch_size_per_gpu;
  o.model.seq_len = c.data.seq_len;
  o.model.activation_checkpointing = c.model.activation_checkpointing;
  o.model.threads = c.threads;
  o.compute_dtype = c.bf16 ? DType::kBF16 : c.fp16.enabled ? DType::kF16 : DType::kF32;
  o.world_size = world;
  o.chunk_elems = c.chunk.size_elems;
  o.accelerator_bytes = c.accelerator.memory_bytes;
  // Any explicit budget: the minimum does not depend on it.
  o.disk = GptRunPlanOptions::DiskTier{.dir = "unused", .read_ahead = 1, .host_budget_bytes = 1};
  ASSIGN_OR_RETURN(const GptRunPlan plan, PlanGptRun(o));
  if (!plan.plan.disk_tier || plan.plan.disk_min_host_bytes <= 0) {
    return absl::InternalError("the plan has no disk tier");
  }
  return plan.plan.disk_min_host_bytes;
}

std::vector<std::string> SwapDirEntries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "patrickstar-")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ps::trainer_testing
