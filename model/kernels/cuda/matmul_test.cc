// cuda::Gemm and cuda::Matmul* against OpenBLAS (the CPU kernels) on awkward
// shapes, f32 and 16-bit operands. Every test reports SKIPPED without a GPU,
// and in a build without --config=cuda — never passed.
#include "base/testing/gpu_gate.h"
#include "gtest/gtest.h"

#if PS_WITH_CUDA
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "memory/dtype_math.h"
#include "model/kernels/cuda/cublas.h"
#include "model/kernels/cuda/cuda_test_util.h"
#include "model/kernels/cuda/matmul.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"
#endif

namespace ps {
namespace {

#if PS_WITH_CUDA

using ::ps::cuda_testing::DeviceVector;
using ::ps::cuda_testing::TestStream;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

class CudaMatmulTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_REQUIRE_GPUS(1);
    stream_.emplace();
    ASSERT_OK_AND_ASSIGN(cublas_, cuda::CublasHandle::Create());
  }
  std::optional<TestStream> stream_;  // created once a GPU is known to exist
  absl::StatusOr<cuda::CublasHandle> cublas_ = absl::UnknownError("not created");
};

// f32 products of values in [-1, 1] summed over k terms: each side's error is
// <= ~k * 6e-8 in the worst case (both accumulate in f32, in different
// orders/blockings), so 1e-6 * k + 1e-6 covers the difference with ~10x room.
double GemmTolerance(int64_t k) { return 1e-6 * static_cast<double>(k) + 1e-6; }

TEST_F(CudaMatmulTest, ForwardAndBackwardMatchCpu) {
  TestRng gen(1);  // fixed seed: reproducible failures
  for (const MatmulShape s : {MatmulShape{1, 1, 1}, MatmulShape{7, 13, 5}, MatmulShape{37, 64, 96},
                              MatmulShape{130, 33, 257}}) {
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    const auto x = RandomVector<float>(gen, N * I), w = RandomVector<float>(gen, I * O);
    const auto b = RandomVector<float>(gen, O), dy = RandomVector<float>(gen, N * O);
    auto dx = RandomVector<float>(gen, N * I), dw = RandomVector<float>(gen, I * O);
    auto db = RandomVector<float>(gen, O);
    DeviceVector<float> d_x(x), d_w(w), d_b(b), d_y(N * O), d_dy(dy), d_dx(dx), d_dw(dw), d_db(db);
    ASSERT_OK(cuda::MatmulForward(*cublas_, s, d_x.get(), d_w.get(), d_b.get(), d_y.get(),
                                  stream_->get()));
    ASSERT_OK(cuda::MatmulBackward(*cublas_, s, d_x.get(), d_w.get(), d_dy.get(), d_dx.get(),
                                   d_dw.get(), d_db.get(), stream_->get()));
    std::vector<float> y(N * O);
    ASSERT_OK(MatmulForward<float>(s, x, w, b, absl::MakeSpan(y), nullptr));
    ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                    absl::MakeSpan(db), nullptr));
    ExpectAllNear(d_y.Download(), y, GemmTolerance(I), 1e-6, "y");
    ExpectAllNear(d_dx.Download(), dx, GemmTolerance(O), 1e-6, "dx");
    ExpectAllNear(d_dw.Download(), dw, GemmTolerance(N), 1e-6, "dw");
    ExpectAllNear(d_db.Download(), db, GemmTolerance(N), 1e-6, "db");
  }
}

// Every transpose combination with padded leading dimensions, and 16-bit A and
// B: the CPU reference multiplies the same values widened back to f32, so only
// f32 accumulation differs.
TEST_F(CudaMatmulTest, GemmTransposesLeadingDimsAnd16BitOperands) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const int64_t m = 19, n = 45, k = 70, pad = 3;
  for (const cuda::GemmOperand type :
       {cuda::GemmOperand::kF32, cuda::GemmOperand::kF16, cuda::GemmOperand::kBF16}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, lda = a_cols + pad;
        const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n, ldb = b_cols + pad;
        const int64_t ldc = n + pad;
        auto a = RandomVector<float>(gen, a_rows * lda), b = RandomVector<float>(gen, b_rows * ldb);
        const auto c0 = RandomVector<float>(gen, m * ldc);
        std::vector<uint16_t> a16(a.size()), b16(b.size());
        if (type != cuda::GemmOperand::kF32) {
          const bool half = type == cuda::GemmOperand::kF16;
          for (size_t i = 0; i < a.size(); ++i) {
            a16[i] = half ? FloatToHalfBits(a[i]) : FloatToBFloat16Bits(a[i]);
            a[i] = half ? HalfBitsToFloat(a16[i]) : BFloat16BitsToFloat(a16[i]);
          }
          for (size_t i = 0; i < b.size(); ++i) {
            b16[i] = half ? FloatToHalfBits(b[i]) : FloatToBFloat16Bits(b[i]);
            b[i] = half ? HalfBitsToFloat(b16[i]) : BFloat16BitsToFloat(b16[i]);
          }
        }
        DeviceVector<float> d_a(a), d_b(b), d_c(c0);
        DeviceVector<uint16_t> d_a16(a16), d_b16(b16);
        const bool f32 = type == cuda::GemmOperand::kF32;
        ASSERT_OK(cuda::Gemm(*cublas_, stream_->get(), ta, tb, m, n, k, 0.5f, type,
                             f32 ? static_cast<const void*>(d_a.get()) : d_a16.get(), lda,
                             f32 ? static_cast<const void*>(d_b.get()) : d_b16.get(), ldb, 2.0f,
                             d_c.get(), ldc));
        std::vector<float> c = c0;
        kernels_internal::Gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(),
                               ldc, /*pool=*/nullptr);
        ExpectAllNear(d_c.Download(), c, GemmTolerance(k), 1e-6, "c");
      }
    }
  }
}

TEST_F(CudaMatmulTest, RejectsBadArguments) {
  DeviceVector<float> buf(64);
  EXPECT_THAT(cuda::MatmulForward(*cublas_, {0, 2, 2}, buf.get(), buf.get(), buf.get(), buf.get(),
                                  stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
  EXPECT_THAT(cuda::MatmulBackward(*cublas_, {2, 2, 2}, buf.get(), buf.get(), buf.get(), nullptr,
                                   buf.get(), buf.get(), stream_->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx is null")));
  EXPECT_THAT(cuda::Gemm(*cublas_, stream_->get(), false, false, 4, 4, 4, 1.0f, buf.get(), 3,
                         buf.get(), 4, 0.0f, buf.get(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lda")));
  EXPECT_THAT(cuda::CublasHandle::Create(-1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace_bytes")));
  // A moved-from handle is an error, not a crash.
  cuda::CublasHandle moved = std::move(*cublas_);
  EXPECT_THAT(cuda::Gemm(*cublas_, stream_->get(), false, false, 4, 4, 4, 1.0f, buf.get(), 4,
                         buf.get(), 4, 0.0f, buf.get(), 4),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("moved-from")));
}

#else  // !PS_WITH_CUDA

TEST(CudaMatmul, NotBuilt) { PS_REQUIRE_GPUS(1); }

#endif

}  // namespace
}  // namespace ps
