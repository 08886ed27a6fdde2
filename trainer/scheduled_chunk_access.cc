#include "trainer/scheduled_chunk_access.h"

#include <vector>

#include "base/status_macros.h"
#include "chunk/chunk_type.h"

namespace ps {
namespace {

std::vector<ChunkType> TypesFor(AdamChunkUse use) {
  switch (use) {
    case AdamChunkUse::kGradients:
      return {ChunkType::kParam};
    case AdamChunkUse::kRestore:
      return {ChunkType::kParam, ChunkType::kMaster};
    case AdamChunkUse::kUpdate:
      return {ChunkType::kParam, ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance};
  }
  return {};
}

// The mode of each of TypesFor(use): the gradient pass reads the param chunk; the restore pass
// writes it from the master, which it only reads (so a clean master stays clean: no write-back
// from the accelerator, no disk write from the disk tier); the update pass writes all four.
std::vector<AccessMode> ModesFor(AdamChunkUse use) {
  switch (use) {
    case AdamChunkUse::kGradients:
      return {AccessMode::kRead};
    case AdamChunkUse::kRestore:
      return {AccessMode::kReadWrite, AccessMode::kRead};
    case AdamChunkUse::kUpdate:
      return std::vector<AccessMode>(4, AccessMode::kReadWrite);
  }
  return {};
}

// The payloads of `types` of chunk `chunk_index`, on `device`.
AdamChunkPayloads PayloadsOf(const ChunkStore& store, int64_t chunk_index,
                             const std::vector<ChunkType>& types, Device device) {
  AdamChunkPayloads payloads;
  payloads.device = device;
  for (ChunkType type : types) {
    void* p = store.chunk(type, chunk_index).payload();
    switch (type) {
      case ChunkType::kParam:
        payloads.param = p;
        break;
      case ChunkType::kMaster:
        payloads.master = static_cast<float*>(p);
        break;
      case ChunkType::kMomentum:
        payloads.exp_avg = static_cast<float*>(p);
        break;
      case ChunkType::kVariance:
        payloads.exp_avg_sq = static_cast<float*>(p);
        break;
    }
  }
  return payloads;
}

}  // namespace

absl::StatusOr<AdamChunkPayloads> ScheduledChunkAccess::Acquire(int64_t chunk_index,
                                                                AdamChunkUse use) {
  const Device device = DeviceFor(chunk_index);
  const std::vector<ChunkType> types = TypesFor(use);
  RETURN_IF_ERROR(manager_.AccessChunks(chunk_index, types, device, ModesFor(use)));
  return PayloadsOf(store_, chunk_index, types, device);
}

absl::StatusOr<AdamChunkPayloads> BackwardChunkAccess::Acquire(int64_t chunk_index,
                                                               AdamChunkUse use) {
  const std::vector<ChunkType> types = TypesFor(use);
  const Device device =
      manager_.AdamPlacedOnAccelerator(chunk_index) && manager_.accelerator_in_host_memory()
          ? manager_.accelerator_device()
          : Device::Host();
  RETURN_IF_ERROR(manager_.AccessChunksInBackward(chunk_index, types, device, ModesFor(use)));
  return PayloadsOf(store_, chunk_index, types, device);
}

absl::Status BackwardChunkAccess::Release(int64_t chunk_index, AdamChunkUse use) {
  return manager_.ReleaseChunks(chunk_index, TypesFor(use));
}

absl::Status ScheduledChunkAccess::Release(int64_t chunk_index, AdamChunkUse use) {
  return manager_.ReleaseChunks(chunk_index, TypesFor(use));
}

}  // namespace ps
