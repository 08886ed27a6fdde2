// The one rule every GPU test uses to decide whether it runs, reports SKIPPED or fails.
//
// A GPU test skips only when this process has no CUDA device to use, or when it was built without
// --config=cuda; it fails on any other CUDA error (a driver older than the runtime, a busy device,
// an unknown error), since "SKIPPED" would then hide a broken machine. With PS_EXPECT_GPU=N
// (N >= 1) in the environment, a test that needs at most N GPUs fails instead of skipping: set it
// where GPUs are expected (tools/gpu_kit/run.sh does), so a green run means the tests ran. Tests
// needing more GPUs than N still skip, naming the count (a 2-GPU test on a 1-GPU machine).
//
//   TEST(Foo, Bar) { PS_REQUIRE_GPUS(1); ... }            // in a test body or a fixture's SetUp
//   factory: RETURN_IF_ERROR(ps::GpuGateStatus(1));      // for conformance-suite factories
//
// The probe (cudaDriverGetVersion, cudaGetDeviceCount) runs once per process.
#ifndef PATRICKSTAR_BASE_TESTING_GPU_GATE_H_
#define PATRICKSTAR_BASE_TESTING_GPU_GATE_H_

#include <string>

#include "absl/status/status.h"
#include "base/cuda_device_rule.h"
#include "gtest/gtest.h"

namespace ps {

struct GpuGate {
  enum class Verdict { kRun, kSkip, kFail };
  Verdict verdict = Verdict::kRun;
  std::string message;  // why it skips or fails; empty for kRun
};

// What the CUDA runtime of this process reports, probed once.
struct CudaProbe {
  bool compiled_in = false;  // built with --config=cuda
  bool no_device = false;    // no device or no driver: the only "skip" answers
  int device_count = 0;      // valid when `error` is empty
  std::string error;         // a CUDA error that is not "no device" (fails the tests)
  std::string description;   // one line: runtime/driver versions and the device count or error
};
const CudaProbe& ProbeCuda();

namespace gpu_gate_internal {

// cudaError_t values the classification needs (static_assert-ed against the runtime's in a CUDA
// build), so the rule is testable in every build.
inline constexpr int kCudaSuccess = kCudaSuccessCode;
inline constexpr int kCudaErrorInsufficientDriver = kCudaErrorInsufficientDriverCode;
inline constexpr int kCudaErrorNoDevice = kCudaErrorNoDeviceCode;

// What the CUDA runtime answered to the probe's calls.
struct CudaAnswers {
  int runtime_version = 0;            // cudaRuntimeGetVersion
  bool driver_known = false;          // cudaDriverGetVersion succeeded
  int driver_version = 0;             // its answer: 0 when no driver is installed
  int count_error = 0;                // cudaGetDeviceCount's cudaError_t
  std::string count_error_name = "";  // cudaGetErrorName of it
  std::string count_error_text = "";  // cudaGetErrorString of it
  int device_count = 0;
};

// The rule: a device count > 0 runs; 0 devices, cudaErrorNoDevice, or cudaErrorInsufficientDriver
// with no driver installed (version 0) is "no device"; anything else (an installed driver older
// than the runtime included) is an error that fails the tests.
CudaProbe ClassifyCudaProbe(const CudaAnswers& answers);

}  // namespace gpu_gate_internal

// The test's verdict when it needs `gpus` CUDA devices, under the current PS_EXPECT_GPU.
GpuGate CheckGpus(int gpus);

// CheckGpus as a status, for factories feeding the conformance suites (which skip on Unavailable
// and fail on any other error): OK to run, Unavailable to skip, FailedPrecondition to fail.
absl::Status GpuGateStatus(int gpus);

}  // namespace ps

// Makes the calling test (body or SetUp) skip or fail unless `gpus` CUDA devices can be used.
#define PS_REQUIRE_GPUS(gpus)                                          \
  do {                                                                 \
    const ::ps::GpuGate ps_gpu_gate = ::ps::CheckGpus(gpus);           \
    if (ps_gpu_gate.verdict == ::ps::GpuGate::Verdict::kFail) {        \
      GTEST_FAIL() << ps_gpu_gate.message;                             \
    } else if (ps_gpu_gate.verdict == ::ps::GpuGate::Verdict::kSkip) { \
      GTEST_SKIP() << ps_gpu_gate.message;                             \
    }                                                                  \
  } while (0)

#endif  // PATRICKSTAR_BASE_TESTING_GPU_GATE_H_
