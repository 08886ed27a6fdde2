// Highway implementation of model/finite_scan.h, compiled once per SIMD target
// (hwy/foreach_target.h re-includes this file with HWY_TARGET set to each target;
// HWY_DYNAMIC_DISPATCH in the HWY_ONCE section picks one at run time), as in memory/convert.cc.
//
// An element is non-finite when (bits & E) == E, E being the exponent field: 0x7f800000 for f32,
// 0x7c00 for f16, 0x7f80 for bf16. Vectors are loaded as bytes (no alignment needed, no misaligned
// typed pointer) and reinterpreted as u32 or u16 lanes; four vectors share one branch, and only
// the block that holds a hit is rescanned element by element. The scalar target and the tails read
// each element with memcpy.
#include "model/finite_scan.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "memory/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/finite_scan.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#ifndef PATRICKSTAR_MODEL_FINITE_SCAN_SCALAR_
#define PATRICKSTAR_MODEL_FINITE_SCAN_SCALAR_
namespace ps::finite_scan_internal {

// Element i of a little-endian array of T at `bytes`.
template <typename T>
inline T LoadElement(const uint8_t* bytes, size_t i) {
  T v;
  std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
  return v;
}

// The first i in [begin, end) whose exponent bits are all ones, or -1.
template <typename T>
inline int64_t ScalarFind(const uint8_t* bytes, size_t begin, size_t end, T exponent) {
  for (size_t i = begin; i < end; ++i) {
    if ((LoadElement<T>(bytes, i) & exponent) == exponent) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace ps::finite_scan_internal
#endif  // PATRICKSTAR_MODEL_FINITE_SCAN_SCALAR_

HWY_BEFORE_NAMESPACE();
namespace ps {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
int64_t FindExponentAllOnes(const uint8_t* HWY_RESTRICT bytes, size_t n, T exponent) {
#if HWY_TARGET == HWY_SCALAR
  // One-lane vectors: a byte vector cannot be reinterpreted as a wider lane here.
  return finite_scan_internal::ScalarFind<T>(bytes, 0, n, exponent);
#else
  const hn::ScalableTag<T> d;
  const hn::Repartition<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const auto e = hn::Set(d, exponent);
  const auto bad = [&](size_t i) {
    const auto v = hn::BitCast(d, hn::LoadU(d8, bytes + i * sizeof(T)));
    return hn::Eq(hn::And(v, e), e);
  };
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto any =
        hn::Or(hn::Or(bad(i), bad(i + lanes)), hn::Or(bad(i + 2 * lanes), bad(i + 3 * lanes)));
    if (!hn::AllFalse(d, any)) {
      return finite_scan_internal::ScalarFind<T>(bytes, i, i + 4 * lanes, exponent);
    }
  }
  for (; i + lanes <= n; i += lanes) {
    const intptr_t first = hn::FindFirstTrue(d, bad(i));
    if (first >= 0) return static_cast<int64_t>(i) + first;
  }
  return finite_scan_internal::ScalarFind<T>(bytes, i, n, exponent);
#endif
}

int64_t FindFirstNonFiniteImpl(DType dtype, const uint8_t* bytes, size_t n) {
  switch (dtype) {
    case DType::kF32:
      return FindExponentAllOnes<uint32_t>(bytes, n, 0x7f800000u);
    case DType::kF16:
      return FindExponentAllOnes<uint16_t>(bytes, n, uint16_t{0x7c00});
    case DType::kBF16:
      return FindExponentAllOnes<uint16_t>(bytes, n, uint16_t{0x7f80});
  }
  return -1;
}

const char* FiniteScanTargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace ps
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ps {

HWY_EXPORT(FindFirstNonFiniteImpl);
HWY_EXPORT(FiniteScanTargetNameImpl);

int64_t FindFirstNonFinite(DType dtype, const void* data, int64_t num_elems) {
  if (num_elems <= 0) return -1;
  return HWY_DYNAMIC_DISPATCH(FindFirstNonFiniteImpl)(dtype, static_cast<const uint8_t*>(data),
                                                      static_cast<size_t>(num_elems));
}

std::string NonFiniteKind(DType dtype, const void* data, int64_t index) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t bits = 0;
  uint32_t mantissa_mask = 0;
  int sign_shift = 0;
  switch (dtype) {
    case DType::kF32:
      bits = finite_scan_internal::LoadElement<uint32_t>(bytes, static_cast<size_t>(index));
      mantissa_mask = 0x007fffffu;
      sign_shift = 31;
      break;
    case DType::kF16:
      bits = finite_scan_internal::LoadElement<uint16_t>(bytes, static_cast<size_t>(index));
      mantissa_mask = 0x03ffu;
      sign_shift = 15;
      break;
    case DType::kBF16:
      bits = finite_scan_internal::LoadElement<uint16_t>(bytes, static_cast<size_t>(index));
      mantissa_mask = 0x007fu;
      sign_shift = 15;
      break;
  }
  if ((bits & mantissa_mask) != 0) return "NaN";
  return (bits >> sign_shift) != 0 ? "-Inf" : "+Inf";
}

std::string ElementCoordinates(absl::Span<const int64_t> shape, int64_t index) {
  std::vector<int64_t> coords(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] <= 0) break;
    coords[d] = index % shape[d];
    index /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(coords, ", "), "]");
}

absl::Status CheckTensorFinite(absl::string_view where, absl::string_view name, DType dtype,
                               absl::Span<const int64_t> shape, const void* data,
                               int64_t num_elems) {
  const int64_t first = FindFirstNonFinite(dtype, data, num_elems);
  if (first < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      where, ": tensor '", name, "' holds ", NonFiniteKind(dtype, data, first), " at ",
      ElementCoordinates(shape, first), " (element ", first, " of ", num_elems, ", ",
      DTypeName(dtype),
      "); weights with Inf or NaN cannot be trained from (every step would be non-finite). "
      "Use the file from before the run diverged, or re-export the weights"));
}

const char* FiniteScanTargetName() { return HWY_DYNAMIC_DISPATCH(FiniteScanTargetNameImpl)(); }

}  // namespace ps
#endif  // HWY_ONCE
