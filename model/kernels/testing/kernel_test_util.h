// Test helpers for model/kernels: random fills, element-wise comparison with an absolute plus
// relative tolerance, and central finite differences.
//
// Finite differences are taken in double: for a smooth f, the central difference
// (f(x+h) - f(x-h)) / 2h has truncation error h^2 f'''/6 and rounding error ~eps*|f|/h, so with
// h = 1e-5 and |f| = O(10) both are below 1e-8 — far under the 1e-6 tolerances the tests use.
#ifndef PATRICKSTAR_MODEL_KERNELS_TESTING_KERNEL_TEST_UTIL_H_
#define PATRICKSTAR_MODEL_KERNELS_TESTING_KERNEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/types/span.h"
#include "base/testing/test_rng.h"
#include "gtest/gtest.h"

namespace ps::kernel_testing {

// Uniform values in [lo, hi).
template <typename T>
std::vector<T> RandomVector(TestRng& gen, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(absl::Uniform<double>(gen, lo, hi));
  return v;
}

// Element-wise conversion (e.g. the double reference's inputs to float).
template <typename To, typename From>
std::vector<To> Convert(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Expects |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for every i; reports at most a
// few mismatches and the largest error.
template <typename A, typename E>
void ExpectAllNear(absl::Span<const A> actual, absl::Span<const E> expected, double atol,
                   double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]);
    const double e = static_cast<double>(expected[i]);
    const double err = std::abs(a - e);
    worst = std::max(worst, err);
    if (!(err <= atol + rtol * std::abs(e))) {
      if (reported++ < 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << a << ", expected " << e << " (error "
                      << err << ", tolerance " << atol + rtol * std::abs(e) << ")";
      }
    }
  }
  if (reported > 5) ADD_FAILURE() << what << ": " << reported << " mismatches, worst " << worst;
}

template <typename A, typename E>
void ExpectAllNear(const std::vector<A>& actual, const std::vector<E>& expected, double atol,
                   double rtol, const std::string& what) {
  ExpectAllNear(absl::Span<const A>(actual), absl::Span<const E>(expected), atol, rtol, what);
}

// (f(x + h e_i) - f(x - h e_i)) / 2h, restoring x[i].
inline double CentralDifference(std::vector<double>& x, int64_t i, const std::function<double()>& f,
                                double h = 1e-5) {
  const double saved = x[i];
  x[i] = saved + h;
  const double plus = f();
  x[i] = saved - h;
  const double minus = f();
  x[i] = saved;
  return (plus - minus) / (2 * h);
}

// Checks the analytic gradient `grad` of f with respect to every element of x (or, when
// `max_checks` is smaller than x.size(), an evenly spaced sample of them) against central
// differences: |fd - grad| <= atol + rtol * |fd|.
inline void ExpectGradientMatchesFiniteDifferences(std::vector<double>& x,
                                                   const std::vector<double>& grad,
                                                   const std::function<double()>& f,
                                                   const std::string& what, double atol = 1e-7,
                                                   double rtol = 1e-6, int64_t max_checks = 64) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t stride = std::max<int64_t>(1, n / std::max<int64_t>(1, max_checks));
  int reported = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double fd = CentralDifference(x, i, f);
    if (!(std::abs(fd - grad[i]) <= atol + rtol * std::abs(fd)) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << grad[i] << ", finite difference " << fd
                    << " (error " << std::abs(fd - grad[i]) << ")";
    }
  }
}

// sum_i a[i] * b[i] in double: the scalar loss L = <out, R> whose gradient dL/dout is R.
template <typename T>
double Dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace ps::kernel_testing

#endif  // PATRICKSTAR_MODEL_KERNELS_TESTING_KERNEL_TEST_UTIL_H_
