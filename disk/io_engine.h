// IoEngine: the file-I/O seam under the disk tier's swap (disk/file_chunk_swap.h) and its
// bandwidth probe (disk/disk_probe.h). An engine carries positioned reads and writes of caller
// buffers and reports each one's raw result — the bytes moved or -errno — without retrying short
// transfers: continuing them is the caller's job, so that a fault-injecting engine
// (disk/testing/faulty_io_engine.h) can exercise exactly the paths a real disk takes.
//
// Two implementations:
//  - io_uring through liburing (disk/io_uring_engine.h): one ring of queue_depth entries, the
//    kernel carries the I/O;
//  - a pool of threads calling pread/pwrite (disk/thread_io_engine.h), for kernels and containers
//    that refuse io_uring (seccomp profiles, kernel.io_uring_disabled).
// OpenIoEngine() picks one (IoEngineKind) and says which, and why.
//
// Thread safety: one thread submits and reaps (the swap's I/O thread); Allocate() may be called
// from any thread. The buffers of a submitted request must stay valid until its completion is
// reaped.
#ifndef PATRICKSTAR_DISK_IO_ENGINE_H_
#define PATRICKSTAR_DISK_IO_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

// One positioned read or write: pread(fd, buffer, bytes, offset) or pwrite(...).
struct IoRequest {
  int fd = -1;
  int64_t offset = 0;
  void* buffer = nullptr;
  int64_t bytes = 0;
  bool write = false;
  // The caller's name for the request, returned with its completion.
  uint64_t tag = 0;
};

// The raw result of one request: bytes moved (possibly fewer than asked: a short transfer, or 0 at
// the end of the file) or -errno.
struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // Starts `requests`. REQUIRES: the requests in flight (submitted, completion not reaped) never
  // exceed the queue depth the engine was opened with. An error here means the engine itself
  // failed (the ring broke); per-request errors come back as completions.
  [[nodiscard]] virtual absl::Status Submit(absl::Span<const IoRequest> requests) = 0;
  // Appends completions to `out`: blocks until at least `min_completions` arrived (0: does not
  // block), then adds every other one already available. REQUIRES: min_completions <= requests in
  // flight.
  [[nodiscard]] virtual absl::Status Reap(int min_completions, std::vector<IoCompletion>* out) = 0;
  // fallocate(fd, 0, offset, bytes): 0 or -errno. Part of the seam so that ENOSPC can be injected.
  // Unlike Submit and Reap, it may be called from any thread, also while another one submits.
  virtual int Allocate(int fd, int64_t offset, int64_t bytes);
};

enum class IoEngineKind {
  kAuto,     // io_uring, else the thread pool (saying why)
  kIoUring,  // io_uring or an error naming the reason
  kThreads,  // the pread/pwrite thread pool
};

struct IoEngineOptions {
  IoEngineKind kind = IoEngineKind::kAuto;
  // Requests in flight at most (io_uring: the ring's entries). >= 1.
  int queue_depth = 8;
  // Threads of the pread/pwrite engine. >= 1.
  int thread_count = 1;
  // For tests: io_uring_queue_init is treated as if it returned -errno (e.g. EPERM) when non-zero.
  int io_uring_refusal_for_test = 0;
};

struct OpenedIoEngine {
  std::unique_ptr<IoEngine> engine;
  // "io_uring", "threads", or "threads (io_uring refused: Operation not permitted)".
  std::string description;
};

// Opens the engine `options.kind` asks for. kAuto falls back to the thread pool when the kernel
// refuses io_uring (any error of io_uring_queue_init) and says so in `description`; kIoUring
// refused is FailedPrecondition naming the reason. InvalidArgument for queue_depth or
// thread_count < 1.
[[nodiscard]] absl::StatusOr<OpenedIoEngine> OpenIoEngine(const IoEngineOptions& options);

}  // namespace ps

#endif  // PATRICKSTAR_DISK_IO_ENGINE_H_
