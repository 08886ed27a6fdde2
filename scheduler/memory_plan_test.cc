#include "scheduler/memory_plan.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/operator_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "scheduler/activation_profile.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::vector<OperatorSpec> Ops() {
  return {
      {"a", {{"a.w", {1000}}}}, {"b", {{"b.w", {600}}, {"b.b", {400}}}}, {"c", {{"c.w", {10}}}}};
}

// A forward a, b, c then backward c, b, a with one activation per op and a workspace at b.
ActivationProfile Profile(const std::vector<OperatorSpec>& ops) {
  ActivationProfileBuilder b(ops);
  ActivationProfile p;
  const int64_t x0 = b.Alloc(100 * kKiB);
  b.Touch("a", Stage::kForward);
  const int64_t x1 = b.Alloc(200 * kKiB);
  b.Access("b", Stage::kForward);
  const int64_t ws = b.Alloc(300 * kKiB);
  b.Free(ws);
  b.Release("b", Stage::kForward);
  b.Touch("c", Stage::kForward);
  b.Touch("c", Stage::kBackward);
  b.Touch("b", Stage::kBackward);
  b.Free(x1);
  b.Touch("a", Stage::kBackward);
  b.Free(x0);
  p.iteration = b.Take();
  const int64_t e = b.Alloc(50 * kKiB);
  b.Touch("a", Stage::kForward);
  b.Touch("b", Stage::kForward);
  b.Touch("c", Stage::kForward);
  b.Free(e);
  p.evaluation = b.Take();
  return p;
}

MemoryPlanOptions Options() {
  MemoryPlanOptions o;
  o.ops = Ops();
  o.profile = Profile(o.ops);
  o.chunk_elems = 1024;  // a alone; b (1000 elements) and c (10) share the second chunk
  o.accelerator_bytes = 64 * kMiB;
  o.scratch.small_request_max_bytes = 32 * kKiB;
  o.scratch.small_segment_bytes = 64 * kKiB;
  o.scratch.large_segment_round_bytes = 64 * kKiB;
  return o;
}

TEST(MemoryPlan, LowerBoundIsTheWorkingSetPlusTheActivationsOfTheWorstMoment) {
  ASSERT_OK_AND_ASSIGN(MemoryPlan p, PlanMemory(Options()));
  EXPECT_EQ(p.num_chunks, 2);
  EXPECT_EQ(p.param_chunk_bytes, 4 * kKiB);
  EXPECT_EQ(p.largest_working_set_bytes, 4 * kKiB);
  // At b's forward: x0 + x1 + the workspace as the tracker counts them: a large request takes a
  // segment of its size rounded to 64 KiB and keeps a tail of at most 32 KiB (100 -> 128 KiB,
  // 200 KiB split off its 256 KiB segment, 300 -> 320 KiB).
  EXPECT_EQ(p.activation_peak_bytes, (128 + 200 + 320) * kKiB);
  EXPECT_EQ(p.lower_bound_bytes, 4 * kKiB + (128 + 200 + 320) * kKiB);
  EXPECT_EQ(p.lower_bound_at, "b (FWD)");
  EXPECT_EQ(p.min_accelerator_bytes, p.lower_bound_bytes + p.slack_bytes + p.tide_margin_bytes);
  EXPECT_GE(p.slack_bytes, p.stranded_bytes);
  EXPECT_EQ(p.moments.size(), 6u);
  EXPECT_TRUE(p.fits());
  // The model data: param chunks in f32 plus three f32 state chunks each.
  EXPECT_EQ(p.rank_model_data_bytes, 2 * 4 * 4 * kKiB);
}

// A device-memory communicator's staging (nccl: CommCollectives::DeviceStagingBytes) lives in
// the scratch allocator for the whole run: it is in every moment's tide, the lower bound and the
// minimum, and a budget that fits without it can be refused with it.
TEST(MemoryPlan, DeviceCommStagingIsPartOfTheTide) {
  ASSERT_OK_AND_ASSIGN(const MemoryPlan host, PlanMemory(Options()));
  MemoryPlanOptions o = Options();
  constexpr int64_t kStaging = 40 * kKiB + 256;  // two 20 KiB chunks and the scalar word
  o.device_comm_staging_bytes = kStaging;
  ASSERT_OK_AND_ASSIGN(const MemoryPlan device, PlanMemory(o));
  EXPECT_EQ(device.device_comm_staging_bytes, kStaging);
  EXPECT_GE(device.activation_peak_bytes - host.activation_peak_bytes, kStaging);
  EXPECT_GE(device.lower_bound_bytes - host.lower_bound_bytes, kStaging);
  EXPECT_GE(device.min_accelerator_bytes - host.min_accelerator_bytes, kStaging);
  ASSERT_EQ(device.moments.size(), host.moments.size());
  for (size_t i = 0; i < device.moments.size(); ++i) {
    EXPECT_GE(device.moments[i].nonmodel_now_bytes - host.moments[i].nonmodel_now_bytes, kStaging)
        << "moment " << i;
  }
  o.accelerator_bytes = host.min_accelerator_bytes;
  ASSERT_OK_AND_ASSIGN(const MemoryPlan tight, PlanMemory(o));
  EXPECT_FALSE(tight.fits_accelerator);
  o.device_comm_staging_bytes = -1;
  EXPECT_THAT(PlanMemory(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_comm_staging_bytes")));
}

// The expected host peak counts the pages written: param blocks whole, optimizer-state chunks up
// to their last tensor (page-rounded), the measured overhead; the safe bound counts every block
// and the budgeted overhead.
TEST(MemoryPlan, ExpectedHostPeakCountsTheWrittenPages) {
  MemoryPlanOptions o = Options();
  o.ops = {
      {"a", {{"a.w", {1500}}}}, {"b", {{"b.w", {2000}}, {"b.b", {1000}}}}, {"c", {{"c.w", {10}}}}};
  o.profile = Profile(o.ops);
  o.chunk_elems = 4096;  // a in chunk 0 (6000 bytes), b and c in chunk 1 (12040 bytes)
  o.host_resident_bytes = 1 * kMiB;
  o.host_overhead_bytes = 256 * kMiB;
  ASSERT_OK_AND_ASSIGN(MemoryPlan p, PlanMemory(o));
  ASSERT_EQ(p.num_chunks, 2);
  EXPECT_EQ(p.rank_model_data_bytes, 2 * 4 * 16 * kKiB);
  EXPECT_EQ(p.host_model_data_touched_bytes, 2 * 16 * kKiB + 3 * (8 + 12) * kKiB);
  EXPECT_EQ(p.host_peak_bytes, 1 * kMiB + 2 * 4 * 16 * kKiB + 256 * kMiB);
  EXPECT_EQ(p.host_expected_peak_bytes,
            1 * kMiB + p.host_model_data_touched_bytes + kExpectedHostOverheadBytes);
  // The budgeted overhead caps the measured one; 16-bit param blocks are half as large.
  o.host_overhead_bytes = 1 * kMiB;
  o.compute_dtype = DType::kBF16;
  ASSERT_OK_AND_ASSIGN(p, PlanMemory(o));
  EXPECT_EQ(p.host_model_data_touched_bytes, 2 * 8 * kKiB + 3 * (8 + 12) * kKiB);
  EXPECT_EQ(p.host_expected_peak_bytes, 2 * kMiB + p.host_model_data_touched_bytes);
}

TEST(MemoryPlan, RefusesABudgetBelowTheMinimumAndHostMemoryBelowTheNeed) {
  MemoryPlanOptions o = Options();
  ASSERT_OK_AND_ASSIGN(MemoryPlan p, PlanMemory(o));
  o.accelerator_bytes = p.min_accelerator_bytes - 1;
  ASSERT_OK_AND_ASSIGN(MemoryPlan below, PlanMemory(o));
  EXPECT_FALSE(below.fits_accelerator);
  o.accelerator_bytes = p.min_accelerator_bytes;
  o.host_available_bytes = p.host_needed_bytes - 1;
  ASSERT_OK_AND_ASSIGN(MemoryPlan host, PlanMemory(o));
  EXPECT_TRUE(host.fits_accelerator);
  EXPECT_FALSE(host.fits_host);
}

TEST(MemoryPlan, GradientAccumulationAddsTheOwnersF32Accumulator) {
  MemoryPlanOptions o = Options();
  ASSERT_OK_AND_ASSIGN(MemoryPlan one, PlanMemory(o));
  EXPECT_EQ(one.host_accumulator_bytes, 0);
  o.gradient_accumulation_steps = 4;
  ASSERT_OK_AND_ASSIGN(MemoryPlan four, PlanMemory(o));
  EXPECT_EQ(four.host_accumulator_bytes, 2 * 4 * kKiB);
  EXPECT_EQ(four.host_needed_bytes, one.host_needed_bytes + 2 * 4 * kKiB);
}

TEST(MemoryPlan, OverlapSnapshotIsHostMemory) {
  MemoryPlanOptions o = Options();
  ASSERT_OK_AND_ASSIGN(MemoryPlan off, PlanMemory(o));
  EXPECT_EQ(off.host_overlap_snapshot_bytes, 0);
  o.overlap_snapshot_bytes = 3 * kKiB;
  ASSERT_OK_AND_ASSIGN(MemoryPlan on, PlanMemory(o));
  EXPECT_EQ(on.host_overlap_snapshot_bytes, 3 * kKiB);
  EXPECT_EQ(on.host_needed_bytes, off.host_needed_bytes + 3 * kKiB);
  EXPECT_EQ(on.host_expected_peak_bytes, off.host_expected_peak_bytes + 3 * kKiB);
  EXPECT_NE(on.Summary().find("overlap snapshot"), std::string::npos);
  // A budget beyond the owned chunks counts only what they can hold: 2 chunks of 1024 elements,
  // old master and moments (f32) and the f32 gradient, 16 bytes each.
  o.overlap_snapshot_bytes = 1 << 30;
  ASSERT_OK_AND_ASSIGN(MemoryPlan capped, PlanMemory(o));
  EXPECT_EQ(capped.host_overlap_snapshot_bytes, 2 * 1024 * 16);
  o.compute_dtype = DType::kBF16;
  ASSERT_OK_AND_ASSIGN(MemoryPlan capped16, PlanMemory(o));
  EXPECT_EQ(capped16.host_overlap_snapshot_bytes, 2 * 1024 * 14);
  o.compute_dtype = DType::kF32;
  o.overlap_snapshot_bytes = -1;
  EXPECT_FALSE(PlanMemory(o).ok());
}

TEST(MemoryPlan, SixteenBitParamChunksTakeHalfBlocks) {
  MemoryPlanOptions o = Options();
  o.compute_dtype = DType::kBF16;
  ASSERT_OK_AND_ASSIGN(MemoryPlan p, PlanMemory(o));
  EXPECT_EQ(p.param_chunk_bytes, 2 * kKiB);
  EXPECT_EQ(p.rank_model_data_bytes, 2 * (2 + 12) * kKiB);
}

// Six operators of 1000 elements, one per chunk of 1024: six owned indices whose master, momentum
// and variance chunks are 4 KiB each (72 KiB of optimizer state, 24 KiB of f32 params).
MemoryPlanOptions SixChunkOptions() {
  MemoryPlanOptions o = Options();
  o.ops.clear();
  for (int i = 0; i < 6; ++i) {
    o.ops.push_back({absl::StrCat("o", i), {{absl::StrCat("o", i, ".w"), {1000}}}});
  }
  ActivationProfileBuilder b(o.ops);
  for (int i = 0; i < 6; ++i) b.Touch(absl::StrCat("o", i), Stage::kForward);
  for (int i = 5; i >= 0; --i) b.Touch(absl::StrCat("o", i), Stage::kBackward);
  o.profile.iteration = b.Take();
  for (int i = 0; i < 6; ++i) b.Touch(absl::StrCat("o", i), Stage::kForward);
  o.profile.evaluation = b.Take();
  return o;
}

// A frozen base (LoRA): frozen chunks cost their param bytes only — on the host, in the
// accumulator and on disk — while trainable chunks keep their full state. Six chunks of 1024
// elements, the first four frozen, bf16 params (2 KiB per chunk), f32 state (4 KiB per chunk).
TEST(MemoryPlan, FrozenChunksCostTheirParamsOnly) {
  MemoryPlanOptions o = SixChunkOptions();
  o.compute_dtype = DType::kBF16;
  for (int i = 0; i < 4; ++i) o.ops[i].trainable = false;
  ASSERT_OK_AND_ASSIGN(const MemoryPlan ram, PlanMemory(o));
  ASSERT_EQ(ram.num_data_chunks, 6);
  EXPECT_EQ(ram.rank_model_data_bytes, 6 * 2 * kKiB + 2 * 3 * 4 * kKiB);
  EXPECT_EQ(ram.host_model_data_bytes, 6 * 2 * kKiB + 2 * 3 * 4 * kKiB);
  o.gradient_accumulation_steps = 4;
  ASSERT_OK_AND_ASSIGN(const MemoryPlan acc, PlanMemory(o));
  EXPECT_EQ(acc.host_accumulator_bytes, 2 * 4 * kKiB);
  o.gradient_accumulation_steps = 1;
  // The disk tier backs the two trainable indices' state only.
  o.disk = MemoryPlanOptions::DiskTier{.host_budget_bytes = 36 * kKiB, .read_ahead = 1};
  ASSERT_OK_AND_ASSIGN(const MemoryPlan disk, PlanMemory(o));
  EXPECT_EQ(disk.disk_bytes, 2 * 3 * 4 * kKiB);
  EXPECT_EQ(disk.disk_kept_indices + disk.disk_streamed_indices, 2);
}

// The ADAM placement (ResidencyPlanner::PlanAdam) keeps the optimizer state of as many owned
// indices on the accelerator as the room beside every param chunk holds, for the whole run: the
// predicted peak counts it. The LoRA shape: four frozen chunks (bf16 params, 2 KiB each) and two
// trainable ones (state 3 x 4 KiB per index); no activations, so all the budget is chunk room.
TEST(MemoryPlan, PredictedPeakCountsTheOptimizerStateTheAdamPlacementKeeps) {
  MemoryPlanOptions o = SixChunkOptions();
  o.compute_dtype = DType::kBF16;
  for (int i = 0; i < 4; ++i) o.ops[i].trainable = false;
  const int64_t params = 6 * 2 * kKiB, index_state = 3 * 4 * kKiB;
  struct Case {
    int64_t budget, margin, indices;
  };
  for (const Case& c :
       {Case{64 * kMiB, 0, 2}, Case{params + 2 * index_state, 0, 2},
        Case{params + 2 * index_state - 1, 0, 1}, Case{params + index_state + kKiB, 2 * kKiB, 0},
        Case{params + index_state - 1, 0, 0}}) {
    SCOPED_TRACE(absl::StrCat("budget ", c.budget, ", margin ", c.margin));
    o.accelerator_bytes = c.budget;
    o.adam_margin_bytes = c.margin;
    ASSERT_OK_AND_ASSIGN(const MemoryPlan p, PlanMemory(o));
    ASSERT_EQ(p.slack_bytes, 0);
    EXPECT_EQ(p.accelerator_state_indices, c.indices);
    EXPECT_EQ(p.accelerator_state_bytes, c.indices * index_state);
    // Every param chunk and the placed state (the budget holds every param chunk here).
    EXPECT_EQ(p.predicted_accelerator_peak_bytes, params + c.indices * index_state);
  }
  o.adam_margin_bytes = -1;
  EXPECT_THAT(PlanMemory(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("adam_margin_bytes")));
}

TEST(MemoryPlan, DiskTierCountsItsBudgetOnTheHostAndPredictsTheTraffic) {
  MemoryPlanOptions o = SixChunkOptions();
  ASSERT_OK_AND_ASSIGN(const MemoryPlan ram, PlanMemory(o));
  ASSERT_EQ(ram.num_data_chunks, 6);
  EXPECT_EQ(ram.host_model_data_bytes, 24 * kKiB + 72 * kKiB);
  EXPECT_FALSE(ram.disk_tier);
  EXPECT_EQ(ram.disk_bytes + ram.disk_read_bytes_per_step + ram.disk_write_bytes_per_step, 0);
  EXPECT_EQ(DiskStepSeconds(ram, 1e9, 1e9), 0);

  // 36 KiB: three indices of state, all a streaming window (the access, one written behind, one
  // read ahead); every index streams.
  o.disk = MemoryPlanOptions::DiskTier{.host_budget_bytes = 36 * kKiB, .read_ahead = 1};
  ASSERT_OK_AND_ASSIGN(MemoryPlan p, PlanMemory(o));
  EXPECT_TRUE(p.disk_tier);
  EXPECT_EQ(p.disk_bytes, 18 * 4 * kKiB);
  EXPECT_EQ(p.disk_host_bytes, 36 * kKiB);
  EXPECT_EQ(p.disk_min_host_bytes, 24 * kKiB);
  EXPECT_EQ(p.disk_kept_indices, 0);
  EXPECT_EQ(p.disk_streamed_indices, 6);
  EXPECT_EQ(p.disk_read_ahead, 1);
  EXPECT_EQ(p.disk_read_bytes_per_step, 72 * kKiB);
  EXPECT_EQ(p.disk_write_bytes_per_step, 72 * kKiB);
  EXPECT_EQ(p.host_model_data_bytes, 24 * kKiB + 36 * kKiB);
  EXPECT_EQ(p.host_needed_bytes, ram.host_needed_bytes - 36 * kKiB);
  EXPECT_EQ(p.host_model_data_touched_bytes, 24 * kKiB + 36 * kKiB);
  EXPECT_DOUBLE_EQ(DiskStepSeconds(p, 144.0 * kKiB, 144.0 * kKiB), 1.0);
  EXPECT_TRUE(p.fits_host);
  EXPECT_THAT(p.Summary(), HasSubstr("disk: 72.00 KiB of swap slots"));
  // The accelerator side does not change.
  EXPECT_EQ(p.min_accelerator_bytes, ram.min_accelerator_bytes);
  EXPECT_EQ(p.predicted_accelerator_peak_bytes, ram.predicted_accelerator_peak_bytes);

  // Gradient accumulation: each of micro-batches 1..3 reads every streamed master again.
  o.gradient_accumulation_steps = 4;
  ASSERT_OK_AND_ASSIGN(p, PlanMemory(o));
  EXPECT_EQ(p.disk_read_bytes_per_step, 72 * kKiB + 3 * 6 * 4 * kKiB);
  EXPECT_EQ(p.disk_write_bytes_per_step, 72 * kKiB);
  o.gradient_accumulation_steps = 1;

  // 60 KiB: five indices fit; a window of three leaves two kept, four streamed.
  o.disk->host_budget_bytes = 60 * kKiB;
  ASSERT_OK_AND_ASSIGN(p, PlanMemory(o));
  EXPECT_EQ(p.disk_kept_indices, 2);
  EXPECT_EQ(p.disk_streamed_indices, 4);
  EXPECT_EQ(p.disk_read_bytes_per_step, 3 * 4 * 4 * kKiB);
  EXPECT_EQ(p.disk_write_bytes_per_step, 3 * 4 * 4 * kKiB);

  // A budget above all the state: it all stays in RAM, nothing streams.
  o.disk->host_budget_bytes = 1 * kMiB;
  ASSERT_OK_AND_ASSIGN(p, PlanMemory(o));
  EXPECT_EQ(p.disk_host_bytes, 72 * kKiB);
  EXPECT_EQ(p.host_model_data_bytes, ram.host_model_data_bytes);
  EXPECT_EQ(p.disk_streamed_indices, 0);
  EXPECT_EQ(p.disk_read_bytes_per_step + p.disk_write_bytes_per_step, 0);

  // Below the tier's minimum the host does not fit.
  o.disk->host_budget_bytes = 24 * kKiB - 1;
  ASSERT_OK_AND_ASSIGN(p, PlanMemory(o));
  EXPECT_FALSE(p.fits_host);
}

TEST(MemoryPlan, InconsistentProfilesAndBadOptionsAreInvalidArguments) {
  MemoryPlanOptions o = Options();
  o.profile.iteration.push_back({.kind = ActivationEvent::Kind::kFree, .buffer = 12345});
  EXPECT_THAT(PlanMemory(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not live")));
  o = Options();
  o.profile.iteration.push_back({.kind = ActivationEvent::Kind::kAlloc, .buffer = 999, .bytes = 8});
  EXPECT_THAT(PlanMemory(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("still live")));
  o = Options();
  o.chunk_elems = 0;
  EXPECT_THAT(PlanMemory(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_elems")));
  o = Options();
  o.chunk_elems = 512;  // a does not fit
  EXPECT_THAT(PlanMemory(o), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ps
