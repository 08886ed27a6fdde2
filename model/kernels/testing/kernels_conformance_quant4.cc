// The Kernels conformance suite (kernels_conformance.h): 4-bit frozen weights (QLoRA, issue #37) —
// Dequantize4Bit, and the dequantizing nn.Linear's forward and input gradient, on weights quantized
// on the host by model/kernels/nf4.h (NF4 and FP4, plain and nested absmax) and uploaded.
//
// What each implementation must give:
//  - Dequantize4Bit: bit for bit the CPU codec's values (f32, and bf16 / f16 rounded from them), on
//    every implementation (CUDA included: one f32 product per value, nf4_math.h's arithmetic).
//  - Quant4LinearForward / BackwardInput: against the direct f32 CPU function (nf4_linear.h) bit
//  for
//    bit where the implementation is bit-identical (the CPU), and against the f64 product of the
//    dequantized weight within Check's tolerance everywhere: 2e-4 times the largest magnitude of
//    the reference. That bound is what the CUDA twin is held to; its dequantized tiles are the
//    CPU's bits, so it differs only in how cuBLAS orders the f32 sums (K <= 520 terms of |x w| <= 3
//    here, i.e. errors of a few 1e-6 relative to the largest output).
//  - The same result as LinearForward / LinearBackward's dx on the weight dequantized by
//    Dequantize4Bit (bit for bit on the CPU, within the tolerance on CUDA), and the same bits
//    with a larger workspace than the query asks (on the CPU: more tiles in flight).
//  - Computing in bf16 / f16 (bnb_4bit_compute_dtype; nf4_linear.h): bit for bit the direct CPU
//    function with the same compute dtype where bit-identical, and on every implementation within
//    one 16-bit ulp (relative 2^-7 for bf16, 2^-10 for f16) plus the f32 cases' 2e-4 x the largest
//    |reference| of the f64 product of the 16-bit-rounded operands (x, bias, dequantized W; dy):
//    the result's one rounding is at most half an ulp, and the f32 sums (cuBLAS's order or
//    OpenBLAS's) add errors far below 2e-4 of the largest output. The backward adds its rounded
//    product to dx: dx0 + (the result on dx0 = 0) bit for bit on every implementation, and y and
//    that product hold 16-bit values.
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "model/kernels/linear.h"
#include "model/kernels/nf4.h"
#include "model/kernels/nf4_linear.h"
#include "model/kernels/testing/kernel_test_util.h"
#include "model/kernels/testing/kernels_conformance.h"
#include "model/kernels/testing/kernels_conformance_util.h"

namespace ps::kernel_testing {
namespace {

using ::testing::HasSubstr;

// A weight quantized on the host, its tensor in host memory and, once uploaded, in device memory.
struct HostQuant4 {
  Quant4Type type = Quant4Type::kNf4;
  int64_t num_elems = 0;
  bool nested = false;
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
  std::vector<uint8_t> nested_codes;
  std::vector<float> nested_absmax;
  float offset = 0.0f;

  Quant4Tensor Host() const {
    Quant4Tensor t{.type = type, .num_elems = num_elems, .codes = codes.data()};
    if (nested) {
      t.nested_codes = nested_codes.data();
      t.nested_absmax = nested_absmax.data();
      t.nested_offset = offset;
    } else {
      t.absmax = absmax.data();
    }
    return t;
  }
};

// Random values with a magnitude that varies from row to row of `row` values (so the block scales
// differ, and with them the nested codes), and an all-zero block when `zero_block` and the tensor
// has a second one (NF4's zero block dequantizes to -0.0).
HostQuant4 Quantize(TestRng& rng, Quant4Type type, int64_t n, int64_t row, bool nested,
                    bool zero_block) {
  std::vector<float> w = Rand(rng, n);
  for (int64_t i = 0; i < n; ++i) w[i] *= 0.05f + 2.95f * static_cast<float>((i / row) % 7) / 6;
  if (zero_block && n >= 2 * kQuant4BlockElems) {
    std::fill(w.begin() + kQuant4BlockElems, w.begin() + 2 * kQuant4BlockElems, 0.0f);
  }
  HostQuant4 q;
  q.type = type;
  q.num_elems = n;
  q.nested = nested;
  q.codes.resize(Quant4CodeBytes(n));
  q.absmax.resize(Quant4NumBlocks(n));
  EXPECT_OK(Quantize4Bit(type, DType::kF32, w.data(), n, M(q.codes), M(q.absmax), nullptr));
  if (nested) {
    q.nested_codes.resize(q.absmax.size());
    q.nested_absmax.resize(Quant4NestedNumBlocks(static_cast<int64_t>(q.absmax.size())));
    EXPECT_OK(QuantizeAbsmaxNested(C(q.absmax), M(q.nested_codes), M(q.nested_absmax), &q.offset));
  }
  return q;
}

// The whole weight dequantized on the host (f32).
std::vector<float> DequantizeOnHost(const HostQuant4& q) {
  std::vector<float> w(q.num_elems);
  EXPECT_OK(Dequantize4Bit(q.Host(), 0, q.num_elems, DType::kF32, w.data()));
  return w;
}

std::string Describe(const HostQuant4& q) {
  return absl::StrCat(Quant4TypeName(q.type), q.nested ? " nested" : " plain");
}

void ExpectSameBits(const void* got, const void* want, int64_t bytes, const std::string& what) {
  const auto* a = static_cast<const uint8_t*>(got);
  const auto* b = static_cast<const uint8_t*>(want);
  int64_t first = -1, differing = 0;
  for (int64_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i]) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " bytes differ, the first at byte "
                          << first << " (must be bit-identical)";
}

// Odd element counts (a final low nibble of padding), rows that start inside a byte and inside a
// block of 64, one partial block, several nested blocks of 256 and their short tail.
TEST_P(KernelsConformanceTest, Dequantize4BitIsTheCodecBitForBit) {
  TestRng rng(370);
  struct Case {
    Quant4Type type;
    int64_t n;
    bool nested;
  };
  for (const Case& c : {Case{Quant4Type::kNf4, 1001, false}, Case{Quant4Type::kFp4, 1001, true},
                        Case{Quant4Type::kNf4, 39000, true}, Case{Quant4Type::kFp4, 64, false},
                        Case{Quant4Type::kNf4, 17 * 256 * 64 + 33, true}}) {
    const HostQuant4 q = Quantize(rng, c.type, c.n, 77, c.nested, /*zero_block=*/true);
    const Quant4Tensor d = UploadQuant4(q.Host());
    struct Range {
      int64_t begin, count;
    };
    const Range ranges[] = {{0, c.n}, {1, c.n - 2}, {c.n / 3 | 1, c.n / 2}, {c.n - 1, 1}};
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const Range& r : ranges) {
        const std::string what = absl::StrCat("Dequantize4Bit ", Describe(q), " n=", c.n, " [",
                                              r.begin, ", +", r.count, ") to ", DTypeName(dtype));
        const int64_t bytes = r.count * SizeOf(dtype);
        std::vector<uint8_t> want(bytes);
        ASSERT_OK(Dequantize4Bit(q.Host(), r.begin, r.count, dtype, want.data()));
        uint8_t* dst = Alloc<uint8_t>(bytes);
        ASSERT_OK(kernels().Dequantize4Bit(stream(), d, r.begin, r.count, dtype, dst));
        const std::vector<uint8_t> got = Download(dst, bytes);
        ExpectSameBits(got.data(), want.data(), bytes, what);
      }
    }
  }
}

// NF4 and FP4, plain and nested; in not a multiple of 64 (rows of W start mid-block and mid-byte),
// odd out*in, N = 1, out = 1, more than one 256-wide column block of the CPU's GEMM grid in both
// directions (out = 300 forward, in = 520 backward), with and without bias. y is pre-filled (the
// forward overwrites it), dx too (the backward adds to it).
TEST_P(KernelsConformanceTest, Quant4LinearForwardAndBackwardInput) {
  TestRng rng(371);
  struct Case {
    LinearShape shape;
    Quant4Type type;
    bool nested;
  };
  const Case cases[] = {
      {{.rows = 1, .in_features = 77, .out_features = 13, .bias = true}, Quant4Type::kNf4, false},
      {{.rows = 37, .in_features = 130, .out_features = 300}, Quant4Type::kFp4, true},
      {{.rows = 5, .in_features = 520, .out_features = 70, .bias = true}, Quant4Type::kNf4, true},
      {{.rows = 3, .in_features = 64, .out_features = 1, .bias = true}, Quant4Type::kFp4, false},
      {{.rows = 66, .in_features = 33, .out_features = 65}, Quant4Type::kNf4, false},
      {{.rows = 1, .in_features = 129, .out_features = 257}, Quant4Type::kFp4, true},
  };
  for (const Case& c : cases) {
    const LinearShape& s = c.shape;
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    const HostQuant4 q = Quantize(rng, c.type, O * I, I, c.nested, /*zero_block=*/true);
    const std::string tag =
        absl::StrCat(" ", Describe(q), " N=", N, " in=", I, " out=", O, s.bias ? " bias" : "");
    const std::vector<float> wf = DequantizeOnHost(q);
    const auto x = Rand(rng, N * I), b = s.bias ? Rand(rng, O) : std::vector<float>{},
               y0 = Rand(rng, N * O), dy = Rand(rng, N * O), dx0 = Rand(rng, N * I);

    const Quant4Tensor d = UploadQuant4(q.Host());
    const float* d_x = Upload(x);
    const float* d_b = s.bias ? Upload(b) : nullptr;
    const float* d_dy = Upload(dy);
    float *d_y = Upload(y0), *d_dx = Upload(dx0);
    const int64_t ws = kernels().Quant4LinearWorkspaceBytes(s);
    ASSERT_GT(ws, 0) << tag;  // every implementation dequantizes into a workspace
    ASSERT_OK(kernels().Quant4LinearForward(stream(), s, d_x, d, d_b, d_y, Workspace(ws), ws));
    ASSERT_OK(kernels().Quant4LinearBackwardInput(stream(), s, d, d_dy, d_dx, Workspace(ws), ws));

    // The direct f32 CPU function (one tile of workspace, no pool: the same bits as any other).
    std::vector<float> y = y0, dx = dx0, tile(Quant4LinearWorkspaceElems(s, 1));
    ASSERT_OK(Quant4LinearForward(s, C(x), q.Host(), C(b), M(y), M(tile), nullptr));
    ASSERT_OK(Quant4LinearBackwardInput(s, q.Host(), C(dy), M(dx), M(tile), nullptr));
    // The f64 reference on the dequantized weight.
    std::vector<double> y_r(N * O), dx_r = D(dx0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = s.bias ? b[o] : 0.0;
        for (int64_t i = 0; i < I; ++i) acc += double{x[n * I + i]} * wf[o * I + i];
        y_r[n * O + o] = acc;
      }
      for (int64_t i = 0; i < I; ++i) {
        double acc = 0.0;
        for (int64_t o = 0; o < O; ++o) acc += double{dy[n * O + o]} * wf[o * I + i];
        dx_r[n * I + i] += acc;
      }
    }
    const std::vector<float> got_y = Download(d_y, N * O), got_dx = Download(d_dx, N * I);
    Check(got_y, y, y_r, "Quant4LinearForward y" + tag);
    Check(got_dx, dx, dx_r, "Quant4LinearBackwardInput dx" + tag);

    // LinearForward / LinearBackward (dx only) on the weight dequantized by Dequantize4Bit.
    float* d_w = Alloc<float>(O * I);
    ASSERT_OK(kernels().Dequantize4Bit(stream(), d, 0, O * I, DType::kF32, d_w));
    float *d_y2 = Alloc<float>(N * O), *d_dx2 = Upload(dx0);
    const int64_t lws = kernels().LinearWorkspaceBytes(s);
    ASSERT_OK(kernels().LinearForward(stream(), s, d_x, d_w, d_b, d_y2, Workspace(lws), lws));
    ASSERT_OK(kernels().LinearBackward(stream(), s, d_x, d_w, d_dy, d_dx2, nullptr, nullptr,
                                       Workspace(lws), lws));
    const std::vector<float> lin_y = Download(d_y2, N * O), lin_dx = Download(d_dx2, N * I);
    if (bit_identical()) {
      ExpectSameBits(got_y.data(), lin_y.data(), N * O * 4, "Quant4LinearForward vs Linear" + tag);
      ExpectSameBits(got_dx.data(), lin_dx.data(), N * I * 4,
                     "Quant4LinearBackwardInput vs LinearBackward" + tag);
    }
    Check(lin_y, y, y_r, "LinearForward on Dequantize4Bit's weight" + tag);
    Check(lin_dx, dx, dx_r, "LinearBackward dx on Dequantize4Bit's weight" + tag);

    // A workspace three times the query's: the same bits on every implementation.
    float *d_y3 = Alloc<float>(N * O), *d_dx3 = Upload(dx0);
    ASSERT_OK(
        kernels().Quant4LinearForward(stream(), s, d_x, d, d_b, d_y3, Workspace(3 * ws), 3 * ws));
    ASSERT_OK(kernels().Quant4LinearBackwardInput(stream(), s, d, d_dy, d_dx3, Workspace(3 * ws),
                                                  3 * ws));
    const std::vector<float> big_y = Download(d_y3, N * O), big_dx = Download(d_dx3, N * I);
    ExpectSameBits(big_y.data(), got_y.data(), N * O * 4, "y with a larger workspace" + tag);
    ExpectSameBits(big_dx.data(), got_dx.data(), N * I * 4, "dx with a larger workspace" + tag);
  }
}

// v rounded to bf16 / f16 and widened back (torch's .to(dtype)).
std::vector<float> Rounded(const std::vector<float>& v, DType dt) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<uint16_t> bits(n);
  std::vector<float> out(n);
  if (dt == DType::kBF16) {
    ConvertF32ToBF16(v.data(), bits.data(), n);
    ConvertBF16ToF32(bits.data(), out.data(), n);
  } else {
    ConvertF32ToF16(v.data(), bits.data(), n);
    ConvertF16ToF32(bits.data(), out.data(), n);
  }
  return out;
}

// bnb_4bit_compute_dtype bf16 and f16 on the shapes above (odd sizes, N = 1, out = 1, several
// column blocks of the CPU grid, both 4-bit types and scale forms, with and without bias).
TEST_P(KernelsConformanceTest, Quant4LinearSixteenBitCompute) {
  TestRng rng(373);
  struct Case {
    LinearShape shape;
    Quant4Type type;
    bool nested;
    DType dt;
  };
  const Case cases[] = {
      {{.rows = 1, .in_features = 77, .out_features = 13, .bias = true}, Quant4Type::kNf4, false,
       DType::kBF16},
      {{.rows = 37, .in_features = 130, .out_features = 300}, Quant4Type::kFp4, true, DType::kBF16},
      {{.rows = 5, .in_features = 520, .out_features = 70, .bias = true}, Quant4Type::kNf4, true,
       DType::kBF16},
      {{.rows = 3, .in_features = 64, .out_features = 1, .bias = true}, Quant4Type::kFp4, false,
       DType::kF16},
      {{.rows = 66, .in_features = 33, .out_features = 65, .bias = true}, Quant4Type::kNf4, false,
       DType::kF16},
      {{.rows = 1, .in_features = 129, .out_features = 257}, Quant4Type::kFp4, true, DType::kBF16},
  };
  for (const Case& c : cases) {
    const LinearShape& s = c.shape;
    const DType dt = c.dt;
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    const HostQuant4 q = Quantize(rng, c.type, O * I, I, c.nested, /*zero_block=*/true);
    const std::string tag = absl::StrCat(" ", DTypeName(dt), " compute, ", Describe(q), " N=", N,
                                         " in=", I, " out=", O, s.bias ? " bias" : "");
    const auto x = Rand(rng, N * I, -3, 3), b = s.bias ? Rand(rng, O) : std::vector<float>{},
               y0 = Rand(rng, N * O), dy = Rand(rng, N * O), dx0 = Rand(rng, N * I);
    const std::vector<float> zeros(N * I, 0.0f);

    const Quant4Tensor d = UploadQuant4(q.Host());
    const float* d_x = Upload(x);
    const float* d_b = s.bias ? Upload(b) : nullptr;
    const float* d_dy = Upload(dy);
    float *d_y = Upload(y0), *d_dx = Upload(dx0), *d_g = Upload(zeros);
    const int64_t ws = kernels().Quant4LinearWorkspaceBytes(s, dt);
    ASSERT_GT(ws, 0) << tag;
    ASSERT_OK(kernels().Quant4LinearForward(stream(), s, d_x, d, d_b, d_y, Workspace(ws), ws, dt));
    ASSERT_OK(
        kernels().Quant4LinearBackwardInput(stream(), s, d, d_dy, d_dx, Workspace(ws), ws, dt));
    ASSERT_OK(
        kernels().Quant4LinearBackwardInput(stream(), s, d, d_dy, d_g, Workspace(ws), ws, dt));
    const std::vector<float> got_y = Download(d_y, N * O), got_dx = Download(d_dx, N * I),
                             got_g = Download(d_g, N * I);

    // The direct CPU function with the same compute dtype.
    std::vector<float> y = y0, dx = dx0, g = zeros, tile(Quant4LinearWorkspaceElems(s, 1, dt));
    ASSERT_OK(Quant4LinearForward(s, C(x), q.Host(), C(b), M(y), M(tile), nullptr, dt));
    ASSERT_OK(Quant4LinearBackwardInput(s, q.Host(), C(dy), M(dx), M(tile), nullptr, dt));
    ASSERT_OK(Quant4LinearBackwardInput(s, q.Host(), C(dy), M(g), M(tile), nullptr, dt));
    if (bit_identical()) {
      ExpectSameBits(got_y.data(), y.data(), N * O * 4, "Quant4LinearForward y" + tag);
      ExpectSameBits(got_dx.data(), dx.data(), N * I * 4, "Quant4LinearBackwardInput dx" + tag);
      ExpectSameBits(got_g.data(), g.data(), N * I * 4, "Quant4LinearBackwardInput (dx 0)" + tag);
    }
    // y and the product are 16-bit values (rounded once more: unchanged) on every implementation.
    ExpectSameBits(Rounded(got_y, dt).data(), got_y.data(), N * O * 4, "y is 16-bit" + tag);
    ExpectSameBits(Rounded(got_g, dt).data(), got_g.data(), N * I * 4,
                   "dx (dx0 = 0) is 16-bit" + tag);
    // dx0 + (dy W rounded), in f32, on every implementation.
    std::vector<float> sum(N * I);
    for (int64_t i = 0; i < N * I; ++i) sum[i] = dx0[i] + got_g[i];
    ExpectSameBits(got_dx.data(), sum.data(), N * I * 4, "dx = dx0 + the product rounded" + tag);

    // The f64 reference on the 16-bit operands.
    const std::vector<float> wr = Rounded(DequantizeOnHost(q), dt), xr = Rounded(x, dt),
                             br = Rounded(b, dt), dyr = Rounded(dy, dt);
    std::vector<double> y_r(N * O), g_r(N * I, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = s.bias ? br[o] : 0.0;
        for (int64_t i = 0; i < I; ++i) {
          acc += double{xr[n * I + i]} * wr[o * I + i];
          g_r[n * I + i] += double{dyr[n * O + o]} * wr[o * I + i];
        }
        y_r[n * O + o] = acc;
      }
    }
    const double rtol = dt == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
    for (const auto& [got, ref, what] : {std::tuple(&got_y, &y_r, "y"),
                                         std::tuple(&got_g, &g_r, "dx (dx0 = 0)")}) {
      double scale = 0;
      for (double r : *ref) scale = std::max(scale, std::abs(r));
      ExpectAllNear(*got, *ref, 2e-4 * scale, rtol,
                    absl::StrCat(what, tag, " vs the f64 reference on the 16-bit operands"));
    }

    // A workspace three times the query's: the same bits.
    float *d_y3 = Alloc<float>(N * O), *d_dx3 = Upload(dx0);
    ASSERT_OK(kernels().Quant4LinearForward(stream(), s, d_x, d, d_b, d_y3, Workspace(3 * ws),
                                            3 * ws, dt));
    ASSERT_OK(kernels().Quant4LinearBackwardInput(stream(), s, d, d_dy, d_dx3, Workspace(3 * ws),
                                                  3 * ws, dt));
    const std::vector<float> big_y = Download(d_y3, N * O), big_dx = Download(d_dx3, N * I);
    ExpectSameBits(big_y.data(), got_y.data(), N * O * 4, "y with a larger workspace" + tag);
    ExpectSameBits(big_dx.data(), got_dx.data(), N * I * 4, "dx with a larger workspace" + tag);
  }
}

TEST_P(KernelsConformanceTest, Quant4ArgumentErrorsAreFoundAtEnqueue) {
  TestRng rng(372);
  const LinearShape s{.rows = 4, .in_features = 70, .out_features = 9, .bias = true};
  const HostQuant4 q = Quantize(rng, Quant4Type::kNf4, 70 * 9, 70, /*nested=*/true, false);
  const Quant4Tensor w = UploadQuant4(q.Host());
  float *x = Alloc<float>(4 * 70), *y = Alloc<float>(4 * 9), *b = Alloc<float>(9),
        *xy = Alloc<float>(4 * 70 + 4 * 9);
  const int64_t ws_bytes = kernels().Quant4LinearWorkspaceBytes(s);
  void* ws = Workspace(ws_bytes);
  const auto invalid = [](const std::string& words) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(words));
  };

  Quant4Tensor wrong_count = w;
  wrong_count.num_elems = 70 * 9 + 1;
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, x, wrong_count, b, y, ws, ws_bytes),
              invalid("holds 631 values, expected out_features*in_features"));
  Quant4Tensor no_scales = w;
  no_scales.nested_absmax = nullptr;
  EXPECT_THAT(kernels().Quant4LinearBackwardInput(stream(), s, no_scales, y, x, ws, ws_bytes),
              invalid("w.nested_absmax is null"));
  Quant4Tensor no_codes = w;
  no_codes.codes = nullptr;
  EXPECT_THAT(kernels().Dequantize4Bit(stream(), no_codes, 0, 10, DType::kF32, x),
              invalid("w.codes is null"));
  Quant4Tensor bad_type = w;
  bad_type.type = static_cast<Quant4Type>(7);
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, x, bad_type, b, y, ws, ws_bytes),
              invalid("unknown 4-bit type 7"));
  EXPECT_THAT(kernels().Dequantize4Bit(stream(), w, 600, 31, DType::kF32, x),
              invalid("outside the 4-bit tensor's 630 values"));
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, x, w, nullptr, y, ws, ws_bytes),
              invalid("b is null"));
  if (ws_bytes > 0) {
    EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, x, w, b, y, ws, ws_bytes - 4),
                invalid("Quant4LinearForward: workspace has"));
  }
  EXPECT_THAT(kernels().Quant4LinearBackwardInput(stream(), s, w, xy, xy + 4, ws, ws_bytes),
              invalid("dy and dx overlap"));
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, xy, w, b, xy + 4 * 70 - 1, ws, ws_bytes),
              invalid("x and y overlap"));
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, x, w, b, y, ws, ws_bytes,
                                            static_cast<DType>(7)),
              invalid("Quant4LinearForward: compute_dtype 7 is not f32, bf16 or f16"));
  EXPECT_THAT(kernels().Quant4LinearBackwardInput(stream(), s, w, y, x, ws, ws_bytes,
                                                  static_cast<DType>(9)),
              invalid("Quant4LinearBackwardInput: compute_dtype 9 is not f32, bf16 or f16"));
  // The 16-bit compute asks for more (the rounded activations): the f32 answer is refused.
  const int64_t bf16_bytes = kernels().Quant4LinearWorkspaceBytes(s, DType::kBF16);
  EXPECT_GT(bf16_bytes, ws_bytes);
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), s, x, w, b, y, ws, ws_bytes, DType::kBF16),
              invalid("Quant4LinearForward: workspace has"));
  LinearShape zero_rows = s;
  zero_rows.rows = 0;
  EXPECT_THAT(kernels().Quant4LinearForward(stream(), zero_rows, x, w, b, y, ws, ws_bytes),
              invalid("Quant4LinearForward: rows must be in [1, 2^31)"));
  ASSERT_OK(stream().Synchronize());
}

}  // namespace

Quant4Tensor KernelsConformanceTest::UploadQuant4(const Quant4Tensor& host) {
  Quant4Tensor t = host;
  const int64_t blocks = Quant4NumBlocks(host.num_elems);
  const auto upload = [&](const void* p, int64_t bytes) {
    void* d = AllocBytes(bytes);
    UploadBytes(d, p, bytes);
    return d;
  };
  t.codes = static_cast<const uint8_t*>(upload(host.codes, Quant4CodeBytes(host.num_elems)));
  if (host.nested()) {
    t.nested_codes = static_cast<const uint8_t*>(upload(host.nested_codes, blocks));
    t.nested_absmax = static_cast<const float*>(
        upload(host.nested_absmax, Quant4NestedNumBlocks(blocks) * int64_t{sizeof(float)}));
  } else {
    t.absmax = static_cast<const float*>(upload(host.absmax, blocks * int64_t{sizeof(float)}));
  }
  return t;
}

}  // namespace ps::kernel_testing
