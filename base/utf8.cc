#include "base/utf8.h"

#include "glog/logging.h"

namespace ps {

Utf8Char DecodeUtf8(absl::string_view text, size_t pos) {
  const auto byte = [&text](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1};
  // Table 3-7: the allowed range of the second byte depends on the first; later bytes are 80..BF.
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
    return {kInvalidCodePoint, 1};  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  for (int k = 1; k < length; ++k) {
    const size_t i = pos + static_cast<size_t>(k);
    const uint8_t b = i < text.size() ? byte(i) : 0;
    if (i >= text.size() || b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      return {kInvalidCodePoint, k};
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, length};
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = DecodeUtf8(s, i);
    if (!c.valid()) return false;
    i += static_cast<size_t>(c.length);
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  DCHECK(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF)) << "not a scalar value: " << cp;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace ps
