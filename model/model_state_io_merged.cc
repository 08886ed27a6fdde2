// ModelStateIo's merged export (model/model_state_io.h): a Hugging Face directory of the base
// weights with each LoRA adapter's delta (B A scaled, as peft's merge_and_unload) added.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/lora_config.h"
#include "model/model_state_io.h"

namespace ps {

absl::Status ModelStateIo::SaveMergedHfCheckpoint(const std::string& dir, DType dtype,
                                                  const HfExportOptions& options) const {
  RETURN_IF_ERROR(CheckExport("SaveMergedHfCheckpoint", /*need_lora=*/true, /*whole_model=*/true));
  absl::flat_hash_map<std::string, LoraTarget> targets;
  for (LoraTarget& t : LoraTargets(*parts_.model_config, *parts_.lora)) {
    std::string weight = t.base_weight;
    targets.emplace(std::move(weight), std::move(t));
  }
  const int64_t r = parts_.lora->r;
  const float scale = static_cast<float>(parts_.lora->scale());
  // The adapter of the weight being written (the writer asks for a tensor's ranges in order).
  const LoraTarget* cached = nullptr;
  std::vector<float> a, b;
  return WriteHfCheckpoint(
      dir, *parts_.model_config, dtype,
      ConvertingFill(
          [&](const TensorSpec& tensor, int64_t first_elem, absl::Span<float> dst) -> absl::Status {
            RETURN_IF_ERROR(ReadTensorRange(ChunkType::kMaster, tensor.name, first_elem, dst));
            const auto it = targets.find(tensor.name);
            if (it == targets.end()) return absl::OkStatus();
            const LoraTarget& t = it->second;
            if (cached != &t) {
              cached = nullptr;
              a.resize(static_cast<size_t>(r * t.in));
              b.resize(static_cast<size_t>(t.out * r));
              RETURN_IF_ERROR(ReadTensorInto(ChunkType::kMaster, t.a, absl::MakeSpan(a)));
              RETURN_IF_ERROR(ReadTensorInto(ChunkType::kMaster, t.b, absl::MakeSpan(b)));
              cached = &t;
            }
            // PEFT's get_delta_weight: (B @ A) * scaling (transposed for Conv1D), in f32.
            for (size_t j = 0; j < dst.size(); ++j) {
              const int64_t e = first_elem + static_cast<int64_t>(j);
              const int64_t o = t.conv1d ? e % t.out : e / t.in;
              const int64_t i = t.conv1d ? e / t.out : e % t.in;
              float delta = 0.0f;
              for (int64_t k = 0; k < r; ++k) delta += b[o * r + k] * a[k * t.in + i];
              dst[j] += delta * scale;
            }
            return absl::OkStatus();
          },
          dtype),
      options);
}

}  // namespace ps
