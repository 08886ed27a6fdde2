// Helper binary for comm/mpi_multiprocess_test.cc, run as `mpirun -np N mpi_conformance_main`:
// every rank runs the Communicator conformance suite on the mpi communicator (the ranks execute
// the same tests in the same order, so their collectives match), plus tests that need more than
// one rank. Each rank exits 0 only if all its tests passed.
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "comm/mpi_communicator.h"
#include "comm/testing/communicator_conformance.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Mpi, CommunicatorConformanceTest,
    ::testing::Values(CommunicatorFactory{
        "mpi",
        []() -> absl::StatusOr<std::unique_ptr<Communicator>> {
          ASSIGN_OR_RETURN(auto comm, MpiCommunicator::Create());
          return std::unique_ptr<Communicator>(std::move(comm));
        }}),
    CommunicatorFactoryName);

TEST(MpiMultiRank, WorldComesFromMpirun) {
  ASSERT_OK_AND_ASSIGN(auto comm, MpiCommunicator::Create());
  EXPECT_TRUE(MpiCommunicator::LaunchedByMpirun());
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  ASSERT_NE(size, nullptr);
  ASSERT_NE(rank, nullptr);
  int size_value = 0, rank_value = 0;
  ASSERT_TRUE(absl::SimpleAtoi(size, &size_value));
  ASSERT_TRUE(absl::SimpleAtoi(rank, &rank_value));
  EXPECT_EQ(comm->world_size(), size_value);
  EXPECT_EQ(comm->rank(), rank_value);
}

// A rank that joins late: the others' timed waits report DeadlineExceeded (naming the
// collective), the collective stays in flight, and completes once the late rank joins.
TEST(MpiMultiRank, TimedWaitReportsALatePeerAndTheCollectiveStillCompletes) {
  ASSERT_OK_AND_ASSIGN(auto comm, MpiCommunicator::Create());
  if (comm->world_size() < 2) GTEST_SKIP() << "needs two ranks";
  float x[8];
  for (int i = 0; i < 8; ++i) x[i] = static_cast<float>(comm->rank() + i);
  float y[8] = {0};
  const bool late = comm->rank() == comm->world_size() - 1;
  if (late) absl::SleepFor(absl::Seconds(2));
  ASSERT_OK_AND_ASSIGN(auto req, comm->AllReduceAsync(x, y, 8, CommDType::kF32, ReduceOp::kSum));
  if (!late) {
    EXPECT_THAT(req->Wait(absl::Milliseconds(200)),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         ::testing::AllOf(::testing::HasSubstr("all-reduce (sum) of 8 f32"),
                                          ::testing::HasSubstr("still in flight"))));
    EXPECT_FALSE(req->Done());
  }
  ASSERT_OK(req->Wait(absl::Seconds(60)));
  const int w = comm->world_size();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], static_cast<float>(w * (w - 1) / 2 + w * i));
}

}  // namespace
}  // namespace ps
