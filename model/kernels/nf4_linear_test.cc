// Quant4LinearForward / Quant4LinearBackwardInput against LinearForward / LinearBackward (dx only)
// on the dequantized f32 weight: bit for bit, for awkward shapes (in not a multiple of 64, odd, the
// GEMM grid's edges), NF4 and FP4, plain and nested absmax, any slot count and thread count.
#include "model/kernels/nf4_linear.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/random/distributions.h"
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

}  // namespace
}  // namespace ps
