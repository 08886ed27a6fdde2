// Unicode character classes for GPT-2's pre-tokenizer
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

// The class of code point `cp`. Values that are not Unicode scalar values (kInvalidCodePoint of
// base/utf8.h included) are kOther.
CharClass ClassOf(uint32_t cp);

// The Unicode version of the letter/number tables, e.g. "14.0.0".
absl::string_view UnicodeTablesVersion();

}  // namespace ps::data_internal

#endif  // PATRICKSTAR_TRAINER_DATA_INTERNAL_UNICODE_CLASSES_H_
