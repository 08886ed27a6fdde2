// Test-only MemoryResources for the chunk tests: small, single-threaded, with exact counters and
// strict checks, independent of the production resources in memory/resources.h (which the chunk
// layer is also tested over, in chunk_memory_integration_test):
//  - TestHostResource: host memory from aligned_alloc, under an optional byte cap, counting
//    live bytes and allocations, and checking every Deallocate against its own records.
//  - TestDeviceResource: accelerator memory straight from Backend::AllocateDevice (the cpu
//    backend's emulated accelerator in tests), with the same cap and checks.
// Both follow the MemoryResource contract (memory/memory_resource.h): ResourceExhausted naming
// the device, request, cap and use; InvalidArgument for foreign pointers or size mismatches.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_CHUNK_TESTING_TEST_MEMORY_RESOURCES_H_
#define PATRICKSTAR_CHUNK_TESTING_TEST_MEMORY_RESOURCES_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/backend.h"
#include "memory/device.h"
#include "memory/memory_resource.h"

namespace ps {

// Shared bookkeeping: cap, live allocations, counters.
class TestResourceBase : public MemoryResource {
 public:
  // capacity_bytes <= 0 means unlimited.
  TestResourceBase(Device device, std::string name, int64_t capacity_bytes)
      : device_(device), name_(std::move(name)), capacity_bytes_(capacity_bytes) {}
  ~TestResourceBase() override = default;

  absl::StatusOr<void*> Allocate(int64_t bytes) override;
  absl::Status Deallocate(void* ptr, int64_t bytes) override;
  Device device() const override { return device_; }
  std::string name() const override { return name_; }

  int64_t allocated_bytes() const { return allocated_bytes_; }
  int64_t live_allocations() const { return static_cast<int64_t>(live_.size()); }
  int64_t total_allocations() const { return total_allocations_; }
  int64_t peak_allocated_bytes() const { return peak_allocated_bytes_; }

 protected:
  virtual absl::StatusOr<void*> RawAllocate(int64_t bytes) = 0;
  virtual absl::Status RawFree(void* ptr) = 0;

 private:
  const Device device_;
  const std::string name_;
  const int64_t capacity_bytes_;
  absl::flat_hash_map<void*, int64_t> live_;
  int64_t allocated_bytes_ = 0;
  int64_t peak_allocated_bytes_ = 0;
  int64_t total_allocations_ = 0;
};

class TestHostResource final : public TestResourceBase {
 public:
  explicit TestHostResource(int64_t capacity_bytes = 0)
      : TestResourceBase(Device::Host(), "test_host_resource", capacity_bytes) {}
  ~TestHostResource() override;

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override;
  absl::Status RawFree(void* ptr) override;
};

class TestDeviceResource final : public TestResourceBase {
 public:
  // `backend` must outlive the resource.
  TestDeviceResource(Backend& backend, int64_t capacity_bytes = 0)
      : TestResourceBase(backend.device(),
                         "test_device_resource(" + backend.device().ToString() + ")",
                         capacity_bytes),
        backend_(backend) {}
  ~TestDeviceResource() override;

 protected:
  absl::StatusOr<void*> RawAllocate(int64_t bytes) override;
  absl::Status RawFree(void* ptr) override;

 private:
  Backend& backend_;
};

}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_TESTING_TEST_MEMORY_RESOURCES_H_
