#include "trainer/data/internal/unicode_classes.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace ps::data_internal {
namespace {

struct CodePointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

#include "trainer/data/internal/unicode_tables.inc"

template <size_t N>
bool InRanges(const CodePointRange (&ranges)[N], uint32_t cp) {
  // The first range whose end is >= cp.
  const CodePointRange* it =
      std::lower_bound(std::begin(ranges), std::end(ranges), cp,
                       [](const CodePointRange& r, uint32_t value) { return r.last < value; });
  return it != std::end(ranges) && it->first <= cp;
}

bool IsWhiteSpace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

CharClass ClassOf(uint32_t cp) {
  if (cp < 0x80) {  // ASCII fast path
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    return IsWhiteSpace(cp) ? CharClass::kSpace : CharClass::kOther;
  }
  if (cp > 0x10FFFF) return CharClass::kOther;
  if (IsWhiteSpace(cp)) return CharClass::kSpace;
  if (InRanges(kLetterRanges, cp)) return CharClass::kLetter;
  if (InRanges(kNumberRanges, cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

absl::string_view UnicodeTablesVersion() { return kUnicodeTablesVersion; }

DecodedChar DecodeUtf8(absl::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) return {b0, 1};
  const DecodedChar invalid{kInvalidCodePoint, 1};
  // Unicode Table 3-7 (well-formed UTF-8 byte sequences): the allowed range of the second byte
  // depends on the first; later bytes are 80..BF.
  int length;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return invalid;  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (pos + static_cast<size_t>(length) > n) return invalid;
  if (s[pos + 1] < lo || s[pos + 1] > hi) return invalid;
  cp = (cp << 6) | (s[pos + 1] & 0x3F);
  for (int i = 2; i < length; ++i) {
    if (!IsContinuation(s[pos + i])) return invalid;
    cp = (cp << 6) | (s[pos + i] & 0x3F);
  }
  return {cp, length};
}

}  // namespace ps::data_internal
