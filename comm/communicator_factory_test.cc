#include "comm/communicator_factory.h"

#include <memory>

#include "base/testing/status_matchers.h"
#include "comm/testing/communicator_conformance.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// Communicators from the factory pass the conformance suite like the classes themselves.
INSTANTIATE_TEST_SUITE_P(
    Factory, CommunicatorConformanceTest,
    ::testing::Values(CommunicatorFactory{"local",
                                          [] {
                                            CommunicatorOptions options;
                                            options.kind = "local";
                                            return CreateCommunicator(options);
                                          }},
                      CommunicatorFactory{"mpi",
                                          [] {
                                            CommunicatorOptions options;
                                            options.kind = "MPI";  // case-insensitive
                                            return CreateCommunicator(options);
                                          }}),
    CommunicatorFactoryName);

TEST(CommunicatorFactory, CreatesEachKindByName) {
  CommunicatorOptions options;
  options.kind = "local";
  ASSERT_OK_AND_ASSIGN(auto local, CreateCommunicator(options));
  EXPECT_EQ(local->name(), "local");
  EXPECT_EQ(local->world_size(), 1);
  options.kind = "mpi";
  ASSERT_OK_AND_ASSIGN(auto mpi, CreateCommunicator(options));
  EXPECT_EQ(mpi->name(), "mpi");
  EXPECT_EQ(mpi->world_size(), 1);  // not launched by mpirun: a singleton
}

TEST(CommunicatorFactory, UnknownNamesListTheValidOnes) {
  CommunicatorOptions options;
  options.kind = "gloo";
  EXPECT_THAT(CreateCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("gloo"), HasSubstr("local, mpi, nccl"))));
  options.kind = "";
  EXPECT_THAT(CreateCommunicator(options), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CommunicatorFactory, NcclNeedsACudaBuildAndAGpu) {
  CommunicatorOptions options;
  options.kind = "nccl";
  const auto comm = CreateCommunicator(options);
  if (!NcclCompiledIn()) {
    EXPECT_THAT(comm, StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("--config=cuda")));
  } else if (!comm.ok()) {
    EXPECT_THAT(comm, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA GPU")));
  } else {
    EXPECT_EQ((*comm)->name(), "nccl");
    EXPECT_EQ((*comm)->memory(), CommMemory::kCudaDevice);
  }
}

}  // namespace
}  // namespace ps
