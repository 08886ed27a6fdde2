#include "comm/internal/completion.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::comm_internal {

absl::Status Completion::Wait(absl::Duration timeout, absl::string_view hint) {
  MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; }, timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(description_, " did not complete within ",
                                                    absl::FormatDuration(timeout), hint));
  }
  return status_;
}

std::unique_ptr<CommRequest> CompletedRequest(std::string description, absl::Status status) {
  auto completion = std::make_shared<Completion>(std::move(description));
  completion->Complete(std::move(status));
  return std::make_unique<CompletionRequest>(std::move(completion), "");
}

}  // namespace ps::comm_internal
