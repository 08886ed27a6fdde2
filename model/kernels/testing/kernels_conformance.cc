#include "model/kernels/testing/kernels_conformance.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/units.h"
#include "memory/convert.h"
#include "memory/device_memory.h"
#include "memory/dtype_math.h"
#include "memory/testing/stream_gate.h"
#include "model/kernels/embedding.h"
#include "model/kernels/encoder.h"
#include "model/kernels/gelu.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/layernorm.h"
#include "model/kernels/linear.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/matmul.h"
#include "model/kernels/residual.h"
#include "model/kernels/rmsnorm.h"
#include "model/kernels/rope.h"
#include "model/kernels/swiglu.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/vocab_blocks.h"

namespace ps::kernel_testing {

using ::testing::HasSubstr;

void KernelsConformanceTest::SetUp() {
  absl::StatusOr<KernelsUnderTest> env = GetParam().create();
  if (absl::IsUnavailable(env.status())) {
    GTEST_SKIP() << GetParam().name << " kernels unavailable here: " << env.status().message();
  }
  ASSERT_OK(env.status());
  env_ = *std::move(env);
  ASSERT_NE(env_.kernels, nullptr);
  ASSERT_OK_AND_ASSIGN(stream_, env_.backend->CreateStream());
  ASSERT_OK_AND_ASSIGN(side_, env_.backend->CreateStream());
}

void KernelsConformanceTest::TearDown() {
  if (stream_ != nullptr) {
    // An asynchronous error a test provoked is the test's business; drain the stream either way.
    (void)stream_->Synchronize();
  }
  if (side_ != nullptr) {
    EXPECT_OK(side_->Synchronize());
  }
  for (void* p : buffers_) EXPECT_OK(env_.backend->FreeDevice(p));
  buffers_.clear();
  side_.reset();
  stream_.reset();
}

void* KernelsConformanceTest::AllocBytes(int64_t bytes) {
  absl::StatusOr<void*> p = env_.backend->AllocateDevice(std::max<int64_t>(bytes, 1));
  EXPECT_OK(p.status());
  if (!p.ok()) return nullptr;
  buffers_.push_back(*p);
  return *p;
}

void KernelsConformanceTest::UploadBytes(void* device, const void* host, int64_t bytes,
                                         Stream* on) {
  Stream& s = on == nullptr ? *stream_ : *on;
  EXPECT_OK(s.MemcpyAsync(device, host, bytes, CopyKind::kHostToDevice));
  EXPECT_OK(s.Synchronize());  // `host` may go away after this
}

void KernelsConformanceTest::DownloadBytes(void* host, const void* device, int64_t bytes,
                                           Stream* on) {
  Stream& s = on == nullptr ? *stream_ : *on;
  EXPECT_OK(s.MemcpyAsync(host, device, bytes, CopyKind::kDeviceToHost));
  EXPECT_OK(s.Synchronize());
}

void KernelsConformanceTest::Check(const std::vector<float>& got, const std::vector<float>& direct,
                                   const std::vector<double>& reference, const std::string& what,
                                   double tol) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  if (bit_identical()) {
    ASSERT_EQ(got.size(), direct.size()) << what;
    int64_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &direct[i], 4);
      if (a != b && differing++ < 3) {
        ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " differs from the direct CPU "
                      << "kernel's " << direct[i] << " (must be bit-identical)";
      }
    }
    EXPECT_EQ(differing, 0) << what << ": elements differing from the direct CPU kernel";
  }
  double scale = 0;
  for (double r : reference) scale = std::max(scale, std::abs(r));
  ExpectAllNear(got, reference, tol * std::max(scale, 1e-30), tol, what + " vs the f64 reference");
}

namespace {

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KernelsConformanceTest);

std::vector<float> Rand(TestRng& rng, int64_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
absl::Span<const T> C(const std::vector<T>& v) {
  return absl::MakeConstSpan(v);
}
template <typename T>
absl::Span<T> M(std::vector<T>& v) {
  return absl::MakeSpan(v);
}

// GPT-2's multi-head attention on its fused qkv [B, T, 3C] with the CPU kernel: `s` has kv heads =
// heads, C = num_heads * head_dim and both row strides 3C; q = qkv, k = qkv + C, v = qkv + 2C,
// gradients likewise into dqkv.
template <typename T>
absl::Status FusedQkvAttentionForward(const GqaAttentionShape& s, absl::Span<const T> qkv,
                                      absl::Span<T> out, absl::Span<T> lse, absl::Span<T> ws) {
  const int64_t n = GqaAttentionQElems(s), c = s.num_heads * s.head_dim;
  return GqaAttentionForward<T>(s, qkv.subspan(0, n), qkv.subspan(c, n), qkv.subspan(2 * c, n), out,
                                lse, ws, nullptr);
}
template <typename T>
absl::Status FusedQkvAttentionBackward(const GqaAttentionShape& s, absl::Span<const T> qkv,
                                       absl::Span<const T> out, absl::Span<const T> lse,
                                       absl::Span<const T> dout, absl::Span<T> dqkv) {
  const int64_t n = GqaAttentionQElems(s), c = s.num_heads * s.head_dim;
  return GqaAttentionBackward<T>(s, qkv.subspan(0, n), qkv.subspan(c, n), qkv.subspan(2 * c, n),
                                 out, lse, dout, dqkv.subspan(0, n), dqkv.subspan(c, n),
                                 dqkv.subspan(2 * c, n), nullptr);
}

// --- Memory, conversion and GEMM
// ------------------------------------------------------------------

TEST_P(KernelsConformanceTest, ZeroSetsExactlyTheRange) {
  TestRng rng(1);
  std::vector<uint8_t> host(1024);
  for (auto& b : host) b = static_cast<uint8_t>(1 + rng() % 255);
  uint8_t* d = Upload(host);
  ASSERT_OK(kernels().Zero(stream(), d + 3, 1001));
  ASSERT_OK(kernels().Zero(stream(), d, 0));
  const std::vector<uint8_t> got = Download(d, 1024);
  for (int i = 0; i < 1024; ++i) {
    ASSERT_EQ(got[i], (i >= 3 && i < 1004) ? 0 : host[i]) << i;
  }
}

TEST_P(KernelsConformanceTest, ConvertMatchesTheHostBitForBit) {
  constexpr int64_t kN = 1031;
  TestRng rng(2);
  // Random f32 bit patterns (every exponent, NaNs with payloads, Infs, subnormals) plus ties.
  std::vector<float> f32(kN);
  for (int64_t i = 0; i < kN; ++i) {
    const uint32_t bits = i < 64 ? (static_cast<uint32_t>(rng()) & 0xFFFF0000u) | 0x8000u
                                 : static_cast<uint32_t>(rng());
    std::memcpy(&f32[i], &bits, 4);
  }
  std::vector<uint16_t> u16(kN);
  for (auto& x : u16) x = static_cast<uint16_t>(rng());
  const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType from : kTypes) {
    const void* src_host = from == DType::kF32 ? static_cast<const void*>(f32.data()) : u16.data();
    void* src = AllocBytes(kN * SizeOf(from));
    UploadBytes(src, src_host, kN * SizeOf(from));
    for (DType to : kTypes) {
      void* dst = AllocBytes(kN * SizeOf(to));
      ASSERT_OK(kernels().Convert(stream(), from, src, to, dst, kN));
      std::vector<uint8_t> got(kN * SizeOf(to)), want(kN * SizeOf(to));
      DownloadBytes(got.data(), dst, kN * SizeOf(to));
      ASSERT_OK(ps::Convert(from, src_host, to, want.data(), kN));
      EXPECT_EQ(got, want) << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
  EXPECT_OK(kernels().Convert(stream(), DType::kF32, nullptr, DType::kF16, nullptr, 0));
}

TEST_P(KernelsConformanceTest, GemmWithEveryOperandTypeAndTranspose) {
  TestRng rng(3);
  // A small odd shape with general alpha and beta, and shapes wider than one block of the bf16
  // GEMM's output grid (internal/bf16_gemm.h: blocks of >= 128) that overwrite and add to C.
  struct Case {
    int64_t m, n, k;
    float alpha, beta;
  };
  for (const Case& cs : {Case{13, 17, 21, 0.75f, 0.5f}, Case{150, 290, 37, 1.0f, 0.0f},
                         Case{131, 140, 19, 1.0f, 1.0f}}) {
    const int64_t m = cs.m, n = cs.n, k = cs.k;
    const float alpha = cs.alpha, beta = cs.beta;
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int t = 0; t < 4; ++t) {
        GemmShape s;
        s.trans_a = t & 1;
        s.trans_b = t & 2;
        s.m = m, s.n = n, s.k = k;
        s.ab_dtype = dtype;
        const int64_t a_rows = s.trans_a ? k : m, a_cols = s.trans_a ? m : k;
        const int64_t b_rows = s.trans_b ? n : k, b_cols = s.trans_b ? k : n;
        s.lda = a_cols + 3;  // padded rows
        s.ldb = b_cols + 1;
        s.ldc = n + 2;
        // Operands as f32 values exactly representable in `dtype`, stored in `dtype`.
        auto make = [&](int64_t rows, int64_t ld, std::vector<float>& values,
                        std::vector<uint8_t>& stored) {
          values = Rand(rng, rows * ld);
          stored.resize(values.size() * SizeOf(dtype));
          if (dtype == DType::kF32) {
            std::memcpy(stored.data(), values.data(), stored.size());
            return;
          }
          auto* bits = reinterpret_cast<uint16_t*>(stored.data());
          for (size_t i = 0; i < values.size(); ++i) {
            bits[i] =
                dtype == DType::kF16 ? FloatToHalfBits(values[i]) : FloatToBFloat16Bits(values[i]);
            values[i] =
                dtype == DType::kF16 ? HalfBitsToFloat(bits[i]) : BFloat16BitsToFloat(bits[i]);
          }
        };
        std::vector<float> a, b;
        std::vector<uint8_t> a_stored, b_stored;
        make(a_rows, s.lda, a, a_stored);
        make(b_rows, s.ldb, b, b_stored);
        std::vector<float> c0 = Rand(rng, m * s.ldc);
        void* da = Upload(a_stored);
        void* db = Upload(b_stored);
        float* dc = Upload(c0);
        const int64_t ws_bytes = kernels().GemmWorkspaceBytes(s);
        ASSERT_OK(
            kernels().Gemm(stream(), s, alpha, da, db, beta, dc, Workspace(ws_bytes), ws_bytes));
        const std::vector<float> got = Download(dc, m * s.ldc);

        std::vector<float> direct = c0;
        if (dtype == DType::kBF16) {
          // The CPU's bf16 GEMM (oneDNN on AVX512-BF16, else sgemm on the widened operands), which
          // writes or adds the product; other alpha, beta scale a product into C.
          kernels_internal::Bf16GemmArgs g;
          g.trans_a = s.trans_a, g.trans_b = s.trans_b;
          g.m = m, g.n = n, g.k = k;
          g.a = reinterpret_cast<const uint16_t*>(a_stored.data()), g.lda = s.lda;
          g.b = reinterpret_cast<const uint16_t*>(b_stored.data()), g.ldb = s.ldb;
          std::vector<float> product(static_cast<size_t>(m * n));
          const bool in_place = alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
          g.accumulate = in_place && beta == 1.0f;
          g.c = in_place ? direct.data() : product.data();
          g.ldc = in_place ? s.ldc : n;
          ASSERT_OK(kernels_internal::GemmBf16(g, nullptr));
          for (int64_t i = 0; !in_place && i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              float& out = direct[i * s.ldc + j];
              out = beta == 0.0f ? alpha * product[i * n + j]
                                 : alpha * product[i * n + j] + beta * out;
            }
          }
        } else {
          kernels_internal::Gemm(s.trans_a, s.trans_b, m, n, k, alpha, a.data(), s.lda, b.data(),
                                 s.ldb, beta, direct.data(), s.ldc, /*pool=*/nullptr);
        }
        std::vector<double> reference = D(c0);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double sum = 0;
            for (int64_t p = 0; p < k; ++p) {
              const double av = s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p];
              const double bv = s.trans_b ? b[j * s.ldb + p] : b[p * s.ldb + j];
              sum += av * bv;
            }
            reference[i * s.ldc + j] = alpha * sum + beta * static_cast<double>(c0[i * s.ldc + j]);
          }
        }
        // The padding between rows of C must be untouched.
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = n; j < s.ldc; ++j) ASSERT_EQ(got[i * s.ldc + j], c0[i * s.ldc + j]);
        }
        // Bit identity holds for f32 operands (the same sgemm call) and f16 ones (widened exactly,
        // then the very same sgemm on the same values); bf16 operands run the same bf16 GEMM, whose
        // blocks do not depend on the pool.
        Check(got, direct, reference,
              absl::StrCat("Gemm ", DTypeName(dtype), " ", m, "x", n, "x", k, " alpha=", alpha,
                           " beta=", beta, " trans_a=", s.trans_a, " trans_b=", s.trans_b));
      }
    }
  }
}

// --- GPT-2
// ----------------------------------------------------------------------------------------

TEST_P(KernelsConformanceTest, Encoder) {
  TestRng rng(4);
  const EncoderShape s{
      .batch = 3, .seq_len = 5, .channels = 13, .vocab_size = 11, .max_seq_len = 7};
  const int64_t bt = s.batch * s.seq_len, btc = bt * s.channels;
  std::vector<int32_t> tokens(bt);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 4);  // many repeats
  tokens.back() = 10;
  const auto wte = Rand(rng, s.vocab_size * s.channels),
             wpe = Rand(rng, s.max_seq_len * s.channels);
  const auto dout = Rand(rng, btc);
  const auto dwte0 = Rand(rng, s.vocab_size * s.channels),
             dwpe0 = Rand(rng, s.max_seq_len * s.channels);
  int32_t* d_tokens = Upload(tokens);
  float* d_out = Alloc<float>(btc);
  float *d_dwte = Upload(dwte0), *d_dwpe = Upload(dwpe0);
  ASSERT_OK(kernels().EncoderForward(stream(), s, d_tokens, Upload(wte), Upload(wpe), d_out));
  ASSERT_OK(kernels().EncoderBackward(stream(), s, d_tokens, Upload(dout), d_dwte, d_dwpe));

  std::vector<float> out(btc), dwte = dwte0, dwpe = dwpe0;
  ASSERT_OK(EncoderForward<float>(s, C(tokens), C(wte), C(wpe), M(out), nullptr));
  ASSERT_OK(EncoderBackward<float>(s, C(tokens), C(dout), M(dwte), M(dwpe), nullptr));
  std::vector<double> out_r(btc), dwte_r = D(dwte0), dwpe_r = D(dwpe0);
  ASSERT_OK(EncoderForward<double>(s, C(tokens), C(D(wte)), C(D(wpe)), M(out_r), nullptr));
  ASSERT_OK(EncoderBackward<double>(s, C(tokens), C(D(dout)), M(dwte_r), M(dwpe_r), nullptr));
  Check(Download(d_out, btc), out, out_r, "EncoderForward out");
  Check(Download(d_dwte, s.vocab_size * s.channels), dwte, dwte_r, "EncoderBackward dwte");
  Check(Download(d_dwpe, s.max_seq_len * s.channels), dwpe, dwpe_r, "EncoderBackward dwpe");
}

TEST_P(KernelsConformanceTest, LayerNorm) {
  TestRng rng(5);
  for (const LayerNormShape s :
       {LayerNormShape{.rows = 37, .channels = 19}, LayerNormShape{.rows = 5, .channels = 131}}) {
    const int64_t nc = s.rows * s.channels;
    const auto x = Rand(rng, nc, -3, 3), w = Rand(rng, s.channels), b = Rand(rng, s.channels);
    const auto dy = Rand(rng, nc), dx0 = Rand(rng, nc);
    const auto dw0 = Rand(rng, s.channels), db0 = Rand(rng, s.channels);
    float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(nc);
    float *d_mean = Alloc<float>(s.rows), *d_rstd = Alloc<float>(s.rows);
    float *d_dx = Upload(dx0), *d_dw = Upload(dw0), *d_db = Upload(db0);
    ASSERT_OK(kernels().LayerNormForward(stream(), s, d_x, d_w, Upload(b), d_y, d_mean, d_rstd));
    ASSERT_OK(kernels().LayerNormBackward(stream(), s, d_x, d_w, d_mean, d_rstd, Upload(dy), d_dx,
                                          d_dw, d_db));

    std::vector<float> y(nc), mean(s.rows), rstd(s.rows), dx = dx0, dw = dw0, db = db0;
    ASSERT_OK(LayerNormForward<float>(s, C(x), C(w), C(b), M(y), M(mean), M(rstd), nullptr));
    ASSERT_OK(LayerNormBackward<float>(s, C(x), C(w), C(mean), C(rstd), C(dy), M(dx), M(dw), M(db),
                                       nullptr));
    std::vector<double> y_r(nc), mean_r(s.rows), rstd_r(s.rows), dx_r = D(dx0), dw_r = D(dw0),
                                                                 db_r = D(db0);
    ASSERT_OK(LayerNormForward<double>(s, C(D(x)), C(D(w)), C(D(b)), M(y_r), M(mean_r), M(rstd_r),
                                       nullptr));
    ASSERT_OK(LayerNormBackward<double>(s, C(D(x)), C(D(w)), C(mean_r), C(rstd_r), C(D(dy)),
                                        M(dx_r), M(dw_r), M(db_r), nullptr));
    const std::string c = absl::StrCat(" C=", s.channels);
    Check(Download(d_y, nc), y, y_r, "LayerNormForward y" + c);
    Check(Download(d_mean, s.rows), mean, mean_r, "LayerNormForward mean" + c);
    Check(Download(d_rstd, s.rows), rstd, rstd_r, "LayerNormForward rstd" + c);
    Check(Download(d_dx, nc), dx, dx_r, "LayerNormBackward dx" + c);
    Check(Download(d_dw, s.channels), dw, dw_r, "LayerNormBackward dw" + c);
    Check(Download(d_db, s.channels), db, db_r, "LayerNormBackward db" + c);
  }
}

TEST_P(KernelsConformanceTest, Matmul) {
  TestRng rng(6);
  const MatmulShape s{.rows = 23, .in_features = 17, .out_features = 29};
  const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                io = s.in_features * s.out_features;
  const auto x = Rand(rng, ni), w = Rand(rng, io), b = Rand(rng, s.out_features);
  const auto dy = Rand(rng, no), dx0 = Rand(rng, ni), dw0 = Rand(rng, io),
             db0 = Rand(rng, s.out_features);
  float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(no);
  float *d_dx = Upload(dx0), *d_dw = Upload(dw0), *d_db = Upload(db0);
  const int64_t ws = kernels().MatmulWorkspaceBytes(s);
  void* d_ws = Workspace(ws);
  ASSERT_OK(kernels().MatmulForward(stream(), s, d_x, d_w, Upload(b), d_y, d_ws, ws));
  ASSERT_OK(
      kernels().MatmulBackward(stream(), s, d_x, d_w, Upload(dy), d_dx, d_dw, d_db, d_ws, ws));
  std::vector<float> y(no), dx = dx0, dw = dw0, db = db0;
  ASSERT_OK(MatmulForward<float>(s, C(x), C(w), C(b), M(y), nullptr));
  ASSERT_OK(MatmulBackward<float>(s, C(x), C(w), C(dy), M(dx), M(dw), M(db), nullptr));
  std::vector<double> y_r(no), dx_r = D(dx0), dw_r = D(dw0), db_r = D(db0);
  ASSERT_OK(MatmulForward<double>(s, C(D(x)), C(D(w)), C(D(b)), M(y_r), nullptr));
  ASSERT_OK(
      MatmulBackward<double>(s, C(D(x)), C(D(w)), C(D(dy)), M(dx_r), M(dw_r), M(db_r), nullptr));
  Check(Download(d_y, no), y, y_r, "MatmulForward y");
  Check(Download(d_dx, ni), dx, dx_r, "MatmulBackward dx");
  Check(Download(d_dw, io), dw, dw_r, "MatmulBackward dw");
  Check(Download(d_db, s.out_features), db, db_r, "MatmulBackward db");
}

TEST_P(KernelsConformanceTest, GeluAndResidual) {
  TestRng rng(7);
  constexpr int64_t kN = 1031;
  const auto x = Rand(rng, kN, -4, 4), x2 = Rand(rng, kN), dy = Rand(rng, kN), dx0 = Rand(rng, kN),
             db0 = Rand(rng, kN);
  float *d_x = Upload(x), *d_x2 = Upload(x2), *d_dy = Upload(dy);
  float *d_y = Alloc<float>(kN), *d_dx = Upload(dx0), *d_sum = Alloc<float>(kN);
  float *d_da = Upload(dx0), *d_db = Upload(db0);
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_x, d_y));
  ASSERT_OK(kernels().GeluBackward(stream(), kN, d_x, d_dy, d_dx));
  ASSERT_OK(kernels().ResidualForward(stream(), kN, d_x, d_x2, d_sum));
  ASSERT_OK(kernels().ResidualBackward(stream(), kN, d_dy, d_da, d_db));
  // In place: y may equal x, out may equal a.
  float* d_inplace = Upload(x);
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_inplace, d_inplace));

  std::vector<float> y(kN), dx = dx0, sum(kN), da = dx0, db = db0;
  ASSERT_OK(GeluForward<float>(C(x), M(y), nullptr));
  ASSERT_OK(GeluBackward<float>(C(x), C(dy), M(dx), nullptr));
  ASSERT_OK(ResidualForward<float>(C(x), C(x2), M(sum), nullptr));
  ASSERT_OK(ResidualBackward<float>(C(dy), M(da), M(db), nullptr));
  std::vector<double> y_r(kN), dx_r = D(dx0), sum_r(kN), da_r = D(dx0), db_r = D(db0);
  ASSERT_OK(GeluForward<double>(C(D(x)), M(y_r), nullptr));
  ASSERT_OK(GeluBackward<double>(C(D(x)), C(D(dy)), M(dx_r), nullptr));
  ASSERT_OK(ResidualForward<double>(C(D(x)), C(D(x2)), M(sum_r), nullptr));
  ASSERT_OK(ResidualBackward<double>(C(D(dy)), M(da_r), M(db_r), nullptr));
  Check(Download(d_y, kN), y, y_r, "GeluForward y");
  Check(Download(d_inplace, kN), y, y_r, "GeluForward in place");
  Check(Download(d_dx, kN), dx, dx_r, "GeluBackward dx");
  Check(Download(d_sum, kN), sum, sum_r, "ResidualForward out");
  Check(Download(d_da, kN), da, da_r, "ResidualBackward da");
  Check(Download(d_db, kN), db, db_r, "ResidualBackward db");
}

// GPT-2's multi-head attention: kv heads = heads, q, k and v read from the fused qkv [B, T, 3C]
// (C = 24) through row strides of 3C, the gradients written likewise into one dqkv.
TEST_P(KernelsConformanceTest, MultiHeadAttentionOnAFusedQkv) {
  TestRng rng(8);
  const GqaAttentionShape s{.batch = 2,
                            .seq_len = 19,
                            .num_heads = 3,
                            .num_kv_heads = 3,
                            .head_dim = 8,
                            .tile = 8,
                            .q_row_stride = 72,
                            .kv_row_stride = 72};
  const int64_t c = s.num_heads * s.head_dim;
  const int64_t btc = s.batch * s.seq_len * c, bht = s.batch * s.num_heads * s.seq_len;
  const auto qkv = Rand(rng, 3 * btc, -2, 2), dout = Rand(rng, btc), dqkv0 = Rand(rng, 3 * btc);
  float *d_qkv = Upload(qkv), *d_out = Alloc<float>(btc), *d_lse = Alloc<float>(bht);
  float* d_dqkv = Upload(dqkv0);
  const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
  const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
  ASSERT_OK(kernels().GqaAttentionForward(stream(), s, d_qkv, d_qkv + c, d_qkv + 2 * c, d_out,
                                          d_lse, Workspace(fws), fws));
  ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_qkv, d_qkv + c, d_qkv + 2 * c, d_out,
                                           d_lse, Upload(dout), d_dqkv, d_dqkv + c, d_dqkv + 2 * c,
                                           Workspace(bws), bws));
  std::vector<float> out(btc), lse(bht), dqkv = dqkv0;
  std::vector<float> ws(GqaAttentionWorkspaceElems(s, 1));
  ASSERT_OK(FusedQkvAttentionForward<float>(s, C(qkv), M(out), M(lse), M(ws)));
  ASSERT_OK(FusedQkvAttentionBackward<float>(s, C(qkv), C(out), C(lse), C(dout), M(dqkv)));
  std::vector<double> out_r(btc), lse_r(bht), dqkv_r = D(dqkv0), ws_r(ws.size());
  ASSERT_OK(FusedQkvAttentionForward<double>(s, C(D(qkv)), M(out_r), M(lse_r), M(ws_r)));
  ASSERT_OK(
      FusedQkvAttentionBackward<double>(s, C(D(qkv)), C(out_r), C(lse_r), C(D(dout)), M(dqkv_r)));
  Check(Download(d_out, btc), out, out_r, "GqaAttentionForward out (fused qkv)");
  Check(Download(d_lse, bht), lse, lse_r, "GqaAttentionForward lse (fused qkv)");
  Check(Download(d_dqkv, 3 * btc), dqkv, dqkv_r, "GqaAttentionBackward dqkv (fused qkv)");
}

TEST_P(KernelsConformanceTest, LmHeadCrossEntropy) {
  TestRng rng(9);
  const LmHeadCrossEntropyShape s{
      .rows = 21, .channels = 16, .vocab_size = 150, .row_tile = 8, .vocab_tile = 64};
  const int64_t nc = s.rows * s.channels, vc = s.vocab_size * s.channels;
  std::vector<int32_t> targets(s.rows);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % s.vocab_size);
  targets[2] = targets[11] = s.ignore_index;
  const auto h = Rand(rng, nc, -2, 2), wte = Rand(rng, vc), dh0 = Rand(rng, nc),
             dwte0 = Rand(rng, vc);
  constexpr double kLossGrad = 1.7;
  float *d_h = Upload(h), *d_wte = Upload(wte), *d_lse = Alloc<float>(s.rows);
  float *d_dh = Upload(dh0), *d_dwte = Upload(dwte0);
  int32_t* d_targets = Upload(targets);
  double* d_loss = Alloc<double>(1);
  const int64_t ws = kernels().LmHeadCrossEntropyWorkspaceBytes(s);
  void* d_ws = Workspace(ws);
  ASSERT_OK(kernels().LmHeadCrossEntropyForward(stream(), s, d_h, d_wte, d_targets, d_lse, d_loss,
                                                d_ws, ws));
  ASSERT_OK(kernels().LmHeadCrossEntropyBackward(stream(), s, d_h, d_wte, d_targets, d_lse,
                                                 kLossGrad, d_dh, d_dwte, d_ws, ws));
  std::vector<float> lse(s.rows), dh = dh0, dwte = dwte0;
  std::vector<float> ws_f(LmHeadCrossEntropyWorkspaceElems(s));
  ASSERT_OK_AND_ASSIGN(
      const double loss,
      LmHeadCrossEntropyForward<float>(s, C(h), C(wte), C(targets), M(lse), M(ws_f), nullptr));
  ASSERT_OK(LmHeadCrossEntropyBackward<float>(s, C(h), C(wte), C(targets), C(lse), kLossGrad, M(dh),
                                              M(dwte), M(ws_f), nullptr));
  std::vector<double> lse_r(s.rows), dh_r = D(dh0), dwte_r = D(dwte0), ws_r(ws_f.size());
  ASSERT_OK_AND_ASSIGN(const double loss_r,
                       LmHeadCrossEntropyForward<double>(s, C(D(h)), C(D(wte)), C(targets),
                                                         M(lse_r), M(ws_r), nullptr));
  ASSERT_OK(LmHeadCrossEntropyBackward<double>(s, C(D(h)), C(D(wte)), C(targets), C(lse_r),
                                               kLossGrad, M(dh_r), M(dwte_r), M(ws_r), nullptr));
  const double got_loss = Download(d_loss, 1)[0];
  if (bit_identical()) {
    EXPECT_EQ(got_loss, loss);
  }
  EXPECT_NEAR(got_loss, loss_r, 1e-5 * std::abs(loss_r));
  Check(Download(d_lse, s.rows), lse, lse_r, "LmHeadCrossEntropyForward lse");
  Check(Download(d_dh, nc), dh, dh_r, "LmHeadCrossEntropyBackward dh");
  Check(Download(d_dwte, vc), dwte, dwte_r, "LmHeadCrossEntropyBackward dwte");
}

// --- Llama / Qwen2 / Mistral
// ----------------------------------------------------------------------

TEST_P(KernelsConformanceTest, RmsNorm) {
  TestRng rng(10);
  const RmsNormShape s{.rows = 29, .channels = 45, .eps = 1e-6};
  const int64_t nc = s.rows * s.channels;
  const auto x = Rand(rng, nc, -2, 2), w = Rand(rng, s.channels), dy = Rand(rng, nc),
             dx0 = Rand(rng, nc), dw0 = Rand(rng, s.channels);
  float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(nc), *d_rstd = Alloc<float>(s.rows);
  float *d_dx = Upload(dx0), *d_dw = Upload(dw0);
  ASSERT_OK(kernels().RmsNormForward(stream(), s, d_x, d_w, d_y, d_rstd));
  ASSERT_OK(kernels().RmsNormBackward(stream(), s, d_x, d_w, d_rstd, Upload(dy), d_dx, d_dw));
  std::vector<float> y(nc), rstd(s.rows), dx = dx0, dw = dw0;
  ASSERT_OK(RmsNormForward<float>(s, C(x), C(w), M(y), M(rstd), nullptr));
  ASSERT_OK(RmsNormBackward<float>(s, C(x), C(w), C(rstd), C(dy), M(dx), M(dw), nullptr));
  std::vector<double> y_r(nc), rstd_r(s.rows), dx_r = D(dx0), dw_r = D(dw0);
  ASSERT_OK(RmsNormForward<double>(s, C(D(x)), C(D(w)), M(y_r), M(rstd_r), nullptr));
  ASSERT_OK(
      RmsNormBackward<double>(s, C(D(x)), C(D(w)), C(rstd_r), C(D(dy)), M(dx_r), M(dw_r), nullptr));
  Check(Download(d_y, nc), y, y_r, "RmsNormForward y");
  Check(Download(d_rstd, s.rows), rstd, rstd_r, "RmsNormForward rstd");
  Check(Download(d_dx, nc), dx, dx_r, "RmsNormBackward dx");
  Check(Download(d_dw, s.channels), dw, dw_r, "RmsNormBackward dw");
}

TEST_P(KernelsConformanceTest, Rope) {
  TestRng rng(11);
  const RopeShape s{
      .batch = 2, .seq_len = 9, .num_heads = 3, .head_dim = 10, .table_positions = 12};
  RopeConfig config;
  config.head_dim = 10;
  config.theta = 10000.0;
  const int64_t half = s.head_dim / 2, table = s.table_positions * half;
  const int64_t n = s.batch * s.seq_len * s.num_heads * s.head_dim;
  std::vector<float> cos(table), sin(table);
  ASSERT_OK(RopeTables<float>(config, s.table_positions, M(cos), M(sin)));
  std::vector<double> cos_r(table), sin_r(table);
  ASSERT_OK(RopeTables<double>(config, s.table_positions, M(cos_r), M(sin_r)));
  const auto x = Rand(rng, n), dx0 = Rand(rng, n);
  float *d_cos = Upload(cos), *d_sin = Upload(sin), *d_x = Upload(x), *d_dx = Upload(dx0);
  ASSERT_OK(kernels().RopeForward(stream(), s, d_cos, d_sin, d_x));
  ASSERT_OK(kernels().RopeBackward(stream(), s, d_cos, d_sin, d_dx));
  std::vector<float> y = x, dx = dx0;
  ASSERT_OK(RopeForward<float>(s, C(cos), C(sin), M(y), nullptr));
  ASSERT_OK(RopeBackward<float>(s, C(cos), C(sin), M(dx), nullptr));
  // The reference rotates in double with the f32 tables widened (what the f32 kernels use).
  std::vector<double> y_r = D(x), dx_r = D(dx0);
  ASSERT_OK(RopeForward<double>(s, C(D(cos)), C(D(sin)), M(y_r), nullptr));
  ASSERT_OK(RopeBackward<double>(s, C(D(cos)), C(D(sin)), M(dx_r), nullptr));
  Check(Download(d_x, n), y, y_r, "RopeForward x");
  Check(Download(d_dx, n), dx, dx_r, "RopeBackward dx");
}

TEST_P(KernelsConformanceTest, SwiGlu) {
  TestRng rng(12);
  constexpr int64_t kN = 1031;
  const auto g = Rand(rng, kN, -5, 5), u = Rand(rng, kN), dh = Rand(rng, kN), dg0 = Rand(rng, kN),
             du0 = Rand(rng, kN);
  float *d_g = Upload(g), *d_u = Upload(u), *d_h = Alloc<float>(kN);
  float *d_dg = Upload(dg0), *d_du = Upload(du0);
  ASSERT_OK(kernels().SwiGluForward(stream(), kN, d_g, d_u, d_h));
  ASSERT_OK(kernels().SwiGluBackward(stream(), kN, d_g, d_u, Upload(dh), d_dg, d_du));
  std::vector<float> h(kN), dg = dg0, du = du0;
  ASSERT_OK(SwiGluForward<float>(C(g), C(u), M(h), nullptr));
  ASSERT_OK(SwiGluBackward<float>(C(g), C(u), C(dh), M(dg), M(du), nullptr));
  std::vector<double> h_r(kN), dg_r = D(dg0), du_r = D(du0);
  ASSERT_OK(SwiGluForward<double>(C(D(g)), C(D(u)), M(h_r), nullptr));
  ASSERT_OK(SwiGluBackward<double>(C(D(g)), C(D(u)), C(D(dh)), M(dg_r), M(du_r), nullptr));
  Check(Download(d_h, kN), h, h_r, "SwiGluForward h");
  Check(Download(d_dg, kN), dg, dg_r, "SwiGluBackward dg");
  Check(Download(d_du, kN), du, du_r, "SwiGluBackward du");
}

TEST_P(KernelsConformanceTest, GqaAttention) {
  TestRng rng(13);
  const GqaAttentionShape s{
      .batch = 2, .seq_len = 17, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8, .tile = 8};
  const int64_t bt = s.batch * s.seq_len, nq = bt * s.num_heads * s.head_dim,
                nkv = bt * s.num_kv_heads * s.head_dim, bht = s.batch * s.num_heads * s.seq_len;
  const auto q = Rand(rng, nq, -2, 2), k = Rand(rng, nkv, -2, 2), v = Rand(rng, nkv),
             dout = Rand(rng, nq), dq0 = Rand(rng, nq), dk0 = Rand(rng, nkv), dv0 = Rand(rng, nkv);
  float *d_q = Upload(q), *d_k = Upload(k), *d_v = Upload(v), *d_out = Alloc<float>(nq),
        *d_lse = Alloc<float>(bht), *d_dq = Upload(dq0), *d_dk = Upload(dk0), *d_dv = Upload(dv0);
  const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
  const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
  ASSERT_OK(
      kernels().GqaAttentionForward(stream(), s, d_q, d_k, d_v, d_out, d_lse, Workspace(fws), fws));
  ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_q, d_k, d_v, d_out, d_lse, Upload(dout),
                                           d_dq, d_dk, d_dv, Workspace(bws), bws));
  std::vector<float> out(nq), lse(bht), dq = dq0, dk = dk0, dv = dv0;
  std::vector<float> ws(GqaAttentionWorkspaceElems(s, 1));
  ASSERT_OK(GqaAttentionForward<float>(s, C(q), C(k), C(v), M(out), M(lse), M(ws), nullptr));
  ASSERT_OK(GqaAttentionBackward<float>(s, C(q), C(k), C(v), C(out), C(lse), C(dout), M(dq), M(dk),
                                        M(dv), nullptr));
  std::vector<double> out_r(nq), lse_r(bht), dq_r = D(dq0), dk_r = D(dk0), dv_r = D(dv0),
                                             ws_r(ws.size());
  ASSERT_OK(GqaAttentionForward<double>(s, C(D(q)), C(D(k)), C(D(v)), M(out_r), M(lse_r), M(ws_r),
                                        nullptr));
  ASSERT_OK(GqaAttentionBackward<double>(s, C(D(q)), C(D(k)), C(D(v)), C(out_r), C(lse_r),
                                         C(D(dout)), M(dq_r), M(dk_r), M(dv_r), nullptr));
  Check(Download(d_out, nq), out, out_r, "GqaAttentionForward out");
  Check(Download(d_lse, bht), lse, lse_r, "GqaAttentionForward lse");
  Check(Download(d_dq, nq), dq, dq_r, "GqaAttentionBackward dq");
  Check(Download(d_dk, nkv), dk, dk_r, "GqaAttentionBackward dk");
  Check(Download(d_dv, nkv), dv, dv_r, "GqaAttentionBackward dv");
}

// q, k and v as strided views into one fused projection [B, T, (Hq + 2 Hkv) D] (the layout of
// GPT-2's qkv, here with grouped heads), the gradients likewise into one buffer.
TEST_P(KernelsConformanceTest, GqaAttentionOnAFusedProjection) {
  TestRng rng(20);
  GqaAttentionShape s{
      .batch = 2, .seq_len = 17, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8, .tile = 8};
  const int64_t qd = s.num_heads * s.head_dim, kvd = s.num_kv_heads * s.head_dim;
  const int64_t width = qd + 2 * kvd;
  s.q_row_stride = s.kv_row_stride = width;
  const int64_t bt = s.batch * s.seq_len, n = bt * width, nout = bt * qd,
                bht = s.batch * s.num_heads * s.seq_len;
  const int64_t nq = GqaAttentionQElems(s), nkv = GqaAttentionKvElems(s);
  const auto qkv = Rand(rng, n, -2, 2), dout = Rand(rng, nout), dqkv0 = Rand(rng, n);
  float *d_qkv = Upload(qkv), *d_out = Alloc<float>(nout), *d_lse = Alloc<float>(bht),
        *d_dqkv = Upload(dqkv0);
  const int64_t fws = kernels().GqaAttentionForwardWorkspaceBytes(s);
  const int64_t bws = kernels().GqaAttentionBackwardWorkspaceBytes(s);
  ASSERT_OK(kernels().GqaAttentionForward(stream(), s, d_qkv, d_qkv + qd, d_qkv + qd + kvd, d_out,
                                          d_lse, Workspace(fws), fws));
  ASSERT_OK(kernels().GqaAttentionBackward(stream(), s, d_qkv, d_qkv + qd, d_qkv + qd + kvd, d_out,
                                           d_lse, Upload(dout), d_dqkv, d_dqkv + qd,
                                           d_dqkv + qd + kvd, Workspace(bws), bws));
  auto run = [&](auto zero, const auto& in, const auto& d_out_host, auto& out, auto& lse,
                 auto& dqkv, auto& ws) {
    using T = decltype(zero);
    const absl::Span<const T> x(in);
    const absl::Span<T> dx = absl::MakeSpan(dqkv);
    ASSERT_OK(GqaAttentionForward<T>(s, x.subspan(0, nq), x.subspan(qd, nkv),
                                     x.subspan(qd + kvd, nkv), M(out), M(lse), M(ws), nullptr));
    ASSERT_OK(GqaAttentionBackward<T>(
        s, x.subspan(0, nq), x.subspan(qd, nkv), x.subspan(qd + kvd, nkv), C(out), C(lse),
        C(d_out_host), dx.subspan(0, nq), dx.subspan(qd, nkv), dx.subspan(qd + kvd, nkv), nullptr));
  };
  std::vector<float> out(nout), lse(bht), dqkv = dqkv0, ws(GqaAttentionWorkspaceElems(s, 1));
  run(0.0f, qkv, dout, out, lse, dqkv, ws);
  std::vector<double> out_r(nout), lse_r(bht), dqkv_r = D(dqkv0), ws_r(ws.size());
  run(0.0, D(qkv), D(dout), out_r, lse_r, dqkv_r, ws_r);
  Check(Download(d_out, nout), out, out_r, "GqaAttentionForward out (fused projection)");
  Check(Download(d_lse, bht), lse, lse_r, "GqaAttentionForward lse (fused projection)");
  Check(Download(d_dqkv, n), dqkv, dqkv_r, "GqaAttentionBackward dqkv (fused projection)");
}

TEST_P(KernelsConformanceTest, LinearWithAndWithoutBias) {
  TestRng rng(14);
  for (bool bias : {false, true}) {
    const LinearShape s{.rows = 19, .in_features = 23, .out_features = 14, .bias = bias};
    const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                  oi = s.out_features * s.in_features;
    const auto x = Rand(rng, ni), w = Rand(rng, oi), b = Rand(rng, s.out_features),
               dy = Rand(rng, no), dx0 = Rand(rng, ni), dw0 = Rand(rng, oi),
               db0 = Rand(rng, s.out_features);
    float *d_x = Upload(x), *d_w = Upload(w), *d_y = Alloc<float>(no), *d_dx = Upload(dx0),
          *d_dw = Upload(dw0), *d_db = Upload(db0);
    const int64_t ws = kernels().LinearWorkspaceBytes(s);
    void* d_ws = Workspace(ws);
    ASSERT_OK(
        kernels().LinearForward(stream(), s, d_x, d_w, bias ? Upload(b) : nullptr, d_y, d_ws, ws));
    ASSERT_OK(kernels().LinearBackward(stream(), s, d_x, d_w, Upload(dy), d_dx, d_dw,
                                       bias ? d_db : nullptr, d_ws, ws));
    std::vector<float> y(no), dx = dx0, dw = dw0, db = db0;
    const absl::Span<const float> b_span = bias ? C(b) : absl::Span<const float>();
    const absl::Span<float> db_span = bias ? M(db) : absl::Span<float>();
    ASSERT_OK(LinearForward<float>(s, C(x), C(w), b_span, M(y), nullptr));
    ASSERT_OK(LinearBackward<float>(s, C(x), C(w), C(dy), M(dx), M(dw), db_span, nullptr));
    const std::vector<double> b_d = D(b);
    std::vector<double> y_r(no), dx_r = D(dx0), dw_r = D(dw0), db_r = D(db0);
    ASSERT_OK(LinearForward<double>(s, C(D(x)), C(D(w)), bias ? C(b_d) : absl::Span<const double>(),
                                    M(y_r), nullptr));
    ASSERT_OK(LinearBackward<double>(s, C(D(x)), C(D(w)), C(D(dy)), M(dx_r), M(dw_r),
                                     bias ? M(db_r) : absl::Span<double>(), nullptr));
    const std::string tag = bias ? " (bias)" : " (no bias)";
    Check(Download(d_y, no), y, y_r, "LinearForward y" + tag);
    Check(Download(d_dx, ni), dx, dx_r, "LinearBackward dx" + tag);
    Check(Download(d_dw, oi), dw, dw_r, "LinearBackward dw" + tag);
    // Without a bias, db is neither read nor written.
    Check(Download(d_db, s.out_features), db, db_r, "LinearBackward db" + tag);
  }
}

TEST_P(KernelsConformanceTest, EmbeddingWithPadding) {
  TestRng rng(15);
  const EmbeddingShape s{.rows = 31, .channels = 11, .vocab_size = 9, .padding_idx = 3};
  std::vector<int32_t> tokens(s.rows);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % s.vocab_size);
  tokens[0] = tokens[5] = 3;
  const int64_t vc = s.vocab_size * s.channels, nc = s.rows * s.channels;
  const auto wte = Rand(rng, vc), dout = Rand(rng, nc), dwte0 = Rand(rng, vc);
  int32_t* d_tokens = Upload(tokens);
  float *d_out = Alloc<float>(nc), *d_dwte = Upload(dwte0);
  ASSERT_OK(kernels().EmbeddingForward(stream(), s, d_tokens, Upload(wte), d_out));
  ASSERT_OK(kernels().EmbeddingBackward(stream(), s, d_tokens, Upload(dout), d_dwte));
  std::vector<float> out(nc), dwte = dwte0;
  ASSERT_OK(EmbeddingForward<float>(s, C(tokens), C(wte), M(out), nullptr));
  ASSERT_OK(EmbeddingBackward<float>(s, C(tokens), C(dout), M(dwte), nullptr));
  std::vector<double> out_r(nc), dwte_r = D(dwte0);
  ASSERT_OK(EmbeddingForward<double>(s, C(tokens), C(D(wte)), M(out_r), nullptr));
  ASSERT_OK(EmbeddingBackward<double>(s, C(tokens), C(D(dout)), M(dwte_r), nullptr));
  Check(Download(d_out, nc), out, out_r, "EmbeddingForward out");
  Check(Download(d_dwte, vc), dwte, dwte_r, "EmbeddingBackward dwte");
}

// --- Argument errors ----------------------------------------------------------------------------

TEST_P(KernelsConformanceTest, ArgumentErrorsAreInvalidArgumentAtEnqueueAndRunNothing) {
  constexpr int64_t kN = 64;
  std::vector<float> pattern(kN, 7.0f);
  float* out = Upload(pattern);
  float* in = Upload(std::vector<float>(kN, 1.0f));
  Kernels& k = kernels();
  Stream& s = stream();
  const auto invalid = [](absl::string_view substring) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(std::string(substring)));
  };
  EXPECT_THAT(k.GeluForward(s, 0, in, out), invalid("GeluForward: num_elems must be positive"));
  EXPECT_THAT(k.GeluForward(s, kN, nullptr, out), invalid("GeluForward: x is null"));
  EXPECT_THAT(
      k.GeluForward(s, kN - 1,
                    reinterpret_cast<const float*>(reinterpret_cast<const char*>(in) + 2), out),
      invalid("x is not 4-byte aligned"));
  EXPECT_THAT(k.ResidualBackward(s, kN, in, out, out), invalid("da and db overlap"));
  EXPECT_THAT(k.SwiGluBackward(s, kN, in, in, in, out, out), invalid("dg and du overlap"));
  EXPECT_THAT(k.LayerNormForward(s, {.rows = 2, .channels = 0}, in, in, in, out, out, out),
              invalid("channels must be positive"));
  EXPECT_THAT(
      k.LayerNormForward(s, {.rows = 2, .channels = 4, .eps = 0}, in, in, in, out, out, out),
      invalid("eps"));
  // A fused qkv's row stride that does not hold a row of q (3 heads of 4).
  EXPECT_THAT(k.GqaAttentionForward(s,
                                    {.batch = 1,
                                     .seq_len = 2,
                                     .num_heads = 3,
                                     .num_kv_heads = 3,
                                     .head_dim = 4,
                                     .q_row_stride = 10,
                                     .kv_row_stride = 36},
                                    in, in, in, out, out, nullptr, 0),
              invalid("q_row_stride 10 is shorter than a row"));
  EXPECT_THAT(k.GqaAttentionForward(
                  s, {.batch = 1, .seq_len = 2, .num_heads = 4, .num_kv_heads = 3, .head_dim = 2},
                  in, in, in, out, out, nullptr, 0),
              invalid("num_key_value_heads"));
  EXPECT_THAT(
      k.RopeForward(s,
                    {.batch = 1, .seq_len = 2, .num_heads = 1, .head_dim = 3, .table_positions = 2},
                    in, in, out),
      invalid("odd"));
  EXPECT_THAT(
      k.RopeForward(s,
                    {.batch = 1, .seq_len = 5, .num_heads = 1, .head_dim = 2, .table_positions = 4},
                    in, in, out),
      invalid("exceeds the cos/sin tables"));
  EXPECT_THAT(k.EncoderForward(
                  s, {.batch = 1, .seq_len = 9, .channels = 2, .vocab_size = 4, .max_seq_len = 8},
                  reinterpret_cast<const int32_t*>(in), in, in, out),
              invalid("exceeds max_seq_len"));
  EXPECT_THAT(k.EmbeddingForward(s, {.rows = 2, .channels = 2, .vocab_size = 4, .padding_idx = 4},
                                 reinterpret_cast<const int32_t*>(in), in, out),
              invalid("padding_idx 4"));
  EXPECT_THAT(k.MatmulForward(s, {.rows = int64_t{1} << 31, .in_features = 1, .out_features = 1},
                              in, in, in, out, nullptr, 0),
              invalid("rows must be in [1, 2^31)"));
  GemmShape gemm{.m = 4, .n = 4, .k = 4, .lda = 3, .ldb = 4, .ldc = 4};
  EXPECT_THAT(k.Gemm(s, gemm, 1, in, in, 0, out, nullptr, 0), invalid("lda is 3"));
  EXPECT_THAT(k.Convert(s, DType::kF32, in, DType::kF16, reinterpret_cast<char*>(in) + 4, 8),
              invalid("overlap"));
  EXPECT_THAT(k.Zero(s, out, -1), invalid("negative"));
  EXPECT_THAT(k.MatmulForward(s, {.rows = 1 << 20, .in_features = 1 << 20, .out_features = 1 << 20},
                              in, in, in, out, nullptr, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A workspace one byte short (every implementation needs one for the LM head).
  const LmHeadCrossEntropyShape lm{.rows = 2, .channels = 2, .vocab_size = 4};
  const int64_t needed = k.LmHeadCrossEntropyWorkspaceBytes(lm);
  ASSERT_GT(needed, 0);
  void* ws = Workspace(needed);
  EXPECT_THAT(k.LmHeadCrossEntropyForward(s, lm, in, in, reinterpret_cast<const int32_t*>(in), out,
                                          reinterpret_cast<double*>(out), ws, needed - 1),
              invalid("workspace has"));
  EXPECT_THAT(k.LmHeadCrossEntropyForward(s, lm, in, in, reinterpret_cast<const int32_t*>(in), out,
                                          reinterpret_cast<double*>(out), nullptr, needed),
              invalid("workspace is null"));
  if (k.name() == "cpu") {
    // Host memory where device memory is meant, and a device buffer too small for the shape.
    std::vector<float> host(kN);
    EXPECT_THAT(k.GeluForward(s, kN, host.data(), out), invalid("GeluForward: x"));
    EXPECT_THAT(k.GeluForward(s, kN * 2, in, out), invalid("not inside device memory"));
  }
  // Nothing ran: the output is untouched.
  EXPECT_EQ(Download(out, kN), pattern);
}

// --- Asynchrony and stream order --------------------------------------------------------------

TEST_P(KernelsConformanceTest, KernelsRunAsynchronouslyAndInStreamOrder) {
  TestRng rng(16);
  constexpr int64_t kN = 777;
  const auto a = Rand(rng, kN), b = Rand(rng, kN);
  const std::vector<float> sentinel(kN, -123.0f);
  float *d_a = Upload(a), *d_b = Upload(b), *d_t1 = Alloc<float>(kN), *d_t2 = Alloc<float>(kN);
  float* d_out = Upload(sentinel);
  ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(stream()));
  // A chain: each kernel reads the previous one's output.
  ASSERT_OK(kernels().ResidualForward(stream(), kN, d_a, d_b, d_t1));
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_t1, d_t2));
  ASSERT_OK(kernels().ResidualForward(stream(), kN, d_t2, d_a, d_out));
  // Every enqueue has returned; none of the kernels has run (read through another stream).
  EXPECT_EQ(Download(d_out, kN, side_.get()), sentinel);
  gate->Open();
  std::vector<float> t1(kN), t2(kN), out(kN);
  ASSERT_OK(ResidualForward<float>(C(a), C(b), M(t1), nullptr));
  ASSERT_OK(GeluForward<float>(C(t1), M(t2), nullptr));
  ASSERT_OK(ResidualForward<float>(C(t2), C(a), M(out), nullptr));
  std::vector<double> t1_r(kN), t2_r(kN), out_r(kN);
  ASSERT_OK(ResidualForward<double>(C(D(a)), C(D(b)), M(t1_r), nullptr));
  ASSERT_OK(GeluForward<double>(C(t1_r), M(t2_r), nullptr));
  ASSERT_OK(ResidualForward<double>(C(t2_r), C(D(a)), M(out_r), nullptr));
  Check(Download(d_out, kN), out, out_r, "the chain after the gate opened");
}

// The hazard every ordering bug reduces to, made deterministic: a kernel reads its input when it
// runs, not when it was enqueued, so a host that reuses the buffer in between changes the result.
TEST_P(KernelsConformanceTest, ABufferReusedBeforeTheKernelRanIsWhatTheKernelReads) {
  TestRng rng(17);
  constexpr int64_t kN = 300;
  const auto x_old = Rand(rng, kN), x_new = Rand(rng, kN);
  float *d_x = Upload(x_old), *d_y = Alloc<float>(kN);
  ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(stream()));
  ASSERT_OK(kernels().GeluForward(stream(), kN, d_x, d_y));
  UploadBytes(d_x, x_new.data(), kN * sizeof(float), side_.get());  // the premature reuse
  gate->Open();
  std::vector<float> y_new(kN), y_old(kN);
  ASSERT_OK(GeluForward<float>(C(x_new), M(y_new), nullptr));
  ASSERT_OK(GeluForward<float>(C(x_old), M(y_old), nullptr));
  const std::vector<float> got = Download(d_y, kN);
  ExpectAllNear(got, y_new, 1e-5, 1e-5, "the kernel read the reused buffer");
  EXPECT_NE(got, y_old);
}

// ... and what prevents it: scratch freed in stream order is not handed out again while a kernel
// queued before the free still reads it.
TEST_P(KernelsConformanceTest, StreamOrderedScratchIsNotReusedUnderAQueuedKernel) {
  TestRng rng(18);
  constexpr int64_t kN = 300;
  constexpr int64_t kBytes = kN * sizeof(float);
  DeviceMemoryOptions options;
  options.chunk_block_bytes = kMiB;
  options.capacity_bytes = 16 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto memory, CreateAcceleratorMemory(&backend(), options));
  CachingAllocator& scratch = *memory->scratch();
  const auto x_old = Rand(rng, kN), x_new = Rand(rng, kN);
  ASSERT_OK_AND_ASSIGN(void* x, scratch.Allocate(kBytes));
  ASSERT_OK_AND_ASSIGN(void* y, scratch.Allocate(kBytes));
  UploadBytes(x, x_old.data(), kBytes);
  ASSERT_OK_AND_ASSIGN(auto gate, StreamGate::Close(stream()));
  ASSERT_OK(kernels().GeluForward(stream(), kN, static_cast<float*>(x), static_cast<float*>(y)));
  ASSERT_OK(scratch.DeallocateOnStream(x, kBytes, stream()));
  ASSERT_OK_AND_ASSIGN(void* x2, scratch.Allocate(kBytes));  // the host wants scratch again
  EXPECT_NE(x2, x);
  UploadBytes(x2, x_new.data(), kBytes, side_.get());
  gate->Open();
  std::vector<float> y_old(kN);
  ASSERT_OK(GeluForward<float>(C(x_old), M(y_old), nullptr));
  ExpectAllNear(Download(static_cast<float*>(y), kN), y_old, 1e-5, 1e-5, "kernel output");
  ASSERT_OK(stream().Synchronize());
  EXPECT_OK(scratch.Deallocate(x2, kBytes));
  EXPECT_OK(scratch.Deallocate(y, kBytes));
}

TEST_P(KernelsConformanceTest, DataErrorsFoundWhileRunningAreReportedOrLoud) {
  const EmbeddingShape s{.rows = 4, .channels = 3, .vocab_size = 5};
  const std::vector<int32_t> tokens = {0, 4, 5, 1};  // 5 is outside the vocabulary
  int32_t* d_tokens = Upload(tokens);
  float* d_wte = Upload(std::vector<float>(15, 0.5f));
  float* d_out = Alloc<float>(12);
  // Enqueuing succeeds: the tokens are device data.
  ASSERT_OK(kernels().EmbeddingForward(stream(), s, d_tokens, d_wte, d_out));
  if (kernels().name() == "cpu") {
    EXPECT_THAT(stream().Synchronize(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 5 at index 2")));
  } else {
    const std::vector<float> out = Download(d_out, 12);
    for (int c = 0; c < 3; ++c) {
      EXPECT_TRUE(std::isnan(out[2 * 3 + c])) << c;
      EXPECT_EQ(out[1 * 3 + c], 0.5f);
    }
  }
}

TEST_P(KernelsConformanceTest, ConcurrentStreamsGiveTheResultsOfOneStreamAlone) {
  TestRng rng(19);
  // Per stream: qkv = x W + b, attention, LayerNorm of the attention output, four times over.
  // GPT-2's attention on the fused qkv [B, T, 3C], C = 32: row strides of 3C.
  const GqaAttentionShape as{.batch = 2,
                             .seq_len = 16,
                             .num_heads = 4,
                             .num_kv_heads = 4,
                             .head_dim = 8,
                             .tile = 8,
                             .q_row_stride = 96,
                             .kv_row_stride = 96};
  const int64_t rows = as.batch * as.seq_len, c = as.num_heads * as.head_dim;
  const MatmulShape ms{.rows = rows, .in_features = 48, .out_features = 3 * c};
  const LayerNormShape ls{.rows = rows, .channels = c};
  const auto x = Rand(rng, rows * ms.in_features), w = Rand(rng, ms.in_features * 3 * c),
             b = Rand(rng, 3 * c);
  float *d_x = Upload(x), *d_w = Upload(w), *d_b = Upload(b);
  const std::vector<float> ln_w(c, 1.0f), ln_b(c, 0.0f);
  float *d_lw = Upload(ln_w), *d_lb = Upload(ln_b);
  struct Outputs {
    float *qkv, *att, *lse, *ln, *mean, *rstd;
    void *mws, *aws;
  };
  const int64_t mws = kernels().MatmulWorkspaceBytes(ms);
  const int64_t aws = kernels().GqaAttentionForwardWorkspaceBytes(as);
  const int64_t lse_elems = as.batch * as.num_heads * as.seq_len;
  auto make = [&] {
    return Outputs{Alloc<float>(rows * 3 * c),
                   Alloc<float>(rows * c),
                   Alloc<float>(lse_elems),
                   Alloc<float>(rows * c),
                   Alloc<float>(rows),
                   Alloc<float>(rows),
                   Workspace(mws),
                   Workspace(aws)};
  };
  const Outputs o1 = make(), o2 = make();
  auto enqueue = [&](Stream& s, const Outputs& o) {
    for (int round = 0; round < 4; ++round) {
      ASSERT_OK(kernels().MatmulForward(s, ms, d_x, d_w, d_b, o.qkv, o.mws, mws));
      ASSERT_OK(kernels().GqaAttentionForward(s, as, o.qkv, o.qkv + c, o.qkv + 2 * c, o.att, o.lse,
                                              o.aws, aws));
      ASSERT_OK(kernels().LayerNormForward(s, ls, o.att, d_lw, d_lb, o.ln, o.mean, o.rstd));
    }
  };
  std::atomic<bool> host_ok{true};
  std::thread host([&] {
    // The host uses the kernels' pool at the same time (as CPU Adam would).
    if (env_.pool == nullptr) return;
    std::vector<int64_t> sums(64, 0);
    for (int r = 0; r < 50; ++r) {
      env_.pool->ParallelFor(64, [&](int64_t t) { sums[t] += t; });
    }
    host_ok = sums[63] == 50 * 63;
  });
  enqueue(stream(), o1);
  enqueue(*side_, o2);
  host.join();
  EXPECT_TRUE(host_ok.load());
  ASSERT_OK(side_->Synchronize());
  const std::vector<float> ln1 = Download(o1.ln, rows * c), ln2 = Download(o2.ln, rows * c);
  EXPECT_EQ(ln1, ln2);
  // And what one stream computes is the direct chain's result.
  std::vector<float> qkv(rows * 3 * c), att(rows * c), lse(lse_elems),
      ws(GqaAttentionWorkspaceElems(as, 1)), ln(rows * c), mean(rows), rstd(rows);
  ASSERT_OK(MatmulForward<float>(ms, C(x), C(w), C(b), M(qkv), nullptr));
  ASSERT_OK(FusedQkvAttentionForward<float>(as, C(qkv), M(att), M(lse), M(ws)));
  ASSERT_OK(
      LayerNormForward<float>(ls, C(att), C(ln_w), C(ln_b), M(ln), M(mean), M(rstd), nullptr));
  if (bit_identical()) {
    EXPECT_EQ(ln1, ln);
  } else {
    ExpectAllNear(ln1, ln, 1e-3, 1e-3, "LayerNorm of attention of the GEMM");
  }
}

// --- The model's entry points: bf16-weight GEMMs and the vocabulary in row blocks --------------

// `v` rounded to bf16 bit patterns, and those widened back.
std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  ConvertF32ToBF16(v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}
std::vector<float> Widened(DType dtype, const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  if (dtype == DType::kF16) {
    ConvertF16ToF32(v.data(), out.data(), static_cast<int64_t>(v.size()));
  } else {
    ConvertBF16ToF32(v.data(), out.data(), static_cast<int64_t>(v.size()));
  }
  return out;
}
std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  return Widened(DType::kBF16, ToBf16(v));
}

TEST_P(KernelsConformanceTest, MatmulWithBf16WeightsReadInPlace) {
  TestRng rng(31);
  const MatmulShape s{.rows = 23, .in_features = 17, .out_features = 29};
  const int64_t ni = s.rows * s.in_features, no = s.rows * s.out_features,
                io = s.in_features * s.out_features;
  const auto x = Rand(rng, ni), b = Rand(rng, s.out_features), dy = Rand(rng, no);
  const std::vector<uint16_t> w = ToBf16(Rand(rng, io));
  const auto dx0 = Rand(rng, ni), dw0 = Rand(rng, io), db0 = Rand(rng, s.out_features);
  float *d_x = Upload(x), *d_y = Alloc<float>(no);
  uint16_t* d_w = Upload(w);
  float *d_dx = Upload(dx0), *d_dw = Upload(dw0), *d_db = Upload(db0);
  const int64_t fws = kernels().MatmulBf16ForwardWorkspaceBytes(s);
  const int64_t bws = kernels().MatmulBf16BackwardWorkspaceBytes(s);
  ASSERT_OK(
      kernels().MatmulForwardBf16(stream(), s, d_x, d_w, Upload(b), d_y, Workspace(fws), fws));
  ASSERT_OK(kernels().MatmulBackwardBf16(stream(), s, d_x, d_w, Upload(dy), d_dx, d_dw, d_db,
                                         Workspace(bws), bws));
  // Direct: the CPU kernels on the host.
  std::vector<float> y(no), dx = dx0, dw = dw0, db = db0;
  std::vector<float> ws(
      std::max(MatmulBf16ForwardWorkspaceElems(s), MatmulBf16BackwardWorkspaceElems(s)));
  ASSERT_OK(MatmulForwardBf16(s, C(x), C(w), C(b), M(y), M(ws), nullptr));
  ASSERT_OK(MatmulBackwardBf16(s, C(x), C(w), C(dy), M(dx), M(dw), M(db), M(ws), nullptr));
  // Reference: f64 on the operands rounded to bf16 (the products are exact), db on the unrounded
  // dy.
  const std::vector<double> xr = D(RoundedToBf16(x)), wr = D(Widened(DType::kBF16, w)),
                            dyr = D(RoundedToBf16(dy));
  std::vector<double> y_r(no), dx_r = D(dx0), dw_r = D(dw0), db_r = D(db0), unused(s.out_features);
  ASSERT_OK(MatmulForward<double>(s, C(xr), C(wr), C(D(b)), M(y_r), nullptr));
  ASSERT_OK(MatmulBackward<double>(s, C(xr), C(wr), C(dyr), M(dx_r), M(dw_r), M(unused), nullptr));
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t o = 0; o < s.out_features; ++o) db_r[o] += dy[r * s.out_features + o];
  }
  Check(Download(d_y, no), y, y_r, "MatmulForwardBf16 y");
  Check(Download(d_dx, ni), dx, dx_r, "MatmulBackwardBf16 dx");
  Check(Download(d_dw, io), dw, dw_r, "MatmulBackwardBf16 dw");
  Check(Download(d_db, s.out_features), db, db_r, "MatmulBackwardBf16 db");
}

// A block's values in `dtype` (f32 values, or 16-bit patterns) as the device holds them, and the
// f32 values they stand for.
struct BlockData {
  std::vector<float> f32;      // dtype == kF32
  std::vector<uint16_t> bits;  // 16-bit dtypes
  std::vector<float> values;   // what the block means, widened
};
BlockData MakeBlock(TestRng& rng, DType dtype, int64_t n) {
  BlockData b;
  const std::vector<float> v = Rand(rng, n);
  if (dtype == DType::kF32) {
    b.f32 = v;
    b.values = v;
    return b;
  }
  b.bits.resize(v.size());
  if (dtype == DType::kF16) {
    ConvertF32ToF16(v.data(), b.bits.data(), n);
  } else {
    ConvertF32ToBF16(v.data(), b.bits.data(), n);
  }
  b.values = Widened(dtype, b.bits);
  return b;
}

TEST_P(KernelsConformanceTest, EmbeddingBlockForwardForEveryBlockDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    TestRng rng(32);
    // A block that does not start at row 0 and has a tail of rows no token uses.
    const VocabBlockShape s{
        .rows = 31, .channels = 13, .vocab_size = 20, .row_begin = 5, .block_rows = 7};
    std::vector<int32_t> tokens(s.rows);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % s.vocab_size);
    tokens[0] = 5, tokens[1] = 11, tokens[2] = 4, tokens[3] = 12;
    const BlockData block = MakeBlock(rng, dtype, s.block_rows * s.channels);
    const auto out0 = Rand(rng, s.rows * s.channels);
    float* d_out = Upload(out0);
    const void* d_block = dtype == DType::kF32 ? static_cast<const void*>(Upload(block.f32))
                                               : static_cast<const void*>(Upload(block.bits));
    ASSERT_OK(kernels().EmbeddingBlockForward(stream(), s, Upload(tokens), dtype, d_block, d_out));
    std::vector<float> out = out0;
    if (dtype == DType::kF32) {
      ASSERT_OK(EmbeddingBlockForward<float>(s, C(tokens), C(block.f32), M(out), nullptr));
    } else {
      ASSERT_OK(
          EmbeddingBlockForward(s, C(tokens), Block16{block.bits.data(), dtype}, M(out), nullptr));
    }
    std::vector<double> out_r = D(out0);
    for (int64_t n = 0; n < s.rows; ++n) {
      const int64_t r = tokens[n] - s.row_begin;
      if (r < 0 || r >= s.block_rows) continue;
      for (int64_t c = 0; c < s.channels; ++c) {
        out_r[n * s.channels + c] = block.values[r * s.channels + c];
      }
    }
    Check(Download(d_out, s.rows * s.channels), out, out_r, "EmbeddingBlockForward out", 0);
  }
}

TEST_P(KernelsConformanceTest, TouchedRowsScatterAndCopies) {
  TestRng rng(33);
  const int64_t N = 37, Ch = 70, V = 23;  // Ch > 64: two channel slices, the second a tail
  std::vector<int32_t> tokens(N);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  tokens[4] = tokens[9] = tokens[30] = 22;  // a repeated token in the last row
  std::vector<int32_t> slot_of_token(V, -1);
  int32_t num_slots = 0;
  for (int32_t t : tokens) {
    if (slot_of_token[t] < 0) slot_of_token[t] = num_slots++;
  }
  const TouchedRowsShape s{.channels = Ch, .vocab_size = V, .num_slots = num_slots};
  const auto dout = Rand(rng, N * Ch), rows0 = Rand(rng, num_slots * Ch);
  int32_t* d_slots = Upload(slot_of_token);
  float* d_rows = Upload(rows0);
  ASSERT_OK(
      kernels().ScatterRowsAdd(stream(), s, N, Upload(tokens), d_slots, Upload(dout), d_rows));
  std::vector<float> rows = rows0;
  ASSERT_OK(ScatterRowsAdd<float>(Ch, C(tokens), C(slot_of_token), C(dout), M(rows), nullptr));
  std::vector<double> rows_r = D(rows0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t slot = slot_of_token[tokens[n]];
    for (int64_t c = 0; c < Ch; ++c) rows_r[slot * Ch + c] += dout[n * Ch + c];
  }
  Check(Download(d_rows, num_slots * Ch), rows, rows_r, "ScatterRowsAdd slot_rows");
  rows_r = D(rows);  // the copies are exact: from here on, the f32 values are the reference

  // A tile of rows [6, 6 + 17): its touched rows go into their slots.
  const int64_t row_begin = 6, tile_rows = 17;
  const auto tile = Rand(rng, tile_rows * Ch);
  ASSERT_OK(
      kernels().CopyRowsToSlots(stream(), s, row_begin, tile_rows, d_slots, Upload(tile), d_rows));
  for (int64_t r = 0; r < tile_rows; ++r) {
    const int32_t slot = slot_of_token[row_begin + r];
    if (slot < 0) continue;
    std::copy_n(tile.begin() + r * Ch, Ch, rows.begin() + slot * Ch);
    for (int64_t c = 0; c < Ch; ++c) rows_r[slot * Ch + c] = tile[r * Ch + c];
  }
  Check(Download(d_rows, num_slots * Ch), rows, rows_r, "CopyRowsToSlots slot_rows", 0);

  // And back out of the slots into rows [3, 3 + 20) of every dtype; untouched rows stay.
  const std::vector<float> final_rows = Download(d_rows, num_slots * Ch);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    const int64_t begin = 3, n_rows = 20, e = SizeOf(dtype);
    std::vector<uint8_t> dst0(n_rows * Ch * e);
    for (auto& byte : dst0) byte = static_cast<uint8_t>(rng());
    uint8_t* d_dst = Upload(dst0);
    ASSERT_OK(kernels().CopySlotsToRows(stream(), s, begin, n_rows, d_slots, d_rows, dtype, d_dst));
    std::vector<uint8_t> expected = dst0;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int32_t slot = slot_of_token[begin + r];
      if (slot < 0) continue;
      ASSERT_OK(Convert(DType::kF32, final_rows.data() + slot * Ch, dtype,
                        expected.data() + r * Ch * e, Ch));
    }
    EXPECT_EQ(Download(d_dst, n_rows * Ch * e), expected) << "CopySlotsToRows";
  }
}

TEST_P(KernelsConformanceTest, PositionEmbedding) {
  TestRng rng(34);
  const int64_t B = 3, T = 5, Ch = 67, max_T = 7;
  const auto wpe = Rand(rng, max_T * Ch), out0 = Rand(rng, B * T * Ch),
             dout = Rand(rng, B * T * Ch), dwpe0 = Rand(rng, max_T * Ch);
  float *d_out = Upload(out0), *d_dwpe = Upload(dwpe0);
  ASSERT_OK(kernels().PositionEmbeddingForward(stream(), B, T, Ch, max_T, Upload(wpe), d_out));
  ASSERT_OK(kernels().PositionEmbeddingBackward(stream(), B, T, Ch, max_T, Upload(dout), d_dwpe));
  std::vector<float> out = out0, dwpe = dwpe0;
  ASSERT_OK(PositionEmbeddingForward<float>(B, T, Ch, C(wpe), M(out), nullptr));
  ASSERT_OK(PositionEmbeddingBackward<float>(B, T, Ch, C(dout), M(dwpe), nullptr));
  std::vector<double> out_r = D(out0), dwpe_r = D(dwpe0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < Ch; ++c) {
        out_r[(b * T + t) * Ch + c] += wpe[t * Ch + c];
        dwpe_r[t * Ch + c] += dout[(b * T + t) * Ch + c];
      }
    }
  }
  Check(Download(d_out, B * T * Ch), out, out_r, "PositionEmbeddingForward out");
  Check(Download(d_dwpe, max_T * Ch), dwpe, dwpe_r, "PositionEmbeddingBackward dwpe");
}

// The LM head over three blocks (the last one short, ending in a partial vocabulary tile) of every
// dtype; the backward called once per vocabulary tile with a one-tile dblock, as the model does.
// Direct: the CPU block kernels called once per *block* — so the per-tile calls are checked to
// give the per-block bits. Reference: the f64 whole-matrix kernel on the block's values.
TEST_P(KernelsConformanceTest, LmHeadOverVocabularyBlocksAndTiles) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    TestRng rng(35);
    const int64_t N = 21, Ch = 16, V = 150, kTile = 32;
    const std::vector<std::pair<int64_t, int64_t>> blocks = {{0, 64}, {64, 64}, {128, 22}};
    VocabBlockShape s{
        .rows = N, .channels = Ch, .vocab_size = V, .row_tile = 8, .vocab_tile = kTile};
    std::vector<int32_t> targets(N);
    for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
    targets[2] = targets[11] = s.ignore_index;
    targets[5] = 149;
    const auto h = Rand(rng, N * Ch, -2, 2), dh0 = Rand(rng, N * Ch);
    const BlockData wte = MakeBlock(rng, dtype, V * Ch);
    constexpr double kLossGrad = 1.7;
    const int64_t e = SizeOf(dtype);
    const char* d_wte = dtype == DType::kF32 ? reinterpret_cast<const char*>(Upload(wte.f32))
                                             : reinterpret_cast<const char*>(Upload(wte.bits));
    float *d_h = Upload(h), *d_dh = Upload(dh0);
    int32_t* d_targets = Upload(targets);
    float *d_state = Alloc<float>(LmHeadStateElems(s)), *d_lse = Alloc<float>(N);
    double* d_loss = Alloc<double>(1);
    float* d_dblock = Alloc<float>(kTile * Ch);
    std::vector<float> dwte(V * Ch);
    ASSERT_OK(kernels().LmHeadStateInit(stream(), s, d_state));
    for (const auto& [begin, rows] : blocks) {
      VocabBlockShape b = s;
      b.row_begin = begin, b.block_rows = rows;
      const int64_t ws = kernels().LmHeadBlockForwardWorkspaceBytes(b, dtype);
      ASSERT_OK(kernels().LmHeadBlockForward(stream(), b, d_h, dtype, d_wte + begin * Ch * e,
                                             d_targets, d_state, Workspace(ws), ws));
    }
    ASSERT_OK(kernels().LmHeadFinish(stream(), s, d_targets, d_state, d_lse, d_loss));
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      VocabBlockShape t = s;
      t.row_begin = v0, t.block_rows = std::min(kTile, V - v0);
      const int64_t ws = kernels().LmHeadBlockBackwardWorkspaceBytes(t, dtype);
      ASSERT_OK(kernels().LmHeadBlockBackward(stream(), t, d_h, dtype, d_wte + v0 * Ch * e,
                                              d_targets, d_lse, kLossGrad, d_dh, d_dblock,
                                              Workspace(ws), ws));
      const std::vector<float> tile = Download(d_dblock, t.block_rows * Ch);
      std::copy(tile.begin(), tile.end(), dwte.begin() + v0 * Ch);
    }
    // Direct, per block.
    std::vector<float> state(LmHeadStateElems(s)), lse(N), dh = dh0, dwte_direct(V * Ch);
    LmHeadStateInit<float>(M(state));
    for (const auto& [begin, rows] : blocks) {
      VocabBlockShape b = s;
      b.row_begin = begin, b.block_rows = rows;
      std::vector<float> ws(LmHeadBlockForwardWorkspaceElems(b, dtype != DType::kF32));
      if (dtype == DType::kF32) {
        ASSERT_OK(LmHeadBlockForward<float>(b, C(h), C(wte.f32).subspan(begin * Ch, rows * Ch),
                                            C(targets), M(state), M(ws), nullptr));
      } else {
        ASSERT_OK(LmHeadBlockForward(b, C(h), Block16{wte.bits.data() + begin * Ch, dtype},
                                     C(targets), M(state), M(ws), nullptr));
      }
    }
    ASSERT_OK_AND_ASSIGN(const double loss, LmHeadFinish<float>(s, C(targets), C(state), M(lse)));
    for (const auto& [begin, rows] : blocks) {
      VocabBlockShape b = s;
      b.row_begin = begin, b.block_rows = rows;
      std::vector<float> ws(LmHeadBlockBackwardWorkspaceElems(b, dtype != DType::kF32));
      auto on_tile = [&](int64_t v0, int64_t n, const float* g) {
        std::copy_n(g, n * Ch, dwte_direct.begin() + v0 * Ch);
        return absl::OkStatus();
      };
      if (dtype == DType::kF32) {
        ASSERT_OK(LmHeadBlockBackward<float>(b, C(h), C(wte.f32).subspan(begin * Ch, rows * Ch),
                                             C(targets), C(lse), kLossGrad, M(dh), M(ws), on_tile,
                                             nullptr));
      } else {
        ASSERT_OK(LmHeadBlockBackward(b, C(h), Block16{wte.bits.data() + begin * Ch, dtype},
                                      C(targets), C(lse), kLossGrad, M(dh), M(ws), on_tile,
                                      nullptr));
      }
    }
    // Reference: f64 over the whole matrix; bf16 blocks multiply bf16(h).
    const LmHeadCrossEntropyShape whole{
        .rows = N, .channels = Ch, .vocab_size = V, .row_tile = 8, .vocab_tile = kTile};
    const std::vector<double> h_r = D(dtype == DType::kBF16 ? RoundedToBf16(h) : h);
    std::vector<double> lse_r(N), dh_r = D(dh0), dwte_r(V * Ch, 0.0),
                                  ws_r(LmHeadCrossEntropyWorkspaceElems(whole));
    ASSERT_OK_AND_ASSIGN(const double loss_r,
                         LmHeadCrossEntropyForward<double>(whole, C(h_r), C(D(wte.values)),
                                                           C(targets), M(lse_r), M(ws_r), nullptr));
    ASSERT_OK(LmHeadCrossEntropyBackward<double>(whole, C(h_r), C(D(wte.values)), C(targets),
                                                 C(lse_r), kLossGrad, M(dh_r), M(dwte_r), M(ws_r),
                                                 nullptr));
    // bf16 rounds the logit gradient tile before the gradient GEMMs.
    const double tol = dtype == DType::kBF16 ? 2e-2 : 2e-4;
    const double got_loss = Download(d_loss, 1)[0];
    if (bit_identical()) {
      EXPECT_EQ(got_loss, loss);
    }
    EXPECT_NEAR(got_loss, loss_r, 1e-5 * std::abs(loss_r));
    Check(Download(d_lse, N), lse, lse_r, "LmHeadFinish lse", tol);
    Check(Download(d_dh, N * Ch), dh, dh_r, "LmHeadBlockBackward dh", tol);
    Check(dwte, dwte_direct, dwte_r, "LmHeadBlockBackward dblock", tol);
  }
}

TEST_P(KernelsConformanceTest, ModelEntryPointArgumentErrorsAreFoundAtEnqueue) {
  constexpr int64_t kN = 256;
  std::vector<float> pattern(kN, 7.0f);
  float* out = Upload(pattern);
  float* in = Upload(std::vector<float>(kN, 1.0f));
  const auto* tokens = reinterpret_cast<const int32_t*>(in);
  Kernels& k = kernels();
  Stream& s = stream();
  const auto invalid = [](absl::string_view substring) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(std::string(substring)));
  };
  const VocabBlockShape block{.rows = 2,
                              .channels = 2,
                              .vocab_size = 40,
                              .row_begin = 8,
                              .block_rows = 4,
                              .row_tile = 2,
                              .vocab_tile = 16};
  EXPECT_THAT(k.LmHeadBlockForward(s, block, in, DType::kF32, in, tokens, out, out, kN),
              invalid("LmHeadBlockForward: the block starts at row 8, not a multiple of "
                      "vocab_tile 16"));
  VocabBlockShape outside = block;
  outside.row_begin = 38;
  EXPECT_THAT(k.EmbeddingBlockForward(s, outside, tokens, DType::kF32, in, out),
              invalid("EmbeddingBlockForward: block rows [38, 42) are not inside"));
  EXPECT_THAT(k.EmbeddingBlockForward(s, block, tokens, static_cast<DType>(7), in, out),
              invalid("block_dtype"));
  const TouchedRowsShape touched{.channels = 2, .vocab_size = 40, .num_slots = 3};
  EXPECT_THAT(k.CopyRowsToSlots(s, touched, 39, 2, tokens, in, out),
              invalid("CopyRowsToSlots: rows [39, 41) are not inside"));
  EXPECT_THAT(k.CopySlotsToRows(s, touched, 0, 2, tokens, in, DType::kBF16, in + 2),
              invalid("overlap"));
  EXPECT_THAT(k.ScatterRowsAdd(s, touched, 0, tokens, tokens, in, out),
              invalid("num_tokens must be positive"));
  EXPECT_THAT(k.PositionEmbeddingForward(s, 1, 9, 2, 8, in, out), invalid("exceeds max_seq_len"));
  EXPECT_THAT(
      k.LmHeadBlockBackward(s, {.rows = 2, .channels = 2, .vocab_size = 4, .block_rows = 4}, in,
                            DType::kF32, in, tokens, in, 1.0, out, out + 2, out, kN * 4),
      invalid("dh and dblock overlap"));
  const MatmulShape mm{.rows = 4, .in_features = 4, .out_features = 4};
  const int64_t needed = k.MatmulBf16ForwardWorkspaceBytes(mm);
  if (needed > 0) {
    EXPECT_THAT(k.MatmulForwardBf16(s, mm, in, reinterpret_cast<const uint16_t*>(in), in, out,
                                    Workspace(needed), needed - 1),
                invalid("workspace has"));
  }
  EXPECT_THAT(k.MatmulForwardBf16(s, mm, in, nullptr, in, out, Workspace(needed), needed),
              invalid("MatmulForwardBf16: w is null"));
  EXPECT_EQ(Download(out, kN), pattern);
}

}  // namespace
}  // namespace ps::kernel_testing
