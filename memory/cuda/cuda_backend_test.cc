// The cuda backend under the backend conformance suite. Every test here reports SKIPPED on a
// machine without a CUDA device, and in a build without --config=cuda (where this file is compiled
// with no CUDA at all) — never passed; under PS_EXPECT_GPU=1 those skips fail
// (base/testing/gpu_gate.h).
#include "base/status_macros.h"
#include "base/testing/gpu_gate.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"
#include "memory/testing/backend_conformance.h"

#if PS_WITH_CUDA
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <vector>

#include "memory/cuda/convert_kernels.h"
#include "memory/cuda/cuda_backend.h"
#include "memory/dtype_math.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

constexpr int64_t kTestCapacityBytes = int64_t{512} << 20;

INSTANTIATE_TEST_SUITE_P(Cuda, BackendConformanceTest,
                         ::testing::Values(BackendFactory{
                             "cuda",
                             []() -> absl::StatusOr<std::unique_ptr<Backend>> {
                               // Unavailable (SKIPPED) only without a CUDA device.
                               RETURN_IF_ERROR(GpuGateStatus(1));
                               return CreateBackend(
                                   {.kind = "cuda", .capacity_bytes = kTestCapacityBytes});
                             }}),
                         BackendFactoryName);

TEST(CudaBackend, RejectsBadOptions) {
  PS_REQUIRE_GPUS(1);
  EXPECT_THAT(CreateCudaBackend({.device_index = CudaDeviceCount()}),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
  EXPECT_THAT(CreateCudaBackend({.capacity_bytes = int64_t{1} << 50}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cap"));
  EXPECT_THAT(CreateBackend({.kind = "cuda", .copy_bandwidth_bytes_per_s = 1e9}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cpu backend only"));
}

// The cap is checked against free memory minus the margin, not the total: a cap the card has but
// cannot give (the context, cuBLAS and NCCL live outside it) is refused up front, and no cap means
// the free memory minus the margin.
TEST(CudaBackend, CapsAgainstFreeMemoryMinusTheMargin) {
  PS_REQUIRE_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const int64_t usable = static_cast<int64_t>(free_bytes) - kCudaRuntimeMarginBytes;
  ASSERT_GT(usable, kTestCapacityBytes);
  EXPECT_THAT(CreateCudaBackend({.capacity_bytes = static_cast<int64_t>(total_bytes) - (1 << 20)}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("free")));
  ASSERT_OK_AND_ASSIGN(auto whole, CreateCudaBackend({}));
  EXPECT_LE(whole->capacity_bytes(), usable + (64 << 20));  // free memory may move a little
  EXPECT_GT(whole->capacity_bytes(), usable - (256 << 20));
  ASSERT_OK_AND_ASSIGN(auto wide_margin,
                       CreateCudaBackend({.margin_bytes = CudaMarginBytes(/*nccl=*/true)}));
  EXPECT_LT(wide_margin->capacity_bytes(), whole->capacity_bytes());
}

TEST(CudaBackend, UnavailableWithoutGpuIsReportedNotCrashed) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present; this checks the no-GPU path";
  EXPECT_THAT(CreateCudaBackend({}), StatusIs(absl::StatusCode::kUnavailable, "cpu backend"));
}

// The GPU conversion kernels give the same bits as the CPU's dtype_math.h functions: every f16 and
// bf16 pattern widened, and 4M random f32 patterns (plus every tie) narrowed.
TEST(CudaConvertKernels, MatchTheCpuBitForBit) {
  PS_REQUIRE_GPUS(1);
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCudaBackend({.capacity_bytes = kTestCapacityBytes}));
  ASSERT_OK_AND_ASSIGN(auto stream, backend->CreateStream());
  auto* cuda_stream = static_cast<cudaStream_t>(stream->native_handle());

  std::vector<float> f32(1 << 22);
  std::mt19937 rng(1234);
  for (size_t i = 0; i < f32.size(); ++i) {
    const uint32_t bits = i < 65536 ? (static_cast<uint32_t>(i) << 16) | 0x8000u  // bf16 ties
                                    : static_cast<uint32_t>(rng());
    std::memcpy(&f32[i], &bits, 4);
  }
  std::vector<uint16_t> all16(65536);
  for (int i = 0; i < 65536; ++i) all16[i] = static_cast<uint16_t>(i);

  const int64_t n32 = static_cast<int64_t>(f32.size());
  ASSERT_OK_AND_ASSIGN(void* d_f32, backend->AllocateDevice(n32 * 4));
  ASSERT_OK_AND_ASSIGN(void* d_u16, backend->AllocateDevice(n32 * 2));
  ASSERT_OK_AND_ASSIGN(void* d_in16, backend->AllocateDevice(65536 * 2));
  ASSERT_OK_AND_ASSIGN(void* d_out32, backend->AllocateDevice(65536 * 4));
  ASSERT_OK(stream->MemcpyAsync(d_f32, f32.data(), n32 * 4, CopyKind::kHostToDevice));
  ASSERT_OK(stream->MemcpyAsync(d_in16, all16.data(), 65536 * 2, CopyKind::kHostToDevice));

  std::vector<uint16_t> got16(f32.size());
  std::vector<float> got32(65536);
  for (bool bf16 : {false, true}) {
    ASSERT_EQ(bf16 ? cuda::LaunchConvertF32ToBF16(static_cast<float*>(d_f32),
                                                  static_cast<uint16_t*>(d_u16), n32, cuda_stream)
                   : cuda::LaunchConvertF32ToF16(static_cast<float*>(d_f32),
                                                 static_cast<uint16_t*>(d_u16), n32, cuda_stream),
              cudaSuccess);
    ASSERT_OK(stream->MemcpyAsync(got16.data(), d_u16, n32 * 2, CopyKind::kDeviceToHost));
    ASSERT_EQ(bf16 ? cuda::LaunchConvertBF16ToF32(static_cast<uint16_t*>(d_in16),
                                                  static_cast<float*>(d_out32), 65536, cuda_stream)
                   : cuda::LaunchConvertF16ToF32(static_cast<uint16_t*>(d_in16),
                                                 static_cast<float*>(d_out32), 65536, cuda_stream),
              cudaSuccess);
    ASSERT_OK(stream->MemcpyAsync(got32.data(), d_out32, 65536 * 4, CopyKind::kDeviceToHost));
    ASSERT_OK(stream->Synchronize());
    for (size_t i = 0; i < f32.size(); ++i) {
      const uint16_t want = bf16 ? FloatToBFloat16Bits(f32[i]) : FloatToHalfBits(f32[i]);
      ASSERT_EQ(got16[i], want) << (bf16 ? "bf16" : "f16") << " narrowing, element " << i;
    }
    for (int i = 0; i < 65536; ++i) {
      const float want = bf16 ? BFloat16BitsToFloat(static_cast<uint16_t>(i))
                              : HalfBitsToFloat(static_cast<uint16_t>(i));
      uint32_t a, b;
      std::memcpy(&a, &got32[i], 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << (bf16 ? "bf16" : "f16") << " widening, pattern " << i;
    }
  }
  for (void* p : {d_f32, d_u16, d_in16, d_out32}) EXPECT_OK(backend->FreeDevice(p));
}

#else  // !PS_WITH_CUDA

TEST(CudaBackend, NotBuilt) {
  EXPECT_FALSE(CudaBackendCompiledIn());
  PS_REQUIRE_GPUS(1);
}

#endif

}  // namespace
}  // namespace ps
