#include "memory/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/internal/backend_errors.h"
#include "memory/internal/cpu_device_heap.h"
#include "memory/internal/page_allocation.h"
#include "memory/memory_resource.h"

namespace ps {
namespace {

using backend_internal::CheckAllocationSize;
using backend_internal::CheckTransferArgs;

// Whether the link emulation still runs: it ends for good once `interrupt` (SetCpuLinkInterrupt)
// returns true, polled by sleeping copies. Shared by both directions.
class LinkControl {
 public:
  bool ended() const { return ended_.load(std::memory_order_relaxed); }

  // Polls the interrupt; true (and ended from now on) once it fired.
  bool PollInterrupt() {
    if (ended()) return true;
    std::function<bool()> interrupt;
    {
      MutexLock lock(&mu_);
      interrupt = interrupt_;
    }
    if (interrupt && interrupt()) ended_.store(true, std::memory_order_relaxed);
    return ended();
  }

  void SetInterrupt(std::function<bool()> interrupt) {
    MutexLock lock(&mu_);
    interrupt_ = std::move(interrupt);
  }

 private:
  std::atomic<bool> ended_{false};
  Mutex mu_;
  std::function<bool()> interrupt_ ABSL_GUARDED_BY(mu_);
};

// One direction of the emulated host<->device link. Copies in one direction are serialized, and
// with a bandwidth cap each one takes at least bytes / bandwidth: the memcpy happens at host speed,
// then the copy engine sleeps out the remainder, in slices of at most kCpuLinkPollInterval, so
// that an interrupt ends the emulation within one slice (the data is already copied: ending it
// only makes the copy finish early).
class Link {
 public:
  Link(double bandwidth_bytes_per_s, LinkControl* control)
      : bandwidth_bytes_per_s_(bandwidth_bytes_per_s), control_(control) {}

  void Copy(void* dst, const void* src, int64_t bytes) {
    if (bandwidth_bytes_per_s_ <= 0 || control_->ended()) {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
      return;
    }
    MutexLock lock(&mu_);
    const absl::Time start = absl::Now();
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    const absl::Time done =
        start + absl::Seconds(static_cast<double>(bytes) / bandwidth_bytes_per_s_);
    for (absl::Duration left = done - absl::Now(); left > absl::ZeroDuration();
         left = done - absl::Now()) {
      if (control_->PollInterrupt()) return;
      absl::SleepFor(std::min(left, kCpuLinkPollInterval));
    }
  }

 private:
  const double bandwidth_bytes_per_s_;
  LinkControl* const control_;
  Mutex mu_;
};

class StreamCore;

// State shared by the backend and every stream and event it created, so a stream may outlive the
// backend object without dangling.
struct SharedState {
  SharedState(const CpuBackendOptions& o)
      : options(o),
        host_to_device(o.copy_bandwidth_bytes_per_s, &link_control),
        device_to_host(o.copy_bandwidth_bytes_per_s, &link_control),
        heap(o) {}

  const CpuBackendOptions options;
  LinkControl link_control;
  Link host_to_device;
  Link device_to_host;

  // The device memory: cap, registry of live allocations, cache of freed blocks.
  memory_internal::CpuDeviceHeap heap;

  // Copy counters and pinned host allocations.
  Mutex mu;
  absl::btree_map<uintptr_t, int64_t> pinned_allocations ABSL_GUARDED_BY(mu);
  int64_t host_to_device_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t device_to_host_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t device_to_device_bytes ABSL_GUARDED_BY(mu) = 0;

  // The stall hooks (see cpu_backend.h). Every host wait increments the epoch; work held by a
  // stall remembers the epoch it was enqueued in and may start once the epoch has moved past it.
  std::atomic<int64_t> host_wait_epoch{0};
  // Live streams, poked after every epoch change so their workers re-check held work.
  // Lock order: streams_mu before a stream's own mutex.
  Mutex streams_mu;
  absl::flat_hash_set<StreamCore*> streams ABSL_GUARDED_BY(streams_mu);

  // A host thread is about to wait for the device: release all held work.
  void HostWaits();

  Device device() const { return heap.device(); }

  // OK if [ptr, ptr + bytes) lies inside one live device allocation.
  absl::Status CheckDeviceRange(const void* ptr, int64_t bytes, absl::string_view what) const {
    return heap.CheckRange(ptr, bytes, what);
  }

  void Count(CopyKind kind, int64_t bytes) {
    MutexLock lock(&mu);
    switch (kind) {
      case CopyKind::kHostToDevice:
        host_to_device_bytes += bytes;
        break;
      case CopyKind::kDeviceToHost:
        device_to_host_bytes += bytes;
        break;
      case CopyKind::kDeviceToDevice:
        device_to_device_bytes += bytes;
        break;
      case CopyKind::kHostToHost:
        break;
    }
  }
};

// An event is a sequence of recordings. Record() on a stream takes the next generation number and
// enqueues its completion; the event is complete when its latest generation is. Generations can
// complete out of order (records on different streams), so completion is tracked exactly: every
// generation <= `done_through_` is done, plus the ones in `done_beyond_`. A generation recorded on
// a stream that had an asynchronous error carries it; Synchronize() reports the latest
// generation's. The state is shared with the records and waits queued on streams, so the Event may
// be destroyed before they ran (as cudaEventDestroy allows).
class CpuEventState {
 public:
  explicit CpuEventState(std::shared_ptr<SharedState> state) : state_(std::move(state)) {}

  // Called by Stream::RecordEvent: returns the generation the stream must complete.
  int64_t NextGeneration() {
    MutexLock lock(&mu_);
    return ++recorded_;
  }
  int64_t latest() {
    MutexLock lock(&mu_);
    return recorded_;
  }
  void Complete(int64_t generation, const absl::Status& stream_error) {
    MutexLock lock(&mu_);
    if (!stream_error.ok() && generation >= error_generation_) {
      error_generation_ = generation;
      error_ = stream_error;
    }
    done_beyond_.insert(generation);
    while (!done_beyond_.empty() && *done_beyond_.begin() == done_through_ + 1) {
      ++done_through_;
      done_beyond_.erase(done_beyond_.begin());
    }
  }
  // Blocks until `generation` completed. A device-side wait (WaitEvent): not a host wait.
  void WaitFor(int64_t generation) {
    MutexLock lock(&mu_);
    auto done = [this, generation]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return IsDoneLocked(generation); };
    mu_.Await(done);
  }

  bool Query() {
    MutexLock lock(&mu_);
    return IsDoneLocked(recorded_);
  }
  absl::Status Synchronize() {
    const int64_t generation = latest();
    state_->HostWaits();
    WaitFor(generation);
    MutexLock lock(&mu_);
    if (generation != 0 && generation == error_generation_) return error_;
    return absl::OkStatus();
  }

 private:
  bool IsDoneLocked(int64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation <= done_through_ || done_beyond_.contains(generation);
  }

  const std::shared_ptr<SharedState> state_;
  Mutex mu_;
  int64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_through_ ABSL_GUARDED_BY(mu_) = 0;
  absl::btree_set<int64_t> done_beyond_ ABSL_GUARDED_BY(mu_);
  int64_t error_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(std::shared_ptr<SharedState> state)
      : impl_(std::make_shared<CpuEventState>(std::move(state))) {}
  bool Query() override { return impl_->Query(); }
  absl::Status Synchronize() override { return impl_->Synchronize(); }
  const std::shared_ptr<CpuEventState>& impl() const { return impl_; }

 private:
  const std::shared_ptr<CpuEventState> impl_;
};

// The queue of one stream and the loop its worker thread runs. Owned by the CpuStream (which
// starts and joins the worker) and shared with stalls, which may outlive it.
class StreamCore {
 public:
  using Op = absl::AnyInvocable<void() &&>;

  explicit StreamCore(std::shared_ptr<SharedState> state) : state_(std::move(state)) {
    MutexLock lock(&state_->streams_mu);
    state_->streams.insert(this);
  }
  ~StreamCore() {
    MutexLock lock(&state_->streams_mu);
    state_->streams.erase(this);
  }

  SharedState* state() const { return state_.get(); }

  // Appends `op`; `make_op` variant builds it under the queue's lock (so that an event's
  // generation and its completion are enqueued atomically with respect to host waits).
  void Enqueue(Op op) {
    EnqueueBuilt([&op]() { return std::move(op); });
  }
  template <typename MakeOp>
  void EnqueueBuilt(MakeOp make_op) {
    MutexLock lock(&mu_);
    const int64_t epoch = state_->host_wait_epoch.load(std::memory_order_acquire);
    const bool hold = state_->options.stall_streams_until_host_waits || stall_epoch_ == epoch;
    queue_.push_back(QueuedOp{make_op(), ++enqueued_, hold ? epoch : -1});
  }

  // Runs queued work in order until Stop() and the queue is drained.
  void Run() {
    while (true) {
      Op op;
      {
        MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return (queue_.empty() && stopping_) ||
                 (!queue_.empty() && RunnableLocked(queue_.front()));
        };
        mu_.Await(ready);
        if (queue_.empty()) return;  // stopping and drained
        op = std::move(queue_.front().op);
        queue_.pop_front();
      }
      std::move(op)();
      MutexLock lock(&mu_);
      ++completed_;
    }
  }

  // Makes all remaining work runnable; Run() returns once it is done.
  void Stop() {
    MutexLock lock(&mu_);
    stopping_ = true;
  }

  absl::Status Synchronize() {
    int64_t target;
    {
      MutexLock lock(&mu_);
      target = enqueued_;
    }
    // Every op up to `target` was enqueued before this epoch change, so all of them may run.
    state_->HostWaits();
    MutexLock lock(&mu_);
    auto done = [this, target]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_ >= target; };
    mu_.Await(done);
    return error_;
  }

  void SetError(absl::Status status) {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = std::move(status);
  }
  absl::Status error() {
    MutexLock lock(&mu_);
    return error_;
  }

  // Wakes the worker so it re-checks whether held work may start.
  void Poke() { MutexLock lock(&mu_); }

  // The stall hook. BeginStall returns the epoch the stall lives in.
  absl::StatusOr<int64_t> BeginStall() {
    MutexLock lock(&mu_);
    const int64_t epoch = state_->host_wait_epoch.load(std::memory_order_acquire);
    if (stall_epoch_ == epoch) {
      return absl::FailedPreconditionError(
          "StallCpuStream: the stream is already stalled; release that stall first");
    }
    stall_epoch_ = epoch;
    return epoch;
  }
  void EndStall(int64_t epoch) {
    MutexLock lock(&mu_);
    if (stall_epoch_ != epoch) return;  // ended already (or a newer stall owns the stream)
    stall_epoch_ = -1;
    released_through_ = enqueued_;
  }
  bool StallActive(int64_t epoch) {
    MutexLock lock(&mu_);
    return stall_epoch_ == epoch &&
           state_->host_wait_epoch.load(std::memory_order_acquire) == epoch;
  }

 private:
  struct QueuedOp {
    Op op;
    int64_t seq = 0;
    // The host-wait epoch the op was enqueued in if a stall holds it, else -1.
    int64_t hold_epoch = -1;
  };

  bool RunnableLocked(const QueuedOp& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || op.hold_epoch < 0 || op.seq <= released_through_ ||
           state_->host_wait_epoch.load(std::memory_order_acquire) > op.hold_epoch;
  }

  const std::shared_ptr<SharedState> state_;
  Mutex mu_;
  std::deque<QueuedOp> queue_ ABSL_GUARDED_BY(mu_);
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // The epoch of the current StallCpuStream stall, -1 for none. The stall is in effect while the
  // backend's epoch still equals it.
  int64_t stall_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  // Ops with seq <= this run whatever holds them (a released stall).
  int64_t released_through_ ABSL_GUARDED_BY(mu_) = 0;
};

void SharedState::HostWaits() {
  host_wait_epoch.fetch_add(1, std::memory_order_acq_rel);
  MutexLock lock(&streams_mu);
  for (StreamCore* stream : streams) stream->Poke();
}

class CpuStreamStallImpl final : public CpuStreamStall {
 public:
  CpuStreamStallImpl(std::shared_ptr<StreamCore> core, int64_t epoch)
      : core_(std::move(core)), epoch_(epoch) {}
  ~CpuStreamStallImpl() override { Release(); }
  void Release() override {
    core_->EndStall(epoch_);
    core_->Poke();
  }
  bool active() const override { return core_->StallActive(epoch_); }

 private:
  const std::shared_ptr<StreamCore> core_;
  const int64_t epoch_;
};

// A stream is a FIFO of operations run by its own worker thread.
class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::shared_ptr<SharedState> state)
      : core_(std::make_shared<StreamCore>(std::move(state))),
        worker_([core = core_.get()] { core->Run(); }) {}

  ~CpuStream() override {
    // Draining may wait for events recorded behind another stream's stall: that is a host wait.
    core_->state()->HostWaits();
    core_->Stop();
    worker_.join();
  }

  const std::shared_ptr<StreamCore>& core() const { return core_; }

  absl::Status MemcpyAsync(void* dst, const void* src, int64_t bytes, CopyKind kind) override {
    if (absl::Status s = CheckTransferArgs("MemcpyAsync", dst, src, bytes); !s.ok()) return s;
    if (bytes == 0) return absl::OkStatus();
    SharedState* st = core_->state();
    const std::string what = absl::StrCat("MemcpyAsync(", CopyKindName(kind), ")");
    if (backend_internal::DestinationIsDevice(kind)) {
      if (absl::Status s = st->CheckDeviceRange(dst, bytes, what + " destination"); !s.ok()) {
        return s;
      }
    }
    if (backend_internal::SourceIsDevice(kind)) {
      if (absl::Status s = st->CheckDeviceRange(src, bytes, what + " source"); !s.ok()) {
        return s;
      }
    }
    core_->Enqueue([st, dst, src, bytes, kind] {
      switch (kind) {
        case CopyKind::kHostToDevice:
          st->host_to_device.Copy(dst, src, bytes);
          break;
        case CopyKind::kDeviceToHost:
          st->device_to_host.Copy(dst, src, bytes);
          break;
        default:
          std::memmove(dst, src, static_cast<size_t>(bytes));
          break;
      }
      st->Count(kind, bytes);
    });
    return absl::OkStatus();
  }

  absl::Status MemsetAsync(void* dst, int value, int64_t bytes) override {
    if (absl::Status s = CheckTransferArgs("MemsetAsync", dst, dst, bytes); !s.ok()) return s;
    if (bytes == 0) return absl::OkStatus();
    if (absl::Status s = core_->state()->CheckDeviceRange(dst, bytes, "MemsetAsync"); !s.ok()) {
      return s;
    }
    core_->Enqueue([dst, value, bytes] { std::memset(dst, value, static_cast<size_t>(bytes)); });
    return absl::OkStatus();
  }

  absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&> fn) override {
    if (!fn) return absl::InvalidArgumentError("LaunchHostFunc: empty function");
    core_->Enqueue(std::move(fn));
    return absl::OkStatus();
  }

  absl::Status LaunchChecked(absl::AnyInvocable<absl::Status() &&> fn) {
    if (!fn) return absl::InvalidArgumentError("LaunchCheckedHostFunc: empty function");
    StreamCore* core = core_.get();
    core_->Enqueue([core, fn = std::move(fn)]() mutable {
      absl::Status status = std::move(fn)();
      if (!status.ok()) core->SetError(std::move(status));
    });
    return absl::OkStatus();
  }

  absl::Status RecordEvent(Event* event) override {
    auto* e = dynamic_cast<CpuEvent*>(event);
    if (e == nullptr) {
      return absl::InvalidArgumentError("RecordEvent: the event was not created by a cpu backend");
    }
    StreamCore* core = core_.get();
    core_->EnqueueBuilt([e = e->impl(), core]() -> StreamCore::Op {
      const int64_t generation = e->NextGeneration();
      return [e, core, generation] { e->Complete(generation, core->error()); };
    });
    return absl::OkStatus();
  }

  absl::Status WaitEvent(Event* event) override {
    auto* e = dynamic_cast<CpuEvent*>(event);
    if (e == nullptr) {
      return absl::InvalidArgumentError("WaitEvent: the event was not created by a cpu backend");
    }
    const int64_t generation = e->impl()->latest();
    if (generation == 0) return absl::OkStatus();  // never recorded: already complete
    core_->Enqueue([e = e->impl(), generation] { e->WaitFor(generation); });
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return core_->Synchronize(); }

  void* native_handle() override { return nullptr; }

 private:
  const std::shared_ptr<StreamCore> core_;
  std::thread worker_;  // last: started after every other member is constructed
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : state_(std::make_shared<SharedState>(options)) {}

  ~CpuBackend() override {
    state_->heap.FreeAllAtBackendDestruction();
    MutexLock lock(&state_->mu);
    for (const auto& [p, bytes] : state_->pinned_allocations) {
      memory_internal::FreePages(reinterpret_cast<void*>(p), bytes);
    }
  }

  absl::string_view name() const override { return "cpu"; }
  Device device() const override { return state_->device(); }
  int64_t capacity_bytes() const override { return state_->heap.capacity_bytes(); }
  int64_t allocated_bytes() const override { return state_->heap.live_bytes(); }
  BackendCounters counters() const override {
    // Allocations are counted once, by the heap: CpuBackendMemoryStats::allocations and
    // peak_live_bytes are the backend's device_allocations and peak_device_allocated_bytes.
    const CpuBackendMemoryStats heap = state_->heap.stats();
    BackendCounters c;
    c.device_allocations = heap.allocations;
    c.peak_device_allocated_bytes = heap.peak_live_bytes;
    MutexLock lock(&state_->mu);
    c.host_to_device_bytes = state_->host_to_device_bytes;
    c.device_to_host_bytes = state_->device_to_host_bytes;
    c.device_to_device_bytes = state_->device_to_device_bytes;
    return c;
  }

  absl::StatusOr<void*> AllocateDevice(int64_t bytes) override {
    return state_->heap.Allocate(bytes);
  }

  absl::Status FreeDevice(void* ptr) override { return state_->heap.Free(ptr); }

  absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) override {
    if (absl::Status s = CheckAllocationSize("AllocatePinnedHost", bytes); !s.ok()) return s;
    // Mapped pages: a chunk block's tail that is never written is never resident.
    const int64_t rounded = AlignUp(bytes, kAllocationAlignment);
    void* p = memory_internal::AllocatePages(rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host memory exhausted: could not allocate ",
                                                       FormatBytes(bytes),
                                                       " of pinned host memory"));
    }
    MutexLock lock(&state_->mu);
    state_->pinned_allocations[reinterpret_cast<uintptr_t>(p)] = rounded;
    return p;
  }

  absl::Status FreePinnedHost(void* ptr) override {
    MutexLock lock(&state_->mu);
    auto it = state_->pinned_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == state_->pinned_allocations.end()) {
      return backend_internal::NotALiveAllocation("FreePinnedHost", ptr, device(), "pinned host");
    }
    memory_internal::FreePages(ptr, it->second);
    state_->pinned_allocations.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(new CpuStream(state_));
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(new CpuEvent(state_));
  }

  SharedState* state() const { return state_.get(); }

  CpuBackendMemoryStats memory_stats() const { return state_->heap.stats(); }

  int64_t ReleaseCache() { return state_->heap.ReleaseCache(); }

 private:
  std::shared_ptr<SharedState> state_;
};

}  // namespace

absl::Status LaunchCheckedHostFunc(Stream& stream, absl::AnyInvocable<absl::Status() &&> fn) {
  auto* cpu_stream = dynamic_cast<CpuStream*>(&stream);
  if (cpu_stream == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchCheckedHostFunc: the stream was not created by a cpu backend");
  }
  return cpu_stream->LaunchChecked(std::move(fn));
}

absl::Status CheckCpuDeviceRange(const Backend& backend, const void* ptr, int64_t bytes,
                                 absl::string_view what) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": CheckCpuDeviceRange needs a cpu backend, got the ", backend.name(), " backend"));
  }
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative size ", bytes));
  }
  return cpu->state()->CheckDeviceRange(ptr, bytes, what);
}

absl::StatusOr<CpuBackendMemoryStats> GetCpuBackendMemoryStats(const Backend& backend) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetCpuBackendMemoryStats needs a cpu backend, got the ", backend.name(), " backend"));
  }
  return cpu->memory_stats();
}

absl::StatusOr<int64_t> ReleaseCpuDeviceCache(Backend& backend) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReleaseCpuDeviceCache needs a cpu backend, got the ", backend.name(), " backend"));
  }
  return cpu->ReleaseCache();
}

absl::Status SetCpuLinkInterrupt(Backend& backend, std::function<bool()> interrupt) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetCpuLinkInterrupt needs a cpu backend, got the ", backend.name(), " backend"));
  }
  cpu->state()->link_control.SetInterrupt(std::move(interrupt));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CpuStreamStall>> StallCpuStream(Stream& stream) {
  auto* cpu_stream = dynamic_cast<CpuStream*>(&stream);
  if (cpu_stream == nullptr) {
    return absl::InvalidArgumentError(
        "StallCpuStream: the stream was not created by a cpu backend");
  }
  absl::StatusOr<int64_t> epoch = cpu_stream->core()->BeginStall();
  if (!epoch.ok()) return epoch.status();
  return std::unique_ptr<CpuStreamStall>(new CpuStreamStallImpl(cpu_stream->core(), *epoch));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: capacity_bytes must be positive (the emulated accelerator's "
                     "memory cap), got ",
                     options.capacity_bytes));
  }
  if (!(options.copy_bandwidth_bytes_per_s >= 0) ||
      !std::isfinite(options.copy_bandwidth_bytes_per_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: copy_bandwidth_bytes_per_s must be finite and >= 0 (0 = unlimited), got ",
        options.copy_bandwidth_bytes_per_s));
  }
  if (options.max_cached_bytes.has_value() && *options.max_cached_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: max_cached_bytes must be >= 0 (0 turns the cache of freed device blocks "
        "off), got ",
        *options.max_cached_bytes));
  }
  if (options.device_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: device_index must be >= 0, got ", options.device_index));
  }
  CpuBackendOptions resolved = options;
  if (!resolved.max_cached_bytes.has_value()) {
    if (const char* env = std::getenv("PS_CPU_DEVICE_CACHE_BYTES"); env != nullptr && *env) {
      int64_t bytes = 0;
      if (!absl::SimpleAtoi(env, &bytes) || bytes < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cpu backend: PS_CPU_DEVICE_CACHE_BYTES must be a byte count >= 0 (0 turns the cache "
            "of freed device blocks off), got \"",
            env, "\""));
      }
      resolved.max_cached_bytes = bytes;
    }
  }
  return std::unique_ptr<Backend>(new CpuBackend(resolved));
}

}  // namespace ps
