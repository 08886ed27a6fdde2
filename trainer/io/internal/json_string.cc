#include "trainer/io/internal/json_string.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <system_error>

#include "base/utf8.h"

namespace ps::io_internal {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// True for bytes that may be copied verbatim from an ASCII run.
inline bool IsPlainAscii(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

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
    // An ill-formed sequence becomes one U+FFFD per maximal subpart (Unicode 3.9).
    const Utf8Char ch = DecodeUtf8(s, i);
    if (ch.valid()) {
      out->append(s.data() + i, static_cast<size_t>(ch.length));
    } else {
      out->append(kReplacement);
    }
    i += static_cast<size_t>(ch.length);
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
