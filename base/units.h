// Byte quantities: constants, alignment arithmetic, and human-readable formatting and parsing.
//
// Convention (STYLE.md rule 6): every variable that could hold either bytes or elements carries a
// `_bytes` or `_elems` suffix. Quantities are int64_t so that sizes above 4 GiB and differences
// are safe.
#ifndef PATRICKSTAR_BASE_UNITS_H_
#define PATRICKSTAR_BASE_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// Rounds `value` up to a multiple of `alignment`. REQUIRES: alignment > 0, value >= 0.
constexpr int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// ceil(a / b). REQUIRES: a >= 0, b > 0.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// "0 B", "512 B", "1.50 KiB", "3.00 GiB": binary units with two decimals.
std::string FormatBytes(int64_t bytes);

// Parses a byte quantity as a person writes it in a config or flag: a plain integer ("1048576"),
// or a number with a unit: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024),
// case-insensitive, optional space ("1.5 GiB", "512MiB", "2gb"). Returns InvalidArgument for
// anything else, negative values, or values that overflow int64.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

}  // namespace ps

#endif  // PATRICKSTAR_BASE_UNITS_H_
