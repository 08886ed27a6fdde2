// The trainer's pre-flight memory plan (model/gpt_activation_profile.h PlanGptRun, called before
// anything is allocated): random tiny shapes x dtypes x caps at and just below the plan's minimum
// either train within the cap or are refused up front — never an out-of-memory mid-run; a shape
// whose parameters cannot fit this machine's memory is refused before allocating (it used to
// abort with std::bad_alloc); gpt2's automatic chunk size gives at least 20 chunks per type; the
// disk tier's swap files that do not fit their filesystem are refused up front, naming the
// directory and the numbers (the plan's check, and the trainer on a size-limited tmpfs).
#include <sys/mount.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/model_config.h"
#include "trainer/config.h"
#include "trainer/plan_options.h"
#include "trainer/testing/disk_tier_config.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TrainConfig Shape(std::mt19937_64& rng, DType* dtype) {
  const auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  TrainConfig c = DefaultTrainConfig();
  c.model = TrainModelConfig{};
  c.model.num_heads = uniform(1, 3);
  c.model.hidden = c.model.num_heads * 8 * uniform(1, 4);
  c.model.vocab_size = uniform(256, 700);  // >= the synthetic corpus's 256 tokens; odd sizes
  c.model.max_seq_len = uniform(8, 40);
  c.model.num_layers = uniform(1, 3);
  c.model.activation_checkpointing = uniform(0, 1) == 1;
  c.data.seq_len = uniform(4, c.model.max_seq_len);
  c.train_micro_batch_size_per_gpu = uniform(1, 3);
  c.train_batch_size = 0;
  c.steps = 3;
  c.chunk.size_elems = 0;  // auto
  c.threads = 2;
  c.data.eval_every = 0;
  c.data.eval_batches = 1;
  c.checkpoint = CheckpointConfig{};
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 1;
  const int d = static_cast<int>(uniform(0, 2));
  *dtype = d == 0 ? DType::kF32 : d == 1 ? DType::kBF16 : DType::kF16;
  c.bf16 = *dtype == DType::kBF16;
  c.fp16.enabled = *dtype == DType::kF16;
  return c;
}

// The plan the trainer makes for `c` (trainer/plan_options.h, as Trainer::Create plans it; the
// machine unread: its accelerator numbers do not depend on it). `dtype` is c's compute dtype.
GptRunPlan Plan(const TrainConfig& c, DType dtype) {
  CHECK(ComputeDType(c.precision()) == dtype);
  PlanContext context;
  absl::StatusOr<ModelConfig> model = PlanModelFromConfig(c);
  CHECK(model.ok()) << model.status();
  context.model = *model;
  context.threads = c.threads;
  absl::StatusOr<RunPlan> run = PlanRunFromConfig(c, context);
  CHECK(run.ok()) << run.status();
  return run->plan;
}

TEST(Preflight, RandomShapesTrainWithinThePlansMinimumOrAreRefusedUpFront) {
  std::mt19937_64 rng(20261124);
  for (int trial = 0; trial < 12; ++trial) {
    DType dtype;
    TrainConfig c = Shape(rng, &dtype);
    c.accelerator.memory_bytes = 64 * kMiB;
    const int64_t min_bytes = Plan(c, dtype).plan.min_accelerator_bytes;
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", DTypeName(dtype), " hidden ", c.model.hidden,
                              " layers ", c.model.num_layers, " vocab ", c.model.vocab_size,
                              " batch ", c.train_micro_batch_size_per_gpu, " x ", c.data.seq_len,
                              " checkpointing ", c.model.activation_checkpointing,
                              "; plan minimum ", min_bytes));
    // Just below the minimum: refused before anything is allocated, naming the minimum.
    c.accelerator.memory_bytes = min_bytes - 4 * kKiB;
    const int64_t below_minimum = Plan(c, dtype).plan.min_accelerator_bytes;
    if (below_minimum > c.accelerator.memory_bytes) {
      EXPECT_THAT(Trainer::Create(c).status(),
                  StatusIs(absl::StatusCode::kResourceExhausted,
                           AllOf(HasSubstr("does not fit the accelerator"),
                                 HasSubstr("--accelerator_memory="))));
    }
    // At the minimum (as planned at that cap): trains every step within the cap.
    c.accelerator.memory_bytes = AlignUp(min_bytes, 4 * kKiB);
    for (int i = 0; i < 3 && Plan(c, dtype).plan.min_accelerator_bytes > c.accelerator.memory_bytes;
         ++i) {
      c.accelerator.memory_bytes = AlignUp(Plan(c, dtype).plan.min_accelerator_bytes, 4 * kKiB);
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c));
    ASSERT_OK(trainer->Run());
    EXPECT_LE(trainer->summary().accelerator_peak_total_bytes, c.accelerator.memory_bytes);
    // The plan's segments and slack reach the allocator and the manager: no emergency eviction.
    EXPECT_EQ(trainer->summary().pressure_reclaims, 0);
  }
}

// Issue 12: preset 1B in bf16 under 2 GiB finished the warm-up, then ran out of accelerator memory
// (trainer/activation_profile_match_test reproduces the mechanism at a tiny shape). At the plan
// level for the real preset: it fits; the activation segments are sized to the budget; the slack
// the manager reserves covers every byte the segments strand in the replay (the bytes a manager
// without slack fills with chunks after the warm-up), and the warm-up share leaves room for the
// highest activation peak plus that slack.
TEST(Preflight, Preset1BInBf16Under2GiBKeepsRoomForWhatItsSegmentsStrand) {
  GptRunPlanOptions o;
  ASSERT_OK_AND_ASSIGN(o.config, GptPreset("1B"));
  o.model.batch = 1;
  o.model.seq_len = 64;
  o.model.activation_checkpointing = true;
  o.model.threads = 2;
  o.compute_dtype = DType::kBF16;
  o.accelerator_bytes = 2 * kGiB;
  ASSERT_OK_AND_ASSIGN(const GptRunPlan run, PlanGptRun(o));
  const MemoryPlan& p = run.plan;
  EXPECT_TRUE(p.fits_accelerator);
  EXPECT_EQ(run.scratch.small_segment_bytes, 2 * kMiB);
  EXPECT_GT(p.stranded_bytes, 0);
  EXPECT_GE(p.slack_bytes, p.stranded_bytes + run.scratch.small_segment_bytes);
  for (const PlannedMoment& m : p.moments) {
    EXPECT_LE(m.stranded_bytes, p.slack_bytes);
  }
  EXPECT_LE(p.warmup_chunk_fraction * static_cast<double>(run.accelerator_bytes) +
                static_cast<double>(p.activation_peak_bytes + p.slack_bytes),
            static_cast<double>(run.accelerator_bytes));
  // The host: 1B's model data is 14 bytes per parameter plus the chunks' padding.
  EXPECT_GE(p.host_model_data_bytes, 14 * p.parameters);
  EXPECT_LT(p.host_expected_peak_bytes, p.host_peak_bytes);
}

// A config training `model` on one sequence of `seq_len` tokens, chunk size and cap automatic.
TrainConfig OneSequenceOf(const TrainModelConfig& model, int64_t seq_len) {
  TrainConfig c = DefaultTrainConfig();
  c.model = model;
  c.data.seq_len = seq_len;
  c.train_micro_batch_size_per_gpu = 1;
  c.train_batch_size = 0;
  c.chunk.size_elems = 0;
  c.accelerator.memory_bytes = 0;
  return c;
}

// Issue 15: parameters beyond this machine's memory used to abort with std::bad_alloc.
TEST(Preflight, RefusesAModelBeyondHostMemoryBeforeAllocating) {
  TrainModelConfig m;
  m.vocab_size = 50257;
  m.max_seq_len = 1024;
  m.hidden = 16384;
  m.num_layers = 96;
  m.num_heads = 128;
  EXPECT_THAT(Trainer::Create(OneSequenceOf(m, 64)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("does not fit in host memory"),
                             HasSubstr("the smallest host memory that fits is"),
                             HasSubstr("Nothing was allocated"))));
}

// A mistyped vocabulary of 1e9 rows on the tiny preset (64e9 parameters): refused at once, naming
// host memory. It used to list a billion one-row vocabulary blocks, then build layouts of 10^5
// blocks for every chunk-size candidate: minutes and gigabytes (and no answer to SIGINT) before the
// same refusal. The test's timeout (size small: 60 s) is the guard.
TEST(Preflight, RefusesAHugeVocabularyAtOnce) {
  TrainModelConfig m;
  m.preset = "tiny";
  m.vocab_size = 1000000000;
  EXPECT_THAT(Trainer::Create(OneSequenceOf(m, 16)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("does not fit in host memory"),
                             HasSubstr("model data alone needs at least"),
                             HasSubstr("Nothing was allocated"))));
}

TEST(Preflight, Gpt2sAutomaticChunkSizeGivesAtLeastTwentyChunksPerType) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    GptRunPlanOptions o;
    ASSERT_OK_AND_ASSIGN(o.config, GptPreset("gpt2"));
    o.model.batch = 1;
    o.model.seq_len = 64;
    o.model.threads = 2;
    o.compute_dtype = dtype;
    ASSERT_OK_AND_ASSIGN(GptRunPlan plan, PlanGptRun(o));
    EXPECT_GE(plan.plan.num_chunks, 20) << DTypeName(dtype);
    EXPECT_TRUE(plan.plan.fits());
  }
}

// The disk tier's swap files must fit their filesystem: refused, naming the directory and both
// numbers, one byte short; accepted at exactly the plan's disk bytes.
TEST(Preflight, RefusesADiskTierWhoseSwapDoesNotFitTheFilesystem) {
  for (const int world : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    GptRunPlanOptions o;
    ASSERT_OK_AND_ASSIGN(o.config, GptPreset("tiny"));
    o.model.batch = 1;
    o.model.seq_len = 16;
    o.model.threads = 2;
    o.compute_dtype = DType::kBF16;
    o.world_size = world;
    o.disk = GptRunPlanOptions::DiskTier{.dir = "/mnt/nvme/swap", .free_bytes = 0};
    ASSERT_OK_AND_ASSIGN(const GptRunPlan unchecked, PlanGptRun(o));
    const int64_t disk_bytes = unchecked.plan.disk_bytes;
    ASSERT_TRUE(unchecked.plan.disk_tier);
    ASSERT_GT(disk_bytes, 0);
    EXPECT_OK(CheckGptRunDisk(o, unchecked)) << "free_bytes 0: not checked";
    o.disk->free_bytes = disk_bytes - 1;
    ASSERT_OK_AND_ASSIGN(const GptRunPlan short_by_one, PlanGptRun(o));
    EXPECT_EQ(short_by_one.plan.disk_bytes, disk_bytes);
    const auto refused =
        StatusIs(absl::StatusCode::kResourceExhausted,
                 AllOf(HasSubstr("does not fit on disk"), HasSubstr("/mnt/nvme/swap"),
                       HasSubstr("zero_optimization.offload_optimizer.nvme_path"),
                       HasSubstr(absl::StrCat(disk_bytes, " bytes")),
                       HasSubstr(absl::StrCat(disk_bytes - 1, " bytes")),
                       HasSubstr("Nothing was allocated")));
    EXPECT_THAT(CheckGptRunDisk(o, short_by_one), refused);
    EXPECT_THAT(CheckGptRunFits(o, short_by_one), refused) << "the fit check starts with the disk";
    o.disk->free_bytes = disk_bytes;
    ASSERT_OK_AND_ASSIGN(const GptRunPlan exact, PlanGptRun(o));
    EXPECT_OK(CheckGptRunDisk(o, exact));
  }
}

// A real filesystem too small for the swap: a 1 MiB tmpfs. The trainer refuses the run before
// anything is allocated or written there (no probe, lock or swap file), naming the directory.
// Mounting needs CAP_SYS_ADMIN; where it is refused (an unprivileged sandbox) the test is skipped,
// saying why.
TEST(Preflight, RefusesASwapThatDoesNotFitASizeLimitedTmpfs) {
  const std::string dir = trainer_testing::FreshTempDir("preflight_test", "tmpfs");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs on " << dir << ": " << std::strerror(errno)
                 << " (needs CAP_SYS_ADMIN outside a sandbox that refuses mounts)";
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};
  TrainConfig c = trainer_testing::TinyDiskConfig();  // about 1.7 MiB of optimizer state
  c = trainer_testing::WithDiskTier(c, dir, /*host_budget_bytes=*/0);
  EXPECT_THAT(Trainer::Create(c).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("does not fit on disk"), HasSubstr(dir),
                             HasSubstr("Nothing was allocated"))));
  EXPECT_THAT(trainer_testing::SwapDirEntries(dir), IsEmpty());
}

}  // namespace
}  // namespace ps
