// DeviceCheckingCommunicator: a Communicator that stands for a device-memory one (nccl) on the
// emulated accelerator. It forwards every collective to `inner` (a host-memory communicator, e.g.
// one of comm/testing's thread communicators, which can address the cpu backend's memory), but
// reports memory() == CommMemory::kCudaDevice and first checks that every buffer it is handed lies
// inside one live device allocation of `backend` (CheckCpuDeviceRange): host memory is
// InvalidArgument, as NCCL would refuse it (or crash). Test-only.
//
// The check happens before the call is forwarded, on every rank alike for the same arguments, so a
// rejected call does not desynchronize a world of correct ranks (a rank that hands host memory
// while the others do not leaves them waiting until the inner communicator's timeout).
//
// Thread safety: as `inner`; the counter is atomic.
#ifndef PATRICKSTAR_SCHEDULER_TESTING_DEVICE_CHECKING_COMMUNICATOR_H_
#define PATRICKSTAR_SCHEDULER_TESTING_DEVICE_CHECKING_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "memory/backend.h"

namespace ps {

class DeviceCheckingCommunicator final : public Communicator {
 public:
  // Neither pointer is owned; both must outlive this object. `backend` must be a cpu backend.
  DeviceCheckingCommunicator(Communicator* inner, const Backend* backend)
      : inner_(inner), backend_(backend) {}

  absl::string_view name() const override { return "device_checking"; }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  CommMemory memory() const override { return CommMemory::kCudaDevice; }

  absl::StatusOr<std::unique_ptr<CommRequest>> AllGatherAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> ReduceScatterAsync(const void* send, void* recv,
                                                                  int64_t count_elems,
                                                                  CommDType dtype,
                                                                  ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> AllReduceAsync(const void* send, void* recv,
                                                              int64_t count_elems, CommDType dtype,
                                                              ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BroadcastAsync(const void* send, void* recv,
                                                              int64_t count_elems, CommDType dtype,
                                                              int root) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BarrierAsync() override;

  // Buffers checked (and found in device memory) so far.
  int64_t checked_buffers() const { return checked_.load(); }

 private:
  // OK if [ptr, ptr + elems * size(dtype)) is device memory of the backend (nothing to check for
  // an empty range).
  absl::Status Check(const void* ptr, int64_t elems, CommDType dtype, absl::string_view what);

  Communicator* const inner_;
  const Backend* const backend_;
  std::atomic<int64_t> checked_{0};
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_TESTING_DEVICE_CHECKING_COMMUNICATOR_H_
