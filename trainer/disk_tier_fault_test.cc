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
// And a run killed by a second Ctrl-C leaves no swap file behind.
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
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
#include "trainer/io/signal_flag.h"
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

// Ctrl-C twice on a run whose stop hangs: the second SIGINT kills the process (the trainer's
// handlers, trainer/io/signal_flag.h, as the binary installs them), and its swap file and lock are
// gone all the same. The run is a forked child (its own signal dispositions), killed mid-run with
// the swap open and holding state. (First in this file: forked before any test started threads.)
TEST(DiskTierSignals, ASecondSigintStillRemovesTheSwapFiles) {
  const std::string root = trainer_testing::FreshTempDir("disk_tier_fault_test", "sigint");
  TrainConfig ram = TinyDiskConfig();
  ram.steps = 1000000;  // runs until the signals
  ASSERT_OK_AND_ASSIGN(const int64_t budget, DiskTierMinimumBudget(ram, 1));
  const std::string swap = root + "/swap";
  std::filesystem::create_directories(swap);
  const TrainConfig c = WithDiskTier(ram, swap, budget);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(120);  // a child that never dies shows up as SIGALRM, not as a hang
    ::close(pipe_fds[0]);
    const int out = pipe_fds[1];
    if (!InstallStopSignalHandlers().ok()) ::_exit(1);
    TrainerEnvironment env;
    // After the first step: tell the parent (the swap holds state now). On the first SIGINT: tell
    // the parent, then hang, as a stop that never finishes.
    env.stop_requested = [out, first = true]() mutable {
      if (first) {
        first = false;
        if (::write(out, "r", 1) != 1) ::_exit(2);
      }
      if (!StopRequested()) return false;
      if (::write(out, "s", 1) != 1) ::_exit(3);
      while (true) ::pause();
    };
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(c, std::move(env));
    if (!trainer.ok()) ::_exit(4);
    (void)(*trainer)->Run();
    ::_exit(5);  // never: the steps outlast the test
  }
  ::close(pipe_fds[1]);
  bool reaped = false;
  absl::Cleanup reap = [&] {  // a failed ASSERT below leaves no child behind
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ::close(pipe_fds[0]);
  };
  char byte = 0;
  ASSERT_EQ(::read(pipe_fds[0], &byte, 1), 1) << "the child failed before its first step";
  ASSERT_EQ(byte, 'r');
  EXPECT_THAT(SwapDirEntries(swap), ::testing::IsSupersetOf({"patrickstar-swap-rank0.bin",
                                                             "patrickstar-swap-rank0.lock"}));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  ASSERT_EQ(::read(pipe_fds[0], &byte, 1), 1) << "the child did not see the first SIGINT";
  ASSERT_EQ(byte, 's');
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  reaped = true;
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT) << "killed by " << ::strsignal(WTERMSIG(status));
  EXPECT_THAT(SwapDirEntries(swap), IsEmpty()) << "swap files left after the second SIGINT";
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
