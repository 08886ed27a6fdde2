// Tests for model/finite_scan.h: FindFirstNonFinite against a reference that converts every
// element to float (memory/dtype_math.h) and asks std::isfinite, on every Highway target this CPU
// supports (hwy::TestWithParamTarget), over awkward lengths, every byte misalignment 0..3, and
// the bit patterns next to the boundary (largest finite values, subnormals, -0, every Inf/NaN
// class).
#include "model/finite_scan.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "base/testing/test_rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"
#include "memory/dtype.h"
#include "memory/dtype_math.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The element as float, from its bits: the independent reference.
float ToFloat(DType dtype, const std::vector<uint8_t>& bytes, size_t offset, size_t i) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, bytes.data() + offset + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + offset + 2 * i, 2);
  return dtype == DType::kF16 ? HalfBitsToFloat(h) : BFloat16BitsToFloat(h);
}

int64_t Reference(DType dtype, const std::vector<uint8_t>& bytes, size_t offset, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(ToFloat(dtype, bytes, offset, i))) return static_cast<int64_t>(i);
  }
  return -1;
}

// Finite patterns at the edges of each format, and every kind of non-finite one.
std::vector<uint32_t> FinitePatterns(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u,
              0x3f800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f000000u, 0x807fffffu};
    case DType::kF16:
      return {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0xfbff, 0x7800, 0x83ff};
    case DType::kBF16:
      return {0x0000, 0x8000, 0x0001, 0x007f, 0x0080, 0x3f80, 0x7f7f, 0xff7f, 0x7f00, 0x807f};
  }
  return {};
}
std::vector<uint32_t> NonFinitePatterns(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fbfffffu};
    case DType::kF16:
      return {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff, 0x7dff};
    case DType::kBF16:
      return {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff, 0x7fbf};
  }
  return {};
}

void Put(DType dtype, std::vector<uint8_t>& bytes, size_t offset, size_t i, uint32_t bits) {
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data() + offset + 4 * i, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(bytes.data() + offset + 2 * i, &h, 2);
  }
}

class FiniteScanTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(FiniteScanTest);

TEST_P(FiniteScanTest, DispatchesToTheTargetUnderTest) {
  EXPECT_STREQ(FiniteScanTargetName(), hwy::TargetName(GetParam()));
}

// Random finite data with 0, 1 or 2 non-finite elements planted at random places, every length up
// to 300 and a few long ones, at byte offsets 0..3.
TEST_P(FiniteScanTest, FindsTheFirstNonFiniteElementLikeTheReference) {
  TestRng rng(7);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {1023, 1024, 1025, 4099, 65537}) lengths.push_back(n);
  int failures = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::vector<uint32_t> finite = FinitePatterns(dtype);
    const std::vector<uint32_t> bad = NonFinitePatterns(dtype);
    const size_t width = static_cast<size_t>(SizeOf(dtype));
    for (size_t n : lengths) {
      for (size_t offset = 0; offset < 4; ++offset) {
        if (n > 300 && offset == 2) continue;
        std::vector<uint8_t> bytes(offset + n * width + 3);
        for (size_t i = 0; i < n; ++i) Put(dtype, bytes, offset, i, finite[rng() % finite.size()]);
        const int planted = n == 0 ? 0 : static_cast<int>(rng() % 3);
        for (int p = 0; p < planted; ++p) {
          Put(dtype, bytes, offset, rng() % n, bad[rng() % bad.size()]);
        }
        // Garbage after the end must not be seen.
        for (size_t b = offset + n * width; b < bytes.size(); ++b) bytes[b] = 0xff;
        const int64_t want = Reference(dtype, bytes, offset, n);
        const int64_t got =
            FindFirstNonFinite(dtype, bytes.data() + offset, static_cast<int64_t>(n));
        if (got != want && failures++ < 10) {
          ADD_FAILURE() << DTypeName(dtype) << " n=" << n << " offset=" << offset << ": got " << got
                        << ", want " << want;
        }
      }
    }
  }
}

TEST_P(FiniteScanTest, EveryPositionOfALongArrayIsSeen) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const size_t n = 257;
    const size_t width = static_cast<size_t>(SizeOf(dtype));
    std::vector<uint8_t> bytes(n * width + 1, 0);
    for (size_t pos = 0; pos < n; ++pos) {
      std::fill(bytes.begin(), bytes.end(), 0);
      Put(dtype, bytes, 1, pos, NonFinitePatterns(dtype)[pos % 6]);
      EXPECT_EQ(FindFirstNonFinite(dtype, bytes.data() + 1, static_cast<int64_t>(n)),
                static_cast<int64_t>(pos))
          << DTypeName(dtype);
    }
  }
}

TEST(FiniteScan, NamesTheKindAndTheCoordinates) {
  const std::vector<float> v = {1.0f, -INFINITY, NAN, INFINITY};
  EXPECT_EQ(NonFiniteKind(DType::kF32, v.data(), 1), "-Inf");
  EXPECT_EQ(NonFiniteKind(DType::kF32, v.data(), 2), "NaN");
  EXPECT_EQ(NonFiniteKind(DType::kF32, v.data(), 3), "+Inf");
  const uint16_t h[] = {0xfc00, 0x7e00};
  EXPECT_EQ(NonFiniteKind(DType::kF16, h, 0), "-Inf");
  EXPECT_EQ(NonFiniteKind(DType::kF16, h, 1), "NaN");
  EXPECT_EQ(ElementCoordinates({4, 100}, 317), "[3, 17]");
  EXPECT_EQ(ElementCoordinates({2, 3, 4}, 23), "[1, 2, 3]");
  EXPECT_EQ(ElementCoordinates({}, 0), "[]");
  EXPECT_EQ(ElementCoordinates({7}, 6), "[6]");
}

TEST(FiniteScan, CheckTensorFiniteNamesTheTensorAndTheElement) {
  std::vector<float> v(4 * 100, 0.5f);
  EXPECT_OK(CheckTensorFinite("file 'a'", "w", DType::kF32, {4, 100}, v.data(), 400));
  v[317] = NAN;
  v[399] = INFINITY;
  EXPECT_THAT(CheckTensorFinite("file 'a.safetensors'", "h.0.mlp.c_fc.weight", DType::kF32,
                                {4, 100}, v.data(), 400),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("a.safetensors"), HasSubstr("'h.0.mlp.c_fc.weight'"),
                             HasSubstr("NaN at [3, 17]"), HasSubstr("element 317 of 400"))));
  EXPECT_OK(CheckTensorFinite("file", "empty", DType::kF32, {0, 5}, v.data(), 0));
}

}  // namespace
}  // namespace ps
