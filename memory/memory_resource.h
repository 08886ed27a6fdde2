// MemoryResource: the one allocation interface of the memory layer.
//
// Modelled on rmm's device_memory_resource: small resources compose over an upstream resource
// (a pool over the backend's raw device memory, a tracking adaptor over a pool, ...). Every
// allocator of this project implements it, and one conformance suite
// (memory/testing/memory_resource_conformance.h) runs against each implementation.
//
// Contract for every implementation:
//  - Allocate(bytes) returns memory on device() of at least `bytes` bytes, aligned to
//    kAllocationAlignment, not overlapping any other live allocation of the resource.
//  - bytes <= 0 is InvalidArgument. Running out of memory is ResourceExhausted, and the message
//    names the device, the request, the capacity and the bytes in use — never an abort.
//  - Deallocate(ptr, bytes) takes back memory from a previous Allocate with the same `bytes`.
//    A pointer this resource does not own, or a second Deallocate, is InvalidArgument; the
//    resource's state is unchanged.
//  - Thread safety: implementations are thread-compatible unless their header says otherwise.
#ifndef PATRICKSTAR_MEMORY_MEMORY_RESOURCE_H_
#define PATRICKSTAR_MEMORY_MEMORY_RESOURCE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/device.h"

namespace ps {

// Every pointer handed out by a MemoryResource is aligned to this (as cudaMalloc's are).
inline constexpr int64_t kAllocationAlignment = 256;

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;

  [[nodiscard]] virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  [[nodiscard]] virtual absl::Status Deallocate(void* ptr, int64_t bytes) = 0;

  // The device the memory lives on.
  virtual Device device() const = 0;
  // A short name for messages and benchmarks ("caching_allocator(accelerator:0)").
  virtual std::string name() const = 0;
};

// Something that keeps memory it does not currently need (a cache of free blocks) and can hand it
// back to its upstream when another consumer of the same device runs short. The device-level
// resource asks its reclaimers before reporting ResourceExhausted.
class Reclaimer {
 public:
  virtual ~Reclaimer() = default;
  // Returns cached memory to the upstream; returns the number of bytes given back.
  virtual int64_t ReleaseCached() = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_MEMORY_RESOURCE_H_
