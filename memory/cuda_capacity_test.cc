// The cap arithmetic of the cuda backend, on any machine (no GPU needed).
#include "memory/cuda_capacity.h"

#include "absl/status/status.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kTotal = 80 * kGiB;
constexpr int64_t kFree = 79 * kGiB + 300 * kMiB;  // the context already took its share

TEST(CudaCapacityFromFree, UnsetUsesTheFreeMemoryMinusTheMargin) {
  ASSERT_OK_AND_ASSIGN(int64_t cap, CudaCapacityFromFree(0, kFree, kTotal, kGiB, 0));
  EXPECT_EQ(cap, kFree - kGiB);
  ASSERT_OK_AND_ASSIGN(int64_t with_nccl,
                       CudaCapacityFromFree(0, kFree, kTotal, CudaMarginBytes(true), 0));
  EXPECT_EQ(with_nccl, kFree - CudaMarginBytes(true));
  EXPECT_GT(CudaMarginBytes(true), CudaMarginBytes(false));
}

// On an 80 GB card, a 79 GiB cap used to be accepted (it is below the total) and cudaMalloc
// failed hours in, once cuBLAS and NCCL had taken their share.
TEST(CudaCapacityFromFree, RefusesACapAboveFreeMinusMarginNamingTheFlag) {
  EXPECT_THAT(CudaCapacityFromFree(79 * kGiB, kFree, kTotal, kGiB, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cuda device 1"), HasSubstr("--accelerator_memory"),
                             HasSubstr(FormatBytes(kFree - kGiB)))));
  ASSERT_OK_AND_ASSIGN(int64_t exact, CudaCapacityFromFree(kFree - kGiB, kFree, kTotal, kGiB, 0));
  EXPECT_EQ(exact, kFree - kGiB);
  ASSERT_OK_AND_ASSIGN(int64_t small, CudaCapacityFromFree(kGiB, kFree, kTotal, kGiB, 0));
  EXPECT_EQ(small, kGiB);
}

TEST(CudaCapacityFromFree, NothingLeftOrNegative) {
  EXPECT_THAT(CudaCapacityFromFree(0, 512 * kMiB, kTotal, kGiB, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nvidia-smi")));
  EXPECT_THAT(CudaCapacityFromFree(-1, kFree, kTotal, kGiB, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

}  // namespace
}  // namespace ps
