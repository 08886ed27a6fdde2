#include "model/atomic_directory.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  const std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::set<std::string> List(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.insert(n);
  }
  ::closedir(d);
  return names;
}

DirectoryReplaceOptions ModelDirOptions() {
  DirectoryReplaceOptions o;
  o.marker_file = "config.json";
  o.is_replaced = [](absl::string_view name) {
    return name == "config.json" || absl::StartsWith(name, "weights");
  };
  return o;
}

// A writer that creates the given files.
std::function<absl::Status(const std::string&)> Writes(
    std::vector<std::pair<std::string, std::string>> files) {
  return [files](const std::string& staging) {
    for (const auto& [name, bytes] : files) WriteFile(absl::StrCat(staging, "/", name), bytes);
    return absl::OkStatus();
  };
}

TEST(AtomicDirectoryTest, CreatesAMissingDirectory) {
  const std::string parent = FreshDir("create");
  const std::string dir = absl::StrCat(parent, "/model/");  // a trailing slash is fine
  ASSERT_OK(ReplaceDirectoryAtomically(dir, ModelDirOptions(),
                                       Writes({{"config.json", "{}"}, {"weights-1", "w"}})));
  EXPECT_EQ(List(absl::StrCat(parent, "/model")),
            (std::set<std::string>{"config.json", "weights-1"}));
  EXPECT_EQ(List(parent), std::set<std::string>{"model"});  // no staging left behind
  struct stat st;
  ASSERT_EQ(::stat(absl::StrCat(parent, "/model").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
}

TEST(AtomicDirectoryTest, ReplacesKeepingFilesItDoesNotOwn) {
  const std::string parent = FreshDir("replace");
  const std::string dir = absl::StrCat(parent, "/model");
  ASSERT_OK(ReplaceDirectoryAtomically(
      dir, ModelDirOptions(),
      Writes({{"config.json", "old"}, {"weights-1", "old1"}, {"weights-2", "old2"}})));
  WriteFile(absl::StrCat(dir, "/tokenizer.json"), "tok");
  WriteFile(absl::StrCat(dir, "/README.md"), "old readme");
  ASSERT_EQ(::symlink("tokenizer.json", absl::StrCat(dir, "/link.json").c_str()), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0750), 0);
  ASSERT_OK(ReplaceDirectoryAtomically(
      dir, ModelDirOptions(),
      Writes({{"config.json", "new"}, {"weights-1", "new1"}, {"README.md", "new readme"}})));
  // weights-2 (owned, not rewritten) is gone; tokenizer.json and the link are carried over; the
  // new README wins.
  EXPECT_EQ(List(dir), (std::set<std::string>{"config.json", "weights-1", "tokenizer.json",
                                              "README.md", "link.json"}));
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/config.json")), "new");
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/tokenizer.json")), "tok");
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/link.json")), "tok");
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/README.md")), "new readme");
  EXPECT_EQ(List(parent), std::set<std::string>{"model"});
  struct stat st;
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);  // the old directory's mode
}

TEST(AtomicDirectoryTest, RefusesWhatDoesNotLookLikeItsOwn) {
  const std::string parent = FreshDir("refuse");
  const std::string file = absl::StrCat(parent, "/a_file");
  WriteFile(file, "x");
  EXPECT_THAT(ReplaceDirectoryAtomically(file, ModelDirOptions(), Writes({})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a directory")));
  const std::string home = absl::StrCat(parent, "/home");
  ASSERT_EQ(::mkdir(home.c_str(), 0755), 0);
  WriteFile(absl::StrCat(home, "/thesis.tex"), "precious");
  EXPECT_THAT(ReplaceDirectoryAtomically(home, ModelDirOptions(), Writes({{"config.json", "{}"}})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no config.json")));
  EXPECT_EQ(ReadFile(absl::StrCat(home, "/thesis.tex")), "precious");
  WriteFile(absl::StrCat(home, "/config.json"), "{}");
  ASSERT_EQ(::mkdir(absl::StrCat(home, "/sub").c_str(), 0755), 0);
  EXPECT_THAT(ReplaceDirectoryAtomically(home, ModelDirOptions(), Writes({{"config.json", "{}"}})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'sub'")));
  const std::string link = absl::StrCat(parent, "/link");
  ASSERT_EQ(::symlink(home.c_str(), link.c_str()), 0);
  EXPECT_THAT(ReplaceDirectoryAtomically(link, ModelDirOptions(), Writes({})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_THAT(ReplaceDirectoryAtomically(absl::StrCat(parent, "/missing/model"), ModelDirOptions(),
                                         Writes({})),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  EXPECT_THAT(ReplaceDirectoryAtomically("/", ModelDirOptions(), Writes({})),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(AtomicDirectoryTest, AFailedWriteLeavesTheOldDirectory) {
  const std::string parent = FreshDir("failed");
  const std::string dir = absl::StrCat(parent, "/model");
  ASSERT_OK(ReplaceDirectoryAtomically(dir, ModelDirOptions(),
                                       Writes({{"config.json", "v1"}, {"weights-1", "w1"}})));
  const absl::Status failed =
      ReplaceDirectoryAtomically(dir, ModelDirOptions(), [](const std::string& staging) {
        WriteFile(absl::StrCat(staging, "/config.json"), "v2");
        return absl::DataLossError("disk on fire");
      });
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("disk on fire")));
  EXPECT_EQ(List(dir), (std::set<std::string>{"config.json", "weights-1"}));
  EXPECT_EQ(ReadFile(absl::StrCat(dir, "/config.json")), "v1");
  EXPECT_EQ(List(parent), std::set<std::string>{"model"});  // the staging directory is gone
  // And when there was no old directory, nothing appears.
  EXPECT_THAT(
      ReplaceDirectoryAtomically(absl::StrCat(parent, "/new"), ModelDirOptions(),
                                 [](const std::string&) { return absl::InternalError("no"); }),
      StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(List(parent), std::set<std::string>{"model"});
}

TEST(AtomicDirectoryTest, EmptyDirectoryMayBeReplaced) {
  const std::string parent = FreshDir("empty");
  const std::string dir = absl::StrCat(parent, "/model");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_OK(ReplaceDirectoryAtomically(dir, ModelDirOptions(), Writes({{"config.json", "{}"}})));
  EXPECT_EQ(List(dir), std::set<std::string>{"config.json"});
}

}  // namespace
}  // namespace ps
