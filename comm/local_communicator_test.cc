// The local (world of one) communicator under the conformance suite.
#include "comm/local_communicator.h"

#include <memory>

#include "comm/testing/communicator_conformance.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Local, CommunicatorConformanceTest,
    ::testing::Values(CommunicatorFactory{
        "local",
        []() -> absl::StatusOr<std::unique_ptr<Communicator>> {
          return std::make_unique<LocalCommunicator>();
        }}),
    CommunicatorFactoryName);

}  // namespace
}  // namespace ps
