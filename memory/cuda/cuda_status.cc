#include "memory/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, " failed: ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ")");
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
