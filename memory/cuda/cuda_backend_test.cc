// The cuda backend under the backend conformance suite. Every test here reports SKIPPED on a
// machine without a GPU, and in a build without --config=cuda (where this file is compiled with no
// CUDA at all) — never passed.
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
#include "memory/testing/backend_conformance.h"

#if PS_WITH_CUDA
#include "memory/cuda/cuda_backend.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

constexpr int64_t kTestCapacityBytes = int64_t{512} << 20;

INSTANTIATE_TEST_SUITE_P(
    Cuda, BackendConformanceTest,
    ::testing::Values(BackendFactory{"cuda",
                                     [] {
                                       return CreateBackend({.kind = "cuda",
                                                             .capacity_bytes = kTestCapacityBytes});
                                     }}),
    BackendFactoryName);

TEST(CudaBackend, RejectsBadOptions) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  EXPECT_THAT(CreateCudaBackend({.device_index = CudaDeviceCount()}),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
  EXPECT_THAT(CreateCudaBackend({.capacity_bytes = int64_t{1} << 50}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cap"));
  EXPECT_THAT(CreateBackend({.kind = "cuda", .copy_bandwidth_bytes_per_s = 1e9}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cpu backend only"));
}

TEST(CudaBackend, UnavailableWithoutGpuIsReportedNotCrashed) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present; this checks the no-GPU path";
  EXPECT_THAT(CreateCudaBackend({}), StatusIs(absl::StatusCode::kUnavailable, "cpu backend"));
}

#else  // !PS_WITH_CUDA

TEST(CudaBackend, NotBuilt) {
  EXPECT_FALSE(CudaBackendCompiledIn());
  GTEST_SKIP() << "built without --config=cuda: the cuda backend tests did not run";
}

#endif

}  // namespace
}  // namespace ps
