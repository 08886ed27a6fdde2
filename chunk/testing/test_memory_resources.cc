#include "chunk/testing/test_memory_resources.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {

absl::StatusOr<void*> TestResourceBase::Allocate(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": allocation size must be positive, got ", bytes));
  }
  if (capacity_bytes_ > 0 && bytes > capacity_bytes_ - allocated_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, " on ", device_.ToString(), " is out of memory: requested ",
                     FormatBytes(bytes), " with ", FormatBytes(allocated_bytes_), " of its ",
                     FormatBytes(capacity_bytes_), " capacity in use"));
  }
  absl::StatusOr<void*> p = RawAllocate(bytes);
  if (!p.ok()) return p.status();
  live_.emplace(*p, bytes);
  allocated_bytes_ += bytes;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  ++total_allocations_;
  return *p;
}

absl::Status TestResourceBase::Deallocate(void* ptr, int64_t bytes) {
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": Deallocate of a pointer it does not own (double free?)"));
  }
  if (it->second != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": Deallocate with ", bytes,
                                                   " bytes of an allocation of ", it->second));
  }
  absl::Status s = RawFree(ptr);
  if (!s.ok()) return s;
  allocated_bytes_ -= bytes;
  live_.erase(it);
  return absl::OkStatus();
}

TestHostResource::~TestHostResource() {
  LOG_IF(ERROR, live_allocations() != 0)
      << name() << " destroyed with " << live_allocations() << " live allocations";
}

absl::StatusOr<void*> TestHostResource::RawAllocate(int64_t bytes) {
  void* p = std::aligned_alloc(kAllocationAlignment,
                               static_cast<size_t>(AlignUp(bytes, kAllocationAlignment)));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("aligned_alloc of ", FormatBytes(bytes), " failed"));
  }
  return p;
}

absl::Status TestHostResource::RawFree(void* ptr) {
  std::free(ptr);
  return absl::OkStatus();
}

TestDeviceResource::~TestDeviceResource() {
  LOG_IF(ERROR, live_allocations() != 0)
      << name() << " destroyed with " << live_allocations() << " live allocations";
}

absl::StatusOr<void*> TestDeviceResource::RawAllocate(int64_t bytes) {
  return backend_.AllocateDevice(bytes);
}

absl::Status TestDeviceResource::RawFree(void* ptr) { return backend_.FreeDevice(ptr); }

}  // namespace ps
