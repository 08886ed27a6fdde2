// Per-token positions (packed documents restart at 0): RoPE (model/kernels/rope.h) and GPT-2's
// learned positions (model/kernels/vocab_blocks.h). A row at position p must come out exactly as
// the same row does at sequence index p without positions; positions 0 .. T-1 are the default;
// positions outside the tables are refused naming (b, t). transformers' reference is
// masked_attention_vectors_test.cc.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/rope.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/vocab_blocks.h"

namespace ps {
namespace {

using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

// Positions that restart at random document starts, so every value 0 .. max_len-1 occurs.
std::vector<int32_t> RandomPositions(TestRng& gen, int64_t B, int64_t T, int64_t max_len) {
  std::vector<int32_t> pos(B * T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t start = 0; start < T;) {
      const int64_t len = std::min(T - start, absl::Uniform<int64_t>(gen, 1, max_len + 1));
      for (int64_t t = start; t < start + len; ++t)
        pos[b * T + t] = static_cast<int32_t>(t - start);
      start += len;
    }
  }
  return pos;
}

template <typename T>
void CheckRopeRowAtPositionEqualsRowAtIndex() {
  TestRng gen(201);
  ThreadPool pool(3);
  const int64_t B = 3, L = 40, H = 3, D = 12, P = 50;
  RopeConfig config;
  config.head_dim = D;
  config.theta = 500000.0;
  std::vector<T> cos(P * D / 2), sin(P * D / 2);
  ASSERT_OK(RopeTables<T>(config, P, absl::MakeSpan(cos), absl::MakeSpan(sin)));
  const RopeShape s{.batch = B, .seq_len = L, .num_heads = H, .head_dim = D, .table_positions = P};
  std::vector<int32_t> positions = RandomPositions(gen, B, L, 15);
  positions[5] = static_cast<int32_t>(P - 1);  // any value in the table, not only < T
  const std::vector<T> x = RandomVector<T>(gen, B * L * H * D);
  for (const bool inverse : {false, true}) {
    std::vector<T> y = x;
    if (inverse) {
      ASSERT_OK(RopeBackward<T>(s, cos, sin, absl::MakeSpan(y), &pool, positions));
    } else {
      ASSERT_OK(RopeForward<T>(s, cos, sin, absl::MakeSpan(y), &pool, positions));
    }
    // Row r alone, placed at index positions[r] of a sequence of P rows, rotated without
    // positions: the same bits.
    for (int64_t r = 0; r < B * L; ++r) {
      const RopeShape one{
          .batch = 1, .seq_len = P, .num_heads = H, .head_dim = D, .table_positions = P};
      std::vector<T> seq(P * H * D, T{0});
      const int64_t p = positions[r];
      std::copy(x.begin() + r * H * D, x.begin() + (r + 1) * H * D, seq.begin() + p * H * D);
      if (inverse) {
        ASSERT_OK(RopeBackward<T>(one, cos, sin, absl::MakeSpan(seq), nullptr));
      } else {
        ASSERT_OK(RopeForward<T>(one, cos, sin, absl::MakeSpan(seq), nullptr));
      }
      for (int64_t e = 0; e < H * D; ++e) {
        ASSERT_EQ(y[r * H * D + e], seq[p * H * D + e]) << "row " << r << " inverse " << inverse;
      }
    }
  }
  // Positions 0 .. T-1 are the default.
  std::vector<int32_t> identity(B * L);
  for (int64_t r = 0; r < B * L; ++r) identity[r] = static_cast<int32_t>(r % L);
  std::vector<T> a = x, b = x;
  ASSERT_OK(RopeForward<T>(s, cos, sin, absl::MakeSpan(a), &pool, identity));
  ASSERT_OK(RopeForward<T>(s, cos, sin, absl::MakeSpan(b), &pool));
  EXPECT_EQ(a, b);
}
TEST(PositionsTest, RopeRowAtPositionEqualsRowAtIndexFloat) {
  CheckRopeRowAtPositionEqualsRowAtIndex<float>();
}
TEST(PositionsTest, RopeRowAtPositionEqualsRowAtIndexDouble) {
  CheckRopeRowAtPositionEqualsRowAtIndex<double>();
}

TEST(PositionsTest, RopeRejectsPositionsOutsideTheTables) {
  const RopeShape s{.batch = 2, .seq_len = 3, .num_heads = 1, .head_dim = 2, .table_positions = 4};
  std::vector<float> cos(4), sin(4), x(12);
  EXPECT_THAT(RopeForward<float>(s, cos, sin, absl::MakeSpan(x), nullptr, {0, 1, 2, 0, 4, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("positions[b=1, t=1] = 4 is outside the cos/sin tables' [0, 4)")));
  EXPECT_THAT(RopeBackward<float>(s, cos, sin, absl::MakeSpan(x), nullptr, {0, -1, 2, 0, 1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positions[b=0, t=1] = -1")));
  EXPECT_THAT(RopeForward<float>(s, cos, sin, absl::MakeSpan(x), nullptr, {0, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("positions has 2 elements, expected B*T = 6")));
}

// out[b,t] += wpe[pos] is one addition per element: exactly x + wpe[pos]. dwpe[p] receives the
// dout rows at position p in (b, t) order: exactly a sequential loop in that order.
TEST(PositionsTest, PositionEmbeddingWithPositionsIsTheIndexedSum) {
  TestRng gen(202);
  ThreadPool pool(3);
  const int64_t B = 3, L = 50, C = 70, P = 60;
  const std::vector<int32_t> positions = RandomPositions(gen, B, L, 20);
  const std::vector<float> wpe = RandomVector<float>(gen, P * C);
  const std::vector<float> x = RandomVector<float>(gen, B * L * C);
  const std::vector<float> dout = RandomVector<float>(gen, B * L * C);
  const std::vector<float> dwpe0 = RandomVector<float>(gen, P * C);
  std::vector<float> out = x, dwpe = dwpe0, out_r = x, dwpe_r = dwpe0;
  ASSERT_OK(PositionEmbeddingForward<float>(B, L, C, wpe, absl::MakeSpan(out), &pool, positions));
  ASSERT_OK(
      PositionEmbeddingBackward<float>(B, L, C, dout, absl::MakeSpan(dwpe), &pool, positions));
  for (int64_t r = 0; r < B * L; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      out_r[r * C + c] += wpe[positions[r] * C + c];
      dwpe_r[positions[r] * C + c] += dout[r * C + c];
    }
  }
  EXPECT_EQ(out, out_r);
  EXPECT_EQ(dwpe, dwpe_r);
  // Positions 0 .. T-1 are the default, bit for bit.
  std::vector<int32_t> identity(B * L);
  for (int64_t r = 0; r < B * L; ++r) identity[r] = static_cast<int32_t>(r % L);
  std::vector<float> a = x, b = x, da = dwpe0, db = dwpe0;
  ASSERT_OK(PositionEmbeddingForward<float>(B, L, C, wpe, absl::MakeSpan(a), &pool, identity));
  ASSERT_OK(PositionEmbeddingForward<float>(B, L, C, wpe, absl::MakeSpan(b), &pool));
  ASSERT_OK(PositionEmbeddingBackward<float>(B, L, C, dout, absl::MakeSpan(da), &pool, identity));
  ASSERT_OK(PositionEmbeddingBackward<float>(B, L, C, dout, absl::MakeSpan(db), &pool));
  EXPECT_EQ(a, b);
  EXPECT_EQ(da, db);
}

TEST(PositionsTest, PositionEmbeddingRejectsPositionsOutsideTheTable) {
  std::vector<float> wpe(5 * 2), out(2 * 3 * 2);
  EXPECT_THAT(
      PositionEmbeddingForward<float>(2, 3, 2, wpe, absl::MakeSpan(out), nullptr,
                                      {0, 1, 2, 0, 1, 5}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("positions[b=1, t=2] = 5 is outside the position table's [0, 5)")));
  EXPECT_THAT(PositionEmbeddingBackward<float>(2, 3, 2, out, absl::MakeSpan(wpe), nullptr, {0, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("positions has 2 elements, expected B*T = 6")));
}

}  // namespace
}  // namespace ps
