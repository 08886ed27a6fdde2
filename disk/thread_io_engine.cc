#include "disk/thread_io_engine.h"

#include <unistd.h>

#include <cerrno>
#include <deque>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "glog/logging.h"

namespace ps {
namespace {

class ThreadIoEngine final : public IoEngine {
 public:
  explicit ThreadIoEngine(int thread_count) {
    CHECK_GE(thread_count, 1);
    workers_.reserve(static_cast<size_t>(thread_count));
    for (int i = 0; i < thread_count; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~ThreadIoEngine() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  absl::Status Submit(absl::Span<const IoRequest> requests) override {
    MutexLock lock(&mu_);
    queue_.insert(queue_.end(), requests.begin(), requests.end());
    return absl::OkStatus();
  }

  absl::Status Reap(int min_completions, std::vector<IoCompletion>* out) override {
    MutexLock lock(&mu_);
    mu_.Await([&] { return static_cast<int>(done_.size()) >= min_completions; });
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

 private:
  static int64_t Run(const IoRequest& r) {
    while (true) {
      const ssize_t n = r.write ? ::pwrite(r.fd, r.buffer, static_cast<size_t>(r.bytes), r.offset)
                                : ::pread(r.fd, r.buffer, static_cast<size_t>(r.bytes), r.offset);
      if (n >= 0) return n;
      if (errno != EINTR) return -errno;
    }
  }

  void WorkerLoop() {
    while (true) {
      IoRequest request;
      {
        MutexLock lock(&mu_);
        mu_.Await([&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        request = queue_.front();
        queue_.pop_front();
      }
      const int64_t result = Run(request);
      MutexLock lock(&mu_);
      done_.push_back(IoCompletion{.tag = request.tag, .result = result});
    }
  }

  Mutex mu_;
  std::deque<IoRequest> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<IoCompletion> done_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> NewThreadIoEngine(int thread_count) {
  return std::make_unique<ThreadIoEngine>(thread_count);
}

}  // namespace ps
