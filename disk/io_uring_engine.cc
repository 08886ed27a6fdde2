#include "disk/io_uring_engine.h"

#include <liburing.h>
#include <string.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ps {
namespace {

class IoUringEngine final : public IoEngine {
 public:
  IoUringEngine() = default;
  ~IoUringEngine() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  // 0 or -errno.
  int Init(int queue_depth) {
    const int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth), &ring_, 0);
    initialized_ = rc == 0;
    return rc;
  }

  absl::Status Submit(absl::Span<const IoRequest> requests) override {
    for (const IoRequest& r : requests) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        // The ring is full of unsubmitted entries: hand them to the kernel and retry.
        if (absl::Status s = SubmitPending(); !s.ok()) return s;
        sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) {
          return absl::InternalError("io_uring: no submission entry free after io_uring_submit");
        }
      }
      if (r.write) {
        io_uring_prep_write(sqe, r.fd, r.buffer, static_cast<unsigned>(r.bytes),
                            static_cast<__u64>(r.offset));
      } else {
        io_uring_prep_read(sqe, r.fd, r.buffer, static_cast<unsigned>(r.bytes),
                           static_cast<__u64>(r.offset));
      }
      io_uring_sqe_set_data64(sqe, r.tag);
    }
    return SubmitPending();
  }

  absl::Status Reap(int min_completions, std::vector<IoCompletion>* out) override {
    int got = 0;
    while (true) {
      io_uring_cqe* cqe = nullptr;
      const int rc =
          got < min_completions ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
      if (rc == -EAGAIN || (rc == 0 && cqe == nullptr)) {
        if (got >= min_completions) return absl::OkStatus();
        continue;
      }
      if (rc == -EINTR) continue;
      if (rc < 0) {
        return absl::InternalError(
            absl::StrCat("io_uring: waiting for completions failed: ", ::strerror(-rc)));
      }
      out->push_back(IoCompletion{.tag = io_uring_cqe_get_data64(cqe), .result = cqe->res});
      io_uring_cqe_seen(&ring_, cqe);
      ++got;
    }
  }

 private:
  absl::Status SubmitPending() {
    while (true) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) return absl::OkStatus();
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      return absl::InternalError(
          absl::StrCat("io_uring: io_uring_submit failed: ", ::strerror(-rc)));
    }
  }

  io_uring ring_ = {};
  bool initialized_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> NewIoUringEngine(int queue_depth) {
  CHECK_GE(queue_depth, 1);
  auto engine = std::make_unique<IoUringEngine>();
  const int rc = engine->Init(queue_depth);
  if (rc < 0) {
    // The message is strerror alone: callers say "io_uring refused: <message>".
    return absl::Status(absl::ErrnoToStatus(-rc, "").code(), ::strerror(-rc));
  }
  return engine;
}

}  // namespace ps
