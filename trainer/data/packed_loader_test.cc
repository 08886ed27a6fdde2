#include "trainer/data/packed_loader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/data/example_file.h"
#include "trainer/data/internal/epoch_permutation.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Owned examples. tokens32 holds the tokens; tokens16 the same when they fit.
struct Examples {
  std::vector<uint32_t> tokens32;
  std::vector<uint16_t> tokens16;
  std::vector<int64_t> starts = {0};
  std::vector<uint8_t> trained;

  void Add(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& flags) {
    tokens32.insert(tokens32.end(), tokens.begin(), tokens.end());
    trained.insert(trained.end(), flags.begin(), flags.end());
    starts.push_back(static_cast<int64_t>(tokens32.size()));
  }
  int64_t size() const { return static_cast<int64_t>(starts.size()) - 1; }
  int64_t Length(int64_t e) const { return starts[e + 1] - starts[e]; }
  ExamplesView View(bool narrow) {
    if (narrow) {
      tokens16.assign(tokens32.begin(), tokens32.end());
      return ExamplesView{absl::MakeConstSpan(tokens16), starts, trained};
    }
    return ExamplesView{absl::MakeConstSpan(tokens32), starts, trained};
  }
};

// Examples whose lengths are drawn by `length(rng)`. The first token of example e is e + 1 (so a
// segment of a row names its example); the others are random in [1, vocab): token 0 appears only
// as padding. Trained flags are random (0 at each first token); some examples are trained nowhere
// or everywhere.
template <typename LengthFn>
Examples MakeExamples(std::mt19937_64& rng, int64_t count, uint32_t vocab, LengthFn length) {
  Examples ex;
  for (int64_t e = 0; e < count; ++e) {
    const int64_t len = std::max<int64_t>(1, length(rng));
    const int mode = static_cast<int>(rng() % 4);  // 0: none, 1: all, else random
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> flags;
    for (int64_t k = 0; k < len; ++k) {
      tokens.push_back(k == 0 ? static_cast<uint32_t>(e + 1)
                              : std::uniform_int_distribution<uint32_t>(1, vocab - 1)(rng));
      const uint8_t f = mode == 0 ? 0 : mode == 1 ? 1 : static_cast<uint8_t>(rng() & 1);
      flags.push_back(k == 0 ? 0 : f);
    }
    ex.Add(tokens, flags);
  }
  return ex;
}

Examples UniformExamples(std::mt19937_64& rng, int64_t count, int64_t max_len, uint32_t vocab) {
  return MakeExamples(rng, count, vocab, [max_len](std::mt19937_64& r) {
    return std::uniform_int_distribution<int64_t>(1, max_len)(r);
  });
}

PackedLoader MustCreate(ExamplesView view, const PackedLoaderOptions& options) {
  absl::StatusOr<PackedLoader> loader = PackedLoader::Create(view, options);
  CHECK(loader.ok()) << loader.status();
  return *std::move(loader);
}

PackedBatch MustBatchAt(const PackedLoader& loader, const DataCursor& cursor) {
  PackedBatch batch;
  const absl::Status status = loader.BatchAt(cursor, &batch);
  CHECK(status.ok()) << status;
  return batch;
}

// Checks one row of a batch against the examples, independently of the loader's code: splits it
// into segments at key_start[p] == p, checks each segment's positions, key_start, tokens and
// targets, and appends the examples it holds to `seen`.
void CheckRow(const Examples& ex, int64_t t_len, const PackedBatch& batch, int64_t slot,
              std::vector<int64_t>* seen, int64_t* trained_targets, int64_t* real_tokens) {
  const int64_t base = slot * t_len;
  int64_t p = 0;
  while (p < t_len) {
    const int64_t a = p;
    ASSERT_EQ(batch.key_start[base + a], a) << "slot " << slot << " p " << p;
    int64_t b = a + 1;
    while (b < t_len && batch.key_start[base + b] == a) ++b;
    for (int64_t q = a; q < b; ++q) ASSERT_EQ(batch.positions[base + q], q - a);
    const uint32_t first = static_cast<uint32_t>(batch.tokens[base + a]);
    if (first == 0) {
      // Padding: all zeros, nothing trained, and it runs to the row's end.
      ASSERT_EQ(b, t_len) << "padding in the middle of a row";
      for (int64_t q = a; q < b; ++q) {
        ASSERT_EQ(batch.tokens[base + q], 0);
        ASSERT_EQ(batch.targets[base + q], -100);
      }
    } else {
      const int64_t e = static_cast<int64_t>(first) - 1;
      ASSERT_LT(e, ex.size());
      const int64_t len = std::min(ex.Length(e), t_len);
      ASSERT_EQ(b - a, len) << "example " << e;
      const int64_t s = ex.starts[e];
      for (int64_t k = 0; k < len; ++k) {
        ASSERT_EQ(batch.tokens[base + a + k], static_cast<int32_t>(ex.tokens32[s + k]));
        const bool trained = k + 1 < len && ex.trained[s + k + 1] == 1;
        const int32_t want = trained ? static_cast<int32_t>(ex.tokens32[s + k + 1]) : -100;
        ASSERT_EQ(batch.targets[base + a + k], want) << "example " << e << " position " << k;
        *trained_targets += trained ? 1 : 0;
      }
      *real_tokens += len;
      seen->push_back(e);
    }
    p = b;
  }
}

struct Config {
  int64_t batch_size;
  int64_t seq_len;
  bool packing;
  bool shuffle;
  int world_size;
  bool narrow;
};

std::string Name(const Config& c) {
  return absl::StrCat("B", c.batch_size, " T", c.seq_len, c.packing ? " packed" : " unpacked",
                      c.shuffle ? " shuffled" : "", " W", c.world_size,
                      c.narrow ? " u16" : " u32");
}

// Over several epochs, all ranks together see every example exactly once per epoch, rows hold
// what the file says, and the batch's counts are right.
TEST(PackedLoaderTest, EveryExampleOncePerEpochWithCorrectRows) {
  std::mt19937_64 rng(3);
  std::vector<Config> configs;
  for (const int64_t b : {1, 3, 8}) {
    for (const int64_t t : {1, 2, 7, 32, 100}) {
      for (const bool packing : {true, false}) {
        for (const bool shuffle : {false, true}) {
          for (const int w : {1, 3}) {
            configs.push_back({b, t, packing, shuffle, w, (b + t) % 2 == 0});
          }
        }
      }
    }
  }
  for (const Config& c : configs) {
    SCOPED_TRACE(Name(c));
    const int64_t count = 1 + static_cast<int64_t>(rng() % 60);
    Examples ex = UniformExamples(rng, count, 2 * c.seq_len + 3, c.narrow ? 60000 : 1000000);
    const ExamplesView view = ex.View(c.narrow);
    std::vector<PackedLoader> ranks;
    for (int r = 0; r < c.world_size; ++r) {
      PackedLoaderOptions o;
      o.batch_size = c.batch_size;
      o.seq_len = c.seq_len;
      o.vocab_size = 1000000;
      o.packing = c.packing;
      o.shuffle = c.shuffle;
      o.seed = 99;
      o.rank = r;
      o.world_size = c.world_size;
      ranks.push_back(MustCreate(view, o));
    }
    const PackedLoader& l0 = ranks[0];
    EXPECT_EQ(l0.num_examples(), count);
    EXPECT_EQ(l0.global_batches_per_epoch(),
              (l0.num_rows() + c.batch_size - 1) / c.batch_size);
    EXPECT_EQ(l0.batches_per_epoch(),
              (l0.global_batches_per_epoch() + c.world_size - 1) / c.world_size);
    int64_t want_real = 0;
    for (int64_t e = 0; e < count; ++e) want_real += std::min(ex.Length(e), c.seq_len);
    EXPECT_DOUBLE_EQ(l0.real_token_fraction(),
                     static_cast<double>(want_real) / (l0.num_rows() * c.seq_len));
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen;
      for (int64_t i = 0; i < l0.batches_per_epoch(); ++i) {
        const DataCursor cursor{epoch, i};
        int64_t all_ranks_trained = 0;
        for (PackedLoader& loader : ranks) {
          ASSERT_EQ(loader.cursor(), cursor);
          PackedBatch batch;
          ASSERT_OK(loader.Next(&batch));
          ASSERT_EQ(batch.cursor, cursor);
          ASSERT_EQ(batch.tokens.size(), static_cast<size_t>(c.batch_size * c.seq_len));
          int64_t trained = 0;
          int64_t real = 0;
          for (int64_t slot = 0; slot < c.batch_size; ++slot) {
            CheckRow(ex, c.seq_len, batch, slot, &seen, &trained, &real);
            if (::testing::Test::HasFatalFailure()) return;
          }
          EXPECT_EQ(batch.trained_targets, trained);
          EXPECT_EQ(batch.real_tokens, real);
          all_ranks_trained += trained;
        }
        EXPECT_EQ(l0.TrainedTargetsAllRanks(cursor), all_ranks_trained);
        for (const PackedLoader& loader : ranks) {
          EXPECT_EQ(loader.TrainedTargetsAllRanks(cursor), all_ranks_trained);
        }
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(count));
      std::iota(all.begin(), all.end(), int64_t{0});
      ASSERT_EQ(seen, all) << "epoch " << epoch;
    }
  }
}

// An independent best-fit decreasing: a linear scan over all rows for every example.
std::vector<std::vector<int64_t>> NaiveBestFit(const std::vector<int64_t>& kept, int64_t t_len) {
  std::vector<int64_t> order(kept.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return kept[a] > kept[b]; });
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> free;
  for (const int64_t e : order) {
    int64_t best = -1;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (free[r] >= kept[e] && (best < 0 || free[r] < free[best])) best = static_cast<int64_t>(r);
    }
    if (best < 0) {
      rows.emplace_back();
      free.push_back(t_len);
      best = static_cast<int64_t>(rows.size()) - 1;
    }
    rows[best].push_back(e);
    free[best] -= kept[e];
  }
  return rows;
}

TEST(PackedLoaderTest, PackingIsBestFitDecreasing) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t t_len = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t count = 1 + static_cast<int64_t>(rng() % 300);
    // Few distinct lengths in some trials, so ties in length and in free space are common.
    const int64_t max_len = trial % 3 == 0 ? 4 : 2 * t_len;
    Examples ex = UniformExamples(rng, count, max_len, 1000);
    PackedLoaderOptions o;
    o.seq_len = t_len;
    o.batch_size = 1 + static_cast<int64_t>(rng() % 5);
    o.vocab_size = 1000000;
    const PackedLoader loader = MustCreate(ex.View(false), o);
    std::vector<int64_t> kept(static_cast<size_t>(count));
    int64_t total = 0;
    for (int64_t e = 0; e < count; ++e) total += kept[e] = std::min(ex.Length(e), t_len);
    const std::vector<std::vector<int64_t>> want = NaiveBestFit(kept, t_len);
    ASSERT_EQ(loader.num_rows(), static_cast<int64_t>(want.size())) << "trial " << trial;
    for (int64_t r = 0; r < loader.num_rows(); ++r) {
      ASSERT_THAT(loader.RowExamples(r), ElementsAreArray(want[r])) << "trial " << trial;
    }
    EXPECT_GE(loader.num_rows() * t_len, total);

    // Replay the loader's own placement in (length desc, index asc) order: an example opens a
    // new row only when no existing row had room, and otherwise went to the fullest row that
    // fits it (the earliest among equals).
    std::vector<int64_t> row_of(static_cast<size_t>(count));
    for (int64_t r = 0; r < loader.num_rows(); ++r) {
      for (const int64_t e : loader.RowExamples(r)) row_of[e] = r;
    }
    std::vector<int64_t> order(static_cast<size_t>(count));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return std::make_tuple(-kept[a], a) < std::make_tuple(-kept[b], b);
    });
    std::vector<int64_t> free;
    for (const int64_t e : order) {
      const int64_t r = row_of[e];
      if (r == static_cast<int64_t>(free.size())) {
        for (size_t q = 0; q < free.size(); ++q) {
          ASSERT_LT(free[q], kept[e]) << "example " << e << " opened row " << r
                                      << " though row " << q << " had room";
        }
        free.push_back(t_len);
      } else {
        ASSERT_LT(r, static_cast<int64_t>(free.size())) << "rows are numbered in creation order";
        ASSERT_GE(free[r], kept[e]);
        for (size_t q = 0; q < free.size(); ++q) {
          if (free[q] >= kept[e]) {
            ASSERT_TRUE(free[q] > free[r] || (free[q] == free[r] && static_cast<int64_t>(q) >= r))
                << "example " << e << " went to row " << r << " but row " << q << " fit better";
          }
        }
      }
      free[r] -= kept[e];
    }
  }
}

TEST(PackedLoaderTest, RowContentOfASmallCaseByHand) {
  Examples ex;
  ex.Add({11, 12, 13}, {0, 1, 1});
  ex.Add({21, 22}, {0, 0});
  ex.Add({31, 32, 33, 34, 35, 36, 37, 38, 39, 40}, {0, 1, 0, 1, 1, 1, 1, 1, 1, 1});
  PackedLoaderOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  const PackedLoader loader = MustCreate(ex.View(true), o);
  EXPECT_EQ(loader.num_rows(), 2);
  EXPECT_EQ(loader.truncated_examples(), 1);
  EXPECT_EQ(loader.dropped_tokens(), 2);
  EXPECT_THAT(loader.RowExamples(0), ElementsAre(2));
  EXPECT_THAT(loader.RowExamples(1), ElementsAre(0, 1));
  const PackedBatch b = MustBatchAt(loader, {0, 0});
  EXPECT_THAT(b.tokens, ElementsAre(31, 32, 33, 34, 35, 36, 37, 38,  //
                                    11, 12, 13, 21, 22, 0, 0, 0));
  EXPECT_THAT(b.targets, ElementsAre(32, -100, 34, 35, 36, 37, 38, -100,  //
                                     12, 13, -100, -100, -100, -100, -100, -100));
  EXPECT_THAT(b.positions, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7,  //
                                       0, 1, 2, 0, 1, 0, 1, 2));
  EXPECT_THAT(b.key_start, ElementsAre(0, 0, 0, 0, 0, 0, 0, 0,  //
                                       0, 0, 0, 3, 3, 5, 5, 5));
  EXPECT_EQ(b.trained_targets, 8);
  EXPECT_EQ(b.real_tokens, 13);
  EXPECT_EQ(loader.TrainedTargetsAllRanks({0, 0}), 8);
  EXPECT_DOUBLE_EQ(loader.real_token_fraction(), 13.0 / 16.0);
}

TEST(PackedLoaderTest, PackingOffIsOneExamplePerRow) {
  std::mt19937_64 rng(8);
  Examples ex = UniformExamples(rng, 37, 20, 5000);
  PackedLoaderOptions o;
  o.batch_size = 4;
  o.seq_len = 16;
  o.packing = false;
  const PackedLoader loader = MustCreate(ex.View(true), o);
  ASSERT_EQ(loader.num_rows(), 37);
  EXPECT_EQ(loader.global_batches_per_epoch(), 10);
  for (int64_t r = 0; r < 37; ++r) EXPECT_THAT(loader.RowExamples(r), ElementsAre(r));
  // The last global batch holds row 36 and three empty rows.
  EXPECT_THAT(loader.RowsAt({0, 9}), ElementsAre(36, -1, -1, -1));
  const PackedBatch last = MustBatchAt(loader, {0, 9});
  for (int64_t p = 16; p < 64; ++p) {
    EXPECT_EQ(last.tokens[p], 0);
    EXPECT_EQ(last.targets[p], -100);
    EXPECT_EQ(last.positions[p], p % 16);
    EXPECT_EQ(last.key_start[p], 0);
  }
  EXPECT_EQ(last.real_tokens, std::min<int64_t>(ex.Length(36), 16));
}

std::vector<PackedBatch> RunNext(PackedLoader& loader, int64_t n) {
  std::vector<PackedBatch> out(static_cast<size_t>(n));
  for (PackedBatch& b : out) CHECK(loader.Next(&b).ok());
  return out;
}

void ExpectSameBatch(const PackedBatch& a, const PackedBatch& b) {
  EXPECT_EQ(a.cursor, b.cursor);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.key_start, b.key_start);
  EXPECT_EQ(a.trained_targets, b.trained_targets);
  EXPECT_EQ(a.real_tokens, b.real_tokens);
}

TEST(PackedLoaderTest, SeekAndBatchAtReproduceNextAcrossEpochs) {
  std::mt19937_64 rng(21);
  Examples ex = UniformExamples(rng, 83, 40, 30000);
  for (const bool shuffle : {false, true}) {
    for (const int w : {1, 2}) {
      PackedLoaderOptions o;
      o.batch_size = 3;
      o.seq_len = 32;
      o.shuffle = shuffle;
      o.seed = 1234;
      o.world_size = w;
      o.rank = w - 1;
      PackedLoader loader = MustCreate(ex.View(false), o);
      const int64_t per_epoch = loader.batches_per_epoch();
      ASSERT_GT(per_epoch, 1);
      const std::vector<PackedBatch> stream = RunNext(loader, 4 * per_epoch + 1);
      EXPECT_EQ(loader.cursor(), (DataCursor{4, 1}));
      for (size_t i = 0; i < stream.size(); ++i) {
        ASSERT_EQ(stream[i].cursor,
                  (DataCursor{static_cast<int64_t>(i) / per_epoch,
                              static_cast<int64_t>(i) % per_epoch}));
        ExpectSameBatch(MustBatchAt(loader, stream[i].cursor), stream[i]);
      }
      for (int trial = 0; trial < 10; ++trial) {
        const size_t i = rng() % stream.size();
        PackedLoader fresh = MustCreate(ex.View(false), o);
        ASSERT_OK(fresh.Seek(stream[i].cursor));
        const std::vector<PackedBatch> resumed =
            RunNext(fresh, std::min<int64_t>(per_epoch + 1, stream.size() - i));
        for (size_t k = 0; k < resumed.size(); ++k) ExpectSameBatch(resumed[k], stream[i + k]);
      }
      EXPECT_THAT(loader.Seek({0, per_epoch}),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
      EXPECT_THAT(loader.Seek({-1, 0}), StatusIs(absl::StatusCode::kInvalidArgument));
      PackedBatch b;
      EXPECT_THAT(loader.BatchAt({0, -1}, &b), StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_EQ(loader.cursor(), (DataCursor{4, 1}));
    }
  }
}

TEST(PackedLoaderTest, RanksAreDisjointAndCoverEveryRowEachEpoch) {
  std::mt19937_64 rng(13);
  Examples ex = UniformExamples(rng, 200, 50, 30000);
  for (const int w : {1, 2, 3, 5, 64}) {
    for (const bool shuffle : {false, true}) {
      std::vector<PackedLoader> ranks;
      for (int r = 0; r < w; ++r) {
        PackedLoaderOptions o;
        o.batch_size = 2;
        o.seq_len = 64;
        o.shuffle = shuffle;
        o.seed = 5;
        o.rank = r;
        o.world_size = w;
        ranks.push_back(MustCreate(ex.View(true), o));
      }
      const int64_t rows = ranks[0].num_rows();
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        std::vector<int64_t> seen;
        for (int64_t i = 0; i < ranks[0].batches_per_epoch(); ++i) {
          int64_t sum = 0;
          for (const PackedLoader& l : ranks) {
            for (const int64_t row : l.RowsAt({epoch, i})) {
              if (row >= 0) seen.push_back(row);
            }
            sum += MustBatchAt(l, {epoch, i}).trained_targets;
          }
          EXPECT_EQ(ranks[0].TrainedTargetsAllRanks({epoch, i}), sum);
        }
        std::sort(seen.begin(), seen.end());
        std::vector<int64_t> all(static_cast<size_t>(rows));
        std::iota(all.begin(), all.end(), int64_t{0});
        ASSERT_EQ(seen, all) << "W " << w << " epoch " << epoch;
      }
    }
  }
}

TEST(PackedLoaderTest, TruncationCountsAndExactFits) {
  Examples ex;
  for (const int64_t len : {5, 8, 9, 1, 20, 8, 16}) {
    std::vector<uint32_t> tokens(static_cast<size_t>(len), 7);
    std::vector<uint8_t> flags(static_cast<size_t>(len), 1);
    flags[0] = 0;
    ex.Add(tokens, flags);
  }
  PackedLoaderOptions o;
  o.seq_len = 8;
  const PackedLoader loader = MustCreate(ex.View(true), o);
  EXPECT_EQ(loader.truncated_examples(), 3);          // 9, 20, 16
  EXPECT_EQ(loader.dropped_tokens(), 1 + 12 + 8);     // the tokens past 8
  // Kept lengths 5 8 8 1 8 8 8: five full rows, then 5 + 1 in one row.
  EXPECT_EQ(loader.num_rows(), 6);
  EXPECT_THAT(loader.RowExamples(0), ElementsAre(1));
  EXPECT_THAT(loader.RowExamples(5), ElementsAre(0, 3));
  EXPECT_DOUBLE_EQ(loader.real_token_fraction(), 46.0 / 48.0);
  // An example exactly T long fills its row; its last position predicts nothing.
  const PackedBatch b = MustBatchAt(loader, {0, 0});
  EXPECT_THAT(b.targets, ElementsAre(7, 7, 7, 7, 7, 7, 7, -100));
  EXPECT_EQ(b.real_tokens, 8);
  EXPECT_EQ(b.trained_targets, 7);
}

TEST(PackedLoaderTest, SeqLenOne) {
  std::mt19937_64 rng(17);
  Examples ex = UniformExamples(rng, 9, 5, 100);
  PackedLoaderOptions o;
  o.seq_len = 1;
  o.batch_size = 4;
  PackedLoader loader = MustCreate(ex.View(true), o);
  EXPECT_EQ(loader.num_rows(), 9);
  EXPECT_EQ(loader.global_batches_per_epoch(), 3);
  int64_t truncated = 0;
  for (int64_t e = 0; e < 9; ++e) truncated += ex.Length(e) > 1 ? 1 : 0;
  EXPECT_EQ(loader.truncated_examples(), truncated);
  for (int64_t i = 0; i < 3; ++i) {
    PackedBatch b;
    ASSERT_OK(loader.Next(&b));
    EXPECT_EQ(b.trained_targets, 0);
    EXPECT_EQ(b.real_tokens, i < 2 ? 4 : 1);
    for (int64_t s = 0; s < 4; ++s) {
      EXPECT_EQ(b.targets[s], -100);
      EXPECT_EQ(b.positions[s], 0);
      EXPECT_EQ(b.key_start[s], 0);
    }
  }
  EXPECT_EQ(loader.cursor(), (DataCursor{1, 0}));
}

TEST(PackedLoaderTest, BatchLargerThanTheRows) {
  Examples ex;
  ex.Add({1, 2, 3}, {0, 1, 1});
  ex.Add({4, 5}, {0, 1});
  PackedLoaderOptions o;
  o.seq_len = 4;
  o.batch_size = 5;
  o.world_size = 3;
  o.rank = 0;
  const PackedLoader r0 = MustCreate(ex.View(true), o);
  o.rank = 2;
  const PackedLoader r2 = MustCreate(ex.View(true), o);
  EXPECT_EQ(r0.num_rows(), 2);
  EXPECT_EQ(r0.global_batches_per_epoch(), 1);
  EXPECT_EQ(r0.batches_per_epoch(), 1);
  EXPECT_THAT(r0.RowsAt({0, 0}), ElementsAre(0, 1, -1, -1, -1));
  EXPECT_THAT(r2.RowsAt({0, 0}), ElementsAre(-1, -1, -1, -1, -1));
  const PackedBatch b2 = MustBatchAt(r2, {3, 0});
  EXPECT_EQ(b2.real_tokens, 0);
  EXPECT_EQ(b2.trained_targets, 0);
  EXPECT_EQ(std::count(b2.targets.begin(), b2.targets.end(), -100), 20);
  EXPECT_EQ(MustBatchAt(r0, {3, 0}).trained_targets, 3);
  EXPECT_EQ(r2.TrainedTargetsAllRanks({3, 0}), 3);
}

TEST(PackedLoaderTest, ShuffleIsDeterministicPerSeedAndDiffersAcrossEpochs) {
  std::mt19937_64 rng(23);
  Examples ex = UniformExamples(rng, 300, 30, 1000);
  PackedLoaderOptions o;
  o.batch_size = 1;
  o.seq_len = 32;
  o.shuffle = true;
  o.seed = 77;
  const PackedLoader a = MustCreate(ex.View(true), o);
  const PackedLoader b = MustCreate(ex.View(false), o);
  o.seed = 78;
  const PackedLoader other_seed = MustCreate(ex.View(true), o);
  o.shuffle = false;
  const PackedLoader plain = MustCreate(ex.View(true), o);
  const int64_t rows = a.num_rows();
  ASSERT_GT(rows, 50);
  auto order = [&](const PackedLoader& l, int64_t epoch) {
    std::vector<int64_t> rows_in_order;
    for (int64_t i = 0; i < l.batches_per_epoch(); ++i) {
      for (const int64_t r : l.RowsAt({epoch, i})) rows_in_order.push_back(r);
    }
    return rows_in_order;
  };
  std::vector<int64_t> identity(static_cast<size_t>(rows));
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(order(plain, 0), identity);
  EXPECT_EQ(order(plain, 5), identity);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    EXPECT_EQ(order(a, epoch), order(b, epoch));
    // The documented order: base/splitmix64's Fisher-Yates seeded from (seed, epoch).
    EXPECT_EQ(order(a, epoch), EpochPermutation(rows, 77, epoch));
    EXPECT_NE(order(a, epoch), order(other_seed, epoch));
    EXPECT_NE(order(a, epoch), order(a, epoch + 1));
    EXPECT_NE(order(a, epoch), identity);
  }
}

TEST(PackedLoaderTest, RefusesBadOptionsAndData) {
  Examples ex;
  ex.Add({1, 2, 3}, {0, 1, 1});
  ex.Add({4, 500, 6}, {0, 1, 0});
  const ExamplesView view = ex.View(true);
  auto refused = [&](PackedLoaderOptions o, absl::string_view what) {
    EXPECT_THAT(PackedLoader::Create(view, o),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(what)));
  };
  PackedLoaderOptions o;
  o.seq_len = 4;
  ASSERT_OK(PackedLoader::Create(view, o));
  auto with = [&](auto change) {
    PackedLoaderOptions c = o;
    change(c);
    return c;
  };
  refused(with([](auto& c) { c.batch_size = 0; }), "PackedLoaderOptions.batch_size = 0");
  refused(with([](auto& c) { c.seq_len = 0; }), "PackedLoaderOptions.seq_len = 0");
  refused(with([](auto& c) { c.seq_len = int64_t{1} << 31; }), "PackedLoaderOptions.seq_len");
  refused(with([](auto& c) { c.vocab_size = 0; }), "PackedLoaderOptions.vocab_size = 0");
  refused(with([](auto& c) { c.world_size = 0; }), "PackedLoaderOptions.world_size = 0");
  refused(with([](auto& c) { c.rank = 2, c.world_size = 2; }), "PackedLoaderOptions.rank = 2");
  refused(with([](auto& c) { c.rank = -1; }), "PackedLoaderOptions.rank = -1");
  refused(with([](auto& c) { c.batch_size = int64_t{1} << 40, c.seq_len = 1 << 30; }),
          "overflows");
  refused(with([](auto& c) { c.vocab_size = 500; }),
          "token 500 at position 1 of example 1 (token 4 of 6) is out of range for vocab_size 500");
  Examples none;
  EXPECT_THAT(PackedLoader::Create(none.View(true), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no examples")));
  Examples broken = ex;
  broken.trained[3] = 1;
  EXPECT_THAT(PackedLoader::Create(broken.View(true), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("first token of example 1")));
}

// The fill on a realistic length distribution: lognormal lengths (median 180 tokens, sigma 1,
// about 10% above 650), T = 1024. Prints the figure docs/data_format.md quotes.
TEST(PackedLoaderTest, RealTokenFractionOnLognormalLengths) {
  std::mt19937_64 rng(2026);
  std::lognormal_distribution<double> lognormal(std::log(180.0), 1.0);
  Examples ex = MakeExamples(rng, 20000, 50000, [&](std::mt19937_64& r) {
    return static_cast<int64_t>(std::lround(lognormal(r))) + 1;
  });
  PackedLoaderOptions o;
  o.seq_len = 1024;
  o.batch_size = 8;
  o.vocab_size = 50000;
  const PackedLoader packed = MustCreate(ex.View(true), o);
  o.packing = false;
  const PackedLoader padded = MustCreate(ex.View(true), o);
  int64_t kept = 0;
  for (int64_t e = 0; e < ex.size(); ++e) kept += std::min<int64_t>(ex.Length(e), 1024);
  const int64_t lower_bound_rows = (kept + 1023) / 1024;
  std::printf(
      "lognormal lengths (median 180, sigma 1), 20000 examples, T = 1024: packed %lld rows "
      "(lower bound %lld), real-token fraction %.4f; one example per row: %.4f; truncated %lld\n",
      static_cast<long long>(packed.num_rows()), static_cast<long long>(lower_bound_rows),
      packed.real_token_fraction(), padded.real_token_fraction(),
      static_cast<long long>(packed.truncated_examples()));
  EXPECT_GE(packed.real_token_fraction(), 0.99);
  EXPECT_LE(packed.num_rows(), lower_bound_rows + lower_bound_rows / 100 + 1);
  EXPECT_LT(padded.real_token_fraction(), 0.35);
}

}  // namespace
}  // namespace ps
