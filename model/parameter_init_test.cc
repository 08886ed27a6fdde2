#include "model/parameter_init.h"

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model_config.h"

namespace ps {
namespace {

using ::testing::ElementsAreArray;

std::vector<float> Normal(uint64_t seed, uint64_t stream, double std, int64_t first_elem,
                          int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  FillNormal(seed, stream, std, first_elem, absl::MakeSpan(out));
  return out;
}

// The values below were produced, independently of this code, by this Python 3 script (no
// libraries: a transcription of SplitMix64 and of mt19937_64 as the C++ standard defines it; from
// seed 5489 its generator gives 14514284786278117030 first and the standard's 9981545732273789042
// as its 10000th output), printing normal(1234, 5, 0.02, 8) and normal(0, 0, 1.0, 3) with
// float.hex:
//
//   import math, struct
//   M64 = (1 << 64) - 1
//   def splitmix64(x):
//       x = (x + 0x9E3779B97F4A7C15) & M64
//       x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
//       x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
//       return x ^ (x >> 31)
//   def mt19937_64(seed):
//       mt = [seed & M64]
//       for i in range(1, 312):
//           mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & M64)
//       i = 312
//       while True:
//           if i >= 312:
//               for k in range(312):
//                   x = (mt[k] & 0xFFFFFFFF80000000) | (mt[(k + 1) % 312] & 0x7FFFFFFF)
//                   xa = (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
//                   mt[k] = mt[(k + 156) % 312] ^ xa
//               i = 0
//           y = mt[i]; i += 1
//           y ^= (y >> 29) & 0x5555555555555555
//           y ^= (y << 17) & 0x71D67FFFEDA60000
//           y ^= (y << 37) & 0xFFF7EEE000000000
//           y ^= y >> 43
//           yield y & M64
//   def f32(x):
//       return struct.unpack('f', struct.pack('f', x))[0]
//   def normal(seed, stream, std, n):
//       gen = mt19937_64(splitmix64(seed ^ splitmix64(stream)))
//       out = []
//       while len(out) < n:
//           u1 = ((next(gen) >> 11) + 1) * 2.0**-53
//           u2 = (next(gen) >> 11) * 2.0**-53
//           r = math.sqrt(-2.0 * math.log(u1))
//           out += [f32(std * r * math.cos(2 * math.pi * u2)),
//                   f32(std * r * math.sin(2 * math.pi * u2))]
//       return out[:n]
TEST(FillNormalTest, MatchesAnIndependentReference) {
  EXPECT_THAT(Normal(1234, 5, 0.02, 0, 8),
              ElementsAreArray({0x1.2ccd74p-6f, -0x1.3f5a2ep-6f, 0x1.0ea964p-7f, 0x1.f648f4p-6f,
                                0x1.f4830ap-8f, 0x1.f283dcp-8f, -0x1.12766p-7f, 0x1.4b06b6p-5f}));
  EXPECT_THAT(Normal(0, 0, 1.0, 0, 3),
              ElementsAreArray({0x1.f9bb1ep-1f, 0x1.641372p-1f, -0x1.25664cp+0f}));
}

TEST(FillNormalTest, IsDeterministic) {
  EXPECT_EQ(Normal(7, 3, 0.02, 0, 1001), Normal(7, 3, 0.02, 0, 1001));
}

TEST(FillNormalTest, AnyRangeEqualsThatRangeOfTheWhole) {
  const std::vector<float> whole = Normal(42, 9, 0.5, 0, 257);
  // Ranges starting on even and odd elements, ending on both, one element, and the tail.
  for (const auto& [first, n] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {1, 1}, {1, 2}, {2, 5}, {3, 6}, {100, 57}, {255, 2}, {256, 1}}) {
    SCOPED_TRACE(testing::Message() << "first " << first << ", n " << n);
    EXPECT_EQ(Normal(42, 9, 0.5, first, n),
              std::vector<float>(whole.begin() + first, whole.begin() + first + n));
  }
}

TEST(FillNormalTest, StreamsAndSeedsAreIndependent) {
  const std::vector<float> base = Normal(1, 0, 1.0, 0, 64);
  for (const std::vector<float>& other :
       {Normal(1, 1, 1.0, 0, 64), Normal(2, 0, 1.0, 0, 64), Normal(0, 1, 1.0, 0, 64)}) {
    int equal = 0;
    for (size_t i = 0; i < base.size(); ++i) equal += base[i] == other[i];
    EXPECT_EQ(equal, 0);
  }
}

TEST(FillNormalTest, ScalesWithStd) {
  const std::vector<float> one = Normal(5, 2, 1.0, 0, 32);
  const std::vector<float> half = Normal(5, 2, 0.5, 0, 32);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(half[i], one[i] / 2) << i;
}

TEST(InitOfTest, Gpt2) {
  using Kind = ParameterInit::Kind;
  const auto init = [](const char* name) { return InitOf(ModelArchitecture::kGpt2, 8, name); };
  EXPECT_EQ(init("h.3.ln_1.weight").kind, Kind::kConstant);
  EXPECT_EQ(init("h.3.ln_1.weight").value, 1.0f);
  EXPECT_EQ(init("ln_f.bias").kind, Kind::kConstant);
  EXPECT_EQ(init("ln_f.bias").value, 0.0f);
  EXPECT_EQ(init("h.0.attn.c_attn.bias").kind, Kind::kConstant);
  EXPECT_EQ(init("h.0.attn.c_attn.bias").value, 0.0f);
  EXPECT_EQ(init("wte.weight").kind, Kind::kNormal);
  EXPECT_EQ(init("wte.weight").std, 0.02);
  EXPECT_EQ(init("h.0.attn.c_attn.weight").std, 0.02);
  EXPECT_EQ(init("h.0.mlp.c_fc.weight").std, 0.02);
  EXPECT_EQ(init("h.0.attn.c_proj.weight").kind, Kind::kNormal);
  EXPECT_EQ(init("h.0.attn.c_proj.weight").std, 0.02 / 4);  // sqrt(2 * 8) = 4
  EXPECT_EQ(init("h.7.mlp.c_proj.weight").std, 0.02 / 4);
}

TEST(InitOfTest, Llama) {
  using Kind = ParameterInit::Kind;
  const auto init = [](const char* name) { return InitOf(ModelArchitecture::kLlama, 8, name); };
  EXPECT_EQ(init("model.layers.0.input_layernorm.weight").kind, Kind::kConstant);
  EXPECT_EQ(init("model.layers.0.input_layernorm.weight").value, 1.0f);
  EXPECT_EQ(init("model.layers.1.post_attention_layernorm.weight").value, 1.0f);
  EXPECT_EQ(init("model.norm.weight").value, 1.0f);
  EXPECT_EQ(init("model.layers.0.self_attn.q_norm.weight").kind, Kind::kConstant);
  EXPECT_EQ(init("model.layers.0.self_attn.q_norm.weight").value, 1.0f);
  EXPECT_EQ(init("model.layers.1.self_attn.k_norm.weight").value, 1.0f);
  EXPECT_EQ(init("model.layers.0.self_attn.q_proj.bias").kind, Kind::kConstant);
  EXPECT_EQ(init("model.layers.0.self_attn.q_proj.bias").value, 0.0f);
  // No residual scaling for Llama.
  EXPECT_EQ(init("model.layers.0.mlp.down_proj.weight").kind, Kind::kNormal);
  EXPECT_EQ(init("model.layers.0.mlp.down_proj.weight").std, 0.02);
  EXPECT_EQ(init("model.layers.0.self_attn.o_proj.weight").std, 0.02);
  EXPECT_EQ(init("model.embed_tokens.weight").std, 0.02);
  EXPECT_EQ(init("lm_head.weight").std, 0.02);
  // Gemma's RMSNorm gain is (1 + w): its weights start at 0 (transformers zeroes them), every
  // other tensor as without the offset.
  const auto gemma = [](const char* name) {
    return InitOf(ModelArchitecture::kLlama, 8, name, /*norm_weight_offset=*/1.0);
  };
  EXPECT_EQ(gemma("model.layers.0.input_layernorm.weight").value, 0.0f);
  EXPECT_EQ(gemma("model.layers.0.pre_feedforward_layernorm.weight").value, 0.0f);
  EXPECT_EQ(gemma("model.layers.0.post_feedforward_layernorm.weight").value, 0.0f);
  EXPECT_EQ(gemma("model.layers.0.self_attn.q_norm.weight").value, 0.0f);
  EXPECT_EQ(gemma("model.norm.weight").kind, Kind::kConstant);
  EXPECT_EQ(gemma("model.norm.weight").value, 0.0f);
  EXPECT_EQ(gemma("model.embed_tokens.weight").std, 0.02);
}

TEST(FillInitialValuesTest, ConstantOrTheStream) {
  std::vector<float> out(5, -1.0f);
  FillInitialValues({.kind = ParameterInit::Kind::kConstant, .value = 1.0f}, 3, 4, 2,
                    absl::MakeSpan(out));
  EXPECT_THAT(out, ElementsAreArray({1.0f, 1.0f, 1.0f, 1.0f, 1.0f}));
  FillInitialValues({.kind = ParameterInit::Kind::kNormal, .std = 0.02}, 3, 4, 2,
                    absl::MakeSpan(out));
  EXPECT_EQ(out, Normal(3, 4, 0.02, 2, 5));
}

}  // namespace
}  // namespace ps
