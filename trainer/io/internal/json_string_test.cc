#include "trainer/io/internal/json_string.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps::io_internal {
namespace {

// Parses `text` with a strict parser (no exceptions); fails the test when it is not valid JSON.
nlohmann::json ParseStrict(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not valid JSON: " << text;
  return j;
}

std::string Quote(absl::string_view s) {
  std::string out;
  AppendJsonString(&out, s);
  return out;
}

// Encodes a code point as UTF-8.
void AppendUtf8(std::string* out, uint32_t cp) {
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

const std::string kFffd = "\xEF\xBF\xBD";

TEST(JsonStringTest, EscapesQuotesBackslashAndControlCharacters) {
  EXPECT_EQ(Quote(""), "\"\"");
  EXPECT_EQ(Quote("plain"), "\"plain\"");
  EXPECT_EQ(Quote("a\"b\\c/d"), "\"a\\\"b\\\\c/d\"");
  EXPECT_EQ(Quote("\b\f\n\r\t"), "\"\\b\\f\\n\\r\\t\"");
  EXPECT_EQ(Quote(std::string("\0\x01\x1f\x7f", 4)), "\"\\u0000\\u0001\\u001f\x7f\"");
  // Every byte below 0x80 round-trips through a strict parser.
  std::string all;
  for (int c = 0; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  EXPECT_EQ(ParseStrict(Quote(all)).get<std::string>(), all);
}

TEST(JsonStringTest, PassesWellFormedUtf8Through) {
  const std::string s = "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x9A\x80 \xE4\xB8\xAD\xEF\xBF\xBF";
  EXPECT_EQ(Quote(s), "\"" + s + "\"");
  // Random code points across all planes (surrogates excluded: they are not scalar values).
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      uint32_t cp;
      do {
        const int plane = static_cast<int>(rng() % 4);
        cp = plane == 0   ? rng() % 0x80
             : plane == 1 ? rng() % 0x800
             : plane == 2 ? rng() % 0x10000
                          : rng() % 0x110000;
      } while (cp >= 0xD800 && cp <= 0xDFFF);
      AppendUtf8(&text, cp);
    }
    EXPECT_EQ(ParseStrict(Quote(text)).get<std::string>(), text);
  }
}

// The example of Unicode 15 §3.9 (Table 3-8) and the edge cases of Table 3-7.
TEST(JsonStringTest, ReplacesMaximalIllFormedSubpartsWithOneReplacementCharacter) {
  const std::string f = kFffd;
  EXPECT_EQ(
      ParseStrict(Quote("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64")).get<std::string>(),
      "a" + f + f + f + "b" + f + "c" + f + f + "d");
  EXPECT_EQ(ParseStrict(Quote("\xC0\x80")).get<std::string>(), f + f);          // overlong NUL
  EXPECT_EQ(ParseStrict(Quote("\xE0\x80\x80")).get<std::string>(), f + f + f);  // overlong
  EXPECT_EQ(ParseStrict(Quote("\xED\xA0\x80")).get<std::string>(), f + f + f);  // surrogate
  EXPECT_EQ(ParseStrict(Quote("\xF4\x90\x80\x80")).get<std::string>(), f + f + f + f);  // >10FFFF
  EXPECT_EQ(ParseStrict(Quote("\xF5\xFF\xFE")).get<std::string>(), f + f + f);
  EXPECT_EQ(ParseStrict(Quote("x\xE2\x82")).get<std::string>(), "x" + f);  // truncated at the end
  EXPECT_EQ(ParseStrict(Quote("\xF0\x9F\x9A")).get<std::string>(), f);
  EXPECT_EQ(ParseStrict(Quote("\xF0\x9F\x9A\"")).get<std::string>(), f + "\"");
}

// Random bytes: always valid JSON, and the ASCII characters survive in order (an ill-formed
// subpart never swallows an ASCII byte).
TEST(JsonStringTest, RandomBytesAlwaysGiveValidJson) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const nlohmann::json parsed = ParseStrict(Quote(bytes));
    ASSERT_TRUE(parsed.is_string());
    std::string ascii_in, ascii_out;
    for (char c : bytes) {
      if (static_cast<unsigned char>(c) < 0x80) ascii_in.push_back(c);
    }
    for (char c : parsed.get<std::string>()) {
      if (static_cast<unsigned char>(c) < 0x80) ascii_out.push_back(c);
    }
    ASSERT_EQ(ascii_out, ascii_in);
  }
}

TEST(JsonStringTest, Doubles) {
  const auto dbl = [](double v) {
    std::string s;
    AppendJsonDouble(&s, v);
    return s;
  };
  EXPECT_EQ(dbl(0.1), "0.1");
  EXPECT_EQ(dbl(5), "5");
  EXPECT_EQ(dbl(1e300), "1e+300");
  EXPECT_EQ(dbl(std::numeric_limits<double>::quiet_NaN()), "\"NaN\"");
  EXPECT_EQ(dbl(std::numeric_limits<double>::infinity()), "\"Infinity\"");
  EXPECT_EQ(dbl(-std::numeric_limits<double>::infinity()), "\"-Infinity\"");
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1000; ++i) {
    uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    if (!std::isfinite(v)) continue;
    const nlohmann::json j = ParseStrict("[" + dbl(v) + "]");
    EXPECT_EQ(j[0].get<double>(), v) << dbl(v);
  }
}

TEST(JsonStringTest, MicrosFromNanos) {
  const auto us = [](int64_t ns) {
    std::string s;
    AppendMicrosFromNanos(&s, ns);
    return s;
  };
  EXPECT_EQ(us(0), "0.000");
  EXPECT_EQ(us(1), "0.001");
  EXPECT_EQ(us(999), "0.999");
  EXPECT_EQ(us(1000), "1.000");
  EXPECT_EQ(us(1234567), "1234.567");
  EXPECT_EQ(us(-1), "-0.001");
  EXPECT_EQ(us(-1234567), "-1234.567");
  EXPECT_EQ(us(std::numeric_limits<int64_t>::min()), "-9223372036854775.808");
  EXPECT_EQ(us(std::numeric_limits<int64_t>::max()), "9223372036854775.807");
  EXPECT_FALSE(ParseStrict("[" + us(-1234567) + "]").is_discarded());
}

}  // namespace
}  // namespace ps::io_internal
