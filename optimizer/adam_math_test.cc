// Tests for optimizer/adam_math.h: hand-computed steps, and the f32 reference against an
// independent double-precision transcription of torch.optim.Adam/AdamW over many steps.
#include "optimizer/adam_math.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "base/testing/test_rng.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// torch.optim.Adam/AdamW's documented algorithm in double.
struct DoubleAdam {
  AdamMode mode;
  double lr, beta1, beta2, eps, weight_decay;
  double p = 0, m = 0, v = 0;
  int64_t t = 0;

  void Step(double g) {
    ++t;
    if (mode == AdamMode::kAdam) {
      g += weight_decay * p;
    } else {
      p *= 1 - lr * weight_decay;
    }
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double m_hat = m / (1 - std::pow(beta1, t));
    const double v_hat = v / (1 - std::pow(beta2, t));
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST(AdamMathTest, FirstStepMovesByLrTimesSignOfGradient) {
  // With m = v = 0 the first bias-corrected step is lr * g / (|g| + eps) = lr * sign(g).
  const AdamStepScalars s = MakeAdamStepScalars(AdamMode::kAdam, 0.1, 0.9, 0.999, 1e-8, 0.0, 1);
  float p = 1.0f, m = 0.0f, v = 0.0f;
  AdamUpdate(s, 0.5f, p, m, v);
  EXPECT_FLOAT_EQ(m, 0.05f);
  EXPECT_FLOAT_EQ(v, 0.00025f);
  EXPECT_NEAR(p, 0.9f, 1e-6f);

  float q = 1.0f, mq = 0.0f, vq = 0.0f;
  AdamUpdate(s, -3.0f, q, mq, vq);
  EXPECT_NEAR(q, 1.1f, 1e-6f);
}

TEST(AdamMathTest, ScalarsAreBiasCorrected) {
  const AdamStepScalars s =
      MakeAdamStepScalars(AdamMode::kAdam, 1e-3, 0.9, 0.999, 1e-8, 0.0, /*step=*/3);
  EXPECT_FLOAT_EQ(s.step_size, static_cast<float>(1e-3 / (1 - 0.9 * 0.9 * 0.9)));
  EXPECT_FLOAT_EQ(s.inv_sqrt_bias_correction2,
                  static_cast<float>(1 / std::sqrt(1 - 0.999 * 0.999 * 0.999)));
  EXPECT_FLOAT_EQ(s.one_minus_beta1, 0.1f);
  EXPECT_EQ(s.l2, 0.0f);
  EXPECT_EQ(s.decay, 1.0f);
}

TEST(AdamMathTest, WeightDecayIsL2ForAdamAndDecoupledForAdamW) {
  const AdamStepScalars adam = MakeAdamStepScalars(AdamMode::kAdam, 0.01, 0.9, 0.99, 1e-8, 0.1, 1);
  EXPECT_FLOAT_EQ(adam.l2, 0.1f);
  EXPECT_EQ(adam.decay, 1.0f);
  const AdamStepScalars adamw =
      MakeAdamStepScalars(AdamMode::kAdamW, 0.01, 0.9, 0.99, 1e-8, 0.1, 1);
  EXPECT_EQ(adamw.l2, 0.0f);
  EXPECT_FLOAT_EQ(adamw.decay, 1.0f - 0.001f);

  // Zero gradient, p = 2: AdamW decays p and then takes no Adam step (m = 0); Adam sees the L2
  // gradient 0.1 * 2 = 0.2 and moves by lr.
  float p = 2.0f, m = 0.0f, v = 0.0f;
  AdamUpdate(adamw, 0.0f, p, m, v);
  EXPECT_FLOAT_EQ(p, 2.0f * (1.0f - 0.001f));
  EXPECT_EQ(m, 0.0f);
  p = 2.0f, m = 0.0f, v = 0.0f;
  AdamUpdate(adam, 0.0f, p, m, v);
  EXPECT_NEAR(p, 2.0f - 0.01f, 1e-6f);
  EXPECT_FLOAT_EQ(m, 0.1f * 0.2f);
}

TEST(AdamMathTest, LossScaleAndClipCoefficientScaleTheGradient) {
  const AdamStepScalars s = MakeAdamStepScalars(AdamMode::kAdam, 0.01, 0.9, 0.99, 1e-8, 0.0, 1,
                                                /*loss_scale=*/1024.0, /*clip_coef=*/0.5);
  EXPECT_FLOAT_EQ(AdamEffectiveGrad(s, 2048.0f), 1.0f);
  float p = 0.0f, m = 0.0f, v = 0.0f;
  AdamUpdate(s, 2048.0f, p, m, v);
  EXPECT_FLOAT_EQ(m, 0.1f);   // (1 - beta1) * 1
  EXPECT_FLOAT_EQ(v, 0.01f);  // (1 - beta2) * 1
}

// Many steps of random gradients, f32 reference against the double transcription: the relative
// error stays at the level of f32 rounding.
TEST(AdamMathTest, MatchesDoublePrecisionAlgorithmOverManySteps) {
  TestRng rng(42);
  std::normal_distribution<double> normal;
  for (AdamMode mode : {AdamMode::kAdam, AdamMode::kAdamW}) {
    for (int trial = 0; trial < 50; ++trial) {
      DoubleAdam ref{mode, 1e-3, 0.9, 0.999, 1e-8, 0.01};
      ref.p = normal(rng);
      float p = static_cast<float>(ref.p), m = 0.0f, v = 0.0f;
      ref.p = p;
      for (int64_t step = 1; step <= 100; ++step) {
        const float g = static_cast<float>(normal(rng));
        ref.Step(g);
        AdamUpdate(MakeAdamStepScalars(mode, ref.lr, ref.beta1, ref.beta2, ref.eps,
                                       ref.weight_decay, step),
                   g, p, m, v);
      }
      EXPECT_NEAR(p, ref.p, 1e-5 * (1 + std::abs(ref.p))) << "trial " << trial;
      // m is an average of O(1) gradients that may nearly cancel: absolute tolerance at the
      // scale of the gradients. v has no cancellation: relative.
      EXPECT_NEAR(m, ref.m, 1e-6);
      EXPECT_NEAR(v, ref.v, 1e-5 * std::abs(ref.v));
    }
  }
}

}  // namespace
}  // namespace ps
