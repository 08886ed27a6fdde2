#include "model/kernels/internal/bf16_gemm.h"

#include <cblas.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/random/distributions.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype_math.h"

ABSL_DECLARE_FLAG(ps::kernels_internal::Bf16GemmBackend, bf16_gemm);

namespace ps::kernels_internal {
namespace {

using ::testing::HasSubstr;

// A stored bf16 matrix of `rows` x `cols` with leading dimension ld >= cols; the padding holds
// NaN, so a read outside the matrix poisons the result.
struct Matrix {
  int64_t rows, cols, ld;
  std::vector<uint16_t> bits;
  float at(int64_t r, int64_t c) const { return BFloat16BitsToFloat(bits[r * ld + c]); }
};

Matrix RandomMatrix(TestRng& gen, int64_t rows, int64_t cols, int64_t pad) {
  Matrix m{rows, cols, cols + pad, {}};
  m.bits.assign(static_cast<size_t>(rows * m.ld), FloatToBFloat16Bits(NAN));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      m.bits[r * m.ld + c] = FloatToBFloat16Bits(absl::Uniform(gen, -2.0f, 2.0f));
    }
  }
  return m;
}

struct Shape {
  int64_t m, n, k;
  bool trans_a, trans_b, accumulate;
  int64_t pad;  // extra leading-dimension elements of A, B and C
};

class Bf16GemmTest : public ::testing::TestWithParam<Bf16GemmBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == Bf16GemmBackend::kOneDnn && !OneDnnBf16Available()) {
      GTEST_SKIP() << "no native oneDNN bf16 GEMM on this CPU: " << OneDnnBf16Description();
    }
    SetBf16GemmBackendForTest(GetParam());
    // The fallback's OpenBLAS runs on the calling thread only (its own threads synchronize in
    // ways ThreadSanitizer cannot see), as the other kernel tests pin it.
    openblas_set_num_threads(1);
  }
  void TearDown() override { SetBf16GemmBackendForTest(Bf16GemmBackend::kAuto); }
};

// Products of bf16 values are exact in f32, so both backends compute the exact sum of the same
// k products up to f32 summation error: at most ~k ulp(f32) of sum |a b| in the worst order.
TEST_P(Bf16GemmTest, MatchesExactSumsOnAwkwardShapes) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  const Shape shapes[] = {
      {1, 1, 1, false, false, false, 0},     {3, 5, 7, false, true, true, 1},
      {17, 130, 33, true, false, false, 3},  {129, 257, 65, true, true, true, 0},
      {300, 40, 513, false, false, true, 5}, {64, 1100, 96, false, true, false, 0},
      {1030, 20, 9, true, false, true, 2},   {130, 700, 40, false, true, false, 0},
  };
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k << " ta=" << s.trans_a
                                      << " tb=" << s.trans_b << " acc=" << s.accumulate);
    const Matrix a =
        s.trans_a ? RandomMatrix(gen, s.k, s.m, s.pad) : RandomMatrix(gen, s.m, s.k, s.pad);
    const Matrix b =
        s.trans_b ? RandomMatrix(gen, s.n, s.k, s.pad) : RandomMatrix(gen, s.k, s.n, s.pad);
    const int64_t ldc = s.n + s.pad;
    std::vector<float> c(static_cast<size_t>(s.m * ldc), -7.0f);  // padding must stay -7
    std::vector<float> init(c.size());
    for (float& x : init) x = absl::Uniform(gen, -1.0f, 1.0f);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) c[i * ldc + j] = init[i * ldc + j];
    }
    ASSERT_OK(GemmBf16({.trans_a = s.trans_a,
                        .trans_b = s.trans_b,
                        .m = s.m,
                        .n = s.n,
                        .k = s.k,
                        .a = a.bits.data(),
                        .lda = a.ld,
                        .b = b.bits.data(),
                        .ldb = b.ld,
                        .accumulate = s.accumulate,
                        .c = c.data(),
                        .ldc = ldc},
                       &pool));
    int64_t bad = 0;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = c[i * ldc + j];
        if (j >= s.n) {
          if (got != -7.0f) ++bad;
          continue;
        }
        double sum = s.accumulate ? init[i * ldc + j] : 0.0, abs_sum = std::abs(sum);
        for (int64_t p = 0; p < s.k; ++p) {
          const double prod = static_cast<double>(s.trans_a ? a.at(p, i) : a.at(i, p)) *
                              (s.trans_b ? b.at(j, p) : b.at(p, j));
          sum += prod;
          abs_sum += std::abs(prod);
        }
        const double tol = (s.k + 2) * 6e-8 * abs_sum + 1e-30;
        if (!(std::abs(got - sum) <= tol)) {
          if (++bad <= 3) {
            ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", exact " << sum
                          << ", tolerance " << tol;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST_P(Bf16GemmTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const int64_t m = 200, n = 1500, k = 130;
  const Matrix a = RandomMatrix(gen, m, k, 0), b = RandomMatrix(gen, n, k, 0);
  std::vector<float> results[3];
  ThreadPool pool2(2), pool4(4);
  ThreadPool* pools[3] = {nullptr, &pool2, &pool4};
  for (int i = 0; i < 3; ++i) {
    results[i].assign(static_cast<size_t>(m * n), 0.0f);
    ASSERT_OK(GemmBf16({.trans_b = true,
                        .m = m,
                        .n = n,
                        .k = k,
                        .a = a.bits.data(),
                        .lda = k,
                        .b = b.bits.data(),
                        .ldb = k,
                        .c = results[i].data(),
                        .ldc = n},
                       pools[i]));
  }
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[2].data(), results[0].size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Backends, Bf16GemmTest,
                         ::testing::Values(Bf16GemmBackend::kOneDnn, Bf16GemmBackend::kFallback),
                         [](const ::testing::TestParamInfo<Bf16GemmBackend>& info) {
                           return std::string(Bf16GemmBackendName(info.param));
                         });

TEST(RoundToBf16Test, PlainAndTransposedMatchTheScalarRounding) {
  TestRng gen(3);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 130}, {65, 64}, {200, 77}, {129, 300}}) {
    std::vector<float> src(static_cast<size_t>(rows * cols));
    for (float& x : src) x = absl::Uniform(gen, -3.0f, 3.0f);
    src[0] = NAN;
    if (src.size() > 2) src[2] = -INFINITY;
    std::vector<uint16_t> plain(src.size()), transposed(src.size());
    RoundToBf16(src.data(), plain.data(), rows * cols, &pool);
    RoundToBf16Transposed(src.data(), rows, cols, transposed.data(), &pool);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t want = FloatToBFloat16Bits(src[r * cols + c]);
        ASSERT_EQ(plain[r * cols + c], want) << rows << "x" << cols << " at " << r << "," << c;
        ASSERT_EQ(transposed[c * rows + r], want) << rows << "x" << cols << " at " << r << "," << c;
      }
    }
  }
}

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// The fallback's pieces: RoundToBf16Values is RoundToBf16 widened back, bit for bit (NaN payloads,
// infinities, subnormals, ties to even), in place too; WidenBf16 is the exact widening. Lengths
// cross the 2048-value pieces and the 64K-value task ranges.
TEST(RoundToBf16Test, ValuesAndWideningMatchTheScalarConversions) {
  TestRng gen(5);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  const float specials[] = {NAN,
                            -NAN,
                            INFINITY,
                            -INFINITY,
                            0.0f,
                            -0.0f,
                            1e-40f,             // subnormal
                            -3e-39f,            // subnormal
                            1.0f + 1.0f / 256,  // a tie: rounds to even (1.0)
                            1.0f + 3.0f / 256,  // a tie: rounds to even (up)
                            3.3895314e38f,      // rounds up to infinity
                            std::numeric_limits<float>::max(),
                            std::bit_cast<float>(0x7fa00001u)};  // a signalling NaN with payload
  for (int64_t n :
       {int64_t{1}, int64_t{13}, int64_t{2048}, int64_t{2049}, int64_t{70000}, int64_t{200003}}) {
    std::vector<float> src(static_cast<size_t>(n));
    for (float& x : src)
      x = absl::Uniform(gen, -5.0f, 5.0f) * std::exp2(absl::Uniform(gen, -30, 30));
    for (size_t i = 0; i < std::size(specials) && i < src.size(); ++i) {
      src[(i * 7919) % src.size()] = specials[i];
    }
    std::vector<float> values(src.size()), widened(src.size());
    std::vector<uint16_t> bf16(src.size());
    RoundToBf16Values(src.data(), values.data(), n, &pool);
    RoundToBf16(src.data(), bf16.data(), n, &pool);
    WidenBf16(bf16.data(), widened.data(), n, &pool);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = FloatToBFloat16Bits(src[i]);
      ASSERT_EQ(Bits(values[i]), uint32_t{want} << 16) << "n=" << n << " at " << i;
      ASSERT_EQ(Bits(widened[i]), uint32_t{want} << 16) << "n=" << n << " at " << i;
    }
    std::vector<float> in_place = src;
    RoundToBf16Values(in_place.data(), in_place.data(), n, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(in_place[i]), Bits(values[i])) << "in place, n=" << n << " at " << i;
    }
  }
}

// FallbackScratch: a slot keeps its buffer while it is large enough and grows when asked for more;
// slots are distinct; every thread has its own.
TEST(FallbackScratchTest, SlotsGrowAndArePerThread) {
  float* a = FallbackScratch(0, 100);
  float* b = FallbackScratch(1, 100);
  float* c = FallbackScratch(2, 100);
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_NE(a, c);
  a[99] = 1.5f;
  EXPECT_EQ(FallbackScratch(0, 50), a);
  EXPECT_EQ(FallbackScratch(0, 100)[99], 1.5f);
  float* grown = FallbackScratch(0, 1 << 20);
  grown[(1 << 20) - 1] = 2.5f;  // the whole grown extent is writable (ASan checks it)
  EXPECT_EQ(FallbackScratch(0, 1 << 20), grown);
  float* other = nullptr;
  std::thread([&] { other = FallbackScratch(0, 1 << 20); }).join();
  EXPECT_NE(other, nullptr);
  EXPECT_NE(other, grown);
}

TEST(Bf16GemmBackendTest, AutoResolvesByTheCpu) {
  SetBf16GemmBackendForTest(Bf16GemmBackend::kAuto);
  Bf16GemmBackend resolved;
  ASSERT_OK(ResolveBf16GemmBackend(&resolved));
  EXPECT_EQ(resolved, OneDnnBf16Available() ? Bf16GemmBackend::kOneDnn : Bf16GemmBackend::kFallback)
      << OneDnnBf16Description();
  EXPECT_FALSE(OneDnnBf16Description().empty());
}

TEST(Bf16GemmBackendTest, FlagSelectsAndForcingAMissingOneDnnFails) {
  const Bf16GemmBackend saved = absl::GetFlag(FLAGS_bf16_gemm);
  absl::SetFlag(&FLAGS_bf16_gemm, Bf16GemmBackend::kFallback);
  Bf16GemmBackend resolved;
  ASSERT_OK(ResolveBf16GemmBackend(&resolved));
  EXPECT_EQ(resolved, Bf16GemmBackend::kFallback);
  absl::SetFlag(&FLAGS_bf16_gemm, Bf16GemmBackend::kOneDnn);
  const absl::Status status = ResolveBf16GemmBackend(&resolved);
  if (OneDnnBf16Available()) {
    EXPECT_OK(status);
    EXPECT_EQ(resolved, Bf16GemmBackend::kOneDnn);
  } else {
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--bf16_gemm=onednn")));
  }
  absl::SetFlag(&FLAGS_bf16_gemm, saved);
}

TEST(Bf16GemmBackendTest, ParsesFlagValues) {
  Bf16GemmBackend b;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("fallback", &b, &error));
  EXPECT_EQ(b, Bf16GemmBackend::kFallback);
  EXPECT_TRUE(AbslParseFlag("onednn", &b, &error));
  EXPECT_EQ(b, Bf16GemmBackend::kOneDnn);
  EXPECT_FALSE(AbslParseFlag("mkl", &b, &error));
  EXPECT_THAT(error, HasSubstr("auto, onednn or fallback"));
  EXPECT_EQ(AbslUnparseFlag(Bf16GemmBackend::kAuto), "auto");
}

}  // namespace
}  // namespace ps::kernels_internal
