// LocalCommunicator: a world of one process. Every collective is a copy from `send` to `recv` (a
// no-op in place); reductions over one rank return the input unchanged, bit for bit (avg divides
// by one). Arguments are validated exactly as by the other implementations (comm/communicator.h),
// so single-process training exercises the same contract. Requests are complete when returned.
//
// Buffers: host-addressable memory (host, pinned, or the emulated `cpu` accelerator's memory).
//
// Thread safety: thread-safe; collectives run synchronously on the calling thread.
#ifndef PATRICKSTAR_COMM_LOCAL_COMMUNICATOR_H_
#define PATRICKSTAR_COMM_LOCAL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ps {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator() = default;

  absl::string_view name() const override { return "local"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  CommMemory memory() const override { return CommMemory::kHost; }

  absl::StatusOr<std::unique_ptr<CommRequest>> AllGatherAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> ReduceScatterAsync(const void* send, void* recv,
                                                                  int64_t count_elems,
                                                                  CommDType dtype,
                                                                  ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> AllReduceAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype,
                                                              ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BroadcastAsync(const void* send, void* recv,
                                                              int64_t count_elems,
                                                              CommDType dtype, int root) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> BarrierAsync() override;
};

}  // namespace ps

#endif  // PATRICKSTAR_COMM_LOCAL_COMMUNICATOR_H_
