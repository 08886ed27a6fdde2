// CreateBackend's answers to `--accelerator=cuda` where it cannot be served. Built both ways:
// without --config=cuda it checks the "built without CUDA" refusal; with it, on a machine without
// a GPU, the "no CUDA device" refusal (and it reports SKIPPED where a GPU exists).
#include "memory/backend_factory.h"

#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include "memory/cuda/cuda_backend.h"
#endif

namespace ps {
namespace {

using ::testing::HasSubstr;

TEST(BackendFactory, UnknownKindNamesTheChoices) {
  EXPECT_THAT(CreateBackend({.kind = "tpu", .capacity_bytes = kMiB}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"tpu\""), HasSubstr("\"cpu\" or \"cuda\""))));
}

#if PS_WITH_CUDA

TEST(BackendFactory, CudaWithoutAGpuSaysNoDeviceIsAvailable) {
  EXPECT_TRUE(CudaBackendCompiledIn());
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present; this checks the no-GPU answer";
  EXPECT_THAT(
      CreateBackend({.kind = "cuda"}),
      StatusIs(absl::StatusCode::kUnavailable,
               ::testing::AllOf(HasSubstr("no CUDA device is available (cudaGetDeviceCount"),
                                HasSubstr("cpu backend"))));
}

#else  // !PS_WITH_CUDA

TEST(BackendFactory, CudaInABinaryWithoutCudaSaysHowToRebuild) {
  EXPECT_FALSE(CudaBackendCompiledIn());
  EXPECT_THAT(CreateBackend({.kind = "cuda"}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("built without CUDA support; rebuild with --config=cuda")));
}

#endif

}  // namespace
}  // namespace ps
