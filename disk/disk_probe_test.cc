#include "disk/disk_probe.h"

#include <filesystem>
#include <iostream>
#include <string>

#include "base/testing/status_matchers.h"
#include "disk/io_engine.h"
#include "disk/testing/scoped_test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

TEST(DiskProbe, FreeBytesAndFilesystem) {
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(const int64_t free_bytes, FreeDiskBytes(dir.path()));
  EXPECT_GT(free_bytes, 0);
  ASSERT_OK_AND_ASSIGN(const std::string fs, FilesystemName(dir.path()));
  EXPECT_FALSE(fs.empty());
  if (std::filesystem::is_directory("/dev/shm")) {
    EXPECT_THAT(FilesystemName("/dev/shm"), IsOkAndHolds(std::string("tmpfs")));
  }
  const std::string missing = dir.path() + "/missing";
  EXPECT_THAT(FreeDiskBytes(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  EXPECT_THAT(FilesystemName(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
}

// tmpfs (/dev/shm here) holds its files in RAM; the test's own directory is on a disk (or an
// overlay) unless TEST_TMPDIR itself is on tmpfs, which FilesystemName then says.
TEST(DiskProbe, IsRamBackedTellsTmpfsFromADisk) {
  if (std::filesystem::is_directory("/dev/shm")) {
    EXPECT_THAT(IsRamBacked("/dev/shm"), IsOkAndHolds(true));
  }
  ScopedTestDir dir;
  ASSERT_OK_AND_ASSIGN(const std::string fs, FilesystemName(dir.path()));
  EXPECT_THAT(IsRamBacked(dir.path()), IsOkAndHolds(fs == "tmpfs")) << fs;
  const std::string missing = dir.path() + "/missing";
  EXPECT_THAT(IsRamBacked(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
}

void ExpectBandwidth(IoEngineKind engine, bool direct) {
  ScopedTestDir dir;
  FileChunkSwapOptions options;
  options.engine = engine;
  options.direct = direct;
  options.block_size = 256 << 10;
  options.queue_depth = 4;
  ASSERT_OK_AND_ASSIGN(const DiskBandwidth bw,
                       MeasureDiskBandwidth(dir.path(), options, (4 << 20) + 5));
  std::cout << bw.engine << (bw.direct ? ", direct" : ", buffered") << ": write "
            << bw.write_bytes_per_s / 1e6 << " MB/s, read " << bw.read_bytes_per_s / 1e6
            << " MB/s, one 256 KiB block " << bw.block_latency_ns / 1000 << " us (" << bw.note
            << ")\n";
  EXPECT_GT(bw.write_bytes_per_s, 0);
  EXPECT_GT(bw.read_bytes_per_s, 0);
  EXPECT_GT(bw.block_latency_ns, 0);
  EXPECT_EQ(bw.engine, engine == IoEngineKind::kThreads ? "threads" : "io_uring");
  if (!bw.direct) {
    EXPECT_THAT(bw.note, HasSubstr("page cache"));
  }
  if (!direct) {
    EXPECT_FALSE(bw.direct);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the probe file was not removed";
}

TEST(DiskProbe, BandwidthThroughTheThreadEngine) {
  ExpectBandwidth(IoEngineKind::kThreads, true);
  ExpectBandwidth(IoEngineKind::kThreads, false);
}

TEST(DiskProbe, BandwidthThroughIoUring) {
  absl::StatusOr<OpenedIoEngine> ring =
      OpenIoEngine(IoEngineOptions{.kind = IoEngineKind::kIoUring});
  if (!ring.ok()) GTEST_SKIP() << "io_uring is refused here: " << ring.status().message();
  ExpectBandwidth(IoEngineKind::kIoUring, true);
  ExpectBandwidth(IoEngineKind::kIoUring, false);
}

TEST(DiskProbe, Errors) {
  ScopedTestDir dir;
  FileChunkSwapOptions options;
  EXPECT_THAT(MeasureDiskBandwidth(dir.path() + "/missing", options, 1 << 20),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  EXPECT_THAT(MeasureDiskBandwidth(dir.path(), options, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options.block_size = 1000;
  EXPECT_THAT(MeasureDiskBandwidth(dir.path(), options, 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aio.block_size")));
}

}  // namespace
}  // namespace ps
