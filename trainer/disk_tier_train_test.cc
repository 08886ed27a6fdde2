// The disk tier end to end through the Trainer (zero_optimization.offload_optimizer.device
// "nvme", issue #27), on a tiny GPT with several chunk indices and the tier's host budget at its
// minimum, so that every optimizer-state chunk goes through the swap files:
//  - the run trains bit for bit as the all-in-RAM run: the same per-step losses (exact doubles)
//    and the same checkpointed training state (state.safetensors, byte for byte), in f32 and
//    bf16, on one rank and on two ZeRO ranks, with and without gradient accumulation; the disk
//    counters show the state really went through the disk;
//  - a checkpoint streamed out of the tier resumes into the tier exactly as the uninterrupted
//    all-in-RAM run continues;
//  - the swap files are gone once the Trainer is, the directory is claimed before the disk probe
//    writes there, and a second run on the same directory and rank while the first lives is
//    refused naming the other process, before it writes anything there;
//  - the aio knobs reach the I/O seam under the swap, and the engine is io_uring where the kernel
//    allows it;
//  - a host budget below the tier's minimum is refused before anything is allocated, naming the
//    key.
// Fault injection is in disk_tier_fault_test.cc; the plan's disk refusals in preflight_test.cc.
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "disk/io_engine.h"
#include "disk/testing/counting_io_engine.h"
#include "disk/testing/io_uring_gate.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/checkpoint.h"
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
using ::ps::trainer_testing::WithDiskTierPerRank;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The state.safetensors of every committed checkpoint of every rank under `root`, by
// "rank R step N".
std::vector<std::pair<std::string, std::string>> CheckpointStates(const std::string& root,
                                                                  int world) {
  std::vector<std::pair<std::string, std::string>> states;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<std::vector<CheckpointRef>> refs = ListCheckpoints(RankCheckpointRoot(root, r));
    EXPECT_OK(refs.status());
    if (!refs.ok()) continue;
    for (const CheckpointRef& ref : *refs) {
      absl::StatusOr<Checkpoint> ckpt = OpenCheckpoint(ref.path);  // verifies the checksums
      EXPECT_OK(ckpt.status()) << ref.path;
      states.emplace_back(absl::StrCat("rank ", r, " step ", ref.step),
                          trainer_testing::ReadFile(ref.path + "/state.safetensors"));
    }
  }
  return states;
}

struct Case {
  bool bf16;
  int world;
  int64_t accumulation;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(info.param.bf16 ? "Bf16" : "F32", "_", info.param.world, "Ranks_Accumulate",
                      info.param.accumulation);
}

class DiskTierTrainTest : public ::testing::TestWithParam<Case> {};

// Every state chunk on disk changes no number and no checkpointed byte.
TEST_P(DiskTierTrainTest, TrainsAndCheckpointsBitForBitAsTheAllInRamRun) {
  const Case p = GetParam();
  const std::string dir = trainer_testing::FreshTempDir("disk_tier_train_test", CaseName({p, 0}));
  TrainConfig ram = TinyDiskConfig();
  ram.bf16 = p.bf16;
  ram.gradient_accumulation_steps = p.accumulation;
  ram.checkpoint.every = 2;
  ram.checkpoint.keep_last = 10;
  ram.checkpoint.dir = dir + "/ram";
  ASSERT_OK_AND_ASSIGN(const int64_t budget, DiskTierMinimumBudget(ram, p.world));
  TrainConfig disk_config = ram;
  disk_config.checkpoint.dir = dir + "/disk";
  // Every rank in one directory, as mpirun's ranks on one machine would run (each rank has its own
  // swap file, lock and disk probe).
  const std::string swap = dir + "/swap";
  std::filesystem::create_directories(swap);
  const std::vector<TrainConfig> disk(p.world, WithDiskTier(disk_config, swap, budget));
  SCOPED_TRACE(absl::StrCat("host budget ", budget, " bytes (the tier's minimum)"));

  const std::vector<RankRun> a = RunRanks(ram, p.world);
  const std::vector<RankRun> b = RunRanks(disk);
  for (int r = 0; r < p.world; ++r) {
    EXPECT_OK(a[r].status) << "rank " << r;
    EXPECT_OK(b[r].status) << "rank " << r;
  }
  if (HasFailure()) return;
  for (int r = 0; r < p.world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_EQ(b[r].losses.size(), static_cast<size_t>(ram.steps));
    EXPECT_EQ(b[r].losses, a[r].losses) << "the disk tier must change no number";
    // Not vacuous: the state went to disk and came back, every step.
    const TrainSummary& s = b[r].summary;
    EXPECT_GT(s.disk_writes, 0);
    EXPECT_GT(s.disk_reads, 0);
    EXPECT_GT(s.disk_read_bytes, 0);
    EXPECT_GT(s.disk_write_bytes, 0);
    EXPECT_LE(s.disk_peak_host_bytes, budget) << "the tier held more than its budget";
    EXPECT_EQ(s.disk_engine, ExpectedAutoEngine()) << "io_uring where the kernel allows it";
    EXPECT_EQ(a[r].summary.disk_reads, 0) << "the all-in-RAM run has no disk tier";
  }
  const auto states_a = CheckpointStates(ram.checkpoint.dir, p.world);
  const auto states_b = CheckpointStates(disk_config.checkpoint.dir, p.world);
  ASSERT_EQ(states_a.size(), static_cast<size_t>(p.world * ram.steps / ram.checkpoint.every));
  ASSERT_EQ(states_b.size(), states_a.size());
  for (size_t i = 0; i < states_a.size(); ++i) {
    EXPECT_EQ(states_b[i].first, states_a[i].first);
    EXPECT_FALSE(states_a[i].second.empty());
    EXPECT_TRUE(states_b[i].second == states_a[i].second)
        << states_b[i].first << ": the checkpointed training state differs";
  }
  for (const TrainConfig& c : disk) {
    EXPECT_THAT(SwapDirEntries(c.zero_optimization.offload_optimizer.nvme_path), IsEmpty())
        << "swap files left after the run";
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, DiskTierTrainTest,
                         ::testing::Values(Case{false, 1, 1}, Case{true, 1, 2}, Case{false, 2, 2},
                                           Case{true, 2, 1}),
                         CaseName);

// A checkpoint streamed out of the tier, resumed into the tier: exactly the uninterrupted
// all-in-RAM run.
TEST(DiskTierResume, ContinuesExactlyAsTheUninterruptedAllInRamRun) {
  const std::string dir = trainer_testing::FreshTempDir("disk_tier_train_test", "resume");
  for (const int world : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    TrainConfig straight = TinyDiskConfig();
    straight.steps = 6;
    straight.bf16 = world == 2;
    const std::vector<RankRun> a = RunRanks(straight, world);

    ASSERT_OK_AND_ASSIGN(const int64_t budget, DiskTierMinimumBudget(straight, world));
    TrainConfig with_checkpoints = straight;
    with_checkpoints.checkpoint.dir = absl::StrCat(dir, "/ckpt", world);
    const std::vector<TrainConfig> first =
        WithDiskTierPerRank(with_checkpoints, world, absl::StrCat(dir, "/swap", world), budget);
    std::vector<TrainConfig> second = first;
    for (TrainConfig& c : second) c.checkpoint.resume = true;
    // Stopped after step 3 (as by a signal: every rank agrees), which writes a checkpoint.
    const std::vector<RankRun> b1 = RunRanks(first, [](int, TrainerEnvironment& env) {
      env.stop_requested = [steps = 0]() mutable { return ++steps >= 3; };
    });
    const std::vector<RankRun> b2 = RunRanks(second);
    for (int r = 0; r < world; ++r) {
      EXPECT_OK(a[r].status) << "rank " << r;
      EXPECT_OK(b1[r].status) << "rank " << r;
      EXPECT_OK(b2[r].status) << "rank " << r;
    }
    if (HasFailure()) return;
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      EXPECT_EQ(b1[r].summary.last_step, 3);
      EXPECT_EQ(b2[r].summary.first_step, 3);
      std::vector<double> split = b1[r].losses;
      split.insert(split.end(), b2[r].losses.begin(), b2[r].losses.end());
      EXPECT_EQ(split, a[r].losses);
      EXPECT_GT(b2[r].summary.disk_read_bytes, 0);
    }
  }
}

// The names of the entries created in a directory while it is watched (inotify), in order.
class CreatedEntries {
 public:
  explicit CreatedEntries(const std::string& dir) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    CHECK_GE(fd_, 0) << "inotify_init1: " << ::strerror(errno);
    CHECK_GE(::inotify_add_watch(fd_, dir.c_str(), IN_CREATE), 0)
        << dir << ": " << ::strerror(errno);
  }
  ~CreatedEntries() { ::close(fd_); }
  CreatedEntries(const CreatedEntries&) = delete;
  CreatedEntries& operator=(const CreatedEntries&) = delete;

  // The entries created since the last call.
  std::vector<std::string> Take() {
    std::vector<std::string> names;
    alignas(inotify_event) char buffer[64 * 1024];
    while (true) {
      const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
      if (n <= 0) break;
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        EXPECT_EQ(event->mask & IN_Q_OVERFLOW, 0u) << "inotify lost events";
        if (event->len > 0) names.emplace_back(event->name);
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    return names;
  }

 private:
  int fd_;
};

TEST(DiskTierSwapFiles, AreRemovedAfterTheRunAndASecondRunOnTheDirectoryIsRefused) {
  const std::string swap = trainer_testing::FreshTempDir("disk_tier_train_test", "swap_files");
  TrainConfig ram = TinyDiskConfig();
  ASSERT_OK_AND_ASSIGN(const int64_t budget, DiskTierMinimumBudget(ram, 1));
  const TrainConfig c = WithDiskTier(ram, swap, budget);
  CreatedEntries created(swap);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> first, Trainer::Create(c));
    EXPECT_THAT(SwapDirEntries(swap), Contains(HasSubstr("patrickstar-swap-rank0")))
        << "the tier's swap file and lock while the run lives";
    // The directory is claimed (the lock file) before the disk probe writes its file there.
    const std::vector<std::string> names = created.Take();
    const auto lock = std::find(names.begin(), names.end(), "patrickstar-swap-rank0.lock");
    const auto probe = std::find_if(names.begin(), names.end(), [](const std::string& name) {
      return absl::StartsWith(name, "patrickstar-probe-");
    });
    ASSERT_NE(lock, names.end()) << absl::StrJoin(names, ", ");
    ASSERT_NE(probe, names.end()) << "the disk probe ran elsewhere? " << absl::StrJoin(names, ", ");
    EXPECT_LT(lock - names.begin(), probe - names.begin())
        << "probed before the claim: " << absl::StrJoin(names, ", ");
    // The same directory and rank while the first run lives (its lock is held per open file, so
    // also within one process): refused before its probe writes anything there.
    EXPECT_THAT(Trainer::Create(c).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr(swap), HasSubstr(absl::StrCat("process ", ::getpid())))));
    EXPECT_THAT(created.Take(), IsEmpty()) << "the refused run wrote into the directory";
    ASSERT_OK(first->Run());
    EXPECT_GT(first->summary().disk_reads, 0);
  }
  EXPECT_THAT(SwapDirEntries(swap), IsEmpty()) << "swap files left after the Trainer is gone";
  // The directory is free again.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> again, Trainer::Create(c));
}

// DeepSpeed's aio knobs, from the config to the I/O seam under the swap (a CountingIoEngine via
// TrainerEnvironment::wrap_disk_engine_for_test), in two settings that differ in every knob from
// each other and from the defaults: block_size sizes the requests, queue_depth bounds and fills
// what is in flight, single_submit submits one request per call, overlap_events reaps one
// completion at a time (without it, whole batches). Chunks are 96 KiB (24 Ki f32 elements): more
// requests than the queue is deep. (thread_count sizes the thread engine: disk/
// file_chunk_swap_test.cc; the trainer's engine is io_uring where the kernel allows it.)
TEST(DiskTierAio, KnobsFromTheConfigReachTheSwapEngine) {
  const std::string root = trainer_testing::FreshTempDir("disk_tier_train_test", "aio");
  TrainConfig ram = TinyDiskConfig();
  ram.steps = 2;
  ASSERT_OK_AND_ASSIGN(const int64_t budget, DiskTierMinimumBudget(ram, 1));
  struct Knobs {
    int64_t block_size_bytes;
    int64_t queue_depth;
    bool single_submit;
    bool overlap_events;
  };
  for (const Knobs k : {Knobs{8 * kKiB, 3, true, false}, Knobs{16 * kKiB, 5, false, true}}) {
    SCOPED_TRACE(absl::StrCat("block_size ", k.block_size_bytes, ", queue_depth ", k.queue_depth,
                              ", single_submit ", k.single_submit, ", overlap_events ",
                              k.overlap_events));
    const std::string swap = absl::StrCat(root, "/swap", k.queue_depth);
    std::filesystem::create_directories(swap);
    TrainConfig c = WithDiskTier(ram, swap, budget);
    c.aio.block_size_bytes = k.block_size_bytes;
    c.aio.queue_depth = k.queue_depth;
    c.aio.single_submit = k.single_submit;
    c.aio.overlap_events = k.overlap_events;
    std::shared_ptr<IoRecords> records;
    const std::vector<RankRun> run = RunRanks(c, 1, [&records](int, TrainerEnvironment& env) {
      env.wrap_disk_engine_for_test = [&records](std::unique_ptr<IoEngine> inner) {
        auto counting = std::make_unique<CountingIoEngine>(std::move(inner));
        records = counting->records();
        return std::unique_ptr<IoEngine>(std::move(counting));
      };
    });
    ASSERT_OK(run[0].status);
    EXPECT_EQ(run[0].summary.disk_engine, ExpectedAutoEngine());
    ASSERT_NE(records, nullptr) << "the seam was not called";
    const IoRecords& r = *records;  // the run is over: nothing in flight
    EXPECT_GT(r.allocate_calls, 0);
    ASSERT_FALSE(r.requests.empty());
    int64_t full_blocks = 0;
    for (const IoRecords::Request& q : r.requests) {
      EXPECT_LE(q.bytes, k.block_size_bytes);
      full_blocks += q.bytes == k.block_size_bytes ? 1 : 0;
    }
    EXPECT_GT(full_blocks, static_cast<int64_t>(r.requests.size()) / 2);
    EXPECT_EQ(r.max_in_flight, k.queue_depth);
    EXPECT_EQ(r.in_flight, 0);
    for (const IoRecords::Submission& s : r.submissions) {
      EXPECT_LE(s.in_flight_before + s.requests, k.queue_depth);
    }
    if (k.single_submit) {
      EXPECT_EQ(r.submissions.size(), r.requests.size());
    } else {
      EXPECT_LT(r.submissions.size(), r.requests.size());
    }
    bool waited_for_one_of_several = false;
    for (const IoRecords::Reaping& p : r.reapings) {
      if (k.overlap_events) {
        EXPECT_EQ(p.min_completions, 1);
        waited_for_one_of_several |= p.in_flight > 1;
      } else {
        EXPECT_EQ(p.min_completions, p.in_flight);
      }
    }
    EXPECT_EQ(waited_for_one_of_several, k.overlap_events);
  }
}

TEST(DiskTierHostBudget, BelowTheTiersMinimumIsRefusedBeforeAnythingIsAllocated) {
  const std::string swap = trainer_testing::FreshTempDir("disk_tier_train_test", "budget");
  TrainConfig ram = TinyDiskConfig();
  for (const int world : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    ASSERT_OK_AND_ASSIGN(const int64_t budget, DiskTierMinimumBudget(ram, world));
    for (const int64_t too_small : {int64_t{1}, budget - 1}) {
      const std::vector<RankRun> runs = RunRanks(WithDiskTierPerRank(ram, world, swap, too_small));
      for (const RankRun& run : runs) {
        EXPECT_FALSE(run.created) << "refused by Create, before any work";
        EXPECT_THAT(run.status,
                    StatusIs(absl::StatusCode::kResourceExhausted,
                             AllOf(HasSubstr("zero_optimization.offload_optimizer.host_budget"),
                                   HasSubstr(absl::StrCat(too_small, " bytes")),
                                   HasSubstr(absl::StrCat(budget, " bytes")),
                                   HasSubstr("Nothing was allocated"))));
      }
      for (int r = 0; r < world; ++r) {
        EXPECT_THAT(SwapDirEntries(absl::StrCat(swap, "/rank", r)), IsEmpty())
            << "refused before the swap was opened";
      }
    }
  }
}

}  // namespace
}  // namespace ps
