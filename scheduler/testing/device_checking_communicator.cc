#include "scheduler/testing/device_checking_communicator.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "memory/cpu_backend.h"

namespace ps {

absl::Status DeviceCheckingCommunicator::Check(const void* ptr, int64_t elems, CommDType dtype,
                                               absl::string_view what) {
  const int64_t bytes = elems * CommDTypeSize(dtype);
  if (bytes <= 0) return absl::OkStatus();
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  RETURN_IF_ERROR(CheckCpuDeviceRange(*backend_, ptr, bytes,
                                      absl::StrCat(what, " of a device-memory collective")));
  ++checked_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CommRequest>> DeviceCheckingCommunicator::AllGatherAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype) {
  RETURN_IF_ERROR(Check(send, count_elems, dtype, "all-gather send buffer"));
  RETURN_IF_ERROR(Check(recv, count_elems * world_size(), dtype, "all-gather recv buffer"));
  return inner_->AllGatherAsync(send, recv, count_elems, dtype);
}

absl::StatusOr<std::unique_ptr<CommRequest>> DeviceCheckingCommunicator::ReduceScatterAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  RETURN_IF_ERROR(Check(send, count_elems * world_size(), dtype, "reduce-scatter send buffer"));
  RETURN_IF_ERROR(Check(recv, count_elems, dtype, "reduce-scatter recv buffer"));
  return inner_->ReduceScatterAsync(send, recv, count_elems, dtype, op);
}

absl::StatusOr<std::unique_ptr<CommRequest>> DeviceCheckingCommunicator::AllReduceAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  RETURN_IF_ERROR(Check(send, count_elems, dtype, "all-reduce send buffer"));
  RETURN_IF_ERROR(Check(recv, count_elems, dtype, "all-reduce recv buffer"));
  return inner_->AllReduceAsync(send, recv, count_elems, dtype, op);
}

absl::StatusOr<std::unique_ptr<CommRequest>> DeviceCheckingCommunicator::BroadcastAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, int root) {
  if (rank() == root) RETURN_IF_ERROR(Check(send, count_elems, dtype, "broadcast send buffer"));
  RETURN_IF_ERROR(Check(recv, count_elems, dtype, "broadcast recv buffer"));
  return inner_->BroadcastAsync(send, recv, count_elems, dtype, root);
}

absl::StatusOr<std::unique_ptr<CommRequest>> DeviceCheckingCommunicator::BarrierAsync() {
  return inner_->BarrierAsync();
}

}  // namespace ps
