#include "model/kernels/gqa_attention.h"

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
  for (const GqaAttentionShape& s :
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
    // Scores carry D-term f32 dot products (|s| <= ~6, error ~1e-6); outputs are convex
    // combinations of |v| <= 2; dq sums up to T terms of O(1), dk and dv up to G * T, hence the
    // G-scaled bound. The bounds leave ~10x room.
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

// GPT-2's fused qkv [B, T, 3C] interleaves q, k and v per token; the kernel reads it through row
// strides of 3C (q = qkv, k = qkv + C, v = qkv + 2C, kv heads = heads) and writes the gradients
// likewise into dqkv. The same numbers in separate packed tensors must give the same bits: the
// layout does not change the arithmetic. Also checked against the naive reference.
struct FusedQkv {
  GqaAttentionShape shape;  // strided, kv heads = heads
  std::vector<float> qkv;   // [B, T, 3C]
};
FusedQkv Fuse(const GqaAttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
              const std::vector<float>& v) {
  const int64_t C = s.num_heads * s.head_dim;
  FusedQkv f{s, std::vector<float>(s.batch * s.seq_len * 3 * C)};
  f.shape.q_row_stride = f.shape.kv_row_stride = 3 * C;
  for (int64_t row = 0; row < s.batch * s.seq_len; ++row) {
    for (int64_t c = 0; c < C; ++c) {
      f.qkv[row * 3 * C + c] = q[row * C + c];
      f.qkv[row * 3 * C + C + c] = k[row * C + c];
      f.qkv[row * 3 * C + 2 * C + c] = v[row * C + c];
    }
  }
  return f;
}

// out, lse and dqkv (accumulated onto `dqkv_init`) of the fused layout.
struct FusedResult {
  std::vector<float> out, lse, dqkv;
};
FusedResult RunFused(const FusedQkv& f, const std::vector<float>& dout,
                     const std::vector<float>& dqkv_init, ThreadPool* pool) {
  const GqaAttentionShape& s = f.shape;
  const int64_t C = s.num_heads * s.head_dim;
  const int64_t nq = GqaAttentionQElems(s), nkv = GqaAttentionKvElems(s);
  EXPECT_EQ(nq, static_cast<int64_t>(f.qkv.size()) - 2 * C);
  EXPECT_EQ(nkv, nq);
  FusedResult r{std::vector<float>(s.batch * s.seq_len * C),
                std::vector<float>(s.batch * s.num_heads * s.seq_len), dqkv_init};
  std::vector<float> ws(GqaAttentionWorkspaceElems(s, pool == nullptr ? 1 : pool->num_threads()));
  const absl::Span<const float> in(f.qkv);
  const absl::Span<float> d = absl::MakeSpan(r.dqkv);
  EXPECT_OK(GqaAttentionForward<float>(s, in.subspan(0, nq), in.subspan(C, nkv),
                                       in.subspan(2 * C, nkv), absl::MakeSpan(r.out),
                                       absl::MakeSpan(r.lse), absl::MakeSpan(ws), pool));
  EXPECT_OK(GqaAttentionBackward<float>(
      s, in.subspan(0, nq), in.subspan(C, nkv), in.subspan(2 * C, nkv), r.out, r.lse, dout,
      d.subspan(0, nq), d.subspan(C, nkv), d.subspan(2 * C, nkv), pool));
  return r;
}

TEST(GqaAttentionTest, FusedQkvViewIsBitIdenticalToSeparateTensors) {
  TestRng gen(3);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // {B, T, H, H, D, tile}: GPT-2's heads (D = 64), odd head dims, T around the 64-row block.
  for (const GqaAttentionShape& s :
       {GqaAttentionShape{2, 23, 3, 3, 8, 5}, GqaAttentionShape{1, 70, 2, 2, 64, 64},
        GqaAttentionShape{3, 9, 4, 4, 3, 1}, GqaAttentionShape{1, 130, 1, 1, 17, 256}}) {
    const int64_t B = s.batch, L = s.seq_len, C = s.num_heads * s.head_dim;
    const Tensors in = RandomTensors(gen, s, 2.0);
    const std::vector<float> q = Convert<float>(in.q), k = Convert<float>(in.k),
                             v = Convert<float>(in.v);
    const std::vector<float> dout = RandomVector<float>(gen, B * L * C);
    const std::vector<float> init = RandomVector<float>(gen, B * L * 3 * C);  // += onto this
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const FusedResult fused = RunFused(Fuse(s, q, k, v), dout, init, p);
      std::vector<float> out(B * L * C), lse(B * s.num_heads * L), dq(B * L * C), dk(B * L * C),
          dv(B * L * C);
      for (int64_t row = 0; row < B * L; ++row) {
        for (int64_t c = 0; c < C; ++c) {
          dq[row * C + c] = init[row * 3 * C + c];
          dk[row * C + c] = init[row * 3 * C + C + c];
          dv[row * C + c] = init[row * 3 * C + 2 * C + c];
        }
      }
      std::vector<float> ws(GqaAttentionWorkspaceElems(s, p == nullptr ? 1 : p->num_threads()));
      ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                           absl::MakeSpan(ws), p));
      ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out, lse, dout, absl::MakeSpan(dq),
                                            absl::MakeSpan(dk), absl::MakeSpan(dv), p));
      EXPECT_EQ(fused.out, out);
      EXPECT_EQ(fused.lse, lse);
      for (int64_t row = 0; row < B * L; ++row) {
        for (int64_t c = 0; c < C; ++c) {
          ASSERT_EQ(fused.dqkv[row * 3 * C + c], dq[row * C + c]) << row << "," << c;
          ASSERT_EQ(fused.dqkv[row * 3 * C + C + c], dk[row * C + c]) << row << "," << c;
          ASSERT_EQ(fused.dqkv[row * 3 * C + 2 * C + c], dv[row * C + c]) << row << "," << c;
        }
      }
    }
  }
}

TEST(GqaAttentionTest, FusedQkvMatchesNaiveReference) {
  TestRng gen(5);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // GPT-2's layout: T = 1; T not a multiple of the tile; one tile covering all; B > 1; odd head
  // dims; a long sequence.
  for (const GqaAttentionShape& s :
       {GqaAttentionShape{1, 1, 2, 2, 2, 8}, GqaAttentionShape{2, 37, 3, 3, 4, 8},
        GqaAttentionShape{1, 5, 1, 1, 6, 64}, GqaAttentionShape{3, 20, 2, 2, 5, 7},
        GqaAttentionShape{1, 300, 2, 2, 8, 64}}) {
    const Tensors in = RandomTensors(gen, s, 2.0);  // scores reach |s| ~ 6: real rescaling
    const int64_t B = s.batch, L = s.seq_len, C = s.num_heads * s.head_dim;
    const std::vector<double> dout = RandomVector<double>(gen, B * L * C);
    const Reference ref = NaiveGqa(s, in, dout);
    const FusedResult fused =
        RunFused(Fuse(s, Convert<float>(in.q), Convert<float>(in.k), Convert<float>(in.v)),
                 Convert<float>(dout), std::vector<float>(B * L * 3 * C, 0.f), &pool);
    std::vector<double> dq(B * L * C), dk(B * L * C), dv(B * L * C);
    for (int64_t row = 0; row < B * L; ++row) {
      for (int64_t c = 0; c < C; ++c) {
        dq[row * C + c] = fused.dqkv[row * 3 * C + c];
        dk[row * C + c] = fused.dqkv[row * 3 * C + C + c];
        dv[row * C + c] = fused.dqkv[row * 3 * C + 2 * C + c];
      }
    }
    // As FloatMatchesNaiveReference with G = 1.
    ExpectAllNear(fused.out, ref.out, 1e-5, 1e-5, "out");
    ExpectAllNear(fused.lse, ref.lse, 1e-5, 1e-6, "lse");
    ExpectAllNear(dq, ref.dq, 3e-5, 1e-4, "dq");
    ExpectAllNear(dk, ref.dk, 3e-5, 1e-4, "dk");
    ExpectAllNear(dv, ref.dv, 3e-5, 1e-4, "dv");
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
// bit, on every instruction set this CPU has: the training losses depend on it. Packed and strided
// (GPT-2's fused qkv) layouts, multi-head, grouped and multi-query heads.
TEST(GqaAttentionTest, FloatIsBitIdenticalToTheReferenceScheduleOnEveryTarget) {
  TestRng gen(6);  // fixed seed: reproducible failures
  ThreadPool pool(3);
  // {B, T, Hq, Hkv, D, tile, q_row_stride, kv_row_stride}. Head dims with and without vector
  // tails (1, 3, 17, 20, 40, 80) and GPT-2's 64 and the default run's 32; sequence lengths around
  // the 64-row backward block; tiles from 1 to > T; strides of a fused qkv and padded rows.
  const GqaAttentionShape shapes[] = {{1, 1, 2, 2, 4, 8, 24, 24},    {2, 37, 3, 3, 4, 8, 36, 36},
                                      {1, 5, 1, 1, 6, 64, 18, 18},   {3, 20, 2, 2, 5, 7, 30, 30},
                                      {1, 130, 1, 1, 64, 64},        {1, 64, 4, 4, 32, 64},
                                      {1, 65, 1, 1, 32, 16, 96, 96}, {1, 70, 3, 3, 17, 1, 153, 153},
                                      {1, 129, 2, 2, 20, 256},       {1, 9, 1, 1, 1, 4, 3, 3},
                                      {2, 37, 4, 2, 6, 8},           {1, 40, 4, 2, 40, 7},
                                      {1, 70, 2, 1, 80, 64},         {2, 20, 8, 2, 3, 5, 30, 9},
                                      {1, 66, 4, 2, 17, 64, 120, 60}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const GqaAttentionShape& s : shapes) {
      SCOPED_TRACE(::testing::Message()
                   << "B=" << s.batch << " T=" << s.seq_len << " Hq=" << s.num_heads
                   << " Hkv=" << s.num_kv_heads << " D=" << s.head_dim << " tile=" << s.tile
                   << " strides=" << s.q_row_stride << "," << s.kv_row_stride);
      const int64_t nq = GqaAttentionQElems(s), nkv = GqaAttentionKvElems(s);
      const int64_t nout = s.batch * s.seq_len * s.num_heads * s.head_dim;
      const std::vector<float> q = RandomVector<float>(gen, nq, -2, 2);
      const std::vector<float> k = RandomVector<float>(gen, nkv, -2, 2);
      const std::vector<float> v = RandomVector<float>(gen, nkv, -2, 2);
      const std::vector<float> dout = RandomVector<float>(gen, nout);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const int slots = p == nullptr ? 1 : p->num_threads();
        std::vector<float> ws(GqaAttentionWorkspaceElems(s, slots));
        const int64_t nlse = s.batch * s.num_heads * s.seq_len;
        std::vector<float> out(nout), lse(nlse), ref_out(nout), ref_lse(nlse);
        ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                             absl::MakeSpan(ws), p));
        kernels_internal::GqaAttentionForwardReference<float>(
            s, q, k, v, absl::MakeSpan(ref_out), absl::MakeSpan(ref_lse), absl::MakeSpan(ws), p);
        ExpectSameBits(out, ref_out, "out");
        ExpectSameBits(lse, ref_lse, "lse");
        // Backward accumulates into non-zero gradients, as the model's may be.
        const std::vector<float> dq0 = RandomVector<float>(gen, nq);
        const std::vector<float> dk0 = RandomVector<float>(gen, nkv);
        const std::vector<float> dv0 = RandomVector<float>(gen, nkv);
        std::vector<float> dq = dq0, dk = dk0, dv = dv0, ref_dq = dq0, ref_dk = dk0, ref_dv = dv0;
        ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out, lse, dout, absl::MakeSpan(dq),
                                              absl::MakeSpan(dk), absl::MakeSpan(dv), p));
        kernels_internal::GqaAttentionBackwardReference<float>(
            s, q, k, v, out, lse, dout, absl::MakeSpan(ref_dq), absl::MakeSpan(ref_dk),
            absl::MakeSpan(ref_dv), p);
        ExpectSameBits(dq, ref_dq, "dq");
        ExpectSameBits(dk, ref_dk, "dk");
        ExpectSameBits(dv, ref_dv, "dv");
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
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
  GqaAttentionShape short_stride = s;
  short_stride.q_row_stride = 11;  // a row of q holds Hq*D = 12
  EXPECT_THAT(GqaAttentionForward<float>(short_stride, q, kv2, kv2, absl::MakeSpan(out),
                                         absl::MakeSpan(lse), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("q_row_stride 11 is shorter than a row (Hq*D = 12)")));
  GqaAttentionShape fused = s;  // rows of 20: q must cover (B*T-1)*20 + 12 = 112 elements
  fused.q_row_stride = fused.kv_row_stride = 20;
  EXPECT_THAT(
      GqaAttentionForward<float>(fused, q, kv2, kv2, absl::MakeSpan(out), absl::MakeSpan(lse),
                                 absl::MakeSpan(ws), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("q has 72 elements, expected 112")));
  std::vector<float> dq(q.size()), dk(kv2.size()), dv(kv.size());
  EXPECT_THAT(GqaAttentionBackward<float>(s, q, kv2, kv2, out, lse, out, absl::MakeSpan(dq),
                                          absl::MakeSpan(dk), absl::MakeSpan(dv), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dv")));
}

}  // namespace
}  // namespace ps
