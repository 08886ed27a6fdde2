// FlagGiven, FlagsDefinedIn and RefuseEmptyFlags over a real absl::ParseCommandLine of this
// test's own flags (absl keeps one parse record per process: one parse, several checks).
#include "base/flag_presence.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, fp_given_empty, "default", "a string flag given empty");
ABSL_FLAG(std::string, fp_given_value, "", "a string flag given a value");
ABSL_FLAG(std::string, fp_left_out, "", "a string flag not given (its default is empty)");
ABSL_FLAG(std::optional<int64_t>, fp_optional_number, std::nullopt, "an optional number");
ABSL_FLAG(bool, fp_bool, false, "a boolean");

namespace ps {
namespace {

using ::testing::HasSubstr;

void Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "flag_presence_test");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagPresence, GivenEmptyIsRefusedLeftOutIsNot) {
  Parse({"--fp_given_value=x", "--fp_bool", "--fp_optional_number="});
  EXPECT_TRUE(FlagGiven("fp_given_value"));
  EXPECT_TRUE(FlagGiven("fp_bool"));
  EXPECT_TRUE(FlagGiven("fp_optional_number"));
  EXPECT_FALSE(FlagGiven("fp_left_out"));  // empty default, never given: fine
  EXPECT_FALSE(FlagGiven("fp_given_empty"));

  std::vector<std::string> names;
  for (const absl::CommandLineFlag* f : FlagsDefinedIn(__FILE__)) names.emplace_back(f->Name());
  EXPECT_THAT(names, ::testing::ElementsAre("fp_bool", "fp_given_empty", "fp_given_value",
                                            "fp_left_out", "fp_optional_number"));
  EXPECT_TRUE(FlagsDefinedIn("no/such/file.cc").empty());

  // The optional number given "" is the first (by name) flag of this file given empty.
  const absl::Status s = RefuseEmptyFlags(__FILE__);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--fp_optional_number is empty"));
  EXPECT_THAT(s.message(), HasSubstr("--fp_optional_number=$VAR"));
  // Flags of another file are not this file's concern.
  EXPECT_TRUE(RefuseEmptyFlags("no/such/file.cc").ok());
}

}  // namespace
}  // namespace ps
