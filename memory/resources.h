// The bottom and the adaptors of a memory-resource stack (rmm-style composition).
//
// A device's memory is assembled from small resources, each over an upstream one:
//
//   BackendDeviceResource (the backend's raw device memory, optional budget below its capacity)
//     ├── ChunkBlockPool     (memory/chunk_block_pool.h: fixed-size chunk payloads, model data)
//     └── CachingAllocator   (memory/caching_allocator.h: variable-size non-model data)
//
// and the same on the host over PinnedHostResource or HostResource (memory/device_memory.h puts
// it together). This header holds the bottom layer and a generic adaptor:
//
//  - ProviderResource: the common base of the bottom layer. It takes memory from a provider (the
//    C++ heap or a Backend), enforces an optional hard cap, keeps a registry of live pointers so
//    that a foreign pointer or a double free is InvalidArgument, and runs the *reclaimers*: pools
//    above it keep freed memory cached, so when the provider (or the cap) says no, it asks the
//    registered Reclaimers, in order, to hand their cached memory back, retrying after each one
//    that did (so a costly reclaimer registered last, such as the ChunkManager evicting chunks,
//    runs only when the caches were not enough). Only then does it report ResourceExhausted, with a message that names the device, the request, the cap, the bytes in
//    use, what each pool released, and what to change. This is how the chunk pool gets memory the
//    caching allocator had cached, and vice versa.
//  - HostResource, PinnedHostResource, BackendDeviceResource: the three providers.
//  - TrackingResource: forwards to an upstream and records the bytes in use in a MemoryTracker.
//
// Sizes: every allocation is accounted as its request rounded up to kAllocationAlignment, which is
// also what the cpu backend charges against its capacity.
//
// Thread safety: every class in this header is thread-safe (TrackingResource as far as its upstream
// is).
#ifndef PATRICKSTAR_MEMORY_RESOURCES_H_
#define PATRICKSTAR_MEMORY_RESOURCES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/memory_resource.h"
#include "memory/memory_tracker.h"

namespace ps {

// Counters of a ProviderResource. All byte values count requests rounded up to
// kAllocationAlignment.
struct ProviderResourceStats {
  int64_t in_use_bytes = 0;
  int64_t peak_in_use_bytes = 0;
  // Live allocations now, and successful Allocate calls since construction.
  int64_t live_allocations = 0;
  int64_t total_allocations = 0;
  // How many times the reclaimers were asked to release their caches, and how much they gave back.
  int64_t reclaim_rounds = 0;
  int64_t reclaimed_bytes = 0;
  // Allocate calls that ended in ResourceExhausted.
  int64_t failed_allocations = 0;
};

// Base of the resources at the bottom of a stack. See the file comment.
//
// Subclasses implement the provider calls; this class does everything else. Subclass destructors
// must call FreeAllLiveAllocations() (the base destructor cannot reach the provider).
class ProviderResource : public MemoryResource {
 public:
  ProviderResource(const ProviderResource&) = delete;
  ProviderResource& operator=(const ProviderResource&) = delete;
  ~ProviderResource() override;

  // MemoryResource. Allocate returns InvalidArgument for bytes <= 0; ResourceExhausted when the
  // cap or the provider refuses even after the reclaimers released their caches. Deallocate returns
  // InvalidArgument, leaving every state unchanged, for a pointer that is not a live allocation of
  // this resource or a `bytes` different from the one it was allocated with.
  [[nodiscard]] absl::StatusOr<void*> Allocate(int64_t bytes) final;
  [[nodiscard]] absl::Status Deallocate(void* ptr, int64_t bytes) final;
  Device device() const final { return device_; }
  std::string name() const final { return name_; }

  // Registers `reclaimer` to be asked for its cached memory when an allocation fails; `name` is how
  // out-of-memory messages refer to it ("chunk_block_pool(accelerator:0)").
  // REQUIRES: `reclaimer` is not registered yet and outlives its registration. Its ReleaseCached()
  // may call Deallocate on this resource (that is its point) but must not call Allocate,
  // AddReclaimer or RemoveReclaimer on it.
  void AddReclaimer(Reclaimer* reclaimer, std::string name);
  // Unregisters `reclaimer` and waits for reclaim rounds in progress to finish, so the reclaimer
  // may be destroyed once this returns. No-op if it is not registered.
  // REQUIRES: not called from inside a ReleaseCached() of this resource's reclaimers.
  void RemoveReclaimer(Reclaimer* reclaimer);

  // The hard cap this resource enforces itself, if any (the provider may have its own, see
  // effective_capacity_bytes()).
  std::optional<int64_t> capacity_bytes() const { return capacity_bytes_; }
  // The tighter of capacity_bytes() and the provider's own capacity; nullopt when neither exists.
  std::optional<int64_t> effective_capacity_bytes() const;

  int64_t in_use_bytes() const;
  ProviderResourceStats stats() const;
  // Sets peak_in_use_bytes to the current in_use_bytes.
  void ResetPeakStats();

 protected:
  // REQUIRES: capacity_bytes, when set, is > 0 (CHECK-fails otherwise; callers validate options).
  ProviderResource(Device device, std::string name, std::optional<int64_t> capacity_bytes);

  // Obtains `bytes` bytes (already rounded up to kAllocationAlignment) from the provider, aligned
  // to kAllocationAlignment. Returns ResourceExhausted when the provider has no memory, which makes
  // the caller reclaim and retry. Called without any lock of this class held.
  [[nodiscard]] virtual absl::StatusOr<void*> ProviderAllocate(int64_t bytes) = 0;
  // Returns memory obtained from ProviderAllocate. Called with this class's lock held (so that
  // a failed free leaves the registry untouched); must not call back into this resource.
  [[nodiscard]] virtual absl::Status ProviderFree(void* ptr) = 0;
  // The provider's own capacity, if it has one.
  virtual std::optional<int64_t> ProviderCapacityBytes() const { return std::nullopt; }
  // Extra facts for out-of-memory messages ("the backend has 1.5 GiB of 2 GiB allocated"); may
  // be empty.
  virtual std::string ProviderUsage() const { return ""; }
  // What a person can change to avoid running out of this memory.
  virtual std::string OutOfMemoryAdvice() const = 0;

  // Returns every live allocation to the provider (logging a warning if there are any: someone is
  // destroying a resource whose memory is still in use). Subclass destructors call this.
  void FreeAllLiveAllocations();

 private:
  struct ReclaimResult {
    std::vector<std::pair<std::string, int64_t>> released_bytes_by_name;
    int64_t total_bytes = 0;
  };

  // Reserves `rounded_bytes` against the cap. Returns false if the cap would be exceeded.
  bool TryReserve(int64_t rounded_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // One attempt: reserve, call the provider, register. Returns ResourceExhausted for a cap or
  // provider refusal (with the provider's message), other errors as they come.
  absl::StatusOr<void*> TryAllocate(int64_t bytes, int64_t rounded_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the reclaimers in order; after each that released memory, calls `retry` and stops when
  // it returns true.
  ReclaimResult RunReclaimers(const std::function<bool()>& retry)
      ABSL_LOCKS_EXCLUDED(mu_, reclaimers_mu_);
  std::string OutOfMemoryMessage(int64_t bytes, const ReclaimResult& reclaimed,
                                 const absl::Status& last_error) const;

  const Device device_;
  const std::string name_;
  const std::optional<int64_t> capacity_bytes_;

  mutable Mutex mu_;
  // Live allocations: pointer -> requested bytes.
  absl::flat_hash_map<void*, int64_t> live_ ABSL_GUARDED_BY(mu_);
  ProviderResourceStats stats_ ABSL_GUARDED_BY(mu_);

  // The registered reclaimers, and how many reclaim rounds are running over a copy of the list
  // (RemoveReclaimer waits for those to finish). Never held while a reclaimer runs.
  mutable Mutex reclaimers_mu_;
  std::vector<std::pair<Reclaimer*, std::string>> reclaimers_ ABSL_GUARDED_BY(reclaimers_mu_);
  int active_reclaim_rounds_ ABSL_GUARDED_BY(reclaimers_mu_) = 0;
};

// Host memory from the C++ heap (std::aligned_alloc), optionally under a hard cap.
class HostResource final : public ProviderResource {
 public:
  // REQUIRES: capacity_bytes, when set, is > 0.
  explicit HostResource(std::optional<int64_t> capacity_bytes = std::nullopt);
  ~HostResource() override;

 private:
  absl::StatusOr<void*> ProviderAllocate(int64_t bytes) override;
  absl::Status ProviderFree(void* ptr) override;
  std::string OutOfMemoryAdvice() const override;
};

// Page-locked host memory from a Backend (fast, truly asynchronous copies), optionally under a cap.
class PinnedHostResource final : public ProviderResource {
 public:
  // `backend` is not owned and must outlive this resource.
  // REQUIRES: backend != nullptr; capacity_bytes, when set, is > 0.
  explicit PinnedHostResource(Backend* backend,
                              std::optional<int64_t> capacity_bytes = std::nullopt);
  ~PinnedHostResource() override;

 private:
  absl::StatusOr<void*> ProviderAllocate(int64_t bytes) override;
  absl::Status ProviderFree(void* ptr) override;
  std::string OutOfMemoryAdvice() const override;

  Backend* const backend_;
};

// The raw device memory of a Backend, optionally under a budget below the backend's capacity
// (PatrickStar's overall_gpu_mem_ratio: the share of the accelerator this process may use).
class BackendDeviceResource final : public ProviderResource {
 public:
  // `backend` is not owned and must outlive this resource.
  // REQUIRES: backend != nullptr; capacity_bytes, when set, is > 0.
  explicit BackendDeviceResource(Backend* backend,
                                 std::optional<int64_t> capacity_bytes = std::nullopt);
  ~BackendDeviceResource() override;

  Backend* backend() const { return backend_; }

 private:
  absl::StatusOr<void*> ProviderAllocate(int64_t bytes) override;
  absl::Status ProviderFree(void* ptr) override;
  std::optional<int64_t> ProviderCapacityBytes() const override;
  std::string ProviderUsage() const override;
  std::string OutOfMemoryAdvice() const override;

  Backend* const backend_;
};

// Forwards to `upstream` and records, in `tracker`, the bytes in use (each request rounded up to
// kAllocationAlignment) as `kind`. Failed calls record nothing.
//
// Thread safety: as thread-safe as `upstream`. Under concurrent use the tracker may briefly count
// an allocation that another thread has already returned upstream (the subtraction follows the
// upstream Deallocate), never less than what is truly live.
class TrackingResource final : public MemoryResource {
 public:
  // Neither pointer is owned; both must outlive this resource.
  // REQUIRES: both non-null; tracker->device() == upstream->device().
  TrackingResource(MemoryResource* upstream, MemoryTracker* tracker, MemoryKind kind);

  [[nodiscard]] absl::StatusOr<void*> Allocate(int64_t bytes) override;
  [[nodiscard]] absl::Status Deallocate(void* ptr, int64_t bytes) override;
  Device device() const override { return upstream_->device(); }
  std::string name() const override;

  MemoryResource* upstream() const { return upstream_; }
  MemoryKind kind() const { return kind_; }

 private:
  MemoryResource* const upstream_;
  MemoryTracker* const tracker_;
  const MemoryKind kind_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_RESOURCES_H_
