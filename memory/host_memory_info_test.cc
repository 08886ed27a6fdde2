#include "memory/host_memory_info.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

class HostMemoryInfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    options_.proc_root = (root_ / "proc").string();
    options_.cgroup_root = (root_ / "cgroup").string();
  }
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path p = root_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void WriteMeminfo(int64_t total_kib, int64_t available_kib) {
    Write("proc/meminfo", "MemTotal:       " + std::to_string(total_kib) +
                              " kB\nMemFree:  1 kB\nMemAvailable:   " +
                              std::to_string(available_kib) + " kB\nBuffers: 3 kB\n");
  }

  std::filesystem::path root_;
  HostMemoryInfoOptions options_;
};

TEST_F(HostMemoryInfoTest, MemAvailableWithoutCgroups) {
  WriteMeminfo(24 * 1024 * 1024, 20 * 1024 * 1024);
  Write("proc/self/status", "Name: x\nVmHWM:     2048 kB\nVmRSS:\t  1024 kB\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryInfo info, ReadHostMemoryInfo(options_));
  EXPECT_EQ(info.mem_total_bytes, 24 * kGiB);
  EXPECT_EQ(info.mem_available_bytes, 20 * kGiB);
  EXPECT_EQ(info.available_bytes(), 20 * kGiB);
  EXPECT_FALSE(info.cgroup_limit_bytes.has_value());
  EXPECT_EQ(info.process_resident_bytes, kMiB);
  EXPECT_EQ(info.process_peak_resident_bytes, 2 * kMiB);
  EXPECT_THAT(info.DebugString(), HasSubstr("20.00 GiB available"));
}

TEST_F(HostMemoryInfoTest, CgroupV2LimitTighterThanTheMachineWins) {
  WriteMeminfo(64 * 1024 * 1024, 60 * 1024 * 1024);
  Write("proc/self/cgroup", "0::/job/step\n");
  Write("cgroup/job/step/memory.max", "max\n");
  Write("cgroup/job/step/memory.current", "100\n");
  Write("cgroup/job/memory.max", std::to_string(8 * kGiB) + "\n");
  Write("cgroup/job/memory.current", std::to_string(3 * kGiB) + "\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryInfo info, ReadHostMemoryInfo(options_));
  ASSERT_TRUE(info.cgroup_limit_bytes.has_value());
  EXPECT_EQ(*info.cgroup_limit_bytes, 8 * kGiB);
  EXPECT_EQ(info.available_bytes(), 5 * kGiB);
  EXPECT_THAT(info.cgroup_dir, HasSubstr("cgroup/job"));
  EXPECT_THAT(info.DebugString(), HasSubstr("memory cgroup"));
}

TEST_F(HostMemoryInfoTest, CgroupV1UnlimitedIsNoLimitAndMissingDirectoriesAreSkipped) {
  WriteMeminfo(16 * 1024 * 1024, 10 * 1024 * 1024);
  // The v1 path of the process does not exist under the mount (a cgroup namespace); the root
  // says "unlimited".
  Write("proc/self/cgroup", "5:cpu:/\n4:memory:/process_api/abc\n0::/\n");
  Write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("cgroup/memory/memory.usage_in_bytes", "123\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryInfo info, ReadHostMemoryInfo(options_));
  EXPECT_FALSE(info.cgroup_limit_bytes.has_value());
  EXPECT_EQ(info.available_bytes(), 10 * kGiB);
}

TEST_F(HostMemoryInfoTest, CgroupV1LimitBelowAvailableAndNeverNegative) {
  WriteMeminfo(16 * 1024 * 1024, 10 * 1024 * 1024);
  Write("proc/self/cgroup", "4:memory,hugetlb:/a\n");
  Write("cgroup/memory/a/memory.limit_in_bytes", std::to_string(2 * kGiB));
  Write("cgroup/memory/a/memory.usage_in_bytes", std::to_string(kGiB / 2));
  ASSERT_OK_AND_ASSIGN(HostMemoryInfo info, ReadHostMemoryInfo(options_));
  EXPECT_EQ(info.available_bytes(), 2 * kGiB - kGiB / 2);
  Write("cgroup/memory/a/memory.usage_in_bytes", std::to_string(3 * kGiB));
  ASSERT_OK_AND_ASSIGN(info, ReadHostMemoryInfo(options_));
  EXPECT_EQ(info.available_bytes(), 0);
}

TEST_F(HostMemoryInfoTest, MissingOrBrokenMeminfoIsAnError) {
  EXPECT_THAT(ReadHostMemoryInfo(options_), StatusIs(absl::StatusCode::kNotFound, "meminfo"));
  Write("proc/meminfo", "MemTotal: 5 kB\n");
  EXPECT_THAT(ReadHostMemoryInfo(options_), StatusIs(absl::StatusCode::kDataLoss, "MemAvailable"));
}

TEST(HostMemoryInfoRealTest, ThisMachineHasSomeMemory) {
  ASSERT_OK_AND_ASSIGN(HostMemoryInfo info, ReadHostMemoryInfo());
  EXPECT_GT(info.mem_total_bytes, 0);
  EXPECT_GT(info.available_bytes(), 0);
  EXPECT_GT(info.process_resident_bytes, 0);
}

}  // namespace
}  // namespace ps
