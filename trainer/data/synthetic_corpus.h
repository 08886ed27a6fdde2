// A deterministic built-in corpus for the trainer's default run: no files needed, and structure a
// small GPT learns within a few hundred steps.
//
// Text. Byte-level tokens (vocabulary 256; the text is printable ASCII plus '\n'). Paragraphs of
// three sentences from a small English-like grammar (trainer/data/internal/synthetic_grammar.h:
// ~45 words, each state of the grammar choosing among a few words, so words follow each other
// Markov-style), then " again: " and the paragraph's first sentence repeated, e.g.
//
//   the old fox chases a moon near the river. my cat sleeps. a robot likes every apple. again:
//   the old fox chases a moon near the river.
//
// What a model can learn, easiest first: spelling (bytes inside a word are determined by the
// word's first letters), which words may follow which, counting three sentences, and copying the
// first sentence (an induction-head task reaching back ~100 bytes).
//
// Entropy. unigram_entropy_nats is the byte-unigram entropy of the generated split (what a model
// that ignores context reaches); entropy_rate_nats is the generator's exact entropy rate in nats
// per byte (the expected entropy of a paragraph over its expected length, exact because the text
// determines the grammar's choices). No model can average below the entropy rate; a model with a
// finite context sits a little above it even when perfect, since the first bytes of a window lack
// their context.
//
// Reproducibility: the tokens are a function of (seed, split, token count) only, identical on
// every platform (SplitMix64 with integer weights, no floating point in the sampling). The train
// and validation splits are independent streams of the same grammar. ~2M tokens take a few ms.
#ifndef PATRICKSTAR_TRAINER_DATA_SYNTHETIC_CORPUS_H_
#define PATRICKSTAR_TRAINER_DATA_SYNTHETIC_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

struct SyntheticCorpusOptions {
  uint64_t seed = 0;
  // Tokens (bytes) of each split. >= 1 each; at most 2^31 - 1 (one token file's limit).
  int64_t train_tokens = 2'000'000;
  int64_t val_tokens = 200'000;
};

struct SyntheticCorpus {
  static constexpr int kVocabSize = 256;

  std::vector<uint16_t> train;  // train_tokens byte tokens
  std::vector<uint16_t> val;    // val_tokens byte tokens
  double train_unigram_entropy_nats = 0;
  double val_unigram_entropy_nats = 0;
  // The generator's exact entropy rate, nats per token: a lower bound on the loss.
  double entropy_rate_nats = 0;
};

// Generates both splits. Errors: InvalidArgument for token counts out of range (naming the field).
[[nodiscard]] absl::StatusOr<SyntheticCorpus> GenerateSyntheticCorpus(
    const SyntheticCorpusOptions& options);

// The generator's exact entropy rate in nats per byte (independent of the seed).
double SyntheticCorpusEntropyRateNats();

// Empirical unigram entropy of `tokens`, -sum_v p(v) ln p(v) with p the tokens' frequencies, in
// nats; 0 for an empty span. Useful for any token file.
double UnigramEntropyNats(absl::Span<const uint16_t> tokens);

// Decodes byte-level tokens to text (for printing samples). Tokens > 255 become '?'.
std::string BytesToText(absl::Span<const uint16_t> tokens);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_DATA_SYNTHETIC_CORPUS_H_
