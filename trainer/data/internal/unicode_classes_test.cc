#include "trainer/data/internal/unicode_classes.h"

#include <string>

#include "gtest/gtest.h"

namespace ps::data_internal {
namespace {

TEST(UnicodeClassesTest, ClassifiesLettersNumbersSpacesAndOthers) {
  for (const uint32_t cp :
       {0x41u, 0x7Au, 0xAAu, 0xE9u, 0x416u, 0x4E2Du, 0x1C5u, 0x2B0u, 0x20000u}) {
    EXPECT_EQ(ClassOf(cp), CharClass::kLetter) << std::hex << cp;
  }
  for (const uint32_t cp : {0x30u, 0x39u, 0x663u, 0x216Bu, 0xBDu, 0xB2u}) {
    EXPECT_EQ(ClassOf(cp), CharClass::kNumber) << std::hex << cp;
  }
  for (const uint32_t cp : {0x9u, 0xAu, 0xBu, 0xCu, 0xDu, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u,
                            0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_EQ(ClassOf(cp), CharClass::kSpace) << std::hex << cp;
  }
  // Punctuation, symbols, combining marks, controls that are not White_Space (U+001C..U+001F),
  // format characters (zero-width space), surrogates, unassigned and out-of-range values.
  for (const uint32_t cp : {0x21u, 0x27u, 0x5Fu, 0x7Fu, 0x301u, 0x1Cu, 0x1Fu, 0x200Bu, 0x1F600u,
                            0xD800u, 0x0378u, 0x110000u, 0xFFFFFFFFu}) {
    EXPECT_EQ(ClassOf(cp), CharClass::kOther) << std::hex << cp;
  }
  EXPECT_EQ(UnicodeTablesVersion(), "16.0.0");
}

}  // namespace
}  // namespace ps::data_internal
