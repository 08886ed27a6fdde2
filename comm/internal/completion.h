// CompletionRequest: a CommRequest completed by someone else (the caller itself for `local`, the
// MPI progress thread for `mpi`). Internal to comm/.
#ifndef PATRICKSTAR_COMM_INTERNAL_COMPLETION_H_
#define PATRICKSTAR_COMM_INTERNAL_COMPLETION_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "comm/communicator.h"

namespace ps::comm_internal {

// The shared completion state of one collective. Thread-safe.
class Completion {
 public:
  explicit Completion(std::string description) : description_(std::move(description)) {}

  const std::string& description() const { return description_; }

  // Records the outcome and wakes waiters. Only the first call counts.
  void Complete(absl::Status status) {
    MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
  }
  bool Done() {
    MutexLock lock(&mu_);
    return done_;
  }
  absl::Status Wait() {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; });
    return status_;
  }
  // DeadlineExceeded naming the collective if not done within `timeout`.
  absl::Status Wait(absl::Duration timeout, absl::string_view hint);

 private:
  const std::string description_;
  Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A CommRequest over a shared Completion.
class CompletionRequest final : public CommRequest {
 public:
  // `timeout_hint` is appended to DeadlineExceeded messages (what may be wrong, what to do).
  CompletionRequest(std::shared_ptr<Completion> completion, std::string timeout_hint)
      : completion_(std::move(completion)), timeout_hint_(std::move(timeout_hint)) {}

  bool Done() override { return completion_->Done(); }
  absl::Status Wait() override { return completion_->Wait(); }
  absl::Status Wait(absl::Duration timeout) override {
    return completion_->Wait(timeout, timeout_hint_);
  }

 private:
  const std::shared_ptr<Completion> completion_;
  const std::string timeout_hint_;
};

// A request that is already complete with `status`.
std::unique_ptr<CommRequest> CompletedRequest(std::string description, absl::Status status);

}  // namespace ps::comm_internal

#endif  // PATRICKSTAR_COMM_INTERNAL_COMPLETION_H_
