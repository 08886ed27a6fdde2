// The emulated accelerator: a Backend whose device memory is host RAM under a hard cap.
//
// It exists so that every layer above memory/ runs, and is tested, on machines without a GPU, and
// it is a supported runtime for CPU-only training — not a test double:
//  - Device memory: aligned host allocations, at most `capacity_bytes` in total (requests rounded
//    up to kAllocationAlignment). Over the cap is ResourceExhausted; nothing is over-committed.
//    Every live allocation is registered, so copies and memsets into device memory are checked
//    against it at enqueue time (InvalidArgument for a range outside any live allocation).
//  - Mapped blocks are kept for reuse, as CUDA's caching allocator keeps cudaMalloc'd blocks:
//    FreeDevice puts a block in a cache instead of unmapping it, and AllocateDevice takes a block
//    of that size back without a system call or a single page fault; failing that it cuts the
//    front off the smallest larger block (the rest stays cached) or grows the largest smaller one
//    with mremap (its pages stay; only the new tail faults in). Once
//    every chunk load mapped fresh pages that the kernel zeroed one fault at a time (1B bf16 at
//    its minimum cap: more system time than user time). Semantics are CUDA's: memory from
//    AllocateDevice holds whatever it held (it is not zeroed); the cap counts live bytes only,
//    exactly as without the cache; a cached block is not a live allocation, so copies into it
//    are refused until it is allocated again, and under AddressSanitizer it is poisoned, so a
//    use after FreeDevice is still reported. The cache never makes the backend hold more host
//    memory than its highest live total so far (mapped = live + cached <= that peak <= the cap):
//    a miss that would exceed it unmaps cached blocks first (largest first). It is emptied when
//    the host runs low (CpuBackendOptions::host_low_memory_bytes, checked at most every
//    host_memory_check_interval while the cache grows), when mapping fails (and the mapping is
//    retried), by ReleaseCpuDeviceCache, and at destruction. CpuBackendMemoryStats counts it all.
//  - Streams: each stream is a worker thread running its queue in order. A copy on a copy stream
//    really overlaps computation on a compute stream, as a DMA engine would.
//  - Link emulation: with `copy_bandwidth_bytes_per_s > 0`, every host<->device copy takes at
//    least bytes / bandwidth seconds, and copies in one direction share that direction's link
//    (like the one copy engine per direction of a PCIe GPU), so two concurrent host-to-device
//    copies take as long as their sum. Device-to-device and host-to-host copies are not capped.
//    The data moves at host speed first; the copy engine then sleeps out the remainder in slices
//    of kCpuLinkPollInterval, polling SetCpuLinkInterrupt's predicate, so a stop request ends the
//    emulation (and every copy completes at host speed from then on) within one slice, however
//    slow the link.
//
// Asynchronous errors: work enqueued with LaunchCheckedHostFunc (the CPU kernels of
// model/kernels/cpu_kernels.h) may fail while it runs, as a CUDA kernel may fault. The first such
// failure is kept by its stream and returned by every later Synchronize() of that stream, and by
// Event::Synchronize() of events recorded on it after the failure, as CUDA reports an
// asynchronous error at the next synchronization. Later work still runs (so events complete and
// nothing hangs), but the stream's results are unreliable from then on: create a new stream.
//
// Making the host run ahead (for tests): on a GPU the host enqueues far ahead of the device, so a
// missing wait (reading a buffer a queued kernel still writes, reusing a buffer a queued kernel
// still reads) produces wrong results. Here the worker threads usually keep up, which would hide
// such bugs. Two hooks make the host's lead deterministic:
//  - StallCpuStream(stream): work enqueued on `stream` from now on does not start until the stall
//    is released, or until the host next *waits* for this backend;
//  - CpuBackendOptions::stall_streams_until_host_waits: every stream behaves as if stalled
//    all the time — work starts only once the host has waited for the backend after enqueuing it.
// A host wait is Stream::Synchronize() or Event::Synchronize() on any stream or event of the
// backend (or the destruction of a stream): the host blocks, so a slow device would now catch up,
// and the wait may depend on the held work, so holding it longer would deadlock. Event::Query()
// is not a wait and releases nothing (a loop that only polls an event captured behind a stall
// spins until something else waits). Between two host waits, therefore, everything the host does
// happens before any held work runs: a bug that lets the host touch a buffer before the device is
// done with it shows up every time, not once in a thousand runs.
//
// Thread safety: thread-safe.
#ifndef PATRICKSTAR_MEMORY_CPU_BACKEND_H_
#define PATRICKSTAR_MEMORY_CPU_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "memory/backend.h"

namespace ps {

struct CpuBackendOptions {
  // Accelerator index reported by device().
  int device_index = 0;
  // Hard cap on device memory. Must be > 0.
  int64_t capacity_bytes = 0;
  // Emulated host<->device link bandwidth per direction; 0 means unlimited (plain memcpy speed).
  double copy_bandwidth_bytes_per_s = 0;
  // For tests: every stream holds its work until the host next waits for the backend (see the
  // file comment). Slower (no overlap between the host and the streams) but deterministic.
  bool stall_streams_until_host_waits = false;
  // The cache of freed device blocks (see the file comment). Most bytes it keeps; unset: bounded
  // only by the highest live total so far. 0 turns the cache off (every free unmaps). Must be
  // >= 0 when set. When unset, the environment variable PS_CPU_DEVICE_CACHE_BYTES (a byte count)
  // sets it for every cpu backend of the process: an escape hatch for a host short of memory, and
  // how benchmarks compare runs without the cache.
  std::optional<int64_t> max_cached_bytes = std::nullopt;
  // Host-memory pressure: while the cache grows, at most once per host_memory_check_interval,
  // the backend asks `host_available_bytes` what the host can still give (default: empty, which
  // reads ReadHostMemoryInfo().available_bytes(), memory/host_memory_info.h) and empties the
  // cache when the answer is below host_low_memory_bytes. A negative answer (unknown) never
  // empties it. Tests inject a function; it is called without the backend's locks held.
  int64_t host_low_memory_bytes = int64_t{512} << 20;
  absl::Duration host_memory_check_interval = absl::Milliseconds(200);
  std::function<int64_t()> host_available_bytes = nullptr;
};

// What the emulated accelerator's memory costs the host (see the file comment).
struct CpuBackendMemoryStats {
  int64_t live_bytes = 0;    // allocated, what the cap counts
  int64_t cached_bytes = 0;  // freed, kept mapped for reuse
  int64_t cached_blocks = 0;
  int64_t mapped_bytes = 0;       // live + cached: the host memory the device holds
  int64_t peak_mapped_bytes = 0;  // highest mapped_bytes since construction
  int64_t peak_live_bytes = 0;    // highest live_bytes since construction
  // Successful AllocateDevice calls and how many a cached block served (no mapping, no faults):
  // one of the same size, the front of a larger one (the rest stays cached), or a smaller one
  // grown in place (mremap: only the new tail faults in).
  int64_t allocations = 0;
  int64_t cache_hits = 0;
  int64_t split_reuses = 0;
  int64_t grow_reuses = 0;
  int64_t reuses() const { return cache_hits + split_reuses + grow_reuses; }
  // Blocks mapped from and unmapped back to the OS (pages of the host allocator).
  int64_t blocks_mapped = 0;
  int64_t blocks_unmapped = 0;
  // Cached blocks unmapped to stay within the bound on a miss, and caches emptied because the
  // host ran low (host_low_memory_bytes), mapping failed, or ReleaseCpuDeviceCache was called.
  int64_t bound_evictions = 0;
  int64_t pressure_releases = 0;
  int64_t explicit_releases = 0;
};

// The counters above for `backend`, a cpu backend; InvalidArgument for another backend.
absl::StatusOr<CpuBackendMemoryStats> GetCpuBackendMemoryStats(const Backend& backend);

// Unmaps every cached block of `backend`, a cpu backend, and returns the bytes given back to the
// OS; InvalidArgument for another backend. Live allocations are untouched.
absl::StatusOr<int64_t> ReleaseCpuDeviceCache(Backend& backend);

// Returns InvalidArgument for a non-positive capacity or a negative or non-finite bandwidth.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);

// How often a copy sleeping out its emulated link time polls the interrupt.
inline constexpr absl::Duration kCpuLinkPollInterval = absl::Milliseconds(10);

// Lets `interrupt` end the link emulation of `backend`, a cpu backend: copies sleeping out their
// emulated time call it every kCpuLinkPollInterval, and once it returns true the emulation ends
// for good — the sleeping copies complete at once and later copies run at host speed. Results
// never change (the bytes are copied before the sleep); only time does. For stop requests: a run
// throttled to a slow link still finishes its step and writes its checkpoint in seconds.
// `interrupt` is called on the copy-engine threads, so it must be thread-safe and cheap (an
// atomic load; trainer/io/signal_flag.h's StopRequested). Replaces an earlier predicate; an empty
// one never interrupts. InvalidArgument for a backend that is not a cpu backend.
[[nodiscard]] absl::Status SetCpuLinkInterrupt(Backend& backend, std::function<bool()> interrupt);

// Enqueues `fn` on `stream` like Stream::LaunchHostFunc; if `fn` returns an error when it runs, the
// stream keeps it (the first one) as its asynchronous error (see the file comment). `fn` must not
// enqueue on or synchronize `stream`. InvalidArgument, with nothing enqueued, for an empty `fn` or
// a stream not created by a cpu backend.
[[nodiscard]] absl::Status LaunchCheckedHostFunc(Stream& stream,
                                                 absl::AnyInvocable<absl::Status() &&> fn);

// OK if [ptr, ptr + bytes) lies inside one live device allocation of `backend`, a cpu backend;
// InvalidArgument naming `what` otherwise (also for a backend that is not a cpu backend).
// bytes == 0 checks only that ptr lies inside or at the end of a live allocation.
// The CPU kernels use it to refuse host memory where device memory is meant — on a GPU that
// would be a crash.
[[nodiscard]] absl::Status CheckCpuDeviceRange(const Backend& backend, const void* ptr,
                                               int64_t bytes, absl::string_view what);

// A stall of one cpu-backend stream (see the file comment): work enqueued on the stream after
// StallCpuStream() and before the stall ends does not start. The stall ends at Release(), at
// destruction, or at the backend's next host wait, whichever comes first; work enqueued after it
// ended is not held. Thread-safe; may outlive the stream and the backend.
class CpuStreamStall {
 public:
  virtual ~CpuStreamStall() = default;
  // Ends the stall and lets the held work run. Idempotent.
  virtual void Release() = 0;
  // True until the stall ended (Release, or a host wait of the backend).
  virtual bool active() const = 0;
};

// Stalls `stream`. InvalidArgument for a stream not created by a cpu backend; FailedPrecondition
// if the stream is already stalled by a live, active CpuStreamStall.
[[nodiscard]] absl::StatusOr<std::unique_ptr<CpuStreamStall>> StallCpuStream(Stream& stream);

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_CPU_BACKEND_H_
