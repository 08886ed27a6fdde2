#include "base/utf8.h"

#include <cstdint>
#include <string>
#include <vector>

#include "base/splitmix64.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

struct Utf8Case {
  std::string bytes;
  uint32_t cp;
  int length;
};

TEST(Utf8Test, DecodesWellFormedSequencesAndMaximalSubpartsOfIllFormedOnes) {
  const Utf8Case cases[] = {
      {"A", 0x41, 1},
      {"\xC3\xA9", 0xE9, 2},
      {"\xE4\xB8\xAD", 0x4E2D, 3},
      {"\xF0\x9F\x98\x80", 0x1F600, 4},
      {"\xF4\x8F\xBF\xBF", 0x10FFFF, 4},
      {"\xEF\xBF\xBF", 0xFFFF, 3},
      {"\x80", kInvalidCodePoint, 1},              // lone continuation byte
      {"\xC0\xAF", kInvalidCodePoint, 1},          // overlong '/'
      {"\xC1\xBF", kInvalidCodePoint, 1},          // overlong
      {"\xE0\x80\xAF", kInvalidCodePoint, 1},      // overlong 3-byte
      {"\xF0\x80\x80\xAF", kInvalidCodePoint, 1},  // overlong 4-byte
      {"\xED\xA0\x80", kInvalidCodePoint, 1},      // encoded surrogate
      {"\xF4\x90\x80\x80", kInvalidCodePoint, 1},  // above U+10FFFF
      {"\xF5\x80\x80\x80", kInvalidCodePoint, 1},
      {"\xFF", kInvalidCodePoint, 1},
      {"\xE2\x82", kInvalidCodePoint, 2},  // truncated at the end: one maximal subpart
      {"\xE2\x82"
       "A",
       kInvalidCodePoint, 2},  // truncated before ASCII
      {"\xF0\x9F\x98"
       "A",
       kInvalidCodePoint, 3},                  // three of four bytes
      {"\xC3\xC3\xA9", kInvalidCodePoint, 1},  // lead byte followed by a lead byte
  };
  for (const Utf8Case& c : cases) {
    const Utf8Char d = DecodeUtf8(c.bytes, 0);
    EXPECT_EQ(d.cp, c.cp) << c.bytes;
    EXPECT_EQ(d.length, c.length) << c.bytes;
    EXPECT_EQ(d.valid(), c.cp != kInvalidCodePoint);
  }
  EXPECT_EQ(DecodeUtf8("x\xC3\xA9", 1).cp, 0xE9u);
}

TEST(Utf8Test, EveryScalarValueRoundTrips) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    AppendUtf8(cp, &s);
    const Utf8Char d = DecodeUtf8(s, 0);
    ASSERT_EQ(d.cp, cp);
    ASSERT_EQ(d.length, static_cast<int>(s.size()));
    ASSERT_TRUE(IsValidUtf8(s));
  }
}

// An independent oracle for IsValidUtf8: decode by the bit pattern of the lead byte alone (no
// Table 3-7 ranges), then accept only if the value is a scalar value whose shortest encoding is
// exactly the bytes read.
bool OracleValid(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      len = 1, cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    const int shortest = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (shortest != len || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

TEST(Utf8Test, ValidationAgreesWithABitPatternOracleOnRandomBytes) {
  // Bytes drawn from the boundaries of Table 3-7, so ill-formed cases of every kind are common.
  const std::vector<uint8_t> alphabet = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF,
                                         0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE,
                                         0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFE, 0xFF};
  SplitMix64 rng(42);
  int valid = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string s(1 + rng.Next() % 6, '\0');
    for (char& c : s) c = static_cast<char>(alphabet[rng.Next() % alphabet.size()]);
    const bool expected = OracleValid(s);
    valid += expected;
    ASSERT_EQ(IsValidUtf8(s), expected) << trial;
    // Decoding never reads past the end and always advances.
    for (size_t i = 0; i < s.size();) {
      const Utf8Char d = DecodeUtf8(s, i);
      ASSERT_GE(d.length, 1);
      ASSERT_LE(i + static_cast<size_t>(d.length), s.size());
      i += static_cast<size_t>(d.length);
    }
  }
  EXPECT_GT(valid, 1000);  // the test reaches both outcomes
}

}  // namespace
}  // namespace ps
