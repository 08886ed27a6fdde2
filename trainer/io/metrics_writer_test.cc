#include "trainer/io/metrics_writer.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string TmpPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/metrics_writer_test_", name, "_", ::getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Every line of the file parsed strictly; fails the test on a line that is not a JSON object or
// on a missing final newline.
std::vector<nlohmann::json> ReadLines(const std::string& path) {
  const std::string text = ReadFile(path);
  std::vector<nlohmann::json> out;
  if (text.empty()) return out;
  EXPECT_EQ(text.back(), '\n');
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text).substr(0, text.size() - 1), '\n')) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(!j.is_discarded() && j.is_object()) << "bad line: " << line;
    out.push_back(std::move(j));
  }
  return out;
}

TEST(MetricsWriterTest, EachLineIsInTheFileWhenWriteReturns) {
  const std::string path = TmpPath("lines");
  WriteRaw(path, "{\"old\":1}\n");
  ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kTruncate));
  EXPECT_EQ(ReadFile(path), "");  // truncated
  for (int step = 0; step < 5; ++step) {
    ASSERT_OK(metrics->Write({{"step", step}, {"loss", 10.0 / (step + 1)}, {"phase", "train"}}));
    const std::vector<nlohmann::json> lines = ReadLines(path);  // no Close, no Sync
    ASSERT_EQ(lines.size(), static_cast<size_t>(step + 1));
    EXPECT_EQ(lines.back()["step"], step);
    EXPECT_EQ(lines.back()["loss"], 10.0 / (step + 1));  // exact round trip
  }
  EXPECT_EQ(metrics->lines_written(), 5);
  ASSERT_OK(metrics->Sync());
  ASSERT_OK(metrics->Close());
  ASSERT_OK(metrics->Close());
  EXPECT_THAT(metrics->Write({{"step", 5}}), StatusIs(absl::StatusCode::kFailedPrecondition, path));
  EXPECT_THAT(metrics->Sync(), StatusIs(absl::StatusCode::kFailedPrecondition, path));
}

TEST(MetricsWriterTest, AppendKeepsExistingLinesAndCreatesMissingFiles) {
  const std::string path = TmpPath("append");
  {
    ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kAppend));
    ASSERT_OK(metrics->Write({{"step", 1}}));
    ASSERT_OK(metrics->Write({{"step", 2}}));
  }
  {
    ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kAppend));
    ASSERT_OK(metrics->Write({{"step", 3}}));
  }
  const std::vector<nlohmann::json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lines[i]["step"], i + 1);
}

// A crash mid-line leaves an unterminated last line; append mode removes it, whatever its length
// (within one read block, across blocks, or the whole file).
TEST(MetricsWriterTest, AppendCutsATornLastLine) {
  const std::string path = TmpPath("torn");
  const std::string good = "{\"step\":1}\n{\"step\":2}\n";
  for (const std::string& torn :
       {std::string("{\"step\":3,\"lo"), std::string(100000, 'x'), std::string("{")}) {
    for (bool with_good_prefix : {true, false}) {
      SCOPED_TRACE(absl::StrCat(torn.size(), " torn bytes, prefix ", with_good_prefix));
      WriteRaw(path, (with_good_prefix ? good : "") + torn);
      ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kAppend));
      ASSERT_OK(metrics->Write({{"step", 3}}));
      ASSERT_OK(metrics->Close());
      EXPECT_EQ(ReadFile(path), (with_good_prefix ? good : "") + "{\"step\":3}\n");
    }
  }
  // A long good line before the torn one, crossing the 64 KiB read block.
  const std::string long_line = "{\"s\":\"" + std::string(70000, 'y') + "\"}\n";
  WriteRaw(path, long_line + std::string(70000, 'z'));
  ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kAppend));
  ASSERT_OK(metrics->Write({{"step", 4}}));
  EXPECT_EQ(ReadFile(path), long_line + "{\"step\":4}\n");
}

TEST(MetricsWriterTest, RejectsNonObjectsAndSanitizesValues) {
  const std::string path = TmpPath("values");
  ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kTruncate));
  for (const nlohmann::json& bad :
       {nlohmann::json(1), nlohmann::json("s"), nlohmann::json::array({1, 2}), nlohmann::json()}) {
    EXPECT_THAT(metrics->Write(bad), StatusIs(absl::StatusCode::kInvalidArgument, "JSON object"));
  }
  ASSERT_OK(metrics->Write({{"name", "bad \xFF utf8 \xC3"},
                            {"nan", std::nan("")},
                            {"inf", std::numeric_limits<double>::infinity()},
                            {"nested", {{"a", {1, 2, 3}}}},
                            {"ctl", std::string("a\nb\0c", 5)}}));
  const std::vector<nlohmann::json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["name"], "bad \xEF\xBF\xBD utf8 \xEF\xBF\xBD");
  EXPECT_TRUE(lines[0]["nan"].is_null());
  EXPECT_TRUE(lines[0]["inf"].is_null());
  EXPECT_EQ(lines[0]["nested"]["a"][2], 3);
  EXPECT_EQ(lines[0]["ctl"], std::string("a\nb\0c", 5));
  EXPECT_EQ(metrics->lines_written(), 1);
}

TEST(MetricsWriterTest, IoErrorsAreStatusesNamingTheFile) {
  EXPECT_THAT(MetricsWriter::Open("/nonexistent-dir-for-metrics/m.jsonl", MetricsFileMode::kAppend),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent-dir-for-metrics/m.jsonl"));
  EXPECT_THAT(MetricsWriter::Open(::testing::TempDir(), MetricsFileMode::kTruncate),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::TempDir()));  // EISDIR
  ASSERT_OK_AND_ASSIGN(auto full, MetricsWriter::Open("/dev/full", MetricsFileMode::kAppend));
  EXPECT_THAT(full->Write({{"step", 1}}),
              StatusIs(absl::StatusCode::kResourceExhausted, "/dev/full"));
}

// A write cut short (here by RLIMIT_FSIZE, as a full disk would) leaves a partial line; the next
// successful Write starts on a fresh line, so only the torn line is unreadable.
TEST(MetricsWriterTest, LineAfterAPartialWriteStartsOnANewLine) {
  const std::string path = TmpPath("partial");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    auto metrics = MetricsWriter::Open(path, MetricsFileMode::kTruncate);
    if (!metrics.ok()) ::_exit(1);
    if (!(*metrics)->Write({{"step", 1}}).ok()) ::_exit(2);  // 11 bytes
    struct rlimit limit;
    ::getrlimit(RLIMIT_FSIZE, &limit);
    struct rlimit small = limit;
    small.rlim_cur = 20;
    if (::setrlimit(RLIMIT_FSIZE, &small) != 0) ::_exit(3);
    const absl::Status s = (*metrics)->Write({{"step", 2}, {"pad", "xxxxxxxxxxxx"}});
    if (s.ok()) ::_exit(4);
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(5);
    if (!(*metrics)->Write({{"step", 3}}).ok()) ::_exit(6);
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);
  const std::string text = ReadFile(path);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ASSERT_EQ(lines.size(), 4u) << text;  // good, torn, good, ""
  EXPECT_EQ(lines[0], "{\"step\":1}");
  EXPECT_EQ(lines[1].size(), 9u);  // bytes 11..20 minus the newline: cut at the limit
  EXPECT_EQ(lines[2], "{\"step\":3}");
  EXPECT_EQ(lines[3], "");
}

TEST(MetricsWriterTest, ConcurrentWritersNeverInterleaveLines) {
  const std::string path = TmpPath("concurrent");
  ASSERT_OK_AND_ASSIGN(auto metrics, MetricsWriter::Open(path, MetricsFileMode::kTruncate));
  constexpr int kThreads = 4, kLines = 400;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < kLines; ++i) {
        EXPECT_OK(metrics->Write({{"thread", k}, {"i", i}, {"pad", std::string(k * 100, 'p')}}));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_OK(metrics->Close());
  std::map<int, int> next;
  const std::vector<nlohmann::json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kLines));
  for (const nlohmann::json& line : lines) {
    const int k = line["thread"];
    EXPECT_EQ(line["i"], next[k]++);
  }
}

}  // namespace
}  // namespace ps
