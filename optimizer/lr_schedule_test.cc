// Tests for optimizer/lr_schedule.h against values computed by hand from DeepSpeed's formulas.
#include "optimizer/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(LrScheduleTest, Constant) {
  ASSERT_OK_AND_ASSIGN(LrSchedule s, LrSchedule::Create({.lr = 3e-4}));
  EXPECT_EQ(s.LearningRate(0), 3e-4);
  EXPECT_EQ(s.LearningRate(123456), 3e-4);
}

TEST(LrScheduleTest, WarmupLogIsDeepSpeedsDefault) {
  ASSERT_OK_AND_ASSIGN(
      LrSchedule s,
      LrSchedule::Create({.type = LrScheduleType::kWarmup, .lr = 1e-3, .warmup_num_steps = 1000}));
  EXPECT_EQ(s.LearningRate(0), 0.0);                 // log(1) = 0
  EXPECT_NEAR(s.LearningRate(9), 1e-3 / 3, 1e-15);   // log(10) / log(1000)
  EXPECT_NEAR(s.LearningRate(99), 2e-3 / 3, 1e-15);  // log(100) / log(1000)
  EXPECT_NEAR(s.LearningRate(999), 1e-3, 1e-15);     // log(1000) / log(1000)
  EXPECT_EQ(s.LearningRate(1000), 1e-3);
  EXPECT_EQ(s.LearningRate(50000), 1e-3);
}

TEST(LrScheduleTest, WarmupLinearFromMinLr) {
  ASSERT_OK_AND_ASSIGN(LrSchedule s, LrSchedule::Create({.type = LrScheduleType::kWarmup,
                                                         .lr = 1e-3,
                                                         .warmup_min_lr = 1e-4,
                                                         .warmup_num_steps = 10,
                                                         .warmup_type = WarmupType::kLinear}));
  EXPECT_DOUBLE_EQ(s.LearningRate(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.LearningRate(5), 1e-4 + 9e-4 * 0.5);
  EXPECT_DOUBLE_EQ(s.LearningRate(9), 1e-4 + 9e-4 * 0.9);
  EXPECT_DOUBLE_EQ(s.LearningRate(10), 1e-3);
}

TEST(LrScheduleTest, WarmupStepsBelowTwoActAsTwo) {
  ASSERT_OK_AND_ASSIGN(LrSchedule s, LrSchedule::Create({.type = LrScheduleType::kWarmup,
                                                         .lr = 1.0,
                                                         .warmup_num_steps = 0,
                                                         .warmup_type = WarmupType::kLinear}));
  EXPECT_EQ(s.LearningRate(0), 0.0);
  EXPECT_EQ(s.LearningRate(1), 0.5);
  EXPECT_EQ(s.LearningRate(2), 1.0);
}

TEST(LrScheduleTest, WarmupDecayIsLinearToZeroAtTotal) {
  ASSERT_OK_AND_ASSIGN(LrSchedule s, LrSchedule::Create({.type = LrScheduleType::kWarmupDecay,
                                                         .lr = 1.0,
                                                         .warmup_num_steps = 10,
                                                         .warmup_type = WarmupType::kLinear,
                                                         .total_num_steps = 110}));
  EXPECT_DOUBLE_EQ(s.LearningRate(4), 0.4);
  EXPECT_DOUBLE_EQ(s.LearningRate(10), 1.0);  // (110 - 10) / 100
  EXPECT_DOUBLE_EQ(s.LearningRate(60), 0.5);
  EXPECT_DOUBLE_EQ(s.LearningRate(109), 0.01);
  EXPECT_EQ(s.LearningRate(110), 0.0);
  EXPECT_EQ(s.LearningRate(500), 0.0);
}

TEST(LrScheduleTest, WarmupCosine) {
  ASSERT_OK_AND_ASSIGN(LrSchedule s, LrSchedule::Create({.type = LrScheduleType::kWarmupCosine,
                                                         .lr = 2.0,
                                                         .warmup_num_steps = 10,
                                                         .warmup_type = WarmupType::kLinear,
                                                         .total_num_steps = 110,
                                                         .warmup_min_ratio = 0.1,
                                                         .cos_min_ratio = 0.0}));
  EXPECT_DOUBLE_EQ(s.LearningRate(0), 2.0 * 0.1);
  EXPECT_DOUBLE_EQ(s.LearningRate(5), 2.0 * (0.1 + 0.9 * 0.5));
  // After warm-up s = step - 9 of 100 steps.
  EXPECT_DOUBLE_EQ(s.LearningRate(10), 2.0 * (1 + std::cos(std::numbers::pi / 100)) / 2);
  EXPECT_NEAR(s.LearningRate(59), 1.0, 1e-15);   // s = 50: half way
  EXPECT_NEAR(s.LearningRate(109), 0.0, 1e-15);  // s = 100
  EXPECT_NEAR(s.LearningRate(300), 0.0, 1e-15);  // held, not rising again
  ASSERT_OK_AND_ASSIGN(LrSchedule floor, LrSchedule::Create({.type = LrScheduleType::kWarmupCosine,
                                                             .lr = 1.0,
                                                             .warmup_num_steps = 10,
                                                             .total_num_steps = 110,
                                                             .cos_min_ratio = 0.25}));
  EXPECT_NEAR(floor.LearningRate(59), 0.25 + 0.75 * 0.5, 1e-15);
  EXPECT_NEAR(floor.LearningRate(1000), 0.25, 1e-15);
}

TEST(LrScheduleTest, BadOptionsNameTheKey) {
  EXPECT_THAT(LrSchedule::Create({.lr = -1}), StatusIs(absl::StatusCode::kInvalidArgument, "lr"));
  EXPECT_THAT(LrSchedule::Create({.type = LrScheduleType::kWarmup, .lr = 1, .warmup_min_lr = 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "warmup_min_lr"));
  EXPECT_THAT(LrSchedule::Create({.type = LrScheduleType::kWarmup, .warmup_num_steps = -5}),
              StatusIs(absl::StatusCode::kInvalidArgument, "warmup_num_steps"));
  EXPECT_THAT(
      LrSchedule::Create(
          {.type = LrScheduleType::kWarmupCosine, .warmup_num_steps = 100, .total_num_steps = 100}),
      StatusIs(absl::StatusCode::kInvalidArgument, "total_num_steps"));
  EXPECT_THAT(LrSchedule::Create({.type = LrScheduleType::kWarmupCosine,
                                  .warmup_num_steps = 1,
                                  .total_num_steps = 10,
                                  .cos_min_ratio = 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cos_min_ratio"));
}

TEST(LrScheduleTest, ParsesDeepSpeedNames) {
  EXPECT_THAT(ParseLrScheduleType("WarmupDecayLR"), IsOkAndHolds(LrScheduleType::kWarmupDecay));
  EXPECT_THAT(ParseLrScheduleType("WarmupCosineLR"), IsOkAndHolds(LrScheduleType::kWarmupCosine));
  EXPECT_THAT(ParseLrScheduleType("OneCycle"),
              StatusIs(absl::StatusCode::kInvalidArgument, "WarmupLR"));
}

}  // namespace
}  // namespace ps
