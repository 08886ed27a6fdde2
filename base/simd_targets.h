// PS_SIMD_MAX: a process-wide cap on the SIMD targets that Highway's run-time dispatch may choose
// (memory/convert, the CPU kernels, CPU Adam, the finite scan), so that a machine with AVX-512 can
// run the AVX2, SSE4 or scalar code paths that other CPUs take — CI runs the model, kernel,
// optimizer and trainer tests a second time with PS_SIMD_MAX=avx2 for that.
//
//   PS_SIMD_MAX=avx512|avx2|sse4|ssse3|scalar   (case-insensitive; unset or empty: no cap)
//
// avx512 allows every x86 target (AVX3_DL and AVX3 included); avx2 disables the AVX-512 targets;
// sse4 also AVX2; ssse3 also SSE4; scalar leaves only Highway's portable targets (EMU128/SCALAR). A
// cap above what the CPU has changes nothing. The variable is read once, while the program starts
// (a static initializer of this library, linked into every binary that links a SIMD library); a
// value outside the list ends the process at start with a message naming the variable, since a typo
// must not silently test the default path.
#ifndef PATRICKSTAR_BASE_SIMD_TARGETS_H_
#define PATRICKSTAR_BASE_SIMD_TARGETS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

inline constexpr char kSimdMaxEnvVar[] = "PS_SIMD_MAX";

// The Highway target bits that PS_SIMD_MAX=value disables (0 for "" and avx512).
// InvalidArgument naming PS_SIMD_MAX and the accepted values for anything else.
absl::StatusOr<int64_t> SimdTargetsDisabledBy(absl::string_view value);

// Applies a cap as PS_SIMD_MAX=value does at start ("" lifts it), replacing any earlier one. For
// tests and benchmarks that compare targets; programs take it from the environment.
absl::Status ApplySimdMax(absl::string_view value);

// The target Highway's dispatch chooses now, e.g. "AVX2", and the cap, e.g.
// "AVX2 (PS_SIMD_MAX=avx2)" or "AVX3 (every target this CPU has)".
std::string DescribeSimdDispatch();

}  // namespace ps

#endif  // PATRICKSTAR_BASE_SIMD_TARGETS_H_
