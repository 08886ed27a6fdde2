#include "model/kernels/attention.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "model/kernels/internal/attention_reference.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

struct Reference {
  std::vector<double> out, lse, dqkv;
};

// The naive reference: the full T x T masked score matrix per head, a plain softmax, and the
// backward through the softmax Jacobian written with rowsum(P * dP) (not the kernel's dO . out).
Reference NaiveAttention(const AttentionShape& s, const std::vector<double>& qkv,
                         const std::vector<double>& dout) {
  const int64_t B = s.batch, L = s.seq_len, C = s.channels, H = s.num_heads, hd = C / H;
  const double scale = 1 / std::sqrt(static_cast<double>(hd));
  Reference ref;
  ref.out.assign(B * L * C, 0.0);
  ref.lse.assign(B * H * L, 0.0);
  ref.dqkv.assign(B * L * 3 * C, 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return (b * L + t) * 3 * C + part * C + h * hd + d;
  };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> P(L * L, 0.0), dP(L * L, 0.0);
      for (int64_t i = 0; i < L; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double sc = 0;
          for (int64_t d = 0; d < hd; ++d) sc += qkv[at(b, i, 0, h, d)] * qkv[at(b, j, 1, h, d)];
          P[i * L + j] = sc * scale;
          mx = std::max(mx, sc * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(P[i * L + j] - mx);
        ref.lse[(b * H + h) * L + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) P[i * L + j] = std::exp(P[i * L + j] - mx) / sum;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            ref.out[(b * L + i) * C + h * hd + d] += P[i * L + j] * qkv[at(b, j, 2, h, d)];
          }
        }
      }
      for (int64_t i = 0; i < L; ++i) {
        const double* dO = dout.data() + (b * L + i) * C + h * hd;
        double row = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dp += dO[d] * qkv[at(b, j, 2, h, d)];
            ref.dqkv[at(b, j, 2, h, d)] += P[i * L + j] * dO[d];
          }
          dP[i * L + j] = dp;
          row += P[i * L + j] * dp;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double dS = P[i * L + j] * (dP[i * L + j] - row);
          for (int64_t d = 0; d < hd; ++d) {
            ref.dqkv[at(b, i, 0, h, d)] += scale * dS * qkv[at(b, j, 1, h, d)];
            ref.dqkv[at(b, j, 1, h, d)] += scale * dS * qkv[at(b, i, 0, h, d)];
          }
        }
      }
    }
  }
  return ref;
}

TEST(AttentionTest, FloatMatchesNaiveReference) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // T = 1; T not a multiple of the tile; one tile covering all; B > 1; odd head dims.
  for (const AttentionShape s : {AttentionShape{1, 1, 4, 2, 8}, AttentionShape{2, 37, 12, 3, 8},
                                 AttentionShape{1, 5, 6, 1, 64}, AttentionShape{3, 20, 10, 2, 7},
                                 AttentionShape{1, 300, 16, 2, 64}}) {
    const int64_t B = s.batch, L = s.seq_len, C = s.channels, H = s.num_heads;
    // Scores reach |s| ~ 6: the online softmax rescales across tiles for real.
    const std::vector<double> qkv = RandomVector<double>(gen, B * L * 3 * C, -2, 2);
    const std::vector<double> dout = RandomVector<double>(gen, B * L * C);
    const Reference ref = NaiveAttention(s, qkv, dout);
    std::vector<float> out(B * L * C), lse(B * H * L), ws(AttentionWorkspaceElems(s, 3));
    std::vector<float> dqkv(B * L * 3 * C, 0.f);
    const std::vector<float> qkvf = Convert<float>(qkv);
    ASSERT_OK(AttentionForward<float>(s, qkvf, absl::MakeSpan(out), absl::MakeSpan(lse),
                                      absl::MakeSpan(ws), &pool));
    ASSERT_OK(AttentionBackward<float>(s, qkvf, out, lse, Convert<float>(dout),
                                       absl::MakeSpan(dqkv), &pool));
    // Scores carry hd-term float dot products (|s| <= ~6, error ~1e-6); outputs are convex
    // combinations of |v| <= 2; gradients sum up to T terms of O(1). The bounds leave ~10x room.
    ExpectAllNear(out, ref.out, 1e-5, 1e-5, "out");
    ExpectAllNear(lse, ref.lse, 1e-5, 1e-6, "lse");
    ExpectAllNear(dqkv, ref.dqkv, 3e-5, 1e-4, "dqkv");
  }
}

// Element-wise bit equality (so -0 vs +0 and NaN payloads count), naming the first difference.
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << want[i];
      return;
    }
  }
}

// The f32 kernels run a faster schedule (internal/attention_simd.h) that must reproduce the
// reference schedule (internal/attention_reference.h, the loops the kernels ran before) bit for
// bit, on every instruction set this CPU has: the training losses depend on it.
TEST(AttentionTest, FloatIsBitIdenticalToTheReferenceScheduleOnEveryTarget) {
  TestRng gen(4);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // Head dims with and without vector tails (1, 3, 17, 20, 40, 80) and GPT-2's 64 and the default
  // run's 32; sequence lengths around the 64-row backward block; tiles from 1 to > T.
  const AttentionShape shapes[] = {{1, 1, 4, 2, 8},    {2, 37, 12, 3, 8},   {1, 5, 6, 1, 64},
                                   {3, 20, 10, 2, 7},  {1, 130, 64, 1, 64}, {1, 64, 128, 4, 64},
                                   {1, 65, 32, 1, 16}, {1, 70, 51, 3, 1},   {1, 129, 40, 2, 256},
                                   {1, 9, 1, 1, 4}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const AttentionShape& s : shapes) {
      SCOPED_TRACE(::testing::Message()
                   << "B=" << s.batch << " T=" << s.seq_len << " C=" << s.channels
                   << " H=" << s.num_heads << " tile=" << s.tile);
      const int64_t B = s.batch, L = s.seq_len, C = s.channels, H = s.num_heads;
      const std::vector<float> qkv = RandomVector<float>(gen, B * L * 3 * C, -2, 2);
      const std::vector<float> dout = RandomVector<float>(gen, B * L * C);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const int slots = p == nullptr ? 1 : p->num_threads();
        std::vector<float> ws(AttentionWorkspaceElems(s, slots));
        std::vector<float> out(B * L * C), lse(B * H * L), ref_out(B * L * C), ref_lse(B * H * L);
        ASSERT_OK(AttentionForward<float>(s, qkv, absl::MakeSpan(out), absl::MakeSpan(lse),
                                          absl::MakeSpan(ws), p));
        kernels_internal::AttentionForwardReference<float>(
            s, qkv, absl::MakeSpan(ref_out), absl::MakeSpan(ref_lse), absl::MakeSpan(ws), p);
        ExpectSameBits(out, ref_out, "out");
        ExpectSameBits(lse, ref_lse, "lse");
        // Backward accumulates into a non-zero gradient, as the model's dqkv may be.
        const std::vector<float> init = RandomVector<float>(gen, B * L * 3 * C);
        std::vector<float> dqkv = init, ref_dqkv = init;
        ASSERT_OK(AttentionBackward<float>(s, qkv, out, lse, dout, absl::MakeSpan(dqkv), p));
        kernels_internal::AttentionBackwardReference<float>(s, qkv, out, lse, dout,
                                                            absl::MakeSpan(ref_dqkv), p);
        ExpectSameBits(dqkv, ref_dqkv, "dqkv");
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(AttentionTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const AttentionShape s{2, 9, 6, 2, 4};
  const int64_t n_qkv = 2 * 9 * 18, n_out = 2 * 9 * 6;
  std::vector<double> qkv = RandomVector<double>(gen, n_qkv, -1.5, 1.5);
  const std::vector<double> r = RandomVector<double>(gen, n_out);
  std::vector<double> out(n_out), lse(2 * 2 * 9), ws(AttentionWorkspaceElems(s, 1));
  auto loss = [&]() {
    PS_CHECK_OK(AttentionForward<double>(s, qkv, absl::MakeSpan(out), absl::MakeSpan(lse),
                                         absl::MakeSpan(ws), nullptr));
    return Dot(out, r);
  };
  loss();
  std::vector<double> dqkv(n_qkv, 0.0);
  ASSERT_OK(AttentionBackward<double>(s, qkv, out, lse, r, absl::MakeSpan(dqkv), nullptr));
  ExpectGradientMatchesFiniteDifferences(qkv, dqkv, loss, "dqkv", 1e-8, 1e-6, 1000);
}

TEST(AttentionTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const AttentionShape s{2, 33, 16, 4, 8};
  const std::vector<float> qkv = RandomVector<float>(gen, 2 * 33 * 48);
  const std::vector<float> dout = RandomVector<float>(gen, 2 * 33 * 16);
  ThreadPool pool(4);
  std::vector<float> results[2][3];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    std::vector<float> out(2 * 33 * 16), lse(2 * 4 * 33), dqkv(2 * 33 * 48, 0.f);
    std::vector<float> ws(AttentionWorkspaceElems(s, p == nullptr ? 1 : p->num_threads()));
    ASSERT_OK(AttentionForward<float>(s, qkv, absl::MakeSpan(out), absl::MakeSpan(lse),
                                      absl::MakeSpan(ws), p));
    ASSERT_OK(AttentionBackward<float>(s, qkv, out, lse, dout, absl::MakeSpan(dqkv), p));
    results[run][0] = out;
    results[run][1] = lse;
    results[run][2] = dqkv;
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results[0][i], results[1][i]) << i;
}

TEST(AttentionTest, WorkspaceIsIndependentOfSequenceLength) {
  // GPT-2 small heads at T = 4096: a T x T score matrix per head would be 64 MiB in f32.
  const AttentionShape long_seq{1, 4096, 768, 12, 64};
  const AttentionShape short_seq{1, 64, 768, 12, 64};
  EXPECT_EQ(AttentionWorkspaceElems(long_seq, 4), AttentionWorkspaceElems(short_seq, 4));
  EXPECT_EQ(AttentionWorkspaceElems(long_seq, 4), 4 * (64 + 64));
  EXPECT_LE(AttentionWorkspaceBytes<float>(long_seq, 4), 4096 * 64 * 4)  // O(T * tile) bound
      << "the attention workspace must not grow with T^2";
}

TEST(AttentionTest, RejectsBadShapesAndSmallWorkspace) {
  std::vector<float> qkv(2 * 3 * 12), out(2 * 3 * 4), lse(2 * 2 * 3), ws(100);
  EXPECT_THAT(AttentionForward<float>({2, 3, 4, 3, 8}, qkv, absl::MakeSpan(out),
                                      absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_heads 3")));
  EXPECT_THAT(AttentionForward<float>({2, 3, 4, 2, 8}, qkv, absl::MakeSpan(out),
                                      absl::MakeSpan(lse).subspan(1), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lse")));
  ThreadPool pool(2);
  const AttentionShape s{2, 3, 4, 2, 8};
  std::vector<float> small(AttentionWorkspaceElems(s, 1));
  EXPECT_THAT(AttentionForward<float>(s, qkv, absl::MakeSpan(out), absl::MakeSpan(lse),
                                      absl::MakeSpan(small), &pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  EXPECT_THAT(AttentionBackward<float>(s, absl::MakeSpan(qkv).subspan(1), out, lse, out,
                                       absl::MakeSpan(qkv), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("qkv")));
}

}  // namespace
}  // namespace ps
