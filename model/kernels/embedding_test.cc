#include "model/kernels/embedding.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

TEST(EmbeddingTest, ForwardGathersAndBackwardScattersWithPadding) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const int64_t padding_idx : {int64_t{-1}, int64_t{3}}) {
    // C above one 64-channel backward task and not a multiple of a vector; repeated tokens.
    const EmbeddingShape s{50, 130, 7, padding_idx};
    std::vector<int32_t> tokens(s.rows);
    for (int32_t& t : tokens) t = absl::Uniform<int32_t>(gen, 0, 7);
    tokens[0] = tokens[1] = 3;
    const std::vector<float> wte = RandomVector<float>(gen, 7 * 130),
                             dout = RandomVector<float>(gen, 50 * 130);
    std::vector<float> out(50 * 130), dwte(7 * 130, 0.25f);
    ASSERT_OK(EmbeddingForward<float>(s, tokens, wte, absl::MakeSpan(out), &pool));
    ASSERT_OK(EmbeddingBackward<float>(s, tokens, dout, absl::MakeSpan(dwte), &pool));
    std::vector<double> dwte_ref(7 * 130, 0.25);
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < 130; ++c) {
        ASSERT_EQ(out[r * 130 + c], wte[tokens[r] * 130 + c]);
        if (tokens[r] != padding_idx) dwte_ref[tokens[r] * 130 + c] += dout[r * 130 + c];
      }
    }
    // Up to 50 f32 additions of O(1) terms.
    ExpectAllNear(dwte, dwte_ref, 1e-5, 1e-6, "dwte");
    if (padding_idx >= 0) {
      for (int64_t c = 0; c < 130; ++c) ASSERT_EQ(dwte[padding_idx * 130 + c], 0.25f);
    }
  }
}

TEST(EmbeddingTest, BackwardDoesNotDependOnThreadCount) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const EmbeddingShape s{300, 200, 5, -1};
  std::vector<int32_t> tokens(300);
  for (int32_t& t : tokens) t = absl::Uniform<int32_t>(gen, 0, 5);
  const std::vector<float> dout = RandomVector<float>(gen, 300 * 200);
  ThreadPool pool(4);
  std::vector<float> a(5 * 200, 0.f), b(5 * 200, 0.f);
  ASSERT_OK(EmbeddingBackward<float>(s, tokens, dout, absl::MakeSpan(a), nullptr));
  ASSERT_OK(EmbeddingBackward<float>(s, tokens, dout, absl::MakeSpan(b), &pool));
  EXPECT_EQ(a, b);
}

TEST(EmbeddingTest, RejectsBadTokensAndShapes) {
  std::vector<float> wte(4 * 2), out(3 * 2);
  const std::vector<int32_t> tokens = {0, 4, 1};
  EXPECT_THAT(EmbeddingForward<float>({3, 2, 4}, tokens, wte, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("token 4 at index 1 is outside [0, vocab_size=4)")));
  const std::vector<int32_t> ok = {0, 3, 1};
  EXPECT_THAT(EmbeddingForward<float>({3, 2, 4, 4}, ok, wte, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("padding_idx 4")));
  EXPECT_THAT(EmbeddingForward<float>({3, 2, 4}, ok, absl::MakeSpan(wte).subspan(1),
                                      absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wte")));
  EXPECT_THAT(EmbeddingBackward<float>({3, 2, 4}, ok, absl::MakeSpan(out).subspan(2),
                                       absl::MakeSpan(wte), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dout")));
}

}  // namespace
}  // namespace ps
