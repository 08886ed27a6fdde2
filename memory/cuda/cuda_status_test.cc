// QueryEvent's contract, driven through a fake runtime so it runs on machines without a GPU: an
// unfinished event must not leave cudaErrorNotReady as the thread's last error (the next kernel
// launcher's cudaGetLastError would report it as a launch failure), and real errors must stay.
#include "memory/cuda/cuda_status.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// The runtime's per-thread last-error slot as CUDA documents it: a query that fails records its
// error; cudaGetLastError returns the slot and resets it to cudaSuccess.
thread_local cudaError_t fake_last_error = cudaSuccess;
thread_local int fake_not_ready_polls = 0;
thread_local cudaError_t fake_final = cudaSuccess;

cudaError_t FakeQuery(cudaEvent_t) {
  const cudaError_t e = fake_not_ready_polls > 0 ? cudaErrorNotReady : fake_final;
  if (fake_not_ready_polls > 0) --fake_not_ready_polls;
  if (e != cudaSuccess) fake_last_error = e;
  return e;
}

cudaError_t FakeGetLastError() {
  const cudaError_t e = fake_last_error;
  fake_last_error = cudaSuccess;
  return e;
}

void ResetFake(int not_ready_polls, cudaError_t final_result) {
  fake_last_error = cudaSuccess;
  fake_not_ready_polls = not_ready_polls;
  fake_final = final_result;
}

TEST(QueryEvent, NotReadyLeavesNoLastError) {
  ResetFake(/*not_ready_polls=*/3, cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cuda_internal::QueryEventWith(nullptr, &FakeQuery, &FakeGetLastError),
              cudaErrorNotReady);
    // What the next launcher's `return cudaGetLastError()` would see.
    EXPECT_EQ(fake_last_error, cudaSuccess) << "poll " << i;
  }
  EXPECT_EQ(cuda_internal::QueryEventWith(nullptr, &FakeQuery, &FakeGetLastError), cudaSuccess);
  EXPECT_EQ(FakeGetLastError(), cudaSuccess);
}

TEST(QueryEvent, TheBugItGuardsAgainst) {
  // Without the clearing step (a bare cudaEventQuery), the NotReady stays recorded: this is what
  // made the first kernel after a NCCL wait fail. Keeps the fake honest.
  ResetFake(/*not_ready_polls=*/1, cudaSuccess);
  EXPECT_EQ(FakeQuery(nullptr), cudaErrorNotReady);
  EXPECT_EQ(FakeQuery(nullptr), cudaSuccess);
  EXPECT_EQ(FakeGetLastError(), cudaErrorNotReady);
}

TEST(QueryEvent, RealErrorsStayRecorded) {
  ResetFake(/*not_ready_polls=*/0, cudaErrorLaunchFailure);
  EXPECT_EQ(cuda_internal::QueryEventWith(nullptr, &FakeQuery, &FakeGetLastError),
            cudaErrorLaunchFailure);
  EXPECT_EQ(fake_last_error, cudaErrorLaunchFailure);
}

// A kernel fault poisons the whole context: the message says so, and that the process must
// restart, instead of leaving a cascade of secondary failures to decode.
TEST(CudaStatus, StickyErrorsSayTheContextIsUnusable) {
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
                        cudaErrorMisalignedAddress}) {
    EXPECT_TRUE(IsStickyCudaError(e)) << cudaGetErrorName(e);
    const absl::Status s = CudaStatus(e, "cuda::Matmul launch");
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_NE(s.message().find("cuda::Matmul launch failed"), absl::string_view::npos);
    EXPECT_NE(s.message().find("sticky"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("Restart the process"), absl::string_view::npos) << s;
  }
  for (cudaError_t e : {cudaErrorMemoryAllocation, cudaErrorInvalidValue, cudaErrorNotReady}) {
    EXPECT_FALSE(IsStickyCudaError(e)) << cudaGetErrorName(e);
    EXPECT_EQ(CudaStatus(e, "x").message().find("sticky"), absl::string_view::npos);
  }
}

TEST(CudaStatus, MapsCodes) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps
