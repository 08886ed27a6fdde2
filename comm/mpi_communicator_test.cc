// The mpi communicator in this process alone (an MPI singleton, a world of one) under the
// conformance suite. The same suite runs on 2 and 3 ranks under mpirun in
// comm/mpi_multiprocess_test.cc.
#include "comm/mpi_communicator.h"

#include <memory>

#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "comm/testing/communicator_conformance.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

INSTANTIATE_TEST_SUITE_P(
    MpiSingleton, CommunicatorConformanceTest,
    ::testing::Values(CommunicatorFactory{
        "mpi",
        []() -> absl::StatusOr<std::unique_ptr<Communicator>> {
          ASSIGN_OR_RETURN(auto comm, MpiCommunicator::Create());
          return std::unique_ptr<Communicator>(std::move(comm));
        }}),
    CommunicatorFactoryName);

TEST(MpiCommunicator, WithoutMpirunIsASingletonWorldOfOne) {
  ASSERT_OK_AND_ASSIGN(auto comm, MpiCommunicator::Create());
  EXPECT_EQ(comm->name(), "mpi");
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->memory(), CommMemory::kHost);
  EXPECT_FALSE(MpiCommunicator::LaunchedByMpirun());
}

// Communicators are independent duplicates of MPI_COMM_WORLD; several may coexist and be
// destroyed in any order while collectives are in flight on the others.
TEST(MpiCommunicator, SeveralCommunicatorsCoexist) {
  ASSERT_OK_AND_ASSIGN(auto a, MpiCommunicator::Create());
  ASSERT_OK_AND_ASSIGN(auto b, MpiCommunicator::Create());
  float x[4] = {1, 2, 3, 4};
  float y[4] = {0, 0, 0, 0};
  ASSERT_OK_AND_ASSIGN(auto ra, a->AllReduceAsync(x, y, 4, CommDType::kF32, ReduceOp::kSum));
  ASSERT_OK_AND_ASSIGN(auto rb, b->BarrierAsync());
  a.reset();  // waits for its all-reduce
  EXPECT_TRUE(ra->Done());
  EXPECT_OK(ra->Wait());
  EXPECT_OK(rb->Wait());
  EXPECT_EQ(y[3], 4.0f);
}

}  // namespace
}  // namespace ps
