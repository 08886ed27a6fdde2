// Faults of the disk under the disk tier, end to end through the Trainer: the swap's I/O goes
// through a FaultyIoEngine (disk/testing/faulty_io_engine.h, via
// TrainerEnvironment::wrap_disk_engine_for_test) that injects, at random moments over several
// seeds, EIO, ENOSPC, reads ending early, corrupted reads — and legal short transfers throughout.
// Whatever a seed hits, the run either
//  - ends in a clean error (not OK, no crash) naming the chunk ("momentum#3") and the swap file,
//    with every loss it reported before equal to the clean run's, its swap files removed and every
//    checkpoint it committed before the fault intact: the files verify, and a run resumed from
//    the latest continues exactly as the clean run; or
//  - injected no error-making fault where it was hit and trains exactly as the clean run.
// Never an OK run with different numbers.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "disk/io_engine.h"
#include "disk/testing/faulty_io_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/config.h"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/testing/disk_tier_config.h"
#include "trainer/testing/rank_runs.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::ps::trainer_testing::DiskTierMinimumBudget;
using ::ps::trainer_testing::RankRun;
using ::ps::trainer_testing::RunRanks;
using ::ps::trainer_testing::SwapDirEntries;
using ::ps::trainer_testing::TinyDiskConfig;
using ::ps::trainer_testing::WithDiskTier;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kSteps = 6;

// The tiny model with every state chunk through the swap, a checkpoint every 2 steps, and I/O in
// 16 KiB requests (several per chunk, so short transfers and faults land mid-chunk).
absl::StatusOr<TrainConfig> FaultConfig(const std::string& dir) {
  TrainConfig ram = TinyDiskConfig();
  ram.steps = kSteps;
  absl::StatusOr<int64_t> budget = DiskTierMinimumBudget(ram, 1);
  if (!budget.ok()) return budget.status();
  std::filesystem::create_directories(dir + "/swap");
  TrainConfig c = WithDiskTier(ram, dir + "/swap", *budget);
  c.aio.block_size_bytes = 16 * kKiB;
  c.checkpoint.dir = dir + "/ckpt";
  c.checkpoint.every = 2;
  c.checkpoint.keep_last = 10;
  return c;
}

// One fault kind per seed (cycling), at a rate that lands about one or two of them in a run, or
// none; short transfers in every run.
FaultRates Rates(uint64_t seed) {
  FaultRates r;
  r.short_transfer = 0.05;
  constexpr double kRate = 0.004;
  switch (seed % 4) {
    case 0:
      r.eio = kRate;
      break;
    case 1:
      r.write_enospc = kRate;
      break;
    case 2:
      r.read_eof = kRate;
      break;
    default:
      r.corrupt_read = kRate;
  }
  return r;
}

TEST(DiskTierFaults, EndInACleanErrorNamingTheChunkAndFileOrChangeNothing) {
  const std::string root = trainer_testing::FreshTempDir("disk_tier_fault_test", "faults");
  ASSERT_OK_AND_ASSIGN(const TrainConfig clean_config, FaultConfig(root + "/clean"));
  const std::vector<RankRun> clean = RunRanks(clean_config, 1);
  ASSERT_OK(clean[0].status);
  ASSERT_EQ(clean[0].losses.size(), static_cast<size_t>(kSteps));
  ASSERT_GT(clean[0].summary.disk_reads, 0);

  const std::regex chunk_name("(master|momentum|variance)#[0-9]+");
  int failed_runs = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const FaultRates rates = Rates(seed);
    SCOPED_TRACE(absl::StrCat("seed ", seed, " (rates: eio ", rates.eio, ", write ENOSPC ",
                              rates.write_enospc, ", read EOF ", rates.read_eof, ", corrupt ",
                              rates.corrupt_read, ", short ", rates.short_transfer, ")"));
    const std::string dir = absl::StrCat(root, "/seed", seed);
    ASSERT_OK_AND_ASSIGN(const TrainConfig c, FaultConfig(dir));
    std::shared_ptr<FaultCounts> counts;
    const std::vector<RankRun> run = RunRanks(c, 1, [&](int, TrainerEnvironment& env) {
      env.wrap_disk_engine_for_test = [&counts, seed](std::unique_ptr<IoEngine> inner) {
        auto faulty = std::make_unique<FaultyIoEngine>(std::move(inner), Rates(seed), seed);
        counts = faulty->counts();
        return std::unique_ptr<IoEngine>(std::move(faulty));
      };
    });
    ASSERT_NE(counts, nullptr) << "the seam was not called";
    const std::string faults =
        absl::StrCat(counts->eios, " EIO, ", counts->write_enospcs, " ENOSPC, ", counts->read_eofs,
                     " EOF, ", counts->corrupt_reads, " corrupted, ", counts->short_transfers,
                     " short transfers injected");
    SCOPED_TRACE(faults);
    const RankRun& r = run[0];
    std::cout << "seed " << seed << ": " << faults << "; " << r.status << "\n";
    EXPECT_THAT(SwapDirEntries(c.zero_optimization.offload_optimizer.nvme_path), IsEmpty())
        << "swap files left after the run";
    // Every step reported before the end matches the clean run.
    ASSERT_LE(r.losses.size(), clean[0].losses.size());
    EXPECT_EQ(r.losses, std::vector<double>(clean[0].losses.begin(),
                                            clean[0].losses.begin() + r.losses.size()))
        << "a wrong number";
    if (r.status.ok()) {
      EXPECT_EQ(r.losses, clean[0].losses) << "an OK run with different losses";
      EXPECT_EQ(counts->errors(), 0) << "a fault that must fail its I/O was swallowed";
      continue;
    }
    ++failed_runs;
    EXPECT_GT(counts->errors(), 0) << "failed without an injected error: " << r.status;
    const std::string message(r.status.message());
    EXPECT_TRUE(std::regex_search(message, chunk_name)) << "no chunk named: " << r.status;
    EXPECT_THAT(message, HasSubstr(c.zero_optimization.offload_optimizer.nvme_path +
                                   "/patrickstar-swap-rank0.bin"))
        << "no file named";
    // The checkpoints committed before the fault are intact, and resume exactly.
    ASSERT_OK_AND_ASSIGN(const std::vector<CheckpointRef> refs, ListCheckpoints(c.checkpoint.dir));
    for (const CheckpointRef& ref : refs) EXPECT_OK(OpenCheckpoint(ref.path).status()) << ref.path;
    if (refs.empty() || refs.back().step >= kSteps) continue;
    TrainConfig resume = c;
    resume.checkpoint.resume = true;
    const std::vector<RankRun> resumed = RunRanks(resume, 1);
    ASSERT_OK(resumed[0].status);
    EXPECT_EQ(resumed[0].summary.first_step, refs.back().step);
    EXPECT_EQ(resumed[0].losses, std::vector<double>(clean[0].losses.begin() + refs.back().step,
                                                     clean[0].losses.end()))
        << "resumed from " << refs.back().path;
  }
  // Not vacuous: the rates make most seeds fail somewhere.
  EXPECT_GT(failed_runs, 0);
  std::cout << failed_runs << " of 12 seeded runs ended in an error\n";
}

}  // namespace
}  // namespace ps
