// End-to-end tests of //tools:text_to_bin: runs the built binary from the runfiles and reads its
// token files back.
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/data/load_tokenizer.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

namespace ps {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/", path);
}

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string TmpPath(const std::string& name) { return absl::StrCat(TmpDir(), "/", name); }

void WriteRawFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs text_to_bin with `args` (already shell-quoted where needed), optionally with an
// environment prefix such as "BUILD_WORKING_DIRECTORY=/x".
RunResult RunTool(const std::string& args, const std::string& env = "") {
  const std::string command = absl::StrCat(env, env.empty() ? "" : " ", "'",
                                           Runfile("tools/text_to_bin"), "' ", args, " 2>&1");
  RunResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::vector<uint16_t> Bytes(const std::string& text) {
  return std::vector<uint16_t>(reinterpret_cast<const uint8_t*>(text.data()),
                               reinterpret_cast<const uint8_t*>(text.data()) + text.size());
}

TEST(TextToBinTest, ByteLevelWritesEveryByteAsAToken) {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  std::mt19937 rng(1);
  for (int i = 0; i < 10000; ++i) text.push_back(static_cast<char>(rng()));
  WriteRawFile(TmpPath("bytes.txt"), text);
  const RunResult r =
      RunTool(absl::StrCat("--input=", TmpPath("bytes.txt"), " --output=", TmpPath("bytes.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(
      r.output,
      HasSubstr("byte tokenizer (vocabulary 256): 10256 bytes, 1 documents -> 10256 tokens"));
  EXPECT_THAT(r.output, HasSubstr("uint16 tokens, magic 20240520 version 1"));
  EXPECT_THAT(r.output, HasSubstr("tokens/s"));
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("bytes.bin")));
  EXPECT_THAT(file.tokens().u16(), ElementsAreArray(Bytes(text)));
}

TEST(TextToBinTest, SplitsTheLastFractionIntoValidation) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  WriteRawFile(TmpPath("split.txt"), text);
  const RunResult r =
      RunTool(absl::StrCat("--input=", TmpPath("split.txt"), " --output=", TmpPath("train.bin"),
                           " --val_output=", TmpPath("val.bin"), " --val_fraction=0.25"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_OK_AND_ASSIGN(TokenFile train, TokenFile::Open(TmpPath("train.bin")));
  ASSERT_OK_AND_ASSIGN(TokenFile val, TokenFile::Open(TmpPath("val.bin")));
  const std::vector<uint16_t> all = Bytes(text);
  EXPECT_THAT(train.tokens().u16(), ElementsAreArray(all.begin(), all.begin() + 750));
  EXPECT_THAT(val.tokens().u16(), ElementsAreArray(all.begin() + 750, all.end()));
  EXPECT_THAT(r.output, HasSubstr("250 validation tokens"));
  EXPECT_THAT(r.output, HasSubstr("750 training tokens"));
}

TEST(TextToBinTest, Gpt2BpeMatchesTheLibrary) {
  const std::string vocab = Runfile("trainer/data/testdata/tiny_vocab.json");
  const std::string merges = Runfile("trainer/data/testdata/tiny_merges.txt");
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text += "hello world, there's abab and abc in 123456 caf\xC3\xA9 \xE4\xB8\xAD\n\n  \t";
  }
  WriteRawFile(TmpPath("bpe.txt"), text);
  const RunResult r =
      RunTool(absl::StrCat("--input=", TmpPath("bpe.txt"), " --output=", TmpPath("bpe.bin"),
                           " --vocab=", vocab, " --merges=", merges));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("gpt2-bpe (gpt2 pre-tokenizer) tokenizer (vocabulary 292)"));
  ASSERT_OK_AND_ASSIGN(auto tok, BpeTokenizer::LoadGpt2(vocab, merges));
  // llm.c's convention: <|endoftext|> in front of the (one) document.
  std::vector<uint32_t> expected = {*tok->TokenId("<|endoftext|>")};
  ASSERT_OK(tok->Encode(text, &expected));
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("bpe.bin")));
  EXPECT_THAT(file.tokens().u16(), ElementsAreArray(expected));
  EXPECT_LT(expected.size(), text.size());  // merges happened
  EXPECT_THAT(tok->Decode(std::vector<uint32_t>(expected.begin() + 1, expected.end())),
              IsOkAndHolds(text));
}

std::vector<uint32_t> FileTokens(const TokenFile& file) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < file.tokens().size(); ++i) out.push_back(file.tokens()[i]);
  return out;
}

TEST(TextToBinTest, TokenizerJsonWithDocumentsGetsTheBosInFrontOfEach) {
  const std::string json = Runfile("trainer/data/testdata/tokenizers/llama3_tokenizer.json");
  const std::string docs[] = {"Hello world, I'M here.", "Second   document\r\nwith 12345 digits",
                              "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD emoji"};
  const std::string text = absl::StrCat(docs[0], "\n\n", docs[1], "\n\n\n\n", docs[2]);
  WriteRawFile(TmpPath("docs.txt"), text);
  const RunResult r =
      RunTool(absl::StrCat("--input=", TmpPath("docs.txt"), " --output=", TmpPath("docs.bin"),
                           " --tokenizer=", json, " --split_documents='\\n\\n'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("3 documents"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(json));
  const uint32_t bos = *tok->TokenId("<|begin_of_text|>");
  std::vector<uint32_t> expected;
  for (const std::string& doc : docs) {
    expected.push_back(bos);
    ASSERT_OK(tok->Encode(doc, &expected));
  }
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("docs.bin")));
  EXPECT_EQ(file.token_width_bytes(), 2);  // a vocabulary of 905
  EXPECT_THAT(FileTokens(file), ElementsAreArray(expected));

  // --document_token=none and a named token.
  ASSERT_EQ(RunTool(absl::StrCat("--input=", TmpPath("docs.txt"), " --output=", TmpPath("none.bin"),
                                 " --tokenizer=", json, " --document_token=none"))
                .exit_code,
            0);
  ASSERT_OK_AND_ASSIGN(TokenFile none, TokenFile::Open(TmpPath("none.bin")));
  std::vector<uint32_t> plain;
  ASSERT_OK(tok->Encode(text, &plain));
  EXPECT_THAT(FileTokens(none), ElementsAreArray(plain));
  ASSERT_EQ(RunTool(absl::StrCat("--input=", TmpPath("docs.txt"), " --output=", TmpPath("eot.bin"),
                                 " --tokenizer=", json, " --document_token='<|eot_id|>'"))
                .exit_code,
            0);
  ASSERT_OK_AND_ASSIGN(TokenFile eot, TokenFile::Open(TmpPath("eot.bin")));
  EXPECT_EQ(eot.tokens()[0], *tok->TokenId("<|eot_id|>"));
}

TEST(TextToBinTest, SentencePieceModelGetsBosPerDocument) {
  const std::string model = Runfile("trainer/data/testdata/tokenizers/llama2_tokenizer.model");
  WriteRawFile(TmpPath("sp.txt"), "one<|endoftext|>two three<|endoftext|><|endoftext|>four");
  const RunResult r =
      RunTool(absl::StrCat("--input=", TmpPath("sp.txt"), " --output=", TmpPath("sp.bin"),
                           " --tokenizer=", model, " --split_documents='<|endoftext|>'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(model));
  std::vector<uint32_t> expected;
  for (const char* doc : {"one", "two three", "four"}) {
    expected.push_back(1);  // <s>
    ASSERT_OK(tok->Encode(doc, &expected));
  }
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("sp.bin")));
  EXPECT_THAT(FileTokens(file), ElementsAreArray(expected));
}

TEST(TextToBinTest, VocabulariesAbove65536WriteUint32Files) {
  // A tokenizer.json with 70000 vocabulary entries: the bytes, filler, and "Ġab" (id 69999) that
  // merges reach; the special token comes after them (70000).
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[Gpt2ByteToUnicode()[b]] = b;
  for (int i = 256; i < 69997; ++i) vocab[absl::StrCat("filler", i)] = i;
  vocab["Ġa"] = 69997;
  vocab["ab"] = 69998;
  vocab["Ġab"] = 69999;
  nlohmann::json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({"Ġ a", nlohmann::json::array({"Ġa", "b"}), "a b"})}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", nlohmann::json::array({{{"id", 70000},
                                               {"content", "<|endoftext|>"},
                                               {"special", true},
                                               {"normalized", false}}})}};
  WriteRawFile(TmpPath("big.json"), j.dump());
  WriteRawFile(TmpPath("big.txt"), "ab ab x<|endoftext|>");
  const RunResult r =
      RunTool(absl::StrCat("--input=", TmpPath("big.txt"), " --output=", TmpPath("big.bin"),
                           " --tokenizer=", TmpPath("big.json"), " --parse_special_tokens"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("vocabulary 70001"));
  EXPECT_THAT(r.output, HasSubstr("uint32 tokens, magic 20240801 version 7"));
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("big.bin")));
  EXPECT_EQ(file.token_width_bytes(), 4);
  // <|endoftext|> (document), "ab", " ab", " x" (bytes 32 and 120: this vocabulary gives byte b
  // the id b), <|endoftext|> (parsed).
  EXPECT_THAT(file.tokens().u32(), ElementsAreArray({70000u, 69998u, 69999u, 32u, 120u, 70000u}));
}

TEST(TextToBinTest, RelativePathsAreRelativeToTheBazelRunDirectory) {
  WriteRawFile(TmpPath("relative.txt"), "relative");
  const RunResult r = RunTool("--input=relative.txt --output=relative.bin",
                              absl::StrCat("BUILD_WORKING_DIRECTORY='", TmpDir(), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("relative.bin")));
  EXPECT_EQ(file.num_tokens(), 8);
}

TEST(TextToBinTest, BadArgumentsFailWithAnExplanation) {
  WriteRawFile(TmpPath("small.txt"), "abc");
  WriteRawFile(TmpPath("bad_merges.txt"), "a b c\n");
  const std::string in = absl::StrCat("--input=", TmpPath("small.txt"));
  const std::string out = absl::StrCat(" --output=", TmpPath("never.bin"));
  const std::string vocab = Runfile("trainer/data/testdata/tiny_vocab.json");
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"", "--input is required"},
      {in, "--output is required"},
      {absl::StrCat("--input=", TmpPath("missing.txt"), out), "cannot open input"},
      {absl::StrCat(in, out, " --vocab=", vocab), "--vocab and --merges go together"},
      {absl::StrCat(in, out, " --val_output=", TmpPath("v.bin"), " --val_fraction=1.5"),
       "--val_fraction=1.5 must be in (0, 1)"},
      {absl::StrCat(in, out, " --val_output=", TmpPath("v.bin"), " --val_fraction=0.01"),
       "leaves 0 validation and 3 training tokens"},
      {absl::StrCat(in, out, " --val_output=", TmpPath("never.bin")),
       "--val_output must differ from --output"},
      {absl::StrCat(in, out, " --vocab=", vocab, " --merges=", TmpPath("bad_merges.txt")),
       "bad_merges.txt' line 1"},
      {absl::StrCat(in, " --output=", TmpPath("no/such/dir/x.bin")), "no/such/dir/x.bin"},
      {absl::StrCat(in, out, " --tokenizer=", vocab, " --vocab=", vocab, " --merges=x"),
       "give one"},
      {absl::StrCat(in, out, " --tokenizer=", vocab), "model: missing"},
      {absl::StrCat(in, out, " --tokenizer=", TmpPath("small.txt")),
       "neither a Hugging Face tokenizer.json"},
      {absl::StrCat(in, out, " --tokenizer=", TmpPath("missing.json")), "missing.json"},
      {absl::StrCat(in, out, " --parse_special_tokens"), "--parse_special_tokens"},
      {absl::StrCat(in, out, " --document_token=nope"), "--document_token='nope'"},
      {absl::StrCat(in, out, " --split_documents='\\x'"), "--split_documents"},
  };
  for (const Case& c : cases) {
    const RunResult r = RunTool(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.output, HasSubstr("text_to_bin: ")) << c.args;
  }
  EXPECT_THAT(TokenFile::Open(TmpPath("never.bin")), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ps
