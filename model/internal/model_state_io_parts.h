// ModelStateIo's internal parts (model/model_state_io.h) shared by the files it is written in:
// the host access of optimizer-state chunks on disk for reading (HostReadAccess: the staged reads
// and the training state's visit) and the host writes of every owned chunk (the parameter setters
// and the training state's load). Internal to ModelStateIo.
//
// Thread safety: thread-compatible, as ModelStateIo's writers and its reads through the manager.
#ifndef PATRICKSTAR_MODEL_INTERNAL_MODEL_STATE_IO_PARTS_H_
#define PATRICKSTAR_MODEL_INTERNAL_MODEL_STATE_IO_PARTS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "glog/logging.h"
#include "memory/device.h"
#include "model/model_state_io.h"
#include "scheduler/chunk_manager.h"

namespace ps {
namespace model_state_io_internal {

// Calls `write(tensors)` for every chunk this rank owns (its master, or for a frozen chunk its
// param payload) with the chunk's tensors for which `include` holds (all when null; a chunk with
// none is skipped), while all of its chunk types (a frozen chunk: its param chunk) are accessed on
// the host (AccessChunks, kReadWrite); releases the chunk even when `write` fails, and returns the
// first error. Frozen chunks are skipped when `trainable_only`. First drops the gathered copies
// of other ranks' chunks (ZeRO: they are stale once this rank rewrites its own).
// Calls visit(tensor) for every tensor WriteOwnedChunksOnHost(store, ..., include,
// trainable_only) would hand to `write`, in the same order, without accessing anything.
void ForEachOwnedTensor(const ChunkStore& store, const std::function<bool(TensorId)>& include,
                        bool trainable_only, absl::FunctionRef<void(TensorId)> visit);

[[nodiscard]] absl::Status WriteOwnedChunksOnHost(
    ChunkStore& store, ChunkManager& manager,
    const std::function<absl::Status(absl::Span<const TensorId> tensors)>& write,
    const std::function<bool(TensorId)>& include = nullptr, bool trainable_only = false);

}  // namespace model_state_io_internal

// The optimizer-state chunks of at most one chunk index accessed on the host through the manager
// for reading, because their payloads were not in memory (the disk tier holds them in swap files
// between accesses; the manager loads them back). Consecutive reads of one chunk's tensors share
// the access. Released by Release() or, failing that, on destruction (logged).
class ModelStateIo::HostReadAccess {
 public:
  HostReadAccess(const ChunkStore& store, ChunkManager& manager)
      : store_(store), manager_(manager) {}
  HostReadAccess(const HostReadAccess&) = delete;
  HostReadAccess& operator=(const HostReadAccess&) = delete;
  ~HostReadAccess() {
    const absl::Status released = Release();
    LOG_IF(WARNING, !released.ok()) << "GptModel: releasing a chunk read: " << released;
  }

  // Makes chunk `chunk_index` of `type` readable where it is. Nothing (no manager call) for a
  // chunk with a payload, a chunk this rank holds no payload of (View says so), and any type but
  // the optimizer state's. Otherwise releases what was accessed before and accesses, on the host
  // (kRead: a clean chunk stays clean), each optimizer-state chunk of the index that this rank
  // holds and that has no payload. FailedPrecondition inside an iteration (an access there would
  // be a moment of the schedule).
  // A frozen param chunk (a LoRA/QLoRA base the disk tier holds: offload_param "nvme") is
  // accessed the same way, alone.
  absl::Status Prepare(ChunkType type, int64_t chunk_index) {
    const ChunkLayout& layout = store_.layout();
    const bool frozen_param = type == ChunkType::kParam && !layout.chunk_trainable(chunk_index);
    if (!IsOptimizerState(type) && !frozen_param) return absl::OkStatus();
    if (chunk_index == index_ && std::find(types_.begin(), types_.end(), type) != types_.end()) {
      return absl::OkStatus();
    }
    if (store_.chunk(type, chunk_index).has_payload() ||
        !layout.HoldsPayload(type, chunk_index, store_.rank())) {
      return absl::OkStatus();
    }
    if (manager_.in_iteration()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GptModel: chunk ", store_.chunk(type, chunk_index).id().ToString(),
          " is not in memory (its bytes are on disk), and loading it inside an iteration would "
          "disturb the schedule; read it after EndIteration"));
    }
    RETURN_IF_ERROR(Release());
    std::vector<ChunkType> missing;
    if (frozen_param) {
      missing.push_back(ChunkType::kParam);
    } else {
      for (ChunkType t : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
        if (layout.HoldsPayload(t, chunk_index, store_.rank()) &&
            !store_.chunk(t, chunk_index).has_payload()) {
          missing.push_back(t);
        }
      }
    }
    RETURN_IF_ERROR(manager_.AccessChunks(chunk_index, missing, Device::Host(), AccessMode::kRead));
    index_ = chunk_index;
    types_ = std::move(missing);
    return absl::OkStatus();
  }

  // Releases the chunks accessed, if any.
  absl::Status Release() {
    if (index_ < 0) return absl::OkStatus();
    const int64_t index = index_;
    index_ = -1;
    return manager_.ReleaseChunks(index, std::exchange(types_, {}));
  }

 private:
  const ChunkStore& store_;
  ChunkManager& manager_;
  int64_t index_ = -1;
  std::vector<ChunkType> types_;
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_INTERNAL_MODEL_STATE_IO_PARTS_H_
