#include "base/testing/gpu_gate.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#if PS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ps {
namespace {

CudaProbe Probe() {
  CudaProbe probe;
#if PS_WITH_CUDA
  probe.compiled_in = true;
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  // 0 when no CUDA driver is installed at all (documented), the driver's version otherwise.
  const cudaError_t driver_error = cudaDriverGetVersion(&driver);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();  // clear the probe's error for later calls
  const std::string versions =
      absl::StrCat("CUDA runtime ", runtime, ", driver ",
                   driver_error == cudaSuccess ? absl::StrCat(driver) : "unknown");
  if (e == cudaSuccess && count > 0) {
    probe.device_count = count;
    probe.description = absl::StrCat(versions, ": ", count, " CUDA device(s)");
  } else if (e == cudaSuccess || e == cudaErrorNoDevice) {
    probe.no_device = true;
    probe.description = absl::StrCat(versions, ": no CUDA device (cudaGetDeviceCount: ",
                                     e == cudaSuccess ? "0 devices" : cudaGetErrorName(e), ")");
  } else if (e == cudaErrorInsufficientDriver && driver_error == cudaSuccess && driver == 0) {
    probe.no_device = true;
    probe.description = absl::StrCat(
        versions, ": no CUDA device (no CUDA driver is installed: cudaDriverGetVersion gives 0)");
  } else {
    probe.error = absl::StrCat("cudaGetDeviceCount failed with ", cudaGetErrorName(e), " (",
                               cudaGetErrorString(e), ")");
    if (e == cudaErrorInsufficientDriver) {
      absl::StrAppend(&probe.error, ": the installed driver (", driver,
                      ") is older than the CUDA runtime this binary was built with (", runtime,
                      "); install a newer driver or build with an older toolkit");
    }
    probe.description = absl::StrCat(versions, ": ", probe.error);
  }
#else
  probe.no_device = true;
  probe.description = "built without --config=cuda: no CUDA in this binary";
#endif
  return probe;
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
