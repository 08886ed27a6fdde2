// model/kernels/nf4.h against the reference vectors of testdata/nf4/make_nf4_vectors.py
// (bitsandbytes' algorithm re-implemented in numpy): codes, absmax, the nested state and the
// dequantized values must match bit for bit, the dequantization on every SIMD target this CPU has
// and for every sub-range (odd starts, ranges inside one block, across chunks).
#include "model/kernels/nf4.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "memory/dtype.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string VectorsPath() {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".",
                      "/patrickstar_cc/model/kernels/testdata/nf4/nf4_vectors.txt");
}

// key -> the whitespace-separated words after it.
using Vectors = std::map<std::string, std::vector<std::string>>;

Vectors ReadVectors() {
  Vectors v;
  std::ifstream in(VectorsPath());
  EXPECT_TRUE(in.good()) << VectorsPath();
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

std::vector<uint32_t> Hex32(const std::vector<std::string>& words) {
  std::vector<uint32_t> out;
  for (const std::string& w : words) {
    uint32_t x = 0;
    EXPECT_TRUE(absl::SimpleHexAtoi(w, &x)) << w;
    out.push_back(x);
  }
  return out;
}

std::vector<uint16_t> Hex16(const std::vector<std::string>& words) {
  std::vector<uint16_t> out;
  for (uint32_t x : Hex32(words)) out.push_back(static_cast<uint16_t>(x));
  return out;
}

std::vector<uint8_t> HexBytes(const std::vector<std::string>& words) {
  std::vector<uint8_t> out;
  const std::string s = words.empty() ? "" : words[0];
  for (size_t i = 0; i + 1 < s.size(); i += 2) {
    uint32_t x = 0;
    EXPECT_TRUE(absl::SimpleHexAtoi(s.substr(i, 2), &x));
    out.push_back(static_cast<uint8_t>(x));
  }
  return out;
}

std::vector<uint32_t> Bits(const std::vector<float>& f) {
  std::vector<uint32_t> out(f.size());
  std::memcpy(out.data(), f.data(), f.size() * 4);
  return out;
}

std::vector<float> Floats(const std::vector<uint32_t>& bits) {
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * 4);
  return out;
}

struct Case {
  std::string name;
  Quant4Type type = Quant4Type::kNf4;
  DType src_dtype = DType::kF32;
  int64_t n = 0;
  bool nested = false;
};

std::vector<Case> Cases(const Vectors& v) {
  std::vector<Case> cases;
  for (const auto& [key, words] : v) {
    if (!absl::EndsWith(key, ".meta")) continue;
    Case c;
    c.name = key.substr(0, key.size() - 5);
    c.type = words[0] == "nf4" ? Quant4Type::kNf4 : Quant4Type::kFp4;
    c.src_dtype = words[1] == "f32" ? DType::kF32 : words[1] == "bf16" ? DType::kBF16 : DType::kF16;
    EXPECT_TRUE(absl::SimpleAtoi(words[2], &c.n));
    c.nested = words[3] == "1";
    cases.push_back(c);
  }
  return cases;
}

class Nf4VectorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { vectors_ = new Vectors(ReadVectors()); }
  static void TearDownTestSuite() { delete vectors_; }
  const std::vector<std::string>& Get(const std::string& key) {
    static const std::vector<std::string> kEmpty;
    auto it = vectors_->find(key);
    EXPECT_NE(it, vectors_->end()) << key;
    return it == vectors_->end() ? kEmpty : it->second;
  }
  static Vectors* vectors_;
};
Vectors* Nf4VectorsTest::vectors_ = nullptr;

TEST_F(Nf4VectorsTest, DynamicMapIsBitsandbytesCreateDynamicMap) {
  const std::vector<uint32_t> want = Hex32(Get("dynamic_map"));
  ASSERT_EQ(want.size(), 256u);
  const std::vector<float> got(DynamicMap8(), DynamicMap8() + 256);
  EXPECT_EQ(Bits(got), want);
}

TEST_F(Nf4VectorsTest, HasTheAwkwardCases) {
  const std::vector<Case> cases = Cases(*vectors_);
  EXPECT_GE(cases.size(), 13u);
  int nested = 0, odd_tail = 0;
  for (const Case& c : cases) {
    nested += c.nested;
    odd_tail += c.n % 2 == 1 && c.n % kQuant4BlockElems != 0;
  }
  EXPECT_GE(nested, 3);
  EXPECT_GE(odd_tail, 2);
}

TEST_F(Nf4VectorsTest, QuantizeAndDequantizeMatchBitForBit) {
  ThreadPool pool(3);
  for (const Case& c : Cases(*vectors_)) {
    SCOPED_TRACE(c.name);
    const std::vector<uint32_t> input32 =
        c.src_dtype == DType::kF32 ? Hex32(Get(c.name + ".input")) : std::vector<uint32_t>();
    const std::vector<uint16_t> input16 =
        c.src_dtype != DType::kF32 ? Hex16(Get(c.name + ".input")) : std::vector<uint16_t>();
    const void* src = c.src_dtype == DType::kF32 ? static_cast<const void*>(input32.data())
                                                 : static_cast<const void*>(input16.data());
    ASSERT_EQ(static_cast<int64_t>(input32.size() + input16.size()), c.n);
    const int64_t blocks = Quant4NumBlocks(c.n);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<uint8_t> codes(Quant4CodeBytes(c.n));
      std::vector<float> absmax(blocks);
      ASSERT_OK(Quantize4Bit(c.type, c.src_dtype, src, c.n, absl::MakeSpan(codes),
                             absl::MakeSpan(absmax), p));
      EXPECT_EQ(codes, HexBytes(Get(c.name + ".codes")));
      EXPECT_EQ(Bits(absmax), Hex32(Get(c.name + ".absmax")));
    }
    const std::vector<uint8_t> codes = HexBytes(Get(c.name + ".codes"));
    std::vector<float> absmax = Floats(Hex32(Get(c.name + ".absmax")));
    Quant4Tensor t{c.type, c.n, codes.data(), absmax.data()};
    std::vector<uint8_t> nested_codes(blocks);
    std::vector<float> nested_absmax(Quant4NestedNumBlocks(blocks));
    if (c.nested) {
      float offset = 0;
      ASSERT_OK(QuantizeAbsmaxNested(absmax, absl::MakeSpan(nested_codes),
                                     absl::MakeSpan(nested_absmax), &offset));
      EXPECT_EQ(Bits({offset}), Hex32(Get(c.name + ".offset")));
      EXPECT_EQ(nested_codes, HexBytes(Get(c.name + ".nested_codes")));
      EXPECT_EQ(Bits(nested_absmax), Hex32(Get(c.name + ".nested_absmax")));
      std::vector<float> restored(blocks);
      ASSERT_OK(
          DequantizeAbsmaxNested(nested_codes, nested_absmax, offset, absl::MakeSpan(restored)));
      EXPECT_EQ(Bits(restored), Hex32(Get(c.name + ".absmax_dequantized")));
      t.absmax = nullptr;
      t.nested_codes = nested_codes.data();
      t.nested_absmax = nested_absmax.data();
      t.nested_offset = offset;
    }
    const std::vector<uint32_t> want_f32 = Hex32(Get(c.name + ".dequant_f32"));
    const std::vector<uint16_t> want_bf16 = Hex16(Get(c.name + ".dequant_bf16"));
    ASSERT_EQ(static_cast<int64_t>(want_f32.size()), c.n);
    TestRng gen(static_cast<uint64_t>(c.n));
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(hwy::TargetName(target));
      std::vector<float> out(c.n);
      ASSERT_OK(Dequantize4Bit(t, 0, c.n, DType::kF32, out.data()));
      EXPECT_EQ(Bits(out), want_f32);
      std::vector<uint16_t> out16(c.n);
      ASSERT_OK(Dequantize4Bit(t, 0, c.n, DType::kBF16, out16.data()));
      EXPECT_EQ(out16, want_bf16);
      // Sub-ranges: odd and even starts, inside one block, across blocks and chunks, the tail.
      for (int trial = 0; trial < 40; ++trial) {
        const int64_t begin = absl::Uniform<int64_t>(absl::IntervalClosed, gen, 0, c.n);
        const int64_t count = absl::Uniform<int64_t>(
            absl::IntervalClosed, gen, 0, std::min<int64_t>(c.n - begin, trial < 20 ? 70 : c.n));
        std::vector<float> part(count + 1, 123.0f);
        ASSERT_OK(Dequantize4Bit(t, begin, count, DType::kF32, part.data()));
        for (int64_t i = 0; i < count; ++i) {
          uint32_t bits;
          std::memcpy(&bits, &part[i], 4);
          ASSERT_EQ(bits, want_f32[begin + i])
              << "begin " << begin << " count " << count << " i " << i;
        }
        EXPECT_EQ(part[count], 123.0f) << "wrote past the range";
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(Nf4Test, RefusesNonFiniteValuesNamingTheIndex) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(100, 0.5f);
    x[77] = bad;
    std::vector<uint8_t> codes(50);
    std::vector<float> absmax(2);
    EXPECT_THAT(Quantize4Bit(Quant4Type::kNf4, DType::kF32, x.data(), 100, absl::MakeSpan(codes),
                             absl::MakeSpan(absmax), nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value 77 of 100")));
  }
}

TEST(Nf4Test, RefusesMisshapenBuffersAndRanges) {
  std::vector<float> x(130, 1.0f);
  std::vector<uint8_t> codes(65);
  std::vector<float> absmax(3);
  EXPECT_THAT(Quantize4Bit(Quant4Type::kNf4, DType::kF32, x.data(), 130,
                           absl::MakeSpan(codes).subspan(1), absl::MakeSpan(absmax), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("codes has 64")));
  EXPECT_THAT(Quantize4Bit(Quant4Type::kNf4, DType::kF32, x.data(), 130, absl::MakeSpan(codes),
                           absl::MakeSpan(absmax).subspan(1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("absmax has 2")));
  ASSERT_OK(Quantize4Bit(Quant4Type::kNf4, DType::kF32, x.data(), 130, absl::MakeSpan(codes),
                         absl::MakeSpan(absmax), nullptr));
  Quant4Tensor t{Quant4Type::kNf4, 130, codes.data(), absmax.data()};
  std::vector<float> out(130);
  EXPECT_THAT(Dequantize4Bit(t, 100, 31, DType::kF32, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the tensor's 130")));
  t.absmax = nullptr;
  EXPECT_THAT(Dequantize4Bit(t, 0, 1, DType::kF32, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested state")));
}

TEST(Nf4Test, StateBytesPerParameter) {
  // 4 bits + a float per 64 values: 0.5625 bytes per parameter; nested: 0.5 + 1/64 + 4/(64*256).
  EXPECT_EQ(Quant4StateBytes(64 * 256 * 16, false), 64 * 256 * 16 / 2 + 4 * 256 * 16);
  EXPECT_EQ(Quant4StateBytes(64 * 256 * 16, true), 64 * 256 * 16 / 2 + 256 * 16 + 4 * 16 + 4);
  EXPECT_EQ(Quant4StateBytes(65, false), 33 + 8);
}

}  // namespace
}  // namespace ps
