// A frozen base on disk end to end through the Trainer (zero_optimization.offload_param.device
// "nvme", issue #37): a llama-tiny LoRA run (f32, bf16, and QLoRA's 4-bit nf4 base) whose frozen
// param chunks live in the disk tier's swap under a host budget of one param chunk
// (offload_param.max_in_cpu = one chunk's elements, the tier's least):
//  - the per-step losses equal the same run without it bit for bit (exact doubles);
//  - not vacuous: the plan has several frozen chunks, the swap was written and read, and the
//    frozen chunks' measured host peak stays within the planned budget (the tier's invariant);
//  - with offload_optimizer "nvme" too, one swap serves both (the same losses);
//  - a checkpoint written with the frozen base on disk resumes (with it on disk) exactly as the
//    uninterrupted run without it continues;
//  - the swap files are gone once the Trainer is; a max_in_cpu below one chunk is refused before
//    anything is allocated, naming the key.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "trainer/config.h"
#include "trainer/plan_options.h"
#include "trainer/testing/disk_tier_config.h"
#include "trainer/testing/rank_runs.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::ps::trainer_testing::RankRun;
using ::ps::trainer_testing::RunRanks;
using ::ps::trainer_testing::SwapDirEntries;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

enum class Base { kF32, kBf16, kNf4 };

std::string BaseName(Base b) {
  switch (b) {
    case Base::kF32:
      return "F32";
    case Base::kBf16:
      return "Bf16";
    case Base::kNf4:
      return "Nf4";
  }
  return "?";
}

// llama-tiny (hidden 64, 2 layers, intermediate 160) with LoRA adapters on every linear layer,
// 4 steps of micro batch 2 x 32 tokens on the synthetic corpus, in chunks small enough that the
// frozen base spans several of them.
TrainConfig TinyLoraConfig(Base base) {
  TrainConfig c = trainer_testing::TinyDiskConfig();
  c.model = TrainModelConfig{.preset = "llama-tiny"};
  c.chunk.size_elems = 16 * 1024;
  c.bf16 = base == Base::kBf16;
  c.lora = LoraSettings{};
  c.lora->r = 4;
  c.lora->lora_alpha = 8;
  c.lora->target_modules = {std::string(kLoraAllLinear)};
  if (base == Base::kNf4) {
    c.quantization.load_in_4bit = true;
    c.quantization.quant_type = Quant4Type::kNf4;
    c.quantization.double_quant = true;
  }
  return c;
}

// `c` with the frozen base on disk under `dir`, max_in_cpu `elems` (0: auto).
TrainConfig WithFrozenOnDisk(TrainConfig c, const std::string& dir, int64_t elems) {
  OffloadParamConfig& p = c.zero_optimization.offload_param;
  p.device = OffloadDevice::kNvme;
  p.nvme_path = dir;
  p.max_in_cpu = elems;
  p.buffer_count = 2;
  return c;
}

// The plan the trainer makes for `c` (one rank, the machine not read).
absl::StatusOr<RunPlan> Plan(const TrainConfig& c) {
  PlanContext context;
  ASSIGN_OR_RETURN(context.model, PlanModelFromConfig(c));
  context.threads = std::max(1, c.threads);
  return PlanRunFromConfig(c, context);
}

// One param chunk's elements: the least max_in_cpu.
absl::StatusOr<int64_t> OneChunkElems(const TrainConfig& c) {
  ASSIGN_OR_RETURN(const RunPlan run, Plan(WithFrozenOnDisk(c, "unused", 0)));
  return run.plan.plan.disk_frozen_min_host_bytes / SizeOf(run.options.compute_dtype);
}

struct Case {
  Base base;
  int64_t accumulation;
  bool optimizer_on_disk;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(BaseName(info.param.base), "_Accumulate", info.param.accumulation,
                      info.param.optimizer_on_disk ? "_OptimizerOnDiskToo" : "");
}

class FrozenDiskTrainTest : public ::testing::TestWithParam<Case> {};

TEST_P(FrozenDiskTrainTest, TrainsBitForBitAsTheRunWithTheBaseInRam) {
  const Case p = GetParam();
  const std::string dir = trainer_testing::FreshTempDir("frozen_disk_train_test", CaseName({p, 0}));
  TrainConfig ram = TinyLoraConfig(p.base);
  ram.gradient_accumulation_steps = p.accumulation;
  ASSERT_OK_AND_ASSIGN(const int64_t elems, OneChunkElems(ram));
  const std::string swap = dir + "/swap";
  std::filesystem::create_directories(swap);
  TrainConfig disk = WithFrozenOnDisk(ram, swap, elems);
  if (p.optimizer_on_disk) {
    disk.zero_optimization.offload_optimizer = {.device = OffloadDevice::kNvme,
                                                .nvme_path = swap};
  }
  // The plan: several frozen chunks, the budget one of them.
  ASSERT_OK_AND_ASSIGN(const RunPlan plan, Plan(disk));
  const MemoryPlan& m = plan.plan.plan;
  ASSERT_TRUE(m.disk_tier);
  EXPECT_GE(m.disk_frozen_chunks, 3) << "the test needs the base in several chunks";
  const int64_t budget = m.disk_frozen_host_budget_bytes;
  EXPECT_EQ(budget, m.disk_frozen_min_host_bytes);
  EXPECT_EQ(budget, elems * SizeOf(plan.options.compute_dtype));
  EXPECT_LT(m.disk_frozen_host_bytes, m.disk_frozen_chunks * m.param_chunk_bytes);
  SCOPED_TRACE(absl::StrCat("frozen host budget ", budget, " bytes, ", m.disk_frozen_chunks,
                            " frozen chunks"));

  const std::vector<RankRun> a = RunRanks(ram, 1);
  const std::vector<RankRun> b = RunRanks(disk, 1);
  ASSERT_OK(a[0].status);
  ASSERT_OK(b[0].status);
  ASSERT_EQ(b[0].losses.size(), static_cast<size_t>(ram.steps));
  EXPECT_EQ(b[0].losses, a[0].losses) << "the frozen base on disk must change no number";
  const TrainSummary& s = b[0].summary;
  EXPECT_GT(s.disk_writes, 0);
  EXPECT_GT(s.disk_reads, 0);
  EXPECT_GT(s.disk_read_bytes, 0);
  EXPECT_EQ(s.disk_frozen_host_budget_bytes, budget);
  EXPECT_GT(s.disk_frozen_peak_host_bytes, 0);
  EXPECT_LE(s.disk_frozen_peak_host_bytes, budget) << "the frozen chunks exceeded their budget";
  EXPECT_EQ(a[0].summary.disk_reads, 0);
  EXPECT_EQ(a[0].summary.disk_frozen_peak_host_bytes, 0);
  EXPECT_THAT(SwapDirEntries(swap), IsEmpty()) << "swap files left after the run";
}

INSTANTIATE_TEST_SUITE_P(Runs, FrozenDiskTrainTest,
                         ::testing::Values(Case{Base::kF32, 1, false}, Case{Base::kBf16, 2, false},
                                           Case{Base::kNf4, 1, false}, Case{Base::kNf4, 2, true}),
                         CaseName);

// A checkpoint written with the frozen base on disk, resumed with it on disk: exactly the
// uninterrupted run with the base in RAM.
TEST(FrozenDiskResume, ContinuesExactlyAsTheUninterruptedRun) {
  const std::string dir = trainer_testing::FreshTempDir("frozen_disk_train_test", "resume");
  for (const Base base : {Base::kF32, Base::kNf4}) {
    SCOPED_TRACE(BaseName(base));
    TrainConfig straight = TinyLoraConfig(base);
    straight.steps = 5;
    const std::vector<RankRun> a = RunRanks(straight, 1);
    ASSERT_OK_AND_ASSIGN(const int64_t elems, OneChunkElems(straight));
    const std::string swap = absl::StrCat(dir, "/swap", BaseName(base));
    std::filesystem::create_directories(swap);
    TrainConfig first = WithFrozenOnDisk(straight, swap, elems);
    first.checkpoint.dir = absl::StrCat(dir, "/ckpt", BaseName(base));
    TrainConfig second = first;
    second.checkpoint.resume = true;
    const std::vector<RankRun> b1 = RunRanks(first, 1, [](int, TrainerEnvironment& env) {
      env.stop_requested = [steps = 0]() mutable { return ++steps >= 2; };
    });
    const std::vector<RankRun> b2 = RunRanks(second, 1);
    ASSERT_OK(a[0].status);
    ASSERT_OK(b1[0].status);
    ASSERT_OK(b2[0].status);
    EXPECT_EQ(b1[0].summary.last_step, 2);
    EXPECT_EQ(b2[0].summary.first_step, 2);
    std::vector<double> split = b1[0].losses;
    split.insert(split.end(), b2[0].losses.begin(), b2[0].losses.end());
    EXPECT_EQ(split, a[0].losses);
    EXPECT_GT(b2[0].summary.disk_read_bytes, 0);
    EXPECT_LE(b2[0].summary.disk_frozen_peak_host_bytes, elems * SizeOf(DType::kF32));
  }
}

TEST(FrozenDiskBudget, BelowOneChunkIsRefusedNamingTheKey) {
  const std::string dir = trainer_testing::FreshTempDir("frozen_disk_train_test", "below");
  const TrainConfig ram = TinyLoraConfig(Base::kF32);
  ASSERT_OK_AND_ASSIGN(const int64_t elems, OneChunkElems(ram));
  const std::vector<RankRun> b = RunRanks(WithFrozenOnDisk(ram, dir, elems - 1), 1);
  EXPECT_FALSE(b[0].created);
  EXPECT_THAT(b[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("zero_optimization.offload_param.max_in_cpu"),
                             HasSubstr(absl::StrCat(elems - 1, " parameter elements")),
                             HasSubstr(absl::StrCat(elems, " elements")))));
  EXPECT_THAT(SwapDirEntries(dir), IsEmpty()) << "nothing written before the refusal";
}

// Auto (max_in_cpu 0): the whole base fits this machine's host, so the plan keeps all of it.
TEST(FrozenDiskBudget, AutoKeepsWhatTheHostLimitAllows) {
  TrainConfig c = WithFrozenOnDisk(TinyLoraConfig(Base::kF32), "unused", 0);
  PlanContext context;
  ASSERT_OK_AND_ASSIGN(context.model, PlanModelFromConfig(c));
  context.host_available_bytes = int64_t{64} << 30;
  ASSERT_OK_AND_ASSIGN(RunPlan roomy, PlanRunFromConfig(c, context));
  const MemoryPlan& r = roomy.plan.plan;
  EXPECT_EQ(r.disk_frozen_host_bytes, r.disk_frozen_chunks * r.param_chunk_bytes);
  EXPECT_EQ(r.disk_frozen_read_bytes_per_step, 0);
  // A host cap that leaves room for two chunks beside the rest: the budget is what it leaves.
  c.accelerator.host_memory_bytes = 0;
  context.host_available_bytes = 0;
  ASSERT_OK_AND_ASSIGN(const RunPlan whole, PlanRunFromConfig(c, context));
  const MemoryPlan& w = whole.plan.plan;
  const int64_t rest = w.host_model_data_bytes - w.disk_frozen_host_bytes;
  c.accelerator.host_memory_bytes = rest + 2 * w.param_chunk_bytes + 100;
  ASSERT_OK_AND_ASSIGN(const RunPlan capped, PlanRunFromConfig(c, context));
  EXPECT_EQ(capped.plan.plan.disk_frozen_host_budget_bytes, 2 * w.param_chunk_bytes + 100);
  EXPECT_EQ(capped.plan.plan.disk_frozen_host_bytes, 2 * w.param_chunk_bytes + 100);
  EXPECT_GT(capped.plan.plan.disk_frozen_read_bytes_per_step, 0);
  // A cap below even that: the least, one chunk (the fit check then refuses the run).
  c.accelerator.host_memory_bytes = rest;
  ASSERT_OK_AND_ASSIGN(const RunPlan tight, PlanRunFromConfig(c, context));
  EXPECT_EQ(tight.plan.plan.disk_frozen_host_budget_bytes, w.disk_frozen_min_host_bytes);
}

}  // namespace
}  // namespace ps
