#include "model/kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype_math.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

TEST(MatmulTest, ForwardAndBackwardMatchNaiveLoops) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const MatmulShape s :
       {MatmulShape{1, 3, 5}, MatmulShape{17, 33, 99}, MatmulShape{40, 24, 130}}) {
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    const std::vector<float> x = RandomVector<float>(gen, N * I);
    const std::vector<float> w = RandomVector<float>(gen, I * O);
    const std::vector<float> b = RandomVector<float>(gen, O);
    const std::vector<float> dy = RandomVector<float>(gen, N * O);
    std::vector<float> y(N * O, 9.f), dx(N * I, 1.f), dw(I * O, 2.f), db(O, 3.f);
    ASSERT_OK(MatmulForward<float>(s, x, w, b, absl::MakeSpan(y), &pool));
    ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                    absl::MakeSpan(db), &pool));
    std::vector<double> y_ref(N * O), dx_ref(N * I, 1.0), dw_ref(I * O, 2.0), db_ref(O, 3.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = b[o];
        for (int64_t i = 0; i < I; ++i) {
          acc += double{x[n * I + i]} * w[i * O + o];
          dx_ref[n * I + i] += double{dy[n * O + o]} * w[i * O + o];
          dw_ref[i * O + o] += double{x[n * I + i]} * dy[n * O + o];
        }
        y_ref[n * O + o] = acc;
        db_ref[o] += dy[n * O + o];
      }
    }
    // Float dot products of K terms of magnitude <= 1: error <= ~K * 6e-8 in the worst case,
    // sqrt(K) typically; with K <= 130, 1e-5 absolute is an honest worst-case bound.
    ExpectAllNear(y, y_ref, 1e-5, 1e-6, "y");
    ExpectAllNear(dx, dx_ref, 1e-5, 1e-6, "dx");
    ExpectAllNear(dw, dw_ref, 1e-5, 1e-6, "dw");
    ExpectAllNear(db, db_ref, 1e-5, 1e-6, "db");
  }
}

TEST(MatmulTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const MatmulShape s{4, 5, 7};
  std::vector<double> x = RandomVector<double>(gen, 20), w = RandomVector<double>(gen, 35),
                      b = RandomVector<double>(gen, 7);
  const std::vector<double> r = RandomVector<double>(gen, 28);
  std::vector<double> y(28);
  auto loss = [&]() {
    PS_CHECK_OK(MatmulForward<double>(s, x, w, b, absl::MakeSpan(y), nullptr));
    return Dot(y, r);
  };
  std::vector<double> dx(20, 0.0), dw(35, 0.0), db(7, 0.0);
  ASSERT_OK(MatmulBackward<double>(s, x, w, r, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                   absl::MakeSpan(db), nullptr));
  ExpectGradientMatchesFiniteDifferences(x, dx, loss, "dx", 1e-8, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(w, dw, loss, "dw", 1e-8, 1e-7, 1000);
  ExpectGradientMatchesFiniteDifferences(b, db, loss, "db", 1e-8, 1e-7, 1000);
}

TEST(MatmulTest, ResultsDoNotDependOnPoolThreads) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const MatmulShape s{300, 8, 200};
  const std::vector<float> x = RandomVector<float>(gen, 2400), w = RandomVector<float>(gen, 1600),
                           dy = RandomVector<float>(gen, 60000);
  std::vector<float> db1(200, 0.f), db2(200, 0.f), dx(2400), dw(1600);
  ThreadPool pool(4);
  ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                  absl::MakeSpan(db1), nullptr));
  ASSERT_OK(MatmulBackward<float>(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                  absl::MakeSpan(db2), &pool));
  EXPECT_EQ(db1, db2);
}

// --- bf16 GEMMs, on each backend --------------------------------------------------------------

using kernels_internal::Bf16GemmBackend;

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBFloat16Bits(v[i]);
  return out;
}
double Bf16(float x) { return BFloat16BitsToFloat(FloatToBFloat16Bits(x)); }

class MatmulBf16Test : public ::testing::TestWithParam<Bf16GemmBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == Bf16GemmBackend::kOneDnn && !kernels_internal::OneDnnBf16Available()) {
      GTEST_SKIP() << kernels_internal::OneDnnBf16Description();
    }
    kernels_internal::SetBf16GemmBackendForTest(GetParam());
  }
  void TearDown() override { kernels_internal::SetBf16GemmBackendForTest(Bf16GemmBackend::kAuto); }
};

// The bf16 kernels round x and dy to bf16 and multiply exactly-representable products summed in
// f32; against a double reference on the same rounded operands the only error is f32 summation:
// at most ~(K + 2) * 6e-8 of the sum of |terms| (K <= 130 here: < 1e-5 relative to that sum).
TEST_P(MatmulBf16Test, MatchesDoubleSumsOfTheRoundedOperands) {
  TestRng gen(4);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const MatmulShape s : {MatmulShape{1, 3, 5}, MatmulShape{17, 33, 99},
                              MatmulShape{40, 24, 130}, MatmulShape{130, 65, 300}}) {
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    const std::vector<float> x = RandomVector<float>(gen, N * I);
    const std::vector<float> w32 = RandomVector<float>(gen, I * O);
    const std::vector<uint16_t> w = ToBf16(w32);
    const std::vector<float> b = RandomVector<float>(gen, O);
    const std::vector<float> dy = RandomVector<float>(gen, N * O);
    std::vector<float> y(N * O, 9.f), dx(N * I, 1.f), dw(I * O, 2.f), db(O, 3.f);
    std::vector<float> ws(
        std::max(MatmulBf16ForwardWorkspaceElems(s), MatmulBf16BackwardWorkspaceElems(s)));
    ASSERT_OK(MatmulForwardBf16(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(ws), &pool));
    ASSERT_OK(MatmulBackwardBf16(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                 absl::MakeSpan(db), absl::MakeSpan(ws), &pool));
    std::vector<double> y_ref(N * O), dx_ref(N * I, 1.0), dw_ref(I * O, 2.0), db_ref(O, 3.0);
    std::vector<double> y_abs(N * O), dx_abs(N * I, 1.0), dw_abs(I * O, 2.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = b[o], abs = std::abs(b[o]);
        for (int64_t i = 0; i < I; ++i) {
          const double wv = Bf16(w32[i * O + o]), xv = Bf16(x[n * I + i]),
                       dyv = Bf16(dy[n * O + o]);
          acc += xv * wv;
          abs += std::abs(xv * wv);
          dx_ref[n * I + i] += dyv * wv;
          dx_abs[n * I + i] += std::abs(dyv * wv);
          dw_ref[i * O + o] += xv * dyv;
          dw_abs[i * O + o] += std::abs(xv * dyv);
        }
        y_ref[n * O + o] = acc;
        y_abs[n * O + o] = abs;
        db_ref[o] += dy[n * O + o];  // db sums the unrounded dy
      }
    }
    auto expect_close = [](const std::vector<float>& got, const std::vector<double>& ref,
                           const std::vector<double>& abs, int64_t k, const char* what) {
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (!(std::abs(got[i] - ref[i]) <= (k + 2) * 6e-8 * abs[i] + 1e-30) && ++bad <= 3) {
          ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
        }
      }
      EXPECT_EQ(bad, 0) << what;
    };
    expect_close(y, y_ref, y_abs, I, "y");
    expect_close(dx, dx_ref, dx_abs, O, "dx");
    expect_close(dw, dw_ref, dw_abs, N, "dw");
    ExpectAllNear(db, db_ref, 1e-5, 1e-6, "db");
  }
}

TEST_P(MatmulBf16Test, ResultsDoNotDependOnPoolThreads) {
  TestRng gen(5);  // fixed seed: reproducible failures
  const MatmulShape s{300, 40, 700};
  const std::vector<float> x = RandomVector<float>(gen, 300 * 40),
                           dy = RandomVector<float>(gen, 300 * 700);
  const std::vector<uint16_t> w = ToBf16(RandomVector<float>(gen, 40 * 700));
  const std::vector<float> b(700, 0.5f);
  std::vector<float> ws(MatmulBf16BackwardWorkspaceElems(s));
  ThreadPool pool(4);
  std::vector<float> out[2][4];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    out[run][0].assign(300 * 700, 0.f);
    out[run][1].assign(300 * 40, 0.f);
    out[run][2].assign(40 * 700, 0.f);
    out[run][3].assign(700, 0.f);
    ASSERT_OK(MatmulForwardBf16(s, x, w, b, absl::MakeSpan(out[run][0]), absl::MakeSpan(ws), p));
    ASSERT_OK(MatmulBackwardBf16(s, x, w, dy, absl::MakeSpan(out[run][1]),
                                 absl::MakeSpan(out[run][2]), absl::MakeSpan(out[run][3]),
                                 absl::MakeSpan(ws), p));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[0][i], out[1][i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Backends, MatmulBf16Test,
                         ::testing::Values(Bf16GemmBackend::kOneDnn, Bf16GemmBackend::kFallback),
                         [](const ::testing::TestParamInfo<Bf16GemmBackend>& info) {
                           return std::string(kernels_internal::Bf16GemmBackendName(info.param));
                         });

TEST(MatmulBf16Errors, RejectsSmallWorkspacesAndBadSizes) {
  const MatmulShape s{4, 3, 5};
  std::vector<float> x(12), b(5), y(20), dy(20), dx(12), dw(15), db(5);
  std::vector<uint16_t> w(15);
  std::vector<float> ws(MatmulBf16ForwardWorkspaceElems(s) - 1);
  EXPECT_THAT(MatmulForwardBf16(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  ws.assign(MatmulBf16BackwardWorkspaceElems(s) - 1, 0.f);
  EXPECT_THAT(MatmulBackwardBf16(s, x, w, dy, absl::MakeSpan(dx), absl::MakeSpan(dw),
                                 absl::MakeSpan(db), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  ws.assign(100, 0.f);
  EXPECT_THAT(MatmulForwardBf16(s, x, absl::MakeSpan(w).subspan(1), b, absl::MakeSpan(y),
                                absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("w has 14")));
  EXPECT_EQ(MatmulBf16ForwardWorkspaceElems({3, 3, 1}), 5);  // 9 bf16 values in 5 floats
}

TEST(MatmulTest, RejectsBadShapes) {
  std::vector<float> x(6), w(12), b(4), y(8);
  EXPECT_THAT(MatmulForward<float>({2, 3, 4}, x, w, absl::MakeSpan(b).subspan(1), absl::MakeSpan(y),
                                   nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b has 3")));
  EXPECT_THAT(MatmulForward<float>({2, 3, 0}, x, w, b, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_features")));
  EXPECT_THAT(MatmulForward<float>({int64_t{1} << 31, 3, 4}, x, w, b, absl::MakeSpan(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
}

// --- The GEMM grid (internal/blas.h) ---------------------------------------------------------

// Random m x n x k products over the grid's block edges (1, a block less one, a block, a block
// plus one, several blocks), every transpose pair, padded leading dimensions, alpha/beta: C's bits
// are the same for every pool size and without a pool, every block of C is the single-threaded
// OpenBLAS call over that block alone, and C is the product to within f32 rounding (a double
// reference). On Haswell/Zen OpenBLAS kernels a whole 2-thread sgemm rounds differently from a
// 1-thread one, which made the trainer's losses depend on `threads` on AVX2 machines.
TEST(GemmGrid, BitsDoNotDependOnThePoolAndEachBlockIsOneCall) {
  TestRng gen(6);
  // Extents around the block-size rule's corners: the 64 floor, the 256 ceiling (a quarter of
  // 1024), one past each.
  const int64_t edges[] = {1, 63, 65, 257, 1024, 1025};
  ThreadPool pool2(2), pool3(3), pool5(5);
  for (int trial = 0; trial < 14; ++trial) {
    // The last two: skinny products (one row block of all m rows, GemmBlocksFor).
    const int64_t m =
        trial >= 12 ? (trial == 12 ? 129 : 256) : edges[absl::Uniform<int>(gen, 0, 6)];
    const int64_t n = trial >= 12 ? 2049 : edges[absl::Uniform<int>(gen, 0, 6)];
    const int64_t k = absl::Uniform<int64_t>(gen, 1, 300);
    const bool ta = absl::Bernoulli(gen, 0.5), tb = absl::Bernoulli(gen, 0.5);
    const int64_t lda = (ta ? m : k) + absl::Uniform<int64_t>(gen, 0, 3);
    const int64_t ldb = (tb ? k : n) + absl::Uniform<int64_t>(gen, 0, 3);
    const int64_t ldc = n + absl::Uniform<int64_t>(gen, 0, 3);
    const float alpha = trial % 3 == 0 ? 1.0f : 0.75f, beta = trial % 2 == 0 ? 0.0f : 1.5f;
    SCOPED_TRACE(
        absl::StrCat(m, "x", n, "x", k, " ta=", ta, " tb=", tb, " alpha=", alpha, " beta=", beta));
    const std::vector<float> a = RandomVector<float>(gen, (ta ? k : m) * lda);
    const std::vector<float> b = RandomVector<float>(gen, (tb ? n : k) * ldb);
    const std::vector<float> c0 = RandomVector<float>(gen, m * ldc);
    auto run = [&](ThreadPool* pool) {
      std::vector<float> c = c0;
      kernels_internal::Gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(),
                             ldc, pool);
      return c;
    };
    const std::vector<float> serial = run(nullptr);
    for (ThreadPool* pool : {&pool2, &pool3, &pool5}) {
      const std::vector<float> c = run(pool);
      for (size_t i = 0; i < c.size(); ++i) {
        ASSERT_EQ(absl::bit_cast<uint32_t>(c[i]), absl::bit_cast<uint32_t>(serial[i]))
            << "element " << i << " with " << pool->num_threads() << " threads";
      }
    }
    // Each block, alone, in one single-threaded call.
    const kernels_internal::GemmBlocks grid = kernels_internal::GemmBlocksFor(m, n);
    std::vector<float> blocks = c0;
    for (int64_t m0 = 0; m0 < m; m0 += grid.rows) {
      for (int64_t n0 = 0; n0 < n; n0 += grid.cols) {
        const int64_t bm = std::min(grid.rows, m - m0), bn = std::min(grid.cols, n - n0);
        kernels_internal::GemmSingleCall(ta, tb, bm, bn, k, alpha,
                                         ta ? a.data() + m0 : a.data() + m0 * lda, lda,
                                         tb ? b.data() + n0 * ldb : b.data() + n0, ldb, beta,
                                         blocks.data() + m0 * ldc + n0, ldc);
      }
    }
    ASSERT_EQ(0, std::memcmp(blocks.data(), serial.data(), serial.size() * sizeof(float)));
    // The product itself, and the padding of C untouched.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = serial[i * ldc + j];
        if (j >= n) {
          ASSERT_EQ(got, c0[i * ldc + j]) << "padding (" << i << ", " << j << ") written";
          continue;
        }
        double sum = 0, magnitude = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = ta ? a[p * lda + i] : a[i * lda + p];
          const double y = tb ? b[j * ldb + p] : b[p * ldb + j];
          sum += x * y;
          magnitude += std::abs(x * y);
        }
        const double want = alpha * sum + beta * c0[i * ldc + j];
        ASSERT_NEAR(got, want, 1e-6 * (alpha * magnitude + std::abs(beta * c0[i * ldc + j])) + 1e-6)
            << "(" << i << ", " << j << ")";
      }
    }
  }
  EXPECT_EQ(kernels_internal::OpenBlasThreads(), 1)
      << "the grid must be OpenBLAS's only parallelism";
}

// The block-size rule: a quarter of each extent, a multiple of 16, within [64, 256].
TEST(GemmGrid, BlocksAreAQuarterOfEachExtentWithinBounds) {
  using kernels_internal::GemmBlocksFor;
  EXPECT_EQ(GemmBlocksFor(1, 1).rows, 64);
  EXPECT_EQ(GemmBlocksFor(512, 128).rows, 128);
  EXPECT_EQ(GemmBlocksFor(512, 128).cols, 64);
  EXPECT_EQ(GemmBlocksFor(300, 384).rows, 80);  // 75 rounded up to 16
  EXPECT_EQ(GemmBlocksFor(300, 384).cols, 96);
  EXPECT_EQ(GemmBlocksFor(50257, 4096).rows, 256);
  EXPECT_EQ(GemmBlocksFor(50257, 4096).cols, 256);
  // Skinny: one row block when the columns give at least 8 blocks.
  EXPECT_EQ(GemmBlocksFor(128, 4096).rows, 128);
  EXPECT_EQ(GemmBlocksFor(128, 4096).cols, 256);
  EXPECT_EQ(GemmBlocksFor(200, 2048).rows, 200);
  EXPECT_EQ(GemmBlocksFor(200, 1024).rows, 64);  // 4 column blocks of 256: rows split too
  EXPECT_EQ(GemmBlocksFor(257, 4096).rows, 80);
  EXPECT_EQ(GemmBlocksFor(40, 4096).rows, 64);
}

// The f64 grid: pool-independent bits too (the reference kernels of the tests run in f64).
TEST(GemmGrid, DoubleBitsDoNotDependOnThePool) {
  TestRng gen(7);
  const int64_t m = 1027, n = 265, k = 129;
  const std::vector<double> a = RandomVector<double>(gen, k * m),
                            b = RandomVector<double>(gen, n * k);
  ThreadPool pool(3);
  std::vector<double> serial(static_cast<size_t>(m * n)), pooled(serial.size());
  kernels_internal::Gemm(true, true, m, n, k, 1.0, a.data(), m, b.data(), k, 0.0, serial.data(), n,
                         nullptr);
  kernels_internal::Gemm(true, true, m, n, k, 1.0, a.data(), m, b.data(), k, 0.0, pooled.data(), n,
                         &pool);
  EXPECT_EQ(0, std::memcmp(serial.data(), pooled.data(), serial.size() * sizeof(double)));
}

}  // namespace
}  // namespace ps
