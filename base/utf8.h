// UTF-8: the one decoder, validator and encoder of the project (config and file headers,
// safetensors names, JSON output, the tokenizers' pre-tokenizer).
//
// Well-formed means Unicode's Table 3-7 ("Well-Formed UTF-8 Byte Sequences"): no overlong forms, no
// encoded surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequence.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_BASE_UTF8_H_
#define PATRICKSTAR_BASE_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ps {

// The code point DecodeUtf8 reports for an ill-formed sequence.
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;

// One decoded character. For a well-formed sequence, `cp` is its code point and `length` its
// length in bytes (1..4). For an ill-formed one, `cp` is kInvalidCodePoint and `length` is the
// length of its *maximal subpart* (Unicode 3.9, U+FFFD substitution of maximal subparts: the
// longest prefix of a well-formed sequence, at least 1 byte) — the bytes a decoder that replaces
// errors with U+FFFD replaces with one U+FFFD.
struct Utf8Char {
  uint32_t cp = 0;
  int length = 1;
  bool valid() const { return cp != kInvalidCodePoint; }
};

// Decodes the character starting at text[pos]. REQUIRES: pos < text.size().
Utf8Char DecodeUtf8(absl::string_view text, size_t pos);

// True if all of `s` is well-formed UTF-8.
bool IsValidUtf8(absl::string_view s);

// Appends the UTF-8 encoding of `cp` to `out`. REQUIRES: cp <= 0x10FFFF and not a surrogate.
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace ps

#endif  // PATRICKSTAR_BASE_UTF8_H_
