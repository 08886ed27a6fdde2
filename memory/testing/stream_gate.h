// StreamGate: holds a stream behind a gate the test controls, on any backend.
//
//   ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(*stream));
//   ... enqueue work on `stream`: none of it starts ...
//   gate->Open();  // now it runs, in order
//
// Close() enqueues a host function that blocks until Open(), so work enqueued on the stream after
// Close() waits behind it, exactly as behind a slow kernel. Tests use it to prove that work really
// runs asynchronously and in stream order (the host returns before the work ran; results appear
// only after Open()), and to let the host do something "too early" deterministically.
//
// Caveats: on the cuda backend host functions of all streams may share one driver thread, so a
// closed gate can also hold other streams' host functions (copies and kernels are not held). The
// destructor opens the gate. Never wait for the gated stream (Synchronize, an event recorded
// after the gate) on the thread that must call Open(): that deadlocks, as it would with a kernel
// that never ends.
//
// Thread safety: thread-safe.
#ifndef PATRICKSTAR_MEMORY_TESTING_STREAM_GATE_H_
#define PATRICKSTAR_MEMORY_TESTING_STREAM_GATE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "memory/backend.h"

namespace ps {

class StreamGate {
 public:
  // Enqueues the gate on `stream`. Errors: those of Stream::LaunchHostFunc.
  static absl::StatusOr<std::unique_ptr<StreamGate>> Close(Stream& stream);

  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  // Opens the gate.
  ~StreamGate();

  // Lets the stream pass. Idempotent.
  void Open();
  // Whether the stream has reached the gate (all work enqueued before Close() has run).
  bool reached() const;
  // Blocks until the stream reached the gate or `timeout` passed; returns reached().
  bool WaitUntilReached(absl::Duration timeout) const;

 private:
  struct State;
  explicit StreamGate(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_TESTING_STREAM_GATE_H_
