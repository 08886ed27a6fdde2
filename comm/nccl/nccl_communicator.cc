#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "comm/internal/collective.h"
#include "glog/logging.h"
#include "memory/cuda/cuda_status.h"

namespace ps {
namespace nccl_internal {

// An ncclResult_t as a Status naming the call, with NCCL's description and last error.
absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  const std::string message = absl::StrCat(
      what, " failed: NCCL error ", static_cast<int>(result), " (", ncclGetErrorString(result), ")",
      last != nullptr && *last ? ": " : "", last != nullptr ? last : "");
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

struct NcclState {
  std::shared_ptr<Communicator> bootstrap;
  int device = 0;
  int rank = 0;
  int world = 1;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int* scratch = nullptr;  // device word for Barrier

  Mutex mu;  // orders enqueues; guards comm and aborted
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  std::string abort_reason ABSL_GUARDED_BY(mu);

  absl::Status CheckUsable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!aborted) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "this nccl communicator was aborted (", abort_reason, "); create a new one on every rank"));
  }
  void Abort(std::string reason) {
    MutexLock lock(&mu);
    if (aborted) return;
    aborted = true;
    abort_reason = std::move(reason);
    LOG(ERROR) << "aborting the NCCL communicator of rank " << rank << ": " << abort_reason;
    const ncclResult_t r = ncclCommAbort(comm);
    if (r != ncclSuccess) LOG(ERROR) << NcclStatus(r, nullptr, "ncclCommAbort");
  }
};

namespace {

ncclDataType_t NcclType(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32:
      return ncclFloat32;
    case CommDType::kF16:
      return ncclFloat16;
    case CommDType::kBF16:
      return ncclBfloat16;
    case CommDType::kI32:
      return ncclInt32;
    case CommDType::kU8:
      return ncclUint8;
  }
  return ncclNumTypes;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// InvalidArgument unless [ptr, +bytes) is device (or managed) memory of `device`.
absl::Status CheckDeviceMemory(const char* which, const void* ptr, int device,
                               const std::string& what) {
  const auto address = absl::Hex(reinterpret_cast<uintptr_t>(ptr));
  cudaPointerAttributes attr;
  const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", which, " buffer 0x", address,
                                                   " is not CUDA memory (", cudaGetErrorString(e),
                                                   ")"));
  }
  if (attr.type == cudaMemoryTypeManaged) return absl::OkStatus();
  if (attr.type != cudaMemoryTypeDevice || attr.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", which, " buffer 0x", address, " is ",
                     attr.type == cudaMemoryTypeDevice ? absl::StrCat("memory of GPU ", attr.device)
                                                       : std::string("host memory"),
                     "; the nccl communicator needs device memory of GPU ", device));
  }
  return absl::OkStatus();
}

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<NcclState> state, cudaEvent_t event, std::string description)
      : state_(std::move(state)), event_(event), description_(std::move(description)) {}
  ~NcclRequest() override {
    cudaSetDevice(state_->device);
    cudaEventDestroy(event_);
  }

  bool Done() override {
    cudaSetDevice(state_->device);
    // QueryEvent, not cudaEventQuery: a NotReady left as this thread's last CUDA error would fail
    // the next kernel launch on the training thread.
    return QueryEvent(event_) != cudaErrorNotReady;
  }
  absl::Status Wait() override { return Wait(absl::InfiniteDuration()); }
  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    cudaSetDevice(state_->device);
    while (true) {
      const cudaError_t e = QueryEvent(event_);  // clears the NotReady it records
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaStatus(e, description_);
      absl::Status async_error;
      {
        MutexLock lock(&state_->mu);
        RETURN_IF_ERROR(state_->CheckUsable());
        ncclResult_t async = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(state_->comm, &async);
        if (r != ncclSuccess) return NcclStatus(r, state_->comm, "ncclCommGetAsyncError");
        if (async != ncclSuccess && async != ncclInProgress) {
          async_error = NcclStatus(async, state_->comm, description_);
        }
      }
      if (!async_error.ok()) {
        state_->Abort(std::string(async_error.message()));
        return absl::UnavailableError(
            absl::StrCat(async_error.message(), "; the NCCL communicator was aborted"));
      }
      if (absl::Now() >= deadline) {
        const std::string message =
            absl::StrCat(description_, " did not complete within ", absl::FormatDuration(timeout),
                         "; the NCCL communicator was aborted. A rank may have died or issued "
                         "different collectives");
        state_->Abort(message);
        return absl::DeadlineExceededError(message);
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

 private:
  const std::shared_ptr<NcclState> state_;
  const cudaEvent_t event_;
  const std::string description_;
};

using comm_internal::Collective;
using comm_internal::CollectiveCall;

// Validates `call`, enqueues it with `enqueue` on the stream, records the completion event.
template <typename Enqueue>
absl::StatusOr<std::unique_ptr<CommRequest>> Issue(const std::shared_ptr<NcclState>& state,
                                                   const CollectiveCall& call, Enqueue enqueue) {
  RETURN_IF_ERROR(comm_internal::Validate(call, state->rank, state->world));
  const std::string what = comm_internal::Describe(call, state->rank, state->world);
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(state->device));
  if (call.kind != Collective::kBarrier && call.count_elems > 0) {
    if (call.kind != Collective::kBroadcast || call.root == state->rank) {
      RETURN_IF_ERROR(CheckDeviceMemory("send", call.send, state->device, what));
    }
    RETURN_IF_ERROR(CheckDeviceMemory("recv", call.recv, state->device, what));
  }
  MutexLock lock(&state->mu);
  RETURN_IF_ERROR(state->CheckUsable());
  RETURN_IF_ERROR(NcclStatus(enqueue(state->comm), state->comm, what));
  cudaEvent_t event;
  PS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t e = cudaEventRecord(event, state->stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(event);
    return CudaStatus(e, "cudaEventRecord");
  }
  return std::unique_ptr<CommRequest>(std::make_unique<NcclRequest>(state, event, what));
}

}  // namespace
}  // namespace nccl_internal

using nccl_internal::NcclState;
using nccl_internal::NcclStatus;

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions& options) {
  if (options.bootstrap == nullptr) {
    return absl::InvalidArgumentError(
        "NcclCommunicatorOptions.bootstrap is null: pass the mpi communicator (or local for a "
        "world of one) that the NCCL unique id is broadcast on");
  }
  if (options.bootstrap->memory() != CommMemory::kHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the bootstrap communicator must work on host memory; got ", options.bootstrap->name()));
  }
  int device_count = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&device_count);
  if (count_error != cudaSuccess || device_count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("nccl communicator: no CUDA GPU on this machine (",
                     count_error == cudaSuccess ? "0 devices" : cudaGetErrorString(count_error),
                     "); use the mpi communicator for host buffers"));
  }
  auto state = std::make_shared<NcclState>();
  state->bootstrap = options.bootstrap;
  state->rank = options.bootstrap->rank();
  state->world = options.bootstrap->world_size();
  if (options.cuda_device >= 0) {
    if (options.cuda_device >= device_count) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_device ", options.cuda_device,
                                                     " is out of range: this machine has ",
                                                     device_count, " GPU(s)"));
    }
    state->device = options.cuda_device;
  } else {
    int local_rank = state->rank;
    if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"); env != nullptr) {
      if (!absl::SimpleAtoi(env, &local_rank)) local_rank = state->rank;
    }
    state->device =
        comm_internal::NodeLocalCudaDevice(options.first_cuda_device, local_rank, device_count);
  }
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(state->device));

  ncclUniqueId id;
  if (state->rank == 0) {
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
  }
  RETURN_IF_ERROR(options.bootstrap->Broadcast(&id, &id, sizeof(id), CommDType::kU8, 0));
  ncclComm_t comm = nullptr;
  RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&comm, state->world, id, state->rank), nullptr,
                             "ncclCommInitRank"));
  {
    MutexLock lock(&state->mu);
    state->comm = comm;
  }
  auto communicator = absl::WrapUnique(new NcclCommunicator(state));  // cleans up from here on
  if (options.cuda_stream != nullptr) {
    state->stream = static_cast<cudaStream_t>(options.cuda_stream);
  } else {
    PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
    state->owns_stream = true;
  }
  PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&state->scratch, sizeof(int)));
  VLOG(1) << "NCCL " << NCCL_MAJOR << "." << NCCL_MINOR << " communicator: rank " << state->rank
          << " of " << state->world << " on GPU " << state->device;
  return communicator;
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(state_->device);
  {
    MutexLock lock(&state_->mu);
    if (!state_->aborted && state_->comm != nullptr) {
      if (state_->stream != nullptr) {
        const cudaError_t e = cudaStreamSynchronize(state_->stream);
        if (e != cudaSuccess) LOG(ERROR) << CudaStatus(e, "cudaStreamSynchronize");
      }
      ncclResult_t r = ncclCommFinalize(state_->comm);
      if (r != ncclSuccess) LOG(ERROR) << NcclStatus(r, state_->comm, "ncclCommFinalize");
      r = ncclCommDestroy(state_->comm);
      if (r != ncclSuccess) LOG(ERROR) << NcclStatus(r, nullptr, "ncclCommDestroy");
    }
    state_->comm = nullptr;
  }
  if (state_->scratch != nullptr) cudaFree(state_->scratch);
  if (state_->owns_stream && state_->stream != nullptr) cudaStreamDestroy(state_->stream);
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::world_size() const { return state_->world; }
int NcclCommunicator::cuda_device() const { return state_->device; }
void* NcclCommunicator::cuda_stream() const { return state_->stream; }

absl::StatusOr<std::unique_ptr<CommRequest>> NcclCommunicator::AllGatherAsync(const void* send,
                                                                              void* recv,
                                                                              int64_t count_elems,
                                                                              CommDType dtype) {
  nccl_internal::CollectiveCall call;
  call.kind = nccl_internal::Collective::kAllGather;
  call.send = send;
  call.recv = recv;
  call.count_elems = count_elems;
  call.dtype = dtype;
  cudaStream_t stream = state_->stream;
  return nccl_internal::Issue(state_, call, [&](ncclComm_t comm) {
    return ncclAllGather(send, recv, static_cast<size_t>(count_elems),
                         nccl_internal::NcclType(dtype), comm, stream);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> NcclCommunicator::ReduceScatterAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  nccl_internal::CollectiveCall call;
  call.kind = nccl_internal::Collective::kReduceScatter;
  call.send = send;
  call.recv = recv;
  call.count_elems = count_elems;
  call.dtype = dtype;
  call.op = op;
  cudaStream_t stream = state_->stream;
  return nccl_internal::Issue(state_, call, [&](ncclComm_t comm) {
    return ncclReduceScatter(send, recv, static_cast<size_t>(count_elems),
                             nccl_internal::NcclType(dtype), nccl_internal::NcclOp(op), comm,
                             stream);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> NcclCommunicator::AllReduceAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  nccl_internal::CollectiveCall call;
  call.kind = nccl_internal::Collective::kAllReduce;
  call.send = send;
  call.recv = recv;
  call.count_elems = count_elems;
  call.dtype = dtype;
  call.op = op;
  cudaStream_t stream = state_->stream;
  return nccl_internal::Issue(state_, call, [&](ncclComm_t comm) {
    return ncclAllReduce(send, recv, static_cast<size_t>(count_elems),
                         nccl_internal::NcclType(dtype), nccl_internal::NcclOp(op), comm, stream);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> NcclCommunicator::BroadcastAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, int root) {
  nccl_internal::CollectiveCall call;
  call.kind = nccl_internal::Collective::kBroadcast;
  call.send = send;
  call.recv = recv;
  call.count_elems = count_elems;
  call.dtype = dtype;
  call.root = root;
  cudaStream_t stream = state_->stream;
  return nccl_internal::Issue(state_, call, [&](ncclComm_t comm) {
    return ncclBroadcast(send, recv, static_cast<size_t>(count_elems),
                         nccl_internal::NcclType(dtype), root, comm, stream);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> NcclCommunicator::BarrierAsync() {
  nccl_internal::CollectiveCall call;
  call.kind = nccl_internal::Collective::kBarrier;
  cudaStream_t stream = state_->stream;
  int* scratch = state_->scratch;
  return nccl_internal::Issue(state_, call, [&](ncclComm_t comm) {
    return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, comm, stream);
  });
}

}  // namespace ps
