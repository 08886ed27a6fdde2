// CpuKernels under the Kernels conformance suite, on the emulated accelerator: without a pool, with
// a pool shared with the host, and with the cpu backend holding every stream until the host waits
// (so each kernel certainly runs after the host moved on). Results must be bit-identical to
// calling the CPU kernels directly.
#include "model/kernels/cpu_kernels.h"

#include <memory>

#include "base/testing/status_matchers.h"
#include "base/thread_pool.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"
#include "model/kernels/testing/kernels_conformance.h"

namespace ps {
namespace {

using kernel_testing::KernelsConformanceTest;
using kernel_testing::KernelsFactory;
using kernel_testing::KernelsFactoryName;
using kernel_testing::KernelsUnderTest;

absl::StatusOr<KernelsUnderTest> MakeCpu(int pool_threads, bool stall_until_host_waits) {
  KernelsUnderTest env;
  if (pool_threads > 0) env.pool = std::make_unique<ThreadPool>(pool_threads);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(
      {.capacity_bytes = 256 * kMiB, .stall_streams_until_host_waits = stall_until_host_waits});
  if (!backend.ok()) return backend.status();
  env.backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<CpuKernels>> kernels =
      CpuKernels::Create(env.backend.get(), {.pool = env.pool.get()});
  if (!kernels.ok()) return kernels.status();
  env.kernels = *std::move(kernels);
  return env;
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, KernelsConformanceTest,
    ::testing::Values(KernelsFactory{"cpu_no_pool", [] { return MakeCpu(0, false); }, true},
                      KernelsFactory{"cpu_pool3", [] { return MakeCpu(3, false); }, true},
                      KernelsFactory{"cpu_pool2_stalled_until_host_waits",
                                     [] { return MakeCpu(2, true); }, true}),
    KernelsFactoryName);

TEST(CpuKernels, CreateNeedsACpuBackend) {
  EXPECT_THAT(CpuKernels::Create(nullptr), StatusIs(absl::StatusCode::kInvalidArgument, "null"));
}

TEST(CpuKernels, RefusesStreamsOfOtherBackendsAtEnqueue) {
  ASSERT_OK_AND_ASSIGN(auto backend, CreateCpuBackend({.capacity_bytes = kMiB}));
  ASSERT_OK_AND_ASSIGN(auto kernels, CpuKernels::Create(backend.get()));
  ASSERT_OK_AND_ASSIGN(void* p, backend->AllocateDevice(1024));
  class NotCpuStream final : public Stream {
   public:
    absl::Status MemcpyAsync(void*, const void*, int64_t, CopyKind) override {
      return absl::OkStatus();
    }
    absl::Status MemsetAsync(void*, int, int64_t) override { return absl::OkStatus(); }
    absl::Status LaunchHostFunc(absl::AnyInvocable<void() &&>) override { return absl::OkStatus(); }
    absl::Status RecordEvent(Event*) override { return absl::OkStatus(); }
    absl::Status WaitEvent(Event*) override { return absl::OkStatus(); }
    absl::Status Synchronize() override { return absl::OkStatus(); }
    void* native_handle() override { return this; }
  } foreign;
  auto* f = static_cast<float*>(p);
  EXPECT_THAT(kernels->GeluForward(foreign, 16, f, f + 16),
              StatusIs(absl::StatusCode::kInvalidArgument, "cpu backend"));
  ASSERT_OK(backend->FreeDevice(p));
}

}  // namespace
}  // namespace ps
