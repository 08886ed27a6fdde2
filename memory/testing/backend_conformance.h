// The Backend conformance suite: one set of tests every Backend implementation passes (the cpu
// emulated accelerator always; cuda where a GPU exists). Instantiate it in a test file with
//
//   INSTANTIATE_TEST_SUITE_P(Cpu, BackendConformanceTest,
//                            ::testing::Values(BackendFactory{"cpu", [] { return ...; }}),
//                            BackendFactoryName);
//
// A factory returning Unavailable (no GPU) makes every test of that instance report SKIPPED.
// The factory must give a backend with at least 64 MiB of capacity.
#ifndef PATRICKSTAR_MEMORY_TESTING_BACKEND_CONFORMANCE_H_
#define PATRICKSTAR_MEMORY_TESTING_BACKEND_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "memory/backend.h"

namespace ps {

struct BackendFactory {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> create;
};

inline std::string BackendFactoryName(const ::testing::TestParamInfo<BackendFactory>& info) {
  return info.param.name;
}

class BackendConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override;
  std::unique_ptr<Backend> backend_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_TESTING_BACKEND_CONFORMANCE_H_
