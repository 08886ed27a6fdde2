#include "model/kernels/rope.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Llama 3.1's published rope_scaling with head_dim 128, theta 500000.
RopeConfig Llama31Config() {
  RopeConfig c;
  c.head_dim = 128;
  c.theta = 500000.0;
  c.scaling_type = "llama3";
  c.llama3 = {8.0, 1.0, 4.0, 8192.0};
  return c;
}

// transformers' llama3 rule written directly in double: which branch each frequency takes.
double ReferenceLlama3(double f, const RopeLlama3Params& p) {
  const double wavelen = 2 * M_PI / f;
  const double low_wl = p.original_max_position_embeddings / p.low_freq_factor;
  const double high_wl = p.original_max_position_embeddings / p.high_freq_factor;
  if (wavelen < high_wl) return f;
  if (wavelen > low_wl) return f / p.factor;
  const double a = (p.original_max_position_embeddings / wavelen - p.low_freq_factor) /
                   (p.high_freq_factor - p.low_freq_factor);
  return (1 - a) * f / p.factor + a * f;
}

TEST(RopeTest, InverseFrequenciesMatchTheDefinition) {
  for (const RopeConfig& base :
       {RopeConfig{64, 10000.0, "", {}}, RopeConfig{128, 1000000.0, "default", {}},
        RopeConfig{2, 10000.0, "", {}}, Llama31Config()}) {
    const int64_t half = base.head_dim / 2;
    std::vector<float> f32(half);
    std::vector<double> f64(half), ref(half);
    ASSERT_OK(RopeInverseFrequencies<float>(base, absl::MakeSpan(f32)));
    ASSERT_OK(RopeInverseFrequencies<double>(base, absl::MakeSpan(f64)));
    int branches[3] = {0, 0, 0};
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::pow(base.theta, -2.0 * i / base.head_dim);
      ref[i] = base.scaling_type == "llama3" ? ReferenceLlama3(f, base.llama3) : f;
      if (base.scaling_type == "llama3") {
        branches[ref[i] == f ? 0 : (ref[i] == f / base.llama3.factor ? 2 : 1)]++;
      }
    }
    // f64: the same formula, only rounding differs. f32: every step rounded to f32 as torch does
    // (a few roundings of 6e-8 each).
    ExpectAllNear(f64, ref, 0, 1e-14, "f64 inv_freq");
    ExpectAllNear(f32, ref, 0, 5e-7, "f32 inv_freq");
    if (base.scaling_type == "llama3") {
      // Llama 3.1's numbers exercise all three branches (high, medium, low frequencies).
      EXPECT_GT(branches[0], 0);
      EXPECT_GT(branches[1], 0);
      EXPECT_GT(branches[2], 0);
    }
  }
}

TEST(RopeTest, TablesHoldCosAndSinOfPositionTimesFrequency) {
  const RopeConfig c = Llama31Config();
  const int64_t P = 300, half = 64;
  std::vector<float> cos(P * half), sin(P * half), inv(half);
  ASSERT_OK(RopeTables<float>(c, P, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  ASSERT_OK(RopeInverseFrequencies<float>(c, absl::MakeSpan(inv)));
  for (int64_t p = 0; p < P; p += 37) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = inv[i] * static_cast<float>(p);  // torch's f32 product
      EXPECT_NEAR(cos[p * half + i], std::cos(static_cast<double>(angle)), 6e-8) << p << "," << i;
      EXPECT_NEAR(sin[p * half + i], std::sin(static_cast<double>(angle)), 6e-8) << p << "," << i;
    }
  }
  EXPECT_EQ(cos[0], 1.0f);  // position 0: no rotation
  EXPECT_EQ(sin[half - 1], 0.0f);
}

// Hugging Face's apply_rotary_pos_emb written literally in double: x * cat(cos, cos) +
// cat(-x2, x1) * cat(sin, sin) on the first R channels (Phi-3's partial rotary), the rest kept.
std::vector<double> NaiveRope(const RopeShape& s, const std::vector<double>& cos,
                              const std::vector<double>& sin, const std::vector<double>& x) {
  const int64_t D = s.head_dim, R = s.rotated(), half = R / 2;
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.seq_len; ++t) {
      for (int64_t h = 0; h < s.num_heads; ++h) {
        const int64_t o = ((b * s.seq_len + t) * s.num_heads + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          if (d >= R) {
            y[o + d] = x[o + d];
            continue;
          }
          const double c = cos[t * half + d % half], sn = sin[t * half + d % half];
          const double rot = d < half ? -x[o + d + half] : x[o + d - half];
          y[o + d] = x[o + d] * c + rot * sn;
        }
      }
    }
  }
  return y;
}

TEST(RopeTest, FloatForwardMatchesRotateHalfDefinition) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  RopeConfig c{0, 10000.0, "", {}};
  // D = 2 (one pair); half not a vector width; several heads and batches; tables longer than T.
  // Partial rotary: Phi-4-mini's 96 of 128, 2 of 10, 4 of 6, and rotary_dim == head_dim.
  for (const RopeShape s :
       {RopeShape{1, 1, 1, 2, 1}, RopeShape{2, 13, 3, 10, 20}, RopeShape{1, 40, 2, 64, 40},
        RopeShape{3, 5, 4, 34, 9}, RopeShape{2, 9, 3, 128, 12, 96}, RopeShape{1, 6, 2, 10, 6, 2},
        RopeShape{2, 5, 3, 6, 5, 4}, RopeShape{1, 4, 1, 8, 4, 8}}) {
    c.head_dim = s.rotated();
    const int64_t half = s.rotated() / 2, n = s.batch * s.seq_len * s.num_heads * s.head_dim;
    std::vector<double> cos(s.table_positions * half), sin(s.table_positions * half);
    ASSERT_OK(RopeTables<double>(c, s.table_positions, absl::MakeSpan(cos), absl::MakeSpan(sin)));
    const std::vector<double> x = RandomVector<double>(gen, n, -2, 2);
    const std::vector<double> ref =
        NaiveRope(s, Convert<double>(Convert<float>(cos)), Convert<double>(Convert<float>(sin)),
                  Convert<double>(Convert<float>(x)));
    std::vector<float> y = Convert<float>(x);
    ASSERT_OK(
        RopeForward<float>(s, Convert<float>(cos), Convert<float>(sin), absl::MakeSpan(y), &pool));
    // Two products and a sum of |x| <= 2 values in f32.
    ExpectAllNear(y, ref, 1e-6, 1e-6, "rotated");
    // The backward undoes the forward (a rotation's transpose is its inverse).
    ASSERT_OK(
        RopeBackward<float>(s, Convert<float>(cos), Convert<float>(sin), absl::MakeSpan(y), &pool));
    ExpectAllNear(y, x, 1e-6, 1e-6, "round trip");
  }
}

TEST(RopeTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  RopeConfig c = Llama31Config();
  c.head_dim = 12;
  c.llama3.original_max_position_embeddings = 64;  // all three branches at head_dim 12
  const RopeShape s{2, 6, 3, 12, 8};
  const int64_t n = 2 * 6 * 3 * 12;
  std::vector<double> cos(8 * 6), sin(8 * 6);
  ASSERT_OK(RopeTables<double>(c, 8, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  std::vector<double> x = RandomVector<double>(gen, n, -2, 2);
  const std::vector<double> r = RandomVector<double>(gen, n);
  std::vector<double> y;
  auto loss = [&]() {
    y = x;
    PS_CHECK_OK(RopeForward<double>(s, cos, sin, absl::MakeSpan(y), nullptr));
    return Dot(y, r);
  };
  std::vector<double> dx = r;
  ASSERT_OK(RopeBackward<double>(s, cos, sin, absl::MakeSpan(dx), nullptr));
  ExpectGradientMatchesFiniteDifferences(x, dx, loss, "dx", 1e-9, 1e-7, 1000);
}

TEST(RopeTest, PartialRotaryRejectsBadRotaryDim) {
  const std::vector<float> cos(4 * 2), sin(4 * 2);
  std::vector<float> x(4 * 8);
  for (const int64_t r : {int64_t{-2}, int64_t{3}, int64_t{10}}) {
    const RopeShape s{1, 4, 1, 8, 4, r};
    EXPECT_THAT(RopeForward<float>(s, cos, sin, absl::MakeSpan(x), nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rotary_dim")));
  }
}

// longrope (Phi-3): inv_freq_i = 1 / (ext_i * theta^(2i/D)) in f32 steps, cos and sin scaled by
// the attention factor; its factors and attention factor are checked.
TEST(RopeTest, LongRopeTables) {
  RopeConfig c{8, 100.0, "longrope", {}, {1.5, 3.0, 0.5, 7.0}, std::sqrt(2.0)};
  std::vector<float> inv(4);
  ASSERT_OK(RopeInverseFrequencies<float>(c, absl::MakeSpan(inv)));
  for (int i = 0; i < 4; ++i) {
    const float power = static_cast<float>(std::pow(100.0, static_cast<double>(2.0f * i / 8.0f)));
    EXPECT_EQ(inv[i], 1.0f / (static_cast<float>(c.longrope_factors[i]) * power)) << i;
  }
  std::vector<float> cos(5 * 4), sin(5 * 4);
  ASSERT_OK(RopeTables<float>(c, 5, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  const float scale = static_cast<float>(std::sqrt(2.0));
  for (int p = 0; p < 5; ++p) {
    for (int i = 0; i < 4; ++i) {
      const double angle = static_cast<double>(inv[i] * static_cast<float>(p));
      EXPECT_EQ(cos[p * 4 + i], static_cast<float>(std::cos(angle)) * scale);
      EXPECT_EQ(sin[p * 4 + i], static_cast<float>(std::sin(angle)) * scale);
    }
  }
  RopeConfig bad = c;
  bad.longrope_factors.pop_back();
  EXPECT_THAT(ValidateRopeConfig(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("short_factor / long_factor")));
  bad = c;
  bad.longrope_factors[1] = 0;
  EXPECT_THAT(ValidateRopeConfig(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("short_factor / long_factor")));
  bad = c;
  bad.attention_factor = -1;
  EXPECT_THAT(ValidateRopeConfig(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("attention_factor")));
}

TEST(RopeTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const RopeConfig c{64, 500000.0, "", {}};
  const RopeShape s{2, 130, 5, 64, 130};
  std::vector<float> cos(130 * 32), sin(130 * 32);
  ASSERT_OK(RopeTables<float>(c, 130, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  const std::vector<float> x = RandomVector<float>(gen, 2 * 130 * 5 * 64);
  ThreadPool pool(4);
  std::vector<float> a = x, b = x;
  ASSERT_OK(RopeForward<float>(s, cos, sin, absl::MakeSpan(a), nullptr));
  ASSERT_OK(RopeForward<float>(s, cos, sin, absl::MakeSpan(b), &pool));
  EXPECT_EQ(a, b);
  ASSERT_OK(RopeBackward<float>(s, cos, sin, absl::MakeSpan(a), nullptr));
  ASSERT_OK(RopeBackward<float>(s, cos, sin, absl::MakeSpan(b), &pool));
  EXPECT_EQ(a, b);
}

// Linear scaling (Gemma 3's global layers): transformers' inv_freq /= factor, in T, and the tables
// of those frequencies; a non-positive factor is refused naming the key.
TEST(RopeTest, LinearScalingDividesTheDefaultFrequencies) {
  RopeConfig plain{.head_dim = 16, .theta = 100.0, .scaling_type = "", .llama3 = {}};
  RopeConfig linear = plain;
  linear.scaling_type = "linear";
  linear.linear_factor = 4.0;
  std::vector<float> f(8), g(8);
  ASSERT_OK(RopeInverseFrequencies<float>(plain, absl::MakeSpan(f)));
  ASSERT_OK(RopeInverseFrequencies<float>(linear, absl::MakeSpan(g)));
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(g[i], f[i] / 4.0f) << i;
  std::vector<float> cos(5 * 8), sin(5 * 8);
  ASSERT_OK(RopeTables<float>(linear, 5, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  for (int p = 0; p < 5; ++p) {
    for (int i = 0; i < 8; ++i) {
      const double angle = static_cast<double>(static_cast<float>(p) * g[i]);
      EXPECT_EQ(cos[p * 8 + i], static_cast<float>(std::cos(angle))) << p << " " << i;
    }
  }
  EXPECT_NE(cos[4 * 8 + 1], static_cast<float>(std::cos(4.0 * f[1])));
  linear.linear_factor = 0;
  EXPECT_THAT(ValidateRopeConfig(linear),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_scaling.factor")));
}

TEST(RopeTest, ConfigValidationNamesTheKey) {
  EXPECT_OK(ValidateRopeConfig(Llama31Config()));
  EXPECT_OK(ValidateRopeConfig(RopeConfig{64, 10000.0, "default", {}}));
  for (const std::string type : {"dynamic", "yarn", "su", "LLAMA3", "Linear"}) {
    RopeConfig c = Llama31Config();
    c.scaling_type = type;
    EXPECT_THAT(ValidateRopeConfig(c),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("rope_scaling.rope_type"), HasSubstr("\"" + type + "\""),
                               HasSubstr("llama3"))));
  }
  RopeConfig c = Llama31Config();
  c.llama3.high_freq_factor = 1.0;
  EXPECT_THAT(ValidateRopeConfig(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("rope_scaling.high_freq_factor")));
  c = Llama31Config();
  c.llama3.factor = 0;
  EXPECT_THAT(ValidateRopeConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_scaling.factor")));
  c = Llama31Config();
  c.llama3.original_max_position_embeddings = -1;
  EXPECT_THAT(ValidateRopeConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rope_scaling.original_max_position_embeddings")));
  c = Llama31Config();
  c.theta = 0;
  EXPECT_THAT(ValidateRopeConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_theta")));
  c = Llama31Config();
  c.head_dim = 7;
  EXPECT_THAT(ValidateRopeConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
  // The table builder validates too.
  c.scaling_type = "yarn";
  c.head_dim = 8;
  std::vector<float> t(4);
  EXPECT_THAT(RopeTables<float>(c, 1, absl::MakeSpan(t), absl::MakeSpan(t)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_scaling.rope_type")));
}

TEST(RopeTest, RejectsBadShapes) {
  std::vector<float> cos(4 * 3), sin(4 * 3), x(2 * 5 * 1 * 6);
  EXPECT_THAT(RopeForward<float>({2, 5, 1, 6, 4}, cos, sin, absl::MakeSpan(x), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seq_len 5 exceeds")));
  EXPECT_THAT(RopeForward<float>({2, 4, 1, 5, 4}, cos, sin, absl::MakeSpan(x), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd")));
  EXPECT_THAT(RopeForward<float>({2, 4, 1, 6, 4}, absl::MakeSpan(cos).subspan(1), sin,
                                 absl::MakeSpan(x).subspan(0, 48), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cos")));
  EXPECT_THAT(RopeBackward<float>({2, 4, 1, 6, 4}, cos, sin, absl::MakeSpan(x), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx has 60")));
}

}  // namespace
}  // namespace ps
