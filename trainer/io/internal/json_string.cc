#include "trainer/io/internal/json_string.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <system_error>

namespace ps::io_internal {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// True for bytes that may be copied verbatim from an ASCII run.
inline bool IsPlainAscii(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

// The length of the well-formed UTF-8 sequence at s[i], or 0 when it is ill-formed; in that case
// *maximal_subpart is the number of bytes to replace with one U+FFFD (at least 1). Table 3-7 of the
// Unicode standard, "Well-Formed UTF-8 Byte Sequences".
size_t Utf8SequenceLength(absl::string_view s, size_t i, size_t* maximal_subpart) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *maximal_subpart = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < length; ++k) {
    if (i + k >= s.size()) break;
    const unsigned char c = byte(i + k);
    const unsigned char l = k == 1 ? lo : 0x80;
    const unsigned char h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  if (k == length) return length;
  *maximal_subpart = k;
  return 0;
}

}  // namespace

void AppendJsonString(std::string* out, absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    size_t run = i;
    while (run < s.size() && IsPlainAscii(static_cast<unsigned char>(s[run]))) ++run;
    if (run > i) {
      out->append(s.data() + i, run - i);
      i = run;
      if (i == s.size()) break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out->append("\\\"");
          break;
        case '\\':
          out->append("\\\\");
          break;
        case '\b':
          out->append("\\b");
          break;
        case '\f':
          out->append("\\f");
          break;
        case '\n':
          out->append("\\n");
          break;
        case '\r':
          out->append("\\r");
          break;
        case '\t':
          out->append("\\t");
          break;
        default: {
          const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
          out->append(esc, sizeof(esc));
        }
      }
      ++i;
      continue;
    }
    size_t bad = 0;
    const size_t n = Utf8SequenceLength(s, i, &bad);
    if (n > 0) {
      out->append(s.data() + i, n);
      i += n;
    } else {
      out->append(kReplacement);
      i += bad;
    }
  }
  out->push_back('"');
}

void AppendJsonDouble(std::string* out, double v) {
  if (std::isnan(v)) {
    out->append("\"NaN\"");
    return;
  }
  if (std::isinf(v)) {
    out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    return;
  }
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  // Shortest round-trip form: "1e+20", "0.1", "-0", "5" — all valid JSON numbers.
  out->append(buf, r.ptr);
}

void AppendJsonInt(std::string* out, int64_t v) {
  char buf[24];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, r.ptr);
}

void AppendJsonUint(std::string* out, uint64_t v) {
  char buf[24];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, r.ptr);
}

void AppendMicrosFromNanos(std::string* out, int64_t ns) {
  // |ns| without overflowing on INT64_MIN.
  const uint64_t magnitude = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  if (ns < 0) out->push_back('-');
  AppendJsonUint(out, magnitude / 1000);
  const unsigned frac = static_cast<unsigned>(magnitude % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                          static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out->append(digits, sizeof(digits));
}

}  // namespace ps::io_internal
