// CountingIoEngine: an IoEngine (disk/io_engine.h) decorator that records what its caller asks of
// the engine, so a test can see DeepSpeed's `aio` knobs (disk/swap_options.h) at the I/O seam:
//  - every request passed down (its bytes, offset, direction): block_size splits a slot's I/O;
//  - every Submit call and how many requests it carried: single_submit submits one at a time;
//  - the requests in flight (submitted, completion not yet reaped) when each Submit starts and
//    their maximum: queue_depth bounds them;
//  - every Reap's min_completions beside the requests in flight then: overlap_events reaps one
//    completion at a time and refills, without it a whole batch is waited for.
// It changes nothing: requests and completions pass through as they are.
//
// Thread safety: as IoEngine. The record is shared with the test (records()), which reads it when
// no I/O is in flight (between Waits, or after the swap is destroyed).
#ifndef PATRICKSTAR_DISK_TESTING_COUNTING_IO_ENGINE_H_
#define PATRICKSTAR_DISK_TESTING_COUNTING_IO_ENGINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "base/mutex.h"
#include "disk/io_engine.h"

namespace ps {

struct IoRecords {
  struct Request {
    int64_t offset = 0;
    int64_t bytes = 0;
    bool write = false;
  };
  struct Submission {
    // Requests this Submit carried.
    int requests = 0;
    // Requests in flight just before it.
    int in_flight_before = 0;
  };
  struct Reaping {
    int min_completions = 0;
    int in_flight = 0;
  };
  std::vector<Request> requests;
  std::vector<Submission> submissions;
  std::vector<Reaping> reapings;
  // The most requests in flight at once (after a Submit).
  int max_in_flight = 0;
  // Requests in flight now.
  int in_flight = 0;
  int64_t allocate_calls = 0;
};

class CountingIoEngine final : public IoEngine {
 public:
  explicit CountingIoEngine(std::unique_ptr<IoEngine> inner);

  absl::Status Submit(absl::Span<const IoRequest> requests) override;
  absl::Status Reap(int min_completions, std::vector<IoCompletion>* out) override;
  int Allocate(int fd, int64_t offset, int64_t bytes) override;

  // Kept by the test after the swap took the engine (see the file comment).
  const std::shared_ptr<IoRecords>& records() const { return records_; }

 private:
  std::unique_ptr<IoEngine> inner_;
  // Allocate() may come from another thread than Submit/Reap (IoEngine's contract).
  Mutex mu_;
  std::shared_ptr<IoRecords> records_ = std::make_shared<IoRecords>();
};

}  // namespace ps

#endif  // PATRICKSTAR_DISK_TESTING_COUNTING_IO_ENGINE_H_
