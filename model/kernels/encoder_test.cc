#include "model/kernels/encoder.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype_math.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

std::vector<int32_t> RandomTokens(TestRng& gen, int64_t n, int64_t vocab) {
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = absl::Uniform<int32_t>(gen, 0, static_cast<int32_t>(vocab));
  return tokens;
}

// B=1 and B>1, C not a multiple of any vector width, T < max_T, more channels than one task.
const EncoderShape kShapes[] = {{1, 5, 7, 11, 9}, {3, 13, 67, 17, 16}, {2, 4, 130, 5, 4}};

// The bf16 variant widens the rows it reads: bit-identical to the f32 kernel on the widened
// table (odd channel counts cross the vector tails; NaN and Inf rows go through too).
TEST(EncoderTest, Bf16ForwardEqualsF32OnTheWidenedTable) {
  TestRng gen(7);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const EncoderShape s : {EncoderShape{2, 5, 7, 11, 9}, EncoderShape{3, 33, 130, 50, 40},
                               EncoderShape{1, 1, 1, 1, 1}}) {
    const int64_t B = s.batch, L = s.seq_len, C = s.channels, V = s.vocab_size;
    std::vector<uint16_t> wte_bits(V * C);
    std::vector<float> wte(V * C);
    for (int64_t i = 0; i < V * C; ++i) {
      wte_bits[i] = FloatToBFloat16Bits(absl::Uniform(gen, -3.0f, 3.0f));
      wte[i] = BFloat16BitsToFloat(wte_bits[i]);
    }
    wte_bits[0] = FloatToBFloat16Bits(INFINITY);
    wte[0] = INFINITY;
    const std::vector<float> wpe = RandomVector<float>(gen, s.max_seq_len * C);
    std::vector<int32_t> tokens(B * L);
    for (int32_t& t : tokens) t = absl::Uniform<int32_t>(gen, 0, static_cast<int32_t>(V));
    std::vector<float> want(B * L * C), got(B * L * C, -1.f);
    ASSERT_OK(EncoderForward<float>(s, tokens, wte, wpe, absl::MakeSpan(want), &pool));
    ASSERT_OK(EncoderForwardBf16(s, tokens, wte_bits, wpe, absl::MakeSpan(got), &pool));
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  }
  std::vector<uint16_t> short_wte(10);
  std::vector<float> wpe(9), out(2);
  EXPECT_THAT(EncoderForwardBf16({1, 2, 1, 11, 9}, std::vector<int32_t>{1, 2}, short_wte, wpe,
                                 absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wte has 10")));
}

TEST(EncoderTest, ForwardAndBackwardMatchNaiveLoops) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const EncoderShape& s : kShapes) {
    const int64_t B = s.batch, L = s.seq_len, C = s.channels;
    const std::vector<int32_t> tokens = RandomTokens(gen, B * L, s.vocab_size);
    const std::vector<float> wte = RandomVector<float>(gen, s.vocab_size * C);
    const std::vector<float> wpe = RandomVector<float>(gen, s.max_seq_len * C);
    const std::vector<float> dout = RandomVector<float>(gen, B * L * C);
    std::vector<float> out(B * L * C, -7.f);
    std::vector<float> dwte(wte.size(), 0.5f), dwpe(wpe.size(), 0.25f);
    ASSERT_OK(EncoderForward<float>(s, tokens, wte, wpe, absl::MakeSpan(out), &pool));
    ASSERT_OK(
        EncoderBackward<float>(s, tokens, dout, absl::MakeSpan(dwte), absl::MakeSpan(dwpe), &pool));
    // The reference: the definition, element by element, in double.
    std::vector<double> out_ref(out.size()), dwte_ref(wte.size(), 0.5), dwpe_ref(wpe.size(), 0.25);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < L; ++t) {
        const int64_t row = b * L + t;
        for (int64_t c = 0; c < C; ++c) {
          out_ref[row * C + c] = double{wte[tokens[row] * C + c]} + wpe[t * C + c];
          dwte_ref[tokens[row] * C + c] += dout[row * C + c];
          dwpe_ref[t * C + c] += dout[row * C + c];
        }
      }
    }
    // A sum of two floats rounds once (relative 6e-8); the scatters add up to B*T floats of
    // magnitude <= 1, so 1e-5 absolute is a generous bound on float accumulation error.
    ExpectAllNear(out, out_ref, 0, 1.2e-7, "out");
    ExpectAllNear(dwte, dwte_ref, 1e-5, 0, "dwte");
    ExpectAllNear(dwpe, dwpe_ref, 1e-5, 0, "dwpe");
  }
}

TEST(EncoderTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);                       // fixed seed: reproducible failures
  const EncoderShape s{2, 6, 5, 4, 8};  // V=4 < B*T: tokens repeat, so the scatter accumulates.
  const int64_t n_out = s.batch * s.seq_len * s.channels;
  const std::vector<int32_t> tokens = RandomTokens(gen, s.batch * s.seq_len, s.vocab_size);
  std::vector<double> wte = RandomVector<double>(gen, s.vocab_size * s.channels);
  std::vector<double> wpe = RandomVector<double>(gen, s.max_seq_len * s.channels);
  const std::vector<double> r = RandomVector<double>(gen, n_out);
  std::vector<double> out(n_out);
  auto loss = [&]() {
    PS_CHECK_OK(EncoderForward<double>(s, tokens, wte, wpe, absl::MakeSpan(out), nullptr));
    return Dot(out, r);
  };
  std::vector<double> dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  ASSERT_OK(
      EncoderBackward<double>(s, tokens, r, absl::MakeSpan(dwte), absl::MakeSpan(dwpe), nullptr));
  ExpectGradientMatchesFiniteDifferences(wte, dwte, loss, "dwte", 1e-8, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(wpe, dwpe, loss, "dwpe", 1e-8, 1e-7, 1000);
}

TEST(EncoderTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const EncoderShape s{4, 9, 200, 6, 9};
  const std::vector<int32_t> tokens = RandomTokens(gen, s.batch * s.seq_len, s.vocab_size);
  const std::vector<float> dout = RandomVector<float>(gen, s.batch * s.seq_len * s.channels);
  std::vector<float> dwte1(s.vocab_size * s.channels, 0.f), dwpe1(s.max_seq_len * s.channels, 0.f);
  std::vector<float> dwte2 = dwte1, dwpe2 = dwpe1;
  ThreadPool pool(4);
  ASSERT_OK(EncoderBackward<float>(s, tokens, dout, absl::MakeSpan(dwte1), absl::MakeSpan(dwpe1),
                                   nullptr));
  ASSERT_OK(
      EncoderBackward<float>(s, tokens, dout, absl::MakeSpan(dwte2), absl::MakeSpan(dwpe2), &pool));
  EXPECT_EQ(dwte1, dwte2);
  EXPECT_EQ(dwpe1, dwpe2);
}

TEST(EncoderTest, RejectsBadTokensAndShapes) {
  const EncoderShape s{1, 2, 3, 4, 2};
  std::vector<float> wte(12), wpe(6), out(6);
  EXPECT_THAT(
      EncoderForward<float>(s, std::vector<int32_t>{0, 4}, wte, wpe, absl::MakeSpan(out), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 4")));
  EXPECT_THAT(
      EncoderForward<float>(s, std::vector<int32_t>{0, -1}, wte, wpe, absl::MakeSpan(out), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token -1")));
  EXPECT_THAT(
      EncoderForward<float>(s, std::vector<int32_t>{0}, wte, wpe, absl::MakeSpan(out), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
  EXPECT_THAT(EncoderForward<float>({1, 3, 3, 4, 2}, std::vector<int32_t>{0, 1, 2}, wte, wpe,
                                    absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_seq_len")));
  EXPECT_THAT(EncoderForward<float>({1, 2, 3, 4, 2}, std::vector<int32_t>{0, 1}, wte,
                                    absl::MakeSpan(wpe).subspan(1), absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wpe")));
  EXPECT_THAT(EncoderForward<float>({0, 2, 3, 4, 2}, std::vector<int32_t>{}, wte, wpe,
                                    absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch")));
}

}  // namespace
}  // namespace ps
