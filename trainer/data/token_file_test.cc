#include "trainer/data/token_file.h"

#include <dirent.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void WriteRawFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadRawFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A header followed by `payload`, built by hand (independently of WriteTokenFile).
std::string RawTokenFile(int32_t magic, int32_t version, int32_t count,
                         const std::string& payload) {
  std::string bytes(1024, '\0');
  std::memcpy(bytes.data(), &magic, 4);
  std::memcpy(bytes.data() + 4, &version, 4);
  std::memcpy(bytes.data() + 8, &count, 4);
  return bytes + payload;
}

std::string TokenBytes(const std::vector<uint16_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
}

std::string TokenBytes32(const std::vector<uint32_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

TEST(TokenFileTest, RoundTripsRandomSizes) {
  std::mt19937_64 rng(1);
  for (const size_t n :
       {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{511}, size_t{4097}, size_t{100003}}) {
    std::vector<uint16_t> tokens(n);
    uint16_t max = 0;
    for (auto& t : tokens) {
      t = static_cast<uint16_t>(rng());
      max = std::max(max, t);
    }
    const std::string path = TmpPath(absl::StrCat("round_trip_", n, ".bin"));
    ASSERT_OK(WriteTokenFile(path, tokens));
    // The bytes are exactly the format: header, then the tokens little-endian.
    EXPECT_EQ(ReadRawFile(path),
              RawTokenFile(20240520, 1, static_cast<int32_t>(n), TokenBytes(tokens)));
    ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(path));
    EXPECT_EQ(file.path(), path);
    EXPECT_EQ(file.num_tokens(), static_cast<int64_t>(n));
    EXPECT_EQ(file.token_width_bytes(), 2);
    EXPECT_THAT(file.tokens().u16(), ElementsAreArray(tokens));
    EXPECT_EQ(file.max_token(), max);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(file.tokens().u16().data()) % alignof(uint16_t), 0u);
  }
}

TEST(TokenFileTest, RoundTripsRandomSizesOfUint32Tokens) {
  std::mt19937_64 rng(2);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4097}, size_t{100003}}) {
    std::vector<uint32_t> tokens(n);
    uint32_t max = 0;
    for (auto& t : tokens) {
      t = static_cast<uint32_t>(rng() % 200000);  // Llama-3-sized ids, above 65535
      max = std::max(max, t);
    }
    const std::string path = TmpPath(absl::StrCat("round_trip32_", n, ".bin"));
    ASSERT_OK(WriteTokenFile(path, tokens));
    // llm.c's "llama-3" variant: magic 20240801, version 7, uint32 tokens.
    EXPECT_EQ(ReadRawFile(path),
              RawTokenFile(20240801, 7, static_cast<int32_t>(n), TokenBytes32(tokens)));
    ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(path));
    EXPECT_EQ(file.token_width_bytes(), 4);
    EXPECT_EQ(file.num_tokens(), static_cast<int64_t>(n));
    EXPECT_THAT(file.tokens().u32(), ElementsAreArray(tokens));
    for (size_t i = 0; i < std::min<size_t>(n, 100); ++i) EXPECT_EQ(file.tokens()[i], tokens[i]);
    EXPECT_EQ(file.max_token(), max);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(file.tokens().u32().data()) % alignof(uint32_t), 0u);
  }
}

TEST(TokenFileTest, ReadsALlama3FileWrittenByHandLikeLlmc) {
  const std::string path = TmpPath("by_hand32.bin");
  WriteRawFile(path, RawTokenFile(20240801, 7, 3, TokenBytes32({128000, 9906, 128001})));
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(path));
  EXPECT_THAT(file.tokens().u32(), ElementsAreArray({128000, 9906, 128001}));
  EXPECT_EQ(file.max_token(), 128001u);
}

TEST(TokenFileTest, CheckVocabSizeNamesTheFileAndTheFirstOffendingPosition) {
  const std::string path16 = TmpPath("vocab16.bin");
  std::vector<uint16_t> narrow(5000, 7);
  narrow[1234] = 300;
  narrow[4000] = 60000;
  ASSERT_OK(WriteTokenFile(path16, narrow));
  ASSERT_OK_AND_ASSIGN(TokenFile f16, TokenFile::Open(path16));
  EXPECT_OK(f16.CheckVocabSize(60001));
  EXPECT_THAT(f16.CheckVocabSize(60000),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path16), HasSubstr("token 60000 at position 4000"),
                             HasSubstr("vocabulary size 60000"))));
  EXPECT_THAT(f16.CheckVocabSize(256), StatusIs(absl::StatusCode::kInvalidArgument,
                                                AllOf(HasSubstr("token 300 at position 1234"),
                                                      HasSubstr("largest token is 60000"))));

  const std::string path32 = TmpPath("vocab32.bin");
  std::vector<uint32_t> wide(3000, 5);
  wide[2999] = 128255;
  ASSERT_OK(WriteTokenFile(path32, wide));
  ASSERT_OK_AND_ASSIGN(TokenFile f32, TokenFile::Open(path32));
  EXPECT_OK(f32.CheckVocabSize(128256));
  EXPECT_THAT(f32.CheckVocabSize(128000),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path32), HasSubstr("token 128255 at position 2999"))));
}

TEST(TokenFileTest, ReadsAFileWrittenByHandLikeLlmc) {
  const std::string path = TmpPath("by_hand.bin");
  WriteRawFile(path, RawTokenFile(20240520, 1, 3, TokenBytes({50256, 15496, 11})));
  ASSERT_OK_AND_ASSIGN(TokenFile file, TokenFile::Open(path));
  EXPECT_THAT(file.tokens().u16(), ElementsAreArray({50256, 15496, 11}));
  EXPECT_EQ(file.max_token(), 50256u);
}

TEST(TokenFileTest, MoveKeepsTheMapping) {
  const std::string path = TmpPath("move.bin");
  ASSERT_OK(WriteTokenFile(path, std::vector<uint16_t>{1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(TokenFile a, TokenFile::Open(path));
  TokenFile b = std::move(a);
  EXPECT_THAT(b.tokens().u16(), ElementsAreArray({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(TokenFile c, TokenFile::Open(path));
  c = std::move(b);
  EXPECT_THAT(c.tokens().u16(), ElementsAreArray({1, 2, 3}));
  EXPECT_EQ(c.max_token(), 3u);
}

TEST(TokenFileTest, WriteReplacesAtomicallyAndLeavesNoTemporaries) {
  const std::string dir = TmpPath("atomic_dir");
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p '", dir, "'").c_str()), 0);
  const std::string path = dir + "/data.bin";
  ASSERT_OK(WriteTokenFile(path, std::vector<uint16_t>(1000, 7)));
  // Keep the old file open (mapped) while it is replaced: the mapping still sees the old data.
  ASSERT_OK_AND_ASSIGN(TokenFile old_file, TokenFile::Open(path));
  ASSERT_OK(WriteTokenFile(path, std::vector<uint16_t>{9, 9}));
  EXPECT_EQ(old_file.num_tokens(), 1000);
  EXPECT_EQ(old_file.tokens()[999], 7u);
  ASSERT_OK_AND_ASSIGN(TokenFile new_file, TokenFile::Open(path));
  EXPECT_THAT(new_file.tokens().u16(), ElementsAreArray({9, 9}));
  EXPECT_THAT(FilesIn(dir), ElementsAreArray({"data.bin"}));
}

TEST(TokenFileTest, WriteIntoAMissingDirectoryFailsNamingThePath) {
  const std::string path = TmpPath("no/such/dir/x.bin");
  EXPECT_THAT(WriteTokenFile(path, std::vector<uint16_t>{1}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(TokenFileTest, WriteRejectsMoreThanInt32MaxTokens) {
  // The size check comes before any byte is read, so a span that merely claims to be that long
  // is enough (nothing behind it is touched).
  const uint16_t one = 1;
  const auto huge = absl::MakeConstSpan(&one, size_t{INT32_MAX} + 1);
  const std::string path = TmpPath("huge.bin");
  EXPECT_THAT(
      WriteTokenFile(path, huge),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(path), HasSubstr("2147483648 tokens"), HasSubstr("2147483647"))));
  EXPECT_EQ(ReadRawFile(path), "");  // nothing was created
}

TEST(TokenFileTest, MissingFileIsNotFound) {
  const std::string path = TmpPath("does_not_exist.bin");
  EXPECT_THAT(TokenFile::Open(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(TokenFileTest, DirectoryIsRejected) {
  const std::string path = TmpPath("");
  EXPECT_THAT(TokenFile::Open(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

struct BadFile {
  std::string name;
  std::string bytes;
  std::vector<std::string> message_parts;
};

class MalformedTokenFileTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(MalformedTokenFileTest, IsDataLossNamingThePathAndTheProblem) {
  const BadFile& bad = GetParam();
  const std::string path = TmpPath(bad.name + ".bin");
  WriteRawFile(path, bad.bytes);
  const absl::StatusOr<TokenFile> file = TokenFile::Open(path);
  ASSERT_THAT(file, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  for (const std::string& part : bad.message_parts) {
    EXPECT_THAT(file.status().message(), HasSubstr(part));
  }
}

std::vector<BadFile> BadFiles() {
  const std::string three = TokenBytes({1, 2, 3});
  std::string text;
  for (int i = 0; i < 100; ++i) text += "It was the best of times, it was the worst of times.\n";
  return {
      {"empty", "", {"empty (0 bytes)"}},
      {"short_binary", std::string(10, '\x01'), {"10 bytes", "shorter than the 1024-byte header"}},
      {"short_text",
       "hello world\n",
       {"shorter than the 1024-byte header", "text file", "text_to_bin"}},
      {"long_text", text, {"bad magic number", "expected 20240520", "or 20240801", "text file"}},
      {"header_only_truncated",
       RawTokenFile(20240520, 1, 0, "").substr(0, 1023),
       {"1023 bytes", "shorter than the 1024-byte header"}},
      {"wide_magic_version1",
       RawTokenFile(20240801, 1, 1, std::string(4, '\0')),
       {"unsupported version 1 for magic 20240801", "version 7"}},
      {"narrow_magic_version7",
       RawTokenFile(20240520, 7, 3, TokenBytes32({1, 2, 3})),
       {"unsupported version 7 for magic 20240520", "version 1"}},
      {"uint16_payload_in_uint32_file",
       RawTokenFile(20240801, 7, 3, three),
       {"says uint32 tokens", "3 tokens of 2 bytes", "other token width"}},
      {"uint32_payload_in_uint16_file",
       RawTokenFile(20240520, 1, 3, TokenBytes32({1, 2, 3})),
       {"says uint16 tokens", "3 tokens of 4 bytes", "other token width"}},
      {"truncated_uint32",
       RawTokenFile(20240801, 7, 3, TokenBytes32({1, 2, 3}).substr(0, 10)),
       {"truncated", "3 uint32 tokens (12 bytes", "only 10 bytes"}},
      {"model_checkpoint", RawTokenFile(20240326, 3, 0, ""), {"model checkpoint"}},
      {"random_magic", RawTokenFile(12345, 1, 0, ""), {"bad magic number 12345"}},
      {"version2", RawTokenFile(20240520, 2, 3, three), {"unsupported version 2"}},
      {"version0", RawTokenFile(20240520, 0, 3, three), {"unsupported version 0"}},
      {"negative_count", RawTokenFile(20240520, 1, -5, ""), {"negative", "-5"}},
      {"truncated_token",
       RawTokenFile(20240520, 1, 4, three),
       {"truncated", "declares 4 uint16 tokens (8 bytes", "only 6 bytes", "(3 tokens)"}},
      {"truncated_byte",
       RawTokenFile(20240520, 1, 3, three.substr(0, 5)),
       {"truncated", "only 5 bytes"}},
      {"trailing_byte",
       RawTokenFile(20240520, 1, 3, three + "x"),
       {"1 trailing bytes", "3 tokens"}},
      {"trailing_tokens", RawTokenFile(20240520, 1, 2, three), {"2 trailing bytes", "2 tokens"}},
      {"count_overflowing_the_file",
       RawTokenFile(20240520, 1, INT32_MAX, three),
       {"truncated", "2147483647 uint16 tokens"}},
  };
}

INSTANTIATE_TEST_SUITE_P(AllCases, MalformedTokenFileTest, ::testing::ValuesIn(BadFiles()),
                         [](const ::testing::TestParamInfo<BadFile>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace ps
