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
// Memory. A host-memory communicator (CommMemory::kHost: local, mpi) works on host-addressable
// payloads (host, pinned, or the emulated accelerator's memory); its staging buffer and scalars
// are host memory. A device-memory communicator (CommMemory::kCudaDevice: nccl) is handed device
// memory only: build it with Create() and CommCollectivesOptions::accelerator. Then
//  - the reduce-scatter staging buffer and a small scalar word are allocated once, at Create, from
//    the accelerator's scratch allocator (DeviceStagingBytes): non-model data under the device
//    cap, so the ChunkManager's tide includes it from the warm-up on and MemoryPlanOptions::
//    device_collectives adds it to the plan's reserve (scheduler/memory_plan.h);
//  - payloads move into the staging buffer with device-to-device copies on a stream of this
//    object (padding slots zero-filled with a device memset), never through the host;
//  - ReduceGradStats, AllReduceMean and AllGatherInt64 copy this rank's value into its slot of
//    the scalar word, all-gather the word on the device and copy it back to sum it on the host.
// Collectives are issued from the host after the copies they depend on completed (the host
// waits for this object's stream), and are waited for before returning: the ChunkManager
// issues them after the compute stream reached the last Release (scheduler/zero_groups.h).
//
// Every collective is waited for with `timeout`; a peer that does not arrive (died, hung) turns
// into DeadlineExceeded naming the collective instead of a hang.
//
// Thread safety: thread-compatible (one ChunkManager, one training thread).
#ifndef PATRICKSTAR_SCHEDULER_COMM_COLLECTIVES_H_
#define PATRICKSTAR_SCHEDULER_COMM_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "memory/backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "scheduler/collective_hooks.h"

namespace ps {

struct CommCollectivesOptions {
  // Bounds every wait for a collective.
  absl::Duration timeout = absl::Minutes(10);
  // Required for a device-memory communicator (ignored for a host one): the accelerator the chunk
  // payloads live on, its backend (for the copy stream), and the largest group collective
  // (elements per chunk and the compute dtype) the staging buffer is sized for. Not owned; must
  // outlive the object.
  Backend* backend = nullptr;
  DeviceMemory* accelerator = nullptr;
  int64_t chunk_elems = 0;
  DType dtype = DType::kF32;
};

class CommCollectives final : public CollectiveHooks {
 public:
  // A host-memory communicator only (a device one fails every collective with
  // FailedPrecondition naming Create). `comm` is not owned and must outlive this object.
  // `timeout` bounds every wait.
  explicit CommCollectives(Communicator* comm, absl::Duration timeout = absl::Minutes(10))
      : comm_(comm), timeout_(timeout) {}
  // Any communicator. For a device-memory one: InvalidArgument (naming the field) without
  // backend/accelerator or with a negative chunk_elems, ResourceExhausted when the staging does
  // not fit the accelerator, errors of creating the stream. `comm` must outlive the object.
  static absl::StatusOr<std::unique_ptr<CommCollectives>> Create(Communicator* comm,
                                                                 CommCollectivesOptions options);
  CommCollectives(const CommCollectives&) = delete;
  CommCollectives& operator=(const CommCollectives&) = delete;
  // Gives the device staging back.
  ~CommCollectives() override;

  // Accelerator bytes a device-memory communicator's staging takes (requested from the scratch
  // allocator, which rounds them up like any request): for world > 1 the reduce-scatter buffer of
  // `world` chunks of `chunk_elems` elements of `dtype`, plus the scalar word (world slots of 16
  // bytes), each rounded to kAllocationAlignment.
  static int64_t DeviceStagingBytes(int world, int64_t chunk_elems, DType dtype);

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

  // Staging bytes held: host bytes for a host communicator (grown at the first reduce-scatter),
  // accelerator bytes for a device one (DeviceStagingBytes, from Create on).
  int64_t staging_bytes() const {
    return device_staging_ != nullptr ? device_staging_bytes_
                                      : static_cast<int64_t>(staging_.size());
  }
  Communicator* communicator() const { return comm_; }
  bool on_device() const { return comm_->memory() != CommMemory::kHost; }

 private:
  CommCollectives(Communicator* comm, CommCollectivesOptions options);
  absl::Status CheckPayloads(absl::Span<void* const> payloads, int64_t count_elems) const;
  // All-gathers `bytes` (<= kScalarSlotBytes) bytes of every rank into `out` (world * bytes).
  absl::Status GatherBytes(const void* in, int64_t bytes, std::vector<uint8_t>& out);
  // The device path's staging: `bytes` of the reduce-scatter buffer, filled from `payloads`.
  absl::StatusOr<uint8_t*> StageOnDevice(absl::Span<void* const> payloads, int64_t bytes);
  // FailedPrecondition unless the device staging exists (the collectives of a device-memory
  // communicator were built by Create with an accelerator).
  absl::Status RequireDeviceStaging() const;

  static constexpr int64_t kScalarSlotBytes = 16;

  Communicator* const comm_;
  const absl::Duration timeout_;
  std::vector<uint8_t> staging_;
  // Device communicators only.
  CommCollectivesOptions options_;
  std::unique_ptr<Stream> stream_;
  void* device_staging_ = nullptr;
  int64_t device_staging_bytes_ = 0;
  // Offsets in device_staging_: the scalar word, and the reduce-scatter buffer's size.
  int64_t scalar_offset_ = 0;
  int64_t reduce_staging_bytes_ = 0;
};

}  // namespace ps

#endif  // PATRICKSTAR_SCHEDULER_COMM_COLLECTIVES_H_
