// Argument validation shared by every Communicator, checked on every rank of several world sizes
// (the conformance suite sees only the ranks of the worlds it runs in).
#include "comm/internal/collective.h"

#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "base/testing/status_matchers.h"
#include "comm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::comm_internal {
namespace {

using ::testing::HasSubstr;

constexpr Collective kKinds[] = {Collective::kAllGather, Collective::kReduceScatter,
                                 Collective::kAllReduce, Collective::kBroadcast};

TEST(NodeLocalCudaDevice, RanksOfANodeTakeDistinctGpus) {
  // 4 ranks on a 4-GPU node: GPUs 0..3, all distinct.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(NodeLocalCudaDevice(0, r, 4), r);
  // Counting from accelerator.device = 2 on 8 GPUs: 2..5.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(NodeLocalCudaDevice(2, r, 8), 2 + r);
  // Wrapping: 2 ranks from GPU 3 of 4 take 3 and 0.
  EXPECT_EQ(NodeLocalCudaDevice(3, 1, 4), 0);
  // Each rank wrapped in its own CUDA_VISIBLE_DEVICES sees one GPU: device 0 for every rank.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(NodeLocalCudaDevice(0, r, 1), 0);
}

TEST(CommDType, NamesSizesAndConversions) {
  EXPECT_EQ(CommDTypeName(CommDType::kF32), "f32");
  EXPECT_EQ(CommDTypeName(CommDType::kBF16), "bf16");
  EXPECT_EQ(CommDTypeName(CommDType::kU8), "u8");
  EXPECT_EQ(CommDTypeName(static_cast<CommDType>(40)), "invalid(40)");
  EXPECT_EQ(CommDTypeSize(CommDType::kF16), 2);
  EXPECT_EQ(CommDTypeSize(CommDType::kI32), 4);
  EXPECT_EQ(CommDTypeSize(CommDType::kU8), 1);
  EXPECT_EQ(CommDTypeSize(static_cast<CommDType>(40)), 0);
  EXPECT_EQ(ToCommDType(DType::kBF16), CommDType::kBF16);
  EXPECT_EQ(ToCommDType(DType::kF32), CommDType::kF32);
  EXPECT_TRUE(IsFloatingPoint(CommDType::kF16));
  EXPECT_FALSE(IsFloatingPoint(CommDType::kI32));
  EXPECT_EQ(ReduceOpName(ReduceOp::kAvg), "avg");
  EXPECT_EQ(ReduceOpName(static_cast<ReduceOp>(7)), "invalid(7)");
}

TEST(Collective, ElementCountsFollowNccl) {
  CollectiveCall call;
  call.count_elems = 10;
  call.kind = Collective::kAllGather;
  EXPECT_EQ(SendElems(call, 4), 10);
  EXPECT_EQ(RecvElems(call, 4), 40);
  call.kind = Collective::kReduceScatter;
  EXPECT_EQ(SendElems(call, 4), 40);
  EXPECT_EQ(RecvElems(call, 4), 10);
  call.kind = Collective::kAllReduce;
  EXPECT_EQ(SendElems(call, 4), 10);
  EXPECT_EQ(RecvElems(call, 4), 10);
}

TEST(Collective, InPlaceLayoutsAreAcceptedOnEveryRank) {
  std::vector<float> arena(8 * 100);
  for (int world : {1, 2, 3, 8}) {
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(testing::Message() << "rank " << rank << " of " << world);
      CollectiveCall call;
      call.count_elems = 100;
      call.dtype = CommDType::kF32;
      call.kind = Collective::kAllGather;
      call.recv = arena.data();
      call.send = arena.data() + rank * 100;
      EXPECT_OK(Validate(call, rank, world));
      EXPECT_TRUE(IsInPlace(call, rank, world));
      call.kind = Collective::kReduceScatter;
      call.send = arena.data();
      call.recv = arena.data() + rank * 100;
      EXPECT_OK(Validate(call, rank, world));
      EXPECT_TRUE(IsInPlace(call, rank, world));
      // Another rank's slot is not in place for this rank.
      if (world > 1) {
        call.recv = arena.data() + ((rank + 1) % world) * 100;
        EXPECT_THAT(Validate(call, rank, world),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("in-place reduce-scatter needs recv == send + rank")));
      }
      call.kind = Collective::kAllReduce;
      call.send = call.recv = arena.data();
      EXPECT_OK(Validate(call, rank, world));
      EXPECT_TRUE(IsInPlace(call, rank, world));
      call.kind = Collective::kBroadcast;
      call.root = world - 1;
      call.send = rank == call.root ? arena.data() : nullptr;
      EXPECT_OK(Validate(call, rank, world));
      EXPECT_EQ(IsInPlace(call, rank, world), rank == call.root);
    }
  }
}

// Random send/recv placements inside one arena: valid exactly when the byte ranges are disjoint
// or send sits at the in-place position (computed here independently of the implementation).
TEST(Collective, OverlapRuleOnRandomPlacements) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> arena(1 << 16);
  for (int iter = 0; iter < 20000; ++iter) {
    const int world = 1 + static_cast<int>(rng() % 5);
    const int rank = static_cast<int>(rng() % world);
    CollectiveCall call{.kind = kKinds[rng() % 4], .dtype = static_cast<CommDType>(rng() % 5)};
    const int64_t elem = CommDTypeSize(call.dtype);
    call.count_elems = 1 + static_cast<int64_t>(rng() % 64);
    call.root = rank;  // so that send is read
    const int64_t send_bytes = SendElems(call, world) * elem;
    const int64_t recv_bytes = RecvElems(call, world) * elem;
    const int64_t send_off = static_cast<int64_t>(rng() % (arena.size() - send_bytes));
    int64_t recv_off = static_cast<int64_t>(rng() % (arena.size() - recv_bytes));
    if (rng() % 3 == 0) {  // aim near the in-place position
      int64_t in_place = send_off;
      if (call.kind == Collective::kAllGather) in_place = send_off - rank * call.count_elems * elem;
      if (call.kind == Collective::kReduceScatter) {
        in_place = send_off + rank * call.count_elems * elem;
      }
      const int64_t jitter = static_cast<int64_t>(rng() % 3) - 1;
      const int64_t candidate = in_place + jitter;
      if (candidate >= 0 && candidate + recv_bytes <= static_cast<int64_t>(arena.size())) {
        recv_off = candidate;
      }
    }
    call.send = arena.data() + send_off;
    call.recv = arena.data() + recv_off;
    const bool disjoint = send_off + send_bytes <= recv_off || recv_off + recv_bytes <= send_off;
    int64_t in_place_send = recv_off;
    if (call.kind == Collective::kAllGather)
      in_place_send = recv_off + rank * call.count_elems * elem;
    if (call.kind == Collective::kReduceScatter) {
      in_place_send = recv_off - rank * call.count_elems * elem;
    }
    const bool in_place = send_off == in_place_send;
    const absl::Status status = Validate(call, rank, world);
    ASSERT_EQ(status.ok(), disjoint || in_place)
        << Describe(call, rank, world) << " send+" << send_off << " recv+" << recv_off << ": "
        << status;
    if (!status.ok()) {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlaps")));
    }
  }
}

TEST(Collective, TransportLimitAndOverflowAreReported) {
  CollectiveCall call{.kind = Collective::kAllReduce, .count_elems = int64_t{INT_MAX} + 1};
  float dummy[2];
  call.send = &dummy[0];
  call.recv = &dummy[1];  // never touched: rejected before
  EXPECT_THAT(Validate(call, 0, 2, INT_MAX, "MPI"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("exceeds MPI's limit of 2147483647; split the buffer")));
  call.kind = Collective::kAllGather;
  call.count_elems = int64_t{1} << 60;
  EXPECT_THAT(Validate(call, 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
}

TEST(Collective, NullBuffersAreFineOnlyWhereNothingIsRead) {
  CollectiveCall call{.kind = Collective::kBroadcast, .count_elems = 3};
  float recv[3];
  call.recv = recv;
  call.root = 1;
  EXPECT_OK(Validate(call, 0, 2));  // not the root: send unused
  EXPECT_THAT(Validate(call, 1, 2), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("send buffer is null with count 3")));
  call.count_elems = 0;
  call.recv = nullptr;
  for (Collective kind : kKinds) {
    call.kind = kind;
    EXPECT_OK(Validate(call, 1, 2)) << CollectiveName(kind);
  }
}

TEST(Collective, DescriptionsNameEverything) {
  CollectiveCall call;
  call.kind = Collective::kReduceScatter;
  call.op = ReduceOp::kAvg;
  call.dtype = CommDType::kBF16;
  call.count_elems = 1000;
  EXPECT_EQ(Describe(call, 1, 4),
            "reduce-scatter (avg) of 1000 bf16 elements per rank on rank 1 of 4");
  call.kind = Collective::kBroadcast;
  call.root = 2;
  EXPECT_EQ(Describe(call, 0, 4),
            "broadcast from root 2 of 1000 bf16 elements per rank on rank 0 of 4");
  call.kind = Collective::kBarrier;
  EXPECT_EQ(Describe(call, 3, 4), "barrier on rank 3 of 4");
}

}  // namespace
}  // namespace ps::comm_internal
