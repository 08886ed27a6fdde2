#include "memory/internal/cpu_device_heap.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/sanitizers.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/host_memory_info.h"
#include "memory/internal/backend_errors.h"
#include "memory/internal/page_allocation.h"
#include "memory/memory_resource.h"

// Cached device blocks are poisoned under AddressSanitizer, so a use after FreeDevice is reported
// although the block stays allocated (CpuBackendOptions' cache).
#if PS_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace ps::memory_internal {
namespace {

void PoisonCached(void* p, int64_t bytes) {
#if PS_ASAN
  ASAN_POISON_MEMORY_REGION(p, static_cast<size_t>(bytes));
#else
  (void)p;
  (void)bytes;
#endif
}

void UnpoisonCached(void* p, int64_t bytes) {
#if PS_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, static_cast<size_t>(bytes));
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace

CpuDeviceHeap::CpuDeviceHeap(const CpuBackendOptions& options)
    : options_(options), device_(Device::Accelerator(options.device_index)) {}

absl::StatusOr<void*> CpuDeviceHeap::Allocate(int64_t bytes) {
  if (absl::Status s = backend_internal::CheckAllocationSize("AllocateDevice", bytes); !s.ok()) {
    return s;
  }
  const int64_t rounded = AlignUp(bytes, kAllocationAlignment);
  MutexLock lock(&mu_);
  const int64_t cap = options_.capacity_bytes;
  if (rounded > cap - live_bytes_) {
    return backend_internal::DeviceOutOfMemory(device_, "emulated by the cpu backend", "", rounded,
                                               live_bytes_, cap);
  }
  CpuBackendMemoryStats& ms = stats_;
  void* p = nullptr;
  if (auto cached = cache_.find(rounded); cached != cache_.end()) {
    // A block of this size was freed: reuse it, its pages are resident already.
    p = reinterpret_cast<void*>(cached->second);
    cache_.erase(cached);
    ms.cached_bytes -= rounded;
    ms.cached_blocks -= 1;
    ms.cache_hits += 1;
    UnpoisonCached(p, rounded);
  } else if (p = SplitCachedLocked(rounded); p != nullptr) {
    ms.split_reuses += 1;
  } else {
    // The backend never holds more host memory than its highest live total (this allocation
    // included): unmap cached blocks first where mapping this one would exceed it.
    const int64_t bound = std::max(ms.peak_live_bytes, live_bytes_ + rounded);
    const int64_t before = ms.blocks_unmapped;
    // Grow the largest smaller cached block in place of a fresh mapping: its pages stay.
    p = GrowCachedLocked(rounded, bound - live_bytes_ - rounded);
    if (p != nullptr) ms.grow_reuses += 1;
    TrimCacheLocked(bound - live_bytes_ - rounded);
    ms.bound_evictions += ms.blocks_unmapped - before;
  }
  if (p == nullptr) {
    // Mapped pages (memory/internal/page_allocation.h).
    p = AllocatePages(rounded);
    if (p == nullptr && ms.cached_bytes > 0) {
      // The host refused: give back what the cache holds and try again.
      ReleaseCacheLocked();
      ms.pressure_releases += 1;
      p = AllocatePages(rounded);
    }
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host RAM backing ", device_.ToString(), " is exhausted: allocating ",
                       FormatBytes(rounded), " failed. Lower the accelerator memory cap."));
    }
    ms.blocks_mapped += 1;
    ms.mapped_bytes += rounded;
    ms.peak_mapped_bytes = std::max(ms.peak_mapped_bytes, ms.mapped_bytes);
  }
  allocations_[reinterpret_cast<uintptr_t>(p)] = rounded;
  live_bytes_ += rounded;
  ms.allocations += 1;
  ms.peak_live_bytes = std::max(ms.peak_live_bytes, live_bytes_);
  return p;
}

absl::Status CpuDeviceHeap::Free(void* ptr) {
  {
    MutexLock lock(&mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end()) {
      return backend_internal::NotALiveAllocation("FreeDevice", ptr, device_, "device");
    }
    const int64_t bytes = it->second;
    live_bytes_ -= bytes;
    allocations_.erase(it);
    // Kept mapped for the next allocation of this size (see cpu_backend.h), within
    // max_cached_bytes; from now on no copy may target it, and AddressSanitizer reports a use.
    const int64_t max_cached =
        options_.max_cached_bytes.value_or(std::numeric_limits<int64_t>::max());
    if (bytes > max_cached) {
      UnmapLocked(ptr, bytes);
      return absl::OkStatus();
    }
    TrimCacheLocked(max_cached - bytes);
    PoisonCached(ptr, bytes);
    cache_.emplace(bytes, reinterpret_cast<uintptr_t>(ptr));
    stats_.cached_bytes += bytes;
    stats_.cached_blocks += 1;
  }
  CheckHostMemory();
  return absl::OkStatus();
}

void CpuDeviceHeap::FreeAllAtBackendDestruction() {
  MutexLock lock(&mu_);
  if (!allocations_.empty()) {
    LOG(WARNING) << "cpu backend for " << device_ << " destroyed with " << allocations_.size()
                 << " device allocations (" << FormatBytes(live_bytes_)
                 << ") still live; freeing them";
  }
  for (const auto& [p, bytes] : allocations_) {
    FreePages(reinterpret_cast<void*>(p), bytes);
  }
  ReleaseCacheLocked();
}

absl::Status CpuDeviceHeap::CheckRange(const void* ptr, int64_t bytes,
                                       absl::string_view what) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  MutexLock lock(&mu_);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin()) {
    --it;
    if (p >= it->first && p + static_cast<uint64_t>(bytes) <= it->first + it->second) {
      return absl::OkStatus();
    }
  }
  return backend_internal::OutsideDeviceMemory(what, ptr, bytes, device_, "cpu");
}

int64_t CpuDeviceHeap::live_bytes() const {
  MutexLock lock(&mu_);
  return live_bytes_;
}

CpuBackendMemoryStats CpuDeviceHeap::stats() const {
  MutexLock lock(&mu_);
  CpuBackendMemoryStats s = stats_;
  s.live_bytes = live_bytes_;
  return s;
}

int64_t CpuDeviceHeap::ReleaseCache() {
  MutexLock lock(&mu_);
  if (cache_.empty()) return 0;
  stats_.explicit_releases += 1;
  return ReleaseCacheLocked();
}

// A block of `bytes` cut from the front of the smallest larger cached block whose rest stays a
// block (memory/internal/page_allocation.h: PagesResizable); the rest stays cached. Null when
// there is none. Host memory held does not change.
void* CpuDeviceHeap::SplitCachedLocked(int64_t bytes) {
  if (!PagesResizable(bytes)) return nullptr;
  for (auto it = cache_.upper_bound(bytes); it != cache_.end(); ++it) {
    const int64_t rest = it->first - bytes;
    if (!PagesResizable(it->first) || !PagesResizable(rest)) continue;
    const uintptr_t block = it->second;
    cache_.erase(it);
    cache_.emplace(rest, block + static_cast<uintptr_t>(bytes));
    stats_.cached_bytes -= bytes;
    UnpoisonCached(reinterpret_cast<void*>(block), bytes);
    return reinterpret_cast<void*>(block);
  }
  return nullptr;
}

// The largest cached block smaller than `bytes`, resized (mremap) to `bytes`: only the grown
// tail faults in. The other cached blocks are first trimmed to `cache_target` bytes. Null (and
// nothing changed but the trim) when there is none or the OS refuses.
void* CpuDeviceHeap::GrowCachedLocked(int64_t bytes, int64_t cache_target) {
  if (!PagesResizable(bytes)) return nullptr;
  // Every block before lower_bound(bytes) is smaller; take the largest resizable one.
  auto it = cache_.lower_bound(bytes);
  bool found = false;
  while (!found && it != cache_.begin()) {
    --it;
    found = PagesResizable(it->first);
  }
  if (!found) return nullptr;
  const int64_t old_bytes = it->first;
  void* block = reinterpret_cast<void*>(it->second);
  cache_.erase(it);
  stats_.cached_bytes -= old_bytes;
  stats_.cached_blocks -= 1;
  stats_.mapped_bytes -= old_bytes;
  // The grown block must fit the bound with what stays cached.
  TrimCacheLocked(cache_target);
  UnpoisonCached(block, old_bytes);
  void* grown = ResizePages(block, old_bytes, bytes);
  if (grown == nullptr) {
    FreePages(block, old_bytes);
    stats_.blocks_unmapped += 1;
    return nullptr;
  }
  stats_.mapped_bytes += bytes;
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, stats_.mapped_bytes);
  return grown;
}

// Unmaps cached blocks, largest first, until at most `target` bytes stay cached.
void CpuDeviceHeap::TrimCacheLocked(int64_t target) {
  while (stats_.cached_bytes > target && !cache_.empty()) {
    auto largest = std::prev(cache_.end());
    UnmapLocked(reinterpret_cast<void*>(largest->second), largest->first);
    stats_.cached_bytes -= largest->first;
    stats_.cached_blocks -= 1;
    cache_.erase(largest);
  }
}

void CpuDeviceHeap::UnmapLocked(void* p, int64_t bytes) {
  UnpoisonCached(p, bytes);
  FreePages(p, bytes);
  stats_.blocks_unmapped += 1;
  stats_.mapped_bytes -= bytes;
}

// Empties the cache; returns the bytes unmapped.
int64_t CpuDeviceHeap::ReleaseCacheLocked() {
  const int64_t released = stats_.cached_bytes;
  TrimCacheLocked(0);
  return released;
}

// Called after a free grew the cache, without the lock: empties the cache if the host runs low
// (at most once per host_memory_check_interval).
void CpuDeviceHeap::CheckHostMemory() {
  {
    MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (cache_.empty() || now < next_host_memory_check_) return;
    next_host_memory_check_ = now + options_.host_memory_check_interval;
  }
  int64_t available = -1;
  if (options_.host_available_bytes) {
    available = options_.host_available_bytes();
  } else if (absl::StatusOr<HostMemoryInfo> info = ReadHostMemoryInfo(); info.ok()) {
    available = info->available_bytes();
  }
  if (available < 0 || available >= options_.host_low_memory_bytes) return;
  MutexLock lock(&mu_);
  if (cache_.empty()) return;
  LOG(INFO) << "cpu backend for " << device_ << ": the host has " << FormatBytes(available)
            << " available (below " << FormatBytes(options_.host_low_memory_bytes)
            << "); unmapping " << FormatBytes(stats_.cached_bytes) << " of cached device blocks";
  ReleaseCacheLocked();
  stats_.pressure_releases += 1;
}

}  // namespace ps::memory_internal
