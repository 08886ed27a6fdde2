// The stochastic grammar behind trainer/data/synthetic_corpus.h, exposed for its tests.
//
// A sentence is a walk through a finite automaton: from each state one edge is drawn with
// probability weight / (sum of the state's weights); an edge either emits a word and moves to its
// next state, or ends the sentence (kEnd, no word). The sentence's text is its words joined by
// single spaces, followed by '.'. Within one state every word is distinct, so the text determines
// the walk (the grammar is unambiguous) and the entropy of a sentence's text equals the entropy of
// its walk: sum over states of (expected visits) x (entropy of the state's edge choice).
//
// A paragraph is kSentencesPerParagraph independent sentences separated by spaces, then
// kRepeatMarker and the paragraph's first sentence again, then '\n'. The repeat is deterministic
// (it adds bytes, no entropy) and, like counting to kSentencesPerParagraph, is structure that
// reaches back further than adjacent words.
#ifndef PATRICKSTAR_TRAINER_DATA_INTERNAL_SYNTHETIC_GRAMMAR_H_
#define PATRICKSTAR_TRAINER_DATA_INTERNAL_SYNTHETIC_GRAMMAR_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ps::data_internal {

inline constexpr int kEnd = -1;
inline constexpr int kSentencesPerParagraph = 3;
inline constexpr char kRepeatMarker[] = " again: ";

struct GrammarEdge {
  uint32_t weight = 1;  // > 0
  std::string word;     // empty exactly when next == kEnd
  int next = kEnd;      // index of the next state, or kEnd
};

struct GrammarState {
  std::vector<GrammarEdge> edges;  // at least one
};

// States; the walk starts in state 0.
struct Grammar {
  std::vector<GrammarState> states;
};

// The corpus's grammar: a small English-like language (subjects, verbs, objects, optional
// prepositional phrases) over ~45 words.
const Grammar& SyntheticGrammar();

// Exact statistics of one sentence of `grammar` (computed from expected state visits).
struct SentenceStats {
  double entropy_nats = 0;    // entropy of the sentence's text
  double expected_bytes = 0;  // expected length including the final '.'
};
SentenceStats ComputeSentenceStats(const Grammar& grammar);

}  // namespace ps::data_internal

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_SYNTHETIC_GRAMMAR_H_
