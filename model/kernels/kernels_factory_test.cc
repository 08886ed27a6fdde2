#include "model/kernels/kernels_factory.h"

#include <memory>
#include <string>

#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/backend_factory.h"

namespace ps {
namespace {

// A backend that only has a name: enough for the factory's choice.
class NamedBackend final : public Backend {
 public:
  explicit NamedBackend(std::string name) : name_(std::move(name)) {}
  absl::string_view name() const override { return name_; }
  Device device() const override { return Device::Accelerator(0); }
  int64_t capacity_bytes() const override { return 0; }
  int64_t allocated_bytes() const override { return 0; }
  BackendCounters counters() const override { return {}; }
  absl::StatusOr<void*> AllocateDevice(int64_t) override { return absl::UnimplementedError(""); }
  absl::Status FreeDevice(void*) override { return absl::UnimplementedError(""); }
  absl::StatusOr<void*> AllocatePinnedHost(int64_t) override {
    return absl::UnimplementedError("");
  }
  absl::Status FreePinnedHost(void*) override { return absl::UnimplementedError(""); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return absl::UnimplementedError("");
  }

 private:
  std::string name_;
};

TEST(CreateKernels, PicksTheImplementationOfTheBackend) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateBackend({.kind = "cpu", .capacity_bytes = kMiB}));
  ThreadPool pool(2);
  ASSERT_OK_AND_ASSIGN(auto kernels, CreateKernels(backend.get(), {.cpu_pool = &pool}));
  EXPECT_EQ(kernels->name(), "cpu");
}

TEST(CreateKernels, RefusesWhatItCannotRun) {
  EXPECT_THAT(CreateKernels(nullptr), StatusIs(absl::StatusCode::kInvalidArgument, "null"));
  NamedBackend tpu("tpu");
  EXPECT_THAT(CreateKernels(&tpu),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"cpu\" or \"cuda\""));
  if (!CudaBackendCompiledIn()) {
    NamedBackend cuda("cuda");
    EXPECT_THAT(CreateKernels(&cuda),
                StatusIs(absl::StatusCode::kFailedPrecondition, "--config=cuda"));
  }
}

}  // namespace
}  // namespace ps
