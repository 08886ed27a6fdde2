#include "optimizer/grad_clip.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(GradClipTest, CoefficientMatchesTorchClipGradNorm) {
  // Norm 10 clipped to 1: 1 / (10 + 1e-6).
  EXPECT_DOUBLE_EQ(ClipCoefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  // Gradients (3, 4): norm 5, clipped to 2.
  EXPECT_DOUBLE_EQ(ClipCoefficient(5.0, 2.0), 2.0 / 5.000001);
  // Below the threshold: untouched. At it, torch's epsilon still scales by 1 / (1 + 1e-6).
  EXPECT_EQ(ClipCoefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(ClipCoefficient(1.0, 1.0), 1.0 / 1.000001);
  EXPECT_EQ(ClipCoefficient(0.0, 1.0), 1.0);
  // Disabled.
  EXPECT_EQ(ClipCoefficient(1e9, 0.0), 1.0);
  EXPECT_EQ(ClipCoefficient(1e9, -1.0), 1.0);
}

}  // namespace
}  // namespace ps
