#include "model/kernels/lm_head_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype_math.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/matmul.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

struct Reference {
  double loss = 0;
  std::vector<double> lse, dh, dwte;
};

// The naive reference: materializes all N x V logits, in double.
Reference NaiveCrossEntropy(const LmHeadCrossEntropyShape& s, const std::vector<double>& h,
                            const std::vector<double>& wte, const std::vector<int32_t>& targets,
                            double loss_grad) {
  const int64_t N = s.rows, C = s.channels, V = s.vocab_size;
  Reference ref;
  ref.lse.resize(N);
  ref.dh.assign(N * C, 0.0);
  ref.dwte.assign(V * C, 0.0);
  std::vector<double> logits(N * V);
  int64_t valid = 0;
  for (int64_t n = 0; n < N; ++n) valid += targets[n] != s.ignore_index;
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += h[n * C + c] * wte[v * C + c];
      logits[n * V + v] = z;
      mx = std::max(mx, z);
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - mx);
    ref.lse[n] = mx + std::log(sum);
    if (targets[n] == s.ignore_index) continue;
    ref.loss += (ref.lse[n] - logits[n * V + targets[n]]) / valid;
    for (int64_t v = 0; v < V; ++v) {
      const double dz =
          loss_grad / valid * (std::exp(logits[n * V + v] - ref.lse[n]) - (v == targets[n]));
      for (int64_t c = 0; c < C; ++c) {
        ref.dh[n * C + c] += dz * wte[v * C + c];
        ref.dwte[v * C + c] += dz * h[n * C + c];
      }
    }
  }
  return ref;
}

std::vector<int32_t> RandomTargets(TestRng& gen, int64_t n, int64_t vocab, int32_t ignore_index,
                                   double ignore_fraction) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) {
    x = absl::Bernoulli(gen, ignore_fraction) ? ignore_index
                                              : absl::Uniform<int32_t>(gen, 0, vocab);
  }
  return t;
}

class LmHeadCrossEntropyTest : public ::testing::Test {};

TEST_F(LmHeadCrossEntropyTest, FloatMatchesNaiveReferenceWithTileTails) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // Tiles that do not divide N or V, one tile covering everything, and B*T = 1.
  for (const LmHeadCrossEntropyShape s :
       {LmHeadCrossEntropyShape{13, 11, 37, 4, 8, -100}, LmHeadCrossEntropyShape{1, 5, 19},
        LmHeadCrossEntropyShape{20, 33, 70, 7, 64, -1}}) {
    const int64_t N = s.rows, C = s.channels, V = s.vocab_size;
    const std::vector<double> h = RandomVector<double>(gen, N * C, -1, 1);
    const std::vector<double> wte = RandomVector<double>(gen, V * C, -1, 1);
    std::vector<int32_t> targets = RandomTargets(gen, N, V, s.ignore_index, 0.25);
    targets[0] = static_cast<int32_t>(V - 1);  // at least one valid target, in the last tile
    const Reference ref = NaiveCrossEntropy(s, h, wte, targets, 2.0);
    std::vector<float> lse(N), ws(LmHeadCrossEntropyWorkspaceElems(s));
    ASSERT_OK_AND_ASSIGN(const double loss, LmHeadCrossEntropyForward<float>(
                                                s, Convert<float>(h), Convert<float>(wte), targets,
                                                absl::MakeSpan(lse), absl::MakeSpan(ws), &pool));
    std::vector<float> dh(N * C, 0.f), dwte(V * C, 0.f);
    ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, Convert<float>(h), Convert<float>(wte), targets,
                                                lse, 2.0, absl::MakeSpan(dh), absl::MakeSpan(dwte),
                                                absl::MakeSpan(ws), &pool));
    // Logits are C-term float dot products of values in [-1, 1] (|z| <= C, error <= ~C*6e-8);
    // lse, the loss and probabilities inherit that absolute error.
    const double tol = 2e-7 * C + 1e-6;
    EXPECT_THAT(loss, DoubleNear(ref.loss, tol));
    ExpectAllNear(lse, ref.lse, tol, 1e-6, "lse");
    ExpectAllNear(dh, ref.dh, tol, 1e-5, "dh");
    ExpectAllNear(dwte, ref.dwte, tol, 1e-5, "dwte");
  }
}

// --- bf16 variants, on each GEMM backend ---------------------------------------------------------

using kernels_internal::Bf16GemmBackend;

class LmHeadCrossEntropyBf16Test : public ::testing::TestWithParam<Bf16GemmBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == Bf16GemmBackend::kOneDnn && !kernels_internal::OneDnnBf16Available()) {
      GTEST_SKIP() << kernels_internal::OneDnnBf16Description();
    }
    kernels_internal::SetBf16GemmBackendForTest(GetParam());
  }
  void TearDown() override { kernels_internal::SetBf16GemmBackendForTest(Bf16GemmBackend::kAuto); }
};

// Against the naive double reference on bf16-rounded h and wte (the values the kernel multiplies):
// the logits are exact products summed in f32, so the forward keeps the f32 kernel's tolerance.
// In the backward each dz is also rounded to bf16 (relative error <= 2^-8, the unit roundoff of 8
// significant bits) before its GEMMs, so a gradient may move by 2^-8 of the sum of |dz * operand|
// over its terms, on top of f32 sums.
TEST_P(LmHeadCrossEntropyBf16Test, MatchesNaiveReferenceOnRoundedOperands) {
  TestRng gen(5);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const LmHeadCrossEntropyShape s :
       {LmHeadCrossEntropyShape{13, 11, 37, 4, 8, -100}, LmHeadCrossEntropyShape{1, 5, 19},
        LmHeadCrossEntropyShape{40, 33, 300, 16, 128, -1}}) {
    const int64_t N = s.rows, C = s.channels, V = s.vocab_size;
    const std::vector<float> h = RandomVector<float>(gen, N * C, -1, 1);
    const std::vector<float> wte = RandomVector<float>(gen, V * C, -1, 1);
    std::vector<uint16_t> wte_bits(V * C);
    std::vector<double> h_rounded(N * C), wte_rounded(V * C);
    for (int64_t i = 0; i < V * C; ++i) {
      wte_bits[i] = FloatToBFloat16Bits(wte[i]);
      wte_rounded[i] = BFloat16BitsToFloat(wte_bits[i]);
    }
    for (int64_t i = 0; i < N * C; ++i)
      h_rounded[i] = BFloat16BitsToFloat(FloatToBFloat16Bits(h[i]));
    std::vector<int32_t> targets = RandomTargets(gen, N, V, s.ignore_index, 0.25);
    targets[0] = static_cast<int32_t>(V - 1);
    const double loss_grad = 2.0;
    const Reference ref = NaiveCrossEntropy(s, h_rounded, wte_rounded, targets, loss_grad);
    std::vector<float> lse(N), ws(LmHeadCrossEntropyBf16WorkspaceElems(s));
    ASSERT_OK_AND_ASSIGN(const double loss,
                         LmHeadCrossEntropyForwardBf16(s, h, wte_bits, targets, absl::MakeSpan(lse),
                                                       absl::MakeSpan(ws), &pool));
    std::vector<float> dh(N * C, 0.f), dwte(V * C, 0.f);
    ASSERT_OK(LmHeadCrossEntropyBackwardBf16(s, h, wte_bits, targets, lse, loss_grad,
                                             absl::MakeSpan(dh), absl::MakeSpan(dwte),
                                             absl::MakeSpan(ws), &pool));
    const double tol = 2e-7 * C + 1e-6;
    EXPECT_THAT(loss, DoubleNear(ref.loss, tol));
    ExpectAllNear(lse, ref.lse, tol, 1e-6, "lse");
    // Sum over the gradient terms of |dz| times the other operand, per output element.
    int64_t valid = 0;
    for (int32_t t : targets) valid += t != s.ignore_index;
    std::vector<double> dh_abs(N * C, 0.0), dwte_abs(V * C, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (targets[n] == s.ignore_index) continue;
      for (int64_t v = 0; v < V; ++v) {
        double z = 0;
        for (int64_t c = 0; c < C; ++c) z += h_rounded[n * C + c] * wte_rounded[v * C + c];
        const double dz =
            std::abs(loss_grad / valid * (std::exp(z - ref.lse[n]) - (v == targets[n])));
        for (int64_t c = 0; c < C; ++c) {
          dh_abs[n * C + c] += dz * std::abs(wte_rounded[v * C + c]);
          dwte_abs[v * C + c] += dz * std::abs(h_rounded[n * C + c]);
        }
      }
    }
    auto expect_within = [](const std::vector<float>& got, const std::vector<double>& want,
                            const std::vector<double>& abs, const char* what) {
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double bound = std::ldexp(abs[i], -8) * 1.01 + 1e-7;
        if (!(std::abs(got[i] - want[i]) <= bound) && ++bad <= 3) {
          ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << want[i]
                        << ", bound " << bound;
        }
      }
      EXPECT_EQ(bad, 0) << what;
    };
    expect_within(dh, ref.dh, dh_abs, "dh");
    expect_within(dwte, ref.dwte, dwte_abs, "dwte");
  }
}

TEST_P(LmHeadCrossEntropyBf16Test, ResultsDoNotDependOnThreadCount) {
  TestRng gen(6);  // fixed seed: reproducible failures
  const LmHeadCrossEntropyShape s{300, 40, 1000, 128, 512, -100};
  const std::vector<float> h = RandomVector<float>(gen, 300 * 40);
  std::vector<uint16_t> wte(1000 * 40);
  for (uint16_t& w : wte) w = FloatToBFloat16Bits(absl::Uniform(gen, -1.0f, 1.0f));
  const std::vector<int32_t> targets = RandomTargets(gen, 300, 1000, -100, 0.1);
  ThreadPool pool(4);
  std::vector<float> out[2][3];
  double losses[2];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    std::vector<float> ws(LmHeadCrossEntropyBf16WorkspaceElems(s));
    out[run][0].assign(300, 0.f);
    out[run][1].assign(300 * 40, 0.f);
    out[run][2].assign(1000 * 40, 0.f);
    ASSERT_OK_AND_ASSIGN(
        losses[run], LmHeadCrossEntropyForwardBf16(s, h, wte, targets, absl::MakeSpan(out[run][0]),
                                                   absl::MakeSpan(ws), p));
    ASSERT_OK(LmHeadCrossEntropyBackwardBf16(s, h, wte, targets, out[run][0], 1.0,
                                             absl::MakeSpan(out[run][1]),
                                             absl::MakeSpan(out[run][2]), absl::MakeSpan(ws), p));
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[0][i], out[1][i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Backends, LmHeadCrossEntropyBf16Test,
                         ::testing::Values(Bf16GemmBackend::kOneDnn, Bf16GemmBackend::kFallback),
                         [](const ::testing::TestParamInfo<Bf16GemmBackend>& info) {
                           return std::string(kernels_internal::Bf16GemmBackendName(info.param));
                         });

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The fused training kernel must give exactly what Forward then Backward give: the training
// losses of the model depend on it. Row tiles with ignored rows, one wholly ignored row tile,
// tile tails, and gradients that already hold values.
TEST_F(LmHeadCrossEntropyTest, FusedForwardBackwardIsBitIdenticalToTheTwoKernels) {
  TestRng gen(8);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  for (const LmHeadCrossEntropyShape s :
       {LmHeadCrossEntropyShape{13, 11, 37, 4, 8, -100}, LmHeadCrossEntropyShape{1, 5, 19},
        LmHeadCrossEntropyShape{40, 33, 300, 16, 128, -1},
        LmHeadCrossEntropyShape{9, 6, 5, 3, 2}}) {
    const int64_t N = s.rows, C = s.channels, V = s.vocab_size;
    const std::vector<float> h = RandomVector<float>(gen, N * C, -1, 1);
    const std::vector<float> wte = RandomVector<float>(gen, V * C, -1, 1);
    std::vector<int32_t> targets = RandomTargets(gen, N, V, s.ignore_index, 0.3);
    for (int64_t i = 0; i < std::min(N, s.row_tile); ++i) targets[i] = s.ignore_index;
    const std::vector<float> dh0 = RandomVector<float>(gen, N * C),
                             dwte0 = RandomVector<float>(gen, V * C);
    for (bool all_ignored : {false, true}) {
      if (all_ignored) std::fill(targets.begin(), targets.end(), s.ignore_index);
      std::vector<float> lse(N), dh = dh0, dwte = dwte0, ws(LmHeadCrossEntropyWorkspaceElems(s));
      ASSERT_OK_AND_ASSIGN(const double loss,
                           LmHeadCrossEntropyForward<float>(s, h, wte, targets, absl::MakeSpan(lse),
                                                            absl::MakeSpan(ws), &pool));
      ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, h, wte, targets, lse, 3.0, absl::MakeSpan(dh),
                                                  absl::MakeSpan(dwte), absl::MakeSpan(ws), &pool));
      std::vector<float> f_lse(N), f_dh = dh0, f_dwte = dwte0,
                                   f_ws(LmHeadCrossEntropyFusedWorkspaceElems(s));
      ASSERT_OK_AND_ASSIGN(const double f_loss,
                           LmHeadCrossEntropyForwardBackward<float>(
                               s, h, wte, targets, 3.0, absl::MakeSpan(f_lse), absl::MakeSpan(f_dh),
                               absl::MakeSpan(f_dwte), absl::MakeSpan(f_ws), &pool));
      EXPECT_EQ(loss, f_loss);
      EXPECT_TRUE(SameBits(lse, f_lse));
      EXPECT_TRUE(SameBits(dh, f_dh));
      EXPECT_TRUE(SameBits(dwte, f_dwte));
      // bf16, on each backend that runs here.
      std::vector<uint16_t> wte_bits(V * C);
      for (int64_t i = 0; i < V * C; ++i) wte_bits[i] = FloatToBFloat16Bits(wte[i]);
      for (kernels_internal::Bf16GemmBackend backend :
           {kernels_internal::Bf16GemmBackend::kOneDnn,
            kernels_internal::Bf16GemmBackend::kFallback}) {
        if (backend == kernels_internal::Bf16GemmBackend::kOneDnn &&
            !kernels_internal::OneDnnBf16Available()) {
          continue;
        }
        kernels_internal::SetBf16GemmBackendForTest(backend);
        std::vector<float> b_lse(N), b_dh = dh0, b_dwte = dwte0,
                                     b_ws(LmHeadCrossEntropyBf16WorkspaceElems(s));
        ASSERT_OK_AND_ASSIGN(
            const double b_loss,
            LmHeadCrossEntropyForwardBf16(s, h, wte_bits, targets, absl::MakeSpan(b_lse),
                                          absl::MakeSpan(b_ws), &pool));
        ASSERT_OK(LmHeadCrossEntropyBackwardBf16(s, h, wte_bits, targets, b_lse, 3.0,
                                                 absl::MakeSpan(b_dh), absl::MakeSpan(b_dwte),
                                                 absl::MakeSpan(b_ws), &pool));
        std::vector<float> fb_lse(N), fb_dh = dh0, fb_dwte = dwte0,
                                      fb_ws(LmHeadCrossEntropyFusedBf16WorkspaceElems(s));
        ASSERT_OK_AND_ASSIGN(
            const double fb_loss,
            LmHeadCrossEntropyForwardBackwardBf16(
                s, h, wte_bits, targets, 3.0, absl::MakeSpan(fb_lse), absl::MakeSpan(fb_dh),
                absl::MakeSpan(fb_dwte), absl::MakeSpan(fb_ws), &pool));
        EXPECT_EQ(b_loss, fb_loss);
        EXPECT_TRUE(SameBits(b_lse, fb_lse));
        EXPECT_TRUE(SameBits(b_dh, fb_dh));
        EXPECT_TRUE(SameBits(b_dwte, fb_dwte));
        kernels_internal::SetBf16GemmBackendForTest(kernels_internal::Bf16GemmBackend::kAuto);
      }
    }
  }
  // Errors: a workspace of one tile is not enough for the fused kernel.
  const LmHeadCrossEntropyShape s{8, 4, 40, 4, 8, -100};
  std::vector<float> h(32), wte(160), lse(8), dh(32), dwte(160),
      ws(LmHeadCrossEntropyWorkspaceElems(s));
  std::vector<int32_t> targets(8, 1);
  EXPECT_THAT(LmHeadCrossEntropyForwardBackward<float>(s, h, wte, targets, 1.0, absl::MakeSpan(lse),
                                                       absl::MakeSpan(dh), absl::MakeSpan(dwte),
                                                       absl::MakeSpan(ws), nullptr)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
}

TEST_F(LmHeadCrossEntropyTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const LmHeadCrossEntropyShape s{6, 4, 11, 4, 3, -1};
  std::vector<double> h = RandomVector<double>(gen, 24), wte = RandomVector<double>(gen, 44);
  const std::vector<int32_t> targets = {3, -1, 0, 10, 7, 3};
  std::vector<double> lse(6), ws(LmHeadCrossEntropyWorkspaceElems(s));
  auto loss = [&]() {
    absl::StatusOr<double> l = LmHeadCrossEntropyForward<double>(
        s, h, wte, targets, absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr);
    PS_CHECK_OK(l);
    return *l;
  };
  loss();
  std::vector<double> dh(24, 0.0), dwte(44, 0.0);
  ASSERT_OK(LmHeadCrossEntropyBackward<double>(s, h, wte, targets, lse, 1.0, absl::MakeSpan(dh),
                                               absl::MakeSpan(dwte), absl::MakeSpan(ws), nullptr));
  ExpectGradientMatchesFiniteDifferences(h, dh, loss, "dh", 1e-8, 1e-6, 1000);
  ExpectGradientMatchesFiniteDifferences(wte, dwte, loss, "dwte", 1e-8, 1e-6, 1000);
  // The ignored row gets no gradient.
  for (int c = 0; c < 4; ++c) EXPECT_EQ(dh[1 * 4 + c], 0.0);
}

TEST_F(LmHeadCrossEntropyTest, AllIgnoredGivesZeroLossAndNoGradient) {
  const LmHeadCrossEntropyShape s{2, 3, 5};
  std::vector<float> h(6, 0.5f), wte(15, 0.25f), lse(2), ws(LmHeadCrossEntropyWorkspaceElems(s));
  const std::vector<int32_t> targets = {-100, -100};
  EXPECT_THAT(LmHeadCrossEntropyForward<float>(s, h, wte, targets, absl::MakeSpan(lse),
                                               absl::MakeSpan(ws), nullptr),
              IsOkAndHolds(0.0));
  std::vector<float> dh(6, 0.f), dwte(15, 0.f);
  ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, h, wte, targets, lse, 1.0, absl::MakeSpan(dh),
                                              absl::MakeSpan(dwte), absl::MakeSpan(ws), nullptr));
  EXPECT_EQ(dh, std::vector<float>(6, 0.f));
  EXPECT_EQ(dwte, std::vector<float>(15, 0.f));
}

TEST_F(LmHeadCrossEntropyTest, WorkspaceIsOneTileNotTheFullLogits) {
  const LmHeadCrossEntropyShape gpt2{8 * 1024, 768, 50257};
  EXPECT_EQ(LmHeadCrossEntropyWorkspaceElems(gpt2), 256 * 2048 + 3 * 256);
  EXPECT_LT(LmHeadCrossEntropyWorkspaceBytes<float>(gpt2), int64_t{3} << 20);
  // Small problems need no more than the problem itself.
  EXPECT_EQ(LmHeadCrossEntropyWorkspaceElems({3, 4, 5}), 3 * 5 + 9);
}

TEST_F(LmHeadCrossEntropyTest, ResultsDoNotDependOnPoolThreads) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const LmHeadCrossEntropyShape s{40, 16, 300, 16, 128};
  const std::vector<float> h = RandomVector<float>(gen, 640), wte = RandomVector<float>(gen, 4800);
  const std::vector<int32_t> targets = RandomTargets(gen, 40, 300, -100, 0.1);
  ThreadPool pool(4);
  std::vector<float> results[2][3];
  double losses[2];
  for (int run = 0; run < 2; ++run) {
    std::vector<float> lse(40), ws(LmHeadCrossEntropyWorkspaceElems(s)), dh(640, 0.f),
        dwte(4800, 0.f);
    ThreadPool* p = run == 0 ? nullptr : &pool;
    ASSERT_OK_AND_ASSIGN(losses[run],
                         LmHeadCrossEntropyForward<float>(s, h, wte, targets, absl::MakeSpan(lse),
                                                          absl::MakeSpan(ws), p));
    ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, h, wte, targets, lse, 1.0, absl::MakeSpan(dh),
                                                absl::MakeSpan(dwte), absl::MakeSpan(ws), p));
    results[run][0] = lse;
    results[run][1] = dh;
    results[run][2] = dwte;
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results[0][i], results[1][i]) << i;
}

TEST_F(LmHeadCrossEntropyTest, RejectsBadTargetsAndBuffers) {
  const LmHeadCrossEntropyShape s{2, 3, 5};
  std::vector<float> h(6), wte(15), lse(2), ws(LmHeadCrossEntropyWorkspaceElems(s));
  EXPECT_THAT(LmHeadCrossEntropyForward<float>(s, h, wte, std::vector<int32_t>{0, 5},
                                               absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target 5")));
  EXPECT_THAT(LmHeadCrossEntropyForward<float>(s, h, wte, std::vector<int32_t>{0, -1},
                                               absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target -1")));
  EXPECT_THAT(
      LmHeadCrossEntropyForward<float>(s, h, wte, std::vector<int32_t>{0, 1}, absl::MakeSpan(lse),
                                       absl::MakeSpan(ws).subspan(1), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  EXPECT_THAT(LmHeadCrossEntropyForward<float>(s, h, absl::MakeSpan(wte).subspan(3),
                                               std::vector<int32_t>{0, 1}, absl::MakeSpan(lse),
                                               absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wte")));
}

}  // namespace
}  // namespace ps
