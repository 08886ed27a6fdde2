// IoUringEngine: an IoEngine (disk/io_engine.h) on one io_uring (liburing) of queue_depth entries.
// Reads and writes are IORING_OP_READ / IORING_OP_WRITE at explicit offsets; the kernel reports
// each one's result, short transfers included, in its completion.
//
// Thread safety: as IoEngine (one submitting and reaping thread).
#ifndef PATRICKSTAR_DISK_IO_URING_ENGINE_H_
#define PATRICKSTAR_DISK_IO_URING_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "disk/io_engine.h"

namespace ps {

// Opens a ring of `queue_depth` (>= 1) entries. When the kernel or the container refuses
// (io_uring_queue_init fails: EPERM under a seccomp profile or kernel.io_uring_disabled, ENOSYS
// on old kernels, ENOMEM under a small RLIMIT_MEMLOCK), the error carries the errno's canonical
// code, and its message is the strerror text alone ("Operation not permitted").
[[nodiscard]] absl::StatusOr<std::unique_ptr<IoEngine>> NewIoUringEngine(int queue_depth);

}  // namespace ps

#endif  // PATRICKSTAR_DISK_IO_URING_ENGINE_H_
