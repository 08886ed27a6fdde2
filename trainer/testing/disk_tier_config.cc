#include "trainer/testing/disk_tier_config.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/memory_plan.h"
#include "trainer/plan_options.h"

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
  // As the trainer plans rank 0 (trainer/plan_options.h), with any explicit budget: the minimum
  // does not depend on it, nor on the machine (not read).
  PlanContext context;
  ASSIGN_OR_RETURN(context.model, PlanModelFromConfig(c));
  context.world = world;
  context.threads = std::max(1, c.threads);
  ASSIGN_OR_RETURN(const RunPlan run,
                   PlanRunFromConfig(WithDiskTier(c, "unused", /*host_budget_bytes=*/1,
                                                  /*buffer_count=*/1),
                                     context));
  const MemoryPlan& plan = run.plan.plan;
  if (!plan.disk_tier || plan.disk_min_host_bytes <= 0) {
    return absl::InternalError("the plan has no disk tier");
  }
  return plan.disk_min_host_bytes;
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
