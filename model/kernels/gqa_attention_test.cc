#include "model/kernels/gqa_attention.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/check.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/attention.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::Convert;
using ::ps::kernel_testing::Dot;
using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::ExpectGradientMatchesFiniteDifferences;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

struct Tensors {
  std::vector<double> q, k, v;
};
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// The naive reference, transformers' eager_attention_forward: repeat_kv (query head h reads kv
// head h / (Hq/Hkv)), the full T x T masked score matrix per head, a plain softmax; the backward
// through the softmax Jacobian with rowsum(P * dP).
Reference NaiveGqa(const GqaAttentionShape& s, const Tensors& in, const std::vector<double>& dout) {
  const int64_t B = s.batch, L = s.seq_len, Hq = s.num_heads, Hkv = s.num_kv_heads, D = s.head_dim,
                G = Hq / Hkv;
  const double scale = 1 / std::sqrt(static_cast<double>(D));
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * L + t) * Hq + h) * D; };
  auto kvi = [&](int64_t b, int64_t t, int64_t g) { return ((b * L + t) * Hkv + g) * D; };
  Reference ref;
  ref.out.assign(in.q.size(), 0);
  ref.dq.assign(in.q.size(), 0);
  ref.dk.assign(in.k.size(), 0);
  ref.dv.assign(in.v.size(), 0);
  ref.lse.assign(B * Hq * L, 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / G;
      std::vector<double> P(L * L, 0.0);
      for (int64_t i = 0; i < L; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double sc = 0;
          for (int64_t d = 0; d < D; ++d) sc += in.q[qi(b, i, h) + d] * in.k[kvi(b, j, g) + d];
          P[i * L + j] = sc * scale;
          mx = std::max(mx, sc * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(P[i * L + j] - mx);
        ref.lse[(b * Hq + h) * L + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) P[i * L + j] = std::exp(P[i * L + j] - mx) / sum;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            ref.out[qi(b, i, h) + d] += P[i * L + j] * in.v[kvi(b, j, g) + d];
          }
        }
      }
      for (int64_t i = 0; i < L; ++i) {
        const double* dO = dout.data() + qi(b, i, h);
        std::vector<double> dP(i + 1);
        double row = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            dp += dO[d] * in.v[kvi(b, j, g) + d];
            ref.dv[kvi(b, j, g) + d] += P[i * L + j] * dO[d];
          }
          dP[j] = dp;
          row += P[i * L + j] * dp;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double dS = P[i * L + j] * (dP[j] - row);
          for (int64_t d = 0; d < D; ++d) {
            ref.dq[qi(b, i, h) + d] += scale * dS * in.k[kvi(b, j, g) + d];
            ref.dk[kvi(b, j, g) + d] += scale * dS * in.q[qi(b, i, h) + d];
          }
        }
      }
    }
  }
  return ref;
}

Tensors RandomTensors(TestRng& gen, const GqaAttentionShape& s, double range) {
  const int64_t nq = s.batch * s.seq_len * s.num_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq_len * s.num_kv_heads * s.head_dim;
  return {RandomVector<double>(gen, nq, -range, range),
          RandomVector<double>(gen, nkv, -range, range),
          RandomVector<double>(gen, nkv, -range, range)};
}

TEST(GqaAttentionTest, FloatMatchesNaiveReference) {
  TestRng gen(1);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // {B, T, Hq, Hkv, D, tile}: T = 1; MQA (Hkv = 1); GQA groups of 2, 3 and 4; MHA; T not a
  // multiple of the tile; a long sequence crossing many tiles; odd head dims.
  for (const GqaAttentionShape s :
       {GqaAttentionShape{1, 1, 2, 1, 4, 8}, GqaAttentionShape{2, 37, 4, 2, 6, 8},
        GqaAttentionShape{1, 20, 6, 2, 5, 7}, GqaAttentionShape{2, 9, 3, 3, 8, 4},
        GqaAttentionShape{1, 19, 8, 2, 12, 64}, GqaAttentionShape{1, 200, 4, 1, 16, 32}}) {
    const Tensors in = RandomTensors(gen, s, 2.0);  // scores reach |s| ~ 6: real rescaling
    const int64_t nq = in.q.size(), nkv = in.k.size();
    const std::vector<double> dout = RandomVector<double>(gen, nq);
    const Reference ref = NaiveGqa(s, in, dout);
    const std::vector<float> q = Convert<float>(in.q), k = Convert<float>(in.k),
                             v = Convert<float>(in.v);
    std::vector<float> out(nq), lse(s.batch * s.num_heads * s.seq_len),
        ws(GqaAttentionWorkspaceElems(s, 3)), dq(nq, 0.f), dk(nkv, 0.f), dv(nkv, 0.f);
    ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                         absl::MakeSpan(ws), &pool));
    ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out, lse, Convert<float>(dout),
                                          absl::MakeSpan(dq), absl::MakeSpan(dk),
                                          absl::MakeSpan(dv), &pool));
    // As attention_test: scores from D-term f32 dot products (|s| <= ~6), outputs convex
    // combinations of |v| <= 2; dk/dv sum up to G * T terms of O(1), hence the G-scaled bound.
    const double G = static_cast<double>(s.num_heads / s.num_kv_heads);
    ExpectAllNear(out, ref.out, 1e-5, 1e-5, "out");
    ExpectAllNear(lse, ref.lse, 1e-5, 1e-6, "lse");
    ExpectAllNear(dq, ref.dq, 3e-5, 1e-4, "dq");
    ExpectAllNear(dk, ref.dk, 3e-5 * G, 1e-4, "dk");
    ExpectAllNear(dv, ref.dv, 3e-5 * G, 1e-4, "dv");
  }
}

TEST(GqaAttentionTest, GradientMatchesFiniteDifferencesInDouble) {
  TestRng gen(2);  // fixed seed: reproducible failures
  const GqaAttentionShape s{2, 9, 4, 2, 3, 4};
  Tensors in = RandomTensors(gen, s, 1.5);
  const int64_t nq = in.q.size(), nkv = in.k.size();
  const std::vector<double> r = RandomVector<double>(gen, nq);
  std::vector<double> out(nq), lse(2 * 4 * 9), ws(GqaAttentionWorkspaceElems(s, 1));
  auto loss = [&]() {
    PS_CHECK_OK(GqaAttentionForward<double>(s, in.q, in.k, in.v, absl::MakeSpan(out),
                                            absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr));
    return Dot(out, r);
  };
  loss();
  std::vector<double> dq(nq, 0.0), dk(nkv, 0.0), dv(nkv, 0.0);
  ASSERT_OK(GqaAttentionBackward<double>(s, in.q, in.k, in.v, out, lse, r, absl::MakeSpan(dq),
                                         absl::MakeSpan(dk), absl::MakeSpan(dv), nullptr));
  ExpectGradientMatchesFiniteDifferences(in.q, dq, loss, "dq", 1e-8, 1e-6, 1000);
  ExpectGradientMatchesFiniteDifferences(in.k, dk, loss, "dk", 1e-8, 1e-6, 1000);
  ExpectGradientMatchesFiniteDifferences(in.v, dv, loss, "dv", 1e-8, 1e-6, 1000);
}

// With Hkv = Hq the kernel is GPT-2's multi-head attention: fed the same numbers (q, k, v packed
// into GPT-2's [B, T, 3C] qkv), it must give bit-identical results — same tiles, same loop order,
// same shared math.
TEST(GqaAttentionTest, MultiHeadCaseIsBitIdenticalToGpt2Attention) {
  TestRng gen(3);  // fixed seed: reproducible failures
  const int64_t B = 2, L = 23, H = 3, D = 8, C = H * D, tile = 5;
  const GqaAttentionShape s{B, L, H, H, D, tile};
  const AttentionShape gpt2{B, L, C, H, tile};
  const Tensors in = RandomTensors(gen, s, 2.0);
  const std::vector<float> q = Convert<float>(in.q), k = Convert<float>(in.k),
                           v = Convert<float>(in.v);
  const std::vector<float> dout = RandomVector<float>(gen, B * L * C);
  std::vector<float> qkv(B * L * 3 * C);
  for (int64_t row = 0; row < B * L; ++row) {
    for (int64_t c = 0; c < C; ++c) {
      qkv[row * 3 * C + c] = q[row * C + c];
      qkv[row * 3 * C + C + c] = k[row * C + c];
      qkv[row * 3 * C + 2 * C + c] = v[row * C + c];
    }
  }
  std::vector<float> out1(B * L * C), lse1(B * H * L), ws1(AttentionWorkspaceElems(gpt2, 1)),
      dqkv(B * L * 3 * C, 0.f);
  ASSERT_OK(AttentionForward<float>(gpt2, qkv, absl::MakeSpan(out1), absl::MakeSpan(lse1),
                                    absl::MakeSpan(ws1), nullptr));
  ASSERT_OK(AttentionBackward<float>(gpt2, qkv, out1, lse1, dout, absl::MakeSpan(dqkv), nullptr));
  std::vector<float> out2(B * L * C), lse2(B * H * L), ws2(GqaAttentionWorkspaceElems(s, 1)),
      dq(B * L * C, 0.f), dk(B * L * C, 0.f), dv(B * L * C, 0.f);
  ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out2), absl::MakeSpan(lse2),
                                       absl::MakeSpan(ws2), nullptr));
  ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out2, lse2, dout, absl::MakeSpan(dq),
                                        absl::MakeSpan(dk), absl::MakeSpan(dv), nullptr));
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(lse1, lse2);
  for (int64_t row = 0; row < B * L; ++row) {
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(dqkv[row * 3 * C + c], dq[row * C + c]) << row << "," << c;
      ASSERT_EQ(dqkv[row * 3 * C + C + c], dk[row * C + c]) << row << "," << c;
      ASSERT_EQ(dqkv[row * 3 * C + 2 * C + c], dv[row * C + c]) << row << "," << c;
    }
  }
}

TEST(GqaAttentionTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(4);  // fixed seed: reproducible failures
  const GqaAttentionShape s{2, 33, 6, 2, 16, 8};
  const Tensors in = RandomTensors(gen, s, 1.0);
  const std::vector<float> q = Convert<float>(in.q), k = Convert<float>(in.k),
                           v = Convert<float>(in.v);
  const std::vector<float> dout = RandomVector<float>(gen, q.size());
  ThreadPool pool(4);
  std::vector<float> results[2][5];
  for (int run = 0; run < 2; ++run) {
    ThreadPool* p = run == 0 ? nullptr : &pool;
    std::vector<float> out(q.size()), lse(2 * 6 * 33), dq(q.size(), 0.f), dk(k.size(), 0.f),
        dv(v.size(), 0.f);
    std::vector<float> ws(GqaAttentionWorkspaceElems(s, p == nullptr ? 1 : p->num_threads()));
    ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                         absl::MakeSpan(ws), p));
    ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out, lse, dout, absl::MakeSpan(dq),
                                          absl::MakeSpan(dk), absl::MakeSpan(dv), p));
    results[run][0] = out;
    results[run][1] = lse;
    results[run][2] = dq;
    results[run][3] = dk;
    results[run][4] = dv;
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(results[0][i], results[1][i]) << i;
}

TEST(GqaAttentionTest, WorkspaceIsIndependentOfSequenceLength) {
  // Llama-3-8B heads at T = 8192: a T x T score matrix per head would be 256 MiB in f32.
  const GqaAttentionShape long_seq{1, 8192, 32, 8, 128, 64};
  const GqaAttentionShape short_seq{1, 64, 32, 8, 128, 64};
  EXPECT_EQ(GqaAttentionWorkspaceElems(long_seq, 4), GqaAttentionWorkspaceElems(short_seq, 4));
  EXPECT_EQ(GqaAttentionWorkspaceElems(long_seq, 4), 4 * (64 + 128));
}

TEST(GqaAttentionTest, RejectsBadShapesAndSmallWorkspace) {
  std::vector<float> q(2 * 3 * 6 * 2), kv(2 * 3 * 4 * 2), out(q.size()), lse(2 * 6 * 3), ws(100);
  EXPECT_THAT(
      GqaAttentionForward<float>({2, 3, 6, 4, 2, 8}, q, kv, kv, absl::MakeSpan(out),
                                 absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("num_attention_heads 6 is not a multiple of num_key_value_heads 4")));
  std::vector<float> kv2(2 * 3 * 2 * 2);
  const GqaAttentionShape s{2, 3, 6, 2, 2, 8};
  EXPECT_THAT(GqaAttentionForward<float>(s, q, kv, kv2, absl::MakeSpan(out), absl::MakeSpan(lse),
                                         absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k has 48 elements")));
  ThreadPool pool(2);
  std::vector<float> small(GqaAttentionWorkspaceElems(s, 1));
  EXPECT_THAT(GqaAttentionForward<float>(s, q, kv2, kv2, absl::MakeSpan(out), absl::MakeSpan(lse),
                                         absl::MakeSpan(small), &pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  std::vector<float> dq(q.size()), dk(kv2.size()), dv(kv.size());
  EXPECT_THAT(GqaAttentionBackward<float>(s, q, kv2, kv2, out, lse, out, absl::MakeSpan(dq),
                                          absl::MakeSpan(dk), absl::MakeSpan(dv), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dv")));
}

}  // namespace
}  // namespace ps
