#include "memory/testing/stream_gate.h"

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace ps {

// ps::Mutex rather than absl::Notification, so ThreadSanitizer sees the ordering.
struct StreamGate::State {
  mutable Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = false;
  bool reached ABSL_GUARDED_BY(mu) = false;
};

absl::StatusOr<std::unique_ptr<StreamGate>> StreamGate::Close(Stream& stream) {
  auto state = std::make_shared<State>();
  absl::Status status = stream.LaunchHostFunc([state] {
    MutexLock lock(&state->mu);
    state->reached = true;
    state->mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->open; });
  });
  if (!status.ok()) return status;
  return std::unique_ptr<StreamGate>(new StreamGate(std::move(state)));
}

StreamGate::~StreamGate() { Open(); }

void StreamGate::Open() {
  MutexLock lock(&state_->mu);
  state_->open = true;
}

bool StreamGate::reached() const {
  MutexLock lock(&state_->mu);
  return state_->reached;
}

bool StreamGate::WaitUntilReached(absl::Duration timeout) const {
  MutexLock lock(&state_->mu);
  return state_->mu.AwaitWithTimeout(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) { return state_->reached; }, timeout);
}

}  // namespace ps
