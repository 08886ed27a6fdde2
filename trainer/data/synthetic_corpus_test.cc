#include "trainer/data/synthetic_corpus.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/data/internal/synthetic_grammar.h"

namespace ps {
namespace {

using data_internal::Grammar;
using data_internal::GrammarEdge;
using data_internal::kEnd;
using ::testing::HasSubstr;

SyntheticCorpusOptions Options(uint64_t seed, int64_t train, int64_t val) {
  SyntheticCorpusOptions o;
  o.seed = seed;
  o.train_tokens = train;
  o.val_tokens = val;
  return o;
}

TEST(SyntheticCorpusTest, IsDeterministicPerSeedAndSplit) {
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus a, GenerateSyntheticCorpus(Options(1, 50000, 7000)));
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus b, GenerateSyntheticCorpus(Options(1, 50000, 7000)));
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus c, GenerateSyntheticCorpus(Options(2, 50000, 7000)));
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.val, b.val);
  EXPECT_NE(a.train, c.train);
  EXPECT_NE(a.val, c.val);
  EXPECT_EQ(a.train.size(), 50000u);
  EXPECT_EQ(a.val.size(), 7000u);
  // The validation split is its own stream, not a copy of the train split's start.
  EXPECT_NE(std::vector<uint16_t>(a.train.begin(), a.train.begin() + 7000), a.val);
  // Shorter corpora are prefixes of longer ones.
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus small, GenerateSyntheticCorpus(Options(1, 333, 1)));
  EXPECT_EQ(small.train, std::vector<uint16_t>(a.train.begin(), a.train.begin() + 333));
  EXPECT_EQ(small.val[0], a.val[0]);
}

// Locks the exact text for seed 0. The generator draws with SplitMix64 and integer weights only
// (the RNG is checked against a Python implementation in splitmix64_test), so this text is the
// same on every platform; a change here changes every default training run.
TEST(SyntheticCorpusTest, TextIsFixedForSeedZero) {
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus corpus, GenerateSyntheticCorpus(Options(0, 200, 100)));
  EXPECT_EQ(
      BytesToText(corpus.train),
      "a dog sings. the bird likes the tree. the girl finds every apple. again: a dog sings.\n"
      "the girl likes every ball. the quiet fox sleeps with the forest. a cat likes the big "
      "song under a forest. again: t");
  EXPECT_EQ(BytesToText(corpus.val),
            "my king chases the tree under the forest. my boy sees the book. my happy girl chases "
            "the book. again");
}

TEST(SyntheticCorpusTest, TokensArePrintableAsciiAndNewlines) {
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus corpus, GenerateSyntheticCorpus(Options(3, 100000, 100)));
  for (const uint16_t t : corpus.train) {
    ASSERT_TRUE((t >= 0x20 && t < 0x7f) || t == '\n') << t;
  }
}

// Reads the text back with the grammar: every paragraph must parse (three sentences, the marker,
// the first sentence again), and the average -ln p of the parsed choices per byte must approach
// the exact entropy rate.
TEST(SyntheticCorpusTest, TextParsesAndItsInformationMatchesTheEntropyRate) {
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus corpus, GenerateSyntheticCorpus(Options(5, 2000000, 10)));
  const Grammar& grammar = data_internal::SyntheticGrammar();
  const std::string text = BytesToText(corpus.train);
  std::vector<std::string> paragraphs = absl::StrSplit(text, '\n');
  paragraphs.pop_back();  // cut off by the token count
  ASSERT_GT(paragraphs.size(), 10000u);

  double information = 0;  // sum of -ln p over parsed choices
  double bytes = 0;
  std::map<std::string, int> first_words;
  for (const std::string& paragraph : paragraphs) {
    const size_t marker = paragraph.find(data_internal::kRepeatMarker);
    ASSERT_NE(marker, std::string::npos) << paragraph;
    const std::string body = paragraph.substr(0, marker);
    const std::string repeat = paragraph.substr(marker + std::strlen(data_internal::kRepeatMarker));
    std::vector<std::string> sentences = absl::StrSplit(body, ". ");
    ASSERT_EQ(sentences.size(), 3u) << paragraph;
    ASSERT_EQ(sentences.back().back(), '.');
    sentences.back().pop_back();
    ASSERT_EQ(repeat, sentences[0] + ".") << paragraph;
    for (const std::string& sentence : sentences) {
      int state = 0;
      const std::vector<std::string> words = absl::StrSplit(sentence, ' ');
      first_words[words[0]]++;
      for (size_t i = 0; i <= words.size(); ++i) {
        const auto& edges = grammar.states[state].edges;
        double total = 0;
        for (const GrammarEdge& e : edges) total += e.weight;
        const GrammarEdge* match = nullptr;
        for (const GrammarEdge& e : edges) {
          if (i == words.size() ? e.next == kEnd : (e.next != kEnd && e.word == words[i])) {
            ASSERT_EQ(match, nullptr) << "ambiguous grammar at state " << state;
            match = &e;
          }
        }
        ASSERT_NE(match, nullptr) << "cannot parse '" << sentence << "' at word " << i;
        information -= std::log(match->weight / total);
        if (match->next == kEnd) break;
        state = match->next;
      }
    }
    bytes += static_cast<double>(paragraph.size() + 1);
  }
  const double empirical_rate = information / bytes;
  EXPECT_NEAR(empirical_rate, corpus.entropy_rate_nats, 0.01 * corpus.entropy_rate_nats);
  // The start state's weights are 6:3:2:1 over the, a, my, one.
  const double n = first_words["the"] + first_words["a"] + first_words["my"] + first_words["one"];
  EXPECT_NEAR(first_words["the"] / n, 0.5, 0.01);
  EXPECT_NEAR(first_words["one"] / n, 1.0 / 12, 0.01);
}

// An independent computation of the sentence statistics for an acyclic grammar: recursion over
// the walk instead of solving for expected visits.
void Recurse(const Grammar& g, int state, double* entropy, double* bytes, int depth) {
  ASSERT_LT(depth, 100) << "the grammar has a cycle";
  double total = 0;
  for (const GrammarEdge& e : g.states[state].edges) total += e.weight;
  *entropy = 0;
  *bytes = 0;
  for (const GrammarEdge& e : g.states[state].edges) {
    const double p = e.weight / total;
    *entropy -= p * std::log(p);
    if (e.next == kEnd) continue;
    double h = 0, b = 0;
    Recurse(g, e.next, &h, &b, depth + 1);
    *entropy += p * h;
    *bytes += p * (static_cast<double>(e.word.size()) + 1 + b);
  }
}

TEST(SyntheticCorpusTest, EntropyRateMatchesAnIndependentComputation) {
  double h = 0, b = 0;
  Recurse(data_internal::SyntheticGrammar(), 0, &h, &b, 0);
  const data_internal::SentenceStats stats =
      data_internal::ComputeSentenceStats(data_internal::SyntheticGrammar());
  EXPECT_NEAR(stats.entropy_nats, h, 1e-12);
  EXPECT_NEAR(stats.expected_bytes, b, 1e-12);
  const double rate = 3 * h / (4 * b + 2 + 8 + 1);
  EXPECT_NEAR(SyntheticCorpusEntropyRateNats(), rate, 1e-12);
}

TEST(SyntheticCorpusTest, SentenceStatsOfTinyGrammars) {
  // One state looping on "x" with probability 1/2: 2 expected visits, each a fair coin.
  Grammar loop;
  loop.states.resize(1);
  loop.states[0].edges = {{1, "x", 0}, {1, "", kEnd}};
  data_internal::SentenceStats s = data_internal::ComputeSentenceStats(loop);
  EXPECT_NEAR(s.entropy_nats, 2 * std::log(2.0), 1e-12);
  EXPECT_NEAR(s.expected_bytes, 2.0, 1e-12);  // 1 expected word of 2 bytes ("x" + separator)

  // Two words with probabilities 3/4, 1/4, then a deterministic end.
  Grammar two;
  two.states.resize(2);
  two.states[0].edges = {{3, "ab", 1}, {1, "cdef", 1}};
  two.states[1].edges = {{1, "", kEnd}};
  s = data_internal::ComputeSentenceStats(two);
  EXPECT_NEAR(s.entropy_nats, -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  EXPECT_NEAR(s.expected_bytes, 0.75 * 3 + 0.25 * 5, 1e-12);
}

TEST(SyntheticCorpusTest, EntropyNumbersAreWhereALearnableCorpusNeedsThem) {
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(SyntheticCorpus corpus, GenerateSyntheticCorpus(SyntheticCorpusOptions()));
  // Reported, not asserted (speed is for benchmarks).
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(corpus.train.size(), 2000000u);
  EXPECT_EQ(corpus.val.size(), 200000u);
  // English-like letter statistics, and far more structure than the unigram captures.
  EXPECT_GT(corpus.train_unigram_entropy_nats, 2.3);
  EXPECT_LT(corpus.train_unigram_entropy_nats, 3.2);
  EXPECT_NEAR(corpus.val_unigram_entropy_nats, corpus.train_unigram_entropy_nats, 0.01);
  EXPECT_LT(corpus.entropy_rate_nats, 0.15 * corpus.train_unigram_entropy_nats);
  EXPECT_GT(corpus.entropy_rate_nats, 0.05);
  std::printf(
      "default corpus: %zu + %zu tokens in %.3f s; unigram entropy %.4f nats/token (train), "
      "%.4f (val); entropy rate %.4f nats/token\n",
      corpus.train.size(), corpus.val.size(), seconds, corpus.train_unigram_entropy_nats,
      corpus.val_unigram_entropy_nats, corpus.entropy_rate_nats);
}

TEST(SyntheticCorpusTest, UnigramEntropy) {
  EXPECT_EQ(UnigramEntropyNats({}), 0.0);
  const std::vector<uint16_t> same(100, 7);
  EXPECT_EQ(UnigramEntropyNats(same), 0.0);
  std::vector<uint16_t> uniform;
  for (int i = 0; i < 4000; ++i) uniform.push_back(static_cast<uint16_t>(i % 40 * 1000));
  EXPECT_NEAR(UnigramEntropyNats(uniform), std::log(40.0), 1e-12);
  const std::vector<uint16_t> skewed = {1, 1, 1, 65535};
  EXPECT_NEAR(UnigramEntropyNats(skewed), -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
}

TEST(SyntheticCorpusTest, BadOptionsNameTheField) {
  EXPECT_THAT(GenerateSyntheticCorpus(Options(0, 0, 10)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train_tokens = 0")));
  EXPECT_THAT(GenerateSyntheticCorpus(Options(0, 10, -1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("val_tokens = -1")));
  EXPECT_THAT(GenerateSyntheticCorpus(Options(0, int64_t{1} << 31, 10)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2147483647")));
}

}  // namespace
}  // namespace ps
