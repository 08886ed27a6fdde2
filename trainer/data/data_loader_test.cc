#include "trainer/data/data_loader.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint16_t> RandomTokens(size_t n, uint16_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> tokens(n);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % vocab);
  return tokens;
}

DataLoaderOptions Options(int64_t b, int64_t t, bool shuffle = false, uint64_t seed = 0,
                          int rank = 0, int world = 1) {
  DataLoaderOptions o;
  o.batch_size = b;
  o.seq_len = t;
  o.shuffle = shuffle;
  o.seed = seed;
  o.rank = rank;
  o.world_size = world;
  return o;
}

// The reference: llm.c's reading loop written out directly. Global batch g is the B*T + 1 tokens
// starting at g*B*T; an epoch holds every global batch that fits, rank r reads g = i*R + r, and
// every rank reads the same number of batches per epoch.
struct Reference {
  std::vector<std::vector<int32_t>> tokens, targets;  // per batch, in reading order
};

Reference ReferenceBatches(const std::vector<uint16_t>& data, int64_t b, int64_t t, int rank,
                           int world, int64_t num_batches) {
  const auto n = static_cast<int64_t>(data.size());
  int64_t global = 0;
  while ((global + 1) * b * t + 1 <= n) ++global;
  const int64_t per_rank = global / world;
  Reference ref;
  for (int64_t k = 0; k < num_batches; ++k) {
    const int64_t i = k % per_rank;
    const int64_t start = (i * world + rank) * b * t;
    std::vector<int32_t> in, out;
    for (int64_t j = 0; j < b * t; ++j) {
      in.push_back(data[start + j]);
      out.push_back(data[start + j + 1]);
    }
    ref.tokens.push_back(in);
    ref.targets.push_back(out);
  }
  return ref;
}

TEST(DataLoaderTest, SequentialBatchesMatchTheReferenceOnRandomSizes) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t b = 1 + rng() % 5;
    const int64_t t = 1 + rng() % 9;
    const int world = 1 + static_cast<int>(rng() % 3);
    const int rank = static_cast<int>(rng() % world);
    // From the minimum length up, so tails of every size appear.
    const int64_t n = b * t * world + 1 + static_cast<int64_t>(rng() % 200);
    const std::vector<uint16_t> data = RandomTokens(n, 1000, trial);
    DataLoaderOptions o = Options(b, t, false, 0, rank, world);
    o.vocab_size = 1000;
    ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, o));
    SCOPED_TRACE(absl::StrCat("B=", b, " T=", t, " N=", n, " rank ", rank, "/", world));
    ASSERT_EQ(loader.num_windows(), (n - 1) / t);
    const int64_t per_epoch = loader.batches_per_epoch();
    ASSERT_EQ(per_epoch, (n - 1) / (b * t) / world);
    const int64_t num = 2 * per_epoch + 3;  // across two epoch boundaries
    const Reference ref = ReferenceBatches(data, b, t, rank, world, num);
    for (int64_t k = 0; k < num; ++k) {
      const DataCursor expected_cursor{k / per_epoch, k % per_epoch};
      ASSERT_EQ(loader.cursor(), expected_cursor);
      const TokenBatch batch = loader.Next();
      ASSERT_EQ(batch.cursor, expected_cursor);
      ASSERT_EQ(batch.tokens, ref.tokens[k]) << "batch " << k;
      ASSERT_EQ(batch.targets, ref.targets[k]) << "batch " << k;
    }
  }
}

TEST(DataLoaderTest, LlmcLayoutOnASmallExample) {
  // Tokens are their own positions: batch k starts at k*B*T and rows are consecutive windows.
  std::vector<uint16_t> data(20);
  for (int i = 0; i < 20; ++i) data[i] = static_cast<uint16_t>(i);
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(2, 3)));
  EXPECT_EQ(loader.num_windows(), 6);  // (20 - 1) / 3
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  TokenBatch b0 = loader.Next();
  EXPECT_THAT(b0.tokens, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(b0.targets, ElementsAre(1, 2, 3, 4, 5, 6));
  TokenBatch b1 = loader.Next();
  EXPECT_THAT(b1.tokens, ElementsAre(6, 7, 8, 9, 10, 11));
  TokenBatch b2 = loader.Next();
  EXPECT_THAT(b2.tokens, ElementsAre(12, 13, 14, 15, 16, 17));
  EXPECT_THAT(b2.targets, ElementsAre(13, 14, 15, 16, 17, 18));  // token 19 is the skipped tail
  TokenBatch b3 = loader.Next();                                 // wraps to the start
  EXPECT_EQ(b3.cursor, (DataCursor{1, 0}));
  EXPECT_THAT(b3.tokens, ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(DataLoaderTest, ShuffledWindowsHaveTheRightContents) {
  const std::vector<uint16_t> data = RandomTokens(1000, 50000, 3);
  const int64_t t = 7;
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(3, t, true, 5)));
  for (int k = 0; k < 100; ++k) {
    const DataCursor cursor = loader.cursor();
    const std::vector<int64_t> windows = loader.WindowsAt(cursor);
    const TokenBatch batch = loader.Next();
    for (size_t row = 0; row < windows.size(); ++row) {
      for (int64_t j = 0; j < t; ++j) {
        ASSERT_EQ(batch.tokens[row * t + j], data[windows[row] * t + j]);
        ASSERT_EQ(batch.targets[row * t + j], data[windows[row] * t + j + 1]);
      }
    }
  }
}

// The permutation is SplitMix64 + Fisher-Yates from DeriveSeed(seed, epoch); these orders come
// from the Python implementation of the same definitions, so any platform that disagrees fails.
TEST(DataLoaderTest, ShuffleOrderIsFixedAcrossPlatforms) {
  std::vector<uint16_t> data(31);  // (31 - 1) / 3 = 10 windows
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(5, 3, true, 2024)));
  ASSERT_EQ(loader.num_windows(), 10);
  EXPECT_THAT(loader.WindowsAt({0, 0}), ElementsAre(9, 2, 0, 7, 3));
  EXPECT_THAT(loader.WindowsAt({0, 1}), ElementsAre(5, 6, 1, 8, 4));
  EXPECT_THAT(loader.WindowsAt({1, 0}), ElementsAre(9, 0, 8, 7, 5));
  EXPECT_THAT(loader.WindowsAt({1, 1}), ElementsAre(6, 3, 1, 2, 4));
}

TEST(DataLoaderTest, ShuffleIsReproducibleAndDependsOnSeedAndEpoch) {
  const std::vector<uint16_t> data = RandomTokens(5000, 256, 1);
  auto run = [&](uint64_t seed) {
    DataLoader loader = DataLoader::Create(data, Options(4, 16, true, seed)).value();
    std::vector<std::vector<int64_t>> windows;
    for (int k = 0; k < 3 * loader.batches_per_epoch(); ++k) {
      windows.push_back(loader.WindowsAt(loader.cursor()));
      loader.Next();
    }
    return windows;
  };
  const auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Epochs are shuffled differently.
  const size_t per_epoch = a.size() / 3;
  EXPECT_NE(std::vector(a.begin(), a.begin() + per_epoch),
            std::vector(a.begin() + per_epoch, a.begin() + 2 * per_epoch));
}

// Every window appears at most once per epoch over all ranks; exactly once when the windows divide
// evenly; ranks never share a window in an epoch; each rank's batches are what its rank-0-indexed
// global batches say.
TEST(DataLoaderTest, EachEpochUsesEveryWindowOnceAcrossRanks) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t b = 1 + rng() % 4;
    const int64_t t = 1 + rng() % 6;
    const int world = 1 + static_cast<int>(rng() % 4);
    const bool even = trial % 2 == 0;
    const int64_t windows = b * world * (1 + rng() % 10) + (even ? 0 : 1 + rng() % (b * world));
    const int64_t n = windows * t + 1 + (even ? 0 : static_cast<int64_t>(rng() % t));
    const std::vector<uint16_t> data = RandomTokens(n, 256, trial);
    const bool shuffle = trial % 3 != 0;
    std::vector<DataLoader> loaders;
    for (int r = 0; r < world; ++r) {
      loaders.push_back(DataLoader::Create(data, Options(b, t, shuffle, 99, r, world)).value());
    }
    ASSERT_EQ(loaders[0].num_windows(), windows);
    const int64_t per_rank = loaders[0].batches_per_epoch();
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::multiset<int64_t> seen;
      for (int64_t k = 0; k < per_rank; ++k) {
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(loaders[r].cursor(), (DataCursor{epoch, k}));
          for (int64_t w : loaders[r].WindowsAt(loaders[r].cursor())) seen.insert(w);
          loaders[r].Next();
        }
      }
      const std::set<int64_t> distinct(seen.begin(), seen.end());
      ASSERT_EQ(distinct.size(), seen.size()) << "a window repeated in epoch " << epoch;
      ASSERT_EQ(static_cast<int64_t>(seen.size()), per_rank * world * b);
      if (even) {
        ASSERT_EQ(static_cast<int64_t>(seen.size()), windows);
      }
      for (int64_t w : distinct) ASSERT_LT(w, windows);
    }
  }
}

TEST(DataLoaderTest, ShardsPartitionTheSingleRankBatches) {
  // Rank r of R reading batch i gets exactly global batch i*R + r of the world-1 loader.
  const std::vector<uint16_t> data = RandomTokens(3000, 256, 5);
  for (const bool shuffle : {false, true}) {
    const int world = 3;
    DataLoader whole = DataLoader::Create(data, Options(2, 10, shuffle, 4)).value();
    for (int r = 0; r < world; ++r) {
      DataLoader shard = DataLoader::Create(data, Options(2, 10, shuffle, 4, r, world)).value();
      EXPECT_EQ(shard.batches_per_epoch(), whole.batches_per_epoch() / world);
      for (int epoch = 0; epoch < 2; ++epoch) {
        for (int64_t i = 0; i < shard.batches_per_epoch(); ++i) {
          ASSERT_EQ(shard.WindowsAt({epoch, i}), whole.WindowsAt({epoch, i * world + r}));
        }
      }
    }
  }
}

TEST(DataLoaderTest, SeekToASavedCursorReproducesAStraightRun) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t b = 1 + rng() % 3;
    const int64_t t = 1 + rng() % 8;
    const int world = 1 + static_cast<int>(rng() % 2);
    const int rank = static_cast<int>(rng() % world);
    const int64_t n = b * t * world * (1 + rng() % 6) + 1 + static_cast<int64_t>(rng() % 20);
    const std::vector<uint16_t> data = RandomTokens(n, 256, trial);
    const DataLoaderOptions o = Options(b, t, trial % 2 == 1, 1000 + trial, rank, world);
    DataLoader straight = DataLoader::Create(data, o).value();
    const int64_t total = 4 * straight.batches_per_epoch() + 1;
    std::vector<TokenBatch> expected;
    for (int64_t k = 0; k < total; ++k) expected.push_back(straight.Next());

    // Stop at random points, "save" the cursor, resume in a fresh loader.
    DataLoader first = DataLoader::Create(data, o).value();
    int64_t k = 0;
    while (k < total) {
      const int64_t stop = std::min<int64_t>(total, k + 1 + static_cast<int64_t>(rng() % 7));
      for (; k < stop; ++k) {
        const TokenBatch got = first.Next();
        ASSERT_EQ(got.cursor, expected[k].cursor);
        ASSERT_EQ(got.tokens, expected[k].tokens) << "trial " << trial << " batch " << k;
        ASSERT_EQ(got.targets, expected[k].targets);
      }
      const DataCursor saved = first.cursor();
      first = DataLoader::Create(data, o).value();
      ASSERT_OK(first.Seek(saved));
      ASSERT_EQ(first.cursor(), saved);
    }
    // Seeking backwards and random access agree too.
    const int64_t back = static_cast<int64_t>(rng() % total);
    ASSERT_OK(first.Seek(expected[back].cursor));
    EXPECT_EQ(first.Next().tokens, expected[back].tokens);
    std::vector<int32_t> tok(b * t), tgt(b * t);
    ASSERT_OK(first.BatchAt(expected[0].cursor, absl::MakeSpan(tok), absl::MakeSpan(tgt)));
    EXPECT_EQ(tok, expected[0].tokens);
    EXPECT_EQ(tgt, expected[0].targets);
  }
}

TEST(DataLoaderTest, SeekRejectsCursorsOutOfRangeAndDoesNotMove) {
  const std::vector<uint16_t> data = RandomTokens(101, 256, 1);
  DataLoader loader = DataLoader::Create(data, Options(2, 5, true)).value();  // 20 windows
  ASSERT_EQ(loader.batches_per_epoch(), 10);
  ASSERT_OK(loader.Seek({3, 4}));
  for (const DataCursor bad :
       {DataCursor{-1, 0}, DataCursor{0, -1}, DataCursor{0, 10}, DataCursor{5, 1000}}) {
    EXPECT_THAT(loader.Seek(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr(DataCursorString(bad)),
                                                 HasSubstr("10 batches per epoch"))));
    EXPECT_EQ(loader.cursor(), (DataCursor{3, 4}));
  }
  std::vector<int32_t> tok(10), tgt(10);
  EXPECT_THAT(loader.BatchAt({0, 10}, absl::MakeSpan(tok), absl::MakeSpan(tgt)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DataLoaderTest, NextRejectsWrongBufferSizesWithoutMoving) {
  const std::vector<uint16_t> data = RandomTokens(101, 256, 1);
  DataLoader loader = DataLoader::Create(data, Options(2, 5)).value();
  std::vector<int32_t> small(9), right(10);
  EXPECT_THAT(loader.Next(absl::MakeSpan(small), absl::MakeSpan(right)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("9 tokens"), HasSubstr("2 * 5 = 10"))));
  EXPECT_THAT(loader.Next(absl::MakeSpan(right), absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(loader.cursor(), (DataCursor{0, 0}));
  EXPECT_OK(loader.Next(absl::MakeSpan(right), absl::MakeSpan(right.data(), 10)));
}

TEST(DataLoaderTest, TooShortStreamsAreRejectedWithTheNumbers) {
  // One batch of B=4, T=8 on 2 ranks needs 4*8*2 + 1 = 65 tokens.
  const std::vector<uint16_t> data = RandomTokens(65, 256, 1);
  EXPECT_OK(DataLoader::Create(data, Options(4, 8, false, 0, 1, 2)));
  EXPECT_THAT(
      DataLoader::Create(absl::MakeConstSpan(data).first(64), Options(4, 8, false, 0, 1, 2)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("too short"), HasSubstr("64 tokens"), HasSubstr("7 windows"),
                     HasSubstr("at least 65 tokens"))));
  EXPECT_THAT(DataLoader::Create({}, Options(1, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 tokens")));
  const std::vector<uint16_t> one = {3};
  EXPECT_THAT(DataLoader::Create(one, Options(1, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 tokens")));
  const std::vector<uint16_t> two = {3, 4};
  EXPECT_OK(DataLoader::Create(two, Options(1, 1)));
}

TEST(DataLoaderTest, TokensOutsideTheVocabularyAreRejectedWithPositionAndValue) {
  std::vector<uint16_t> data = RandomTokens(500, 100, 1);
  DataLoaderOptions o = Options(2, 4);
  o.vocab_size = 100;
  EXPECT_OK(DataLoader::Create(data, o));
  data[317] = 100;
  data[400] = 65535;
  EXPECT_THAT(
      DataLoader::Create(data, o),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("token 100 at position 317 of 500"), HasSubstr("vocab_size 100"))));
  // The last token (only ever a target) is checked too.
  data[317] = 1;
  data[400] = 1;
  data[499] = 250;
  EXPECT_THAT(DataLoader::Create(data, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("position 499")));
}

TEST(DataLoaderTest, BadOptionsNameTheField) {
  const std::vector<uint16_t> data = RandomTokens(100, 256, 1);
  struct Case {
    DataLoaderOptions options;
    std::string field;
  };
  std::vector<Case> cases;
  DataLoaderOptions o = Options(0, 4);
  cases.push_back({o, "batch_size"});
  o = Options(2, 0);
  cases.push_back({o, "seq_len"});
  o = Options(2, 4);
  o.vocab_size = 0;
  cases.push_back({o, "vocab_size"});
  o.vocab_size = int64_t{1} << 31;  // batches hold int32
  cases.push_back({o, "vocab_size"});
  o = Options(2, 4, false, 0, 0, 0);
  cases.push_back({o, "world_size"});
  o = Options(2, 4, false, 0, 2, 2);
  cases.push_back({o, "rank"});
  o = Options(2, 4, false, 0, -1, 2);
  cases.push_back({o, "rank"});
  o = Options(int64_t{1} << 40, int64_t{1} << 40);
  cases.push_back({o, "overflows"});
  for (const Case& c : cases) {
    EXPECT_THAT(DataLoader::Create(data, c.options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)));
  }
}

TEST(DataLoaderTest, LoaderOverAFullVocabularyAcceptsToken65535) {
  std::vector<uint16_t> data(9, 65535);
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(2, 4)));
  EXPECT_THAT(loader.Next().targets,
              ElementsAre(65535, 65535, 65535, 65535, 65535, 65535, 65535, 65535));
}

TEST(DataLoaderTest, Uint32TokensGiveTheSameBatchesAsUint16AndReachLlama3Ids) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t b = 1 + rng() % 4, t = 1 + rng() % 7;
    const int64_t n = b * t + 1 + static_cast<int64_t>(rng() % 300);
    const std::vector<uint16_t> narrow = RandomTokens(n, 60000, trial);
    const std::vector<uint32_t> wide(narrow.begin(), narrow.end());
    DataLoaderOptions o = Options(b, t, trial % 2 == 1, trial);
    o.vocab_size = 60000;
    ASSERT_OK_AND_ASSIGN(DataLoader a, DataLoader::Create(narrow, o));
    ASSERT_OK_AND_ASSIGN(DataLoader c, DataLoader::Create(wide, o));
    for (int k = 0; k < 2 * a.batches_per_epoch() + 1; ++k) {
      const TokenBatch x = a.Next(), y = c.Next();
      ASSERT_EQ(x.tokens, y.tokens);
      ASSERT_EQ(x.targets, y.targets);
    }
  }
  // Ids above 65535 (Llama-3's vocabulary is 128256).
  std::vector<uint32_t> big(9);
  for (int i = 0; i < 9; ++i) big[i] = 128000 + i;
  DataLoaderOptions o = Options(2, 4);
  o.vocab_size = 128256;
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(big, o));
  EXPECT_THAT(loader.Next().targets,
              ElementsAre(128001, 128002, 128003, 128004, 128005, 128006, 128007, 128008));
  big[6] = 128256;
  EXPECT_THAT(DataLoader::Create(big, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token 128256 at position 6 of 9"),
                             HasSubstr("vocab_size 128256"))));
  // The first offending token is found in a long stream, past the first block of the scan.
  std::vector<uint32_t> long_stream(100000, 1);
  long_stream[70001] = 5;
  long_stream[90000] = 7;
  o.vocab_size = 5;
  EXPECT_THAT(DataLoader::Create(long_stream, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("position 70001 ")));
}

}  // namespace
}  // namespace ps
