// The GPU tests' skip-or-fail rule. Runs in every build: on a machine without a GPU it checks that
// "no device" skips and PS_EXPECT_GPU turns that into a failure; where GPUs exist, that a test
// needing no more than them runs and one needing more skips unless PS_EXPECT_GPU covers it.
#include "base/testing/gpu_gate.h"

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using Verdict = GpuGate::Verdict;

class GpuGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = std::getenv("PS_EXPECT_GPU");
    if (old != nullptr) saved_ = old;
    had_ = old != nullptr;
    unsetenv("PS_EXPECT_GPU");
  }
  void TearDown() override { RestoreExpectGpu(); }
  void RestoreExpectGpu() {
    if (had_) {
      setenv("PS_EXPECT_GPU", saved_.c_str(), 1);
    } else {
      unsetenv("PS_EXPECT_GPU");
    }
  }

 private:
  bool had_ = false;
  std::string saved_;
};

TEST_F(GpuGateTest, ProbeDescribesWhatItFound) {
  const CudaProbe& probe = ProbeCuda();
  EXPECT_FALSE(probe.description.empty());
  EXPECT_EQ(&probe, &ProbeCuda()) << "probed once per process";
  if (!probe.compiled_in) {
    EXPECT_TRUE(probe.no_device);
  }
  if (probe.no_device) {
    EXPECT_EQ(probe.device_count, 0);
    EXPECT_TRUE(probe.error.empty());
  }
}

TEST_F(GpuGateTest, NoDeviceSkipsAndExpectGpuMakesItFail) {
  const CudaProbe& probe = ProbeCuda();
  if (!probe.no_device)
    GTEST_SKIP() << "this machine has a usable GPU or a CUDA error: " << probe.description;
  const GpuGate skip = CheckGpus(1);
  EXPECT_EQ(skip.verdict, Verdict::kSkip);
  EXPECT_THAT(skip.message,
              HasSubstr(probe.compiled_in ? "no CUDA device" : "built without --config=cuda"));
  EXPECT_THAT(skip.message, HasSubstr("PS_EXPECT_GPU=1"));
  EXPECT_TRUE(absl::IsUnavailable(GpuGateStatus(1)));

  setenv("PS_EXPECT_GPU", "1", 1);
  const GpuGate fail = CheckGpus(1);
  EXPECT_EQ(fail.verdict, Verdict::kFail);
  EXPECT_THAT(fail.message, HasSubstr("PS_EXPECT_GPU=1"));
  EXPECT_TRUE(absl::IsFailedPrecondition(GpuGateStatus(1)));
  // A 2-GPU test is not covered by PS_EXPECT_GPU=1: it still skips.
  EXPECT_EQ(CheckGpus(2).verdict, Verdict::kSkip);
  setenv("PS_EXPECT_GPU", "2", 1);
  EXPECT_EQ(CheckGpus(2).verdict, Verdict::kFail);
  setenv("PS_EXPECT_GPU", "0", 1);
  EXPECT_EQ(CheckGpus(1).verdict, Verdict::kSkip);
}

TEST_F(GpuGateTest, AvailableGpusRunAndMissingOnesSkipUnlessExpected) {
  const CudaProbe& probe = ProbeCuda();
  if (probe.device_count == 0) {
    RestoreExpectGpu();  // the caller's PS_EXPECT_GPU decides whether "no GPU" skips or fails
    PS_REQUIRE_GPUS(1);
  }
  EXPECT_EQ(CheckGpus(probe.device_count).verdict, Verdict::kRun);
  setenv("PS_EXPECT_GPU", "1", 1);
  EXPECT_EQ(CheckGpus(1).verdict, Verdict::kRun);
  const GpuGate more = CheckGpus(probe.device_count + 1);
  EXPECT_EQ(more.verdict, Verdict::kSkip)
      << "PS_EXPECT_GPU=1 does not cover a test needing more GPUs";
  EXPECT_THAT(more.message, HasSubstr("needs"));
}

TEST(GpuGateRule, OnlyNoDeviceOrNoDriverIsNoDevice) {
  using gpu_gate_internal::ClassifyCudaProbe;
  const CudaProbe gpus = ClassifyCudaProbe(
      {.runtime_version = 13000, .driver_known = true, .driver_version = 13000, .device_count = 2});
  EXPECT_EQ(gpus.device_count, 2);
  EXPECT_FALSE(gpus.no_device);
  EXPECT_TRUE(gpus.error.empty());

  const CudaProbe zero = ClassifyCudaProbe({.driver_known = true, .driver_version = 13000});
  EXPECT_TRUE(zero.no_device);
  EXPECT_THAT(zero.description, HasSubstr("no CUDA device (cudaGetDeviceCount: 0 devices)"));

  const CudaProbe none = ClassifyCudaProbe({.driver_known = true,
                                            .driver_version = 13000,
                                            .count_error = gpu_gate_internal::kCudaErrorNoDevice,
                                            .count_error_name = "cudaErrorNoDevice"});
  EXPECT_TRUE(none.no_device);
  EXPECT_TRUE(none.error.empty());

  const CudaProbe no_driver =
      ClassifyCudaProbe({.runtime_version = 13000,
                         .driver_known = true,
                         .driver_version = 0,
                         .count_error = gpu_gate_internal::kCudaErrorInsufficientDriver,
                         .count_error_name = "cudaErrorInsufficientDriver"});
  EXPECT_TRUE(no_driver.no_device);
  EXPECT_THAT(no_driver.description, HasSubstr("no CUDA driver is installed"));

  // A driver older than the runtime is not "no GPU": it fails, naming both versions.
  const CudaProbe old_driver =
      ClassifyCudaProbe({.runtime_version = 13000,
                         .driver_known = true,
                         .driver_version = 12040,
                         .count_error = gpu_gate_internal::kCudaErrorInsufficientDriver,
                         .count_error_name = "cudaErrorInsufficientDriver",
                         .count_error_text = "CUDA driver version is insufficient"});
  EXPECT_FALSE(old_driver.no_device);
  EXPECT_THAT(old_driver.error, HasSubstr("driver (12040) is older than the CUDA runtime"));
  EXPECT_THAT(old_driver.error, HasSubstr("(13000)"));

  const CudaProbe unknown = ClassifyCudaProbe({.driver_known = true,
                                               .driver_version = 13000,
                                               .count_error = 999,
                                               .count_error_name = "cudaErrorUnknown"});
  EXPECT_FALSE(unknown.no_device);
  EXPECT_THAT(unknown.error, HasSubstr("cudaErrorUnknown"));
}

TEST_F(GpuGateTest, ABadSwitchFailsNamingIt) {
  if (!ProbeCuda().error.empty())
    GTEST_SKIP() << "the CUDA error fails first: " << ProbeCuda().error;
  setenv("PS_EXPECT_GPU", "yes", 1);
  const GpuGate gate = CheckGpus(1);
  EXPECT_EQ(gate.verdict, Verdict::kFail);
  EXPECT_THAT(gate.message, HasSubstr("PS_EXPECT_GPU=\"yes\""));
}

}  // namespace
}  // namespace ps
