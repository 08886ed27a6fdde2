// Tests for DType, Device and the scalar conversions of memory/dtype_math.h.
//
// The conversions are checked against references that share no code with them:
//  - decoding (f16/bf16 -> f32) against values built from the fields with std::ldexp, for all
//    65536 patterns of each type;
//  - rounding (f32 -> f16/bf16) against a table of every finite 16-bit value and a
//    nearest-even decision made with exact double arithmetic, on every tie between adjacent 16-bit
//    values and its neighbours, on named boundary cases, and on random f32 bit patterns;
//  - where the CPU has F16C, additionally against the hardware's VCVTPS2PH/VCVTPH2PS, NaNs
//    included (our NaN policy is the hardware's).
#include "memory/dtype.h"

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/device.h"
#include "memory/dtype_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define PS_TEST_HAVE_F16C_INTRINSICS 1
#else
#define PS_TEST_HAVE_F16C_INTRINSICS 0
#endif

namespace ps {
namespace {

using ::testing::HasSubstr;

bool IsF16NaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool IsBF16NaN(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

// Stops a sweep after this many reported mismatches.
constexpr int kMaxReportedFailures = 10;

// ---------------------------------------------------------------------------------------------
// F16C, when the CPU has it: an independent hardware reference.

#if PS_TEST_HAVE_F16C_INTRINSICS
__attribute__((target("f16c"))) uint16_t F16cFloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float F16cHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
// CPUID.1:ECX has F16C (bit 29), AVX (28) and OSXSAVE (27); the OS must also save YMM state
// (XCR0 bits 1 and 2) for the VEX-encoded F16C instructions to run.
bool HaveF16c() {
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  constexpr unsigned int kNeeded = (1u << 29) | (1u << 28) | (1u << 27);
  if ((ecx & kNeeded) != kNeeded) return false;
  unsigned int xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 6u) == 6u;
}
#else
uint16_t F16cFloatToHalf(float) { return 0; }
float F16cHalfToFloat(uint16_t) { return 0; }
bool HaveF16c() { return false; }
#endif

// ---------------------------------------------------------------------------------------------
// Field-based decoding references. REQUIRES: not a NaN pattern.

double RefHalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000u) ? -magnitude : magnitude;
}

double RefBFloat16Value(uint16_t b) {
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  double magnitude;
  if (exponent == 0xff) {
    magnitude = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -133);
  } else {
    magnitude = std::ldexp(128 + mantissa, exponent - 134);
  }
  return (b & 0x8000u) ? -magnitude : magnitude;
}

// Expected NaN results (see the NaN policy in dtype_math.h).
uint16_t QuietHalfNaNFromFloat(uint32_t x) {
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
}
uint16_t QuietBFloat16NaNFromFloat(uint32_t x) { return static_cast<uint16_t>((x >> 16) | 0x40u); }

// Round-to-nearest-even into a 16-bit format, by table lookup. `values[k]` is the value of the
// positive encoding k for every finite k, followed by one more entry, 2^(emax+1), standing for the
// infinity encoding: IEEE rounds to infinity exactly when the value would round to 2^(emax+1) with
// an unbounded exponent. Adjacent encodings of a format are adjacent values, so the answer is the
// lower or upper neighbour of |x| in the table; 2|x| and lo + hi are exact in double, so the
// comparison decides the tie exactly.
class NearestEvenReference {
 public:
  explicit NearestEvenReference(std::vector<double> values) : values_(std::move(values)) {}

  // REQUIRES: f is not NaN.
  uint16_t Round(float f) const {
    const uint16_t sign = (std::bit_cast<uint32_t>(f) & 0x80000000u) ? 0x8000u : 0;
    const double a = std::fabs(static_cast<double>(f));
    const size_t inf_code = values_.size() - 1;
    if (a >= values_.back()) return static_cast<uint16_t>(sign | inf_code);
    const size_t k = static_cast<size_t>(std::upper_bound(values_.begin(), values_.end(), a) -
                                         values_.begin() - 1);
    const double twice = 2 * a;
    const double sum = values_[k] + values_[k + 1];
    size_t code;
    if (twice < sum) {
      code = k;
    } else if (twice > sum) {
      code = k + 1;
    } else {
      code = (k % 2 == 0) ? k : k + 1;
    }
    return static_cast<uint16_t>(sign | code);
  }

  const std::vector<double>& values() const { return values_; }

 private:
  std::vector<double> values_;
};

const NearestEvenReference& HalfReference() {
  static const NearestEvenReference* const ref = [] {
    std::vector<double> values;
    for (uint32_t k = 0; k < 0x7c00u; ++k) values.push_back(RefHalfValue(static_cast<uint16_t>(k)));
    values.push_back(65536.0);  // 2^16 where 0x7c00 (Inf) would be.
    return new NearestEvenReference(std::move(values));
  }();
  return *ref;
}

const NearestEvenReference& BFloat16Reference() {
  static const NearestEvenReference* const ref = [] {
    std::vector<double> values;
    for (uint32_t k = 0; k < 0x7f80u; ++k) {
      values.push_back(RefBFloat16Value(static_cast<uint16_t>(k)));
    }
    values.push_back(std::ldexp(1.0, 128));  // Where 0x7f80 (Inf) would be.
    return new NearestEvenReference(std::move(values));
  }();
  return *ref;
}

uint16_t ExpectedHalf(float f) {
  return std::isnan(f) ? QuietHalfNaNFromFloat(std::bit_cast<uint32_t>(f)) : HalfReference().Round(f);
}
uint16_t ExpectedBFloat16(float f) {
  return std::isnan(f) ? QuietBFloat16NaNFromFloat(std::bit_cast<uint32_t>(f)) : BFloat16Reference().Round(f);
}

// ---------------------------------------------------------------------------------------------
// DType and Device basics.

TEST(DTypeTest, SizeOf) {
  EXPECT_EQ(SizeOf(DType::kF32), 4);
  EXPECT_EQ(SizeOf(DType::kF16), 2);
  EXPECT_EQ(SizeOf(DType::kBF16), 2);
  static_assert(SizeOf(DType::kF32) == sizeof(float));
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_THAT(ParseDType(DTypeName(d)), IsOkAndHolds(d)) << DTypeName(d);
  }
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
}

TEST(DTypeTest, ParseAcceptsCommonSpellings) {
  for (const char* name : {"f32", "fp32", "float32", "float", "F32", "Float"}) {
    EXPECT_THAT(ParseDType(name), IsOkAndHolds(DType::kF32)) << name;
  }
  for (const char* name : {"f16", "fp16", "float16", "half", "FP16", "Half"}) {
    EXPECT_THAT(ParseDType(name), IsOkAndHolds(DType::kF16)) << name;
  }
  for (const char* name : {"bf16", "bfloat16", "BF16", "BFloat16"}) {
    EXPECT_THAT(ParseDType(name), IsOkAndHolds(DType::kBF16)) << name;
  }
}

TEST(DTypeTest, ParseRejectsUnknownNamesWithTheValidOnes) {
  for (const char* name : {"", "f64", "int8", "bf32", " f16"}) {
    EXPECT_THAT(ParseDType(name),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("f32, f16 or bf16")))
        << name;
  }
}

TEST(DTypeTest, Streams) {
  std::ostringstream os;
  os << DType::kF32 << " " << DType::kF16 << " " << DType::kBF16;
  EXPECT_EQ(os.str(), "f32 f16 bf16");
}

TEST(DeviceTest, Basics) {
  constexpr Device host = Device::Host();
  constexpr Device acc = Device::Accelerator(2);
  static_assert(host.is_host() && !host.is_accelerator());
  static_assert(acc.is_accelerator() && !acc.is_host());
  EXPECT_EQ(Device{}, host);
  EXPECT_EQ(Device::Accelerator(), Device::Accelerator(0));
  EXPECT_NE(acc, Device::Accelerator(1));
  EXPECT_NE(host, Device::Accelerator(0));
  EXPECT_EQ(host.ToString(), "host");
  EXPECT_EQ(acc.ToString(), "accelerator:2");
  std::ostringstream os;
  os << acc;
  EXPECT_EQ(os.str(), "accelerator:2");
}

// ---------------------------------------------------------------------------------------------
// The references themselves, spot-checked against known values.

TEST(ReferenceTest, KnownValues) {
  EXPECT_EQ(RefHalfValue(0x3c00), 1.0);
  EXPECT_EQ(RefHalfValue(0x7bff), 65504.0);
  EXPECT_EQ(RefHalfValue(0x0400), std::ldexp(1.0, -14));
  EXPECT_EQ(RefHalfValue(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(RefHalfValue(0xc000), -2.0);
  EXPECT_EQ(RefBFloat16Value(0x3f80), 1.0);
  EXPECT_EQ(RefBFloat16Value(0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(RefBFloat16Value(0x7f7f), static_cast<double>(std::bit_cast<float>(0x7f7f0000u)));
  EXPECT_EQ(HalfReference().Round(1.0f), 0x3c00);
  EXPECT_EQ(HalfReference().Round(-65520.0f), 0xfc00);
  EXPECT_EQ(BFloat16Reference().Round(1.0f), 0x3f80);
}

// ---------------------------------------------------------------------------------------------
// Decoding: every pattern.

TEST(HalfBitsToFloatTest, EveryPatternMatchesFieldReference) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu && failures < kMaxReportedFailures; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint32_t got = std::bit_cast<uint32_t>(HalfBitsToFloat(h));
    const uint32_t want =
        IsF16NaN(h)
            ? ((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13))
            : std::bit_cast<uint32_t>(static_cast<float>(RefHalfValue(h)));
    if (got != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "f16 0x" << h << ": got 0x" << got << ", want 0x" << want;
    }
  }
}

TEST(HalfBitsToFloatTest, EveryPatternMatchesF16c) {
  if (!HaveF16c()) GTEST_SKIP() << "CPU has no F16C";
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu && failures < kMaxReportedFailures; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint32_t got = std::bit_cast<uint32_t>(HalfBitsToFloat(h));
    const uint32_t want = std::bit_cast<uint32_t>(F16cHalfToFloat(h));
    if (got != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "f16 0x" << h << ": got 0x" << got << ", F16C 0x" << want;
    }
  }
}

TEST(BFloat16BitsToFloatTest, EveryPatternMatchesFieldReference) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu && failures < kMaxReportedFailures; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const uint32_t got = std::bit_cast<uint32_t>(BFloat16BitsToFloat(b));
    const uint32_t want = IsBF16NaN(b) ? ((static_cast<uint32_t>(b) << 16) | 0x00400000u)
                                       : std::bit_cast<uint32_t>(static_cast<float>(RefBFloat16Value(b)));
    if (got != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "bf16 0x" << b << ": got 0x" << got << ", want 0x" << want;
    }
  }
}

// Narrowing a widened value gives back the pattern: exact for every non-NaN, and a NaN comes back
// as the same NaN with the quiet bit set.
TEST(RoundTripTest, EveryHalfPattern) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu && failures < kMaxReportedFailures; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t want = IsF16NaN(h) ? static_cast<uint16_t>(h | 0x0200u) : h;
    const uint16_t got = FloatToHalfBits(HalfBitsToFloat(h));
    if (got != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "f16 0x" << h << " round-trips to 0x" << got;
    }
  }
}

TEST(RoundTripTest, EveryBFloat16Pattern) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu && failures < kMaxReportedFailures; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const uint16_t want = IsBF16NaN(b) ? static_cast<uint16_t>(b | 0x0040u) : b;
    const uint16_t got = FloatToBFloat16Bits(BFloat16BitsToFloat(b));
    if (got != want) {
      ++failures;
      ADD_FAILURE() << std::hex << "bf16 0x" << b << " round-trips to 0x" << got;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rounding: every tie between adjacent 16-bit values, and the floats right next to it.

// For each pair of adjacent positive encodings (k, k + 1) of a format, including the largest
// finite one and infinity, checks both signs of: the exact lower value, the midpoint (a tie: goes
// to the even encoding), and the floats one ulp below and above the midpoint.
template <typename Convert>
void CheckEveryTie(const NearestEvenReference& ref, Convert convert, bool also_f16c) {
  const std::vector<double>& values = ref.values();
  int failures = 0;
  auto check = [&](float f, uint16_t want) {
    for (float signed_f : {f, -f}) {
      const uint16_t signed_want =
          static_cast<uint16_t>(want | (std::signbit(signed_f) ? 0x8000u : 0u));
      const uint16_t got = convert(signed_f);
      if (got != signed_want) {
        ++failures;
        ADD_FAILURE() << std::hex << "f32 0x" << std::bit_cast<uint32_t>(signed_f) << " (" << signed_f << "): got 0x"
                      << got << ", want 0x" << signed_want;
      }
      if (also_f16c && F16cFloatToHalf(signed_f) != signed_want) {
        ++failures;
        ADD_FAILURE() << std::hex << "reference disagrees with F16C on f32 0x" << std::bit_cast<uint32_t>(signed_f);
      }
    }
  };
  for (size_t k = 0; k + 1 < values.size() && failures < kMaxReportedFailures; ++k) {
    const uint16_t lo = static_cast<uint16_t>(k);
    const uint16_t hi = static_cast<uint16_t>(k + 1);
    const uint16_t even = (k % 2 == 0) ? lo : hi;
    check(static_cast<float>(values[k]), lo);
    const double mid = (values[k] + values[k + 1]) / 2;
    const float mid_f = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(mid_f), mid) << "midpoint not representable, k=" << k;
    check(mid_f, even);
    check(std::nextafter(mid_f, 0.0f), lo);
    check(std::nextafter(mid_f, std::numeric_limits<float>::infinity()), hi);
  }
}

TEST(FloatToHalfBitsTest, EveryTieAndItsNeighbours) {
  CheckEveryTie(
      HalfReference(), [](float f) { return FloatToHalfBits(f); }, HaveF16c());
}

TEST(FloatToBFloat16BitsTest, EveryTieAndItsNeighbours) {
  CheckEveryTie(
      BFloat16Reference(), [](float f) { return FloatToBFloat16Bits(f); }, false);
}

// ---------------------------------------------------------------------------------------------
// Named boundary cases, with the expected bits written out.

struct Case {
  uint32_t f32;
  uint16_t want;
  const char* what;
};

TEST(FloatToHalfBitsTest, NamedCases) {
  const Case cases[] = {
      {0x00000000u, 0x0000u, "+0"},
      {0x80000000u, 0x8000u, "-0"},
      {0x00000001u, 0x0000u, "smallest f32 subnormal"},
      {0x80000001u, 0x8000u, "-smallest f32 subnormal"},
      {0x007fffffu, 0x0000u, "largest f32 subnormal"},
      {0x00800000u, 0x0000u, "smallest f32 normal"},
      {0x32ffffffu, 0x0000u, "just below 2^-25"},
      {0x33000000u, 0x0000u, "2^-25: tie between 0 and 2^-24, to even 0"},
      {0xb3000000u, 0x8000u, "-2^-25: to -0"},
      {0x33000001u, 0x0001u, "just above 2^-25"},
      {0x33800000u, 0x0001u, "2^-24: smallest f16 subnormal"},
      {0x33c00000u, 0x0002u, "1.5 * 2^-24: tie, to even 2"},
      {0x34200000u, 0x0002u, "2.5 * 2^-24: tie, to even 2"},
      {0x387fc000u, 0x03ffu, "largest f16 subnormal"},
      {0x387fdfffu, 0x03ffu, "just below the tie under 2^-14"},
      {0x387fe000u, 0x0400u, "tie between largest subnormal and 2^-14, to even"},
      {0x38800000u, 0x0400u, "2^-14: smallest f16 normal"},
      {0x3f800000u, 0x3c00u, "1"},
      {0x3f801000u, 0x3c00u, "1 + 2^-11: tie, to even"},
      {0x3f801001u, 0x3c01u, "just above 1 + 2^-11"},
      {0x3f803000u, 0x3c02u, "1 + 3 * 2^-11: tie, to even"},
      {0x3f7fffffu, 0x3c00u, "just below 1: carries into the exponent"},
      {0x45001000u, 0x6800u, "2049: tie, to even 2048"},
      {0x477fe000u, 0x7bffu, "65504: largest f16"},
      {0x477fefffu, 0x7bffu, "just below 65520"},
      {0x477ff000u, 0x7c00u, "65520: tie between 65504 and 2^16, to Inf"},
      {0xc77ff000u, 0xfc00u, "-65520: to -Inf"},
      {0x47800000u, 0x7c00u, "65536"},
      {0x7f7fffffu, 0x7c00u, "largest f32"},
      {0xff7fffffu, 0xfc00u, "-largest f32"},
      {0x7f800000u, 0x7c00u, "+Inf"},
      {0xff800000u, 0xfc00u, "-Inf"},
      {0x7fc00000u, 0x7e00u, "canonical quiet NaN"},
      {0xffc00000u, 0xfe00u, "negative quiet NaN"},
      {0x7f800001u, 0x7e00u, "signaling NaN whose payload is all below bit 13: quiet, not Inf"},
      {0xff800001u, 0xfe00u, "negative signaling NaN, low payload"},
      {0x7fa00000u, 0x7f00u, "signaling NaN, payload in the kept bits"},
      {0x7f802000u, 0x7e01u, "signaling NaN, lowest kept payload bit"},
      {0xffc02000u, 0xfe01u, "negative quiet NaN with payload"},
      {0x7fffffffu, 0x7fffu, "all-ones NaN"},
  };
  for (const Case& c : cases) {
    const float f = std::bit_cast<float>(c.f32);
    EXPECT_EQ(FloatToHalfBits(f), c.want) << c.what << std::hex << " (f32 0x" << c.f32 << ")";
    EXPECT_EQ(ExpectedHalf(f), c.want) << "reference: " << c.what;
    if (HaveF16c()) {
      EXPECT_EQ(F16cFloatToHalf(f), c.want) << "F16C: " << c.what;
    }
  }
}

TEST(FloatToBFloat16BitsTest, NamedCases) {
  const Case cases[] = {
      {0x00000000u, 0x0000u, "+0"},
      {0x80000000u, 0x8000u, "-0"},
      {0x00000001u, 0x0000u, "smallest f32 subnormal"},
      {0x00008000u, 0x0000u, "tie between 0 and the smallest bf16 subnormal, to even 0"},
      {0x00008001u, 0x0001u, "just above that tie"},
      {0x00018000u, 0x0002u, "tie between subnormals 1 and 2, to even"},
      {0x007fffffu, 0x0080u, "largest f32 subnormal rounds up to the smallest normal"},
      {0x3f800000u, 0x3f80u, "1"},
      {0x3f807fffu, 0x3f80u, "just below 1 + 2^-8"},
      {0x3f808000u, 0x3f80u, "1 + 2^-8: tie, to even"},
      {0x3f808001u, 0x3f81u, "just above 1 + 2^-8"},
      {0x3f818000u, 0x3f82u, "1 + 3 * 2^-8: tie, to even"},
      {0xbf818000u, 0xbf82u, "-(1 + 3 * 2^-8)"},
      {0x3f7fffffu, 0x3f80u, "just below 1: carries into the exponent"},
      {0x7f7f7fffu, 0x7f7fu, "just below the overflow tie"},
      {0x7f7f8000u, 0x7f80u, "tie between the largest bf16 and 2^128, to Inf"},
      {0x7f7fffffu, 0x7f80u, "largest f32"},
      {0xff7fffffu, 0xff80u, "-largest f32"},
      {0x7f800000u, 0x7f80u, "+Inf"},
      {0xff800000u, 0xff80u, "-Inf"},
      {0x7fc00000u, 0x7fc0u, "canonical quiet NaN"},
      {0x7f800001u, 0x7fc0u, "signaling NaN whose payload is all below bit 16: quiet, not Inf"},
      {0xff810000u, 0xffc1u, "negative signaling NaN with payload"},
      {0x7fffffffu, 0x7fffu, "all-ones NaN: must not carry into the sign"},
      {0xffffffffu, 0xffffu, "negative all-ones NaN"},
  };
  for (const Case& c : cases) {
    const float f = std::bit_cast<float>(c.f32);
    EXPECT_EQ(FloatToBFloat16Bits(f), c.want) << c.what << std::hex << " (f32 0x" << c.f32 << ")";
    EXPECT_EQ(ExpectedBFloat16(f), c.want) << "reference: " << c.what;
  }
}

TEST(WideningTest, NamedNaNCases) {
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfBitsToFloat(0x7c01u)), 0x7fc02000u);  // signaling -> quiet, payload kept
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfBitsToFloat(0xfd55u)), 0xffeaa000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfBitsToFloat(0x7e00u)), 0x7fc00000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfBitsToFloat(0x7c00u)), 0x7f800000u);  // Inf stays Inf
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfBitsToFloat(0xfc00u)), 0xff800000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(BFloat16BitsToFloat(0x7f81u)), 0x7fc10000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(BFloat16BitsToFloat(0xffffu)), 0xffff0000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(BFloat16BitsToFloat(0x7f80u)), 0x7f800000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(BFloat16BitsToFloat(0x0001u)), 0x00010000u);  // bf16 subnormal stays subnormal
}

// ---------------------------------------------------------------------------------------------
// Random f32 bit patterns: every class (NaNs, subnormals, huge values) appears in proportion to
// its share of the encoding space; a second stream is drawn from the exponents where f16 rounding
// is non-trivial (2^-27 .. 2^17).

TEST(RandomTest, MatchesReferences) {
  constexpr int kUniform = 7'000'000;
  constexpr int kHalfRange = 3'000'000;
  std::mt19937 rng(20240601);
  const bool f16c = HaveF16c();
  int failures = 0;
  auto check = [&](uint32_t x) {
    const float f = std::bit_cast<float>(x);
    const uint16_t h = FloatToHalfBits(f);
    const uint16_t b = FloatToBFloat16Bits(f);
    if (h != ExpectedHalf(f) || (f16c && h != F16cFloatToHalf(f))) {
      ++failures;
      ADD_FAILURE() << std::hex << "f16 of f32 0x" << x << ": got 0x" << h << ", reference 0x"
                    << ExpectedHalf(f);
    }
    if (b != ExpectedBFloat16(f)) {
      ++failures;
      ADD_FAILURE() << std::hex << "bf16 of f32 0x" << x << ": got 0x" << b << ", reference 0x"
                    << ExpectedBFloat16(f);
    }
  };
  for (int i = 0; i < kUniform && failures < kMaxReportedFailures; ++i) check(rng());
  std::uniform_int_distribution<uint32_t> exponent(100, 144);
  for (int i = 0; i < kHalfRange && failures < kMaxReportedFailures; ++i) {
    const uint32_t x = rng();
    check((x & 0x807fffffu) | (exponent(rng) << 23));
  }
}

}  // namespace
}  // namespace ps
