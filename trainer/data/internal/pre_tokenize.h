// The pre-tokenizers of byte-level BPE tokenizers: the regular expressions that GPT-2, Llama-3 and
// Qwen2 split text with before BPE, each implemented by hand over UTF-8 code points (no regex
// engine). Alternatives are tried in order at each position, each quantifier greedy with
// backtracking, exactly as the Hugging Face `tokenizers` library (Oniguruma) runs them:
//
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  kLlama3 with \p{N} (one digit) for \p{N}{1,3}
//
// \p{L}, \p{N} and \s are unicode_classes.h's classes (Unicode 16.0, as the library). The
// case-insensitive contractions fold ASCII letters only ('ſ does not match 's, as in the library).
// Bytes that are not well-formed UTF-8 are single characters of class "other" (the library cannot
// be given such text; this keeps encoding lossless).
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_TRAINER_DATA_INTERNAL_PRE_TOKENIZE_H_
#define PATRICKSTAR_TRAINER_DATA_INTERNAL_PRE_TOKENIZE_H_

#include <optional>
#include <vector>

#include "absl/strings/string_view.h"

namespace ps::data_internal {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The pattern's name: "gpt2", "llama3", "qwen2".
absl::string_view SplitPatternName(SplitPattern pattern);

// The pattern whose regex source (as tokenizer.json spells it, JSON escapes undone) is exactly
// `regex`; nullopt for any other.
std::optional<SplitPattern> RecognizeSplitPattern(absl::string_view regex);

// Appends the pieces of `text` under `pattern`, in order, as views into `text`; their
// concatenation is `text` (no piece is empty).
void PreTokenize(SplitPattern pattern, absl::string_view text,
                 std::vector<absl::string_view>* pieces);

}  // namespace ps::data_internal

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_PRE_TOKENIZE_H_
