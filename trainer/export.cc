#include "trainer/export.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "comm/communicator.h"
#include "memory/backend.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/peft_adapter.h"
#include "trainer/model_resolution.h"

namespace ps {
namespace trainer_internal {
namespace {

// Broadcasts `values` from `owner` to every rank (in place), through a device tile when the
// communicator takes device memory only.
absl::Status BroadcastFromOwner(const TrainRun& run, std::vector<float>& values, int owner) {
  const int64_t elems = static_cast<int64_t>(values.size());
  if (!run.runtime.collectives->on_device()) {
    ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                     run.runtime.collectives->communicator()->BroadcastAsync(
                         values.data(), values.data(), elems, CommDType::kF32, owner));
    return request->Wait(run.env.comm_timeout);
  }
  // Device memory only: tile by tile through a scratch buffer the manager kept free
  // (run.memory.reserve.export_tile_bytes), the owner copying each tile in and every rank copying
  // it out.
  const int64_t tile_elems = std::max<int64_t>(
      1, run.memory.reserve.export_tile_bytes / static_cast<int64_t>(sizeof(float)));
  const int64_t tile_bytes = std::min(elems, tile_elems) * static_cast<int64_t>(sizeof(float));
  if (tile_bytes == 0) return absl::OkStatus();
  // The copies go on the compute stream (after any compute still queued), not a stream created
  // per tensor.
  Stream* stream = run.runtime.compute_stream.get();
  ASSIGN_OR_RETURN(void* tile, run.runtime.accelerator->scratch()->Allocate(tile_bytes));
  absl::Status s = absl::OkStatus();
  for (int64_t first = 0; first < elems && s.ok(); first += tile_elems) {
    const int64_t n = std::min(tile_elems, elems - first);
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    if (owner == run.shape.rank) {
      s = stream->MemcpyAsync(tile, values.data() + first, bytes, CopyKind::kHostToDevice);
      if (s.ok()) s = stream->Synchronize();
      if (!s.ok()) break;
    }
    absl::StatusOr<std::unique_ptr<CommRequest>> request =
        run.runtime.collectives->communicator()->BroadcastAsync(tile, tile, n, CommDType::kF32,
                                                                owner);
    s = request.ok() ? (*request)->Wait(run.env.comm_timeout) : request.status();
    if (!s.ok()) break;
    s = stream->MemcpyAsync(values.data() + first, tile, bytes, CopyKind::kDeviceToHost);
    if (s.ok()) s = stream->Synchronize();
  }
  s.Update(run.runtime.accelerator->scratch()->Deallocate(tile, tile_bytes));
  return s;
}

}  // namespace

absl::Status ExportPeftAdapter(const TrainRun& run, const std::string& path) {
  // What peft's from_pretrained would load the base from: the init_from directory, else the
  // preset's name (a seeded base: the name documents the architecture, not the weights).
  const std::string base = run.config.checkpoint.init_from.empty()
                               ? run.config.model.preset
                               : run.config.checkpoint.init_from;
  if (run.runtime.collectives == nullptr)
    return run.runtime.model->SavePeftAdapter(path, DType::kF32, base);
  // ZeRO: each adapter tensor is broadcast from the rank that owns it (whole tensors: adapters
  // are never split in row blocks; ResolveLora refuses modules_to_save here), and rank 0 writes
  // the directory.
  const ChunkLayout& layout = run.runtime.store->layout();
  std::map<std::string, std::vector<float>> gathered;
  for (const TensorSpec& spec : PeftAdapterTensors(run.resolved.model_config, *run.resolved.lora)) {
    ASSIGN_OR_RETURN(TensorId t, layout.FindTensor(spec.name));
    const int owner = layout.owner_of(layout.tensor(t).chunk_index);
    std::vector<float> values(static_cast<size_t>(layout.tensor(t).numel), 0.0f);
    if (owner == run.shape.rank) {
      ASSIGN_OR_RETURN(values, run.runtime.model->ReadTensor(ChunkType::kMaster, spec.name));
    }
    RETURN_IF_ERROR(BroadcastFromOwner(run, values, owner));
    if (run.shape.rank == 0) gathered.emplace(spec.name, std::move(values));
  }
  absl::Status written = absl::OkStatus();
  if (run.shape.rank == 0) {
    written = WritePeftAdapter(
        path, run.resolved.model_config, *run.resolved.lora, base,
        [&](const TensorSpec& tensor, absl::Span<float> dst) -> absl::Status {
          auto it = gathered.find(tensor.name);
          if (it == gathered.end() || it->second.size() != dst.size()) {
            return absl::InternalError(
                absl::StrCat("export: adapter tensor '", tensor.name, "' not gathered"));
          }
          std::copy(it->second.begin(), it->second.end(), dst.begin());
          return absl::OkStatus();
        },
        DType::kF32);
  }
  ASSIGN_OR_RETURN(const bool failed, run.AnyRank(!written.ok()));
  RETURN_IF_ERROR(written);
  if (failed) return absl::InternalError("export: rank 0 failed to write the adapter directory");
  return absl::OkStatus();
}

absl::Status ExportMerged(const TrainRun& run, const std::string& path) {
  HfExportOptions hf_options;
  if (run.resolved.hf.has_value()) hf_options.base_config_json = run.resolved.hf->config_json();
  return run.runtime.model->SaveMergedHfCheckpoint(path, DType::kF32, hf_options);
}

absl::Status Export(const TrainRun& run, const std::string& path) {
  if (run.resolved.lora.has_value()) return ExportPeftAdapter(run, path);
  HfExportOptions hf_options;
  if (run.resolved.hf.has_value()) hf_options.base_config_json = run.resolved.hf->config_json();
  if (run.runtime.collectives == nullptr) {
    if (ExportsHfDirectory(run))
      return run.runtime.model->SaveHfCheckpoint(path, DType::kF32, hf_options);
    return run.runtime.model->SaveGpt2Safetensors(path, DType::kF32);
  }
  // Gather: each tensor is broadcast from its owner, in checkpoint order; rank 0 keeps them.
  const ChunkLayout& layout = run.runtime.store->layout();
  std::map<std::string, std::vector<float>> gathered;
  for (const std::string& name : run.runtime.model->ParameterNames()) {
    ASSIGN_OR_RETURN(TensorId t, layout.FindTensor(name));
    const int owner = layout.owner_of(layout.tensor(t).chunk_index);
    std::vector<float> values(static_cast<size_t>(layout.tensor(t).numel), 0.0f);
    if (owner == run.shape.rank) {
      ASSIGN_OR_RETURN(values, run.runtime.model->ReadTensor(ChunkType::kMaster, name));
    }
    RETURN_IF_ERROR(BroadcastFromOwner(run, values, owner));
    if (run.shape.rank == 0) gathered.emplace(name, std::move(values));
  }
  absl::Status written = absl::OkStatus();
  if (run.shape.rank == 0 && ExportsHfDirectory(run)) {
    // Element ranges of the gathered tensors (whole, or assembled from row blocks).
    const int64_t hidden = run.resolved.model_config.hidden_size;
    written = WriteHfCheckpoint(
        path, run.resolved.model_config, DType::kF32,
        ConvertingFill(
            [&](const TensorSpec& tensor, int64_t first, absl::Span<float> dst) -> absl::Status {
              const int64_t n = static_cast<int64_t>(dst.size());
              if (auto it = gathered.find(tensor.name); it != gathered.end()) {
                if (first + n > static_cast<int64_t>(it->second.size())) {
                  return absl::InternalError(absl::StrCat("export: '", tensor.name, "' range"));
                }
                std::copy(it->second.begin() + first, it->second.begin() + first + n, dst.begin());
                return absl::OkStatus();
              }
              int64_t filled = 0;
              for (const auto& [stored, values] : gathered) {
                const std::optional<RowBlockName> block = ParseRowBlockName(stored);
                if (!block.has_value() || block->base != tensor.name) continue;
                const int64_t lo = std::max(first, block->row_begin * hidden);
                const int64_t hi = std::min(
                    first + n, block->row_begin * hidden + static_cast<int64_t>(values.size()));
                if (lo >= hi) continue;
                std::copy(values.begin() + (lo - block->row_begin * hidden),
                          values.begin() + (hi - block->row_begin * hidden),
                          dst.begin() + (lo - first));
                filled += hi - lo;
              }
              if (filled != n) {
                return absl::InternalError(
                    absl::StrCat("export: tensor '", tensor.name, "' not gathered"));
              }
              return absl::OkStatus();
            },
            DType::kF32),
        hf_options);
  } else if (run.shape.rank == 0) {
    written = WriteGpt2Safetensors(
        path, run.runtime.model->dims(), DType::kF32,
        [&](absl::string_view name, absl::Span<float> out) -> absl::Status {
          auto it = gathered.find(std::string(name));
          if (it != gathered.end() && it->second.size() == out.size()) {
            std::copy(it->second.begin(), it->second.end(), out.begin());
            return absl::OkStatus();
          }
          // A tensor held in row blocks ("wte.weight[r0:r1]"): assembled.
          int64_t filled = 0;
          for (const auto& [stored, values] : gathered) {
            const std::optional<RowBlockName> block = ParseRowBlockName(stored);
            if (!block.has_value() || block->base != name) continue;
            const int64_t first = block->row_begin * run.resolved.gpt.hidden;
            if (first + static_cast<int64_t>(values.size()) > static_cast<int64_t>(out.size())) {
              return absl::InternalError(absl::StrCat("export: block '", stored, "' out of range"));
            }
            std::copy(values.begin(), values.end(), out.begin() + first);
            filled += static_cast<int64_t>(values.size());
          }
          if (filled != static_cast<int64_t>(out.size())) {
            return absl::InternalError(absl::StrCat("export: tensor '", name, "' not gathered"));
          }
          return absl::OkStatus();
        });
  }
  // Every rank learns whether rank 0 wrote the file.
  ASSIGN_OR_RETURN(const bool failed, run.AnyRank(!written.ok()));
  RETURN_IF_ERROR(written);
  if (failed) return absl::InternalError("export: rank 0 failed to write the file");
  return absl::OkStatus();
}

}  // namespace trainer_internal
}  // namespace ps
