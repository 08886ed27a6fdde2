// Our tokenizers against the reference libraries: the token ids (and, for the hand-written hard
// cases, the pre-tokenizer's pieces) that Hugging Face `tokenizers` and Google `sentencepiece` give
// for small tokenizers trained offline by testdata/make_tokenizer_fixtures.py (the command line is
// in its header), on a multilingual, emoji- and whitespace-heavy corpus. Plus malformed and
// unsupported tokenizer files.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
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
#include "trainer/data/internal/pre_tokenize.h"
#include "trainer/data/load_tokenizer.h"
#include "trainer/data/sentencepiece_tokenizer.h"
#include "trainer/data/tokenizer.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string FixturePath(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".",
                      "/patrickstar_cc/trainer/data/testdata/tokenizers/", name);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void WriteFileOrDie(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

const Json& Cases() {
  static const Json* const cases = new Json(Json::parse(ReadFileOrDie(FixturePath("cases.json"))));
  return *cases;
}

std::string Unhex(const Json& hex) { return absl::HexStringToBytes(hex.get<std::string>()); }

std::vector<uint32_t> Ids(const Json& array) { return array.get<std::vector<uint32_t>>(); }

// Printable form of a test text for failure messages.
std::string Show(const std::string& text) {
  return absl::StrCat("\"", absl::CHexEscape(text), "\"");
}

std::vector<uint32_t> EncodeOrDie(Tokenizer& tok, const std::string& text) {
  std::vector<uint32_t> ids;
  EXPECT_OK(tok.Encode(text, &ids));
  return ids;
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json

struct JsonFixture {
  std::string file;
  data_internal::SplitPattern pattern;
  bool nfc;
};

class TokenizerJsonTest : public ::testing::TestWithParam<JsonFixture> {};

TEST_P(TokenizerJsonTest, IdsPiecesAndRoundTripsMatchTheTokenizersLibrary) {
  const JsonFixture& f = GetParam();
  const Json& ref = Cases()["tokenizers"][f.file];
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> loaded, LoadTokenizer(FixturePath(f.file)));
  auto* tok = dynamic_cast<BpeTokenizer*>(loaded.get());
  ASSERT_NE(tok, nullptr) << "a tokenizer.json must load as a BpeTokenizer";
  EXPECT_EQ(tok->vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_THAT(tok->name(), HasSubstr(data_internal::SplitPatternName(f.pattern)));

  int compared_pieces = 0, with_special = 0;
  for (const Json& c : ref["cases"]) {
    const std::string text = Unhex(c["hex"]);
    SCOPED_TRACE(absl::StrCat(f.file, " ", c["kind"].get<std::string>(), " ", Show(text)));
    tok->set_parse_special_tokens(false);
    const std::vector<uint32_t> ids = EncodeOrDie(*tok, text);
    ASSERT_THAT(ids, ElementsAreArray(Ids(c["ids"])));
    tok->set_parse_special_tokens(true);
    const Json& special = c.contains("ids_special") ? c["ids_special"] : c["ids"];
    EXPECT_THAT(EncodeOrDie(*tok, text), ElementsAreArray(Ids(special)));
    with_special += c.contains("ids_special") ? 1 : 0;

    if (c.contains("pieces_hex")) {
      std::string normalized;
      std::vector<std::string> want;
      for (const Json& p : c["pieces_hex"]) {
        want.push_back(Unhex(p));
        normalized += want.back();
      }
      // The library's pieces are of the normalized text; compare where NFC changed nothing.
      if (normalized == text) {
        std::vector<absl::string_view> pieces;
        data_internal::PreTokenize(f.pattern, text, &pieces);
        EXPECT_THAT(std::vector<std::string>(pieces.begin(), pieces.end()), ElementsAreArray(want));
        ++compared_pieces;
      } else {
        EXPECT_TRUE(f.nfc) << "the pieces differ from the text only under NFC";
      }
    }
    // Decoding gives the text back (its NFC form, for an NFC tokenizer: re-encoding it gives the
    // same ids).
    ASSERT_OK_AND_ASSIGN(const std::string decoded, tok->Decode(ids));
    if (f.nfc) {
      tok->set_parse_special_tokens(false);
      EXPECT_THAT(EncodeOrDie(*tok, decoded), ElementsAreArray(ids));
    } else {
      EXPECT_EQ(decoded, text);
    }
  }
  EXPECT_GT(compared_pieces, 55);
  EXPECT_GT(with_special, 0) << "some texts have special tokens";
}

TEST_P(TokenizerJsonTest, DocumentTokenIsTheTemplatesBosOrEndOfText) {
  const JsonFixture& f = GetParam();
  const Json& ref = Cases()["tokenizers"][f.file];
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(FixturePath(f.file)));
  // "with_special_tokens_x": the library's encode("x", add_special_tokens=True).
  const std::vector<uint32_t> with_special = Ids(ref["with_special_tokens_x"]);
  if (with_special.size() == 2) {  // Llama-3: <|begin_of_text|> x
    EXPECT_EQ(tok->document_token(), with_special[0]);
    EXPECT_EQ(tok->TokenId("<|begin_of_text|>"), with_special[0]);
  } else {
    EXPECT_EQ(tok->document_token(), tok->TokenId("<|endoftext|>"));
    EXPECT_TRUE(tok->document_token().has_value());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerJsonTest,
                         ::testing::Values(JsonFixture{"gpt2_tokenizer.json",
                                                       data_internal::SplitPattern::kGpt2, false},
                                           JsonFixture{"llama3_tokenizer.json",
                                                       data_internal::SplitPattern::kLlama3, false},
                                           JsonFixture{"qwen2_tokenizer.json",
                                                       data_internal::SplitPattern::kQwen2, true}),
                         [](const ::testing::TestParamInfo<JsonFixture>& info) {
                           return std::string(data_internal::SplitPatternName(info.param.pattern));
                         });

TEST(TokenizerJsonTest, IgnoreMergesGivesAVocabularyEntryNoMergeReaches) {
  // The fixture has "ĠXYZZY" in its vocabulary and no merges that build it.
  ASSERT_OK_AND_ASSIGN(auto llama3,
                       BpeTokenizer::LoadTokenizerJson(FixturePath("llama3_tokenizer.json")));
  EXPECT_EQ(EncodeOrDie(*llama3, " XYZZY").size(), 1u);
  EXPECT_GT(EncodeOrDie(*llama3, " XYZZYX").size(), 1u);
  Json j = Json::parse(ReadFileOrDie(FixturePath("llama3_tokenizer.json")));
  j["model"]["ignore_merges"] = false;
  ASSERT_OK_AND_ASSIGN(auto without, BpeTokenizer::FromTokenizerJson(j.dump()));
  EXPECT_EQ(EncodeOrDie(*without, " XYZZY").size(), 6u);
}

TEST(TokenizerJsonTest, InvalidUtf8IsEncodedLosslessly) {
  // The Python library cannot be given ill-formed UTF-8; ours encodes it byte for byte.
  for (const char* file :
       {"gpt2_tokenizer.json", "llama3_tokenizer.json", "qwen2_tokenizer.json"}) {
    ASSERT_OK_AND_ASSIGN(auto tok, BpeTokenizer::LoadTokenizerJson(FixturePath(file)));
    for (const std::string& text :
         {std::string("ab\xFF"
                      "cd"),
          std::string("\xC0\xAF"), std::string("x\xE2\x82"), std::string("\xED\xA0\x80y"),
          std::string("\xF0\x9F\x98 z 'S\xFF"), std::string("e\xCC\x81\xFF\xCC\x81")}) {
      SCOPED_TRACE(absl::StrCat(file, " ", Show(text)));
      const std::vector<uint32_t> ids = EncodeOrDie(*tok, text);
      ASSERT_OK_AND_ASSIGN(const std::string decoded, tok->Decode(ids));
      if (std::string(file) != "qwen2_tokenizer.json" || text.find('\xCC') == std::string::npos) {
        EXPECT_EQ(decoded, text);
      }
    }
  }
}

TEST(TokenizerJsonTest, NfcComposesAcrossTheText) {
  ASSERT_OK_AND_ASSIGN(auto qwen2,
                       BpeTokenizer::LoadTokenizerJson(FixturePath("qwen2_tokenizer.json")));
  // "e" + COMBINING ACUTE is "é" after NFC; an ill-formed byte between them blocks composition.
  EXPECT_EQ(EncodeOrDie(*qwen2, "caf\x65\xCC\x81"), EncodeOrDie(*qwen2, "caf\xC3\xA9"));
  EXPECT_NE(EncodeOrDie(*qwen2, "caf\x65\xFF\xCC\x81"), EncodeOrDie(*qwen2, "caf\xC3\xA9\xFF"));
}

TEST(TokenizerJsonTest, DecodeRejectsIdsOutsideTheVocabulary) {
  ASSERT_OK_AND_ASSIGN(auto tok,
                       BpeTokenizer::LoadTokenizerJson(FixturePath("gpt2_tokenizer.json")));
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{65, 700}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 700 at position 1")));
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{0}), IsOkAndHolds("<|endoftext|>"));
}

// Malformed or unsupported tokenizer.json files: InvalidArgument naming the file and the key.
struct BadJson {
  std::string name;
  std::function<void(Json&)> edit;
  std::vector<std::string> message_parts;
};

class MalformedTokenizerJsonTest : public ::testing::TestWithParam<BadJson> {};

TEST_P(MalformedTokenizerJsonTest, IsInvalidArgumentNamingFileAndKey) {
  const BadJson& bad = GetParam();
  Json j = Json::parse(ReadFileOrDie(FixturePath("llama3_tokenizer.json")));
  bad.edit(j);
  const std::string path = TmpPath(absl::StrCat(bad.name, ".json"));
  WriteFileOrDie(path, j.dump());
  const auto tok = LoadTokenizer(path);
  ASSERT_THAT(tok, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(tok.status().message(), HasSubstr(path));
  for (const std::string& part : bad.message_parts) {
    EXPECT_THAT(tok.status().message(), HasSubstr(part));
  }
}

std::vector<BadJson> BadJsons() {
  auto pre = [](Json& j) -> Json& { return j["pre_tokenizer"]["pretokenizers"]; };
  return {
      {"no_model", [](Json& j) { j.erase("model"); }, {"model: missing", "--vocab"}},
      {"wordpiece", [](Json& j) { j["model"]["type"] = "WordPiece"; }, {"model.type", "WordPiece"}},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout", "0.1"}},
      {"byte_fallback",
       [](Json& j) { j["model"]["byte_fallback"] = true; },
       {"model.byte_fallback"}},
      {"subword_prefix",
       [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       {"model.continuing_subword_prefix"}},
      {"ignore_merges_type",
       [](Json& j) { j["model"]["ignore_merges"] = "yes"; },
       {"model.ignore_merges", "not a boolean"}},
      {"vocab_negative",
       [](Json& j) { j["model"]["vocab"]["zz"] = -1; },
       {"model.vocab", "'zz'", "-1"}},
      {"vocab_missing_byte",
       [](Json& j) { j["model"]["vocab"].erase("Ġ"); },
       {"model.vocab", "byte 32"}},
      {"merge_three_parts",
       [](Json& j) { j["model"]["merges"][3] = "a b c"; },
       {"model.merges[3]"}},
      {"merge_unknown_symbol",
       [](Json& j) {
         j["model"]["merges"][2] = Json::array({"Ġ", "\u2603\u2603"});
       },
       {"model.merges[2]", "not in model.vocab"}},
      {"merge_not_pair", [](Json& j) { j["model"]["merges"][0] = 7; }, {"model.merges[0]"}},
      {"nfkc",
       [](Json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       {"normalizer", "NFKC"}},
      {"lowercase",
       [](Json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", Json::array({{{"type", "Lowercase"}}})}};
       },
       {"normalizer", "Sequence"}},
      {"no_pre_tokenizer", [](Json& j) { j["pre_tokenizer"] = nullptr; }, {"pre_tokenizer"}},
      {"whitespace",
       [&](Json& j) {
         pre(j)[0] = {{"type", "Whitespace"}};
       },
       {"pre_tokenizer.pretokenizers[0]", "Whitespace"}},
      {"unknown_regex",
       [&](Json& j) { pre(j)[0]["pattern"]["Regex"] = "\\p{L}+|\\s+"; },
       {"pre_tokenizer.pretokenizers[0].pattern.Regex", "not a known pattern"}},
      {"string_pattern",
       [&](Json& j) {
         pre(j)[0]["pattern"] = {{"String", " "}};
       },
       {"pre_tokenizer.pretokenizers[0].pattern"}},
      {"removed",
       [&](Json& j) { pre(j)[0]["behavior"] = "Removed"; },
       {"pre_tokenizer.pretokenizers[0].behavior", "Removed"}},
      {"inverted",
       [&](Json& j) { pre(j)[0]["invert"] = true; },
       {"pre_tokenizer.pretokenizers[0].invert"}},
      {"prefix_space",
       [&](Json& j) { pre(j)[1]["add_prefix_space"] = true; },
       {"pre_tokenizer.pretokenizers[1].add_prefix_space"}},
      {"byte_level_first",
       [&](Json& j) { std::swap(pre(j)[0], pre(j)[1]); },
       {"pre_tokenizer.pretokenizers[1]", "last"}},
      {"no_byte_level", [&](Json& j) { pre(j).erase(1); }, {"pre_tokenizer", "no ByteLevel"}},
      {"decoder",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       {"decoder"}},
      {"added_lstrip",
       [](Json& j) { j["added_tokens"][1]["lstrip"] = true; },
       {"added_tokens[1].lstrip", "<|end_of_text|>"}},
      {"added_wrong_id",
       [](Json& j) { j["added_tokens"][0]["id"] = 128000; },
       {"added_tokens[0].id", "128000", "the tokenizers library gives it 901"}},
      {"added_empty",
       [](Json& j) { j["added_tokens"][0]["content"] = ""; },
       {"added_tokens[0].content"}},
      {"template_unknown",
       [](Json& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<nope>"; },
       {"post_processor.single[0].SpecialToken.id", "<nope>"}},
  };
}

INSTANTIATE_TEST_SUITE_P(AllCases, MalformedTokenizerJsonTest, ::testing::ValuesIn(BadJsons()),
                         [](const ::testing::TestParamInfo<BadJson>& info) {
                           return info.param.name;
                         });

TEST(MalformedTokenizerJsonTest, NotJsonOrNotAnObject) {
  const std::string path = TmpPath("broken.json");
  WriteFileOrDie(path, "{\"model\": {\"vocab\": ");
  EXPECT_THAT(LoadTokenizer(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr(path), HasSubstr("not valid JSON"))));
  EXPECT_THAT(BpeTokenizer::FromTokenizerJson("[1, 2]", "'x.json'"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x.json'")));
  EXPECT_THAT(LoadTokenizer("/no/such/tokenizer.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/no/such/tokenizer.json")));
}

// ---------------------------------------------------------------------------------------------
// SentencePiece

TEST(SentencePieceTest, IdsAndDecodingMatchTheSentencepieceLibrary) {
  const Json& ref = Cases()["tokenizers"]["llama2_tokenizer.model"];
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok,
                       LoadTokenizer(FixturePath("llama2_tokenizer.model")));
  ASSERT_NE(dynamic_cast<SentencePieceTokenizer*>(tok.get()), nullptr);
  EXPECT_EQ(tok->vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok->document_token(), ref["bos_id"].get<uint32_t>());
  EXPECT_EQ(tok->TokenId("<s>"), ref["bos_id"].get<uint32_t>());
  EXPECT_EQ(tok->TokenId("<0x0A>").has_value(), true);
  EXPECT_EQ(tok->TokenId("no such piece"), std::nullopt);
  EXPECT_THAT(tok->name(), HasSubstr("byte fallback"));
  int invalid = 0;
  for (const Json& c : ref["cases"]) {
    const std::string text = Unhex(c["hex"]);
    SCOPED_TRACE(absl::StrCat(c["kind"].get<std::string>(), " ", Show(text)));
    const std::vector<uint32_t> ids = EncodeOrDie(*tok, text);
    ASSERT_THAT(ids, ElementsAreArray(Ids(c["ids"])));
    if (c.contains("decoded_hex")) {
      EXPECT_THAT(tok->Decode(ids), IsOkAndHolds(Unhex(c["decoded_hex"])));
    } else {
      ++invalid;
    }
  }
  EXPECT_GT(invalid, 0) << "cases with ill-formed UTF-8";
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>{5, 800}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 800 at position 1")));
}

TEST(SentencePieceTest, MalformedModelsAreInvalidArgumentNamingTheFile) {
  const std::string model = ReadFileOrDie(FixturePath("llama2_tokenizer.model"));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"empty.model", ""},
      {"garbage.model", std::string("\x08\x96\x01\xff\xff\xff garbage", 13)},
      {"truncated.model", model.substr(0, model.size() / 2)},
      {"text.model", "this is not a model\n"},
  };
  for (const auto& [name, bytes] : bad) {
    SCOPED_TRACE(name);
    const std::string path = TmpPath(name);
    WriteFileOrDie(path, bytes);
    EXPECT_THAT(LoadTokenizer(path), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
    EXPECT_THAT(SentencePieceTokenizer::Load(path),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  }
  EXPECT_THAT(SentencePieceTokenizer::Load("/no/such/tokenizer.model"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/no/such/tokenizer.model")));
}

}  // namespace
}  // namespace ps
