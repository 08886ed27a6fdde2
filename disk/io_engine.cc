#include "disk/io_engine.h"

#include <fcntl.h>
#include <string.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "disk/io_uring_engine.h"
#include "disk/thread_io_engine.h"

namespace ps {

int IoEngine::Allocate(int fd, int64_t offset, int64_t bytes) {
  while (true) {
    if (::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0) return 0;
    if (errno != EINTR) return -errno;
  }
}

absl::StatusOr<OpenedIoEngine> OpenIoEngine(const IoEngineOptions& options) {
  if (options.queue_depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("aio.queue_depth must be at least 1, got ", options.queue_depth));
  }
  if (options.thread_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("aio.thread_count must be at least 1, got ", options.thread_count));
  }
  OpenedIoEngine opened;
  if (options.kind == IoEngineKind::kThreads) {
    opened.engine = NewThreadIoEngine(options.thread_count);
    opened.description = "threads";
    return opened;
  }
  // A refusal's message is the errno's strerror text alone (NewIoUringEngine's contract).
  const int refusal = options.io_uring_refusal_for_test;
  absl::StatusOr<std::unique_ptr<IoEngine>> ring =
      refusal != 0 ? absl::Status(absl::ErrnoToStatus(refusal, "").code(), ::strerror(refusal))
                   : NewIoUringEngine(options.queue_depth);
  if (ring.ok()) {
    opened.engine = *std::move(ring);
    opened.description = "io_uring";
    return opened;
  }
  const std::string reason(ring.status().message());
  if (options.kind == IoEngineKind::kIoUring) {
    return absl::FailedPreconditionError(absl::StrCat(
        "io_uring was asked for (engine io_uring) but the kernel refused it: ", reason,
        "; use the thread engine (pread/pwrite) or let the swap choose (engine auto)"));
  }
  opened.engine = NewThreadIoEngine(options.thread_count);
  opened.description = absl::StrCat("threads (io_uring refused: ", reason, ")");
  return opened;
}

}  // namespace ps
