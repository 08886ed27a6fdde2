// GoogleTest matchers for absl::Status and absl::StatusOr<T> (Abseil 20220623 has none).
//
//   EXPECT_OK(status_or_statusor);
//   ASSERT_OK(...);
//   EXPECT_THAT(s, IsOk());
//   EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
//   EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_size")));
//   EXPECT_THAT(statusor, IsOkAndHolds(42));
//
// A plain string as the message matcher means "contains this substring".
#ifndef PATRICKSTAR_BASE_TESTING_STATUS_MATCHERS_H_
#define PATRICKSTAR_BASE_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace testing_internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

template <typename MessageMatcher>
class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code, MessageMatcher message)
      : code_(code), message_(std::move(message)) {}

  template <typename T>
  bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const {
    const absl::Status& s = GetStatus(value);
    *listener << "whose status is " << s;
    if (s.code() != code_) return false;
    return ::testing::SafeMatcherCast<const std::string&>(message_).MatchAndExplain(
        std::string(s.message()), listener);
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has status code " << absl::StatusCodeToString(code_) << " and a message that ";
    ::testing::SafeMatcherCast<const std::string&>(message_).DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status code " << absl::StatusCodeToString(code_)
        << " or has a message that does not match";
  }

 private:
  absl::StatusCode code_;
  MessageMatcher message_;
};

class IsOkMatcher {
 public:
  template <typename T>
  bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const {
    const absl::Status& s = GetStatus(value);
    if (!s.ok()) *listener << "whose status is " << s;
    return s.ok();
  }
  void DescribeTo(std::ostream* os) const { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const { *os << "is not OK"; }
};

template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}
  template <typename T>
  bool MatchAndExplain(const absl::StatusOr<T>& value,
                       ::testing::MatchResultListener* listener) const {
    if (!value.ok()) {
      *listener << "whose status is " << value.status();
      return false;
    }
    return ::testing::SafeMatcherCast<const T&>(inner_).MatchAndExplain(*value, listener);
  }
  void DescribeTo(std::ostream* os) const { *os << "is OK and holds a value that matches"; }
  void DescribeNegationTo(std::ostream* os) const { *os << "is not OK or holds a mismatch"; }

 private:
  InnerMatcher inner_;
};

}  // namespace testing_internal

inline ::testing::PolymorphicMatcher<testing_internal::IsOkMatcher> IsOk() {
  return ::testing::MakePolymorphicMatcher(testing_internal::IsOkMatcher());
}

template <typename MessageMatcher>
::testing::PolymorphicMatcher<testing_internal::StatusIsMatcher<::testing::Matcher<const std::string&>>>
StatusIs(absl::StatusCode code, MessageMatcher message) {
  ::testing::Matcher<const std::string&> m;
  if constexpr (std::is_convertible_v<MessageMatcher, std::string>) {
    m = ::testing::HasSubstr(std::string(message));
  } else {
    m = ::testing::SafeMatcherCast<const std::string&>(message);
  }
  return ::testing::MakePolymorphicMatcher(
      testing_internal::StatusIsMatcher<::testing::Matcher<const std::string&>>(code, m));
}

inline auto StatusIs(absl::StatusCode code) { return StatusIs(code, ::testing::_); }

template <typename InnerMatcher>
::testing::PolymorphicMatcher<testing_internal::IsOkAndHoldsMatcher<InnerMatcher>> IsOkAndHolds(
    InnerMatcher inner) {
  return ::testing::MakePolymorphicMatcher(
      testing_internal::IsOkAndHoldsMatcher<InnerMatcher>(std::move(inner)));
}

}  // namespace ps

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::ps::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::ps::IsOk())

// ASSERT_OK_AND_ASSIGN(lhs, expr): asserts that the StatusOr `expr` is OK and moves its value.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  PS_ASSERT_OK_AND_ASSIGN_IMPL_(PS_TEST_CONCAT_(ps_test_statusor_, __LINE__), lhs, expr)
#define PS_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  ASSERT_TRUE(statusor.ok()) << statusor.status();         \
  lhs = std::move(statusor).value()
#define PS_TEST_CONCAT_INNER_(a, b) a##b
#define PS_TEST_CONCAT_(a, b) PS_TEST_CONCAT_INNER_(a, b)

#endif  // PATRICKSTAR_BASE_TESTING_STATUS_MATCHERS_H_
