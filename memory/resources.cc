#include "memory/resources.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {
namespace {

// Requests above this are refused outright, so that rounding can never overflow.
constexpr int64_t kMaxRequestBytes = int64_t{1} << 60;

std::string PointerString(const void* ptr) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)));
}

}  // namespace

// --- ProviderResource ---------------------------------------------------------------------------

ProviderResource::ProviderResource(Device device, std::string name,
                                   std::optional<int64_t> capacity_bytes)
    : device_(device), name_(std::move(name)), capacity_bytes_(capacity_bytes) {
  CHECK(!capacity_bytes_.has_value() || *capacity_bytes_ > 0)
      << name_ << ": capacity_bytes must be positive, got " << *capacity_bytes_;
}

ProviderResource::~ProviderResource() {
  MutexLock lock(&mu_);
  DCHECK(live_.empty()) << name_ << ": a subclass destructor did not call FreeAllLiveAllocations()";
}

std::optional<int64_t> ProviderResource::effective_capacity_bytes() const {
  const std::optional<int64_t> provider = ProviderCapacityBytes();
  if (!capacity_bytes_.has_value()) return provider;
  if (!provider.has_value()) return capacity_bytes_;
  return std::min(*capacity_bytes_, *provider);
}

int64_t ProviderResource::in_use_bytes() const {
  MutexLock lock(&mu_);
  return stats_.in_use_bytes;
}

ProviderResourceStats ProviderResource::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void ProviderResource::ResetPeakStats() {
  MutexLock lock(&mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

void ProviderResource::AddReclaimer(Reclaimer* reclaimer, std::string name) {
  CHECK(reclaimer != nullptr);
  MutexLock lock(&reclaimers_mu_);
  for (const auto& [r, unused_name] : reclaimers_) {
    CHECK(r != reclaimer) << name_ << ": reclaimer " << name << " is already registered";
  }
  reclaimers_.emplace_back(reclaimer, std::move(name));
}

void ProviderResource::RemoveReclaimer(Reclaimer* reclaimer) {
  MutexLock lock(&reclaimers_mu_);
  reclaimers_.erase(
      std::remove_if(reclaimers_.begin(), reclaimers_.end(),
                     [reclaimer](const auto& entry) { return entry.first == reclaimer; }),
      reclaimers_.end());
  // A round that copied the list before the erase may still be calling `reclaimer`.
  reclaimers_mu_.Await([this]()
                           ABSL_NO_THREAD_SAFETY_ANALYSIS { return active_reclaim_rounds_ == 0; });
}

bool ProviderResource::TryReserve(int64_t rounded_bytes) {
  MutexLock lock(&mu_);
  if (capacity_bytes_.has_value() && stats_.in_use_bytes + rounded_bytes > *capacity_bytes_) {
    return false;
  }
  stats_.in_use_bytes += rounded_bytes;
  return true;
}

absl::StatusOr<void*> ProviderResource::TryAllocate(int64_t bytes, int64_t rounded_bytes) {
  if (!TryReserve(rounded_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the ", FormatBytes(*capacity_bytes_), " cap of ", name_, " is reached"));
  }
  absl::StatusOr<void*> ptr = ProviderAllocate(rounded_bytes);
  if (ptr.ok() && *ptr == nullptr) {
    ptr = absl::InternalError(absl::StrCat(name_, ": the provider returned a null pointer"));
  }
  MutexLock lock(&mu_);
  if (!ptr.ok()) {
    stats_.in_use_bytes -= rounded_bytes;
    return ptr.status();
  }
  DCHECK_EQ(reinterpret_cast<uintptr_t>(*ptr) % kAllocationAlignment, 0u)
      << name_ << ": the provider returned a misaligned pointer";
  const bool inserted = live_.emplace(*ptr, bytes).second;
  CHECK(inserted) << name_ << ": the provider returned " << *ptr << ", which is already live";
  ++stats_.live_allocations;
  ++stats_.total_allocations;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return *ptr;
}

absl::StatusOr<void*> ProviderResource::Allocate(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": cannot allocate ", bytes, " bytes; an allocation must be at least 1 byte"));
  }
  if (bytes > kMaxRequestBytes) {
    {
      MutexLock lock(&mu_);
      ++stats_.failed_allocations;
    }
    return absl::ResourceExhaustedError(
        OutOfMemoryMessage(bytes, ReclaimResult{},
                           absl::ResourceExhaustedError("the request is larger than any device")));
  }
  const int64_t rounded_bytes = AlignUp(bytes, kAllocationAlignment);
  absl::StatusOr<void*> ptr = TryAllocate(bytes, rounded_bytes);
  if (ptr.ok() || !absl::IsResourceExhausted(ptr.status())) return ptr;

  // Out of memory: the pools above may be sitting on cached memory. Ask them for it in order of
  // registration, retrying after each one that released something, so that later (costlier)
  // reclaimers run only when the earlier ones did not free enough.
  bool done = false;
  const ReclaimResult reclaimed = RunReclaimers([&] {
    ptr = TryAllocate(bytes, rounded_bytes);
    done = ptr.ok() || !absl::IsResourceExhausted(ptr.status());
    return done;
  });
  if (done) return ptr;
  {
    MutexLock lock(&mu_);
    ++stats_.failed_allocations;
  }
  return absl::ResourceExhaustedError(OutOfMemoryMessage(bytes, reclaimed, ptr.status()));
}

absl::Status ProviderResource::Deallocate(void* ptr, int64_t bytes) {
  MutexLock lock(&mu_);
  const auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": Deallocate(", PointerString(ptr), ", ", bytes,
        " bytes): not a live allocation of this resource (it belongs to another resource or was "
        "freed already)"));
  }
  if (it->second != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": Deallocate(", PointerString(ptr), ", ", bytes, " bytes): it was allocated with ",
        it->second, " bytes; pass the size given to Allocate"));
  }
  RETURN_IF_ERROR(ProviderFree(ptr));
  stats_.in_use_bytes -= AlignUp(it->second, kAllocationAlignment);
  --stats_.live_allocations;
  live_.erase(it);
  return absl::OkStatus();
}

ProviderResource::ReclaimResult ProviderResource::RunReclaimers(
    const std::function<bool()>& retry) {
  // Run the reclaimers over a copy of the list, without the lock: they call back into
  // Deallocate, and may take their own locks.
  std::vector<std::pair<Reclaimer*, std::string>> reclaimers;
  {
    MutexLock lock(&reclaimers_mu_);
    reclaimers = reclaimers_;
    ++active_reclaim_rounds_;
  }
  ReclaimResult result;
  for (const auto& [reclaimer, name] : reclaimers) {
    const int64_t released_bytes = reclaimer->ReleaseCached();
    result.released_bytes_by_name.emplace_back(name, released_bytes);
    result.total_bytes += released_bytes;
    if (released_bytes > 0 && retry()) break;
  }
  {
    MutexLock lock(&reclaimers_mu_);
    --active_reclaim_rounds_;
  }
  VLOG(1) << name_ << ": reclaimers released " << FormatBytes(result.total_bytes);
  MutexLock lock(&mu_);
  ++stats_.reclaim_rounds;
  stats_.reclaimed_bytes += result.total_bytes;
  return result;
}

std::string ProviderResource::OutOfMemoryMessage(int64_t bytes, const ReclaimResult& reclaimed,
                                                 const absl::Status& last_error) const {
  int64_t in_use_bytes;
  {
    MutexLock lock(&mu_);
    in_use_bytes = stats_.in_use_bytes;
  }
  std::string message =
      absl::StrCat(device_.ToString(), ": out of memory: ", name_, " cannot allocate ",
                   FormatBytes(bytes), " (", bytes, " bytes); ", FormatBytes(in_use_bytes));
  const std::optional<int64_t> capacity_bytes = effective_capacity_bytes();
  if (capacity_bytes.has_value()) {
    absl::StrAppend(&message, " of its ", FormatBytes(*capacity_bytes), " capacity is in use");
  } else {
    absl::StrAppend(&message, " is in use and the provider has no more");
  }
  const std::string usage = ProviderUsage();
  if (!usage.empty()) absl::StrAppend(&message, " (", usage, ")");
  if (reclaimed.released_bytes_by_name.empty()) {
    absl::StrAppend(&message, "; no pool holds memory cached for this resource");
  } else {
    absl::StrAppend(
        &message, "; before retrying, the pools released the memory they held cached: ",
        absl::StrJoin(reclaimed.released_bytes_by_name, ", ",
                      [](std::string* out, const std::pair<std::string, int64_t>& entry) {
                        absl::StrAppend(out, entry.first, " ", FormatBytes(entry.second));
                      }));
  }
  absl::StrAppend(&message, "; last refusal: ", absl::StripSuffix(last_error.message(), "."), ". ",
                  OutOfMemoryAdvice());
  return message;
}

void ProviderResource::FreeAllLiveAllocations() {
  absl::flat_hash_map<void*, int64_t> live;
  {
    MutexLock lock(&mu_);
    live.swap(live_);
    stats_.in_use_bytes = 0;
    stats_.live_allocations = 0;
  }
  if (!live.empty()) {
    LOG(WARNING) << name_ << " destroyed with " << live.size()
                 << " allocations still live; freeing them";
  }
  for (const auto& [ptr, bytes] : live) {
    const absl::Status status = ProviderFree(ptr);
    LOG_IF(ERROR, !status.ok()) << name_ << ": freeing " << ptr << " at destruction: " << status;
  }
}

// --- HostResource -------------------------------------------------------------------------------

HostResource::HostResource(std::optional<int64_t> capacity_bytes)
    : ProviderResource(Device::Host(), "host_resource(host)", capacity_bytes) {}

HostResource::~HostResource() { FreeAllLiveAllocations(); }

absl::StatusOr<void*> HostResource::ProviderAllocate(int64_t bytes) {
  // Large blocks (chunk payloads) start on a page, so the disk tier can read and write them with
  // O_DIRECT (disk/file_chunk_swap.h), which needs 4096-byte alignment; glibc's mmapped blocks
  // are otherwise only 16 bytes past a page. Their size is rounded up to whole pages, as
  // aligned_alloc asks (< 1/16 more for blocks of 64 KiB and up).
  constexpr int64_t kPageAlignedFromBytes = 64 << 10;
  constexpr int64_t kPageBytes = 4096;
  static_assert(kPageBytes % kAllocationAlignment == 0);
  void* ptr = bytes >= kPageAlignedFromBytes
                  ? std::aligned_alloc(kPageBytes, static_cast<size_t>((bytes + kPageBytes - 1) /
                                                                       kPageBytes * kPageBytes))
                  : std::aligned_alloc(kAllocationAlignment, static_cast<size_t>(bytes));
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the C++ heap has no ", FormatBytes(bytes), " block left"));
  }
  return ptr;
}

absl::Status HostResource::ProviderFree(void* ptr) {
  std::free(ptr);
  return absl::OkStatus();
}

std::string HostResource::OutOfMemoryAdvice() const {
  return "Raise the host memory cap (DeviceMemoryOptions.capacity_bytes) or make the model, the "
         "chunks or the batch smaller";
}

// --- PinnedHostResource -------------------------------------------------------------------------

PinnedHostResource::PinnedHostResource(Backend* backend, std::optional<int64_t> capacity_bytes)
    : ProviderResource(Device::Host(), "pinned_host_resource(host)", capacity_bytes),
      backend_(backend) {
  CHECK(backend_ != nullptr) << "PinnedHostResource needs a backend";
}

PinnedHostResource::~PinnedHostResource() { FreeAllLiveAllocations(); }

absl::StatusOr<void*> PinnedHostResource::ProviderAllocate(int64_t bytes) {
  return backend_->AllocatePinnedHost(bytes);
}

absl::Status PinnedHostResource::ProviderFree(void* ptr) { return backend_->FreePinnedHost(ptr); }

std::string PinnedHostResource::OutOfMemoryAdvice() const {
  return "Raise the pinned host memory cap (DeviceMemoryOptions.capacity_bytes), make the model, "
         "the chunks or the batch smaller, or use pageable host memory "
         "(DeviceMemoryOptions.pinned = false)";
}

// --- BackendDeviceResource ----------------------------------------------------------------------

BackendDeviceResource::BackendDeviceResource(Backend* backend,
                                             std::optional<int64_t> capacity_bytes)
    : ProviderResource(
          backend != nullptr ? backend->device() : Device::Host(),
          absl::StrCat("backend_device_resource(",
                       backend != nullptr ? backend->device().ToString() : "null", ")"),
          capacity_bytes),
      backend_(backend) {
  CHECK(backend_ != nullptr) << "BackendDeviceResource needs a backend";
}

BackendDeviceResource::~BackendDeviceResource() { FreeAllLiveAllocations(); }

absl::StatusOr<void*> BackendDeviceResource::ProviderAllocate(int64_t bytes) {
  return backend_->AllocateDevice(bytes);
}

absl::Status BackendDeviceResource::ProviderFree(void* ptr) { return backend_->FreeDevice(ptr); }

std::optional<int64_t> BackendDeviceResource::ProviderCapacityBytes() const {
  return backend_->capacity_bytes();
}

std::string BackendDeviceResource::ProviderUsage() const {
  return absl::StrCat("the ", backend_->name(), " backend has ",
                      FormatBytes(backend_->allocated_bytes()), " of ",
                      FormatBytes(backend_->capacity_bytes()), " allocated");
}

std::string BackendDeviceResource::OutOfMemoryAdvice() const {
  return "Make the batch or the chunks smaller, enable activation checkpointing, or raise the "
         "accelerator's memory budget (DeviceMemoryOptions.capacity_bytes; for the emulated "
         "accelerator, CpuBackendOptions.capacity_bytes)";
}

// --- TrackingResource ---------------------------------------------------------------------------

TrackingResource::TrackingResource(MemoryResource* upstream, MemoryTracker* tracker,
                                   MemoryKind kind)
    : upstream_(upstream), tracker_(tracker), kind_(kind) {
  CHECK(upstream_ != nullptr) << "TrackingResource needs an upstream resource";
  CHECK(tracker_ != nullptr) << "TrackingResource needs a tracker";
  CHECK(tracker_->device() == upstream_->device())
      << "TrackingResource: the tracker accounts " << tracker_->device() << " but "
      << upstream_->name() << " allocates on " << upstream_->device();
}

absl::StatusOr<void*> TrackingResource::Allocate(int64_t bytes) {
  ASSIGN_OR_RETURN(void* ptr, upstream_->Allocate(bytes));
  tracker_->Add(kind_, AlignUp(bytes, kAllocationAlignment));
  return ptr;
}

absl::Status TrackingResource::Deallocate(void* ptr, int64_t bytes) {
  RETURN_IF_ERROR(upstream_->Deallocate(ptr, bytes));
  tracker_->Subtract(kind_, AlignUp(bytes, kAllocationAlignment));
  return absl::OkStatus();
}

std::string TrackingResource::name() const {
  return absl::StrCat("tracking(", MemoryKindName(kind_), ", ", upstream_->name(), ")");
}

}  // namespace ps
