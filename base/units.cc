#include "base/units.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ps {

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  const int64_t magnitude = bytes < 0 ? -bytes : bytes;
  if (magnitude < kKiB) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes) / kKiB;
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return absl::StrFormat("%.2f %s", v, units[u]);
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  const std::string original(text);
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  size_t split = 0;
  while (split < s.size() && (absl::ascii_isdigit(s[split]) || s[split] == '.' ||
                              s[split] == 'e' || s[split] == '+' || s[split] == '-')) {
    // 'e' belongs to the number only as an exponent, never as a unit's first letter (no unit
    // starts with e), so this greedy scan is safe.
    ++split;
  }
  std::string number = s.substr(0, split);
  std::string unit(absl::StripAsciiWhitespace(absl::string_view(s).substr(split)));
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "gb") {
    scale = 1e9;
  } else if (unit == "tb") {
    scale = 1e12;
  } else if (unit == "kib") {
    scale = static_cast<double>(kKiB);
  } else if (unit == "mib") {
    scale = static_cast<double>(kMiB);
  } else if (unit == "gib") {
    scale = static_cast<double>(kGiB);
  } else if (unit == "tib") {
    scale = static_cast<double>(kGiB) * 1024;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot parse byte quantity \"", original, "\": unknown unit \"", unit,
        "\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"));
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse byte quantity \"", original, "\": expected a number"));
  }
  const double bytes = value * scale;
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte quantity \"", original, "\" is negative"));
  }
  if (bytes >= 9.2e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte quantity \"", original, "\" is too large"));
  }
  if (bytes != std::floor(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte quantity \"", original, "\" is not a whole number of bytes"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace ps
