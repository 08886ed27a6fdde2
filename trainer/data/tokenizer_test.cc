#include "trainer/data/tokenizer.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string TestDataPath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/trainer/data/testdata/", name);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::unique_ptr<BpeTokenizer> TinyTokenizer() {
  auto tok =
      BpeTokenizer::LoadGpt2(TestDataPath("tiny_vocab.json"), TestDataPath("tiny_merges.txt"));
  EXPECT_OK(tok);
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::vector<std::string> Pieces(absl::string_view text) {
  std::vector<std::string> out;
  for (absl::string_view p : Gpt2PreTokenize(text)) out.emplace_back(p);
  return out;
}

std::vector<uint32_t> Encode(Tokenizer& tok, absl::string_view text) {
  std::vector<uint32_t> ids;
  EXPECT_OK(tok.Encode(text, &ids));
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenization, worked out by hand from the pattern.

TEST(Gpt2PreTokenizeTest, HandWorkedExamples) {
  EXPECT_THAT(Pieces(""), ElementsAre());
  EXPECT_THAT(Pieces("Hello world"), ElementsAre("Hello", " world"));
  // Contractions are lowercase only; an apostrophe otherwise starts a punctuation run.
  EXPECT_THAT(Pieces("don't we'll I'M"), ElementsAre("don", "'t", " we", "'ll", " I", "'", "M"));
  EXPECT_THAT(Pieces("''s"), ElementsAre("''", "s"));
  EXPECT_THAT(Pieces("it's'"), ElementsAre("it", "'s", "'"));
  // A space attaches to the following letter, number or punctuation run.
  EXPECT_THAT(Pieces("a 12 ?! b"), ElementsAre("a", " 12", " ?!", " b"));
  EXPECT_THAT(Pieces("abc123def"), ElementsAre("abc", "123", "def"));
  // Whitespace runs leave their last character to the next word; at the end they stay whole.
  EXPECT_THAT(Pieces("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Pieces("a\n\n\nb"), ElementsAre("a", "\n\n", "\n", "b"));
  EXPECT_THAT(Pieces("a\tb"), ElementsAre("a", "\t", "b"));  // only U+0020 attaches
  EXPECT_THAT(Pieces("a  \t"), ElementsAre("a", "  \t"));
  EXPECT_THAT(Pieces("  "), ElementsAre("  "));
  EXPECT_THAT(Pieces(" "), ElementsAre(" "));
  EXPECT_THAT(Pieces("x \n"), ElementsAre("x", " \n"));
  // Non-ASCII letters, numbers, spaces, marks and symbols.
  EXPECT_THAT(Pieces("café 中文 ½Ⅻ"), ElementsAre("café", " 中文", " ½Ⅻ"));
  EXPECT_THAT(Pieces("e\xCC\x81x"), ElementsAre("e", "\xCC\x81", "x"));  // U+0301 is a mark
  EXPECT_THAT(Pieces("a\xC2\xA0"
                     "b"),
              ElementsAre("a", "\xC2\xA0", "b"));  // NBSP: \s, not ' '
  EXPECT_THAT(Pieces("\xF0\x9F\x98\x80!"), ElementsAre("\xF0\x9F\x98\x80!"));
  // Invalid UTF-8 bytes are "other" characters and group with punctuation.
  EXPECT_THAT(Pieces("a\xFF\xFE!b \xC0"), ElementsAre("a", "\xFF\xFE!", "b", " \xC0"));
}

struct FixtureCase {
  std::string text;
  std::vector<std::string> pieces;
  std::vector<uint32_t> ids;
};

std::vector<FixtureCase> FixtureCases() {
  const nlohmann::json doc = nlohmann::json::parse(ReadFileOrDie(TestDataPath("bpe_cases.json")));
  std::vector<FixtureCase> cases;
  for (const auto& c : doc["cases"]) {
    FixtureCase f;
    f.text = absl::HexStringToBytes(c["text_hex"].get<std::string>());
    for (const auto& p : c["pieces_hex"])
      f.pieces.push_back(absl::HexStringToBytes(p.get<std::string>()));
    for (const auto& id : c["ids"]) f.ids.push_back(id.get<uint32_t>());
    cases.push_back(std::move(f));
  }
  return cases;
}

// bpe_cases.json comes from testdata/make_bpe_fixture.py: Python's `re` running GPT-2's pattern
// and encoder.py's bpe(), on hand-picked and 300 random strings (contractions, non-ASCII letters
// and numbers, Unicode spaces, marks, emoji, invalid UTF-8).
TEST(Gpt2PreTokenizeTest, MatchesThePythonReference) {
  const std::vector<FixtureCase> cases = FixtureCases();
  ASSERT_GT(cases.size(), 300u);
  for (const FixtureCase& c : cases) {
    EXPECT_THAT(Pieces(c.text), ElementsAreArray(c.pieces)) << absl::CHexEscape(c.text);
  }
}

// ---------------------------------------------------------------------------------------------
// BPE on the tiny fixture. Byte symbols have GPT-2's ids (bytes_to_unicode order: '!' = 0,
// 'a' = 64, ..., ' ' -> 'Ġ' = 220, '\n' -> 'Ċ' = 198); merged symbols are numbered in merge
// order: he 256, ll 257, hell 258, hello 259, Ġw 260, Ġwo 261, rl 262, Ġworl 263, Ġworld 264,
// bc 265, ab 266, aba 267, ĠĠ 268, ĠĠĠĠ 269, ĊĊ 270, Ã© 271, 's 272, Ġt 273, Ġth 274, ...,
// 12 279, 123 280.

TEST(BpeTokenizerGpt2FilesTest, HandWorkedEncodings) {
  std::unique_ptr<BpeTokenizer> tok = TinyTokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 292);
  EXPECT_EQ(tok->num_merges(), 35);
  EXPECT_EQ(tok->document_token(), 291);
  // h e -> he; l l -> ll; he ll -> hell; hell o -> hello. " world": Ġ w, Ġw o, r l, Ġwo rl,
  // Ġworl d.
  EXPECT_THAT(Encode(*tok, "hello world"), ElementsAre(259, 264));
  // "ab a" (rank 10) is listed before "a b" (rank 11): encoder.py merges both "a b" first and
  // then finds no "ab a" pair; merging one pair at a time would give "aba" + "b".
  EXPECT_THAT(Encode(*tok, "abab"), ElementsAre(266, 266));
  EXPECT_THAT(Encode(*tok, "aba"), ElementsAre(267));
  // Rank decides, not position: "b c" (9) before "a b" (11).
  EXPECT_THAT(Encode(*tok, "abc"), ElementsAre(64, 265));
  // " there": h e (0) first, after which "Ġt h" no longer applies: Ġt he r e.
  EXPECT_THAT(Encode(*tok, " there"), ElementsAre(273, 256, 81, 68));
  EXPECT_THAT(Encode(*tok, "hello's"), ElementsAre(259, 272));
  // Digits: 1 2 -> 12, 12 3 -> 123, then 4 5 6 stay bytes.
  EXPECT_THAT(Encode(*tok, "123456"), ElementsAre(280, 19, 20, 21));
  // é is C3 A9, whose stand-ins are Ã ©.
  EXPECT_THAT(Encode(*tok, "café"), ElementsAre(66, 64, 69, 271));
  EXPECT_THAT(Encode(*tok, "a\n\n\nb"), ElementsAre(64, 270, 198, 65));
  // "   " + " x": Ġ Ġ merges once (left to right), leaving one Ġ.
  EXPECT_THAT(Encode(*tok, "    x"), ElementsAre(268, 220, 220, 87));
  // Six spaces at the end: ĠĠ ĠĠ ĠĠ, then ĠĠ ĠĠ -> ĠĠĠĠ once.
  EXPECT_THAT(Encode(*tok, "      "), ElementsAre(269, 268));
  // Encode appends.
  std::vector<uint32_t> ids = {7};
  ASSERT_OK(tok->Encode("hello", &ids));
  ASSERT_OK(tok->Encode("", &ids));
  EXPECT_THAT(ids, ElementsAre(7, 259));
}

TEST(BpeTokenizerGpt2FilesTest, MatchesThePythonReferenceAndRoundTrips) {
  std::unique_ptr<BpeTokenizer> tok = TinyTokenizer();
  ASSERT_NE(tok, nullptr);
  std::string all_text;
  std::vector<uint32_t> all_ids;
  for (int pass = 0; pass < 2; ++pass) {  // the second pass is served from the cache
    for (const FixtureCase& c : FixtureCases()) {
      const std::vector<uint32_t> ids = Encode(*tok, c.text);
      EXPECT_THAT(ids, ElementsAreArray(c.ids)) << absl::CHexEscape(c.text);
      EXPECT_THAT(tok->Decode(ids), IsOkAndHolds(c.text));
      if (pass == 0) {
        all_text += c.text;
        all_ids.insert(all_ids.end(), ids.begin(), ids.end());
      }
    }
  }
  // Concatenated texts tokenize differently at the seams, but still decode to the same bytes.
  EXPECT_THAT(tok->Decode(Encode(*tok, all_text)), IsOkAndHolds(all_text));
  EXPECT_THAT(tok->Decode(all_ids), IsOkAndHolds(all_text));
}

TEST(BpeTokenizerGpt2FilesTest, EveryByteRoundTrips) {
  std::unique_ptr<BpeTokenizer> tok = TinyTokenizer();
  ASSERT_NE(tok, nullptr);
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  for (int b = 255; b >= 0; --b) bytes.push_back(static_cast<char>(b));
  EXPECT_THAT(tok->Decode(Encode(*tok, bytes)), IsOkAndHolds(bytes));
  // A long piece (one run of letters) goes through the heap path.
  std::string long_word;
  for (int i = 0; i < 50000; ++i) long_word += "ab";
  const std::vector<uint32_t> ids = Encode(*tok, long_word);
  EXPECT_EQ(ids.size(), 50000u);
  EXPECT_THAT(ids, ::testing::Each(266));  // every "a b" merges; "ab ab" has no merge
}

TEST(BpeTokenizerGpt2FilesTest, DecodeRejectsUnknownIdsAndUndecodableTokens) {
  std::unique_ptr<BpeTokenizer> tok = TinyTokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{259, 292}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token 292"), HasSubstr("position 1"))));
  // "<|endoftext|>" decodes to its literal text, as in encoder.py.
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{291}), IsOkAndHolds("<|endoftext|>"));
}

TEST(BpeTokenizerGpt2FilesTest, ByteTables) {
  const auto& table = Gpt2ByteToUnicode();
  EXPECT_EQ(table['a'], "a");
  EXPECT_EQ(table[' '], "Ġ");
  EXPECT_EQ(table['\n'], "Ċ");
  EXPECT_EQ(table[0], "Ā");
  EXPECT_EQ(table[0xAD], "Ń");
  EXPECT_EQ(table[0xFF], "ÿ");
}

// ---------------------------------------------------------------------------------------------
// Malformed files.

std::string ByteVocabEntries() {
  std::vector<std::string> entries;
  for (int b = 0; b < 256; ++b) {
    entries.push_back(absl::StrCat(nlohmann::json(Gpt2ByteToUnicode()[b]).dump(), ": ", b));
  }
  return absl::StrJoin(entries, ", ");
}

std::string VocabWith(const std::string& extra) {
  return absl::StrCat("{", ByteVocabEntries(), extra, "}");
}

struct BadInput {
  std::string name;
  std::string vocab;
  std::string merges;
  std::vector<std::string> message_parts;
};

class MalformedBpeFilesTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(MalformedBpeFilesTest, IsInvalidArgumentSayingWhatIsWrong) {
  const BadInput& bad = GetParam();
  const auto tok = BpeTokenizer::FromGpt2Contents(bad.vocab, bad.merges, "'v.json'", "'m.txt'");
  ASSERT_THAT(tok, StatusIs(absl::StatusCode::kInvalidArgument));
  for (const std::string& part : bad.message_parts) {
    EXPECT_THAT(tok.status().message(), HasSubstr(part));
  }
}

std::vector<BadInput> BadInputs() {
  const std::string good_vocab = VocabWith(R"(, "ab": 256, "abc": 257)");
  std::string missing_byte = VocabWith("");
  const std::string space_entry = "\"Ġ\": 32";  // byte b has id b in VocabWith
  missing_byte.replace(missing_byte.find(space_entry), space_entry.size(), "\"QQ\": 32");
  return {
      {"not_json", "{\"a\": 1", "", {"'v.json'", "not valid JSON"}},
      {"invalid_utf8", "{\"\xFF\": 1}", "", {"not valid JSON (or not valid UTF-8)"}},
      {"array", "[1, 2]", "", {"not a JSON object"}},
      {"empty_object", "{}", "", {"empty"}},
      {"string_id",
       VocabWith(R"(, "ab": "256")"),
       "",
       {"token 'ab'", "\"256\"", "[0, 2147483647]"}},
      {"negative_id", VocabWith(R"(, "ab": -1)"), "", {"token 'ab'", "-1"}},
      {"float_id", VocabWith(R"(, "ab": 2.5)"), "", {"token 'ab'", "2.5"}},
      {"huge_id", VocabWith(R"(, "ab": 2147483648)"), "", {"2147483648", "[0, 2147483647]"}},
      {"duplicate_id", VocabWith(R"(, "ab": 97)"), "", {"same id 97"}},
      {"duplicate_key", VocabWith(R"(, "ab": 256, "ab": 257)"), "", {"'ab' appears twice"}},
      {"empty_token", VocabWith(R"(, "": 256)"), "", {"empty token"}},
      {"missing_byte", missing_byte, "", {"byte 32", "'Ġ'", "missing"}},
      {"one_symbol", good_vocab, "#version: 0.2\nab\n", {"'m.txt' line 2 ('ab')", "two symbols"}},
      {"three_symbols", good_vocab, "a b c\n", {"line 1", "two symbols"}},
      {"double_space", good_vocab, "a  b\n", {"line 1", "two symbols"}},
      {"blank_line", good_vocab, "a b\n\nab c\n", {"line 2", "two symbols"}},
      {"unknown_symbol",
       good_vocab,
       "a b\nab zz\n",
       {"line 2", "symbol 'zz'", "not in the vocabulary"}},
      {"unknown_merged", good_vocab, "a b\nb c\n", {"line 2", "merged symbol 'bc'"}},
      {"duplicate_merge", good_vocab, "a b\nab c\na b\n", {"line 3", "duplicate of line 1"}},
      {"version_not_first", good_vocab, "a b\n#version: 0.2\n", {"line 2", "symbol '#version:'"}},
  };
}

INSTANTIATE_TEST_SUITE_P(AllCases, MalformedBpeFilesTest, ::testing::ValuesIn(BadInputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) {
                           return info.param.name;
                         });

TEST(BpeTokenizerGpt2FilesTest, AcceptsCrlfAndAMissingFinalNewline) {
  const std::string vocab = VocabWith(R"(, "ab": 256, "abc": 257)");
  ASSERT_OK_AND_ASSIGN(auto tok,
                       BpeTokenizer::FromGpt2Contents(vocab, "#version: 0.2\r\na b\r\nab c"));
  EXPECT_EQ(tok->num_merges(), 2);
  EXPECT_THAT(Encode(*tok, "abcab"), ElementsAre(257, 256));
  EXPECT_EQ(tok->document_token(), std::nullopt);
  // No merges at all is a valid (byte-level) BPE.
  ASSERT_OK_AND_ASSIGN(auto bytes_only, BpeTokenizer::FromGpt2Contents(vocab, ""));
  EXPECT_THAT(Encode(*bytes_only, "ab"), ElementsAre(97, 98));  // VocabWith: byte b has id b
}

TEST(BpeTokenizerGpt2FilesTest, DecodeRejectsTokensOutsideTheByteAlphabet) {
  // A raw space is not one of GPT-2's stand-in characters.
  ASSERT_OK_AND_ASSIGN(auto tok, BpeTokenizer::FromGpt2Contents(VocabWith(R"(, "a b": 300)"), ""));
  EXPECT_EQ(tok->vocab_size(), 301);
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{300}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token 300 ('a b')"), HasSubstr("byte alphabet"))));
  // Ids 256..299 are gaps.
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{256}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not in the vocabulary")));
}

TEST(BpeTokenizerGpt2FilesTest, MissingFilesAreNotFound) {
  EXPECT_THAT(BpeTokenizer::LoadGpt2("/no/such/vocab.json", TestDataPath("tiny_merges.txt")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/no/such/vocab.json")));
  EXPECT_THAT(BpeTokenizer::LoadGpt2(TestDataPath("tiny_vocab.json"), "/no/such/merges.txt"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/no/such/merges.txt")));
  // Error messages of loaded files name the path.
  EXPECT_THAT(
      BpeTokenizer::LoadGpt2(TestDataPath("tiny_merges.txt"), TestDataPath("tiny_merges.txt")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tiny_merges.txt'")));
}

// ---------------------------------------------------------------------------------------------
// ByteTokenizer.

TEST(ByteTokenizerTest, EveryByteIsOneToken) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  const std::vector<uint32_t> ids = Encode(tok, bytes);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_THAT(tok.Decode(ids), IsOkAndHolds(bytes));
  EXPECT_THAT(tok.Decode(std::vector<uint32_t>{1, 256}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token 256"), HasSubstr("position 1"))));
}

}  // namespace
}  // namespace ps
