// PS_CHECK_OK(expr): CHECK-fails with the status's message if `expr` (a Status or StatusOr) is not
// OK. For benchmarks, tools and tests' setup, where an error is a bug in the program itself;
// library code returns the Status instead.
#ifndef PATRICKSTAR_BASE_CHECK_H_
#define PATRICKSTAR_BASE_CHECK_H_

#include "base/status_macros.h"
#include "glog/logging.h"

#define PS_CHECK_OK(expr)                                                    \
  do {                                                                       \
    const ::absl::Status ps_check_status_ = ::ps::internal::AsStatus((expr)); \
    CHECK(ps_check_status_.ok()) << #expr << ": " << ps_check_status_;       \
  } while (0)

#endif  // PATRICKSTAR_BASE_CHECK_H_
