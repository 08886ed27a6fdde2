// Early-return helpers for absl::Status and absl::StatusOr<T>.
//
// Abseil 20220623 (Debian's) ships neither status macros nor test matchers, so the project keeps
// its own here and in base/testing/status_matchers.h. Every Status-returning call whose failure
// should propagate goes through one of these.
#ifndef PATRICKSTAR_BASE_STATUS_MACROS_H_
#define PATRICKSTAR_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

// RETURN_IF_ERROR(expr): evaluates `expr` (a Status or StatusOr) once; returns its status from the
// enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                                  \
  do {                                                                         \
    const ::absl::Status ps_status_ = ::ps::internal::AsStatus((expr));        \
    if (ABSL_PREDICT_FALSE(!ps_status_.ok())) return ps_status_;               \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; on error returns its status,
// otherwise move-assigns the value to `lhs` (which may be a declaration: `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_CONCAT_(ps_statusor_, __LINE__), lhs, expr)

#define PS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {            \
    return std::move(statusor).status();               \
  }                                                    \
  lhs = std::move(statusor).value()

#define PS_STATUS_CONCAT_INNER_(a, b) a##b
#define PS_STATUS_CONCAT_(a, b) PS_STATUS_CONCAT_INNER_(a, b)

namespace ps::internal {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace ps::internal

#endif  // PATRICKSTAR_BASE_STATUS_MACROS_H_
