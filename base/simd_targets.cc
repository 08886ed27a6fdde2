#include "base/simd_targets.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "hwy/targets.h"

namespace ps {
namespace {

// Highway's x86 targets, best first; a cap disables every target better than itself.
constexpr int64_t kAvx512Targets = HWY_AVX3_DL | HWY_AVX3;
constexpr int64_t kX86Targets = kAvx512Targets | HWY_AVX2 | HWY_SSE4 | HWY_SSSE3;

// The cap in force (lower-case value; empty: none), set once at start.
std::string& SimdMaxValue() {
  static std::string* value = new std::string();
  return *value;
}

// Applies PS_SIMD_MAX while the program starts.
const bool kSimdMaxApplied = [] {
  const char* env = std::getenv(kSimdMaxEnvVar);
  if (env == nullptr || *env == '\0') return true;
  if (const absl::Status s = ApplySimdMax(env); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    std::exit(2);
  }
  return true;
}();

}  // namespace

absl::StatusOr<int64_t> SimdTargetsDisabledBy(absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v.empty() || v == "avx512") return int64_t{0};
  if (v == "avx2") return kAvx512Targets;
  if (v == "sse4") return kAvx512Targets | HWY_AVX2;
  if (v == "ssse3") return kAvx512Targets | HWY_AVX2 | HWY_SSE4;
  if (v == "scalar") return kX86Targets;
  return absl::InvalidArgumentError(
      absl::StrCat(kSimdMaxEnvVar, "='", value,
                   "' is not a SIMD cap: use avx512, avx2, sse4, ssse3 or "
                   "scalar, or leave it unset for no cap"));
}

absl::Status ApplySimdMax(absl::string_view value) {
  const absl::StatusOr<int64_t> disabled = SimdTargetsDisabledBy(value);
  if (!disabled.ok()) return disabled.status();
  SimdMaxValue() = absl::AsciiStrToLower(value);
  hwy::DisableTargets(*disabled);  // replaces the previous mask (0: none disabled)
  return absl::OkStatus();
}

std::string DescribeSimdDispatch() {
  (void)kSimdMaxApplied;
  const int64_t supported = hwy::SupportedTargets();
  const int64_t best = supported & -supported;  // the lowest bit is the best target
  const std::string& cap = SimdMaxValue();
  return absl::StrCat(hwy::TargetName(best), " (",
                      cap.empty() ? std::string("the best target this CPU has")
                                  : absl::StrCat(kSimdMaxEnvVar, "=", cap),
                      ")");
}

}  // namespace ps
