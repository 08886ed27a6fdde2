#include "base/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/file_io_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int Entries(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(WriteFileAtomically, ReplacesTheFileWithWhatWasWritten) {
  const std::string dir = Dir("replace");
  const std::string path = dir + "/f.bin";
  std::ofstream(path) << "old";
  const std::string data(1 << 20, 'x');
  ASSERT_OK(WriteFileAtomically(path, [&](int fd, const std::string& tmp) {
    EXPECT_NE(tmp, path);
    return WriteAll(fd, data.data(), data.size(), tmp);
  }));
  EXPECT_EQ(Read(path), data);
  EXPECT_EQ(Entries(dir), 1) << "no temporary file left behind";
}

TEST(WriteFileAtomically, AnErrorLeavesTheOldFileAndNoDebris) {
  const std::string dir = Dir("error");
  const std::string path = dir + "/f.bin";
  std::ofstream(path) << "old";
  EXPECT_THAT(WriteFileAtomically(path,
                                  [&](int fd, const std::string& tmp) {
                                    EXPECT_OK(WriteAll(fd, "new", 3, tmp));
                                    return absl::DataLossError("the producer failed");
                                  }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("producer failed")));
  EXPECT_EQ(Read(path), "old");
  EXPECT_EQ(Entries(dir), 1);
}

TEST(WriteFileAtomically, AMissingDirectoryIsNotFoundNamingThePath) {
  const std::string path = Dir("missing") + "/no/such/dir/f.bin";
  EXPECT_THAT(WriteFileAtomically(path, [](int, const std::string&) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(FileIo, WriteAllAndFsyncPathReportErrnoWithThePath) {
  EXPECT_THAT(WriteAll(-1, "x", 1, "/some/file"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'/some/file'")));
  const std::string dir = Dir("fsync");
  EXPECT_OK(FsyncPath(dir, /*directory=*/true));
  EXPECT_THAT(FsyncPath(dir + "/absent", /*directory=*/false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent")));
  EXPECT_THAT(ErrnoError(ENOSPC, "cannot write", "/p"),
              StatusIs(absl::StatusCode::kResourceExhausted, "cannot write '/p'"));
}

}  // namespace
}  // namespace ps
