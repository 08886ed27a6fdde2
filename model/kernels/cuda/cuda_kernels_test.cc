// CudaKernels under the Kernels conformance suite: every method against the CPU kernels (f64
// references, and the f32 kernels within rounding) on awkward shapes, argument errors, asynchrony
// behind a gate, stream-ordered scratch, data errors (NaN rows) and two concurrent streams. Every
// test reports SKIPPED on a machine without a GPU, and in a build without --config=cuda.
#include <vector>

#include "base/testing/gpu_gate.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
#include "model/kernels/testing/kernels_conformance.h"

#if PS_WITH_CUDA
#include "memory/cuda/cuda_backend.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/kernel_workspaces.h"
#include "model/kernels/kernels_factory.h"
#endif

namespace ps {
namespace {

using kernel_testing::KernelsConformanceTest;
using kernel_testing::KernelsFactory;
using kernel_testing::KernelsFactoryName;
using kernel_testing::KernelsUnderTest;

#if PS_WITH_CUDA

absl::StatusOr<KernelsUnderTest> MakeCuda(const cuda::CudaKernelsOptions& options) {
  // Unavailable (SKIPPED) only without a CUDA device; any other error, or no device under
  // PS_EXPECT_GPU, fails the suite's SetUp.
  if (absl::Status gate = GpuGateStatus(1); !gate.ok()) return gate;
  KernelsUnderTest env;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend({.kind = "cuda", .capacity_bytes = int64_t{1} << 30});
  if (!backend.ok()) return backend.status();
  env.backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<cuda::CudaKernels>> kernels =
      cuda::CudaKernels::Create(env.backend.get(), options);
  if (!kernels.ok()) return kernels.status();
  env.kernels = *std::move(kernels);
  return env;
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, KernelsConformanceTest,
    ::testing::Values(KernelsFactory{"cuda", [] { return MakeCuda({}); }, /*bit_identical=*/false},
                      // A small workspace (cuBLAS picks algorithms that fit it), and no pointer
                      // checks. 16 KiB, not less: cuBLAS documents that a user workspace under
                      // 16 KiB may make some routines fail with CUBLAS_STATUS_ALLOC_FAILED
                      // (ResourceExhausted here) instead of running without one.
                      KernelsFactory{"cuda_tiny_cublas_workspace",
                                     [] {
                                       return MakeCuda({.cublas_workspace_bytes = 16 * 1024,
                                                        .check_device_pointers = false});
                                     },
                                     false}),
    KernelsFactoryName);

TEST(CudaKernels, CreateRefusesOtherBackendsAndBadOptions) {
  EXPECT_THAT(cuda::CudaKernels::Create(nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "null"));
  ASSERT_OK_AND_ASSIGN(auto cpu, CreateBackend({.kind = "cpu", .capacity_bytes = 1 << 20}));
  EXPECT_THAT(cuda::CudaKernels::Create(cpu.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "cpu backend"));
  PS_REQUIRE_GPUS(1);
  ASSERT_OK_AND_ASSIGN(auto gpu, CreateBackend({.kind = "cuda", .capacity_bytes = 1 << 28}));
  EXPECT_THAT(cuda::CudaKernels::Create(gpu.get(), {.cublas_workspace_bytes = 100}),
              StatusIs(absl::StatusCode::kInvalidArgument, "multiple of 256"));
  ASSERT_OK_AND_ASSIGN(auto kernels, cuda::CudaKernels::Create(gpu.get()));
  EXPECT_GE(kernels->cublas_workspace_bytes(), int64_t{4} << 20);
  // The cuBLAS workspace is part of every GEMM's workspace: it comes from the caller.
  EXPECT_EQ(kernels->MatmulWorkspaceBytes({.rows = 8, .in_features = 8, .out_features = 8}),
            kernels->cublas_workspace_bytes());
}

// The pre-flight plan asks CreateKernelWorkspaces before the model's kernels exist; on this GPU it
// must answer what the kernels then ask for.
TEST(CudaKernels, ThePlansWorkspacesAreTheKernels) {
  PS_REQUIRE_GPUS(1);
  ASSERT_OK_AND_ASSIGN(auto gpu, CreateBackend({.kind = "cuda", .capacity_bytes = 1 << 28}));
  ASSERT_OK_AND_ASSIGN(auto kernels, CreateKernels(gpu.get()));
  ASSERT_OK_AND_ASSIGN(auto planned, CreateKernelWorkspaces(gpu.get(), /*cpu_threads=*/1));
  EXPECT_EQ(planned->name(), "cuda");
  const MatmulShape mm{.rows = 96, .in_features = 40, .out_features = 72};
  const VocabBlockShape block{.rows = 96,
                              .channels = 40,
                              .vocab_size = 500,
                              .row_begin = 256,
                              .block_rows = 244,
                              .row_tile = 64,
                              .vocab_tile = 128};
  const GqaAttentionShape gqa{
      .batch = 2, .seq_len = 48, .num_heads = 4, .num_kv_heads = 2, .head_dim = 10};
  EXPECT_EQ(planned->MatmulWorkspaceBytes(mm), kernels->MatmulWorkspaceBytes(mm));
  EXPECT_EQ(planned->MatmulBf16BackwardWorkspaceBytes(mm),
            kernels->MatmulBf16BackwardWorkspaceBytes(mm));
  EXPECT_EQ(planned->GqaAttentionBackwardWorkspaceBytes(gqa),
            kernels->GqaAttentionBackwardWorkspaceBytes(gqa));
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(planned->LmHeadBlockForwardWorkspaceBytes(block, dtype),
              kernels->LmHeadBlockForwardWorkspaceBytes(block, dtype));
    EXPECT_EQ(planned->LmHeadBlockBackwardWorkspaceBytes(block, dtype),
              kernels->LmHeadBlockBackwardWorkspaceBytes(block, dtype));
  }
}

TEST(CudaKernels, HostPointersAreRefusedAtEnqueue) {
  PS_REQUIRE_GPUS(1);
  ASSERT_OK_AND_ASSIGN(auto gpu, CreateBackend({.kind = "cuda", .capacity_bytes = 1 << 28}));
  ASSERT_OK_AND_ASSIGN(auto kernels, cuda::CudaKernels::Create(gpu.get()));
  ASSERT_OK_AND_ASSIGN(auto stream, gpu->CreateStream());
  ASSERT_OK_AND_ASSIGN(void* device, gpu->AllocateDevice(1024));
  std::vector<float> host(256);
  EXPECT_THAT(kernels->GeluForward(*stream, 256, host.data(), static_cast<float*>(device)),
              StatusIs(absl::StatusCode::kInvalidArgument, "GeluForward: x is host memory"));
  ASSERT_OK(stream->Synchronize());
  ASSERT_OK(gpu->FreeDevice(device));
}

#else  // !PS_WITH_CUDA

TEST(CudaKernels, NotBuilt) {
  EXPECT_FALSE(CudaBackendCompiledIn());
  PS_REQUIRE_GPUS(1);
}

#endif

}  // namespace
}  // namespace ps
