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
INSTANTIATE_TEST_SUITE_P(Factory, CommunicatorConformanceTest,
                         ::testing::Values(CommunicatorFactory{"local",
                                                               [] {
                                                                 CommunicatorOptions options;
                                                                 options.kind = "local";
                                                                 return CreateCommunicator(options);
                                                               }},
                                           CommunicatorFactory{"mpi",
                                                               [] {
                                                                 CommunicatorOptions options;
                                                                 options.kind =
                                                                     "MPI";  // case-insensitive
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

// A cuda run started by mpirun with the default --comm=auto must get nccl: a host communicator
// would hand the GPU-resident ZeRO payloads to MPI and memcpy (a segfault at the first gather).
TEST(ChooseTrainingCommunicator, AutoPicksNcclForCudaUnderMpirun) {
  ASSERT_OK_AND_ASSIGN(auto cuda, ChooseTrainingCommunicator("auto", /*cuda_accelerator=*/true,
                                                             /*launched_by_mpirun=*/true, 0));
  EXPECT_EQ(cuda.kind, "nccl");
  ASSERT_OK_AND_ASSIGN(auto cpu, ChooseTrainingCommunicator("auto", false, true, 0));
  EXPECT_EQ(cpu.kind, "mpi");
  for (bool accelerator_cuda : {false, true}) {
    ASSERT_OK_AND_ASSIGN(auto alone,
                         ChooseTrainingCommunicator("auto", accelerator_cuda, false, 0));
    EXPECT_EQ(alone.kind, "") << "without mpirun: a world of one, no communicator";
    ASSERT_OK_AND_ASSIGN(auto local,
                         ChooseTrainingCommunicator("local", accelerator_cuda, true, 0));
    EXPECT_EQ(local.kind, "");
  }
}

TEST(ChooseTrainingCommunicator, RefusesMpiWithCudaUnderMpirunNamingNccl) {
  EXPECT_THAT(ChooseTrainingCommunicator("mpi", /*cuda_accelerator=*/true,
                                         /*launched_by_mpirun=*/true, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("--comm=mpi"), HasSubstr("--accelerator=cuda"),
                                        HasSubstr("use --comm=nccl"))));
  ASSERT_OK_AND_ASSIGN(auto cpu, ChooseTrainingCommunicator("mpi", false, true, 0));
  EXPECT_EQ(cpu.kind, "mpi");
  // A singleton (no mpirun) is a world of one: no collective ever runs.
  ASSERT_OK_AND_ASSIGN(auto singleton, ChooseTrainingCommunicator("mpi", true, false, 0));
  EXPECT_EQ(singleton.kind, "mpi");
}

// Under mpirun each rank's GPU comes from its node-local rank, counting from accelerator.device:
// passing accelerator.device as every rank's GPU put all ranks on GPU 0 ("Duplicate GPU").
TEST(ChooseTrainingCommunicator, NcclRanksTakeTheirGpuByLocalRank) {
  for (absl::string_view flag : {"nccl", "auto"}) {
    ASSERT_OK_AND_ASSIGN(auto options, ChooseTrainingCommunicator(flag, /*cuda_accelerator=*/true,
                                                                  /*launched_by_mpirun=*/true,
                                                                  /*accelerator_device=*/2));
    EXPECT_EQ(options.kind, "nccl");
    EXPECT_EQ(options.cuda_device, -1) << flag;
    EXPECT_EQ(options.first_cuda_device, 2) << flag;
  }
  ASSERT_OK_AND_ASSIGN(auto alone, ChooseTrainingCommunicator("nccl", true, false, 3));
  EXPECT_EQ(alone.cuda_device, 3) << "a world of one uses accelerator.device as given";
}

TEST(ChooseTrainingCommunicator, UnknownFlagValue) {
  EXPECT_THAT(ChooseTrainingCommunicator("gloo", true, true, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("--comm"), HasSubstr("gloo"))));
}

}  // namespace
}  // namespace ps
