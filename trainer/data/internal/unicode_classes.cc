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

}  // namespace ps::data_internal
