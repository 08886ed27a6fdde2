#include "memory/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace ps {

bool IsStickyCudaError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
      return true;
    default:
      return false;
  }
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, " failed: ", cudaGetErrorName(error), " (",
                                     cudaGetErrorString(error), ")");
  if (IsStickyCudaError(error)) {
    absl::StrAppend(
        &message,
        ". This error is sticky: a kernel faulted and the CUDA context of this "
        "process is unusable, so every later CUDA call fails with it too (read the "
        "first such error, not the ones after it). Restart the process; to find the "
        "faulting kernel, rerun with CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer");
  }
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace cuda_internal {

cudaError_t QueryEventWith(cudaEvent_t event, cudaError_t (*query)(cudaEvent_t),
                           cudaError_t (*get_last_error)()) {
  const cudaError_t e = query(event);
  // NotReady is not an error, but the runtime keeps it as the thread's last error. Any other
  // failure stays recorded: it is a real error and the caller reports it.
  if (e == cudaErrorNotReady) (void)get_last_error();
  return e;
}

}  // namespace cuda_internal

cudaError_t QueryEvent(cudaEvent_t event) {
  return cuda_internal::QueryEventWith(event, &cudaEventQuery, &cudaGetLastError);
}

}  // namespace ps
