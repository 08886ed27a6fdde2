#include "trainer/data/synthetic_corpus.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "glog/logging.h"
#include "trainer/data/internal/synthetic_grammar.h"

namespace ps {
namespace data_internal {
namespace {

// Adds one edge per word, all with `weight`, to `next`.
void AddWords(GrammarState& state, const std::vector<std::string>& words, uint32_t weight,
              int next) {
  for (const std::string& w : words) state.edges.push_back({weight, w, next});
}

Grammar BuildGrammar() {
  const std::vector<std::string> adjectives = {"big", "small", "red", "old", "happy", "quiet"};
  const std::vector<std::string> agents = {"cat",  "dog", "bird", "fox",
                                           "girl", "boy", "king", "robot"};
  const std::vector<std::string> things = {"apple", "ball", "tree", "house",
                                           "river", "moon", "book", "song"};
  const std::vector<std::string> places = {"garden", "city", "forest", "rain", "night"};
  enum : int {
    kStart,
    kSubject,      // adjective or noun
    kSubjectNoun,  // noun after an adjective
    kVerb,
    kObjectDet,
    kObject,      // adjective or noun
    kObjectNoun,  // noun after an adjective
    kAfterVerb,   // end, or a preposition
    kPlaceDet,
    kPlace,
    kAfterPlace,
    kNumStates
  };
  Grammar g;
  g.states.resize(kNumStates);
  GrammarState* s = g.states.data();
  s[kStart].edges = {
      {6, "the", kSubject}, {3, "a", kSubject}, {2, "my", kSubject}, {1, "one", kSubject}};
  AddWords(s[kSubject], adjectives, 1, kSubjectNoun);
  AddWords(s[kSubject], agents, 2, kVerb);
  AddWords(s[kSubjectNoun], agents, 1, kVerb);
  AddWords(s[kVerb], {"sees", "likes", "finds", "chases", "paints"}, 2, kObjectDet);
  AddWords(s[kVerb], {"sleeps", "runs", "sings", "waits"}, 1, kAfterVerb);
  s[kObjectDet].edges = {{3, "the", kObject}, {2, "a", kObject}, {1, "every", kObject}};
  AddWords(s[kObject], adjectives, 1, kObjectNoun);
  AddWords(s[kObject], things, 2, kAfterVerb);
  AddWords(s[kObjectNoun], things, 1, kAfterVerb);
  s[kAfterVerb].edges = {{4, "", kEnd}};
  AddWords(s[kAfterVerb], {"in", "near", "under", "with"}, 1, kPlaceDet);
  s[kPlaceDet].edges = {{1, "the", kPlace}, {1, "a", kPlace}};
  AddWords(s[kPlace], places, 1, kAfterPlace);
  s[kAfterPlace].edges = {{1, "", kEnd}};
  return g;
}

// Solves a (small, dense, nonsingular) linear system by Gaussian elimination with partial
// pivoting. `a` is n x n row-major.
std::vector<double> Solve(std::vector<double> a, std::vector<double> b) {
  const size_t n = b.size();
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::fabs(a[r * n + col]) > std::fabs(a[pivot * n + col])) pivot = r;
    }
    CHECK_GT(std::fabs(a[pivot * n + col]), 1e-12) << "singular system: a sentence never ends";
    if (pivot != col) {
      for (size_t c = 0; c < n; ++c) std::swap(a[col * n + c], a[pivot * n + c]);
      std::swap(b[col], b[pivot]);
    }
    for (size_t r = col + 1; r < n; ++r) {
      const double f = a[r * n + col] / a[col * n + col];
      if (f == 0) continue;
      for (size_t c = col; c < n; ++c) a[r * n + c] -= f * a[col * n + c];
      b[r] -= f * b[col];
    }
  }
  std::vector<double> x(n);
  for (size_t i = n; i-- > 0;) {
    double sum = b[i];
    for (size_t c = i + 1; c < n; ++c) sum -= a[i * n + c] * x[c];
    x[i] = sum / a[i * n + i];
  }
  return x;
}

}  // namespace

const Grammar& SyntheticGrammar() {
  static const Grammar* const grammar = new Grammar(BuildGrammar());
  return *grammar;
}

SentenceStats ComputeSentenceStats(const Grammar& grammar) {
  // Expected visits v solve v = e_0 + P^T v, i.e. (I - P^T) v = e_0, where P[s][t] is the
  // probability of moving from state s to state t.
  const size_t n = grammar.states.size();
  std::vector<double> a(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) a[i * n + i] = 1.0;
  for (size_t s = 0; s < n; ++s) {
    double total = 0;
    for (const GrammarEdge& e : grammar.states[s].edges) total += e.weight;
    for (const GrammarEdge& e : grammar.states[s].edges) {
      if (e.next != kEnd) a[static_cast<size_t>(e.next) * n + s] -= e.weight / total;
    }
  }
  std::vector<double> start(n, 0.0);
  start[0] = 1.0;
  const std::vector<double> visits = Solve(std::move(a), std::move(start));

  SentenceStats stats;
  for (size_t s = 0; s < n; ++s) {
    double total = 0;
    for (const GrammarEdge& e : grammar.states[s].edges) total += e.weight;
    double entropy = 0, bytes = 0;
    for (const GrammarEdge& e : grammar.states[s].edges) {
      const double p = e.weight / total;
      entropy -= p * std::log(p);
      // Each word is followed by one byte: a space, or the final '.'.
      if (e.next != kEnd) bytes += p * static_cast<double>(e.word.size() + 1);
    }
    stats.entropy_nats += visits[s] * entropy;
    stats.expected_bytes += visits[s] * bytes;
  }
  return stats;
}

}  // namespace data_internal

namespace {

using data_internal::Grammar;
using data_internal::GrammarEdge;
using data_internal::kEnd;

void AppendSentence(const Grammar& grammar, SplitMix64& rng, std::string* out) {
  int state = 0;
  bool first = true;
  while (true) {
    const std::vector<GrammarEdge>& edges = grammar.states[static_cast<size_t>(state)].edges;
    uint64_t total = 0;
    for (const GrammarEdge& e : edges) total += e.weight;
    uint64_t draw = rng.Below(total);
    const GrammarEdge* chosen = &edges.back();
    for (const GrammarEdge& e : edges) {
      if (draw < e.weight) {
        chosen = &e;
        break;
      }
      draw -= e.weight;
    }
    if (chosen->next == kEnd) break;
    if (!first) out->push_back(' ');
    out->append(chosen->word);
    first = false;
    state = chosen->next;
  }
  out->push_back('.');
}

// `count` byte tokens of one stream.
std::vector<uint16_t> GenerateSplit(uint64_t seed, int64_t count) {
  const Grammar& grammar = data_internal::SyntheticGrammar();
  SplitMix64 rng(seed);
  std::string text;
  text.reserve(static_cast<size_t>(count) + 256);
  std::string first_sentence;
  while (static_cast<int64_t>(text.size()) < count) {
    const size_t paragraph_start = text.size();
    for (int i = 0; i < data_internal::kSentencesPerParagraph; ++i) {
      if (i > 0) text.push_back(' ');
      AppendSentence(grammar, rng, &text);
      if (i == 0) first_sentence.assign(text, paragraph_start, std::string::npos);
    }
    text.append(data_internal::kRepeatMarker);
    text.append(first_sentence);
    text.push_back('\n');
  }
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>(text[i]);
  return tokens;
}

}  // namespace

double SyntheticCorpusEntropyRateNats() {
  const data_internal::SentenceStats s =
      data_internal::ComputeSentenceStats(data_internal::SyntheticGrammar());
  constexpr int k = data_internal::kSentencesPerParagraph;
  // k sentences separated by k - 1 spaces, the marker, the first sentence again, '\n'.
  const double paragraph_bytes = (k + 1) * s.expected_bytes + (k - 1) +
                                 static_cast<double>(std::strlen(data_internal::kRepeatMarker)) + 1;
  return k * s.entropy_nats / paragraph_bytes;
}

double UnigramEntropyNats(absl::Span<const uint16_t> tokens) {
  if (tokens.empty()) return 0;
  std::vector<int64_t> counts(65536, 0);
  for (const uint16_t t : tokens) ++counts[t];
  const auto n = static_cast<double>(tokens.size());
  double h = 0;
  for (const int64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    h -= p * std::log(p);
  }
  return h;
}

std::string BytesToText(absl::Span<const uint16_t> tokens) {
  std::string text(tokens.size(), '?');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 256) text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

absl::StatusOr<SyntheticCorpus> GenerateSyntheticCorpus(const SyntheticCorpusOptions& options) {
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  for (const auto& [name, value] : {std::pair{"train_tokens", options.train_tokens},
                                    std::pair{"val_tokens", options.val_tokens}}) {
    if (value < 1 || value > kMaxTokens) {
      return absl::InvalidArgumentError(absl::StrCat("SyntheticCorpusOptions.", name, " = ", value,
                                                     " must be in [1, ", kMaxTokens, "]"));
    }
  }
  SyntheticCorpus corpus;
  corpus.train = GenerateSplit(DeriveSeed(options.seed, 0), options.train_tokens);
  corpus.val = GenerateSplit(DeriveSeed(options.seed, 1), options.val_tokens);
  corpus.train_unigram_entropy_nats = UnigramEntropyNats(corpus.train);
  corpus.val_unigram_entropy_nats = UnigramEntropyNats(corpus.val);
  corpus.entropy_rate_nats = SyntheticCorpusEntropyRateNats();
  return corpus;
}

}  // namespace ps
