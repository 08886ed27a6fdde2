#include "trainer/data/example_file.h"

#include <dirent.h>
#include <sys/stat.h>

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
#include "trainer/data/token_file.h"

namespace ps {
namespace {

using ::testing::AllOf;
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

// Owned examples, tokens kept as uint32 (converted to the view's width on demand).
struct Examples {
  std::vector<uint32_t> tokens;
  std::vector<int64_t> starts = {0};
  std::vector<uint8_t> trained;
};

// Random examples: `count` examples of 1..max_len tokens below `vocab`; trained flags random
// except 0 at every example's first token.
Examples RandomExamples(std::mt19937_64& rng, int64_t count, int64_t max_len, uint32_t vocab) {
  Examples ex;
  for (int64_t e = 0; e < count; ++e) {
    const int64_t len = std::uniform_int_distribution<int64_t>(1, max_len)(rng);
    for (int64_t k = 0; k < len; ++k) {
      ex.tokens.push_back(std::uniform_int_distribution<uint32_t>(0, vocab - 1)(rng));
      ex.trained.push_back(k == 0 ? 0 : static_cast<uint8_t>(rng() & 1));
    }
    ex.starts.push_back(static_cast<int64_t>(ex.tokens.size()));
  }
  return ex;
}

ExamplesView View32(const Examples& ex) {
  return ExamplesView{absl::MakeConstSpan(ex.tokens), ex.starts, ex.trained};
}

// The file's bytes built by hand from the format's description, independently of the writer.
std::string RawExampleFile(const Examples& ex, int32_t width) {
  const int64_t n = static_cast<int64_t>(ex.tokens.size());
  const int64_t e = static_cast<int64_t>(ex.starts.size()) - 1;
  std::string bytes(1024, '\0');
  const int32_t words[8] = {kExampleFileMagic,
                            1,
                            width,
                            0,
                            static_cast<int32_t>(n & 0xffffffff),
                            static_cast<int32_t>(n >> 32),
                            static_cast<int32_t>(e & 0xffffffff),
                            static_cast<int32_t>(e >> 32)};
  std::memcpy(bytes.data(), words, sizeof(words));
  for (const uint32_t t : ex.tokens) {
    if (width == 2) {
      const auto v = static_cast<uint16_t>(t);
      bytes.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      bytes.append(reinterpret_cast<const char*>(&t), 4);
    }
  }
  while (bytes.size() % 8 != 0) bytes.push_back('\0');
  bytes.append(reinterpret_cast<const char*>(ex.starts.data()), ex.starts.size() * 8);
  bytes.append(reinterpret_cast<const char*>(ex.trained.data()), ex.trained.size());
  return bytes;
}

void ExpectViewEquals(const ExamplesView& view, const Examples& ex) {
  ASSERT_EQ(view.tokens.size(), ex.tokens.size());
  for (size_t i = 0; i < ex.tokens.size(); ++i) ASSERT_EQ(view.tokens[i], ex.tokens[i]) << i;
  EXPECT_EQ(std::vector<int64_t>(view.starts.begin(), view.starts.end()), ex.starts);
  EXPECT_EQ(std::vector<uint8_t>(view.trained.begin(), view.trained.end()), ex.trained);
}

TEST(ExampleFileTest, RoundTripsBothWidthsOnRandomExamples) {
  std::mt19937_64 rng(7);
  int case_index = 0;
  for (const int64_t count : {0, 1, 2, 3, 17, 250}) {
    for (const uint32_t vocab : {1u, 7u, 65536u, 70000u, 4000000000u}) {
      for (const bool force4 : {false, true}) {
        const Examples ex = RandomExamples(rng, count, count > 100 ? 40 : 9, vocab);
        uint32_t max = 0;
        for (const uint32_t t : ex.tokens) max = std::max(max, t);
        const int32_t width = force4 || max >= 65536 ? 4 : 2;
        const std::string path = TmpPath(absl::StrCat("rt", case_index++, ".bin"));
        // Write from a uint32 view, and (when the tokens fit) from a uint16 view too.
        ASSERT_OK(WriteExampleFile(path, View32(ex), force4));
        EXPECT_EQ(ReadRawFile(path), RawExampleFile(ex, width)) << count << " " << vocab;
        if (max < 65536) {
          std::vector<uint16_t> narrow(ex.tokens.begin(), ex.tokens.end());
          ASSERT_OK(WriteExampleFile(
              path, ExamplesView{absl::MakeConstSpan(narrow), ex.starts, ex.trained}, force4));
          EXPECT_EQ(ReadRawFile(path), RawExampleFile(ex, width));
        }
        absl::StatusOr<ExampleFile> file = ExampleFile::Open(path);
        ASSERT_OK(file);
        EXPECT_EQ(file->path(), path);
        EXPECT_EQ(file->token_width_bytes(), width);
        EXPECT_EQ(file->num_tokens(), static_cast<int64_t>(ex.tokens.size()));
        EXPECT_EQ(file->num_examples(), count);
        EXPECT_EQ(file->max_token(), max);
        ExpectViewEquals(file->view(), ex);
        EXPECT_OK(ValidateExamples(file->view()));
        // Moving keeps the mapping.
        ExampleFile moved = *std::move(file);
        ExpectViewEquals(moved.view(), ex);
      }
    }
  }
}

TEST(ExampleFileTest, ReadsAHandBuiltFileWithEveryPaddingLength) {
  // N = 1..8 uint16 tokens puts the starts after 0..6 padding bytes.
  for (int n = 1; n <= 8; ++n) {
    Examples ex;
    for (int i = 0; i < n; ++i) {
      ex.tokens.push_back(static_cast<uint32_t>(1000 + i));
      ex.trained.push_back(i == 0 || i == 3 ? 0 : 1);
    }
    if (n > 3) ex.starts.push_back(3);
    ex.starts.push_back(n);
    const std::string path = TmpPath(absl::StrCat("pad", n, ".bin"));
    WriteRawFile(path, RawExampleFile(ex, 2));
    absl::StatusOr<ExampleFile> file = ExampleFile::Open(path);
    ASSERT_OK(file);
    ExpectViewEquals(file->view(), ex);
  }
}

Examples SmallExamples() {
  Examples ex;
  ex.tokens = {5, 6, 7, 8, 9, 10, 11};
  ex.starts = {0, 3, 4, 7};
  ex.trained = {0, 1, 1, 0, 0, 0, 1};
  return ex;
}

TEST(ExampleFileTest, RefusesEveryTruncation) {
  for (const int32_t width : {2, 4}) {
    const std::string bytes = RawExampleFile(SmallExamples(), width);
    const std::string path = TmpPath("trunc.bin");
    for (size_t size = 0; size < bytes.size(); ++size) {
      WriteRawFile(path, bytes.substr(0, size));
      const absl::StatusOr<ExampleFile> file = ExampleFile::Open(path);
      const std::string why = size < 1024 ? "shorter than the 1024-byte header" : "truncated";
      EXPECT_THAT(file, StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr(why))))
          << "size " << size;
    }
  }
}

TEST(ExampleFileTest, RefusesTrailingBytes) {
  const std::string bytes = RawExampleFile(SmallExamples(), 2);
  const std::string path = TmpPath("trail.bin");
  for (const size_t extra : {1, 7, 8, 4096}) {
    WriteRawFile(path, bytes + std::string(extra, '\x01'));
    EXPECT_THAT(ExampleFile::Open(path),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(path), HasSubstr(absl::StrCat(extra, " trailing bytes")))));
  }
}

// Writes `bytes` with int32 word `word` replaced by `value` and opens it.
absl::Status OpenWithWord(std::string bytes, size_t word, int32_t value, const std::string& path) {
  std::memcpy(bytes.data() + 4 * word, &value, 4);
  WriteRawFile(path, bytes);
  return ExampleFile::Open(path).status();
}

TEST(ExampleFileTest, RefusesBadHeaders) {
  const std::string bytes = RawExampleFile(SmallExamples(), 2);
  const std::string path = TmpPath("header.bin");
  auto data_loss = [&](absl::string_view what) {
    return StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr(what)));
  };
  EXPECT_THAT(OpenWithWord(bytes, 0, 20240520, path), data_loss("llm.c token file"));
  EXPECT_THAT(OpenWithWord(bytes, 0, 20240801, path), data_loss("llm.c token file"));
  EXPECT_THAT(OpenWithWord(bytes, 0, 20240326, path), data_loss("model checkpoint"));
  EXPECT_THAT(OpenWithWord(bytes, 0, 12345, path), data_loss("bad magic number 12345"));
  EXPECT_THAT(OpenWithWord(bytes, 1, 2, path), data_loss("unsupported version 2"));
  EXPECT_THAT(OpenWithWord(bytes, 2, 3, path), data_loss("token width is 3 bytes"));
  EXPECT_THAT(OpenWithWord(bytes, 2, 1, path), data_loss("token width is 1 bytes"));
  // Width 4 over a width-2 payload: the sizes no longer match.
  EXPECT_THAT(OpenWithWord(bytes, 2, 4, path), data_loss("truncated"));
  EXPECT_THAT(OpenWithWord(bytes, 3, 1, path), data_loss("header word 3 is 1"));
  EXPECT_THAT(OpenWithWord(bytes, 255, -1, path), data_loss("header word 255 is -1"));
  EXPECT_THAT(OpenWithWord(bytes, 5, -1, path), data_loss("negative"));
  EXPECT_THAT(OpenWithWord(bytes, 7, -1, path), data_loss("negative"));
  // Huge counts are a truncation, not an overflow.
  EXPECT_THAT(OpenWithWord(bytes, 5, 0x7fffffff, path), data_loss("truncated"));
  EXPECT_THAT(OpenWithWord(bytes, 7, 0x1fffffff, path), data_loss("truncated"));
  WriteRawFile(path, std::string("{\"messages\": []}\n"));
  EXPECT_THAT(ExampleFile::Open(path).status(), data_loss("looks like a text file"));
  std::string text(2048, 'a');
  WriteRawFile(path, text);
  EXPECT_THAT(ExampleFile::Open(path).status(), data_loss("looks like a text file"));
}

// Opens a hand-built file with the given (possibly broken) examples.
absl::Status OpenRaw(const Examples& ex, const std::string& path) {
  WriteRawFile(path, RawExampleFile(ex, 2));
  return ExampleFile::Open(path).status();
}

// Each broken invariant: the reader refuses with DataLoss, the validator and writer with
// InvalidArgument, each naming the rule.
TEST(ExampleFileTest, RefusesBrokenInvariantsEverywhere) {
  struct Case {
    std::string name;
    Examples ex;
    std::string what;
  };
  std::vector<Case> cases;
  {
    Examples ex = SmallExamples();
    ex.starts[0] = 1;
    ex.starts = {1, 3, 4, 7};
    cases.push_back({"first start", ex, "starts[0] = 1"});
  }
  {
    Examples ex = SmallExamples();
    ex.starts = {0, 4, 3, 7};
    cases.push_back({"decreasing", ex, "not strictly increasing: starts[2] = 3 <= starts[1] = 4"});
  }
  {
    Examples ex = SmallExamples();
    ex.starts = {0, 3, 3, 7};
    cases.push_back({"empty example", ex, "example 1 would be empty"});
  }
  {
    Examples ex = SmallExamples();
    ex.starts = {0, 3, 4, 6};
    cases.push_back({"last short", ex, "starts[E] = starts[3] = 6 but there are N = 7 tokens"});
  }
  {
    Examples ex = SmallExamples();
    ex.starts = {0, 3, 40, 100, 7};
    cases.push_back({"beyond then back", ex, "not strictly increasing"});
  }
  {
    Examples ex = SmallExamples();
    ex.trained[5] = 2;
    cases.push_back({"flag 2", ex, "token 5 (example 2, position 1) is 2"});
  }
  {
    Examples ex = SmallExamples();
    ex.trained[6] = 255;
    cases.push_back({"flag 255", ex, "is 255"});
  }
  {
    Examples ex = SmallExamples();
    ex.trained[3] = 1;
    cases.push_back({"trained start", ex, "first token of example 1 (token 3) is marked trained"});
  }
  {
    Examples ex = SmallExamples();
    ex.trained[0] = 1;
    cases.push_back({"trained first", ex, "first token of example 0"});
  }
  const std::string path = TmpPath("broken.bin");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(OpenRaw(c.ex, path),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr(c.what))));
    EXPECT_THAT(ValidateExamples(View32(c.ex)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.what)));
    const std::string out = TmpPath("never_written.bin");
    EXPECT_THAT(WriteExampleFile(out, View32(c.ex)),
                StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(out), HasSubstr(c.what))));
    struct stat st;
    EXPECT_NE(::stat(out.c_str(), &st), 0) << "a refused write left a file";
  }
  // Views that cannot even be laid out.
  Examples ex = SmallExamples();
  ex.starts.clear();
  EXPECT_THAT(ValidateExamples(View32(ex)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("starts is empty")));
  ex = SmallExamples();
  ex.trained.pop_back();
  EXPECT_THAT(ValidateExamples(View32(ex)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("6 trained flags for 7")));
}

TEST(ExampleFileTest, RandomCorruptionsOfStartsAreRefused) {
  std::mt19937_64 rng(11);
  const std::string path = TmpPath("rand_broken.bin");
  for (int trial = 0; trial < 200; ++trial) {
    Examples ex = RandomExamples(rng, 2 + trial % 20, 12, 500);
    const size_t e = std::uniform_int_distribution<size_t>(0, ex.starts.size() - 1)(rng);
    const int64_t delta = std::uniform_int_distribution<int64_t>(-20, 20)(rng);
    if (delta == 0) continue;
    ex.starts[e] += delta;
    // Any change of one start breaks an invariant: starts[0] or starts[E], or the trained flag of
    // a new first token (made 0 here so the starts themselves must be refused), or monotonicity.
    for (size_t k = 0; k + 1 < ex.starts.size(); ++k) {
      if (ex.starts[k] >= 0 && ex.starts[k] < static_cast<int64_t>(ex.trained.size())) {
        ex.trained[static_cast<size_t>(ex.starts[k])] = 0;
      }
    }
    const bool valid_shape = e != 0 && e + 1 != ex.starts.size() &&
                             ex.starts[e] > ex.starts[e - 1] && ex.starts[e] < ex.starts[e + 1];
    const absl::Status status = OpenRaw(ex, path);
    if (valid_shape) {
      // Moving an inner start within its neighbours is a different valid file.
      EXPECT_OK(status);
    } else {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("starts")));
    }
  }
}

TEST(ExampleFileTest, MissingAndNonRegularFiles) {
  EXPECT_THAT(ExampleFile::Open(TmpPath("does_not_exist.bin")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does_not_exist.bin")));
  EXPECT_THAT(ExampleFile::Open(TmpPath("")), StatusIs(absl::StatusCode::kInvalidArgument,
                                                       HasSubstr("not a regular file")));
  EXPECT_THAT(SniffDataFile(TmpPath("does_not_exist.bin")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does_not_exist.bin")));
}

TEST(ExampleFileTest, CheckVocabSizeNamesTheExample) {
  Examples ex = SmallExamples();
  ex.tokens[5] = 900;
  const std::string path = TmpPath("vocab.bin");
  ASSERT_OK(WriteExampleFile(path, View32(ex)));
  absl::StatusOr<ExampleFile> file = ExampleFile::Open(path);
  ASSERT_OK(file);
  EXPECT_EQ(file->max_token(), 900u);
  EXPECT_OK(file->CheckVocabSize(901));
  EXPECT_THAT(file->CheckVocabSize(900),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("token 900 at position 1 of example 2"),
                             HasSubstr("vocabulary size 900"))));
  EXPECT_THAT(file->CheckVocabSize(9), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("token 9 at position 0 of example 2")));
}

TEST(ExampleFileTest, WriteIsAtomicAndLeavesNoTemporaries) {
  const std::string dir = TmpPath("atomic_dir");
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/data.bin";
  const Examples ex = SmallExamples();
  ASSERT_OK(WriteExampleFile(path, View32(ex)));
  const std::string before = ReadRawFile(path);
  Examples broken = ex;
  broken.trained[0] = 1;
  EXPECT_FALSE(WriteExampleFile(path, View32(broken)).ok());
  EXPECT_EQ(ReadRawFile(path), before);
  EXPECT_THAT(FilesIn(dir), ::testing::ElementsAre("data.bin"));
  // A directory that does not exist: an error naming the path.
  EXPECT_THAT(WriteExampleFile(TmpPath("no_such_dir/x.bin"), View32(ex)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such_dir")));
}

TEST(ExampleFileTest, SniffsBothKinds) {
  const std::string tokens16 = TmpPath("sniff16.bin");
  const std::string tokens32 = TmpPath("sniff32.bin");
  const std::string examples = TmpPath("sniffex.bin");
  ASSERT_OK(WriteTokenFile(tokens16, std::vector<uint16_t>{1, 2, 3}));
  ASSERT_OK(WriteTokenFile(tokens32, std::vector<uint32_t>{1, 2, 3}));
  ASSERT_OK(WriteExampleFile(examples, View32(SmallExamples())));
  EXPECT_THAT(SniffDataFile(tokens16), IsOkAndHolds(DataFileKind::kLlmcTokens));
  EXPECT_THAT(SniffDataFile(tokens32), IsOkAndHolds(DataFileKind::kLlmcTokens));
  EXPECT_THAT(SniffDataFile(examples), IsOkAndHolds(DataFileKind::kExamples));

  const std::string other = TmpPath("sniff_other.bin");
  WriteRawFile(other, std::string("\x39\x30\x00\x00\x01\x00\x00\x00", 8));  // 12345
  EXPECT_THAT(SniffDataFile(other),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(other), HasSubstr("magic number 12345"))));
  WriteRawFile(other, "{\"text\": \"hello\"}\n");
  EXPECT_THAT(SniffDataFile(other), StatusIs(absl::StatusCode::kDataLoss,
                                             HasSubstr("looks like a text file")));
  WriteRawFile(other, "abc");
  EXPECT_THAT(SniffDataFile(other),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(other), HasSubstr("3 bytes"))));
  WriteRawFile(other, "");
  EXPECT_THAT(SniffDataFile(other), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("0 bytes")));
  EXPECT_THAT(SniffDataFile(TmpPath("")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

}  // namespace
}  // namespace ps
