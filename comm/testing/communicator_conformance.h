// The Communicator conformance suite: one set of tests every Communicator implementation passes
// (local and mpi always; mpi also on 2 and 3 ranks under mpirun, see
// comm/testing/mpi_conformance_main.cc; nccl where a GPU exists). Instantiate it with
//
//   INSTANTIATE_TEST_SUITE_P(Local, CommunicatorConformanceTest,
//                            ::testing::Values(CommunicatorFactory{"local", [] { ... }}),
//                            CommunicatorFactoryName);
//
// A factory returning Unavailable (no GPU) makes every test of that instance report SKIPPED.
//
// Every rank runs the same tests in the same order; inputs are deterministic functions of
// (seed, rank, index), so each rank computes every other rank's input and the exact expected
// result locally. Float inputs are m * 2^e with |m| < 256 and |e| <= 4: exact in f16 and bf16,
// and sums over up to 8 ranks are exact in f32, so the reference "f32 sum, rounded once" does not
// depend on the summation order. Every wait has a timeout, so a desynchronized or hung
// collective fails the test instead of hanging it.
#ifndef PATRICKSTAR_COMM_TESTING_COMMUNICATOR_CONFORMANCE_H_
#define PATRICKSTAR_COMM_TESTING_COMMUNICATOR_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "gtest/gtest.h"

namespace ps {

// How the suite gets buffers a communicator accepts, and moves bytes in and out of them.
struct CommTestMemory {
  std::function<void*(int64_t bytes)> allocate;
  std::function<void(void* ptr)> free;
  std::function<void(void* dst, const void* host_src, int64_t bytes)> upload;
  std::function<void(void* host_dst, const void* src, int64_t bytes)> download;
};

// Plain host memory (malloc/memcpy): for local and mpi.
CommTestMemory HostTestMemory();

struct CommunicatorFactory {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Communicator>>()> create;
  CommTestMemory memory = HostTestMemory();
  // True when floating-point sum/avg results are exactly "f32 sum (avg: / world), rounded once"
  // (local, mpi); false for NCCL's arithmetic, which is then checked within a tolerance.
  bool exact_float_reductions = true;
};

inline std::string CommunicatorFactoryName(
    const ::testing::TestParamInfo<CommunicatorFactory>& info) {
  return info.param.name;
}

class CommunicatorConformanceTest : public ::testing::TestWithParam<CommunicatorFactory> {
 protected:
  void SetUp() override;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace ps

#endif  // PATRICKSTAR_COMM_TESTING_COMMUNICATOR_CONFORMANCE_H_
