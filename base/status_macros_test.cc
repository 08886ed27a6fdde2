#include "base/status_macros.h"

#include <memory>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

absl::Status Fails() { return absl::InvalidArgumentError("bad"); }
absl::StatusOr<int> Seven() { return 7; }
absl::StatusOr<int> NotFound() { return absl::NotFoundError("gone"); }
absl::StatusOr<std::unique_ptr<int>> MoveOnly() { return std::make_unique<int>(3); }

absl::Status PropagatesStatus(int* reached) {
  RETURN_IF_ERROR(Fails());
  ++*reached;
  return absl::OkStatus();
}

absl::StatusOr<int> AddsOne(absl::StatusOr<int> (*f)()) {
  ASSIGN_OR_RETURN(int v, f());
  return v + 1;
}

absl::StatusOr<int> Unwraps() {
  ASSIGN_OR_RETURN(auto p, MoveOnly());
  RETURN_IF_ERROR(Seven());
  return *p;
}

TEST(StatusMacros, ReturnIfErrorStopsAtError) {
  int reached = 0;
  EXPECT_THAT(PropagatesStatus(&reached), StatusIs(absl::StatusCode::kInvalidArgument, "bad"));
  EXPECT_EQ(reached, 0);
}

TEST(StatusMacros, AssignOrReturnAssignsOrPropagates) {
  EXPECT_THAT(AddsOne(&Seven), IsOkAndHolds(8));
  EXPECT_THAT(AddsOne(&NotFound), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Unwraps(), IsOkAndHolds(3));
}

}  // namespace
}  // namespace ps
