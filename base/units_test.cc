#include "base/units.h"

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(Units, AlignAndDivide) {
  EXPECT_EQ(AlignUp(0, 256), 0);
  EXPECT_EQ(AlignUp(1, 256), 256);
  EXPECT_EQ(AlignUp(256, 256), 256);
  EXPECT_EQ(AlignUp(257, 256), 512);
  EXPECT_EQ(CeilDiv(10, 3), 4);
  EXPECT_EQ(CeilDiv(9, 3), 3);
  EXPECT_TRUE(IsPowerOfTwo(1));
  EXPECT_TRUE(IsPowerOfTwo(kGiB));
  EXPECT_FALSE(IsPowerOfTwo(0));
  EXPECT_FALSE(IsPowerOfTwo(12));
}

TEST(Units, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(3 * kGiB), "3.00 GiB");
  EXPECT_EQ(FormatBytes(-2 * kMiB), "-2.00 MiB");
}

TEST(Units, ParseBytesAcceptsWhatPeopleWrite) {
  EXPECT_THAT(ParseBytes("1048576"), IsOkAndHolds(1048576));
  EXPECT_THAT(ParseBytes("512MiB"), IsOkAndHolds(512 * kMiB));
  EXPECT_THAT(ParseBytes(" 1.5 GiB "), IsOkAndHolds(3 * kGiB / 2));
  EXPECT_THAT(ParseBytes("2gb"), IsOkAndHolds(2000000000));
  EXPECT_THAT(ParseBytes("64 KB"), IsOkAndHolds(64000));
  EXPECT_THAT(ParseBytes("1e9"), IsOkAndHolds(1000000000));
  EXPECT_THAT(ParseBytes("0"), IsOkAndHolds(0));
}

TEST(Units, ParseBytesRejectsNonsense) {
  EXPECT_THAT(ParseBytes(""), StatusIs(absl::StatusCode::kInvalidArgument, "expected a number"));
  EXPECT_THAT(ParseBytes("GiB"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseBytes("12 parsecs"), StatusIs(absl::StatusCode::kInvalidArgument, "unknown unit"));
  EXPECT_THAT(ParseBytes("-5MiB"), StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  EXPECT_THAT(ParseBytes("1e30"), StatusIs(absl::StatusCode::kInvalidArgument, "too large"));
  EXPECT_THAT(ParseBytes("0.5B"), StatusIs(absl::StatusCode::kInvalidArgument, "whole number"));
  EXPECT_THAT(ParseBytes("nan"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ps
