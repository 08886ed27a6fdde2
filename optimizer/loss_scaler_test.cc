// Tests for optimizer/loss_scaler.h: DeepSpeed's DynamicLossScaler semantics, step by step,
// against hand-computed sequences.
#include "optimizer/loss_scaler.h"

#include <cmath>
#include <cstdint>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

TEST(LossScalerTest, DefaultsAreDeepSpeeds) {
  ASSERT_OK_AND_ASSIGN(LossScaler s, LossScaler::Dynamic({}));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);  // 2^16
  EXPECT_EQ(s.options().loss_scale_window, 1000);
  EXPECT_EQ(s.options().hysteresis, 2);
  EXPECT_EQ(s.options().min_loss_scale, 1.0);
}

// hysteresis 2, not consecutive: the first overflow spends a credit, the second halves, and
// every further overflow halves too until the credits are refilled by a scale increase.
TEST(LossScalerTest, HysteresisDelaysTheFirstDecrease) {
  ASSERT_OK_AND_ASSIGN(LossScaler s,
                       LossScaler::Dynamic({.initial_scale_power = 10, .loss_scale_window = 4}));
  ASSERT_OK(s.Update(true));  // iteration 0: credit 2 -> 1
  EXPECT_EQ(s.scale(), 1024.0);
  ASSERT_OK(s.Update(false));  // 1: (1 - 0) % 4 != 0
  EXPECT_EQ(s.scale(), 1024.0);
  ASSERT_OK(s.Update(true));  // 2: last credit -> halve
  EXPECT_EQ(s.scale(), 512.0);
  ASSERT_OK(s.Update(true));  // 3: still one credit -> halve again
  EXPECT_EQ(s.scale(), 256.0);
  // Clean iterations 4..7: (7 - 3) % 4 == 0 at iteration 7 -> double, credits refilled.
  for (int i = 4; i <= 6; ++i) {
    ASSERT_OK(s.Update(false));
    EXPECT_EQ(s.scale(), 256.0) << "iteration " << i;
  }
  ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  ASSERT_OK(s.Update(true));  // 8: credit 2 -> 1, no change
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().iteration, 9);
  EXPECT_EQ(s.state().last_overflow_iteration, 8);
}

// consecutive_hysteresis: a clean step refills the credits, so only back-to-back overflows halve.
TEST(LossScalerTest, ConsecutiveHysteresisNeedsOverflowsInARow) {
  ASSERT_OK_AND_ASSIGN(LossScaler s, LossScaler::Dynamic({.initial_scale_power = 8,
                                                          .loss_scale_window = 1000,
                                                          .hysteresis = 2,
                                                          .consecutive_hysteresis = true}));
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(s.Update(true));
    ASSERT_OK(s.Update(false));
    EXPECT_EQ(s.scale(), 256.0);
  }
  ASSERT_OK(s.Update(true));
  ASSERT_OK(s.Update(true));
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScalerTest, DoublesAfterWindowCleanSteps) {
  ASSERT_OK_AND_ASSIGN(LossScaler s,
                       LossScaler::Dynamic({.initial_scale_power = 4, .loss_scale_window = 3}));
  const double want[] = {16, 16, 32, 32, 32, 64, 64, 64, 128};
  for (double w : want) {
    ASSERT_OK(s.Update(false));
    EXPECT_EQ(s.scale(), w) << "iteration " << s.state().iteration - 1;
  }
  // With hysteresis 1 every overflow halves and restarts the window.
  ASSERT_OK_AND_ASSIGN(
      LossScaler t,
      LossScaler::Dynamic({.initial_scale_power = 4, .loss_scale_window = 2, .hysteresis = 1}));
  ASSERT_OK(t.Update(true));   // 0: 8
  ASSERT_OK(t.Update(false));  // 1: (1-0)%2 != 0
  ASSERT_OK(t.Update(false));  // 2: (2-0)%2 == 0 -> 16
  EXPECT_EQ(t.scale(), 16.0);
  ASSERT_OK(t.Update(true));  // 3: 8
  EXPECT_EQ(t.scale(), 8.0);
}

TEST(LossScalerTest, NeverBelowMinAndErrorsAtTheFloor) {
  ASSERT_OK_AND_ASSIGN(
      LossScaler s,
      LossScaler::Dynamic({.initial_scale_power = 2, .hysteresis = 1, .min_loss_scale = 2.0}));
  ASSERT_OK(s.Update(true));
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_THAT(s.Update(true), StatusIs(absl::StatusCode::kOutOfRange, "min_loss_scale"));
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_EQ(s.state().iteration, 2);

  ASSERT_OK_AND_ASSIGN(LossScaler quiet, LossScaler::Dynamic({.initial_scale_power = 1,
                                                              .hysteresis = 1,
                                                              .min_loss_scale = 1.5,
                                                              .error_at_min_scale = false}));
  ASSERT_OK(quiet.Update(true));
  EXPECT_EQ(quiet.scale(), 1.5);  // max(2 / 2, 1.5)
  ASSERT_OK(quiet.Update(true));
  EXPECT_EQ(quiet.scale(), 1.5);
}

TEST(LossScalerTest, ScaleIsCapped) {
  ASSERT_OK_AND_ASSIGN(LossScaler s,
                       LossScaler::Dynamic({.initial_scale_power = 99, .loss_scale_window = 1}));
  for (int i = 0; i < 5; ++i) ASSERT_OK(s.Update(false));
  EXPECT_EQ(s.scale(), kMaxLossScale);
}

TEST(LossScalerTest, StaticAndNone) {
  ASSERT_OK_AND_ASSIGN(LossScaler s, LossScaler::Static(128.0));
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 10; ++i) ASSERT_OK(s.Update(i % 2 == 0));
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(LossScaler::None().scale(), 1.0);
  EXPECT_THAT(LossScaler::Static(0.0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fp16.loss_scale")));
  EXPECT_THAT(LossScaler::Static(std::nan("")), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LossScalerTest, BadOptionsNameTheKey) {
  EXPECT_THAT(LossScaler::Dynamic({.initial_scale_power = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "fp16.initial_scale_power"));
  EXPECT_THAT(LossScaler::Dynamic({.loss_scale_window = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "fp16.loss_scale_window"));
  EXPECT_THAT(LossScaler::Dynamic({.hysteresis = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "fp16.hysteresis"));
  EXPECT_THAT(LossScaler::Dynamic({.min_loss_scale = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "fp16.min_loss_scale"));
  EXPECT_THAT(LossScaler::Dynamic({.scale_factor = 1.0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "scale_factor"));
}

TEST(LossScalerTest, StateRoundTrips) {
  ASSERT_OK_AND_ASSIGN(LossScaler a, LossScaler::Dynamic({.loss_scale_window = 3}));
  for (bool overflow : {true, false, true, false, false}) ASSERT_OK(a.Update(overflow));
  ASSERT_OK_AND_ASSIGN(LossScaler b, LossScaler::Dynamic({.loss_scale_window = 3}));
  ASSERT_OK(b.Restore(a.state()));
  for (bool overflow : {false, false, true, true, false, false, false}) {
    ASSERT_OK(a.Update(overflow));
    ASSERT_OK(b.Update(overflow));
    EXPECT_EQ(a.scale(), b.scale());
  }
  LossScalerState bad = a.state();
  bad.hysteresis_left = 3;
  EXPECT_THAT(b.Restore(bad), StatusIs(absl::StatusCode::kInvalidArgument, "hysteresis_left"));
  bad = a.state();
  bad.scale = 0.5;
  EXPECT_THAT(b.Restore(bad), StatusIs(absl::StatusCode::kInvalidArgument, "scale"));
  bad = a.state();
  bad.last_overflow_iteration = bad.iteration;
  EXPECT_THAT(b.Restore(bad), StatusIs(absl::StatusCode::kInvalidArgument, "last_overflow"));
}

}  // namespace
}  // namespace ps
