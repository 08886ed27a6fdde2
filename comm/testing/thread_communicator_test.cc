// The thread world: each collective's result on every rank, in place and not, and how a broken
// world (a rank that never arrives, mismatched calls) fails instead of hanging.
#include "comm/testing/thread_communicator.h"

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "base/testing/status_matchers.h"
#include "comm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype_math.h"

namespace ps {
namespace {

std::vector<absl::Status> OnEveryRank(std::vector<std::unique_ptr<Communicator>>& comms,
                                      const std::function<absl::Status(Communicator&)>& body) {
  std::vector<absl::Status> status(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { status[r] = body(*comms[r]); });
  }
  for (auto& t : threads) t.join();
  return status;
}

TEST(ThreadCommunicator, CollectivesGiveTheDocumentedResults) {
  constexpr int kWorld = 3;
  constexpr int kCount = 5;
  auto comms = CreateThreadCommunicators(kWorld);
  EXPECT_EQ(comms[2]->rank(), 2);
  EXPECT_EQ(comms[2]->world_size(), kWorld);
  auto status = OnEveryRank(comms, [&](Communicator& c) -> absl::Status {
    const int r = c.rank();
    // All-gather in place.
    std::vector<float> all(kWorld * kCount, -1);
    for (int i = 0; i < kCount; ++i) all[r * kCount + i] = r * 10 + i;
    if (absl::Status s = c.AllGather(all.data() + r * kCount, all.data(), kCount,
                                     CommDType::kF32);
        !s.ok()) {
      return s;
    }
    for (int q = 0; q < kWorld; ++q) {
      for (int i = 0; i < kCount; ++i) EXPECT_EQ(all[q * kCount + i], q * 10 + i);
    }
    // Reduce-scatter (avg) of bf16, rounded once from the f32 sum.
    std::vector<uint16_t> send(kWorld * kCount), recv(kCount);
    for (int i = 0; i < kWorld * kCount; ++i) send[i] = FloatToBFloat16Bits(0.1f * (r + 1) * i);
    if (absl::Status s = c.ReduceScatter(send.data(), recv.data(), kCount, CommDType::kBF16,
                                         ReduceOp::kAvg);
        !s.ok()) {
      return s;
    }
    for (int i = 0; i < kCount; ++i) {
      float sum = 0;
      for (int q = 0; q < kWorld; ++q) {
        sum += BFloat16BitsToFloat(FloatToBFloat16Bits(0.1f * (q + 1) * (r * kCount + i)));
      }
      EXPECT_EQ(recv[i], FloatToBFloat16Bits(sum / kWorld)) << "rank " << r << " elem " << i;
    }
    // All-reduce in place (i32 max) and broadcast in place.
    int32_t x[2] = {r, -r};
    if (absl::Status s = c.AllReduce(x, x, 2, CommDType::kI32, ReduceOp::kMax); !s.ok()) return s;
    EXPECT_EQ(x[0], kWorld - 1);
    EXPECT_EQ(x[1], 0);
    float b[3] = {static_cast<float>(r), 0, 0};
    if (absl::Status s = c.Broadcast(b, b, 3, CommDType::kF32, /*root=*/1); !s.ok()) return s;
    EXPECT_EQ(b[0], 1.0f);
    return c.Barrier();
  });
  for (const absl::Status& s : status) EXPECT_OK(s);
}

TEST(ThreadCommunicator, InvalidArgumentsAreRejectedBeforeCommunicating) {
  auto comms = CreateThreadCommunicators(2);
  float x[2];
  EXPECT_THAT(comms[0]->AllReduce(nullptr, x, 2, CommDType::kF32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(comms[0]->Broadcast(x, x, 2, CommDType::kF32, /*root=*/5),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ThreadCommunicator, AMissingRankTimesOutAndBreaksTheWorld) {
  auto comms = CreateThreadCommunicators(2, absl::Milliseconds(200));
  EXPECT_THAT(comms[0]->Barrier(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(comms[1]->Barrier(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(ThreadCommunicator, MismatchedCallsFailOnEveryRank) {
  auto comms = CreateThreadCommunicators(2);
  auto status = OnEveryRank(comms, [](Communicator& c) -> absl::Status {
    float x[4] = {};
    return c.AllReduce(x, x, c.rank() == 0 ? 2 : 4, CommDType::kF32, ReduceOp::kSum);
  });
  for (const absl::Status& s : status) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal, ::testing::HasSubstr("mismatched")));
  }
}

}  // namespace
}  // namespace ps
