// Quant4LinearForward / Quant4LinearBackwardInput against LinearForward / LinearBackward (dx only)
// on the dequantized f32 weight: bit for bit, for awkward shapes (in not a multiple of 64, odd, the
// GEMM grid's edges), NF4 and FP4, plain and nested absmax, any slot count and thread count.
// The bf16 / f16 compute dtypes: bit for bit the same Linear on the rounded operands with the
// result rounded, and within one 16-bit ulp of torch (testdata/nf4/make_nf4_bf16_gemm_vectors.py).
#include "model/kernels/nf4_linear.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "memory/convert.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kernels/linear.h"
#include "model/kernels/nf4.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::vector<float> Random(TestRng& gen, int64_t n, float scale) {
  std::vector<float> v(n);
  for (float& x : v) x = absl::Gaussian<float>(gen, 0.0f, scale);
  return v;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

// A quantized weight and its dequantized f32 copy.
struct Weight {
  std::vector<uint8_t> codes, nested_codes;
  std::vector<float> absmax, nested_absmax, dequantized;
  Quant4Tensor tensor;
};

Weight MakeWeight(TestRng& gen, Quant4Type type, bool nested, int64_t out, int64_t in) {
  Weight w;
  const int64_t n = out * in, blocks = Quant4NumBlocks(n);
  const std::vector<float> values = Random(gen, n, 0.05f);
  w.codes.resize(Quant4CodeBytes(n));
  w.absmax.resize(blocks);
  EXPECT_OK(Quantize4Bit(type, DType::kF32, values.data(), n, absl::MakeSpan(w.codes),
                         absl::MakeSpan(w.absmax), nullptr));
  w.tensor = {type, n, w.codes.data(), w.absmax.data()};
  if (nested) {
    w.nested_codes.resize(blocks);
    w.nested_absmax.resize(Quant4NestedNumBlocks(blocks));
    float offset = 0;
    EXPECT_OK(QuantizeAbsmaxNested(w.absmax, absl::MakeSpan(w.nested_codes),
                                   absl::MakeSpan(w.nested_absmax), &offset));
    w.tensor.absmax = nullptr;
    w.tensor.nested_codes = w.nested_codes.data();
    w.tensor.nested_absmax = w.nested_absmax.data();
    w.tensor.nested_offset = offset;
  }
  w.dequantized.resize(n);
  EXPECT_OK(Dequantize4Bit(w.tensor, 0, n, DType::kF32, w.dequantized.data()));
  return w;
}

TEST(Quant4LinearTest, BitIdenticalToLinearOnTheDequantizedWeight) {
  TestRng gen(37);
  ThreadPool pool(3);
  struct Case {
    LinearShape shape;
    Quant4Type type;
    bool nested;
  };
  const Case cases[] = {
      {{1, 1, 1, false}, Quant4Type::kNf4, false},
      {{3, 37, 5, true}, Quant4Type::kNf4, true},
      {{17, 64, 300, false}, Quant4Type::kFp4, false},
      {{70, 129, 257, true}, Quant4Type::kNf4, true},
      {{260, 96, 33, false}, Quant4Type::kNf4, false},
      {{5, 513, 70, true}, Quant4Type::kFp4, true},
      {{40, 200, 1030, false}, Quant4Type::kNf4, true},
  };
  for (const Case& c : cases) {
    const LinearShape& s = c.shape;
    SCOPED_TRACE(::testing::Message() << "N=" << s.rows << " in=" << s.in_features
                                      << " out=" << s.out_features << " bias=" << s.bias);
    const Weight w = MakeWeight(gen, c.type, c.nested, s.out_features, s.in_features);
    const std::vector<float> x = Random(gen, s.rows * s.in_features, 1.0f);
    const std::vector<float> b = s.bias ? Random(gen, s.out_features, 1.0f) : std::vector<float>();
    const std::vector<float> dy = Random(gen, s.rows * s.out_features, 1.0f);
    const std::vector<float> dx0 = Random(gen, s.rows * s.in_features, 1.0f);
    std::vector<float> want_y(s.rows * s.out_features), want_dx = dx0;
    ASSERT_OK(LinearForward<float>(s, x, w.dequantized, b, absl::MakeSpan(want_y), &pool));
    ASSERT_OK(
        LinearBackward<float>(s, x, w.dequantized, dy, absl::MakeSpan(want_dx), {}, {}, &pool));
    for (int slots : {1, 2, 5}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        SCOPED_TRACE(::testing::Message() << "slots=" << slots << " pool=" << (p != nullptr));
        std::vector<float> ws(Quant4LinearWorkspaceElems(s, slots), -1.0f);
        std::vector<float> y(s.rows * s.out_features, 7.0f), dx = dx0;
        ASSERT_OK(Quant4LinearForward(s, x, w.tensor, b, absl::MakeSpan(y), absl::MakeSpan(ws), p));
        ExpectSameBits(y, want_y, "y");
        ASSERT_OK(
            Quant4LinearBackwardInput(s, w.tensor, dy, absl::MakeSpan(dx), absl::MakeSpan(ws), p));
        ExpectSameBits(dx, want_dx, "dx");
      }
    }
  }
}

TEST(Quant4LinearTest, RefusesBadArguments) {
  TestRng gen(38);
  const LinearShape s{4, 10, 6, false};
  const Weight w = MakeWeight(gen, Quant4Type::kNf4, false, 6, 10);
  std::vector<float> x(40), y(24), ws(Quant4LinearWorkspaceElems(s, 1));
  Quant4Tensor wrong = w.tensor;
  wrong.num_elems = 59;
  EXPECT_THAT(Quant4LinearForward(s, x, wrong, {}, absl::MakeSpan(y), absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds 59 values")));
  EXPECT_THAT(Quant4LinearForward(s, x, w.tensor, {}, absl::MakeSpan(y),
                                  absl::MakeSpan(ws).subspan(1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  EXPECT_THAT(Quant4LinearBackwardInput(s, w.tensor, y, absl::MakeSpan(x).subspan(1),
                                        absl::MakeSpan(ws), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dx has 39")));
}

// x rounded to `dt` (bf16 / f16) and back, as torch's .to(dt).
std::vector<float> Rounded(const std::vector<float>& x, DType dt) {
  std::vector<uint16_t> bits(x.size());
  std::vector<float> out(x.size());
  if (dt == DType::kBF16) {
    ConvertF32ToBF16(x.data(), bits.data(), static_cast<int64_t>(x.size()));
    ConvertBF16ToF32(bits.data(), out.data(), static_cast<int64_t>(x.size()));
  } else {
    ConvertF32ToF16(x.data(), bits.data(), static_cast<int64_t>(x.size()));
    ConvertF16ToF32(bits.data(), out.data(), static_cast<int64_t>(x.size()));
  }
  return out;
}

// bf16 / f16 compute: bit for bit round(Linear(round(x), round(W), round(b))) and
// dx0 + round(dy_r W_r), which run the same OpenBLAS grid, for any slot count and pool. Rounding W's
// f32 values equals Dequantize4Bit's bf16 / f16 output (checked too).
TEST(Quant4LinearTest, SixteenBitComputeIsTheLinearOnRoundedOperands) {
  TestRng gen(39);
  ThreadPool pool(3);
  struct Case {
    LinearShape shape;
    Quant4Type type;
    bool nested;
    DType dt;
  };
  const Case cases[] = {
      {{1, 1, 1, true}, Quant4Type::kNf4, false, DType::kBF16},
      {{3, 37, 5, true}, Quant4Type::kNf4, true, DType::kBF16},
      {{17, 64, 300, false}, Quant4Type::kFp4, false, DType::kBF16},
      {{70, 129, 257, true}, Quant4Type::kNf4, true, DType::kBF16},
      {{260, 96, 33, false}, Quant4Type::kNf4, false, DType::kF16},
      {{5, 513, 70, true}, Quant4Type::kFp4, true, DType::kF16},
      {{40, 200, 1030, true}, Quant4Type::kNf4, true, DType::kBF16},
  };
  for (const Case& c : cases) {
    const LinearShape& s = c.shape;
    const int64_t N = s.rows, I = s.in_features, O = s.out_features;
    SCOPED_TRACE(::testing::Message() << "N=" << N << " in=" << I << " out=" << O
                                      << " bias=" << s.bias << " " << DTypeName(c.dt));
    const Weight w = MakeWeight(gen, c.type, c.nested, O, I);
    const std::vector<float> x = Random(gen, N * I, 1.0f);
    const std::vector<float> b = s.bias ? Random(gen, O, 1.0f) : std::vector<float>();
    const std::vector<float> dy = Random(gen, N * O, 1.0f);
    const std::vector<float> dx0 = Random(gen, N * I, 1.0f);
    const std::vector<float> wr = Rounded(w.dequantized, c.dt);
    {
      std::vector<uint16_t> bits(O * I);
      ASSERT_OK(Dequantize4Bit(w.tensor, 0, O * I, c.dt, bits.data()));
      std::vector<float> widened(O * I);
      if (c.dt == DType::kBF16) {
        ConvertBF16ToF32(bits.data(), widened.data(), O * I);
      } else {
        ConvertF16ToF32(bits.data(), widened.data(), O * I);
      }
      ExpectSameBits(widened, wr, "rounded W vs Dequantize4Bit's 16-bit output");
    }
    std::vector<float> want_y(N * O), g(N * I, 0.0f);
    ASSERT_OK(LinearForward<float>(s, Rounded(x, c.dt), wr, s.bias ? Rounded(b, c.dt) : b,
                                   absl::MakeSpan(want_y), &pool));
    want_y = Rounded(want_y, c.dt);
    ASSERT_OK(
        LinearBackward<float>(s, x, wr, Rounded(dy, c.dt), absl::MakeSpan(g), {}, {}, &pool));
    g = Rounded(g, c.dt);
    std::vector<float> want_dx = dx0;
    for (int64_t i = 0; i < N * I; ++i) want_dx[i] += g[i];
    for (int slots : {1, 2, 5}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        SCOPED_TRACE(::testing::Message() << "slots=" << slots << " pool=" << (p != nullptr));
        std::vector<float> ws(Quant4LinearWorkspaceElems(s, slots, c.dt), -1.0f);
        std::vector<float> y(N * O, 7.0f), dx = dx0;
        ASSERT_OK(Quant4LinearForward(s, x, w.tensor, b, absl::MakeSpan(y), absl::MakeSpan(ws), p,
                                      c.dt));
        ExpectSameBits(y, want_y, "y");
        ASSERT_OK(Quant4LinearBackwardInput(s, w.tensor, dy, absl::MakeSpan(dx),
                                            absl::MakeSpan(ws), p, c.dt));
        ExpectSameBits(dx, want_dx, "dx");
      }
    }
  }
}

TEST(Quant4LinearTest, SixteenBitComputeNeedsTheActivationsInTheWorkspace) {
  TestRng gen(40);
  const LinearShape s{4, 10, 6, false};
  const Weight w = MakeWeight(gen, Quant4Type::kNf4, false, 6, 10);
  EXPECT_EQ(Quant4LinearWorkspaceElems(s, 2, DType::kBF16),
            Quant4LinearWorkspaceElems(s, 2) + 4 * 10);
  std::vector<float> x(40), y(24), ws(Quant4LinearWorkspaceElems(s, 1, DType::kBF16) - 1);
  EXPECT_THAT(Quant4LinearForward(s, x, w.tensor, {}, absl::MakeSpan(y), absl::MakeSpan(ws),
                                  nullptr, DType::kBF16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rounded activations for compute dtype bf16")));
  ws.push_back(0.0f);
  EXPECT_OK(Quant4LinearForward(s, x, w.tensor, {}, absl::MakeSpan(y), absl::MakeSpan(ws), nullptr,
                                DType::kBF16));
  EXPECT_THAT(Quant4LinearBackwardInput(s, w.tensor, y, absl::MakeSpan(x), absl::MakeSpan(ws),
                                        nullptr, static_cast<DType>(7)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("compute_dtype 7 is not f32, bf16 or f16")));
}

// --- Against torch (make_nf4_bf16_gemm_vectors.py) ---------------------------------------------

using Vectors = std::map<std::string, std::vector<std::string>>;

Vectors ReadVectors(const std::string& file) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : ".",
                                        "/patrickstar_cc/model/kernels/testdata/nf4/", file);
  Vectors v;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    const std::string key = words[0];
    words.erase(words.begin());
    v[key] = std::move(words);
  }
  return v;
}

std::vector<uint32_t> Hex(const std::vector<std::string>& words) {
  std::vector<uint32_t> out;
  for (const std::string& w : words) {
    uint32_t x = 0;
    EXPECT_TRUE(absl::SimpleHexAtoi(w, &x)) << w;
    out.push_back(x);
  }
  return out;
}

std::vector<float> HexF32(const std::vector<std::string>& words) {
  std::vector<float> out;
  for (uint32_t u : Hex(words)) {
    float f;
    std::memcpy(&f, &u, 4);
    out.push_back(f);
  }
  return out;
}

std::vector<float> Hex16AsF32(const std::vector<std::string>& words, DType dt) {
  std::vector<uint16_t> bits;
  for (uint32_t u : Hex(words)) bits.push_back(static_cast<uint16_t>(u));
  std::vector<float> out(bits.size());
  if (dt == DType::kBF16) {
    ConvertBF16ToF32(bits.data(), out.data(), static_cast<int64_t>(bits.size()));
  } else {
    ConvertF16ToF32(bits.data(), out.data(), static_cast<int64_t>(bits.size()));
  }
  return out;
}

std::vector<uint8_t> HexBytes(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    int v = 0;
    EXPECT_TRUE(absl::SimpleHexAtoi(hex.substr(i, 2), &v));
    out.push_back(static_cast<uint8_t>(v));
  }
  return out;
}

// One unit in the last place of a 16-bit value of magnitude |v| (bf16: 8 significant bits; f16:
// 11, and no finer than its smallest subnormal 2^-24).
double Ulp16(double v, DType dt) {
  const int bits = dt == DType::kBF16 ? 8 : 11;
  if (v == 0.0) return dt == DType::kBF16 ? std::ldexp(1.0, -133) : std::ldexp(1.0, -24);
  const double ulp = std::ldexp(1.0, std::ilogb(v) - (bits - 1));
  return dt == DType::kF16 ? std::max(ulp, std::ldexp(1.0, -24)) : ulp;
}

// Our 16-bit compute against torch's F.linear / matmul on the same 16-bit operands. Both multiply
// exactly (a product of two 16-bit values is exact in f32) and sum the K products (and the bias)
// in f32, then round once; only the order of the f32 sums differs (OpenBLAS's kernel against
// torch's). Each f32 sum is within K * 2^-24 * sum|terms| of the exact one, so the two rounded
// results differ by at most one 16-bit ulp of the larger plus 2 K 2^-24 sum|terms|: the bound
// held here. The second term matters only under cancellation (|y| far below sum|terms|); for
// every other value it is a fraction of an ulp, so the bound is one 16-bit ulp of |y|. At least
// 90% of the values must also be equal.
TEST(Quant4LinearTest, SixteenBitComputeMatchesTorch) {
  const Vectors v = ReadVectors("nf4_bf16_gemm_vectors.txt");
  int cases = 0;
  for (const auto& [key, meta] : v) {
    if (!absl::EndsWith(key, ".meta")) continue;
    const std::string name = key.substr(0, key.size() - 5);
    SCOPED_TRACE(name);
    ASSERT_EQ(meta.size(), 7u);
    const Quant4Type type = meta[0] == "nf4" ? Quant4Type::kNf4 : Quant4Type::kFp4;
    const DType dt = meta[1] == "bf16" ? DType::kBF16 : DType::kF16;
    int64_t N = 0, I = 0, O = 0;
    int bias = 0, nested = 0;
    ASSERT_TRUE(absl::SimpleAtoi(meta[2], &N) && absl::SimpleAtoi(meta[3], &I) &&
                absl::SimpleAtoi(meta[4], &O) && absl::SimpleAtoi(meta[5], &bias) &&
                absl::SimpleAtoi(meta[6], &nested));
    const LinearShape s{N, I, O, bias != 0};
    const std::vector<uint8_t> codes = HexBytes(v.at(name + ".codes")[0]);
    std::vector<float> absmax, nested_absmax, offset;
    std::vector<uint8_t> nested_codes;
    Quant4Tensor w{type, O * I, codes.data()};
    if (nested != 0) {
      nested_codes = HexBytes(v.at(name + ".nested_codes")[0]);
      nested_absmax = HexF32(v.at(name + ".nested_absmax"));
      offset = HexF32(v.at(name + ".offset"));
      w.nested_codes = nested_codes.data();
      w.nested_absmax = nested_absmax.data();
      w.nested_offset = offset[0];
    } else {
      absmax = HexF32(v.at(name + ".absmax"));
      w.absmax = absmax.data();
    }
    const std::vector<float> x = HexF32(v.at(name + ".x")), dy = HexF32(v.at(name + ".dy"));
    const std::vector<float> b = bias != 0 ? HexF32(v.at(name + ".b")) : std::vector<float>();
    const std::vector<float> want_y = Hex16AsF32(v.at(name + ".y"), dt);
    const std::vector<float> want_dx = Hex16AsF32(v.at(name + ".dx"), dt);
    ASSERT_EQ(want_y.size(), static_cast<size_t>(N * O));
    ASSERT_EQ(want_dx.size(), static_cast<size_t>(N * I));
    // sum|terms| of each output, in double, on the 16-bit operands.
    std::vector<float> wr(O * I);
    ASSERT_OK(Dequantize4Bit(w, 0, O * I, DType::kF32, wr.data()));
    wr = Rounded(wr, dt);
    const std::vector<float> xr = Rounded(x, dt), dyr = Rounded(dy, dt);
    std::vector<double> y_terms(N * O), dx_terms(N * I, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double t = bias != 0 ? std::abs(Rounded({b[o]}, dt)[0]) : 0.0;
        for (int64_t i = 0; i < I; ++i) {
          t += std::abs(double{xr[n * I + i]} * wr[o * I + i]);
          dx_terms[n * I + i] += std::abs(double{dyr[n * O + o]} * wr[o * I + i]);
        }
        y_terms[n * O + o] = t;
      }
    }
    ThreadPool pool(2);
    std::vector<float> ws(Quant4LinearWorkspaceElems(s, 2, dt)), y(N * O), dx(N * I, 0.0f);
    ASSERT_OK(Quant4LinearForward(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(ws), &pool, dt));
    ASSERT_OK(Quant4LinearBackwardInput(s, w, dy, absl::MakeSpan(dx), absl::MakeSpan(ws), &pool,
                                        dt));
    for (const auto& [got, want, terms, k, what] :
         {std::tuple(&y, &want_y, &y_terms, I + 1, "y"),
          std::tuple(&dx, &want_dx, &dx_terms, O, "dx")}) {
      int64_t equal = 0;
      for (size_t i = 0; i < want->size(); ++i) {
        const double a = (*got)[i], t = (*want)[i];
        const double f32_sums = 2.0 * k * std::ldexp(1.0, -24) * (*terms)[i];
        ASSERT_LE(std::abs(a - t), Ulp16(std::max(std::abs(a), std::abs(t)), dt) + f32_sums)
            << what << "[" << i << "]: ours " << a << ", torch " << t
            << ", sum|terms| " << (*terms)[i];
        equal += a == t;
      }
      // One-ulp differences are rare (sums within a few f32 ulps of a 16-bit rounding boundary).
      EXPECT_GE(equal, static_cast<int64_t>(want->size() * 9 / 10)) << what;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 7);
}

}  // namespace
}  // namespace ps
