// KernelWorkspaces: the CPU kernels' sizes (what CpuKernels asks for, and what its operations
// really need: an operation given exactly the answered bytes runs), and the CUDA kernels' (the
// cuBLAS workspace in exactly the operations that run a cuBLAS GEMM, after the kernels' own part;
// NVIDIA's default by compute capability).
#include "model/kernels/kernel_workspaces.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"
#include "memory/dtype.h"
#include "model/kernels/cpu_kernels.h"
#include "model/kernels/cuda/workspace_sizes.h"
#include "model/kernels/kernels.h"

namespace ps {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

const MatmulShape kMatmul{.rows = 6, .in_features = 10, .out_features = 14};
const LinearShape kLinear{.rows = 6, .in_features = 10, .out_features = 14, .bias = true};
// GPT-2's multi-head attention on a fused qkv [B, T, 3C] (C = 12): kv heads = heads, head_dim =
// C / H, q, k and v read from the one buffer through row strides of 3C.
const GqaAttentionShape kFusedQkv{.batch = 2,
                                  .seq_len = 9,
                                  .num_heads = 3,
                                  .num_kv_heads = 3,
                                  .head_dim = 4,
                                  .tile = 4,
                                  .q_row_stride = 36,
                                  .kv_row_stride = 36};
const GqaAttentionShape kGqa{
    .batch = 2, .seq_len = 9, .num_heads = 4, .num_kv_heads = 2, .head_dim = 6, .tile = 4};
const LmHeadCrossEntropyShape kCe{
    .rows = 6, .channels = 10, .vocab_size = 50, .row_tile = 4, .vocab_tile = 16};
const VocabBlockShape kBlock{.rows = 6,
                             .channels = 10,
                             .vocab_size = 50,
                             .row_begin = 16,
                             .block_rows = 20,
                             .row_tile = 4,
                             .vocab_tile = 16};

TEST(CpuKernelWorkspaces, AreWhatCpuKernelsAskFor) {
  std::unique_ptr<Backend> backend = *CreateCpuBackend({.capacity_bytes = 64 * kMiB});
  for (int threads : {1, 2, 5}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    std::unique_ptr<CpuKernels> kernels = *CpuKernels::Create(backend.get(), {.pool = &pool});
    const CpuKernelWorkspaces w(threads);
    EXPECT_EQ(kernels->workspaces().name(), "cpu");
    EXPECT_EQ(w.GqaAttentionForwardWorkspaceBytes(kFusedQkv),
              kernels->GqaAttentionForwardWorkspaceBytes(kFusedQkv));
    EXPECT_EQ(w.GqaAttentionForwardWorkspaceBytes(kGqa),
              kernels->GqaAttentionForwardWorkspaceBytes(kGqa));
    // Per thread: the attention forwards grow with the pool, nothing else does.
    EXPECT_EQ(w.GqaAttentionForwardWorkspaceBytes(kFusedQkv),
              threads * CpuKernelWorkspaces(1).GqaAttentionForwardWorkspaceBytes(kFusedQkv));
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      EXPECT_EQ(w.LmHeadBlockForwardWorkspaceBytes(kBlock, dtype),
                kernels->LmHeadBlockForwardWorkspaceBytes(kBlock, dtype));
      EXPECT_EQ(w.LmHeadBlockBackwardWorkspaceBytes(kBlock, dtype),
                kernels->LmHeadBlockBackwardWorkspaceBytes(kBlock, dtype));
    }
    // The 4-bit Linear: one dequantized tile of W per thread, the larger of the forward's (the rows
    // of W in one column block of the GEMM grid, internal/blas.h) and the backward's (columns):
    // all of W here; for in 600, out 1000 the backward's 160 columns (a quarter of 600 rounded up
    // to 16) of 1000 rows beat the forward's 256 rows of 600.
    EXPECT_EQ(w.Quant4LinearWorkspaceBytes(kLinear), kernels->Quant4LinearWorkspaceBytes(kLinear));
    EXPECT_EQ(w.Quant4LinearWorkspaceBytes(kLinear), threads * 14 * 10 * 4);
    const LinearShape wide{.rows = 3, .in_features = 600, .out_features = 1000};
    EXPECT_EQ(w.Quant4LinearWorkspaceBytes(wide), threads * 160 * 1000 * 4);
    // The paths the CPU runs without a workspace (a CUDA run has one on each).
    EXPECT_EQ(w.MatmulWorkspaceBytes(kMatmul), 0);
    EXPECT_EQ(w.LinearWorkspaceBytes(kLinear), 0);
    EXPECT_EQ(w.GqaAttentionBackwardWorkspaceBytes(kFusedQkv), 0);
    EXPECT_EQ(w.GqaAttentionBackwardWorkspaceBytes(kGqa), 0);
  }
}

// A 16-bit GEMM given exactly GemmWorkspaceBytes runs, for every transpose (the f16 operands are
// widened into the workspace as stored: [m,k] or [k,m], [k,n] or [n,k]).
TEST(CpuKernelWorkspaces, A16BitGemmRunsInExactlyTheAnsweredWorkspace) {
  std::unique_ptr<Backend> backend = *CreateCpuBackend({.capacity_bytes = 64 * kMiB});
  std::unique_ptr<CpuKernels> kernels = *CpuKernels::Create(backend.get());
  std::unique_ptr<Stream> stream = *backend->CreateStream();
  const int64_t m = 5, n = 7, k = 3;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << DTypeName(dtype) << " ta " << ta << " tb " << tb);
        const GemmShape s{.trans_a = ta,
                          .trans_b = tb,
                          .m = m,
                          .n = n,
                          .k = k,
                          .lda = ta ? m : k,
                          .ldb = tb ? k : n,
                          .ldc = n,
                          .ab_dtype = dtype};
        const int64_t ws_bytes = kernels->workspaces().GemmWorkspaceBytes(s);
        EXPECT_EQ(ws_bytes, dtype == DType::kF16 ? (m * k + k * n) * 4 : m * n * 4);
        std::vector<void*> buffers;
        auto alloc = [&](int64_t bytes) {
          void* p = *backend->AllocateDevice(bytes);
          std::memset(p, 0, static_cast<size_t>(bytes));
          buffers.push_back(p);
          return p;
        };
        void* a = alloc(m * k * 2);
        void* b = alloc(k * n * 2);
        auto* c = static_cast<float*>(alloc(m * n * 4));
        void* ws = alloc(ws_bytes);
        ASSERT_OK(kernels->Gemm(*stream, s, 0.5f, a, b, 0.25f, c, ws, ws_bytes));
        ASSERT_OK(stream->Synchronize());
        EXPECT_THAT(kernels->Gemm(*stream, s, 0.5f, a, b, 0.25f, c, ws, ws_bytes - 4),
                    StatusIs(absl::StatusCode::kInvalidArgument, "workspace has"));
        for (void* p : buffers) ASSERT_OK(backend->FreeDevice(p));
      }
    }
  }
}

TEST(CudaKernelWorkspaces, DefaultCublasWorkspaceByComputeCapability) {
  EXPECT_EQ(CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(7), 4 * kMiB);
  EXPECT_EQ(CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(8), 4 * kMiB);
  EXPECT_EQ(CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(9), 32 * kMiB);
  EXPECT_EQ(CudaKernelWorkspaces::DefaultCublasWorkspaceBytes(10), 32 * kMiB);
}

TEST(CudaKernelWorkspaces, CublasWorkspaceInEveryGemmAfterTheKernelsOwnPart) {
  for (int64_t cublas : {int64_t{0}, int64_t{256}, 32 * kMiB}) {
    SCOPED_TRACE(cublas);
    const CudaKernelWorkspaces w(cublas);
    EXPECT_EQ(w.name(), "cuda");
    EXPECT_EQ(w.cublas_workspace_bytes(), cublas);
    const GemmShape gemm{.m = 4, .n = 4, .k = 4, .lda = 4, .ldb = 4, .ldc = 4};
    EXPECT_EQ(w.GemmWorkspaceBytes(gemm), cublas);
    EXPECT_EQ(w.MatmulWorkspaceBytes(kMatmul), cublas);
    EXPECT_EQ(w.LinearWorkspaceBytes(kLinear), cublas);
    EXPECT_EQ(w.MatmulBf16ForwardWorkspaceBytes(kMatmul),
              cuda::MatmulBf16ForwardWorkspaceBytes(kMatmul) + cublas);
    EXPECT_EQ(w.MatmulBf16BackwardWorkspaceBytes(kMatmul),
              cuda::MatmulBf16BackwardWorkspaceBytes(kMatmul) + cublas);
    EXPECT_EQ(w.LmHeadCrossEntropyWorkspaceBytes(kCe),
              cuda::LmHeadCrossEntropyWorkspaceBytes(kCe) + cublas);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      EXPECT_EQ(w.LmHeadBlockForwardWorkspaceBytes(kBlock, dtype),
                cuda::LmHeadBlockForwardWorkspaceBytes(kBlock, dtype) + cublas);
      EXPECT_EQ(w.LmHeadBlockBackwardWorkspaceBytes(kBlock, dtype),
                cuda::LmHeadBlockBackwardWorkspaceBytes(kBlock, dtype) + cublas);
    }
    // The 4-bit Linear: the dequantized tile (the whole W when small, aligned), then cuBLAS's.
    EXPECT_EQ(w.Quant4LinearWorkspaceBytes(kLinear), 768 + cublas);  // 14*10 f32 = 560 -> 768
    const LinearShape big{.rows = 2, .in_features = 4096, .out_features = 11008};
    EXPECT_EQ(w.Quant4LinearWorkspaceBytes(big), 16 * kMiB + cublas);  // the tile budget
    // No GEMM in attention: the kernels' own part only (none in the forwards).
    EXPECT_EQ(w.GqaAttentionForwardWorkspaceBytes(kFusedQkv), 0);
    EXPECT_EQ(w.GqaAttentionForwardWorkspaceBytes(kGqa), 0);
    EXPECT_EQ(w.GqaAttentionBackwardWorkspaceBytes(kFusedQkv), 2 * 3 * 9 * 4);
    EXPECT_EQ(w.GqaAttentionBackwardWorkspaceBytes(kGqa), 2 * 4 * 9 * 4);
  }
}

}  // namespace
}  // namespace ps
