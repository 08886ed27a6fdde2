// The one rule that tells "this machine has no CUDA device" from "the CUDA setup is broken", from
// what the CUDA runtime answers (cudaGetDeviceCount, cudaDriverGetVersion). CUDA-free, so the rule
// is the same, and testable, in every build: memory/cuda/cuda_backend.cc uses it to return
// Unavailable (no device: use the cpu backend) or FailedPrecondition (broken: fix the driver), and
// base/testing/gpu_gate.h to let a GPU test skip or make it fail.
#ifndef PATRICKSTAR_BASE_CUDA_DEVICE_RULE_H_
#define PATRICKSTAR_BASE_CUDA_DEVICE_RULE_H_

namespace ps {

// cudaError_t values the rule needs (static_assert-ed against the runtime's where it is included
// in a CUDA build).
inline constexpr int kCudaSuccessCode = 0;
inline constexpr int kCudaErrorInsufficientDriverCode = 35;
inline constexpr int kCudaErrorNoDeviceCode = 100;

// No device: cudaGetDeviceCount succeeded with 0 devices, said cudaErrorNoDevice, or said
// cudaErrorInsufficientDriver while no driver is installed at all (cudaDriverGetVersion gives 0).
// Any other error (an installed driver older than the runtime, say) is a broken setup.
constexpr bool CudaAnswersMeanNoDevice(int count_error, int device_count, bool driver_known,
                                       int driver_version) {
  return (count_error == kCudaSuccessCode && device_count == 0) ||
         count_error == kCudaErrorNoDeviceCode ||
         (count_error == kCudaErrorInsufficientDriverCode && driver_known && driver_version == 0);
}

}  // namespace ps

#endif  // PATRICKSTAR_BASE_CUDA_DEVICE_RULE_H_
