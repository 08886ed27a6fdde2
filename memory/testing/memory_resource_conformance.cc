#include "memory/testing/memory_resource_conformance.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/random/distributions.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {

void PrintTo(const MemoryResourceConformanceParam& param, std::ostream* os) {
  *os << param.name << " (max request " << FormatBytes(param.max_request_bytes);
  if (param.capacity_bytes.has_value()) *os << ", capacity " << FormatBytes(*param.capacity_bytes);
  *os << ")";
}

std::string MemoryResourceConformanceParamName(
    const ::testing::TestParamInfo<MemoryResourceConformanceParam>& info) {
  return info.param.name;
}

void MemoryResourceConformanceTest::SetUp() {
  const MemoryResourceConformanceParam& param = GetParam();
  ASSERT_GT(param.max_request_bytes, 0) << "set max_request_bytes in the parameter";
  ASSERT_TRUE(param.factory) << "set factory in the parameter";
  absl::StatusOr<std::unique_ptr<ResourceUnderTest>> made = param.factory();
  ASSERT_OK(made);
  under_test_ = *std::move(made);
  ASSERT_NE(under_test_->resource(), nullptr) << "the factory did not call set_resource()";
}

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

bool IsAligned(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % kAllocationAlignment == 0;
}

// The byte that position `offset` of an allocation tagged `tag` must hold.
unsigned char PatternByte(uint64_t tag, int64_t offset) {
  uint64_t x = tag * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(offset) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x);
}

// Positions of an allocation of `bytes` that carry the pattern: the first and last bytes, and a
// few spread between (all of them for small allocations).
std::vector<int64_t> SamplePositions(int64_t bytes) {
  std::vector<int64_t> positions;
  constexpr int64_t kSamples = 16;
  if (bytes <= kSamples) {
    for (int64_t i = 0; i < bytes; ++i) positions.push_back(i);
    return positions;
  }
  for (int64_t k = 0; k < kSamples; ++k) positions.push_back((bytes - 1) * k / (kSamples - 1));
  return positions;
}

void WritePattern(void* ptr, int64_t bytes, uint64_t tag) {
  auto* p = static_cast<unsigned char*>(ptr);
  for (int64_t i : SamplePositions(bytes)) p[i] = PatternByte(tag, i);
}

// Returns the first position whose byte differs from the pattern, or -1.
int64_t FirstPatternMismatch(const void* ptr, int64_t bytes, uint64_t tag) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  for (int64_t i : SamplePositions(bytes)) {
    if (p[i] != PatternByte(tag, i)) return i;
  }
  return -1;
}

// Fills every byte (for allocations small enough that this stays cheap).
void FillAll(void* ptr, int64_t bytes, uint64_t tag) {
  auto* p = static_cast<unsigned char*>(ptr);
  for (int64_t i = 0; i < bytes; ++i) p[i] = PatternByte(tag, i);
}

int64_t FirstFullMismatch(const void* ptr, int64_t bytes, uint64_t tag) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  for (int64_t i = 0; i < bytes; ++i) {
    if (p[i] != PatternByte(tag, i)) return i;
  }
  return -1;
}

// A request size for a few allocations that must all fit at once.
int64_t ModestRequest(const MemoryResourceConformanceParam& param, int64_t count) {
  int64_t bytes = param.max_request_bytes;
  if (param.capacity_bytes.has_value())
    bytes = std::min(bytes, *param.capacity_bytes / (2 * count));
  return std::max<int64_t>(1, std::min<int64_t>(bytes, 64 * kKiB));
}

TEST_P(MemoryResourceConformanceTest, AllocationsAreAlignedAndWritable) {
  const MemoryResourceConformanceParam& param = GetParam();
  std::vector<int64_t> sizes = {1,
                                7,
                                255,
                                256,
                                257,
                                4095,
                                4096,
                                65537,
                                param.max_request_bytes / 2 + 1,
                                param.max_request_bytes};
  for (int64_t bytes : sizes) {
    if (bytes <= 0 || bytes > param.max_request_bytes) continue;
    if (param.capacity_bytes.has_value() && bytes > *param.capacity_bytes) continue;
    SCOPED_TRACE(::testing::Message() << "bytes = " << bytes);
    ASSERT_OK_AND_ASSIGN(void* ptr, resource()->Allocate(bytes));
    ASSERT_NE(ptr, nullptr);
    EXPECT_TRUE(IsAligned(ptr)) << ptr << " is not aligned to " << kAllocationAlignment;
    if (param.host_accessible) {
      // Every byte of the request is usable.
      std::memset(ptr, 0xA5, static_cast<size_t>(bytes));
      EXPECT_EQ(static_cast<unsigned char*>(ptr)[bytes - 1], 0xA5);
    }
    ASSERT_OK(resource()->Deallocate(ptr, bytes));
  }
}

TEST_P(MemoryResourceConformanceTest, LiveAllocationsDoNotOverlap) {
  const MemoryResourceConformanceParam& param = GetParam();
  int64_t count = 24;
  if (param.capacity_bytes.has_value()) {
    count = std::clamp<int64_t>(*param.capacity_bytes / (2 * param.granularity_bytes), 2, count);
  }
  const int64_t max_bytes = ModestRequest(param, count);
  std::mt19937 rng(7);
  struct Live {
    void* ptr;
    int64_t bytes;
  };
  std::vector<Live> live;
  for (int i = 0; i < count; ++i) {
    const int64_t bytes = absl::Uniform<int64_t>(absl::IntervalClosed, rng, 1, max_bytes);
    ASSERT_OK_AND_ASSIGN(void* ptr, resource()->Allocate(bytes));
    if (param.host_accessible) FillAll(ptr, bytes, static_cast<uint64_t>(i));
    live.push_back({ptr, bytes});
  }
  std::vector<Live> sorted = live;
  std::sort(sorted.begin(), sorted.end(),
            [](const Live& a, const Live& b) { return a.ptr < b.ptr; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    EXPECT_LE(static_cast<char*>(sorted[i - 1].ptr) + sorted[i - 1].bytes,
              static_cast<char*>(sorted[i].ptr))
        << "allocations at " << sorted[i - 1].ptr << " and " << sorted[i].ptr << " overlap";
  }
  if (param.host_accessible) {
    for (int i = 0; i < count; ++i) {
      EXPECT_EQ(FirstFullMismatch(live[i].ptr, live[i].bytes, static_cast<uint64_t>(i)), -1)
          << "allocation " << i << " was overwritten";
    }
  }
  for (const Live& l : live) ASSERT_OK(resource()->Deallocate(l.ptr, l.bytes));
}

TEST_P(MemoryResourceConformanceTest, NonPositiveSizesAreInvalidArgument) {
  EXPECT_THAT(resource()->Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(resource()->Allocate(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(resource()->Allocate(std::numeric_limits<int64_t>::min()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // The resource still works.
  ASSERT_OK_AND_ASSIGN(void* ptr, resource()->Allocate(1));
  ASSERT_OK(resource()->Deallocate(ptr, 1));
}

TEST_P(MemoryResourceConformanceTest, ForeignAndDoubleFreesAreInvalidArgumentAndChangeNothing) {
  const MemoryResourceConformanceParam& param = GetParam();
  // At least 512 bytes where possible, so that a pointer into the middle exists.
  const int64_t bytes =
      std::max(ModestRequest(param, 4), std::min<int64_t>(512, param.max_request_bytes));
  ASSERT_OK_AND_ASSIGN(void* kept, resource()->Allocate(bytes));
  ASSERT_OK_AND_ASSIGN(void* freed, resource()->Allocate(bytes));
  if (param.host_accessible) FillAll(kept, bytes, 1);
  ASSERT_OK(resource()->Deallocate(freed, bytes));

  // A second free of the same pointer.
  EXPECT_THAT(resource()->Deallocate(freed, bytes), StatusIs(absl::StatusCode::kInvalidArgument));
  // Pointers that never came from this resource: the stack, the C++ heap, another instance of the
  // same kind of resource.
  int on_stack = 0;
  EXPECT_THAT(resource()->Deallocate(&on_stack, sizeof(on_stack)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto on_heap = std::make_unique<char[]>(64);
  EXPECT_THAT(resource()->Deallocate(on_heap.get(), 64),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ResourceUnderTest> other, param.factory());
  ASSERT_OK_AND_ASSIGN(void* other_ptr, other->resource()->Allocate(bytes));
  EXPECT_THAT(resource()->Deallocate(other_ptr, bytes),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(other->resource()->Deallocate(other_ptr, bytes));
  // A pointer into the middle of a live allocation.
  if (bytes > kAllocationAlignment) {
    EXPECT_THAT(resource()->Deallocate(static_cast<char*>(kept) + kAllocationAlignment,
                                       bytes - kAllocationAlignment),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }

  // Nothing changed: the live allocation is intact and frees once; new allocations work.
  if (param.host_accessible) {
    EXPECT_EQ(FirstFullMismatch(kept, bytes, 1), -1);
  }
  ASSERT_OK(resource()->Deallocate(kept, bytes));
  EXPECT_THAT(resource()->Deallocate(kept, bytes), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(void* again, resource()->Allocate(bytes));
  ASSERT_OK(resource()->Deallocate(again, bytes));
}

TEST_P(MemoryResourceConformanceTest, ExhaustionIsResourceExhaustedAndRecoverable) {
  const MemoryResourceConformanceParam& param = GetParam();
  if (!param.capacity_bytes.has_value()) GTEST_SKIP() << param.name << " is not capped";
  const int64_t capacity_bytes = *param.capacity_bytes;
  const int64_t request_bytes = std::min(param.max_request_bytes, capacity_bytes / 4);
  ASSERT_GT(request_bytes, 0);
  const int64_t most = capacity_bytes / request_bytes;

  std::vector<void*> live;
  absl::Status failure;
  for (int64_t i = 0; i <= most + 1; ++i) {
    absl::StatusOr<void*> ptr = resource()->Allocate(request_bytes);
    if (!ptr.ok()) {
      failure = ptr.status();
      break;
    }
    live.push_back(*ptr);
  }
  ASSERT_FALSE(failure.ok()) << "more than " << FormatBytes(capacity_bytes)
                             << " was handed out without running out";
  EXPECT_THAT(failure, StatusIs(absl::StatusCode::kResourceExhausted,
                                AllOf(HasSubstr(FormatBytes(request_bytes)),
                                      HasSubstr(FormatBytes(capacity_bytes)))));
  EXPECT_LE(static_cast<int64_t>(live.size()) * request_bytes, capacity_bytes);
  ASSERT_FALSE(live.empty()) << "not even one " << FormatBytes(request_bytes)
                             << " allocation fit in " << FormatBytes(capacity_bytes);

  // One free makes room for one allocation again.
  ASSERT_OK(resource()->Deallocate(live.back(), request_bytes));
  live.pop_back();
  ASSERT_OK_AND_ASSIGN(void* refill, resource()->Allocate(request_bytes));
  live.push_back(refill);
  // After freeing everything, as many allocations fit as the first time.
  const size_t first_round = live.size();
  for (void* ptr : live) ASSERT_OK(resource()->Deallocate(ptr, request_bytes));
  live.clear();
  for (size_t i = 0; i < first_round; ++i) {
    ASSERT_OK_AND_ASSIGN(void* ptr, resource()->Allocate(request_bytes));
    live.push_back(ptr);
  }
  for (void* ptr : live) ASSERT_OK(resource()->Deallocate(ptr, request_bytes));
}

// A few thousand random allocations and frees against a model of the live ranges. After every
// step: every live allocation is aligned, overlaps no other, and still holds its pattern.
TEST_P(MemoryResourceConformanceTest, RandomSequenceAgainstReferenceModel) {
  const MemoryResourceConformanceParam& param = GetParam();
  constexpr int kSteps = 2500;
  constexpr int64_t kMaxLive = 48;
  // Keep the live total well inside a cap (fragmentation may still refuse some requests, which
  // a capped resource may do) and within reason for uncapped ones.
  const int64_t live_budget_bytes =
      param.capacity_bytes.has_value() ? *param.capacity_bytes : 64 * kMiB;
  struct Range {
    int64_t bytes;
    uint64_t tag;
  };
  absl::btree_map<uintptr_t, Range> live;  // by start address
  int64_t live_bytes = 0;
  int exhausted = 0;
  std::mt19937 rng(0x5eed);

  auto check_all = [&](int step) {
    for (const auto& [start, range] : live) {
      ASSERT_TRUE(IsAligned(reinterpret_cast<void*>(start))) << "step " << step;
      if (param.host_accessible) {
        const int64_t at =
            FirstPatternMismatch(reinterpret_cast<void*>(start), range.bytes, range.tag);
        ASSERT_EQ(at, -1) << "step " << step << ": allocation at 0x" << std::hex << start
                          << std::dec << " (" << range.bytes << " bytes) was overwritten at " << at;
      }
    }
  };

  for (int step = 0; step < kSteps; ++step) {
    const bool allocate = live.empty() || (static_cast<int64_t>(live.size()) < kMaxLive &&
                                           absl::Bernoulli(rng, 0.55));
    if (allocate) {
      const int64_t bytes = absl::LogUniform<int64_t>(rng, 1, param.max_request_bytes);
      if (live_bytes + bytes > live_budget_bytes) continue;
      absl::StatusOr<void*> ptr = resource()->Allocate(bytes);
      if (!ptr.ok()) {
        ASSERT_TRUE(param.capacity_bytes.has_value() && absl::IsResourceExhausted(ptr.status()))
            << "step " << step << ": Allocate(" << bytes << "): " << ptr.status();
        ++exhausted;
        check_all(step);
        continue;
      }
      const uintptr_t start = reinterpret_cast<uintptr_t>(*ptr);
      ASSERT_TRUE(IsAligned(*ptr)) << "step " << step;
      // No overlap with the neighbours on either side.
      auto next = live.lower_bound(start);
      if (next != live.end()) {
        ASSERT_LE(start + static_cast<uintptr_t>(bytes), next->first)
            << "step " << step << ": new allocation overlaps a live one";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + static_cast<uintptr_t>(prev->second.bytes), start)
            << "step " << step << ": new allocation overlaps a live one";
      }
      const uint64_t tag = static_cast<uint64_t>(step) + 1;
      if (param.host_accessible) WritePattern(*ptr, bytes, tag);
      live.emplace(start, Range{bytes, tag});
      live_bytes += bytes;
    } else {
      auto it = live.begin();
      std::advance(it, absl::Uniform<size_t>(rng, 0, live.size()));
      const uintptr_t start = it->first;
      const Range range = it->second;
      live.erase(it);
      live_bytes -= range.bytes;
      ASSERT_OK(resource()->Deallocate(reinterpret_cast<void*>(start), range.bytes))
          << "step " << step;
    }
    check_all(step);
  }
  // Uncapped resources must never have refused anything.
  if (!param.capacity_bytes.has_value()) {
    EXPECT_EQ(exhausted, 0);
  }
  for (const auto& [start, range] : live) {
    ASSERT_OK(resource()->Deallocate(reinterpret_cast<void*>(start), range.bytes));
  }
}

}  // namespace

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MemoryResourceConformanceTest);

}  // namespace ps
