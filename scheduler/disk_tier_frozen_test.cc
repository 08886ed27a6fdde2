// Frozen param chunks in the disk tier (DiskTierOptions::frozen_params): a LoRA-style model whose
// frozen chunks live on disk under their own host budget, driven through the ChunkManager on the
// emulated accelerator. Random access orders x awkward budgets (the least, one chunk more,
// everything) x read-ahead windows x device budgets: the budget holds after every call and at
// every peak, every access sees bit-exact values, each frozen slot is written once and never
// again, reads follow the access order, a failing read names the chunk and leaves the manager
// usable, and the memory plan's host model data matches the measured peak.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "chunk/chunk.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "disk/chunk_swap.h"
#include "disk/file_chunk_swap.h"
#include "disk/io_engine.h"
#include "disk/testing/counting_io_engine.h"
#include "disk/testing/memory_chunk_swap.h"
#include "disk/testing/scoped_test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/device.h"
#include "memory/device_memory.h"
#include "memory/memory_tracker.h"
#include "scheduler/activation_profile.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/disk_tier.h"
#include "scheduler/memory_plan.h"
#include "scheduler/metronome.h"
#include "scheduler/testing/training_harness.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kChunkElems = 256;
constexpr int64_t kBlock = kChunkElems * 4;  // f32: every chunk type's block
constexpr int64_t kChunks = 12;              // one operator per chunk
// The trainable operators (LoRA adapters); every other one is frozen.
const std::vector<OperatorId> kTrainable = {3, 8};
constexpr int64_t kFrozen = kChunks - 2;

HarnessModel Model() {
  HarnessModel model;
  model.chunk_elems = kChunkElems;
  model.op_numels.assign(kChunks, 200);
  for (OperatorId op = 0; op < kChunks; ++op) {
    if (std::find(kTrainable.begin(), kTrainable.end(), op) == kTrainable.end()) {
      model.frozen_ops.push_back(op);
    }
  }
  return model;
}

bool IsFrozen(OperatorId op) {
  return std::find(kTrainable.begin(), kTrainable.end(), op) == kTrainable.end();
}

// A MemoryChunkSwap that records the keys of every read and write, and the access (the test's
// counter) during which each read started.
class RecordingSwap final : public ChunkSwap {
 public:
  absl::Status AddSlot(int64_t key, int64_t bytes, std::string name) override {
    return inner_.AddSlot(key, bytes, std::move(name));
  }
  absl::StatusOr<IoTicket> StartWrite(int64_t key, const void* src) override {
    writes.push_back(key);
    return inner_.StartWrite(key, src);
  }
  absl::StatusOr<IoTicket> StartRead(int64_t key, void* dst) override {
    reads.push_back({key, access});
    return inner_.StartRead(key, dst);
  }
  absl::Status Wait(IoTicket ticket) override { return inner_.Wait(ticket); }
  bool Poll(IoTicket ticket) override { return inner_.Poll(ticket); }
  bool written(int64_t key) const override { return inner_.written(key); }
  int64_t slot_bytes(int64_t key) const override { return inner_.slot_bytes(key); }
  ChunkSwapInfo info() const override { return inner_.info(); }
  ChunkSwapCounters counters() const override { return inner_.counters(); }
  MemoryChunkSwap& inner() { return inner_; }

  std::vector<int64_t> writes;
  // (key, the access during which the read started)
  std::vector<std::pair<int64_t, int64_t>> reads;
  int64_t access = -1;

 private:
  MemoryChunkSwap inner_;
};

HarnessConfig Config(ChunkSwap* swap, int64_t frozen_budget, int64_t frozen_read_ahead,
                     int64_t device_blocks) {
  HarnessConfig config;
  config.cap_bytes = 24 * kBlock;
  config.give_compute_stream = false;  // Access waits on the host: views are readable at once
  config.options.device_budget_bytes = device_blocks * kBlock;
  config.options.disk = DiskTierOptions{.swap = swap,
                                        // The adapters' optimizer state all fits.
                                        .host_budget_bytes = 6 * kBlock,
                                        .read_ahead = 1,
                                        .frozen_params = true,
                                        .frozen_host_budget_bytes = frozen_budget,
                                        .frozen_read_ahead = frozen_read_ahead};
  return config;
}

std::vector<uint8_t> OpBytes(const ChunkStore& store, OperatorId op) {
  const TensorId t = store.layout().op(op).tensors.at(0);
  const TensorView view = store.View(ChunkType::kParam, t).value();
  const uint8_t* p = static_cast<const uint8_t*>(view.data);
  return std::vector<uint8_t>(p, p + view.bytes());
}

// Writes random values into every param tensor (the model loading its weights: on the host,
// untracked, through the manager) and returns them by operator.
std::vector<std::vector<uint8_t>> LoadWeights(ChunkManager& m, ChunkStore& store, TestRng& rng) {
  std::vector<std::vector<uint8_t>> ref(kChunks);
  for (OperatorId op = 0; op < kChunks; ++op) {
    const int64_t index = store.layout().op(op).chunk_index;
    EXPECT_OK(m.AccessChunks(index, {ChunkType::kParam}, Device::Host(), AccessMode::kReadWrite));
    const TensorId t = store.layout().op(op).tensors.at(0);
    const TensorView view = store.View(ChunkType::kParam, t).value();
    uint8_t* p = static_cast<uint8_t*>(view.data);
    for (int64_t b = 0; b < view.bytes(); ++b) p[b] = static_cast<uint8_t>(rng());
    ref[op] = OpBytes(store, op);
    EXPECT_OK(m.ReleaseChunks(index, {ChunkType::kParam}));
  }
  return ref;
}

struct Step {
  OperatorId op;
  Stage stage;
};

// A random training-like order: forward over a random permutation, backward over another, with a
// few operators accessed twice.
std::vector<Step> RandomProgram(TestRng& rng) {
  std::vector<Step> steps;
  std::vector<OperatorId> ops(kChunks);
  for (OperatorId op = 0; op < kChunks; ++op) ops[op] = op;
  for (Stage stage : {Stage::kForward, Stage::kBackward}) {
    std::shuffle(ops.begin(), ops.end(), rng);
    for (OperatorId op : ops) {
      steps.push_back({op, stage});
      if (absl::Bernoulli(rng, 0.15)) {
        steps.push_back({static_cast<OperatorId>(absl::Uniform<int64_t>(rng, 0, kChunks)), stage});
      }
    }
  }
  return steps;
}

// Drives iterations of `program` (plus an optimizer step over the adapters), checking the budget
// after every call and the bytes at every access. Returns the frozen keys accessed, in order,
// with the access counter of each.
class Driver {
 public:
  Driver(TrainingHarness& h, RecordingSwap* swap, std::vector<std::vector<uint8_t>> ref,
         int64_t budget)
      : h_(h), swap_(swap), ref_(std::move(ref)), budget_(budget) {}

  void Iteration(const std::vector<Step>& program) {
    ChunkManager& m = h_.manager();
    const DiskTier& tier = *m.disk_tier();
    ASSERT_OK(m.BeginIteration());
    for (const Step& step : program) {
      SCOPED_TRACE(absl::StrCat("access ", access_, " op ", step.op, " ", StageName(step.stage)));
      if (swap_ != nullptr) swap_->access = access_;
      ASSERT_OK(m.Access(step.op, step.stage));
      ASSERT_LE(tier.frozen_host_bytes(), budget_);
      SampleHost();
      ASSERT_EQ(OpBytes(h_.store(), step.op), ref_[step.op]);
      if (IsFrozen(step.op)) {
        accesses_.push_back(
            m.ChunkKey({ChunkType::kParam, h_.store().layout().op(step.op).chunk_index}));
      } else {
        accesses_.push_back(-1);
      }
      ++access_;
      ASSERT_OK(m.Release(step.op, step.stage));
      ASSERT_LE(tier.frozen_host_bytes(), budget_);
    }
    ASSERT_OK_AND_ASSIGN(AdamPlacement placement, m.BeginAdam());
    (void)placement;
    for (OperatorId op : kTrainable) {
      const int64_t index = h_.store().layout().op(op).chunk_index;
      const std::vector<ChunkType> types = {ChunkType::kParam, ChunkType::kMaster,
                                            ChunkType::kMomentum, ChunkType::kVariance};
      ASSERT_OK(m.AccessChunks(index, types, Device::Host(), AccessMode::kReadWrite));
      ASSERT_EQ(OpBytes(h_.store(), op), ref_[op]);
      ASSERT_LE(tier.frozen_host_bytes(), budget_);
      ASSERT_OK(m.ReleaseChunks(index, types));
    }
    SampleHost();
    ASSERT_OK(m.EndIteration());
    ASSERT_LE(tier.frozen_host_bytes(), budget_);
    ASSERT_LE(tier.frozen_iteration_peak_bytes(), budget_);
  }

  // The host's model-data peak since the manager last reset it.
  void SampleHost() {
    host_peak_ = std::max(host_peak_, h_.host().tracker()->peak_bytes(MemoryKind::kModelData));
  }

  int64_t access() const { return access_; }
  const std::vector<int64_t>& accesses() const { return accesses_; }
  int64_t host_peak() const { return host_peak_; }

 private:
  TrainingHarness& h_;
  RecordingSwap* const swap_;
  const std::vector<std::vector<uint8_t>> ref_;
  const int64_t budget_;
  int64_t access_ = 0;
  std::vector<int64_t> accesses_;
  int64_t host_peak_ = 0;
};

TEST(DiskTierFrozen, MinimumBudgetIsOneParamChunk) {
  EXPECT_EQ(DiskTierFrozenMinHostBytes(kBlock, kFrozen), kBlock);
  EXPECT_EQ(DiskTierFrozenMinHostBytes(kBlock, 0), 0);
  MemoryChunkSwap swap;
  EXPECT_THAT(TrainingHarness::Create(Model(), Config(&swap, kBlock - 1, 1, 24)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("frozen_host_budget_bytes"),
                             HasSubstr(absl::StrCat(kBlock - 1, " bytes")),
                             HasSubstr(absl::StrCat(kBlock, " bytes")))));
  MemoryChunkSwap swap2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                       TrainingHarness::Create(Model(), Config(&swap2, kBlock, 1, 24)));
  const DiskTier& tier = *h->manager().disk_tier();
  EXPECT_EQ(tier.num_frozen_chunks(), kFrozen);
  EXPECT_EQ(tier.frozen_min_host_bytes(), kBlock);
  // Only the frozen param chunks and the adapters' state have slots.
  for (int64_t i = 0; i < kChunks; ++i) {
    const bool frozen = IsFrozen(static_cast<OperatorId>(i));
    const int64_t key = h->manager().ChunkKey({ChunkType::kParam, i});
    EXPECT_EQ(tier.frozen(key), frozen) << i;
    EXPECT_EQ(swap2.slot_bytes(key), frozen ? kBlock : 0) << i;
    EXPECT_EQ(swap2.slot_bytes(h->manager().ChunkKey({ChunkType::kMaster, i})), frozen ? 0 : kBlock)
        << i;
  }
}

// Random orders x budgets x read-ahead x device budgets: the budget after every call and at its
// peak, bit-exact values at every access, each frozen slot written at most once (exactly once
// for a chunk that ever left host RAM) and never after the first iteration, and reads that
// follow the access order.
TEST(DiskTierFrozen, RandomOrdersKeepBudgetValuesAndWriteOnce) {
  TestRng rng(37);
  for (int64_t budget : {kBlock, 2 * kBlock, 4 * kBlock, kFrozen * kBlock}) {
    for (int64_t read_ahead : {0, 1, 3}) {
      for (int64_t device_blocks : {3, 24}) {
        SCOPED_TRACE(absl::StrCat("budget ", budget / kBlock, " chunks, read-ahead ", read_ahead,
                                  ", device ", device_blocks, " chunks"));
        RecordingSwap swap;
        ASSERT_OK_AND_ASSIGN(
            std::unique_ptr<TrainingHarness> h,
            TrainingHarness::Create(Model(), Config(&swap, budget, read_ahead, device_blocks)));
        ChunkManager& m = h->manager();
        const DiskTier& tier = *m.disk_tier();
        std::vector<std::vector<uint8_t>> ref = LoadWeights(m, h->store(), rng);
        ASSERT_LE(tier.frozen_host_bytes(), budget);
        Driver driver(*h, &swap, ref, budget);
        const std::vector<Step> program = RandomProgram(rng);
        driver.Iteration(program);
        if (HasFatalFailure()) return;
        const size_t writes_after_warmup = swap.writes.size();
        for (int it = 0; it < 3; ++it) {
          driver.Iteration(program);
          if (HasFatalFailure()) return;
        }
        EXPECT_LE(tier.frozen_peak_host_bytes(), budget);
        // Written once: no frozen slot twice, none after the warm-up, and every frozen chunk
        // read back was written first.
        absl::flat_hash_map<int64_t, int> writes;
        for (int64_t key : swap.writes) {
          if (tier.frozen(key)) ++writes[key];
        }
        for (const auto& [key, n] : writes) EXPECT_EQ(n, 1) << m.ChunkIdOfKey(key).ToString();
        for (size_t w = writes_after_warmup; w < swap.writes.size(); ++w) {
          EXPECT_FALSE(tier.frozen(swap.writes[w]))
              << m.ChunkIdOfKey(swap.writes[w]).ToString() << " written after the warm-up";
        }
        int64_t frozen_reads = 0;
        for (const auto& [key, access] : swap.reads) {
          if (!tier.frozen(key)) continue;
          ++frozen_reads;
          EXPECT_EQ(writes[key], 1) << m.ChunkIdOfKey(key).ToString();
        }
        if (budget >= kFrozen * kBlock) {
          EXPECT_EQ(frozen_reads, 0);
          EXPECT_TRUE(writes.empty());
        } else {
          EXPECT_GT(frozen_reads, 0);
          EXPECT_EQ(static_cast<int64_t>(writes.size()), kFrozen);
        }
        // Reads follow the access order: the access each read serves (the first access of its
        // chunk from the one it started in) never goes back.
        const std::vector<int64_t>& accesses = driver.accesses();
        int64_t last_served = -1;
        for (const auto& [key, started] : swap.reads) {
          if (!tier.frozen(key) || started < 0) continue;
          int64_t served = started;
          while (served < static_cast<int64_t>(accesses.size()) && accesses[served] != key) {
            ++served;
          }
          if (served == static_cast<int64_t>(accesses.size())) continue;  // read for later
          EXPECT_GE(served, last_served)
              << m.ChunkIdOfKey(key).ToString() << " read during access " << started;
          last_served = served;
        }
        if (read_ahead > 0 && budget > kBlock && budget < kFrozen * kBlock) {
          EXPECT_GT(m.counters().disk_read_aheads, 0);
          EXPECT_GT(m.counters().disk_read_ahead_hits, 0);
        }
        if (read_ahead == 0) {
          EXPECT_EQ(m.counters().disk_read_aheads, 0);
        }
        // Reading everything back through the manager gives the values loaded.
        for (OperatorId op = 0; op < kChunks; ++op) {
          const int64_t index = h->store().layout().op(op).chunk_index;
          ASSERT_OK(m.AccessChunks(index, {ChunkType::kParam}, Device::Host(), AccessMode::kRead));
          EXPECT_EQ(OpBytes(h->store(), op), ref[op]) << op;
          ASSERT_OK(m.ReleaseChunks(index, {ChunkType::kParam}));
          ASSERT_LE(tier.frozen_host_bytes(), budget);
        }
      }
    }
  }
}

// On a real swap file, the requests at the I/O seam (a CountingIoEngine): one write per frozen
// chunk, all of them before training, and none while training, however many reads.
TEST(DiskTierFrozen, FileSwapWritesEachFrozenChunkOnce) {
  ScopedTestDir dir;
  FileChunkSwapOptions o;
  o.dir = dir.path();
  o.engine = IoEngineKind::kThreads;
  std::shared_ptr<IoRecords> records;
  o.wrap_engine_for_test = [&records](std::unique_ptr<IoEngine> inner) {
    auto counting = std::make_unique<CountingIoEngine>(std::move(inner));
    records = counting->records();
    return counting;
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSwap> swap, OpenFileChunkSwap(o));
  ASSERT_NE(records, nullptr);
  TestRng rng(7);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                         TrainingHarness::Create(Model(), Config(swap.get(), 2 * kBlock, 1, 3)));
    ChunkManager& m = h->manager();
    const std::vector<std::vector<uint8_t>> ref = LoadWeights(m, h->store(), rng);
    Driver driver(*h, nullptr, ref, 2 * kBlock);
    const std::vector<Step> program = RandomProgram(rng);
    driver.Iteration(program);
    const auto count = [&](bool write) {
      int64_t n = 0;
      for (const IoRecords::Request& r : records->requests) n += r.write == write ? 1 : 0;
      return n;
    };
    const int64_t writes_warmup = count(true);
    // The adapters' state all fits: every write is a frozen chunk's, each at its own offset.
    EXPECT_EQ(writes_warmup, kFrozen);
    std::vector<int64_t> offsets;
    for (const IoRecords::Request& r : records->requests) {
      if (r.write) offsets.push_back(r.offset);
    }
    std::sort(offsets.begin(), offsets.end());
    EXPECT_EQ(std::unique(offsets.begin(), offsets.end()), offsets.end());
    for (int it = 0; it < 3; ++it) driver.Iteration(program);
    EXPECT_EQ(count(true), writes_warmup);
    EXPECT_GT(count(false), 3 * kFrozen);
    EXPECT_EQ(m.counters().frozen_writeback_bytes, 0);
  }
}

// A failing read names the chunk; the access is no moment, and the manager goes on: the next
// access reads the chunk (the fault is gone) and training continues with the right values.
TEST(DiskTierFrozen, ReadFaultNamesChunkAndManagerStaysUsable) {
  RecordingSwap swap;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                       TrainingHarness::Create(Model(), Config(&swap, kBlock, 0, 3)));
  ChunkManager& m = h->manager();
  TestRng rng(5);
  const std::vector<std::vector<uint8_t>> ref = LoadWeights(m, h->store(), rng);
  const OperatorId op = 5;
  const int64_t key = m.ChunkKey({ChunkType::kParam, h->store().layout().op(op).chunk_index});
  ASSERT_FALSE(h->store().chunk(ChunkType::kParam, 5).has_payload());
  swap.inner().FailNextRead(key, absl::DataLossError("CRC-32C mismatch in slot param#5"));
  ASSERT_OK(m.BeginIteration());
  ASSERT_OK(m.Access(0, Stage::kForward));
  ASSERT_OK(m.Release(0, Stage::kForward));
  const int64_t moment = m.metronome().moment();
  EXPECT_THAT(m.Access(op, Stage::kForward),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("loading param#5 from disk: "), HasSubstr("CRC-32C"))));
  EXPECT_EQ(m.metronome().moment(), moment);
  EXPECT_FALSE(h->store().chunk(ChunkType::kParam, 5).has_payload());
  ASSERT_OK(m.Access(op, Stage::kForward));
  EXPECT_EQ(OpBytes(h->store(), op), ref[op]);
  ASSERT_OK(m.Release(op, Stage::kForward));
  ASSERT_OK(m.EndIteration());
  Driver driver(*h, &swap, ref, kBlock);
  driver.Iteration(RandomProgram(rng));
  driver.Iteration(RandomProgram(rng));
  h->DestroyManager();
}

// The plan's host model data is the measured peak of the host's chunk blocks: the trainable
// params and their state whole, the frozen params at min(budget, all of them).
TEST(DiskTierFrozen, PlanPredictsTheHostPeak) {
  const HarnessModel model = Model();
  std::vector<OperatorSpec> ops;
  for (OperatorId op = 0; op < kChunks; ++op) {
    OperatorSpec spec{absl::StrCat("op", op), {{absl::StrCat("w", op), {model.op_numels[op]}}}};
    spec.trainable = !IsFrozen(op);
    ops.push_back(spec);
  }
  for (int64_t budget : {kBlock, 3 * kBlock, kFrozen * kBlock, 20 * kBlock}) {
    SCOPED_TRACE(absl::StrCat("budget ", budget / kBlock, " chunks"));
    MemoryPlanOptions p;
    p.ops = ops;
    ActivationProfileBuilder b(ops);
    for (const OperatorSpec& op : ops) b.Touch(op.name, Stage::kForward);
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) b.Touch(it->name, Stage::kBackward);
    p.profile.iteration = b.Take();
    p.chunk_elems = kChunkElems;
    p.accelerator_bytes = 3 * kBlock + (8 << 20);
    p.disk = MemoryPlanOptions::DiskTier{.host_budget_bytes = 6 * kBlock,
                                         .frozen_params = true,
                                         .frozen_host_budget_bytes = budget,
                                         .frozen_read_ahead = 1};
    ASSERT_OK_AND_ASSIGN(const MemoryPlan plan, PlanMemory(p));
    EXPECT_EQ(plan.disk_frozen_chunks, kFrozen);
    EXPECT_EQ(plan.disk_frozen_min_host_bytes, kBlock);
    EXPECT_EQ(plan.disk_frozen_host_bytes, std::min(budget, kFrozen * kBlock));
    EXPECT_EQ(plan.disk_bytes, (kFrozen + 6) * 4096);
    EXPECT_EQ(plan.disk_frozen_read_bytes_per_step,
              budget < kFrozen * kBlock ? 2 * kFrozen * kBlock : 0);
    EXPECT_TRUE(plan.fits_host);

    RecordingSwap swap;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<TrainingHarness> h,
                         TrainingHarness::Create(model, Config(&swap, budget, 1, 3)));
    ChunkManager& m = h->manager();
    TestRng rng(11);
    // The harness writes every chunk type the rank holds (the adapters' state too).
    ASSERT_OK(h->Initialize());
    const std::vector<std::vector<uint8_t>> ref = LoadWeights(m, h->store(), rng);
    Driver driver(*h, &swap, ref, budget);
    driver.SampleHost();
    std::vector<Step> program;
    for (OperatorId op = 0; op < kChunks; ++op) program.push_back({op, Stage::kForward});
    for (OperatorId op = kChunks - 1; op >= 0; --op) program.push_back({op, Stage::kBackward});
    for (int it = 0; it < 3; ++it) driver.Iteration(program);
    EXPECT_EQ(driver.host_peak(), plan.host_model_data_bytes);
  }
  // Without the frozen params on disk, the plan counts every param block.
  MemoryPlanOptions p;
  p.ops = ops;
  ActivationProfileBuilder b(ops);
  for (const OperatorSpec& op : ops) b.Touch(op.name, Stage::kForward);
  p.profile.iteration = b.Take();
  p.chunk_elems = kChunkElems;
  p.accelerator_bytes = 8 << 20;
  p.disk = MemoryPlanOptions::DiskTier{.host_budget_bytes = 6 * kBlock};
  ASSERT_OK_AND_ASSIGN(const MemoryPlan all, PlanMemory(p));
  EXPECT_EQ(all.host_model_data_bytes, (kChunks + 6) * kBlock);
  EXPECT_EQ(all.disk_frozen_chunks, 0);
  // A positive budget below one chunk does not fit.
  p.disk->frozen_params = true;
  p.disk->frozen_host_budget_bytes = kBlock - 1;
  ASSERT_OK_AND_ASSIGN(const MemoryPlan small, PlanMemory(p));
  EXPECT_FALSE(small.fits_host);
}

}  // namespace
}  // namespace ps
