// The nccl communicator under the conformance suite, as a world of one bootstrapped over the
// local communicator (multi-GPU runs go through mpirun like the mpi tests). Every test reports
// SKIPPED on a machine without a GPU, and in a build without --config=cuda — never passed.
#include <memory>

#include "base/testing/status_matchers.h"
#include "comm/communicator.h"
#include "comm/communicator_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cuda_runtime.h>

#include <vector>

#include "comm/local_communicator.h"
#include "comm/testing/communicator_conformance.h"
#include "comm/nccl/nccl_communicator.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNccl() {
  NcclCommunicatorOptions options;
  options.bootstrap = std::make_shared<LocalCommunicator>();
  options.cuda_device = 0;
  auto comm = NcclCommunicator::Create(options);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Communicator>(*std::move(comm));
}

CommTestMemory CudaTestMemory() {
  CommTestMemory m;
  m.allocate = [](int64_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes > 0 ? bytes : 1), cudaSuccess);
    return p;
  };
  m.free = [](void* p) { EXPECT_EQ(cudaFree(p), cudaSuccess); };
  m.upload = [](void* dst, const void* src, int64_t bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  m.download = [](void* dst, const void* src, int64_t bytes) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  };
  return m;
}

INSTANTIATE_TEST_SUITE_P(Nccl, CommunicatorConformanceTest,
                         ::testing::Values(CommunicatorFactory{
                             "nccl", CreateNccl, CudaTestMemory(),
                             /*exact_float_reductions=*/false}),
                         CommunicatorFactoryName);

TEST(NcclCommunicator, RejectsHostBuffers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ASSERT_OK_AND_ASSIGN(auto comm, CreateNccl());
  std::vector<float> host(16);
  EXPECT_THAT(comm->AllReduceAsync(host.data(), host.data(), 16, CommDType::kF32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("device memory")));
}

TEST(NcclCommunicator, UnavailableWithoutGpu) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU path";
  EXPECT_THAT(CreateNccl(), StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("GPU")));
}

TEST(NcclCommunicator, NeedsABootstrap) {
  EXPECT_THAT(NcclCommunicator::Create({}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("bootstrap")));
}

#else  // !PS_WITH_CUDA

TEST(NcclCommunicator, NotBuilt) {
  CommunicatorOptions options;
  options.kind = "nccl";
  EXPECT_THAT(CreateCommunicator(options),
              StatusIs(absl::StatusCode::kUnimplemented, ::testing::HasSubstr("--config=cuda")));
  GTEST_SKIP() << "built without --config=cuda: the nccl communicator tests did not run";
}

#endif

}  // namespace
}  // namespace ps
