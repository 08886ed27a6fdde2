// CommCollectives: the ZeRO group collectives of scheduler/collective_hooks.h over a comm/
// Communicator, for ChunkManagerOptions::collectives.
//
//  - AllGatherGroup: one broadcast per data chunk of the group, rooted at its owner, in place in
//    the chunk payloads (issued together, then waited for). Chunk payloads are separate
//    chunk-pool blocks, not one contiguous buffer, so a single all-gather would need a staging
//    buffer of N chunks and two extra copies; N broadcasts move the same bytes into place.
//    Padding chunks (null payloads) are skipped on every rank.
//  - ReduceScatterGroup: the N payloads are copied into a contiguous staging buffer (padding
//    slots zero-filled), reduce-scattered with ReduceOp::kAvg into this rank's payload. With a
//    16-bit compute dtype the mean is accumulated in f32 and rounded once (local, mpi; nccl uses
//    its own arithmetic). The staging buffer (N chunks of the compute dtype) is host memory owned
//    here, allocated at the first reduce-scatter and kept (staging_bytes()).
//  - ReduceGradStats: the optimizer's gradient statistics (sum of squares, Inf/NaN count) summed
//    over ranks for HybridAdamOptions::grad_stats_reducer, so every rank takes the same
//    step/skip and clipping decision. The per-rank values are all-gathered as bytes and summed in
//    rank order in double on every rank: bit-identical everywhere (the communicator has no f64
//    reduction).
//  - AllReduceMean: a scalar (e.g. the loss) averaged over ranks, in double, the same way.
//
// Buffers must be in the communicator's memory (CommMemory::kHost: host, pinned, or the emulated
// accelerator's memory). Every collective is waited for with `timeout`; a peer that does not
// arrive (died, hung) turns into DeadlineExceeded naming the collective instead of a hang.
//
// Thread safety: thread-compatible (one ChunkManager, one training thread).
#ifndef PATRICKSTAR_SCHEDULER_COMM_COLLECTIVES_H_
#define PATRICKSTAR_SCHEDULER_COMM_COLLECTIVES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "memory/dtype.h"
#include "scheduler/collective_hooks.h"

namespace ps {

class CommCollectives final : public CollectiveHooks {
 public:
  // `comm` is not owned and must outlive this object. `timeout` bounds every wait.
  explicit CommCollectives(Communicator* comm, absl::Duration timeout = absl::Minutes(10))
      : comm_(comm), timeout_(timeout) {}

  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->world_size(); }

  // InvalidArgument for a payload count that is not world_size() or a negative count.
  [[nodiscard]] absl::Status AllGatherGroup(int64_t group, absl::Span<void* const> payloads,
                                            int64_t count_elems, DType dtype) override;
  [[nodiscard]] absl::Status ReduceScatterGroup(int64_t group, absl::Span<void* const> payloads,
                                                int64_t count_elems, DType dtype) override;

  // Sums (sum_squares, nonfinite_elems) over ranks, in place.
  [[nodiscard]] absl::Status ReduceGradStats(double& sum_squares, int64_t& nonfinite_elems);
  // The mean over ranks of `value`.
  [[nodiscard]] absl::StatusOr<double> AllReduceMean(double value);
  // Every rank's `value`, by rank (for agreeing on flags, steps, errors).
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> AllGatherInt64(int64_t value);

  int64_t staging_bytes() const { return static_cast<int64_t>(staging_.size()); }
  Communicator* communicator() const { return comm_; }

 private:
  absl::Status CheckPayloads(absl::Span<void* const> payloads, int64_t count_elems) const;
  // All-gathers `bytes` bytes of every rank into `out` (world * bytes).
  absl::Status GatherBytes(const void* in, int64_t bytes, std::vector<uint8_t>& out);

  Communicator* const comm_;
  const absl::Duration timeout_;
  std::vector<uint8_t> staging_;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_COMM_COLLECTIVES_H_
