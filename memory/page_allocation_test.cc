// memory/internal/page_allocation.h: large blocks come straight from the OS, hold only the pages
// written, and go back to the OS when freed (the emulated accelerator's host footprint and the
// chunk blocks' untouched tails depend on it); small ones come from the heap. Resident sizes are
// read from /proc/self/status; the checks leave a wide margin for the test runner's own pages.
#include "memory/internal/page_allocation.h"

#include <cstdint>
#include <cstring>

#include "base/sanitizers.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/host_memory_info.h"
#include "memory/memory_resource.h"

namespace ps::memory_internal {
namespace {

// Under AddressSanitizer every block comes from the heap; under ThreadSanitizer writes also fault
// in shadow memory: the resident-size checks hold without sanitizers only.
constexpr bool kSanitized = kAsan || kTsan;

int64_t ResidentBytes() {
  absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo();
  EXPECT_OK(info);
  return info.ok() ? info->process_resident_bytes : 0;
}

TEST(PageAllocation, AlignedForEverySizeAndWritable) {
  for (int64_t bytes : {int64_t{1}, int64_t{255}, int64_t{4097}, kPageAllocationMinBytes - 1,
                        kPageAllocationMinBytes, 3 * kMiB + 5}) {
    void* p = AllocatePages(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kAllocationAlignment, 0u) << bytes;
    std::memset(p, 0x5a, static_cast<size_t>(bytes));
    FreePages(p, bytes);
  }
  FreePages(nullptr, 1);  // a no-op
}

TEST(PageAllocation, OnlyWrittenPagesAreResidentAndFreedPagesLeave) {
  if (kSanitized) GTEST_SKIP() << "resident sizes are checked without sanitizers only";
  constexpr int64_t kBytes = 64 * kMiB;
  const int64_t before = ResidentBytes();
  char* p = static_cast<char*>(AllocatePages(kBytes));
  ASSERT_NE(p, nullptr);
  // A fresh mapping reads as zeros and costs nothing until written.
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[kBytes - 1], 0);
  EXPECT_LT(ResidentBytes() - before, 8 * kMiB);
  // Writing a quarter of it makes a quarter resident.
  std::memset(p, 1, static_cast<size_t>(kBytes / 4));
  const int64_t written = ResidentBytes() - before;
  EXPECT_GE(written, kBytes / 4 - kMiB);
  EXPECT_LT(written, kBytes / 4 + 8 * kMiB);
  // Freed: back to the OS at once.
  FreePages(p, kBytes);
  EXPECT_LT(ResidentBytes() - before, 8 * kMiB);
}

// glibc's malloc raises its mmap threshold to the size of a mapped block freed, and serves blocks
// below it from its heap, where freed pages stay resident: the emulated accelerator's freed blocks
// used to pile up there. Mapped blocks leave whatever was freed before.
TEST(PageAllocation, FreedBlocksLeaveAfterALargerBlockWasFreed) {
  if (kSanitized) GTEST_SKIP() << "resident sizes are checked without sanitizers only";
  void* large = AllocatePages(24 * kMiB);
  ASSERT_NE(large, nullptr);
  std::memset(large, 1, 24 * kMiB);
  FreePages(large, 24 * kMiB);
  const int64_t before = ResidentBytes();
  for (int i = 0; i < 4; ++i) {
    void* p = AllocatePages(12 * kMiB);
    ASSERT_NE(p, nullptr);
    std::memset(p, 2, 12 * kMiB);
    void* q = AllocatePages(6 * kMiB);  // keeps the heap's top above the first block
    ASSERT_NE(q, nullptr);
    std::memset(q, 3, 6 * kMiB);
    FreePages(p, 12 * kMiB);
    FreePages(q, 6 * kMiB);
  }
  EXPECT_LT(ResidentBytes() - before, 4 * kMiB);
}

}  // namespace
}  // namespace ps::memory_internal
