// ModelStateIo's PEFT adapter (model/model_state_io.h): a peft adapter directory loaded into the
// LoRA adapters (checked against the model's LoRA configuration) and saved from them.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/model_state_io.h"
#include "model/peft_adapter.h"

namespace ps {

absl::Status ModelStateIo::LoadPeftAdapter(const std::string& dir) {
  RETURN_IF_ERROR(CheckExport("LoadPeftAdapter", /*need_lora=*/true, /*whole_model=*/false));
  const ModelConfig& model = *parts_.model_config;
  ASSIGN_OR_RETURN(PeftAdapter adapter, ReadPeftAdapter(dir, model));
  const LoraConfig& ours = *parts_.lora;
  const LoraConfig& theirs = adapter.lora;
  auto mismatch = [&](absl::string_view key, absl::string_view their_value,
                      absl::string_view our_value) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel::LoadPeftAdapter: the adapter in ", dir, " has ", key, " = ", their_value,
        " but the model's LoRA configuration has ", key, " = ", our_value,
        "; load an adapter trained with this configuration or change the `lora` section"));
  };
  if (theirs.r != ours.r) return mismatch("r", absl::StrCat(theirs.r), absl::StrCat(ours.r));
  if (theirs.lora_alpha != ours.lora_alpha) {
    return mismatch("lora_alpha", absl::StrCat(theirs.lora_alpha), absl::StrCat(ours.lora_alpha));
  }
  auto modules = [&](const LoraConfig& lora) {
    std::vector<std::string> names;
    for (const LoraTarget& t : LoraTargets(model, lora)) names.push_back(t.module);
    return names;
  };
  auto list = [](absl::Span<const std::string> v) {
    return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
  };
  if (modules(theirs) != modules(ours)) {
    return mismatch("target_modules", list(theirs.target_modules), list(ours.target_modules));
  }
  if (LoraSavedTensors(model, theirs) != LoraSavedTensors(model, ours)) {
    return mismatch("modules_to_save", list(theirs.modules_to_save), list(ours.modules_to_save));
  }
  const ChunkLayout& layout = parts_.store->layout();
  // A stored tensor's whole-tensor name and the offset of its first element there.
  auto whole = [&](TensorId t) -> std::pair<std::string, int64_t> {
    const std::string& name = layout.tensor(t).name;
    if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
      return {block->base, block->row_begin * parts_.config->hidden};
    }
    return {name, 0};
  };
  return SetParameters(
      [&](TensorId t, absl::Span<float> out) -> absl::Status {
        const auto [name, first] = whole(t);
        const std::vector<float>& values = adapter.tensors.at(name);
        CHECK_LE(first + static_cast<int64_t>(out.size()), static_cast<int64_t>(values.size()));
        std::copy_n(values.begin() + first, out.size(), out.begin());
        return absl::OkStatus();
      },
      [&](TensorId t) { return adapter.tensors.contains(whole(t).first); });
}

absl::Status ModelStateIo::SavePeftAdapter(const std::string& dir, DType dtype,
                                           const std::string& base_model_name_or_path) const {
  RETURN_IF_ERROR(CheckExport("SavePeftAdapter", /*need_lora=*/true, /*whole_model=*/true));
  return WritePeftAdapter(
      dir, *parts_.model_config, *parts_.lora, base_model_name_or_path,
      [&](const TensorSpec& tensor, absl::Span<float> dst) {
        return ReadTensorInto(ChunkType::kMaster, tensor.name, dst);
      },
      dtype);
}

}  // namespace ps
