#include "disk/testing/counting_io_engine.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"

namespace ps {

CountingIoEngine::CountingIoEngine(std::unique_ptr<IoEngine> inner) : inner_(std::move(inner)) {
  CHECK(inner_ != nullptr);
}

absl::Status CountingIoEngine::Submit(absl::Span<const IoRequest> requests) {
  {
    MutexLock lock(&mu_);
    IoRecords& r = *records_;
    r.submissions.push_back(IoRecords::Submission{.requests = static_cast<int>(requests.size()),
                                                  .in_flight_before = r.in_flight});
    for (const IoRequest& q : requests) {
      r.requests.push_back(
          IoRecords::Request{.offset = q.offset, .bytes = q.bytes, .write = q.write});
    }
    r.in_flight += static_cast<int>(requests.size());
    r.max_in_flight = std::max(r.max_in_flight, r.in_flight);
  }
  return inner_->Submit(requests);
}

absl::Status CountingIoEngine::Reap(int min_completions, std::vector<IoCompletion>* out) {
  {
    MutexLock lock(&mu_);
    records_->reapings.push_back(
        IoRecords::Reaping{.min_completions = min_completions, .in_flight = records_->in_flight});
  }
  const size_t before = out->size();
  absl::Status status = inner_->Reap(min_completions, out);
  MutexLock lock(&mu_);
  records_->in_flight -= static_cast<int>(out->size() - before);
  return status;
}

int CountingIoEngine::Allocate(int fd, int64_t offset, int64_t bytes) {
  {
    MutexLock lock(&mu_);
    ++records_->allocate_calls;
  }
  return inner_->Allocate(fd, offset, bytes);
}

}  // namespace ps
