// ModelStateIo's training state (model/model_state_io.h): what a checkpoint holds of every
// trainable tensor this rank owns (master, momentum, variance), loaded and visited.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "model/internal/model_state_io_parts.h"
#include "model/model_state_io.h"
#include "scheduler/chunk_manager.h"

namespace ps {

absl::Status ModelStateIo::LoadTrainingState(const TrainingStateFillFn& fill) {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: the training state can only be loaded outside an iteration");
  }
  const ChunkLayout& layout = parts_.store->layout();
  std::vector<float> values;
  return model_state_io_internal::WriteOwnedChunksOnHost(
      *parts_.store, *parts_.manager,
      [&](absl::Span<const TensorId> tensors) -> absl::Status {
        for (TensorId t : tensors) {
          const TensorInfo& info = layout.tensor(t);
          values.assign(static_cast<size_t>(info.numel), 0.0f);
          for (ChunkType type : {ChunkType::kMomentum, ChunkType::kVariance, ChunkType::kMaster}) {
            RETURN_IF_ERROR(fill(info.name, type, absl::MakeSpan(values)));
            ASSIGN_OR_RETURN(TensorView v, parts_.store->View(type, t));
            RETURN_IF_ERROR(RequireHostPayload(v, "loading the training state"));
            std::memcpy(v.data, values.data(), values.size() * sizeof(float));
          }
          // `values` holds the master values now.
          ASSIGN_OR_RETURN(TensorView param, parts_.store->View(ChunkType::kParam, t));
          RETURN_IF_ERROR(RequireHostPayload(param, "loading the training state"));
          RETURN_IF_ERROR(
              Convert(DType::kF32, values.data(), param.dtype, param.data, param.numel));
        }
        return absl::OkStatus();
      },
      /*include=*/nullptr, /*trainable_only=*/true);
}

absl::Status ModelStateIo::VisitTrainingState(const TrainingStateVisitFn& visit) const {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: the training state can only be read outside an iteration");
  }
  // The checkpoint's order (each name's master, momentum, variance in turn) is kept; a chunk
  // whose payloads are on disk is accessed once for the run of its tensors, which follow one
  // another in that order (ParameterNames is the layout's placement order).
  HostReadAccess access(*parts_.store, *parts_.manager);
  std::vector<float> values;
  for (const TrainingStateTensor& t : TrainingStateTensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    values.assign(static_cast<size_t>(numel), 0.0f);
    absl::Status status = ReadRange(t.type, t.name, 0, absl::MakeSpan(values), access);
    if (status.ok()) status = visit(t.name, t.type, values);
    if (!status.ok()) {
      (void)access.Release();  // the first error is the one to report
      return status;
    }
  }
  return access.Release();
}

std::vector<TrainingStateTensor> ModelStateIo::TrainingStateTensors() const {
  std::vector<TrainingStateTensor> tensors;
  for (const TensorSpec& spec : ParameterSpecs()) {
    if (!HoldsTrainingState(spec.name)) continue;  // another rank's (ZeRO)
    for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
      tensors.push_back({.name = spec.name, .type = type, .shape = spec.shape});
    }
  }
  return tensors;
}

bool ModelStateIo::HoldsTrainingState(absl::string_view name) const {
  const ChunkLayout& layout = parts_.store->layout();
  absl::StatusOr<TensorId> t = layout.FindTensor(name);
  return t.ok() && layout.HoldsPayload(ChunkType::kMaster, layout.tensor(*t).chunk_index,
                                       parts_.store->rank());
}

}  // namespace ps
