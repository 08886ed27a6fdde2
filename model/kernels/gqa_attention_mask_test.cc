// The masked attention of model/kernels/gqa_attention.h: per-token key_start (packed documents
// that never see each other) and the sliding window. Checked against a naive masked softmax in
// double, against itself run on each document separately (bit for bit: a packed row must give
// exactly the numbers its documents give alone), across the two CPU schedules (bit for bit on
// every SIMD target) and on the edge cases (documents of one token, one document == plain causal,
// window 1, window >= T). The independent torch reference is masked_attention_vectors_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/internal/attention_reference.h"
#include "model/kernels/testing/kernel_test_util.h"

namespace ps {
namespace {

using ::ps::kernel_testing::ExpectAllNear;
using ::ps::kernel_testing::RandomVector;
using ::testing::HasSubstr;

// Random documents per batch row: key_start[b, t] = the start of t's document. Lengths from 1 to
// max_len (so documents of one token occur).
std::vector<int32_t> RandomKeyStart(TestRng& gen, int64_t B, int64_t T, int64_t max_len) {
  std::vector<int32_t> ks(B * T);
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    while (start < T) {
      const int64_t len = std::min(T - start, absl::Uniform<int64_t>(gen, 1, max_len + 1));
      for (int64_t t = start; t < start + len; ++t) ks[b * T + t] = static_cast<int32_t>(start);
      start += len;
    }
  }
  return ks;
}

// Does query i of row b see key j? Written from the definition, not from AttentionFirstKey.
bool Visible(const GqaAttentionShape& s, const std::vector<int32_t>& ks, int64_t b, int64_t i,
             int64_t j) {
  if (j > i) return false;
  if (!ks.empty() && j < ks[b * s.seq_len + i]) return false;
  if (s.sliding_window > 0 && j <= i - s.sliding_window) return false;
  return true;
}

struct Grads {
  std::vector<double> out, lse, dq, dk, dv;
};

// The naive masked attention in double over packed or strided rows (the shape's strides): the
// full score matrix per head, -inf where not visible, a plain softmax, the Jacobian backward.
Grads NaiveMasked(const GqaAttentionShape& s, const std::vector<int32_t>& ks,
                  const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& dout) {
  const int64_t B = s.batch, L = s.seq_len, Hq = s.num_heads, D = s.head_dim;
  const int64_t G = Hq / s.num_kv_heads, qs = GqaQRowStride(s), kvs = GqaKvRowStride(s);
  const double scale = 1 / std::sqrt(static_cast<double>(D));
  Grads r{std::vector<double>(B * L * Hq * D), std::vector<double>(B * Hq * L),
          std::vector<double>(q.size()), std::vector<double>(k.size()),
          std::vector<double>(v.size())};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / G;
      auto Q = [&](int64_t t) { return (b * L + t) * qs + h * D; };
      auto KV = [&](int64_t t) { return (b * L + t) * kvs + g * D; };
      auto O = [&](int64_t t) { return ((b * L + t) * Hq + h) * D; };
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> p(L, 0.0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < L; ++j) {
          if (!Visible(s, ks, b, i, j)) continue;
          double sc = 0;
          for (int64_t d = 0; d < D; ++d) sc += q[Q(i) + d] * k[KV(j) + d];
          p[j] = sc * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < L; ++j) {
          if (Visible(s, ks, b, i, j)) sum += std::exp(p[j] - mx);
        }
        r.lse[(b * Hq + h) * L + i] = mx + std::log(sum);
        for (int64_t j = 0; j < L; ++j)
          p[j] = Visible(s, ks, b, i, j) ? std::exp(p[j] - mx) / sum : 0;
        std::vector<double> dp(L, 0.0);
        double row = 0;
        for (int64_t j = 0; j < L; ++j) {
          if (p[j] == 0) continue;
          for (int64_t d = 0; d < D; ++d) {
            r.out[O(i) + d] += p[j] * v[KV(j) + d];
            dp[j] += dout[O(i) + d] * v[KV(j) + d];
            r.dv[KV(j) + d] += p[j] * dout[O(i) + d];
          }
          row += p[j] * dp[j];
        }
        for (int64_t j = 0; j < L; ++j) {
          const double ds = p[j] * (dp[j] - row);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[Q(i) + d] += scale * ds * k[KV(j) + d];
            r.dk[KV(j) + d] += scale * ds * q[Q(i) + d];
          }
        }
      }
    }
  }
  return r;
}

// Forward and backward (gradients from zero) through the public functions.
template <typename T>
struct Result {
  std::vector<T> out, lse, dq, dk, dv;
};
template <typename T>
Result<T> RunKernel(const GqaAttentionShape& s, const std::vector<int32_t>& ks,
                    const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                    const std::vector<T>& dout, ThreadPool* pool) {
  const int64_t nout = s.batch * s.seq_len * s.num_heads * s.head_dim;
  Result<T> r{std::vector<T>(nout), std::vector<T>(s.batch * s.num_heads * s.seq_len),
              std::vector<T>(q.size()), std::vector<T>(k.size()), std::vector<T>(v.size())};
  std::vector<T> ws(GqaAttentionWorkspaceElems(s, pool == nullptr ? 1 : pool->num_threads()));
  EXPECT_OK(GqaAttentionForward<T>(s, q, k, v, absl::MakeSpan(r.out), absl::MakeSpan(r.lse),
                                   absl::MakeSpan(ws), pool, ks));
  EXPECT_OK(GqaAttentionBackward<T>(s, q, k, v, r.out, r.lse, dout, absl::MakeSpan(r.dq),
                                    absl::MakeSpan(r.dk), absl::MakeSpan(r.dv), pool, ks));
  return r;
}

template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", expected " << want[i];
      return;
    }
  }
}

template <typename T>
void ExpectSameRun(const Result<T>& got, const Result<T>& want, const std::string& what) {
  ExpectSameBits(got.out, want.out, what + " out");
  ExpectSameBits(got.lse, want.lse, what + " lse");
  ExpectSameBits(got.dq, want.dq, what + " dq");
  ExpectSameBits(got.dk, want.dk, what + " dk");
  ExpectSameBits(got.dv, want.dv, what + " dv");
}

template <typename T>
std::vector<T> Cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

struct Case {
  GqaAttentionShape shape;
  int64_t max_doc;  // longest random document; 0: no key_start (window only)
};

// {B, T, Hq, Hkv, D, tile, q_row_stride, kv_row_stride, sliding_window}: GQA, MQA, MHA; fused
// strides (GPT-2's qkv); windows below, at and above the document lengths; T across the 64-row
// block of the f32 backward and several tiles.
const Case kCases[] = {
    {{2, 37, 4, 2, 6, 8}, 9},
    {{1, 20, 6, 2, 5, 7, 0, 0, 4}, 6},
    {{2, 23, 3, 3, 8, 5, 72, 72}, 7},
    {{1, 130, 2, 1, 16, 32, 0, 0, 40}, 50},
    {{1, 70, 2, 2, 17, 64, 102, 102, 0}, 20},
    {{3, 9, 4, 4, 3, 1, 0, 0, 3}, 0},
    {{1, 150, 4, 2, 8, 64, 0, 0, 0}, 150},
    {{2, 66, 4, 2, 20, 16, 120, 60, 9}, 30},
};

TEST(GqaAttentionMaskTest, MatchesNaiveMaskedSoftmaxInDoubleAndFloat) {
  TestRng gen(101);
  ThreadPool pool(3);
  for (const Case& c : kCases) {
    const GqaAttentionShape& s = c.shape;
    SCOPED_TRACE(::testing::Message() << "T=" << s.seq_len << " window=" << s.sliding_window
                                      << " max_doc=" << c.max_doc);
    const std::vector<int32_t> ks =
        c.max_doc > 0 ? RandomKeyStart(gen, s.batch, s.seq_len, c.max_doc) : std::vector<int32_t>{};
    const std::vector<double> q = RandomVector<double>(gen, GqaAttentionQElems(s), -2, 2);
    const std::vector<double> k = RandomVector<double>(gen, GqaAttentionKvElems(s), -2, 2);
    const std::vector<double> v = RandomVector<double>(gen, GqaAttentionKvElems(s), -2, 2);
    const std::vector<double> dout =
        RandomVector<double>(gen, s.batch * s.seq_len * s.num_heads * s.head_dim);
    const Grads ref = NaiveMasked(s, ks, q, k, v, dout);
    // Double: the same sums in another order, so agreement to ~1e-13 of their magnitude.
    const Result<double> d = RunKernel<double>(s, ks, q, k, v, dout, &pool);
    ExpectAllNear(d.out, ref.out, 1e-12, 1e-12, "f64 out");
    ExpectAllNear(d.lse, ref.lse, 1e-12, 1e-12, "f64 lse");
    ExpectAllNear(d.dq, ref.dq, 1e-11, 1e-11, "f64 dq");
    ExpectAllNear(d.dk, ref.dk, 1e-11, 1e-11, "f64 dk");
    ExpectAllNear(d.dv, ref.dv, 1e-11, 1e-11, "f64 dv");
    // Float: the bounds of gqa_attention_test's FloatMatchesNaiveReference (G-scaled for dk, dv).
    const Result<float> f = RunKernel<float>(s, ks, Cast<float>(q), Cast<float>(k), Cast<float>(v),
                                             Cast<float>(dout), &pool);
    const double G = static_cast<double>(s.num_heads / s.num_kv_heads);
    ExpectAllNear(f.out, ref.out, 1e-5, 1e-5, "f32 out");
    ExpectAllNear(f.lse, ref.lse, 1e-5, 1e-6, "f32 lse");
    ExpectAllNear(f.dq, ref.dq, 3e-5, 1e-4, "f32 dq");
    ExpectAllNear(f.dk, ref.dk, 3e-5 * G, 1e-4, "f32 dk");
    ExpectAllNear(f.dv, ref.dv, 3e-5 * G, 1e-4, "f32 dv");
  }
}

// A packed row is its documents side by side: each document's outputs and gradients must be
// exactly (bit for bit) what attention over that document alone gives — in double and in float,
// in both schedules, with and without a window.
template <typename T>
void CheckPackedEqualsSeparate(int seed) {
  TestRng gen(seed);
  ThreadPool pool(3);
  for (const int64_t window : {int64_t{0}, int64_t{5}}) {
    const GqaAttentionShape s{.batch = 2,
                              .seq_len = 150,
                              .num_heads = 4,
                              .num_kv_heads = 2,
                              .head_dim = 12,
                              .tile = 16,
                              .sliding_window = window};
    const int64_t L = s.seq_len, Hq = s.num_heads, Hkv = s.num_kv_heads, D = s.head_dim;
    const std::vector<int32_t> ks = RandomKeyStart(gen, s.batch, L, 70);
    const std::vector<T> q = RandomVector<T>(gen, GqaAttentionQElems(s), -2, 2);
    const std::vector<T> k = RandomVector<T>(gen, GqaAttentionKvElems(s), -2, 2);
    const std::vector<T> v = RandomVector<T>(gen, GqaAttentionKvElems(s), -2, 2);
    const std::vector<T> dout = RandomVector<T>(gen, s.batch * L * Hq * D);
    const Result<T> packed = RunKernel<T>(s, ks, q, k, v, dout, &pool);
    int documents = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t start = 0; start < L;) {
        int64_t end = start + 1;
        while (end < L && ks[b * L + end] == start) ++end;
        GqaAttentionShape one = s;
        one.batch = 1;
        one.seq_len = end - start;
        const int64_t n = end - start, r0 = b * L + start;
        auto rows = [&](const std::vector<T>& x, int64_t width) {
          return std::vector<T>(x.begin() + r0 * width, x.begin() + (r0 + n) * width);
        };
        const Result<T> alone = RunKernel<T>(one, {}, rows(q, Hq * D), rows(k, Hkv * D),
                                             rows(v, Hkv * D), rows(dout, Hq * D), nullptr);
        Result<T> part{rows(packed.out, Hq * D),
                       {},
                       rows(packed.dq, Hq * D),
                       rows(packed.dk, Hkv * D),
                       rows(packed.dv, Hkv * D)};
        for (int64_t h = 0; h < Hq; ++h) {
          const auto lse0 = packed.lse.begin() + (b * Hq + h) * L + start;
          part.lse.insert(part.lse.end(), lse0, lse0 + n);
        }
        ExpectSameRun(part, alone,
                      "window " + std::to_string(window) + " document [" + std::to_string(start) +
                          ", " + std::to_string(end) + ") of row " + std::to_string(b));
        ++documents;
        start = end;
      }
    }
    EXPECT_GT(documents, 4);
  }
}

TEST(GqaAttentionMaskTest, PackedRowEqualsDocumentsRunSeparatelyInDouble) {
  CheckPackedEqualsSeparate<double>(102);
}
TEST(GqaAttentionMaskTest, PackedRowEqualsDocumentsRunSeparatelyInFloat) {
  CheckPackedEqualsSeparate<float>(103);
}

// The f32 schedule (internal/attention_simd.h) reproduces the reference schedule bit for bit under
// masks too, on every SIMD target, with gradients accumulated onto non-zero values.
TEST(GqaAttentionMaskTest, FloatIsBitIdenticalToTheReferenceScheduleOnEveryTarget) {
  TestRng gen(104);
  ThreadPool pool(3);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const Case& c : kCases) {
      const GqaAttentionShape& s = c.shape;
      const std::vector<int32_t> ks = c.max_doc > 0
                                          ? RandomKeyStart(gen, s.batch, s.seq_len, c.max_doc)
                                          : std::vector<int32_t>{};
      const int64_t nq = GqaAttentionQElems(s), nkv = GqaAttentionKvElems(s);
      const int64_t nout = s.batch * s.seq_len * s.num_heads * s.head_dim;
      const int64_t nlse = s.batch * s.num_heads * s.seq_len;
      const std::vector<float> q = RandomVector<float>(gen, nq, -2, 2);
      const std::vector<float> k = RandomVector<float>(gen, nkv, -2, 2);
      const std::vector<float> v = RandomVector<float>(gen, nkv, -2, 2);
      const std::vector<float> dout = RandomVector<float>(gen, nout);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> ws(GqaAttentionWorkspaceElems(s, p == nullptr ? 1 : p->num_threads()));
        std::vector<float> out(nout), lse(nlse), ref_out(nout), ref_lse(nlse);
        ASSERT_OK(GqaAttentionForward<float>(s, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse),
                                             absl::MakeSpan(ws), p, ks));
        kernels_internal::GqaAttentionForwardReference<float>(s, q, k, v, absl::MakeSpan(ref_out),
                                                              absl::MakeSpan(ref_lse),
                                                              absl::MakeSpan(ws), p, ks);
        ExpectSameBits(out, ref_out, "out");
        ExpectSameBits(lse, ref_lse, "lse");
        const std::vector<float> dq0 = RandomVector<float>(gen, nq);
        const std::vector<float> dk0 = RandomVector<float>(gen, nkv);
        const std::vector<float> dv0 = RandomVector<float>(gen, nkv);
        std::vector<float> dq = dq0, dk = dk0, dv = dv0, rdq = dq0, rdk = dk0, rdv = dv0;
        ASSERT_OK(GqaAttentionBackward<float>(s, q, k, v, out, lse, dout, absl::MakeSpan(dq),
                                              absl::MakeSpan(dk), absl::MakeSpan(dv), p, ks));
        kernels_internal::GqaAttentionBackwardReference<float>(
            s, q, k, v, out, lse, dout, absl::MakeSpan(rdq), absl::MakeSpan(rdk),
            absl::MakeSpan(rdv), p, ks);
        ExpectSameBits(dq, rdq, "dq");
        ExpectSameBits(dk, rdk, "dk");
        ExpectSameBits(dv, rdv, "dv");
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Masks that are no mask: one document per row (key_start all 0), and windows >= T, give exactly
// the plain causal results; in both precisions.
template <typename T>
void CheckTrivialMasksArePlainCausal() {
  TestRng gen(105);
  ThreadPool pool(2);
  const GqaAttentionShape s{2, 70, 4, 2, 8, 16};
  const std::vector<T> q = RandomVector<T>(gen, GqaAttentionQElems(s), -2, 2);
  const std::vector<T> k = RandomVector<T>(gen, GqaAttentionKvElems(s), -2, 2);
  const std::vector<T> v = RandomVector<T>(gen, GqaAttentionKvElems(s), -2, 2);
  const std::vector<T> dout = RandomVector<T>(gen, s.batch * s.seq_len * 4 * 8);
  const Result<T> plain = RunKernel<T>(s, {}, q, k, v, dout, &pool);
  const std::vector<int32_t> zeros(s.batch * s.seq_len, 0);
  ExpectSameRun(RunKernel<T>(s, zeros, q, k, v, dout, &pool), plain, "one document");
  for (const int64_t window : {s.seq_len, s.seq_len + 1, int64_t{1000}}) {
    GqaAttentionShape w = s;
    w.sliding_window = window;
    ExpectSameRun(RunKernel<T>(w, {}, q, k, v, dout, &pool), plain,
                  "window " + std::to_string(window));
  }
}
TEST(GqaAttentionMaskTest, TrivialMasksArePlainCausalInDouble) {
  CheckTrivialMasksArePlainCausal<double>();
}
TEST(GqaAttentionMaskTest, TrivialMasksArePlainCausalInFloat) {
  CheckTrivialMasksArePlainCausal<float>();
}

// A query that sees only itself (window 1, or a document of one token): out = v exactly (its one
// weight is exp(0) / 1), no gradient for q or k (dS = P (dP - D) with D = dP), dv = dout.
template <typename T>
void CheckSeeOnlyItself() {
  TestRng gen(106);
  const GqaAttentionShape base{2, 11, 2, 1, 5, 4};
  const int64_t L = base.seq_len, D = base.head_dim;
  const std::vector<T> q = RandomVector<T>(gen, GqaAttentionQElems(base), -2, 2);
  const std::vector<T> k = RandomVector<T>(gen, GqaAttentionKvElems(base), -2, 2);
  const std::vector<T> v = RandomVector<T>(gen, GqaAttentionKvElems(base), -2, 2);
  const std::vector<T> dout = RandomVector<T>(gen, base.batch * L * 2 * D);
  std::vector<int32_t> each_alone(base.batch * L);
  for (int64_t i = 0; i < base.batch * L; ++i) each_alone[i] = static_cast<int32_t>(i % L);
  GqaAttentionShape window1 = base;
  window1.sliding_window = 1;
  for (const auto& [s, ks] :
       {std::pair{window1, std::vector<int32_t>{}}, std::pair{base, each_alone}}) {
    const Result<T> r = RunKernel<T>(s, ks, q, k, v, dout, nullptr);
    for (int64_t row = 0; row < base.batch * L; ++row) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          ASSERT_EQ(r.out[(row * 2 + h) * D + d], v[row * D + d]) << row << " " << h;
          ASSERT_EQ(r.dq[(row * 2 + h) * D + d], T{0}) << row << " " << h;
        }
      }
      for (int64_t d = 0; d < D; ++d) {
        ASSERT_EQ(r.dk[row * D + d], T{0}) << row;
        // Both query heads of the group add their dout (0 + a + b, as the kernel sums).
        ASSERT_EQ(r.dv[row * D + d], T{0} + dout[(row * 2) * D + d] + dout[(row * 2 + 1) * D + d])
            << row;
      }
    }
  }
}
TEST(GqaAttentionMaskTest, QueriesThatSeeOnlyThemselvesInDouble) { CheckSeeOnlyItself<double>(); }
TEST(GqaAttentionMaskTest, QueriesThatSeeOnlyThemselvesInFloat) { CheckSeeOnlyItself<float>(); }

TEST(GqaAttentionMaskTest, ResultsDoNotDependOnThreadCount) {
  TestRng gen(107);
  const GqaAttentionShape s{2, 90, 6, 2, 16, 8, 0, 0, 13};
  const std::vector<int32_t> ks = RandomKeyStart(gen, s.batch, s.seq_len, 30);
  const std::vector<float> q = RandomVector<float>(gen, GqaAttentionQElems(s), -1, 1);
  const std::vector<float> k = RandomVector<float>(gen, GqaAttentionKvElems(s), -1, 1);
  const std::vector<float> v = RandomVector<float>(gen, GqaAttentionKvElems(s), -1, 1);
  const std::vector<float> dout = RandomVector<float>(gen, q.size());
  ThreadPool pool(4);
  ExpectSameRun(RunKernel<float>(s, ks, q, k, v, dout, &pool),
                RunKernel<float>(s, ks, q, k, v, dout, nullptr), "4 threads vs none");
}

TEST(GqaAttentionMaskTest, RejectsBadKeyStartAndWindowNamingThePosition) {
  const GqaAttentionShape s{2, 4, 2, 1, 2, 8};
  std::vector<float> q(2 * 4 * 2 * 2), kv(2 * 4 * 2), out(q.size()), lse(2 * 2 * 4), ws(100);
  std::vector<float> dq(q.size()), dk(kv.size()), dv(kv.size());
  auto forward = [&](const GqaAttentionShape& shape, std::vector<int32_t> ks) {
    return GqaAttentionForward<float>(shape, q, kv, kv, absl::MakeSpan(out), absl::MakeSpan(lse),
                                      absl::MakeSpan(ws), nullptr, ks);
  };
  auto backward = [&](std::vector<int32_t> ks) {
    return GqaAttentionBackward<float>(s, q, kv, kv, out, lse, out, absl::MakeSpan(dq),
                                       absl::MakeSpan(dk), absl::MakeSpan(dv), nullptr, ks);
  };
  EXPECT_OK(forward(s, {0, 0, 2, 2, 0, 1, 1, 3}));
  EXPECT_THAT(forward(s, {0, 0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key_start has 3 elements, expected B*T = 8")));
  EXPECT_THAT(forward(s, {0, 0, 0, 0, 0, 2, 0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key_start[b=1, t=1] = 2 is outside [0, t]")));
  EXPECT_THAT(forward(s, {0, -1, 0, 0, 0, 0, 0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key_start[b=0, t=1] = -1 is outside [0, t]")));
  EXPECT_THAT(backward({0, 0, 0, 0, 0, 1, 2, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key_start[b=1, t=3] = 1 is less than key_start[b=1, t=2] = 2")));
  GqaAttentionShape negative = s;
  negative.sliding_window = -1;
  EXPECT_THAT(forward(negative, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("sliding_window -1 is negative")));
}

}  // namespace
}  // namespace ps
