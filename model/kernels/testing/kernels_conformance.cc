// The Kernels conformance suite (kernels_conformance.h): the fixture, then the tests of memory,
// conversion and the GEMM, and the argument errors of the operators. The other tests, by topic:
// kernels_conformance_operators.cc (GPT-2 and Llama operators against the CPU kernels),
// kernels_conformance_streams.cc (asynchrony, stream order, concurrency),
// kernels_conformance_vocab.cc (bf16-weight GEMMs and the vocabulary in row blocks),
// kernels_conformance_lora.cc (LoRA adapters, dropout), kernels_conformance_masks.cc (packed
// documents, sliding windows, positions), kernels_conformance_quant4.cc (4-bit weights).
#include "model/kernels/testing/kernels_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"
#include "model/kernels/gqa_attention.h"
#include "model/kernels/internal/bf16_gemm.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/lm_head_cross_entropy.h"
#include "model/kernels/rope.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/testing/kernels_conformance_util.h"

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

}  // namespace
}  // namespace ps::kernel_testing
