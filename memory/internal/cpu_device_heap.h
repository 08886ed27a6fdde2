// The emulated accelerator's device memory: host pages under the cpu backend's hard cap, the
// registry of live allocations, and the cache of freed blocks kept mapped for reuse. Internal to
// the cpu backend (memory/cpu_backend.cc); the semantics — CUDA's, a cap that counts live bytes
// only, the bound mapped <= highest live total, when the cache is emptied — are stated once, in
// memory/cpu_backend.h's file comment, and CpuBackendMemoryStats counts what happens here.
//
// Allocation order for a request rounded up to kAllocationAlignment: a cached block of exactly
// that size; else the front of the smallest larger cached block (the rest stays cached); else the
// largest smaller cached block grown in place (mremap); else fresh pages
// (memory/internal/page_allocation.h). Before growing or mapping, cached blocks are unmapped
// (largest first) so that live + cached never exceeds the highest live total so far.
//
// Thread safety: thread-safe; one internal mutex, never held while calling
// CpuBackendOptions::host_available_bytes.
#ifndef PATRICKSTAR_MEMORY_INTERNAL_CPU_DEVICE_HEAP_H_
#define PATRICKSTAR_MEMORY_INTERNAL_CPU_DEVICE_HEAP_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "memory/cpu_backend.h"
#include "memory/device.h"

namespace ps::memory_internal {

class CpuDeviceHeap {
 public:
  // REQUIRES: `options` validated by CreateCpuBackend (max_cached_bytes resolved).
  explicit CpuDeviceHeap(const CpuBackendOptions& options);

  CpuDeviceHeap(const CpuDeviceHeap&) = delete;
  CpuDeviceHeap& operator=(const CpuDeviceHeap&) = delete;

  Device device() const { return device_; }
  int64_t capacity_bytes() const { return options_.capacity_bytes; }

  // Backend::AllocateDevice: `bytes` rounded up to kAllocationAlignment, not zeroed.
  // InvalidArgument for a bad size, ResourceExhausted over the cap or when the host refuses.
  absl::StatusOr<void*> Allocate(int64_t bytes);

  // Backend::FreeDevice: the block is cached (poisoned under AddressSanitizer) within
  // max_cached_bytes, else unmapped; then the cache may be emptied if the host runs low.
  // InvalidArgument for a pointer that is not a live allocation.
  absl::Status Free(void* ptr);

  // Frees every live allocation (with a warning naming how many) and empties the cache. Called
  // once, by the backend's destructor; the registry of live allocations is left as it was.
  void FreeAllAtBackendDestruction();

  // OK if [ptr, ptr + bytes) lies inside one live allocation; InvalidArgument naming `what`.
  // REQUIRES: bytes >= 0.
  absl::Status CheckRange(const void* ptr, int64_t bytes, absl::string_view what) const;

  // Live bytes: what the cap counts (Backend::allocated_bytes).
  int64_t live_bytes() const;

  // The counters, live_bytes filled in.
  CpuBackendMemoryStats stats() const;

  // ReleaseCpuDeviceCache: empties the cache; returns the bytes unmapped (0, and not counted as
  // an explicit release, when it was empty).
  int64_t ReleaseCache();

 private:
  void* SplitCachedLocked(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void* GrowCachedLocked(int64_t bytes, int64_t cache_target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimCacheLocked(int64_t target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnmapLocked(void* p, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ReleaseCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckHostMemory() ABSL_LOCKS_EXCLUDED(mu_);

  const CpuBackendOptions options_;
  const Device device_;

  mutable Mutex mu_;
  // Live device allocations: start address -> rounded size in bytes.
  absl::btree_map<uintptr_t, int64_t> allocations_ ABSL_GUARDED_BY(mu_);
  int64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Freed device blocks kept mapped for reuse: rounded size -> start address. Not registered in
  // allocations_ (so no copy may target them) and poisoned under AddressSanitizer.
  absl::btree_multimap<int64_t, uintptr_t> cache_ ABSL_GUARDED_BY(mu_);
  CpuBackendMemoryStats stats_ ABSL_GUARDED_BY(mu_);
  // When the cache may next ask whether the host runs low.
  absl::Time next_host_memory_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ps::memory_internal

#endif  // PATRICKSTAR_MEMORY_INTERNAL_CPU_DEVICE_HEAP_H_
