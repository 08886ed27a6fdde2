// Unicode character classes and UTF-8 decoding for GPT-2's pre-tokenizer
// (trainer/data/tokenizer.h).
//
// Classes: letters are the general category L (Lu Ll Lt Lm Lo) and numbers N (Nd Nl No), from
// tables generated out of Unicode 14.0 (unicode_tables.inc, by make_unicode_tables.py); whitespace
// is the Unicode White_Space property (25 code points: U+0009..U+000D, U+0020, U+0085, U+00A0,
// U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). No locale is consulted, so the
// classification is the same on every machine and thread.
#ifndef PATRICKSTAR_TRAINER_DATA_INTERNAL_UNICODE_CLASSES_H_
#define PATRICKSTAR_TRAINER_DATA_INTERNAL_UNICODE_CLASSES_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace ps::data_internal {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// The class of code point `cp`. Values that are not Unicode scalar values are kOther.
CharClass ClassOf(uint32_t cp);

// The Unicode version of the letter/number tables, e.g. "14.0.0".
absl::string_view UnicodeTablesVersion();

// One character of a UTF-8 string: its code point and its length in bytes. A byte that does not
// start a well-formed UTF-8 sequence (as defined by Unicode: no overlong forms, no surrogates,
// nothing above U+10FFFF, no truncated sequence) is one character of length 1 whose `cp` is
// kInvalidCodePoint; it classifies as kOther (Python's "surrogateescape" decoding does the same).
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;
struct DecodedChar {
  uint32_t cp = 0;
  int length = 1;
};

// Decodes the character starting at text[pos]. REQUIRES: pos < text.size().
DecodedChar DecodeUtf8(absl::string_view text, size_t pos);

}  // namespace ps::data_internal

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_UNICODE_CLASSES_H_
