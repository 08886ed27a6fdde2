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

}  // namespace ps
