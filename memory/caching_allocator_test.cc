#include "memory/caching_allocator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_tracker.h"
#include "memory/resources.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

std::unique_ptr<CachingAllocator> MakeAllocator(MemoryResource* upstream,
                                                const CachingAllocatorOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator =
      CachingAllocator::Create(upstream, options);
  EXPECT_OK(allocator);
  return std::move(allocator).value();
}

// Forwards to an upstream and records every successful call, so tests can see exactly which
// segments the allocator takes and returns.
class RecordingResource final : public MemoryResource {
 public:
  explicit RecordingResource(MemoryResource* upstream) : upstream_(upstream) {}

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    absl::StatusOr<void*> ptr = upstream_->Allocate(bytes);
    if (ptr.ok()) allocations_.emplace_back(reinterpret_cast<uintptr_t>(*ptr), bytes);
    return ptr;
  }
  absl::Status Deallocate(void* ptr, int64_t bytes) override {
    absl::Status status = upstream_->Deallocate(ptr, bytes);
    if (status.ok()) deallocations_.emplace_back(reinterpret_cast<uintptr_t>(ptr), bytes);
    return status;
  }
  Device device() const override { return upstream_->device(); }
  std::string name() const override { return "recording"; }

  std::vector<std::pair<uintptr_t, int64_t>> TakeAllocations() {
    return std::exchange(allocations_, {});
  }
  std::vector<std::pair<uintptr_t, int64_t>> TakeDeallocations() {
    return std::exchange(deallocations_, {});
  }

 private:
  MemoryResource* const upstream_;
  std::vector<std::pair<uintptr_t, int64_t>> allocations_;
  std::vector<std::pair<uintptr_t, int64_t>> deallocations_;
};

// Scaled-down options: the same policy with sizes small enough that a few thousand random steps
// split, merge and fill segments constantly.
CachingAllocatorOptions TinyOptions() {
  CachingAllocatorOptions options;
  options.round_bytes = 256;
  options.small_request_max_bytes = 4 * kKiB;
  options.small_segment_bytes = 8 * kKiB;
  options.large_segment_round_bytes = 8 * kKiB;
  return options;
}

TEST(CachingAllocatorTest, CreateRejectsBadOptionsNamingThem) {
  HostResource host;
  EXPECT_THAT(CachingAllocator::Create(nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "upstream"));
  CachingAllocatorOptions options;
  options.round_bytes = 100;
  EXPECT_THAT(CachingAllocator::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "round_bytes"));
  options = {};
  options.small_request_max_bytes = 1000;
  EXPECT_THAT(CachingAllocator::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "small_request_max_bytes"));
  options = {};
  options.small_segment_bytes = 512 * kKiB;
  EXPECT_THAT(CachingAllocator::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "small_segment_bytes"));
  options = {};
  options.large_segment_round_bytes = 0;
  EXPECT_THAT(CachingAllocator::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "large_segment_round_bytes"));
  MemoryTracker tracker(Device::Accelerator(1));
  options = {};
  options.tracker = &tracker;
  EXPECT_THAT(CachingAllocator::Create(&host, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "tracker"));
}

TEST(CachingAllocatorTest, SmallRequestsAreRoundedAndShareASegment) {
  HostResource host;
  auto allocator = MakeAllocator(&host);
  EXPECT_EQ(allocator->name(), "caching_allocator(host)");
  ASSERT_OK_AND_ASSIGN(void* a, allocator->Allocate(1));
  ASSERT_OK_AND_ASSIGN(void* b, allocator->Allocate(513));
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 512);
  CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.in_use_bytes, 512 + 1024);
  EXPECT_EQ(stats.requested_bytes, 1 + 513);
  EXPECT_EQ(stats.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(stats.cached_bytes, 2 * kMiB - 1536);
  EXPECT_EQ(stats.segments, 1);
  EXPECT_EQ(stats.free_blocks, 1);
  EXPECT_EQ(stats.free_segment_bytes, 0);  // the free tail is in a segment still in use
  EXPECT_EQ(stats.upstream_allocations, 1);
  EXPECT_EQ(host.in_use_bytes(), 2 * kMiB);
  ASSERT_OK(allocator->Deallocate(a, 1));
  ASSERT_OK(allocator->Deallocate(b, 513));
  stats = allocator->stats();
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_EQ(stats.reserved_bytes, 2 * kMiB);      // stays cached
  EXPECT_EQ(stats.free_blocks, 1);                // merged back into one block
  EXPECT_EQ(stats.free_segment_bytes, 2 * kMiB);  // all of it could go back
  EXPECT_EQ(stats.fragmentation, 0.0);
}

TEST(CachingAllocatorTest, LargeRequestsGetSegmentsRoundedTo2MiBAndSplitOnlyBigTails) {
  HostResource host;
  auto allocator = MakeAllocator(&host);
  EXPECT_EQ(allocator->SegmentSizeFor(1), 2 * kMiB);
  EXPECT_EQ(allocator->SegmentSizeFor(kMiB), 2 * kMiB);
  EXPECT_EQ(allocator->SegmentSizeFor(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(allocator->SegmentSizeFor(3 * kMiB), 4 * kMiB);

  // 3 MiB in a 4 MiB segment: the 1 MiB tail is not worth a block; it stays with the allocation.
  ASSERT_OK_AND_ASSIGN(void* a, allocator->Allocate(3 * kMiB));
  CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.reserved_bytes, 4 * kMiB);
  EXPECT_EQ(stats.in_use_bytes, 4 * kMiB);
  EXPECT_EQ(stats.free_blocks, 0);
  // 2.5 MiB in a 4 MiB segment: the 1.5 MiB tail is split off.
  ASSERT_OK_AND_ASSIGN(void* b, allocator->Allocate(5 * kMiB / 2));
  stats = allocator->stats();
  EXPECT_EQ(stats.reserved_bytes, 8 * kMiB);
  EXPECT_EQ(stats.in_use_bytes, 4 * kMiB + 5 * kMiB / 2);
  EXPECT_EQ(stats.free_blocks, 1);
  EXPECT_EQ(stats.largest_free_block_bytes, 3 * kMiB / 2);
  // The tail serves a later large request that fits it.
  ASSERT_OK_AND_ASSIGN(void* c, allocator->Allocate(kMiB + 512));
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 5 * kMiB / 2);
  EXPECT_EQ(allocator->stats().segments, 2);
  ASSERT_OK(allocator->Deallocate(a, 3 * kMiB));
  ASSERT_OK(allocator->Deallocate(b, 5 * kMiB / 2));
  ASSERT_OK(allocator->Deallocate(c, kMiB + 512));
}

TEST(CachingAllocatorTest, SmallAndLargeBlocksNeverMix) {
  HostResource host;
  auto allocator = MakeAllocator(&host);
  ASSERT_OK_AND_ASSIGN(void* large, allocator->Allocate(8 * kMiB));
  ASSERT_OK(allocator->Deallocate(large, 8 * kMiB));
  // An 8 MiB large segment is cached, but a small request takes a small segment of its own.
  ASSERT_OK_AND_ASSIGN(void* small, allocator->Allocate(4 * kKiB));
  CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.segments, 2);
  EXPECT_EQ(stats.reserved_bytes, 10 * kMiB);
  // And a large request reuses the large segment (split: the 6 MiB tail is kept).
  ASSERT_OK_AND_ASSIGN(void* again, allocator->Allocate(2 * kMiB));
  EXPECT_EQ(again, large);
  EXPECT_EQ(allocator->stats().segments, 2);
  ASSERT_OK(allocator->Deallocate(small, 4 * kKiB));
  ASSERT_OK(allocator->Deallocate(again, 2 * kMiB));
}

TEST(CachingAllocatorTest, BestFitPicksTheSmallestThenLowestFreeBlock) {
  HostResource host;
  auto allocator = MakeAllocator(&host, TinyOptions());
  // One 8 KiB small segment: [a 1K][b 2K][c 1K][d 1K][e 1K][rest 2K]
  std::vector<std::pair<void*, int64_t>> blocks;
  for (int64_t kib : {1, 2, 1, 1, 1}) {
    ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(kib * kKiB));
    blocks.emplace_back(p, kib * kKiB);
  }
  ASSERT_EQ(allocator->stats().segments, 1);
  // Free b (2K) and d (1K): free blocks are b 2K, d 1K, rest 2K.
  ASSERT_OK(allocator->Deallocate(blocks[1].first, blocks[1].second));
  ASSERT_OK(allocator->Deallocate(blocks[3].first, blocks[3].second));
  // A 1K request takes d (the smallest that fits), a 2K request takes b (lowest of the 2K ones).
  EXPECT_THAT(allocator->Allocate(kKiB), IsOkAndHolds(blocks[3].first));
  EXPECT_THAT(allocator->Allocate(2 * kKiB), IsOkAndHolds(blocks[1].first));
  for (const auto& [ptr, bytes] : blocks) ASSERT_OK(allocator->Deallocate(ptr, bytes));
  EXPECT_EQ(allocator->stats().free_blocks, 1);
}

TEST(CachingAllocatorTest, FreeMergesWithBothNeighboursAndFragmentationFollows) {
  HostResource host;
  auto allocator = MakeAllocator(&host, TinyOptions());
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {  // fills the 8 KiB segment exactly
    ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(kKiB));
    blocks.push_back(p);
  }
  EXPECT_EQ(allocator->stats().fragmentation, 0.0);
  ASSERT_OK(allocator->Deallocate(blocks[1], kKiB));
  ASSERT_OK(allocator->Deallocate(blocks[3], kKiB));
  ASSERT_OK(allocator->Deallocate(blocks[5], kKiB));
  CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.free_blocks, 3);
  EXPECT_EQ(stats.largest_free_block_bytes, kKiB);
  EXPECT_DOUBLE_EQ(stats.fragmentation, 1.0 - 1.0 / 3.0);
  // Freeing 2 merges 1, 2 and 3 into one 3 KiB block.
  ASSERT_OK(allocator->Deallocate(blocks[2], kKiB));
  stats = allocator->stats();
  EXPECT_EQ(stats.free_blocks, 2);
  EXPECT_EQ(stats.largest_free_block_bytes, 3 * kKiB);
  EXPECT_DOUBLE_EQ(stats.fragmentation, 1.0 - 3.0 / 4.0);
  // The merged block serves a 3 KiB request at its lowest address.
  EXPECT_THAT(allocator->Allocate(3 * kKiB), IsOkAndHolds(blocks[1]));
  ASSERT_OK(allocator->Deallocate(blocks[1], 3 * kKiB));
  for (int i : {0, 4, 6, 7}) ASSERT_OK(allocator->Deallocate(blocks[i], kKiB));
  stats = allocator->stats();
  EXPECT_EQ(stats.free_blocks, 1);
  EXPECT_EQ(stats.largest_free_block_bytes, 8 * kKiB);
  EXPECT_EQ(stats.fragmentation, 0.0);
}

TEST(CachingAllocatorTest, ReleaseCachedReturnsOnlyFullyFreeSegments) {
  HostResource host;
  auto allocator = MakeAllocator(&host);
  ASSERT_OK_AND_ASSIGN(void* a, allocator->Allocate(4 * kMiB));
  ASSERT_OK_AND_ASSIGN(void* b, allocator->Allocate(6 * kMiB));
  ASSERT_OK_AND_ASSIGN(void* c, allocator->Allocate(kKiB));
  ASSERT_OK(allocator->Deallocate(a, 4 * kMiB));
  EXPECT_EQ(allocator->ReleaseCached(), 4 * kMiB);
  EXPECT_EQ(allocator->ReleaseCached(), 0);
  CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.segments, 2);
  EXPECT_EQ(stats.reserved_bytes, 8 * kMiB);
  EXPECT_EQ(stats.upstream_deallocations, 1);
  EXPECT_EQ(host.in_use_bytes(), 8 * kMiB);
  ASSERT_OK(allocator->Deallocate(b, 6 * kMiB));
  ASSERT_OK(allocator->Deallocate(c, kKiB));
  EXPECT_EQ(allocator->ReleaseCached(), 8 * kMiB);
  EXPECT_EQ(allocator->stats().reserved_bytes, 0);
  EXPECT_EQ(host.in_use_bytes(), 0);
}

TEST(CachingAllocatorTest, UpstreamFailureReleasesCachedSegmentsAndRetries) {
  HostResource host(6 * kMiB);
  auto allocator = MakeAllocator(&host);
  ASSERT_OK_AND_ASSIGN(void* a, allocator->Allocate(4 * kMiB));
  ASSERT_OK(allocator->Deallocate(a, 4 * kMiB));
  EXPECT_EQ(allocator->stats().reserved_bytes, 4 * kMiB);
  // 4 MiB cached plus a new 6 MiB segment is over the 6 MiB cap: the cached segment must go first.
  ASSERT_OK_AND_ASSIGN(void* b, allocator->Allocate(5 * kMiB));
  const CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.reserved_bytes, 6 * kMiB);
  EXPECT_EQ(stats.segments, 1);
  EXPECT_EQ(stats.upstream_allocations, 2);
  EXPECT_EQ(stats.upstream_deallocations, 1);
  EXPECT_EQ(stats.failed_allocations, 0);
  ASSERT_OK(allocator->Deallocate(b, 5 * kMiB));
}

TEST(CachingAllocatorTest, ExhaustionMessageNamesRequestHoldingsAndCap) {
  HostResource host(4 * kMiB);
  auto allocator = MakeAllocator(&host, TinyOptions());
  // Fill the cap with 512 small segments, then free every other block: 2 MiB is free, but in
  // 4 KiB pieces, and no segment is fully free.
  std::vector<void*> blocks;
  for (int i = 0; i < 1024; ++i) {
    ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(4 * kKiB));
    blocks.push_back(p);
  }
  ASSERT_EQ(allocator->stats().reserved_bytes, 4 * kMiB);
  for (int i = 1; i < 1024; i += 2) ASSERT_OK(allocator->Deallocate(blocks[i], 4 * kKiB));
  EXPECT_THAT(allocator->Allocate(64 * kKiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host"), HasSubstr("caching_allocator(host)"),
                             HasSubstr("64.00 KiB"), HasSubstr("4.00 MiB capacity"),
                             HasSubstr("2.00 MiB in use"), HasSubstr("fragmentation 99.8%"))));
  EXPECT_EQ(allocator->stats().failed_allocations, 1);
  // It still works for what fits.
  ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(2 * kKiB));
  ASSERT_OK(allocator->Deallocate(p, 2 * kKiB));
  for (int i = 0; i < 1024; i += 2) ASSERT_OK(allocator->Deallocate(blocks[i], 4 * kKiB));
}

TEST(CachingAllocatorTest, BadFreesAreInvalidArgumentAndChangeNothing) {
  HostResource host;
  auto allocator = MakeAllocator(&host);
  ASSERT_OK_AND_ASSIGN(void* a, allocator->Allocate(1000));
  ASSERT_OK_AND_ASSIGN(void* b, allocator->Allocate(1000));
  ASSERT_OK(allocator->Deallocate(b, 1000));
  const CachingAllocatorStats before = allocator->stats();
  int on_stack = 0;
  EXPECT_THAT(allocator->Deallocate(&on_stack, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a live allocation"));
  EXPECT_THAT(allocator->Deallocate(b, 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(allocator->Deallocate(static_cast<char*>(a) + 512, 488),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(allocator->Deallocate(a, 999),
              StatusIs(absl::StatusCode::kInvalidArgument, "allocated with 1000 bytes"));
  EXPECT_THAT(allocator->Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(allocator->Allocate(-5), StatusIs(absl::StatusCode::kInvalidArgument));
  const CachingAllocatorStats after = allocator->stats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  ASSERT_OK(allocator->Deallocate(a, 1000));
}

TEST(CachingAllocatorTest, TrackerRecordsInUseBytesAndPeaksReset) {
  HostResource host;
  MemoryTracker tracker(Device::Host());
  CachingAllocatorOptions options;
  options.tracker = &tracker;
  auto allocator = MakeAllocator(&host, options);
  ASSERT_OK_AND_ASSIGN(void* a, allocator->Allocate(1000));
  ASSERT_OK_AND_ASSIGN(void* b, allocator->Allocate(3 * kMiB));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), allocator->stats().in_use_bytes);
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kModelData), 0);
  ASSERT_OK(allocator->Deallocate(b, 3 * kMiB));
  EXPECT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), 1024);
  EXPECT_EQ(allocator->stats().peak_in_use_bytes, 1024 + 4 * kMiB);
  allocator->ResetPeakStats();
  EXPECT_EQ(allocator->stats().peak_in_use_bytes, 1024);
  EXPECT_EQ(allocator->stats().peak_reserved_bytes, 6 * kMiB);
  ASSERT_OK(allocator->Deallocate(a, 1000));
  EXPECT_EQ(tracker.total_bytes(), 0);
}

TEST(CachingAllocatorTest, DestructionReturnsEverySegment) {
  HostResource host;
  MemoryTracker tracker(Device::Host());
  {
    CachingAllocatorOptions options;
    options.tracker = &tracker;
    auto allocator = MakeAllocator(&host, options);
    ASSERT_OK(allocator->Allocate(5 * kMiB).status());  // still live at destruction
    ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(100));
    ASSERT_OK(allocator->Deallocate(p, 100));
  }
  EXPECT_EQ(host.in_use_bytes(), 0);
  EXPECT_EQ(tracker.total_bytes(), 0);
}

TEST(CachingAllocatorTest, StatsDebugStringIsReadable) {
  HostResource host;
  auto allocator = MakeAllocator(&host);
  ASSERT_OK_AND_ASSIGN(void* p, allocator->Allocate(100));
  const std::string s = allocator->stats().DebugString();
  EXPECT_THAT(s, AllOf(HasSubstr("in use 512 B"), HasSubstr("reserved 2.00 MiB in 1 segments"),
                       HasSubstr("fragmentation 0.0%")));
  ASSERT_OK(allocator->Deallocate(p, 100));
}

// --- Randomized sequences against a reference model ----------------------------------------------

// The allocator's policy re-implemented as plainly as possible: every block of every segment in one
// address-ordered map, best fit by linear scan. It predicts the exact pointer every Allocate
// returns, which segments are taken and returned, and every statistic.
class ModelAllocator {
 public:
  ModelAllocator(const CachingAllocatorOptions& options, int64_t capacity_bytes)
      : options_(options), capacity_bytes_(capacity_bytes) {}

  // Returns the address the allocator must return, or nullopt for ResourceExhausted. Calls
  // `new_segment(bytes)` for the base of a segment the allocator has to take from the upstream.
  // Appends the bases of segments returned upstream to `released`.
  std::optional<uintptr_t> Allocate(int64_t bytes,
                                    const std::function<uintptr_t(int64_t)>& new_segment,
                                    std::vector<uintptr_t>* released) {
    const int64_t rounded = AlignUp(bytes, options_.round_bytes);
    const bool small = rounded <= options_.small_request_max_bytes;
    uintptr_t best = 0;
    bool found = false;
    for (const auto& [addr, block] : blocks_) {
      if (block.allocated || segments_.at(block.segment).small != small) continue;
      if (block.size < rounded) continue;
      if (!found || block.size < blocks_.at(best).size) {
        best = addr;
        found = true;
      }
    }
    if (!found) {
      const int64_t segment_bytes = small ? options_.small_segment_bytes
                                          : AlignUp(rounded, options_.large_segment_round_bytes);
      if (reserved_ + segment_bytes > capacity_bytes_) {
        ReleaseCached(released);
        if (reserved_ + segment_bytes > capacity_bytes_) {
          ++failed_;
          return std::nullopt;
        }
      }
      const uintptr_t base = new_segment(segment_bytes);
      segments_[base] = Segment{segment_bytes, small};
      blocks_[base] = Block{segment_bytes, false, 0, base};
      reserved_ += segment_bytes;
      peak_reserved_ = std::max(peak_reserved_, reserved_);
      ++upstream_allocations_;
      best = base;
    }
    Block& block = blocks_.at(best);
    const int64_t remainder = block.size - rounded;
    if (small ? remainder >= options_.round_bytes : remainder > options_.small_request_max_bytes) {
      blocks_[best + rounded] = Block{remainder, false, 0, block.segment};
      block.size = rounded;
    }
    block.allocated = true;
    block.requested = bytes;
    in_use_ += block.size;
    requested_ += bytes;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    ++live_;
    ++total_;
    return best;
  }

  void Deallocate(uintptr_t addr) {
    auto it = blocks_.find(addr);
    ASSERT_TRUE(it != blocks_.end() && it->second.allocated);
    in_use_ -= it->second.size;
    requested_ -= it->second.requested;
    --live_;
    it->second.allocated = false;
    it->second.requested = 0;
    if (it != blocks_.begin()) {
      auto prev = std::prev(it);
      if (!prev->second.allocated && prev->second.segment == it->second.segment) {
        prev->second.size += it->second.size;
        blocks_.erase(it);
        it = prev;
      }
    }
    auto next = std::next(it);
    if (next != blocks_.end() && !next->second.allocated &&
        next->second.segment == it->second.segment) {
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
  }

  int64_t ReleaseCached(std::vector<uintptr_t>* released) {
    int64_t bytes = 0;
    for (auto it = segments_.begin(); it != segments_.end();) {
      const Block& head = blocks_.at(it->first);
      if (!head.allocated && head.size == it->second.size) {
        blocks_.erase(it->first);
        released->push_back(it->first);
        reserved_ -= it->second.size;
        bytes += it->second.size;
        ++upstream_deallocations_;
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
    return bytes;
  }

  void ResetPeaks() {
    peak_in_use_ = in_use_;
    peak_reserved_ = reserved_;
  }

  CachingAllocatorStats Stats() const {
    CachingAllocatorStats s;
    s.in_use_bytes = in_use_;
    s.requested_bytes = requested_;
    s.reserved_bytes = reserved_;
    s.cached_bytes = reserved_ - in_use_;
    s.peak_in_use_bytes = peak_in_use_;
    s.peak_reserved_bytes = peak_reserved_;
    s.segments = static_cast<int64_t>(segments_.size());
    s.live_allocations = live_;
    s.total_allocations = total_;
    s.upstream_allocations = upstream_allocations_;
    s.upstream_deallocations = upstream_deallocations_;
    s.failed_allocations = failed_;
    for (const auto& [addr, block] : blocks_) {
      if (block.allocated) continue;
      ++s.free_blocks;
      s.largest_free_block_bytes = std::max(s.largest_free_block_bytes, block.size);
    }
    s.fragmentation = s.cached_bytes == 0 ? 0.0
                                          : 1.0 - static_cast<double>(s.largest_free_block_bytes) /
                                                      static_cast<double>(s.cached_bytes);
    return s;
  }

 private:
  struct Block {
    int64_t size;
    bool allocated;
    int64_t requested;
    uintptr_t segment;
  };
  struct Segment {
    int64_t size;
    bool small;
  };

  const CachingAllocatorOptions options_;
  const int64_t capacity_bytes_;
  std::map<uintptr_t, Block> blocks_;
  std::map<uintptr_t, Segment> segments_;
  int64_t in_use_ = 0, requested_ = 0, reserved_ = 0, peak_in_use_ = 0, peak_reserved_ = 0;
  int64_t live_ = 0, total_ = 0, upstream_allocations_ = 0, upstream_deallocations_ = 0;
  int64_t failed_ = 0;
};

void ExpectStatsEqual(const CachingAllocatorStats& actual, const CachingAllocatorStats& expected,
                      int step) {
  EXPECT_EQ(actual.in_use_bytes, expected.in_use_bytes) << "step " << step;
  EXPECT_EQ(actual.requested_bytes, expected.requested_bytes) << "step " << step;
  EXPECT_EQ(actual.reserved_bytes, expected.reserved_bytes) << "step " << step;
  EXPECT_EQ(actual.cached_bytes, expected.cached_bytes) << "step " << step;
  EXPECT_EQ(actual.peak_in_use_bytes, expected.peak_in_use_bytes) << "step " << step;
  EXPECT_EQ(actual.peak_reserved_bytes, expected.peak_reserved_bytes) << "step " << step;
  EXPECT_EQ(actual.segments, expected.segments) << "step " << step;
  EXPECT_EQ(actual.live_allocations, expected.live_allocations) << "step " << step;
  EXPECT_EQ(actual.total_allocations, expected.total_allocations) << "step " << step;
  EXPECT_EQ(actual.upstream_allocations, expected.upstream_allocations) << "step " << step;
  EXPECT_EQ(actual.upstream_deallocations, expected.upstream_deallocations) << "step " << step;
  EXPECT_EQ(actual.failed_allocations, expected.failed_allocations) << "step " << step;
  EXPECT_EQ(actual.free_blocks, expected.free_blocks) << "step " << step;
  EXPECT_EQ(actual.largest_free_block_bytes, expected.largest_free_block_bytes) << "step " << step;
  EXPECT_DOUBLE_EQ(actual.fragmentation, expected.fragmentation) << "step " << step;
}

struct RandomCase {
  std::string name;
  CachingAllocatorOptions options;
  int64_t capacity_bytes;
  int64_t max_request_bytes;
  int steps;
};

class CachingAllocatorRandomTest : public ::testing::TestWithParam<RandomCase> {};

TEST_P(CachingAllocatorRandomTest, MatchesModelExactlyAfterEveryStep) {
  const RandomCase& c = GetParam();
  HostResource host(c.capacity_bytes);
  RecordingResource recorder(&host);
  MemoryTracker tracker(Device::Host());
  CachingAllocatorOptions options = c.options;
  options.tracker = &tracker;
  auto allocator = MakeAllocator(&recorder, options);
  ModelAllocator model(c.options, c.capacity_bytes);

  struct Live {
    uintptr_t addr;
    int64_t bytes;
  };
  std::vector<Live> live;
  int exhausted_steps = 0;
  int pressure_release_steps = 0;
  std::mt19937 rng(20240607);
  const double log_max = std::log(static_cast<double>(c.max_request_bytes));
  for (int step = 0; step < c.steps; ++step) {
    // Phases of growth and shrinkage, like activations over forward and backward.
    const int alloc_percent = (step / 400) % 2 == 0 ? 65 : 35;
    const int op = static_cast<int>(rng() % 100);
    std::vector<uintptr_t> expected_released;
    if (op < alloc_percent) {
      // Log-uniform sizes: as many tiny requests as huge ones.
      const double u = std::uniform_real_distribution<double>(0, log_max)(rng);
      const int64_t bytes = std::max<int64_t>(1, static_cast<int64_t>(std::exp(u)));
      const absl::StatusOr<void*> actual = allocator->Allocate(bytes);
      bool took_segment = false;
      const std::optional<uintptr_t> expected = model.Allocate(
          bytes,
          [&](int64_t segment_bytes) -> uintptr_t {
            took_segment = true;
            const auto allocations = recorder.TakeAllocations();
            EXPECT_EQ(allocations.size(), 1u) << "step " << step;
            if (allocations.size() != 1) return 0;
            EXPECT_EQ(allocations[0].second, segment_bytes) << "step " << step;
            return allocations[0].first;
          },
          &expected_released);
      if (!took_segment) {
        ASSERT_TRUE(recorder.TakeAllocations().empty()) << "step " << step;
      }
      if (expected.has_value()) {
        ASSERT_OK(actual) << "step " << step << " bytes " << bytes;
        ASSERT_EQ(reinterpret_cast<uintptr_t>(*actual), *expected)
            << "step " << step << " bytes " << bytes;
        live.push_back({*expected, bytes});
      } else {
        ASSERT_THAT(actual, StatusIs(absl::StatusCode::kResourceExhausted)) << "step " << step;
        ++exhausted_steps;
      }
      if (!expected_released.empty()) ++pressure_release_steps;
    } else if (op < 92) {
      if (live.empty()) continue;
      const size_t i = rng() % live.size();
      const Live victim = live[i];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      ASSERT_OK(allocator->Deallocate(reinterpret_cast<void*>(victim.addr), victim.bytes))
          << "step " << step;
      model.Deallocate(victim.addr);
    } else if (op < 97) {
      const int64_t released_bytes = allocator->ReleaseCached();
      ASSERT_EQ(released_bytes, model.ReleaseCached(&expected_released)) << "step " << step;
    } else {
      allocator->ResetPeakStats();
      model.ResetPeaks();
    }
    std::vector<uintptr_t> actual_released;
    for (const auto& [addr, bytes] : recorder.TakeDeallocations()) actual_released.push_back(addr);
    ASSERT_THAT(actual_released, UnorderedElementsAreArray(expected_released)) << "step " << step;

    const CachingAllocatorStats expected_stats = model.Stats();
    ExpectStatsEqual(allocator->stats(), expected_stats, step);
    ASSERT_EQ(tracker.current_bytes(MemoryKind::kNonModelData), expected_stats.in_use_bytes);
    ASSERT_EQ(host.in_use_bytes(), expected_stats.reserved_bytes);
    if (::testing::Test::HasFailure()) return;
  }
  // The sequence must have reached the interesting states.
  EXPECT_GT(exhausted_steps, 0);
  EXPECT_GT(pressure_release_steps, 0);
  for (const Live& l : live) {
    ASSERT_OK(allocator->Deallocate(reinterpret_cast<void*>(l.addr), l.bytes));
  }
  EXPECT_EQ(allocator->stats().in_use_bytes, 0);
  EXPECT_EQ(allocator->stats().free_blocks, allocator->stats().segments);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, CachingAllocatorRandomTest,
    ::testing::Values(
        // The real policy (512 B rounding, 1 MiB small limit, 2 MiB segments), capped so that
        // releasing cached segments under pressure and running out both happen.
        RandomCase{"Default", CachingAllocatorOptions{}, 48 * kMiB, 6 * kMiB, 3000},
        // The same policy scaled down, so that blocks split and merge all the time.
        RandomCase{"Tiny", TinyOptions(), 96 * kKiB, 20 * kKiB, 4000}),
    [](const ::testing::TestParamInfo<RandomCase>& info) { return info.param.name; });

// --- Threads -----------------------------------------------------------------------------------

TEST(CachingAllocatorTest, ConcurrentUseKeepsAllocationsPrivateAndStatsBalanced) {
  constexpr int kThreads = 4;
  constexpr int kIters = 2000;
  HostResource host;
  MemoryTracker tracker(Device::Host());
  CachingAllocatorOptions options = TinyOptions();
  options.tracker = &tracker;
  auto allocator = MakeAllocator(&host, options);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::vector<std::pair<unsigned char*, int64_t>> mine;
      for (int i = 0; i < kIters; ++i) {
        if (mine.size() < 8 && rng() % 2 == 0) {
          const int64_t bytes = 1 + static_cast<int64_t>(rng() % (16 * kKiB));
          absl::StatusOr<void*> p = allocator->Allocate(bytes);
          if (!p.ok()) {
            ++failures[t];
            continue;
          }
          auto* bytes_ptr = static_cast<unsigned char*>(*p);
          std::memset(bytes_ptr, t + 1, static_cast<size_t>(bytes));
          mine.emplace_back(bytes_ptr, bytes);
        } else if (!mine.empty()) {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (p[0] != t + 1 || p[bytes - 1] != t + 1) ++failures[t];
          if (!allocator->Deallocate(p, bytes).ok()) ++failures[t];
        }
        if (i % 97 == 0) allocator->ReleaseCached();
        if (i % 31 == 0) (void)allocator->stats();
      }
      for (const auto& [p, bytes] : mine) {
        if (!allocator->Deallocate(p, bytes).ok()) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  CachingAllocatorStats stats = allocator->stats();
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_EQ(stats.live_allocations, 0);
  EXPECT_EQ(stats.free_blocks, stats.segments);
  EXPECT_EQ(tracker.total_bytes(), 0);
  allocator->ReleaseCached();
  EXPECT_EQ(allocator->stats().reserved_bytes, 0);
  EXPECT_EQ(host.in_use_bytes(), 0);
}

}  // namespace
}  // namespace ps
