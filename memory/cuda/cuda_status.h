// CUDA runtime return codes as absl::Status, at the call site (the pattern of XLA's
// stream_executor/cuda/cuda_status.h). Every CUDA runtime call and kernel launch goes through one
// of these; nothing in this project ignores a cudaError_t.
#ifndef PATRICKSTAR_MEMORY_CUDA_CUDA_STATUS_H_
#define PATRICKSTAR_MEMORY_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

// OK for cudaSuccess; otherwise a Status whose message has `what`, the error's name and its
// description. cudaErrorMemoryAllocation maps to ResourceExhausted, invalid values to
// InvalidArgument, "no device" to Unavailable, everything else to Internal. A sticky error
// (IsStickyCudaError) also says that the CUDA context is unusable and the process must restart:
// every later CUDA call of the process fails with it, so the first message is the one to read.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

// Whether `error` is one the CUDA runtime documents as leaving the process's context unusable
// (a kernel fault: illegal address or instruction, misaligned address, device assert, launch
// failure or timeout, ...): "any further CUDA work will return the same error; to continue using
// CUDA, the process must be terminated and relaunched".
bool IsStickyCudaError(cudaError_t error);

// cudaEventQuery(event) without its side effect on the calling thread: the runtime records
// cudaErrorNotReady as the thread's last error, and every kernel launcher here ends with
// `return cudaGetLastError()`, so one poll of an unfinished event would make the next launch on
// that thread report "launch failed: cudaErrorNotReady". QueryEvent returns what the query
// returned and, on cudaErrorNotReady only, consumes the recorded error. Every event poll in this
// project (CudaEvent::Query, the nccl communicator's requests) goes through it.
cudaError_t QueryEvent(cudaEvent_t event);

namespace cuda_internal {
// QueryEvent with the two runtime calls passed in (tests drive it with a fake runtime).
cudaError_t QueryEventWith(cudaEvent_t event, cudaError_t (*query)(cudaEvent_t),
                           cudaError_t (*get_last_error)());
}  // namespace cuda_internal

}  // namespace ps

// Returns from the enclosing function if the CUDA runtime call `expr` failed.
#define PS_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                 \
    const cudaError_t ps_cuda_error_ = (expr);                                         \
    if (ps_cuda_error_ != cudaSuccess) return ::ps::CudaStatus(ps_cuda_error_, #expr); \
  } while (0)

#endif  // PATRICKSTAR_MEMORY_CUDA_CUDA_STATUS_H_
