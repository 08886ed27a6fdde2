#include "memory/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/internal/backend_errors.h"
#include "memory/memory_resource.h"

namespace ps {
namespace {

using backend_internal::CheckAllocationSize;
using backend_internal::CheckTransferArgs;

// One direction of the emulated host<->device link. Copies in one direction are serialized, and
// with a bandwidth cap each one takes at least bytes / bandwidth: the memcpy happens at host speed,
// then the copy engine sleeps out the remainder.
class Link {
 public:
  explicit Link(double bandwidth_bytes_per_s) : bandwidth_bytes_per_s_(bandwidth_bytes_per_s) {}

  void Copy(void* dst, const void* src, int64_t bytes) {
    if (bandwidth_bytes_per_s_ <= 0) {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
      return;
    }
    MutexLock lock(&mu_);
    const absl::Time start = absl::Now();
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    const absl::Time done =
        start + absl::Seconds(static_cast<double>(bytes) / bandwidth_bytes_per_s_);
    const absl::Duration left = done - absl::Now();
    if (left > absl::ZeroDuration()) absl::SleepFor(left);
  }

 private:
  const double bandwidth_bytes_per_s_;
  Mutex mu_;
};

// State shared by the backend and every stream it created, so a stream may outlive the backend
// object without dangling.
struct SharedState {
  SharedState(const CpuBackendOptions& o)
      : options(o),
        host_to_device(o.copy_bandwidth_bytes_per_s),
        device_to_host(o.copy_bandwidth_bytes_per_s) {}

  const CpuBackendOptions options;
  Link host_to_device;
  Link device_to_host;

  Mutex mu;
  // Live device allocations: start address -> rounded size in bytes.
  absl::btree_map<uintptr_t, int64_t> device_allocations ABSL_GUARDED_BY(mu);
  absl::btree_set<uintptr_t> pinned_allocations ABSL_GUARDED_BY(mu);
  int64_t allocated_bytes ABSL_GUARDED_BY(mu) = 0;
  BackendCounters counters ABSL_GUARDED_BY(mu);

  Device device() const { return Device::Accelerator(options.device_index); }

  // OK if [ptr, ptr + bytes) lies inside one live device allocation.
  absl::Status CheckDeviceRange(const void* ptr, int64_t bytes, absl::string_view what) {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    MutexLock lock(&mu);
    auto it = device_allocations.upper_bound(p);
    if (it != device_allocations.begin()) {
      --it;
      if (p >= it->first && p + static_cast<uint64_t>(bytes) <= it->first + it->second) {
        return absl::OkStatus();
      }
    }
    return backend_internal::OutsideDeviceMemory(what, ptr, bytes, device(), "cpu");
  }

  void Count(CopyKind kind, int64_t bytes) {
    MutexLock lock(&mu);
    switch (kind) {
      case CopyKind::kHostToDevice:
        counters.host_to_device_bytes += bytes;
        break;
      case CopyKind::kDeviceToHost:
        counters.device_to_host_bytes += bytes;
        break;
      case CopyKind::kDeviceToDevice:
        counters.device_to_device_bytes += bytes;
        break;
      case CopyKind::kHostToHost:
        break;
    }
  }
};

// An event is a sequence of recordings. Record() on a stream takes the next generation number and
// enqueues its completion; the event is complete when its latest generation is. Generations can
// complete out of order (records on different streams), so completion is tracked exactly: every
// generation <= `done_through_` is done, plus the ones in `done_beyond_`.
class CpuEvent final : public Event {
 public:
  // Called by Stream::RecordEvent: returns the generation the stream must complete.
  int64_t NextGeneration() {
    MutexLock lock(&mu_);
    return ++recorded_;
  }
  int64_t latest() {
    MutexLock lock(&mu_);
    return recorded_;
  }
  void Complete(int64_t generation) {
    MutexLock lock(&mu_);
    done_beyond_.insert(generation);
    while (!done_beyond_.empty() && *done_beyond_.begin() == done_through_ + 1) {
      ++done_through_;
      done_beyond_.erase(done_beyond_.begin());
    }
  }
  void WaitFor(int64_t generation) {
    MutexLock lock(&mu_);
    auto done = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return IsDoneLocked(generation);
    };
    mu_.Await(done);
  }

  bool Query() override {
    MutexLock lock(&mu_);
    return IsDoneLocked(recorded_);
  }
  absl::Status Synchronize() override {
    WaitFor(latest());
    return absl::OkStatus();
  }

 private:
  bool IsDoneLocked(int64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation <= done_through_ || done_beyond_.contains(generation);
  }

  Mutex mu_;
  int64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_through_ ABSL_GUARDED_BY(mu_) = 0;
  absl::btree_set<int64_t> done_beyond_ ABSL_GUARDED_BY(mu_);
};

// A stream is a FIFO of operations run by its own worker thread.
class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::shared_ptr<SharedState> state)
      : state_(std::move(state)), worker_([this] { Run(); }) {}

  ~CpuStream() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    worker_.join();
  }

  absl::Status MemcpyAsync(void* dst, const void* src, int64_t bytes, CopyKind kind) override {
    if (absl::Status s = CheckTransferArgs("MemcpyAsync", dst, src, bytes); !s.ok()) return s;
    if (bytes == 0) return absl::OkStatus();
    const std::string what = absl::StrCat("MemcpyAsync(", CopyKindName(kind), ")");
    if (backend_internal::DestinationIsDevice(kind)) {
      if (absl::Status s = state_->CheckDeviceRange(dst, bytes, what + " destination"); !s.ok()) {
        return s;
      }
    }
    if (backend_internal::SourceIsDevice(kind)) {
      if (absl::Status s = state_->CheckDeviceRange(src, bytes, what + " source"); !s.ok()) {
        return s;
      }
    }
    SharedState* st = state_.get();
    Enqueue([st, dst, src, bytes, kind] {
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
    if (absl::Status s = state_->CheckDeviceRange(dst, bytes, "MemsetAsync"); !s.ok()) return s;
    Enqueue([dst, value, bytes] { std::memset(dst, value, static_cast<size_t>(bytes)); });
    return absl::OkStatus();
  }

  absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&> fn) override {
    if (!fn) return absl::InvalidArgumentError("LaunchHostFunc: empty function");
    Enqueue(std::move(fn));
    return absl::OkStatus();
  }

  absl::Status RecordEvent(Event* event) override {
    auto* e = dynamic_cast<CpuEvent*>(event);
    if (e == nullptr) {
      return absl::InvalidArgumentError("RecordEvent: the event was not created by a cpu backend");
    }
    const int64_t generation = e->NextGeneration();
    Enqueue([e, generation] { e->Complete(generation); });
    return absl::OkStatus();
  }

  absl::Status WaitEvent(Event* event) override {
    auto* e = dynamic_cast<CpuEvent*>(event);
    if (e == nullptr) {
      return absl::InvalidArgumentError("WaitEvent: the event was not created by a cpu backend");
    }
    const int64_t generation = e->latest();
    if (generation == 0) return absl::OkStatus();  // never recorded: already complete
    Enqueue([e, generation] { e->WaitFor(generation); });
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    MutexLock lock(&mu_);
    const int64_t target = enqueued_;
    auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_ >= target; };
    mu_.Await(done);
    return absl::OkStatus();
  }

  void* native_handle() override { return nullptr; }

 private:
  using Op = absl::AnyInvocable<void() &&>;

  void Enqueue(Op op) {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(op));
    ++enqueued_;
  }

  void Run() {
    while (true) {
      Op op;
      {
        MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !queue_.empty() || stopping_;
        };
        mu_.Await(ready);
        if (queue_.empty()) return;  // stopping and drained
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      std::move(op)();
      MutexLock lock(&mu_);
      ++completed_;
    }
  }

  std::shared_ptr<SharedState> state_;
  Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: started after every other member is constructed
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : state_(std::make_shared<SharedState>(options)) {}

  ~CpuBackend() override {
    MutexLock lock(&state_->mu);
    if (!state_->device_allocations.empty()) {
      LOG(WARNING) << "cpu backend for " << device() << " destroyed with "
                   << state_->device_allocations.size() << " device allocations ("
                   << FormatBytes(state_->allocated_bytes) << ") still live; freeing them";
    }
    for (const auto& [p, bytes] : state_->device_allocations) {
      std::free(reinterpret_cast<void*>(p));
    }
    for (uintptr_t p : state_->pinned_allocations) std::free(reinterpret_cast<void*>(p));
  }

  absl::string_view name() const override { return "cpu"; }
  Device device() const override { return state_->device(); }
  int64_t capacity_bytes() const override { return state_->options.capacity_bytes; }
  int64_t allocated_bytes() const override {
    MutexLock lock(&state_->mu);
    return state_->allocated_bytes;
  }
  BackendCounters counters() const override {
    MutexLock lock(&state_->mu);
    return state_->counters;
  }

  absl::StatusOr<void*> AllocateDevice(int64_t bytes) override {
    if (absl::Status s = CheckAllocationSize("AllocateDevice", bytes); !s.ok()) return s;
    const int64_t rounded = AlignUp(bytes, kAllocationAlignment);
    MutexLock lock(&state_->mu);
    const int64_t cap = state_->options.capacity_bytes;
    if (rounded > cap - state_->allocated_bytes) {
      return backend_internal::DeviceOutOfMemory(device(), "emulated by the cpu backend", "",
                                                  rounded, state_->allocated_bytes, cap);
    }
    void* p = std::aligned_alloc(kAllocationAlignment, static_cast<size_t>(rounded));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "host RAM backing ", device().ToString(), " is exhausted: aligned_alloc of ",
          FormatBytes(rounded), " failed. Lower the accelerator memory cap."));
    }
    state_->device_allocations[reinterpret_cast<uintptr_t>(p)] = rounded;
    state_->allocated_bytes += rounded;
    state_->counters.device_allocations += 1;
    state_->counters.peak_device_allocated_bytes =
        std::max(state_->counters.peak_device_allocated_bytes, state_->allocated_bytes);
    return p;
  }

  absl::Status FreeDevice(void* ptr) override {
    MutexLock lock(&state_->mu);
    auto it = state_->device_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == state_->device_allocations.end()) {
      return backend_internal::NotALiveAllocation("FreeDevice", ptr, device(), "device");
    }
    state_->allocated_bytes -= it->second;
    state_->device_allocations.erase(it);
    std::free(ptr);
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) override {
    if (absl::Status s = CheckAllocationSize("AllocatePinnedHost", bytes); !s.ok()) return s;
    void* p = std::aligned_alloc(kAllocationAlignment,
                                 static_cast<size_t>(AlignUp(bytes, kAllocationAlignment)));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory exhausted: could not allocate ", FormatBytes(bytes),
                       " of pinned host memory"));
    }
    MutexLock lock(&state_->mu);
    state_->pinned_allocations.insert(reinterpret_cast<uintptr_t>(p));
    return p;
  }

  absl::Status FreePinnedHost(void* ptr) override {
    MutexLock lock(&state_->mu);
    if (state_->pinned_allocations.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return backend_internal::NotALiveAllocation("FreePinnedHost", ptr, device(), "pinned host");
    }
    std::free(ptr);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(new CpuStream(state_));
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(new CpuEvent());
  }

 private:
  std::shared_ptr<SharedState> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: capacity_bytes must be positive (the emulated accelerator's memory cap), got ",
        options.capacity_bytes));
  }
  if (options.copy_bandwidth_bytes_per_s < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: copy_bandwidth_bytes_per_s must be >= 0 (0 = unlimited), got ",
                     options.copy_bandwidth_bytes_per_s));
  }
  if (options.device_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: device_index must be >= 0, got ", options.device_index));
  }
  return std::unique_ptr<Backend>(new CpuBackend(options));
}

}  // namespace ps
