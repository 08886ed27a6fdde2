// Configs for the trainer's end-to-end tests of the disk tier (zero_optimization.offload_optimizer
// .device "nvme"): a tiny GPT with several chunk indices, the same run with the tier, the tier's
// smallest host budget as the plan computes it, and what a swap directory holds. Test-only.
#ifndef PATRICKSTAR_TRAINER_TESTING_DISK_TIER_CONFIG_H_
#define PATRICKSTAR_TRAINER_TESTING_DISK_TIER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/config.h"

namespace ps::trainer_testing {

// A tiny GPT (2 layers, hidden 64, vocab 256, 32-token sequences, about 120K parameters) in chunks
// of 24 Ki elements (several chunk indices per type), micro batch 2, 4 steps on the shuffled
// synthetic corpus, the accelerator at the plan's minimum (chunks move), no checkpoints, no
// validation, one compute thread, without the disk tier.
TrainConfig TinyDiskConfig();

// `config` with the disk tier: swap files under `nvme_path` (an existing directory), the host
// budget `host_budget_bytes` (0: auto), read-ahead `buffer_count`.
TrainConfig WithDiskTier(TrainConfig config, const std::string& nvme_path,
                         int64_t host_budget_bytes, int64_t buffer_count = 2);

// `world` copies of `config` with the disk tier (as WithDiskTier), rank r's swap files under
// "<nvme_root>/rank<r>" (created): ranks on disks of their own. (Ranks may also share one
// directory: each has its own swap file, lock and disk probe file.)
std::vector<TrainConfig> WithDiskTierPerRank(const TrainConfig& config, int world,
                                             const std::string& nvme_root,
                                             int64_t host_budget_bytes);

// The least zero_optimization.offload_optimizer.host_budget the plan accepts for `config` on
// `world` ranks (two chunk indices' optimizer state: MemoryPlan::disk_min_host_bytes), from the
// plan the trainer makes. At it, every optimizer-state chunk streams through the swap files.
absl::StatusOr<int64_t> DiskTierMinimumBudget(const TrainConfig& config, int world);

// The names of the entries of `dir` the disk tier creates ("patrickstar-*": swap files, locks,
// probe files), sorted.
std::vector<std::string> SwapDirEntries(const std::string& dir);

}  // namespace ps::trainer_testing

#endif  // PATRICKSTAR_TRAINER_TESTING_DISK_TIER_CONFIG_H_
