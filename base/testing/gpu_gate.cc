#include "base/testing/gpu_gate.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#if PS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ps {
namespace gpu_gate_internal {

CudaProbe ClassifyCudaProbe(const CudaAnswers& a) {
  CudaProbe probe;
  probe.compiled_in = true;
  const std::string versions =
      absl::StrCat("CUDA runtime ", a.runtime_version, ", driver ",
                   a.driver_known ? absl::StrCat(a.driver_version) : "unknown");
  if (a.count_error == kCudaSuccess && a.device_count > 0) {
    probe.device_count = a.device_count;
    probe.description = absl::StrCat(versions, ": ", a.device_count, " CUDA device(s)");
  } else if (CudaAnswersMeanNoDevice(a.count_error, a.device_count, a.driver_known,
                                     a.driver_version)) {
    probe.no_device = true;
    probe.description =
        a.count_error == kCudaErrorInsufficientDriver
            ? absl::StrCat(versions,
                           ": no CUDA device (no CUDA driver is installed: cudaDriverGetVersion "
                           "gives 0)")
            : absl::StrCat(versions, ": no CUDA device (cudaGetDeviceCount: ",
                           a.count_error == kCudaSuccess ? "0 devices" : a.count_error_name, ")");
  } else {
    probe.error = absl::StrCat("cudaGetDeviceCount failed with ", a.count_error_name, " (",
                               a.count_error_text, ")");
    if (a.count_error == kCudaErrorInsufficientDriver) {
      absl::StrAppend(&probe.error, ": the installed driver (", a.driver_version,
                      ") is older than the CUDA runtime this binary was built with (",
                      a.runtime_version,
                      "); install a newer driver or build with an older toolkit");
    }
    probe.description = absl::StrCat(versions, ": ", probe.error);
  }
  return probe;
}

}  // namespace gpu_gate_internal

namespace {

CudaProbe Probe() {
#if PS_WITH_CUDA
  static_assert(gpu_gate_internal::kCudaSuccess == cudaSuccess);
  static_assert(gpu_gate_internal::kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver);
  static_assert(gpu_gate_internal::kCudaErrorNoDevice == cudaErrorNoDevice);
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  // 0 when no CUDA driver is installed at all (documented), the driver's version otherwise.
  const bool driver_known = cudaDriverGetVersion(&driver) == cudaSuccess;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();  // clear the probe's error for later calls
  return gpu_gate_internal::ClassifyCudaProbe({.runtime_version = runtime,
                                               .driver_known = driver_known,
                                               .driver_version = driver,
                                               .count_error = static_cast<int>(e),
                                               .count_error_name = cudaGetErrorName(e),
                                               .count_error_text = cudaGetErrorString(e),
                                               .device_count = count});
#else
  CudaProbe probe;
  probe.no_device = true;
  probe.description = "built without --config=cuda: no CUDA in this binary";
  return probe;
#endif
}

}  // namespace

const CudaProbe& ProbeCuda() {
  static const CudaProbe* const probe = new CudaProbe(Probe());
  return *probe;
}

GpuGate CheckGpus(int gpus) {
  const CudaProbe& probe = ProbeCuda();
  int expected = 0;
  if (const char* env = std::getenv("PS_EXPECT_GPU"); env != nullptr && *env != '\0') {
    if (!absl::SimpleAtoi(env, &expected) || expected < 0) {
      return {
          GpuGate::Verdict::kFail,
          absl::StrCat("PS_EXPECT_GPU=\"", env,
                       "\" is not a GPU count: unset it, or set it to 0 (GPU tests may skip) or "
                       "N >= 1 (tests needing at most N GPUs must run)")};
    }
  }
  if (!probe.error.empty()) {
    return {GpuGate::Verdict::kFail,
            absl::StrCat("the CUDA runtime is present but unusable, which is not \"no GPU\": ",
                         probe.description)};
  }
  if (probe.device_count >= gpus) return {GpuGate::Verdict::kRun, ""};
  const bool must_run = expected >= gpus;
  std::string why;
  if (!probe.compiled_in) {
    why = "built without --config=cuda: this GPU test did not run";
  } else if (probe.no_device) {
    why = absl::StrCat(gpus > 1 ? absl::StrCat("needs ", gpus, " CUDA GPUs, found none: ") : "",
                       "no CUDA device: this GPU test did not run (", probe.description, ")");
  } else {
    why = absl::StrCat("needs ", gpus, " CUDA GPUs, this machine has ", probe.device_count);
  }
  if (must_run) {
    return {GpuGate::Verdict::kFail,
            absl::StrCat(why, "; PS_EXPECT_GPU=", expected, " says tests needing up to ", expected,
                         " GPU(s) must run here")};
  }
  return {GpuGate::Verdict::kSkip,
          absl::StrCat(why, " (set PS_EXPECT_GPU=", gpus,
                       " to make this a failure where the GPUs are expected)")};
}

absl::Status GpuGateStatus(int gpus) {
  const GpuGate gate = CheckGpus(gpus);
  switch (gate.verdict) {
    case GpuGate::Verdict::kRun:
      return absl::OkStatus();
    case GpuGate::Verdict::kSkip:
      return absl::UnavailableError(gate.message);
    case GpuGate::Verdict::kFail:
      break;
  }
  return absl::FailedPreconditionError(gate.message);
}

}  // namespace ps
