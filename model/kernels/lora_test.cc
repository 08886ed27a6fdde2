#include "model/kernels/lora.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/dropout_math.h"
#include "model/kernels/linear.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

template <typename T>
absl::Span<const T> C(const std::vector<T>& v) {
  return absl::MakeConstSpan(v);
}
template <typename T>
absl::Span<T> M(std::vector<T>& v) {
  return absl::MakeSpan(v);
}

// The adapter by its definition, in double, with naive loops: y += s B (A x) row by row, and the
// chain rule through h = A x, z = s B h.
struct NaiveLora {
  std::vector<double> h, y, dx, da, db;
};
NaiveLora Naive(const LoraShape& s, const std::vector<double>& x, const std::vector<double>& a,
                const std::vector<double>& b, const std::vector<double>& y0,
                const std::vector<double>& dy, const std::vector<double>& dx0,
                const std::vector<double>& da0, const std::vector<double>& db0) {
  const int64_t N = s.rows, I = s.in_features, O = s.out_features, R = s.rank;
  NaiveLora out{std::vector<double>(N * R), y0, dx0, da0, db0};
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t r = 0; r < R; ++r) {
      double acc = 0;
      for (int64_t i = 0; i < I; ++i) acc += a[r * I + i] * x[n * I + i];
      out.h[n * R + r] = acc;
    }
    for (int64_t o = 0; o < O; ++o) {
      double acc = 0;
      for (int64_t r = 0; r < R; ++r) acc += b[o * R + r] * out.h[n * R + r];
      out.y[n * O + o] += s.scale * acc;
    }
    // dL/dh[r] = s * sum_o dy[o] B[o, r]
    for (int64_t r = 0; r < R; ++r) {
      double g = 0;
      for (int64_t o = 0; o < O; ++o) g += dy[n * O + o] * b[o * R + r];
      g *= s.scale;
      for (int64_t i = 0; i < I; ++i) {
        out.da[r * I + i] += g * x[n * I + i];
        out.dx[n * I + i] += g * a[r * I + i];
      }
      for (int64_t o = 0; o < O; ++o)
        out.db[o * R + r] += s.scale * dy[n * O + o] * out.h[n * R + r];
    }
  }
  return out;
}

const LoraShape kAwkwardShapes[] = {
    {.rows = 1, .in_features = 1, .out_features = 1, .rank = 1, .scale = 2.0f},
    {.rows = 1, .in_features = 9, .out_features = 4, .rank = 1, .scale = 0.5f},
    {.rows = 7, .in_features = 13, .out_features = 5, .rank = 3, .scale = 16.0f / 3},
    {.rows = 5, .in_features = 3, .out_features = 11, .rank = 8, .scale = 1.0f},  // rank > in
    {.rows = 33, .in_features = 20, .out_features = 130, .rank = 16, .scale = 2.0f},
    {.rows = 64, .in_features = 96, .out_features = 72, .rank = 4, .scale = 4.0f},
};

std::string Name(const LoraShape& s) {
  return absl::StrCat("N=", s.rows, " in=", s.in_features, " out=", s.out_features, " r=", s.rank);
}

TEST(LoraTest, MatchesNaiveDoubleReference) {
  TestRng gen(1);
  ThreadPool pool(3);
  for (const LoraShape& s : kAwkwardShapes) {
    SCOPED_TRACE(Name(s));
    const int64_t N = s.rows, I = s.in_features, O = s.out_features, R = s.rank;
    const auto x = RandomVector<double>(gen, N * I), a = RandomVector<double>(gen, R * I),
               b = RandomVector<double>(gen, O * R), y0 = RandomVector<double>(gen, N * O),
               dy = RandomVector<double>(gen, N * O), dx0 = RandomVector<double>(gen, N * I),
               da0 = RandomVector<double>(gen, R * I), db0 = RandomVector<double>(gen, O * R);
    const NaiveLora ref = Naive(s, x, a, b, y0, dy, dx0, da0, db0);
    // double instantiation: to rounding.
    {
      std::vector<double> h(N * R), y = y0, dx = dx0, da = da0, db = db0,
                                    ws(LoraBackwardWorkspaceElems(s));
      ASSERT_OK(LoraForward<double>(s, C(x), C(a), C(b), M(h), M(y), &pool));
      ASSERT_OK(LoraBackward<double>(s, C(x), C(a), C(b), C(h), C(dy), M(dx), M(da), M(db), M(ws),
                                     &pool));
      ExpectAllNear(h, ref.h, 1e-12, 1e-12, "h (f64)");
      ExpectAllNear(y, ref.y, 1e-12, 1e-12, "y (f64)");
      ExpectAllNear(dx, ref.dx, 1e-12, 1e-12, "dx (f64)");
      ExpectAllNear(da, ref.da, 1e-12, 1e-12, "da (f64)");
      ExpectAllNear(db, ref.db, 1e-12, 1e-12, "db (f64)");
    }
    // float instantiation: to f32 rounding.
    {
      const auto xf = Convert<float>(x), af = Convert<float>(a), bf = Convert<float>(b),
                 dyf = Convert<float>(dy);
      std::vector<float> h(N * R), y = Convert<float>(y0), dx = Convert<float>(dx0),
                                   da = Convert<float>(da0), db = Convert<float>(db0),
                                   ws(LoraBackwardWorkspaceElems(s));
      ASSERT_OK(LoraForward<float>(s, C(xf), C(af), C(bf), M(h), M(y), &pool));
      ASSERT_OK(LoraBackward<float>(s, C(xf), C(af), C(bf), C(h), C(dyf), M(dx), M(da), M(db),
                                    M(ws), &pool));
      const double tol = 1e-4 * std::max(1.0f, s.scale);
      ExpectAllNear(h, ref.h, tol, tol, "h (f32)");
      ExpectAllNear(y, ref.y, tol, tol, "y (f32)");
      ExpectAllNear(dx, ref.dx, tol, tol, "dx (f32)");
      ExpectAllNear(da, ref.da, tol, tol, "da (f32)");
      ExpectAllNear(db, ref.db, tol, tol, "db (f32)");
    }
  }
}

// The same math composed from nn.Linear calls: h = Linear(x; W = A), y += s * Linear(h; W = B),
// and backward through the two Linear layers (dz = s * dy); in double the two agree to rounding.
TEST(LoraTest, MatchesCompositionOfLinearKernels) {
  TestRng gen(2);
  for (const LoraShape& s : kAwkwardShapes) {
    SCOPED_TRACE(Name(s));
    const int64_t N = s.rows, I = s.in_features, O = s.out_features, R = s.rank;
    const auto x = RandomVector<double>(gen, N * I), a = RandomVector<double>(gen, R * I),
               b = RandomVector<double>(gen, O * R), y0 = RandomVector<double>(gen, N * O),
               dy = RandomVector<double>(gen, N * O);
    // Linear composition.
    std::vector<double> h_l(N * R), z(N * O), y_l = y0;
    ASSERT_OK(LinearForward<double>({N, I, R}, C(x), C(a), {}, M(h_l), nullptr));
    ASSERT_OK(LinearForward<double>({N, R, O}, C(h_l), C(b), {}, M(z), nullptr));
    for (int64_t k = 0; k < N * O; ++k) y_l[k] += s.scale * z[k];
    std::vector<double> dz(N * O), dh(N * R, 0.0), db_l(O * R, 0.0), da_l(R * I, 0.0),
        dx_l(N * I, 0.0);
    for (int64_t k = 0; k < N * O; ++k) dz[k] = s.scale * dy[k];
    ASSERT_OK(LinearBackward<double>({N, R, O}, C(h_l), C(b), C(dz), M(dh), M(db_l), {}, nullptr));
    ASSERT_OK(LinearBackward<double>({N, I, R}, C(x), C(a), C(dh), M(dx_l), M(da_l), {}, nullptr));
    // The LoRA kernel.
    std::vector<double> h(N * R), y = y0, dx(N * I, 0.0), da(R * I, 0.0), db(O * R, 0.0),
                                  ws(LoraBackwardWorkspaceElems(s));
    ASSERT_OK(LoraForward<double>(s, C(x), C(a), C(b), M(h), M(y), nullptr));
    ASSERT_OK(LoraBackward<double>(s, C(x), C(a), C(b), C(h), C(dy), M(dx), M(da), M(db), M(ws),
                                   nullptr));
    ExpectAllNear(h, h_l, 1e-12, 1e-12, "h");
    ExpectAllNear(y, y_l, 1e-12, 1e-12, "y");
    ExpectAllNear(dx, dx_l, 1e-12, 1e-12, "dx");
    ExpectAllNear(da, da_l, 1e-12, 1e-12, "da");
    ExpectAllNear(db, db_l, 1e-12, 1e-12, "db");
  }
}

// L = <y, R> with y = y0 + s B A x: the analytic dx, dA, dB against central differences.
TEST(LoraTest, GradientsMatchFiniteDifferences) {
  TestRng gen(3);
  const LoraShape s{.rows = 3, .in_features = 4, .out_features = 5, .rank = 2, .scale = 1.5f};
  const int64_t N = s.rows, I = s.in_features, O = s.out_features, R = s.rank;
  std::vector<double> x = RandomVector<double>(gen, N * I), a = RandomVector<double>(gen, R * I),
                      b = RandomVector<double>(gen, O * R);
  const std::vector<double> y0 = RandomVector<double>(gen, N * O),
                            r = RandomVector<double>(gen, N * O);
  auto loss = [&] {
    std::vector<double> h(N * R), y = y0;
    PS_CHECK_OK(LoraForward<double>(s, C(x), C(a), C(b), M(h), M(y), nullptr));
    return Dot(y, r);
  };
  std::vector<double> h(N * R), y = y0, dx(N * I, 0.0), da(R * I, 0.0), db(O * R, 0.0),
                                ws(LoraBackwardWorkspaceElems(s));
  ASSERT_OK(LoraForward<double>(s, C(x), C(a), C(b), M(h), M(y), nullptr));
  ASSERT_OK(
      LoraBackward<double>(s, C(x), C(a), C(b), C(h), C(r), M(dx), M(da), M(db), M(ws), nullptr));
  ExpectGradientMatchesFiniteDifferences(x, dx, loss, "dx");
  ExpectGradientMatchesFiniteDifferences(a, da, loss, "da");
  ExpectGradientMatchesFiniteDifferences(b, db, loss, "db");
}

// Gradients accumulate: two backward calls equal one with twice dy; y accumulates too.
TEST(LoraTest, GradientsAndOutputAccumulate) {
  TestRng gen(4);
  const LoraShape s{.rows = 6, .in_features = 7, .out_features = 9, .rank = 2, .scale = 2.0f};
  const int64_t N = s.rows, I = s.in_features, O = s.out_features, R = s.rank;
  const auto x = RandomVector<float>(gen, N * I), a = RandomVector<float>(gen, R * I),
             b = RandomVector<float>(gen, O * R), dy = RandomVector<float>(gen, N * O);
  std::vector<float> h(N * R), y(N * O, 0.0f), ws(LoraBackwardWorkspaceElems(s));
  ASSERT_OK(LoraForward<float>(s, C(x), C(a), C(b), M(h), M(y), nullptr));
  std::vector<float> y2 = y;
  ASSERT_OK(LoraForward<float>(s, C(x), C(a), C(b), M(h), M(y2), nullptr));
  for (int64_t k = 0; k < N * O; ++k) EXPECT_EQ(y2[k], y[k] + y[k]) << k;  // exact doubling
  std::vector<float> dx(N * I, 0.0f), da(R * I, 0.0f), db(O * R, 0.0f);
  ASSERT_OK(
      LoraBackward<float>(s, C(x), C(a), C(b), C(h), C(dy), M(dx), M(da), M(db), M(ws), nullptr));
  std::vector<float> dx2 = dx, da2 = da, db2 = db;
  ASSERT_OK(LoraBackward<float>(s, C(x), C(a), C(b), C(h), C(dy), M(dx2), M(da2), M(db2), M(ws),
                                nullptr));
  for (int64_t k = 0; k < N * I; ++k) EXPECT_EQ(dx2[k], dx[k] + dx[k]) << k;
  for (int64_t k = 0; k < R * I; ++k) EXPECT_EQ(da2[k], da[k] + da[k]) << k;
  for (int64_t k = 0; k < O * R; ++k) EXPECT_EQ(db2[k], db[k] + db[k]) << k;
}

TEST(LoraTest, EmptyDxSkipsTheInputGradientOnly) {
  TestRng gen(5);
  const LoraShape s{.rows = 9, .in_features = 10, .out_features = 6, .rank = 3, .scale = 1.0f};
  const int64_t N = s.rows, I = s.in_features, O = s.out_features, R = s.rank;
  const auto x = RandomVector<float>(gen, N * I), a = RandomVector<float>(gen, R * I),
             b = RandomVector<float>(gen, O * R), dy = RandomVector<float>(gen, N * O),
             da0 = RandomVector<float>(gen, R * I), db0 = RandomVector<float>(gen, O * R);
  std::vector<float> h(N * R), y(N * O), ws(LoraBackwardWorkspaceElems(s));
  ASSERT_OK(LoraForward<float>(s, C(x), C(a), C(b), M(h), M(y), nullptr));
  std::vector<float> dx(N * I), da = da0, db = db0, da2 = da0, db2 = db0;
  ASSERT_OK(
      LoraBackward<float>(s, C(x), C(a), C(b), C(h), C(dy), M(dx), M(da), M(db), M(ws), nullptr));
  ASSERT_OK(LoraBackward<float>(s, C(x), C(a), C(b), C(h), C(dy), absl::Span<float>(), M(da2),
                                M(db2), M(ws), nullptr));
  EXPECT_EQ(da2, da);
  EXPECT_EQ(db2, db);
}

TEST(LoraTest, RejectsBadShapesAndSizes) {
  const LoraShape s{.rows = 2, .in_features = 3, .out_features = 4, .rank = 2, .scale = 1.0f};
  std::vector<float> x(6), a(6), b(8), h(4), y(8), dx(6), da(6), db(8), ws(4);
  LoraShape bad = s;
  bad.rank = 0;
  EXPECT_THAT(LoraForward<float>(bad, C(x), C(a), C(b), M(h), M(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  std::vector<float> short_a(5);
  EXPECT_THAT(LoraForward<float>(s, C(x), C(short_a), C(b), M(h), M(y), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a has 5 elements")));
  std::vector<float> small_ws(3);
  EXPECT_THAT(LoraBackward<float>(s, C(x), C(a), C(b), C(h), C(y), M(dx), M(da), M(db), M(small_ws),
                                  nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
}

// --- Dropout --------------------------------------------------------------------------------

TEST(DropoutTest, KeptFractionIsOneMinusPAndKeptValuesAreScaled) {
  TestRng gen(6);
  const int64_t n = 100000;
  const auto x = RandomVector<float>(gen, n, 0.5, 1.5);  // never zero
  ThreadPool pool(3);
  for (const float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    std::vector<float> y(n);
    ASSERT_OK(DropoutForward(p, /*seed=*/1234, C(x), M(y), &pool));
    int64_t kept = 0;
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; ++i) {
      if (y[i] == 0.0f) continue;
      ++kept;
      ASSERT_EQ(y[i], x[i] * scale) << i;
    }
    // Binomial(n, 1 - p): 5 standard deviations.
    const double expected = n * (1.0 - p), sd = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(kept), expected, 5 * sd) << "p=" << p;
  }
}

TEST(DropoutTest, SameSeedSameMaskOtherSeedOtherMaskPoolIrrelevant) {
  TestRng gen(7);
  const int64_t n = 20000;
  const auto x = RandomVector<float>(gen, n, 0.5, 1.5);
  ThreadPool pool(4);
  std::vector<float> y1(n), y2(n), y3(n);
  ASSERT_OK(DropoutForward(0.3f, 99, C(x), M(y1), nullptr));
  ASSERT_OK(DropoutForward(0.3f, 99, C(x), M(y2), &pool));
  ASSERT_OK(DropoutForward(0.3f, 100, C(x), M(y3), &pool));
  EXPECT_EQ(y1, y2);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (y1[i] == 0.0f) != (y3[i] == 0.0f);
  // Independent masks at p = 0.3 differ in 2 p (1 - p) = 42% of the places.
  EXPECT_GT(differ, n / 4);
  // The mask is the documented rule.
  const uint32_t threshold = DropoutThreshold(0.3f);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits =
        DropoutMix64(99 ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL)) >> 40;
    ASSERT_EQ(y1[i] != 0.0f, bits >= threshold) << i;
  }
}

TEST(DropoutTest, BackwardAppliesTheForwardsMaskAndAccumulates) {
  TestRng gen(8);
  const int64_t n = 5000;
  const auto x = RandomVector<float>(gen, n, 0.5, 1.5), dy = RandomVector<float>(gen, n),
             dx0 = RandomVector<float>(gen, n);
  const float p = 0.25f;
  std::vector<float> y(n), dx = dx0;
  ASSERT_OK(DropoutForward(p, 7, C(x), M(y), nullptr));
  ASSERT_OK(DropoutBackward(p, 7, C(dy), M(dx), nullptr));
  const float scale = DropoutScale(p);
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = y[i] != 0.0f;
    ASSERT_EQ(dx[i], dx0[i] + (kept ? dy[i] * scale : 0.0f)) << i;
  }
}

TEST(DropoutTest, PZeroIsTheIdentity) {
  TestRng gen(9);
  const int64_t n = 777;
  const auto x = RandomVector<float>(gen, n), dy = RandomVector<float>(gen, n),
             dx0 = RandomVector<float>(gen, n);
  std::vector<float> y(n), dx = dx0;
  ASSERT_OK(DropoutForward(0.0f, 5, C(x), M(y), nullptr));
  ASSERT_OK(DropoutBackward(0.0f, 5, C(dy), M(dx), nullptr));
  EXPECT_EQ(std::memcmp(y.data(), x.data(), n * sizeof(float)), 0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx[i], dx0[i] + dy[i]) << i;
}

TEST(DropoutTest, RejectsPOutsideZeroOne) {
  std::vector<float> x(4), y(4), y_short(3);
  for (const float p : {-0.1f, 1.0f, 1.5f, NAN}) {
    EXPECT_THAT(DropoutForward(p, 0, C(x), M(y), nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 1)")));
    EXPECT_THAT(DropoutBackward(p, 0, C(x), M(y), nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 1)")));
  }
  EXPECT_THAT(DropoutForward(0.5f, 0, C(x), M(y_short), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("y has 3")));
}

}  // namespace
}  // namespace ps
