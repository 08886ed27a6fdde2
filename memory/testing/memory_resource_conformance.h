// The conformance suite of the MemoryResource contract (memory/memory_resource.h).
//
// Every MemoryResource implementation is instantiated against the same value-parameterized tests:
// alignment, no overlap between live allocations, InvalidArgument for non-positive sizes and for
// foreign or double frees (with the resource's state unchanged), ResourceExhausted naming the
// request and the capacity when a capped resource runs out (and the resource working again after
// frees), and a long randomized allocate/free sequence checked against a reference model of live
// ranges after every step.
//
// Usage, in a cc_test that links this library:
//
//   MemoryResourceConformanceParam HostParam() {
//     MemoryResourceConformanceParam p;
//     p.name = "Host";
//     p.max_request_bytes = 4 * kMiB;
//     p.factory = []() -> absl::StatusOr<std::unique_ptr<ResourceUnderTest>> {
//       auto r = std::make_unique<ResourceUnderTest>();
//       r->set_resource(r->Own(std::make_unique<HostResource>()));
//       return r;
//     };
//     return p;
//   }
//   INSTANTIATE_TEST_SUITE_P(Host, MemoryResourceConformanceTest,
//                            ::testing::Values(HostParam()), MemoryResourceConformanceParamName);
#ifndef PATRICKSTAR_MEMORY_TESTING_MEMORY_RESOURCE_CONFORMANCE_H_
#define PATRICKSTAR_MEMORY_TESTING_MEMORY_RESOURCE_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "memory/memory_resource.h"

namespace ps {

// A resource under test together with everything it needs alive (a backend, upstream resources,
// the object that owns it). Owned objects are destroyed in the reverse order of Own() calls, so
// own the dependencies first and the resource last.
class ResourceUnderTest {
 public:
  ResourceUnderTest() = default;
  ResourceUnderTest(const ResourceUnderTest&) = delete;
  ResourceUnderTest& operator=(const ResourceUnderTest&) = delete;
  ~ResourceUnderTest() {
    while (!owned_.empty()) owned_.pop_back();
  }

  // Keeps `object` alive as long as this; returns it.
  template <typename T>
  T* Own(std::unique_ptr<T> object) {
    T* raw = object.get();
    owned_.push_back(std::shared_ptr<void>(std::move(object)));
    return raw;
  }

  // The resource the tests exercise; not owned (own it, or what owns it, with Own()).
  void set_resource(MemoryResource* resource) { resource_ = resource; }
  MemoryResource* resource() const { return resource_; }

 private:
  std::vector<std::shared_ptr<void>> owned_;
  MemoryResource* resource_ = nullptr;
};

struct MemoryResourceConformanceParam {
  // Test-name suffix: letters, digits and underscores.
  std::string name;
  // Builds a fresh, empty resource (called once or more per test).
  std::function<absl::StatusOr<std::unique_ptr<ResourceUnderTest>>()> factory;
  // The largest single request the resource serves (a chunk pool serves at most one block).
  int64_t max_request_bytes = 0;
  // Set when the resource is capped: at most this many bytes can be live at once, and running
  // out must be ResourceExhausted naming the request and this capacity.
  std::optional<int64_t> capacity_bytes;
  // Every allocation uses at least this much of the capacity, whatever its size (a chunk pool's
  // block size). Tests that must fit many allocations under the cap size their count by it.
  int64_t granularity_bytes = kAllocationAlignment;
  // False for memory the host cannot touch (a real GPU): contents are then not written or checked.
  bool host_accessible = true;
};

void PrintTo(const MemoryResourceConformanceParam& param, std::ostream* os);

// Name generator for INSTANTIATE_TEST_SUITE_P.
std::string MemoryResourceConformanceParamName(
    const ::testing::TestParamInfo<MemoryResourceConformanceParam>& info);

class MemoryResourceConformanceTest
    : public ::testing::TestWithParam<MemoryResourceConformanceParam> {
 protected:
  void SetUp() override;

  MemoryResource* resource() const { return under_test_->resource(); }

  std::unique_ptr<ResourceUnderTest> under_test_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MEMORY_TESTING_MEMORY_RESOURCE_CONFORMANCE_H_
