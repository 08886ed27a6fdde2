// Backend: the accelerator as seen by every layer above memory/.
//
// A backend owns one accelerator's memory (allocations under a hard capacity cap), pinned host
// memory for fast transfers, and streams and events with CUDA's ordering semantics:
//  - work enqueued on one stream runs in enqueue order, asynchronously to the host;
//  - different streams run concurrently (copies overlap compute as DMA engines do);
//  - Stream::RecordEvent captures all work enqueued on that stream so far; the event completes
//    when that work has. Re-recording replaces what the event captures.
//  - Stream::WaitEvent makes later work on the waiting stream start only after the event's
//    captured work completes (an event never recorded is already complete). The wait is for the
//    record current at the WaitEvent call: once WaitEvent returned, re-recording (or destroying)
//    the event does not move it (cudaStreamWaitEvent's rule; the cpu backend keeps the record's
//    generation).
//
// Implementations:
//  - cpu  (memory/cpu_backend.h): the emulated accelerator. Device memory is host RAM under the
//         cap; each stream is a worker thread, so copies run on a copy-engine thread and really
//         overlap compute; an optional bandwidth cap makes host<->device copies take as long as
//         they would over a given link. It is a supported runtime for CPU-only training.
//  - cuda (memory/cuda/cuda_backend.h, --config=cuda): cudaMalloc, cudaMallocHost, CUDA streams
//         and events.
// Create one through CreateBackend() (memory/backend_factory.h).
//
// Errors: every method returns a Status; bad arguments are InvalidArgument, exhausted memory is
// ResourceExhausted naming the device, the request, the cap and the bytes in use. Asynchronous
// failures (CUDA) surface at the next Synchronize.
//
// Thread safety: Backend methods are thread-safe. A Stream or Event may be used from several
// threads, but callers must order their own enqueues if they care about the resulting order.
#ifndef PATRICKSTAR_MEMORY_BACKEND_H_
#define PATRICKSTAR_MEMORY_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "memory/device.h"

namespace ps {

enum class CopyKind : uint8_t {
  kHostToDevice = 0,
  kDeviceToHost = 1,
  kDeviceToDevice = 2,
  kHostToHost = 3,
};

absl::string_view CopyKindName(CopyKind kind);

class Event {
 public:
  virtual ~Event() = default;

  // True when the work captured by the latest RecordEvent has completed (true if never recorded).
  virtual bool Query() = 0;
  // Blocks the calling thread until Query() is true. Returns the error of failed captured work.
  [[nodiscard]] virtual absl::Status Synchronize() = 0;
};

class Stream {
 public:
  // Destroying a stream waits for its enqueued work to finish.
  virtual ~Stream() = default;

  // Enqueues a copy of `bytes` bytes. `kind` says which side is this backend's device memory;
  // device-side ranges must lie inside one live device allocation of this backend
  // (InvalidArgument otherwise, checked at enqueue where the backend can tell). Host buffers must
  // stay alive until the copy completes; pinned host memory makes copies truly asynchronous.
  [[nodiscard]] virtual absl::Status MemcpyAsync(void* dst, const void* src, int64_t bytes,
                                                 CopyKind kind) = 0;
  // Enqueues setting `bytes` bytes of device memory at `dst` to `value`.
  [[nodiscard]] virtual absl::Status MemsetAsync(void* dst, int value, int64_t bytes) = 0;
  // Enqueues `fn` to run on a host thread after all earlier work on this stream; later work
  // waits for it. This is how CPU kernels run in stream order. `fn` must not enqueue on or
  // synchronize this stream.
  [[nodiscard]] virtual absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&> fn) = 0;
  [[nodiscard]] virtual absl::Status RecordEvent(Event* event) = 0;
  [[nodiscard]] virtual absl::Status WaitEvent(Event* event) = 0;
  // Blocks until all work enqueued so far has completed.
  [[nodiscard]] virtual absl::Status Synchronize() = 0;
  // cudaStream_t for the cuda backend; nullptr for the cpu backend.
  virtual void* native_handle() = 0;
};

// Monotonic counters of a backend since creation.
struct BackendCounters {
  int64_t host_to_device_bytes = 0;
  int64_t device_to_host_bytes = 0;
  int64_t device_to_device_bytes = 0;
  int64_t device_allocations = 0;
  int64_t peak_device_allocated_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual absl::string_view name() const = 0;
  // The accelerator this backend drives.
  virtual Device device() const = 0;
  // The hard cap on device memory this backend hands out, in bytes.
  virtual int64_t capacity_bytes() const = 0;
  // Device bytes currently allocated (after rounding each request up to kAllocationAlignment).
  virtual int64_t allocated_bytes() const = 0;
  virtual BackendCounters counters() const = 0;

  // Raw device memory, aligned to kAllocationAlignment. Pools (memory/*_pool.h) sit above this;
  // the rest of the system never calls it directly.
  [[nodiscard]] virtual absl::StatusOr<void*> AllocateDevice(int64_t bytes) = 0;
  [[nodiscard]] virtual absl::Status FreeDevice(void* ptr) = 0;

  // Page-locked host memory (for the cpu backend: ordinary host memory, not counted against the
  // device cap).
  [[nodiscard]] virtual absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) = 0;
  [[nodiscard]] virtual absl::Status FreePinnedHost(void* ptr) = 0;

  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_BACKEND_H_
