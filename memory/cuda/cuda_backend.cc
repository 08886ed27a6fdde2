#include "memory/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda_device_rule.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"
#include "memory/cuda/cuda_status.h"
#include "memory/internal/backend_errors.h"
#include "memory/memory_resource.h"

namespace ps {
namespace {

// Registry of live allocations shared by the backend and its streams.
struct SharedState {
  explicit SharedState(int device_index, int64_t capacity_bytes)
      : device_index(device_index), capacity_bytes(capacity_bytes) {}

  const int device_index;
  const int64_t capacity_bytes;

  absl::Mutex mu;
  absl::flat_hash_map<uintptr_t, int64_t> device_allocations ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uintptr_t, int64_t> pinned_allocations ABSL_GUARDED_BY(mu);
  int64_t allocated_bytes ABSL_GUARDED_BY(mu) = 0;
  BackendCounters counters ABSL_GUARDED_BY(mu);

  Device device() const { return Device::Accelerator(device_index); }

  absl::Status MakeCurrent() const {
    PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index));
    return absl::OkStatus();
  }

  absl::Status CheckDeviceRange(const void* ptr, int64_t bytes, absl::string_view what) {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    absl::MutexLock lock(&mu);
    // Allocations are few (pools sit above the backend), so a scan is fine here.
    for (const auto& [start, size] : device_allocations) {
      if (p >= start && p + static_cast<uint64_t>(bytes) <= start + size) {
        return absl::OkStatus();
      }
    }
    return backend_internal::OutsideDeviceMemory(what, ptr, bytes, device(), "cuda");
  }

  void Count(CopyKind kind, int64_t bytes) {
    absl::MutexLock lock(&mu);
    if (kind == CopyKind::kHostToDevice) counters.host_to_device_bytes += bytes;
    if (kind == CopyKind::kDeviceToHost) counters.device_to_host_bytes += bytes;
    if (kind == CopyKind::kDeviceToDevice) counters.device_to_device_bytes += bytes;
  }
};

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<SharedState> state, cudaEvent_t event)
      : state_(std::move(state)), event_(event) {}
  ~CudaEvent() override {
    if (state_->MakeCurrent().ok()) {
      const cudaError_t e = cudaEventDestroy(event_);
      LOG_IF(ERROR, e != cudaSuccess) << CudaStatus(e, "cudaEventDestroy");
    }
  }

  bool Query() override {
    if (!state_->MakeCurrent().ok()) return false;
    return QueryEvent(event_) == cudaSuccess;  // clears the NotReady it records
  }

  absl::Status Synchronize() override {
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return absl::OkStatus();
  }

  cudaEvent_t get() const { return event_; }

 private:
  std::shared_ptr<SharedState> state_;
  cudaEvent_t event_;
};

class CudaStream final : public Stream {
 public:
  CudaStream(std::shared_ptr<SharedState> state, cudaStream_t stream)
      : state_(std::move(state)), stream_(stream) {}

  ~CudaStream() override {
    if (state_->MakeCurrent().ok()) {
      cudaError_t e = cudaStreamSynchronize(stream_);
      LOG_IF(ERROR, e != cudaSuccess) << CudaStatus(e, "cudaStreamSynchronize in ~CudaStream");
      e = cudaStreamDestroy(stream_);
      LOG_IF(ERROR, e != cudaSuccess) << CudaStatus(e, "cudaStreamDestroy");
    }
  }

  absl::Status MemcpyAsync(void* dst, const void* src, int64_t bytes, CopyKind kind) override {
    RETURN_IF_ERROR(backend_internal::CheckTransferArgs("MemcpyAsync", dst, src, bytes));
    if (bytes == 0) return absl::OkStatus();
    const std::string what = absl::StrCat("MemcpyAsync(", CopyKindName(kind), ")");
    cudaMemcpyKind cuda_kind = cudaMemcpyHostToHost;
    switch (kind) {
      case CopyKind::kHostToDevice:
        RETURN_IF_ERROR(state_->CheckDeviceRange(dst, bytes, what + " destination"));
        cuda_kind = cudaMemcpyHostToDevice;
        break;
      case CopyKind::kDeviceToHost:
        RETURN_IF_ERROR(state_->CheckDeviceRange(src, bytes, what + " source"));
        cuda_kind = cudaMemcpyDeviceToHost;
        break;
      case CopyKind::kDeviceToDevice:
        RETURN_IF_ERROR(state_->CheckDeviceRange(dst, bytes, what + " destination"));
        RETURN_IF_ERROR(state_->CheckDeviceRange(src, bytes, what + " source"));
        cuda_kind = cudaMemcpyDeviceToDevice;
        break;
      case CopyKind::kHostToHost:
        cuda_kind = cudaMemcpyHostToHost;
        break;
    }
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cuda_kind, stream_));
    state_->Count(kind, bytes);
    return absl::OkStatus();
  }

  absl::Status MemsetAsync(void* dst, int value, int64_t bytes) override {
    RETURN_IF_ERROR(backend_internal::CheckTransferArgs("MemsetAsync", dst, dst, bytes));
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(state_->CheckDeviceRange(dst, bytes, "MemsetAsync"));
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, static_cast<size_t>(bytes), stream_));
    return absl::OkStatus();
  }

  absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&> fn) override {
    if (!fn) return absl::InvalidArgumentError("LaunchHostFunc: empty function");
    RETURN_IF_ERROR(state_->MakeCurrent());
    auto* heap_fn = new absl::AnyInvocable<void() &&>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(
        stream_,
        [](void* arg) {
          auto* f = static_cast<absl::AnyInvocable<void() &&>*>(arg);
          std::move (*f)();
          delete f;
        },
        heap_fn);
    if (e != cudaSuccess) {
      delete heap_fn;
      return CudaStatus(e, "cudaLaunchHostFunc");
    }
    return absl::OkStatus();
  }

  absl::Status RecordEvent(Event* event) override {
    auto* e = dynamic_cast<CudaEvent*>(event);
    if (e == nullptr) {
      return absl::InvalidArgumentError("RecordEvent: the event was not created by a cuda backend");
    }
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(e->get(), stream_));
    return absl::OkStatus();
  }

  absl::Status WaitEvent(Event* event) override {
    auto* e = dynamic_cast<CudaEvent*>(event);
    if (e == nullptr) {
      return absl::InvalidArgumentError("WaitEvent: the event was not created by a cuda backend");
    }
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, e->get(), 0));
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  void* native_handle() override { return stream_; }

 private:
  std::shared_ptr<SharedState> state_;
  cudaStream_t stream_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(std::shared_ptr<SharedState> state) : state_(std::move(state)) {}

  ~CudaBackend() override {
    absl::MutexLock lock(&state_->mu);
    if (!state_->MakeCurrent().ok()) return;
    if (!state_->device_allocations.empty()) {
      LOG(WARNING) << "cuda backend for " << device() << " destroyed with "
                   << state_->device_allocations.size() << " device allocations ("
                   << FormatBytes(state_->allocated_bytes) << ") still live; freeing them";
    }
    for (const auto& [p, bytes] : state_->device_allocations) {
      (void)cudaFree(reinterpret_cast<void*>(p));
    }
    for (const auto& [p, bytes] : state_->pinned_allocations) {
      (void)cudaFreeHost(reinterpret_cast<void*>(p));
    }
  }

  absl::string_view name() const override { return "cuda"; }
  Device device() const override { return state_->device(); }
  int64_t capacity_bytes() const override { return state_->capacity_bytes; }
  int64_t allocated_bytes() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->allocated_bytes;
  }
  BackendCounters counters() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->counters;
  }

  absl::StatusOr<void*> AllocateDevice(int64_t bytes) override {
    RETURN_IF_ERROR(backend_internal::CheckAllocationSize("AllocateDevice", bytes));
    const int64_t rounded = AlignUp(bytes, kAllocationAlignment);
    absl::MutexLock lock(&state_->mu);
    const int64_t cap = state_->capacity_bytes;
    const auto out_of_memory = [&](absl::string_view why) {
      return backend_internal::DeviceOutOfMemory(device(), "cuda", why, rounded,
                                                 state_->allocated_bytes, cap);
    };
    if (rounded > cap - state_->allocated_bytes) return out_of_memory("");
    RETURN_IF_ERROR(state_->MakeCurrent());
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(rounded));
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return out_of_memory(" (cudaMalloc failed: other processes may hold GPU memory)");
    }
    PS_CUDA_RETURN_IF_ERROR(e);
    state_->device_allocations[reinterpret_cast<uintptr_t>(p)] = rounded;
    state_->allocated_bytes += rounded;
    state_->counters.device_allocations += 1;
    state_->counters.peak_device_allocated_bytes =
        std::max(state_->counters.peak_device_allocated_bytes, state_->allocated_bytes);
    return p;
  }

  absl::Status FreeDevice(void* ptr) override {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->device_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == state_->device_allocations.end()) {
      return backend_internal::NotALiveAllocation("FreeDevice", ptr, device(), "device");
    }
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
    state_->allocated_bytes -= it->second;
    state_->device_allocations.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) override {
    RETURN_IF_ERROR(backend_internal::CheckAllocationSize("AllocatePinnedHost", bytes));
    RETURN_IF_ERROR(state_->MakeCurrent());
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("could not allocate ", FormatBytes(bytes), " of pinned host memory: ",
                       cudaGetErrorString(e), ". Lower the host memory budget or the chunk size."));
    }
    absl::MutexLock lock(&state_->mu);
    state_->pinned_allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }

  absl::Status FreePinnedHost(void* ptr) override {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->pinned_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == state_->pinned_allocations.end()) {
      return backend_internal::NotALiveAllocation("FreePinnedHost", ptr, device(), "pinned host");
    }
    RETURN_IF_ERROR(state_->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaFreeHost(ptr));
    state_->pinned_allocations.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    RETURN_IF_ERROR(state_->MakeCurrent());
    cudaStream_t s = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(new CudaStream(state_, s));
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    RETURN_IF_ERROR(state_->MakeCurrent());
    cudaEvent_t e = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(state_, e));
  }

 private:
  std::shared_ptr<SharedState> state_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  int driver_version = 0;
  const bool driver_known = cudaDriverGetVersion(&driver_version) == cudaSuccess;
  static_assert(kCudaSuccessCode == cudaSuccess && kCudaErrorNoDeviceCode == cudaErrorNoDevice &&
                kCudaErrorInsufficientDriverCode == cudaErrorInsufficientDriver);
  // The rule the GPU tests' gate uses too (base/cuda_device_rule.h).
  const bool no_device =
      CudaAnswersMeanNoDevice(static_cast<int>(e), count, driver_known, driver_version);
  if (e != cudaSuccess && !no_device) {
    // A driver older than the runtime, or any other failure to count the devices, is a broken
    // setup, not a machine without a GPU: FailedPrecondition, so nothing reads it as "no GPU".
    (void)cudaGetLastError();
    int runtime_version = 0;
    (void)cudaRuntimeGetVersion(&runtime_version);
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA runtime cannot use this machine's GPUs (cudaGetDeviceCount: ",
        cudaGetErrorName(e), ": ", cudaGetErrorString(e), "; driver version ",
        driver_known ? absl::StrCat(driver_version) : std::string("unknown"), ", runtime version ",
        runtime_version,
        "): update the NVIDIA driver to one that supports this runtime, or check that the device "
        "is visible and not in use exclusively"));
  }
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device is available (cudaGetDeviceCount: ",
        e != cudaSuccess ? absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e))
                         : std::string("0 devices"),
        "). Use the cpu backend on this machine, or run where a GPU and its driver are visible."));
  }
  if (options.device_index < 0 || options.device_index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("cuda device index ", options.device_index,
                                                   " out of range: this machine has ", count,
                                                   " CUDA device(s)"));
  }
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device_index));
  size_t free_bytes = 0, total_bytes = 0;
  PS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Free, not total: the context (and anything another process holds) is already gone, and the
  // margin keeps room for what cuBLAS, NCCL and lazily loaded kernels allocate outside the cap.
  ASSIGN_OR_RETURN(const int64_t cap,
                   CudaCapacityFromFree(options.capacity_bytes, static_cast<int64_t>(free_bytes),
                                        static_cast<int64_t>(total_bytes), options.margin_bytes,
                                        options.device_index));
  LOG(INFO) << "cuda backend on device " << options.device_index << ": cap " << FormatBytes(cap)
            << ", " << FormatBytes(static_cast<int64_t>(free_bytes)) << " free of "
            << FormatBytes(static_cast<int64_t>(total_bytes));
  return std::unique_ptr<Backend>(
      new CudaBackend(std::make_shared<SharedState>(options.device_index, cap)));
}

}  // namespace ps
