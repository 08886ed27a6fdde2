// Tests for memory/convert.h: every bulk conversion must give exactly the bits of the scalar
// functions in memory/dtype_math.h (themselves tested exhaustively in dtype_test.cc), on every
// Highway target this CPU supports. The TEST_P suites run once per target (AVX3, AVX2, SSE4,
// SSSE3, SCALAR, ... as available), selected with hwy::SetSupportedTargetsForTest by
// hwy::TestWithParamTarget.
#include "memory/convert.h"

#include <cfenv>
#include <cmath>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"
#include "memory/dtype_math.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define PS_TEST_X86 1
#else
#define PS_TEST_X86 0
#endif

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr int kMaxReportedFailures = 10;

// f32 patterns where conversions go wrong if they go wrong at all.
const std::vector<uint32_t>& SpecialF32() {
  static const std::vector<uint32_t>* const v = new std::vector<uint32_t>{
      0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,  // zeros, f32 subnormals
      0x33000000u, 0x33000001u, 0xb3800000u, 0x33c00000u, 0x387fe000u,  // f16 subnormal edges
      0x387fdfffu, 0x38800000u, 0x3f801000u, 0x3f803000u, 0x3f7fffffu,  // f16 ties and carries
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u, 0x47800000u,  // f16 overflow edges
      0x3f808000u, 0x3f818000u, 0x7f7f7fffu, 0x7f7f8000u, 0x007fffffu,  // bf16 ties and carries
      0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,               // max finite, Inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u,  // NaNs with payloads
      0x7f802000u, 0x7fffffffu, 0xffffffffu, 0x7f810000u, 0xff808000u,
  };
  return *v;
}

// f16 and bf16 patterns worth sprinkling: zeros, subnormals, Inf, quiet and signaling NaNs.
const std::vector<uint16_t>& Special16() {
  static const std::vector<uint16_t>* const v = new std::vector<uint16_t>{
      0x0000u, 0x8000u, 0x0001u, 0x83ffu, 0x0400u, 0x7bffu, 0x7c00u, 0xfc00u, 0x7c01u, 0x7e00u,
      0xfd55u, 0x7fffu, 0x0080u, 0x007fu, 0x7f7fu, 0x7f80u, 0xff80u, 0x7f81u, 0x7fc0u, 0xffffu,
  };
  return *v;
}

// Random bit patterns with every 7th element replaced by a special value.
std::vector<float> MakeF32Input(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  const auto& specials = SpecialF32();
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::bit_cast<float>(
        i % 7 == 3 ? specials[(i / 7) % specials.size()] : static_cast<uint32_t>(rng()));
  }
  return v;
}

std::vector<uint16_t> Make16Input(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  const auto& specials = Special16();
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<uint16_t>(i % 7 == 3 ? specials[(i / 7) % specials.size()] : rng());
  }
  return v;
}

// Converts with `bulk` from src + src_off into dst + dst_off (both counted in elements), and checks
// every element against `scalar` and that no element outside [dst_off, dst_off + n) was written.
// The source is copied into a buffer that ends exactly after the n elements, so that ASan reports
// any read past the end.
template <typename Src, typename Dst, typename Bulk, typename Scalar>
void CheckBulkMatchesScalar(const std::vector<Src>& all_src, size_t src_off, size_t dst_off,
                            size_t n, Bulk bulk, Scalar scalar, int* failures) {
  const std::vector<Src> src(all_src.begin(), all_src.begin() + src_off + n);
  constexpr size_t kGuard = 8;
  std::vector<Dst> dst(dst_off + n + kGuard);
  std::memset(dst.data(), 0xa5, dst.size() * sizeof(Dst));
  std::vector<Dst> want = dst;
  for (size_t i = 0; i < n; ++i) want[dst_off + i] = scalar(src[src_off + i]);
  bulk(src.data() + src_off, dst.data() + dst_off, static_cast<int64_t>(n));
  if (std::memcmp(dst.data(), want.data(), dst.size() * sizeof(Dst)) == 0) return;
  for (size_t i = 0; i < dst.size() && *failures < kMaxReportedFailures; ++i) {
    if (std::memcmp(&dst[i], &want[i], sizeof(Dst)) != 0) {
      ++*failures;
      uint32_t got_bits = 0, want_bits = 0, src_bits = 0;
      std::memcpy(&got_bits, &dst[i], sizeof(Dst));
      std::memcpy(&want_bits, &want[i], sizeof(Dst));
      const bool in_range = i >= dst_off && i < dst_off + n;
      if (in_range) std::memcpy(&src_bits, &src[src_off + (i - dst_off)], sizeof(Src));
      ADD_FAILURE() << std::hex << (in_range ? "" : "wrote outside the range: ") << "n=" << std::dec
                    << n << " src_off=" << src_off << " dst_off=" << dst_off << " index "
                    << (static_cast<int64_t>(i) - static_cast<int64_t>(dst_off)) << std::hex
                    << ": src 0x" << src_bits << ", got 0x" << got_bits << ", want 0x" << want_bits;
    }
  }
}

uint16_t ScalarF32ToF16(float f) { return FloatToHalfBits(f); }
uint16_t ScalarF32ToBF16(float f) { return FloatToBFloat16Bits(f); }
float ScalarF16ToF32(uint16_t h) { return HalfBitsToFloat(h); }
float ScalarBF16ToF32(uint16_t b) { return BFloat16BitsToFloat(b); }

// Lengths: every one from 0 to 130 (covers tails for every vector width up to 512 bits, several
// times), then larger and odd ones.
std::vector<size_t> Lengths() {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 130; ++n) lengths.push_back(n);
  for (size_t n : {255, 256, 257, 1000, 4095, 4096, 4097, 100003}) lengths.push_back(n);
  return lengths;
}

// Runs one conversion over all lengths and all src/dst offsets 0..3 elements (fewer offset pairs
// for the long lengths, to keep the test quick).
template <typename Src, typename Dst, typename Bulk, typename Scalar>
void SweepLengthsAndOffsets(const std::vector<Src>& src, Bulk bulk, Scalar scalar) {
  int failures = 0;
  for (size_t n : Lengths()) {
    for (size_t src_off = 0; src_off <= 3; ++src_off) {
      for (size_t dst_off = 0; dst_off <= 3; ++dst_off) {
        if (n > 300 && src_off != dst_off && src_off + dst_off != 3) continue;
        CheckBulkMatchesScalar<Src, Dst>(src, src_off, dst_off, n, bulk, scalar, &failures);
        if (failures >= kMaxReportedFailures) return;
      }
    }
  }
}

constexpr size_t kMaxInput = 100003 + 3;

class ConvertTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(ConvertTest);

TEST_P(ConvertTest, DispatchesToTheTargetUnderTest) {
  EXPECT_STREQ(ConvertTargetName(), hwy::TargetName(GetParam()));
}

TEST_P(ConvertTest, F32ToF16MatchesScalar) {
  SweepLengthsAndOffsets<float, uint16_t>(MakeF32Input(kMaxInput, 1), ConvertF32ToF16,
                                          ScalarF32ToF16);
}

TEST_P(ConvertTest, F32ToBF16MatchesScalar) {
  SweepLengthsAndOffsets<float, uint16_t>(MakeF32Input(kMaxInput, 2), ConvertF32ToBF16,
                                          ScalarF32ToBF16);
}

TEST_P(ConvertTest, F16ToF32MatchesScalar) {
  SweepLengthsAndOffsets<uint16_t, float>(Make16Input(kMaxInput, 3), ConvertF16ToF32,
                                          ScalarF16ToF32);
}

TEST_P(ConvertTest, BF16ToF32MatchesScalar) {
  SweepLengthsAndOffsets<uint16_t, float>(Make16Input(kMaxInput, 4), ConvertBF16ToF32,
                                          ScalarBF16ToF32);
}

// The hard cases of narrowing: for every finite positive 16-bit value, the value itself, the tie
// with its successor and the floats either side of the tie, both signs. `inf_value` is where the
// infinity encoding would sit if the exponent were unbounded (2^(emax+1)).
std::vector<float> NarrowingHardCases(float (*widen)(uint16_t), uint32_t inf_code,
                                      double inf_value) {
  std::vector<float> v;
  for (uint32_t k = 0; k < inf_code; ++k) {
    const double lo = widen(static_cast<uint16_t>(k));
    const double hi = k + 1 < inf_code ? widen(static_cast<uint16_t>(k + 1)) : inf_value;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact
    for (float f : {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  return v;
}

// Every hard narrowing case and every widening pattern, through the vector paths.
void CheckHardCasesAndEveryPattern() {
  int failures = 0;
  static const std::vector<float>* const half_cases =
      new std::vector<float>(NarrowingHardCases(HalfBitsToFloat, 0x7c00u, 65536.0));
  static const std::vector<float>* const bf16_cases =
      new std::vector<float>(NarrowingHardCases(BFloat16BitsToFloat, 0x7f80u, 0x1p128));
  CheckBulkMatchesScalar<float, uint16_t>(*half_cases, 0, 0, half_cases->size(), ConvertF32ToF16,
                                          ScalarF32ToF16, &failures);
  CheckBulkMatchesScalar<float, uint16_t>(*bf16_cases, 0, 0, bf16_cases->size(), ConvertF32ToBF16,
                                          ScalarF32ToBF16, &failures);
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  CheckBulkMatchesScalar<uint16_t, float>(all, 0, 0, all.size(), ConvertF16ToF32, ScalarF16ToF32,
                                          &failures);
  CheckBulkMatchesScalar<uint16_t, float>(all, 0, 0, all.size(), ConvertBF16ToF32, ScalarBF16ToF32,
                                          &failures);
}

TEST_P(ConvertTest, HardCasesAndEveryPattern) { CheckHardCasesAndEveryPattern(); }

// Sets the most hostile floating-point environment for the duration of a scope: round toward
// zero, and on x86 also flush-to-zero and denormals-are-zero. The conversions must not notice:
// the scalar functions are integer-only, F16C takes its rounding mode from the instruction, and
// the few floating-point steps of the integer emulation are exact on normal numbers.
class HostileFloatingPointEnvironment {
 public:
  HostileFloatingPointEnvironment() {
    std::fegetenv(&saved_);
    std::fesetround(FE_TOWARDZERO);
#if PS_TEST_X86
    _mm_setcsr(_mm_getcsr() | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
#endif
  }
  ~HostileFloatingPointEnvironment() { std::fesetenv(&saved_); }

 private:
  std::fenv_t saved_;
};

TEST_P(ConvertTest, IndependentOfFloatingPointEnvironment) {
  // Build the inputs first: making them uses floating-point arithmetic.
  CheckHardCasesAndEveryPattern();
  const std::vector<float> src = MakeF32Input(1 << 16, 8);
  std::vector<uint16_t> f16(src.size()), bf16(src.size());
  {
    HostileFloatingPointEnvironment env;
    ConvertF32ToF16(src.data(), f16.data(), static_cast<int64_t>(src.size()));
    ConvertF32ToBF16(src.data(), bf16.data(), static_cast<int64_t>(src.size()));
    CheckHardCasesAndEveryPattern();
  }
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(f16[i], FloatToHalfBits(src[i])) << std::hex << "f32 0x" << std::bit_cast<uint32_t>(src[i]);
    ASSERT_EQ(bf16[i], FloatToBFloat16Bits(src[i])) << std::hex << "f32 0x" << std::bit_cast<uint32_t>(src[i]);
  }
}

// Convert() for all nine dtype pairs, against the scalar functions composed through f32. The
// length exceeds the f16 <-> bf16 staging buffer so the chunked path is exercised.
TEST_P(ConvertTest, ConvertAllPairs) {
  constexpr size_t kN = 10007;
  const std::vector<float> f32 = MakeF32Input(kN + 1, 5);
  const std::vector<uint16_t> u16 = Make16Input(kN + 1, 6);
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " + std::string(DTypeName(to)));
      // Source: one element past the start so it is misaligned.
      const void* src = from == DType::kF32 ? static_cast<const void*>(f32.data() + 1)
                                            : static_cast<const void*>(u16.data() + 1);
      // Destination: one element in, so it is element-aligned but not vector-aligned.
      const size_t width = SizeOf(to);
      std::vector<uint8_t> dst((kN + 1) * width);
      ASSERT_OK(Convert(from, src, to, dst.data() + width, kN));
      for (size_t i = 0; i < kN; ++i) {
        // The source element as f32 (exact: widening never rounds) ...
        float wide = 0.0f;
        uint16_t src16 = u16[1 + i];
        switch (from) {
          case DType::kF32:
            wide = f32[1 + i];
            break;
          case DType::kF16:
            wide = HalfBitsToFloat(src16);
            break;
          case DType::kBF16:
            wide = BFloat16BitsToFloat(src16);
            break;
        }
        // ... then narrowed once; identity copies the bits untouched.
        uint32_t want;
        if (from == to) {
          want = from == DType::kF32 ? std::bit_cast<uint32_t>(f32[1 + i]) : src16;
        } else if (to == DType::kF32) {
          want = std::bit_cast<uint32_t>(wide);
        } else if (to == DType::kF16) {
          want = FloatToHalfBits(wide);
        } else {
          want = FloatToBFloat16Bits(wide);
        }
        uint32_t got = 0;
        std::memcpy(&got, dst.data() + (1 + i) * width, width);
        if (got != want) {
          ADD_FAILURE() << std::hex << "element " << std::dec << i << std::hex << ": got 0x" << got
                        << ", want 0x" << want;
          return;
        }
      }
    }
  }
}

// Every f16 pattern to bf16 and every bf16 pattern to f16 through Convert().
TEST_P(ConvertTest, ConvertBetween16BitTypesEveryPattern) {
  std::vector<uint16_t> all(65536), out(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  ASSERT_OK(Convert(DType::kF16, all.data(), DType::kBF16, out.data(), 65536));
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(out[i], FloatToBFloat16Bits(HalfBitsToFloat(all[i]))) << std::hex << "f16 0x" << i;
  }
  ASSERT_OK(Convert(DType::kBF16, all.data(), DType::kF16, out.data(), 65536));
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(out[i], FloatToHalfBits(BFloat16BitsToFloat(all[i]))) << std::hex << "bf16 0x" << i;
  }
}

// Random f32 patterns in bulk on every target (dtype_test.cc checks the scalar functions on many
// more against an independent reference).
TEST_P(ConvertTest, RandomF32Patterns) {
  const std::vector<float> src = MakeF32Input(1 << 20, 7);
  int failures = 0;
  CheckBulkMatchesScalar<float, uint16_t>(src, 0, 0, src.size(), ConvertF32ToF16, ScalarF32ToF16,
                                          &failures);
  CheckBulkMatchesScalar<float, uint16_t>(src, 0, 0, src.size(), ConvertF32ToBF16, ScalarF32ToBF16,
                                          &failures);
}

// ---------------------------------------------------------------------------------------------
// Errors. These return before any dispatch, so they need not run per target.

TEST(ConvertErrorTest, NegativeLengthIsInvalidArgument) {
  float src[1] = {1.0f};
  uint16_t dst[1] = {0x1234u};
  EXPECT_THAT(Convert(DType::kF32, src, DType::kF16, dst, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n_elems")));
  EXPECT_EQ(dst[0], 0x1234u);
}

TEST(ConvertErrorTest, NullPointersAreInvalidArgument) {
  float src[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  uint16_t dst[4] = {};
  EXPECT_THAT(Convert(DType::kF32, nullptr, DType::kF16, dst, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null src")));
  EXPECT_THAT(Convert(DType::kF32, src, DType::kBF16, nullptr, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null dst")));
  EXPECT_THAT(Convert(DType::kF16, nullptr, DType::kF16, nullptr, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Nothing to convert: null is fine.
  EXPECT_OK(Convert(DType::kF32, nullptr, DType::kF16, nullptr, 0));
}

TEST(ConvertErrorTest, MisalignedElementsAreInvalidArgument) {
  alignas(8) uint8_t src[64] = {};
  alignas(8) uint8_t dst[64] = {};
  EXPECT_THAT(Convert(DType::kF32, src + 2, DType::kF16, dst, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("src")));
  EXPECT_THAT(Convert(DType::kF16, src, DType::kF32, dst + 2, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dst")));
  EXPECT_THAT(Convert(DType::kBF16, src + 1, DType::kF16, dst, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aligned")));
  // Element-aligned is enough.
  EXPECT_OK(Convert(DType::kF32, src + 4, DType::kBF16, dst + 2, 4));
}

TEST(ConvertErrorTest, UnknownDTypeIsInvalidArgument) {
  float src[1] = {1.0f};
  float dst[1] = {2.0f};
  EXPECT_THAT(Convert(static_cast<DType>(7), src, DType::kF32, dst, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown dtype")));
  EXPECT_THAT(Convert(DType::kF32, src, static_cast<DType>(3), dst, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown dtype")));
  EXPECT_EQ(dst[0], 2.0f);
}

TEST(ConvertErrorTest, NonPositiveLengthsAreNoOpsForTypedFunctions) {
  float f[1] = {1.0f};
  uint16_t h[1] = {0x1234u};
  ConvertF32ToF16(f, h, 0);
  ConvertF32ToBF16(f, h, -5);
  ConvertF16ToF32(h, f, 0);
  ConvertBF16ToF32(h, f, -1);
  EXPECT_EQ(h[0], 0x1234u);
  EXPECT_EQ(f[0], 1.0f);
}

TEST(ConvertTargetNameTest, NamesAHighwayTarget) {
  const std::string name = ConvertTargetName();
  EXPECT_FALSE(name.empty());
  EXPECT_NE(name, "Unknown");
}

}  // namespace
}  // namespace ps
