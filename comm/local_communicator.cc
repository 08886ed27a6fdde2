#include "comm/local_communicator.h"

#include <cstring>
#include <memory>

#include "base/status_macros.h"
#include "comm/internal/collective.h"
#include "comm/internal/completion.h"

namespace ps {
namespace {

using comm_internal::Collective;
using comm_internal::CollectiveCall;

// With one rank every collective copies count elements from send to recv.
absl::StatusOr<std::unique_ptr<CommRequest>> Run(const CollectiveCall& call) {
  RETURN_IF_ERROR(comm_internal::Validate(call, /*rank=*/0, /*world=*/1));
  if (call.count_elems > 0 && call.send != call.recv) {
    std::memcpy(call.recv, call.send, call.count_elems * CommDTypeSize(call.dtype));
  }
  return comm_internal::CompletedRequest(comm_internal::Describe(call, 0, 1), absl::OkStatus());
}

}  // namespace

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::AllGatherAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype) {
  CollectiveCall call{.kind = Collective::kAllGather,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype};
  return Run(call);
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::ReduceScatterAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  CollectiveCall call{.kind = Collective::kReduceScatter,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype,
                      .op = op};
  return Run(call);
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::AllReduceAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, ReduceOp op) {
  CollectiveCall call{.kind = Collective::kAllReduce,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype,
                      .op = op};
  return Run(call);
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::BroadcastAsync(
    const void* send, void* recv, int64_t count_elems, CommDType dtype, int root) {
  CollectiveCall call{.kind = Collective::kBroadcast,
                      .send = send,
                      .recv = recv,
                      .count_elems = count_elems,
                      .dtype = dtype,
                      .root = root};
  return Run(call);
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::BarrierAsync() {
  CollectiveCall call{.kind = Collective::kBarrier};
  return Run(call);
}

}  // namespace ps
