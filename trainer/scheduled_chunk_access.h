// ScheduledChunkAccess: HybridAdam's view of the scheduler's ADAM-stage placement.
//
// It implements AdamChunkAccess (optimizer/hybrid_adam.h) over a ChunkManager: the optimizer step
// of an iteration calls ChunkManager::BeginAdam() for the placement, then HybridAdam::Step() with
// this object, which makes each chunk's payloads resident — on the accelerator for the chunk
// indices the placement keeps there, on the host for the rest — through AccessChunks, and gives
// them back with ReleaseChunks. The gradient pass only reads the param chunk; the restore pass
// (after an overflow, and after micro-batches with gradient accumulation) writes it and only
// reads the master (one AccessChunks with a mode per type, so an unchanged master is never
// written back — by the accelerator tier nor the disk tier); the update pass writes all four
// types.
//
// It lives in the trainer, which joins the two: optimizer/ never depends on scheduler/ (HybridAdam
// runs without a scheduler through ResidentChunkAccess), and the model does not run optimizers.
// trainer/train_step.h uses it for the optimizer step of every training iteration.
//
// Thread safety: thread-compatible; the manager and store must outlive it.
#ifndef PATRICKSTAR_TRAINER_SCHEDULED_CHUNK_ACCESS_H_
#define PATRICKSTAR_TRAINER_SCHEDULED_CHUNK_ACCESS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chunk/chunk_store.h"
#include "memory/device.h"
#include "optimizer/hybrid_adam.h"
#include "scheduler/chunk_manager.h"

namespace ps {

class ScheduledChunkAccess final : public AdamChunkAccess {
 public:
  // `accelerator` is the manager's accelerator device; `placement` what BeginAdam() returned for
  // this step.
  ScheduledChunkAccess(ChunkManager& manager, const ChunkStore& store, Device accelerator,
                       AdamPlacement placement)
      : manager_(manager),
        store_(store),
        accelerator_(accelerator),
        placement_(std::move(placement)) {}

  [[nodiscard]] absl::StatusOr<AdamChunkPayloads> Acquire(int64_t chunk_index,
                                                          AdamChunkUse use) override;
  [[nodiscard]] absl::Status Release(int64_t chunk_index, AdamChunkUse use) override;

  bool HostAddressable(Device device) const override {
    return device.is_host() || manager_.accelerator_in_host_memory();
  }

  // Where chunk `chunk_index` runs this step.
  Device DeviceFor(int64_t chunk_index) const {
    return placement_.OnAccelerator(chunk_index) ? accelerator_ : Device::Host();
  }

 private:
  ChunkManager& manager_;
  const ChunkStore& store_;
  const Device accelerator_;
  const AdamPlacement placement_;
};

// HybridAdam's view of a chunk whose gradients became final inside backward (optimizer.overlap,
// docs/pipeline.md): the chunk's payloads where the learned ADAM placement runs it (the
// accelerator only when its memory is host RAM; the host otherwise — a chunk the placement keeps
// on a GPU is not speculated: trainer/train_step.cc), through ChunkManager::AccessChunksInBackward
// (which waits for the compute stream and is no moment of the schedule), released with
// ReleaseChunks. For HybridAdam::SpeculateChunk and AbortSpeculation, called from the manager's
// gradients-final hook (trainer/train_step.cc).
class BackwardChunkAccess final : public AdamChunkAccess {
 public:
  BackwardChunkAccess(ChunkManager& manager, const ChunkStore& store)
      : manager_(manager), store_(store) {}

  [[nodiscard]] absl::StatusOr<AdamChunkPayloads> Acquire(int64_t chunk_index,
                                                          AdamChunkUse use) override;
  [[nodiscard]] absl::Status Release(int64_t chunk_index, AdamChunkUse use) override;
  bool HostAddressable(Device device) const override {
    return device.is_host() || manager_.accelerator_in_host_memory();
  }

 private:
  ChunkManager& manager_;
  const ChunkStore& store_;
};

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_SCHEDULED_CHUNK_ACCESS_H_
