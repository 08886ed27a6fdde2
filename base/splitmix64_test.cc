#include "base/splitmix64.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;

// Vigna's reference SplitMix64 from state 0.
TEST(SplitMix64Test, MatchesReferenceOutputs) {
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.Next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.Next(), 0x06c45d188009454fULL);
  SplitMix64 other(1234567);
  EXPECT_EQ(other.Next(), 6457827717110365317ULL);
  EXPECT_EQ(other.Next(), 3203168211198807973ULL);
  EXPECT_EQ(other.Next(), 9817491932198370423ULL);
}

// The expected values below come from an independent Python implementation of the same
// definitions (splitmix64, Lemire's bounded draw, Durstenfeld's shuffle), so a platform whose
// arithmetic or standard library differs would fail here.
TEST(SplitMix64Test, DerivedSeedsBoundedDrawsAndShuffleAreFixed) {
  EXPECT_EQ(DeriveSeed(42, 0), 0x158a5433a1c7412dULL);
  EXPECT_EQ(DeriveSeed(42, 1), 0x986d7b395a16e230ULL);

  SplitMix64 rng(123);
  std::vector<uint64_t> draws;
  for (int i = 0; i < 8; ++i) draws.push_back(rng.Below(10));
  EXPECT_THAT(draws, ElementsAre(7, 9, 8, 6, 6, 6, 9, 4));

  SplitMix64 shuffler(DeriveSeed(7, 3));
  std::vector<int> v(10);
  std::iota(v.begin(), v.end(), 0);
  Shuffle(absl::MakeSpan(v), shuffler);
  EXPECT_THAT(v, ElementsAre(4, 1, 3, 0, 9, 7, 6, 5, 8, 2));

  // n = 2^63 + 1 rejects almost half of all draws: exercises the rejection loop.
  SplitMix64 r5(5);
  std::vector<uint64_t> small;
  for (int i = 0; i < 8; ++i) small.push_back(r5.Below(3));
  EXPECT_THAT(small, ElementsAre(1, 2, 0, 0, 0, 1, 2, 1));
  EXPECT_EQ(r5.Below((uint64_t{1} << 63) + 1), 4154899361148330835ULL);
  EXPECT_EQ(r5.Below((uint64_t{1} << 63) + 1), 4175487192854586758ULL);
}

TEST(SplitMix64Test, BelowIsInRangeAndRoughlyUniform) {
  SplitMix64 rng(99);
  constexpr int kBuckets = 7;
  constexpr int kDraws = 70000;
  int counts[kBuckets] = {};
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t x = rng.Below(kBuckets);
    ASSERT_LT(x, kBuckets);
    ++counts[x];
  }
  for (int c : counts) EXPECT_NEAR(c, kDraws / kBuckets, 400);  // ~4 sigma
  EXPECT_EQ(rng.Below(1), 0u);
}

TEST(SplitMix64Test, UniformIsInUnitInterval) {
  SplitMix64 rng(3);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(SplitMix64Test, ShuffleIsAPermutationAndHandlesTinyInputs) {
  SplitMix64 rng(11);
  std::vector<int> empty;
  Shuffle(absl::MakeSpan(empty), rng);
  std::vector<int> one = {5};
  Shuffle(absl::MakeSpan(one), rng);
  EXPECT_THAT(one, ElementsAre(5));
  for (int n : {2, 3, 17, 1000}) {
    std::vector<int> v(n);
    std::iota(v.begin(), v.end(), 0);
    Shuffle(absl::MakeSpan(v), rng);
    std::vector<int> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  }
}

}  // namespace
}  // namespace ps
