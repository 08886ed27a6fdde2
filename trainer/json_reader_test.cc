// JsonReader on documents of its own (no config): syntax positions in characters, duplicate keys
// with their paths, the depth limit, unknown keys with suggestions and aliases, ignored keys,
// typed getters (absent keys leave the output alone; wrong types and ranges are named), and the
// message helpers.
#include "trainer/json_reader.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

constexpr absl::string_view kPetKeys[] = {"name", "legs", "weight", "vaccinated", "owner"};
constexpr JsonKeyAlias kPetAliases[] = {{"feet", "legs"}};
constexpr JsonIgnoredKey kPetIgnored[] = {{"color", "colors are not recorded"}};
constexpr JsonSection kPet{"pet", kPetKeys, kPetAliases, kPetIgnored};

TEST(CheckJsonSyntax, PositionsAreLinesAndCharacters) {
  EXPECT_OK(CheckJsonSyntax(R"({"a": [1, {"b": null}]})", "doc.json", 8));
  EXPECT_THAT(CheckJsonSyntax("{\n  \"a\": tru\n}", "doc.json", 8),
              StatusIs(kInvalid, AllOf(HasSubstr("doc.json:2:11: JSON syntax error: "),
                                       HasSubstr("the line reads: \"  \\\"a\\\": tru\""),
                                       Not(HasSubstr("[json.exception")))));
  // "ü" is two bytes and one column.
  EXPECT_THAT(CheckJsonSyntax("{\"\xC3\xBC\": x}", "d", 8),
              StatusIs(kInvalid, HasSubstr("d:1:7: JSON syntax error")));
  EXPECT_THAT(CheckJsonSyntax("", "d", 8), StatusIs(kInvalid, HasSubstr("d:1:1:")));
}

TEST(CheckJsonSyntax, DuplicateKeysAndDepth) {
  EXPECT_THAT(CheckJsonSyntax(R"({"pet": {"legs": 4, "legs": 3}})", "d", 8),
              StatusIs(kInvalid, HasSubstr("d: key `pet.legs` appears more than once")));
  EXPECT_THAT(CheckJsonSyntax(R"([{"x": 1}, [{"y": 1, "y": 2}]])", "d", 8),
              StatusIs(kInvalid, HasSubstr("key `[1][0].y` appears more than once")));
  EXPECT_OK(CheckJsonSyntax(R"({"a": {"x": 1}, "b": {"x": 1}})", "d", 8));
  EXPECT_OK(CheckJsonSyntax("[[[]]]", "d", 3));
  EXPECT_THAT(CheckJsonSyntax("[[[[]]]]", "d", 3, "; flatten it"),
              StatusIs(kInvalid, HasSubstr("d: the JSON nests deeper than 3 levels; flatten it")));
  EXPECT_THAT(CheckJsonSyntax(std::string(100000, '['), "d", 3), StatusIs(kInvalid));
}

TEST(JsonReader, UnknownKeysAreNamedWithSuggestionsAndIgnoredOnesReported) {
  std::vector<std::string> ignored;
  const JsonReader r("pets.json", &ignored);
  const Json ok = Json::parse(R"({"name": "Rex", "color": "brown"})");
  EXPECT_OK(r.CheckKeys(ok, kPet));
  EXPECT_THAT(ignored, ElementsAre("color"));
  EXPECT_THAT(r.CheckKeys(Json::parse(R"({"wieght": 3})"), kPet),
              StatusIs(kInvalid, AllOf(HasSubstr("pets.json: unknown key `pet.wieght`; did you "
                                                 "mean `weight`?"),
                                       HasSubstr("valid keys in `pet`: name, legs, weight"))));
  EXPECT_THAT(r.CheckKeys(Json::parse(R"({"FEET": 3})"), kPet),
              StatusIs(kInvalid, HasSubstr("did you mean `legs`?")));
  EXPECT_THAT(
      r.CheckKeys(Json::parse(R"({"tail": 1})"), kPet),
      StatusIs(kInvalid, AllOf(HasSubstr("unknown key `pet.tail`"), Not(HasSubstr("mean")))));
  const std::string long_key(200, 'k');
  EXPECT_THAT(r.CheckKeys(Json{{long_key, 1}}, kPet),
              StatusIs(kInvalid, HasSubstr(absl::StrCat(std::string(80, 'k'), "...`"))));
  EXPECT_EQ(SuggestKey("ownr", kPet), "owner");
  EXPECT_EQ(SuggestKey("xyz", kPet), "");
  EXPECT_EQ(KeyEditDistance("Betsa", "betas"), 1);  // one transposition, case-insensitive
  EXPECT_EQ(KeyEditDistance("", "abc"), 3);
}

TEST(JsonReader, GettersReadPresentKeysAndNameWrongTypes) {
  const JsonReader r("pets.json");
  const Json pet = Json::parse(
      R"({"name": "Rex", "legs": 4, "weight": 12.5, "vaccinated": true, "owner": 3e3,
          "big": 18446744073709551615, "neg": -1, "size": "64KiB"})");
  std::string name;
  int legs = 0;
  double weight = 0;
  bool vaccinated = false;
  int64_t owner = 0;
  uint64_t big = 0;
  int64_t size = 0;
  ASSERT_OK(r.GetString(pet, "pet", "name", &name));
  ASSERT_OK(r.GetInt(pet, "pet", "legs", &legs));
  ASSERT_OK(r.GetDouble(pet, "pet", "weight", &weight));
  ASSERT_OK(r.GetBool(pet, "pet", "vaccinated", &vaccinated));
  ASSERT_OK(r.GetInt(pet, "pet", "owner", &owner));  // a whole float is an integer
  ASSERT_OK(r.GetUint64(pet, "pet", "big", &big));
  ASSERT_OK(r.GetBytes(pet, "pet", "size", &size));
  EXPECT_EQ(name, "Rex");
  EXPECT_EQ(legs, 4);
  EXPECT_EQ(weight, 12.5);
  EXPECT_TRUE(vaccinated);
  EXPECT_EQ(owner, 3000);
  EXPECT_EQ(big, 18446744073709551615u);
  EXPECT_EQ(size, 64 * 1024);
  // Absent keys leave the output alone.
  int untouched = 7;
  ASSERT_OK(r.GetInt(pet, "pet", "tail", &untouched));
  EXPECT_EQ(untouched, 7);
  // Wrong types and ranges name the path, what was expected and what was found.
  EXPECT_THAT(r.GetInt(pet, "pet", "weight", &legs),
              StatusIs(kInvalid, HasSubstr("pets.json: `pet.weight` must be an integer, found "
                                           "number 12.5")));
  EXPECT_THAT(r.GetBool(pet, "pet", "name", &vaccinated),
              StatusIs(kInvalid, HasSubstr("`pet.name` must be a boolean (true or false), found "
                                           "string \"Rex\"")));
  EXPECT_THAT(r.GetUint64(pet, "pet", "neg", &big),
              StatusIs(kInvalid, HasSubstr("`pet.neg` = integer -1: must be >= 0")));
  int8_t small = 0;
  EXPECT_THAT(r.GetInt(pet, "", "big", &small),
              StatusIs(kInvalid, HasSubstr("`big` = integer 18446744073709551615: out of range; "
                                           "must be in [-128, 127]")));
  EXPECT_THAT(r.GetBytes(pet, "pet", "name", &size),
              StatusIs(kInvalid, HasSubstr("`pet.name` = string \"Rex\"")));
  EXPECT_THAT(r.GetSection(pet, kPet, "name"), StatusIs(kInvalid, HasSubstr("must be an object")));
  ASSERT_OK_AND_ASSIGN(const Json* none, r.GetSection(pet, kPet, "missing"));
  EXPECT_EQ(none, nullptr);
  // An empty string is refused naming the key, and leaves the output alone.
  const Json unnamed = Json::parse(R"({"name": ""})");
  EXPECT_THAT(r.GetString(unnamed, "pet", "name", &name),
              StatusIs(kInvalid, HasSubstr("`pet.name` = string \"\": an empty string is not a "
                                           "value")));
  EXPECT_EQ(name, "Rex");
}

TEST(JsonMessages, DescribeQuoteAndShortestDoubles) {
  EXPECT_EQ(DescribeJson(Json(nullptr)), "null");
  EXPECT_EQ(DescribeJson(Json(false)), "boolean false");
  EXPECT_EQ(DescribeJson(Json(-3)), "integer -3");
  EXPECT_EQ(DescribeJson(Json(0.1)), "number 0.1");
  EXPECT_EQ(DescribeJson(Json::array({1, 2})), "array of 2 element(s)");
  EXPECT_EQ(DescribeJson(Json::object()), "object");
  EXPECT_EQ(QuoteForMessage("a\"b"), "\"a\\\"b\"");
  EXPECT_EQ(QuoteForMessage(std::string(70, 'x')), "\"" + std::string(60, 'x') + "...\"");
  EXPECT_EQ(QuoteForMessage("bad \xFF"), "\"bad \xEF\xBF\xBD\"");  // U+FFFD
  for (double v : {0.1, 1.0 / 3, 1e-300, 123456789.0, -2.5e17}) {
    EXPECT_EQ(std::stod(FormatShortestDouble(v)), v) << FormatShortestDouble(v);
  }
  EXPECT_EQ(FormatShortestDouble(0.1), "0.1");
  EXPECT_EQ(JsonReader::JoinKeyPath("", "a"), "a");
  EXPECT_EQ(JsonReader::JoinKeyPath("a.b", "c"), "a.b.c");
}

}  // namespace
}  // namespace ps
