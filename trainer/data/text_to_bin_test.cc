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
  EXPECT_THAT(r.output, HasSubstr("byte tokenizer (vocabulary 256): 10256 bytes -> 10256 tokens"));
  EXPECT_THAT(r.output, HasSubstr("tokens/s"));
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("bytes.bin")));
  EXPECT_THAT(file.tokens(), ElementsAreArray(Bytes(text)));
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
  EXPECT_THAT(train.tokens(), ElementsAreArray(all.begin(), all.begin() + 750));
  EXPECT_THAT(val.tokens(), ElementsAreArray(all.begin() + 750, all.end()));
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
  EXPECT_THAT(r.output, HasSubstr("gpt2-bpe tokenizer (vocabulary 292)"));
  ASSERT_OK_AND_ASSIGN(auto tok, Gpt2BpeTokenizer::Load(vocab, merges));
  std::vector<uint16_t> expected;
  tok->Encode(text, &expected);
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(TmpPath("bpe.bin")));
  EXPECT_THAT(file.tokens(), ElementsAreArray(expected));
  EXPECT_LT(expected.size(), text.size());  // merges happened
  EXPECT_THAT(tok->Decode(file.tokens()), IsOkAndHolds(text));
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
