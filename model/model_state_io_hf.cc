// ModelStateIo's Hugging Face and GPT-2 imports and exports (model/model_state_io.h): a
// Hugging Face directory or a GPT-2 checkpoint into the parameters, the master weights out.
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/gpt2_checkpoint.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"
#include "model/model_state_io.h"
#include "model/quant4_config.h"
#include "model/quant4_import.h"
#include "model/safetensors.h"
#include "scheduler/chunk_manager.h"

namespace ps {

absl::Status ModelStateIo::LoadGpt2Checkpoint(const Gpt2Checkpoint& checkpoint) {
  if (parts_.model_config->architecture() != ModelArchitecture::kGpt2) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::LoadGpt2Checkpoint: model '", parts_.config->name, "' is a ",
                     ModelFamilyName(parts_.model_config->family),
                     " model, not GPT-2; load a Hugging Face directory (LoadHfCheckpoint)"));
  }
  if (!(checkpoint.dims() == parts_.dims)) {
    std::ostringstream os;
    os << "GptModel: the checkpoint's dimensions " << checkpoint.dims()
       << " differ from the model's " << parts_.dims << " (config '" << parts_.config->name << "')";
    return absl::InvalidArgumentError(os.str());
  }
  const ChunkLayout& layout = parts_.store->layout();
  return SetParameters([&](TensorId t, absl::Span<float> out) {
    const std::string& name = layout.tensor(t).name;
    if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
      return checkpoint.ReadF32(block->base, block->row_begin * parts_.config->hidden, out);
    }
    return checkpoint.ReadF32(name, out);
  });
}

absl::Status ModelStateIo::LoadHfCheckpoint(const HfCheckpoint& checkpoint,
                                            const ProgressFn& progress) {
  ModelConfig theirs = checkpoint.config(), ours = *parts_.model_config;
  theirs.name = ours.name = "";
  theirs.torch_dtype = ours.torch_dtype = std::nullopt;
  if (!(theirs == ours)) {
    std::ostringstream os;
    os << "GptModel: the Hugging Face model in " << checkpoint.dir() << " (" << checkpoint.config()
       << ") differs from the model's configuration (" << *parts_.model_config << ")";
    return absl::InvalidArgumentError(os.str());
  }
  const ChunkLayout& layout = parts_.store->layout();
  return SetParametersInPieces(
      [&](TensorId t, int64_t first, absl::Span<float> out) {
        const std::string& name = layout.tensor(t).name;
        if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
          return checkpoint.ReadAsF32(block->base,
                                      block->row_begin * parts_.config->hidden + first, out);
        }
        return checkpoint.ReadAsF32(name, first, out);
      },
      [&](TensorId t) { return !is_adapter(t); },
      [&](TensorId t, absl::Span<uint8_t> blob, float* offset) -> absl::StatusOr<bool> {
        // A weight the directory holds pre-quantized: its codes and scales as they are, when
        // they are this model's format (else refused: re-quantizing them would quantize twice).
        const std::string& name = layout.tensor(t).name;
        const Quant4Format* theirs = checkpoint.Quant4Of(name);
        if (theirs == nullptr) return false;
        const Quant4Format& ours = *quant4(t);
        if (!(*theirs == ours)) {
          auto describe = [](const Quant4Format& f) {
            return absl::StrCat(Quant4TypeName(f.type),
                                f.nested ? " with double quantization" : " with plain absmax");
          };
          return absl::InvalidArgumentError(absl::StrCat(
              "model directory '", checkpoint.dir(), "' holds '", name, "' pre-quantized as ",
              describe(*theirs), " but this run stores it as ", describe(ours),
              ": set quantization.bnb_4bit_quant_type / bnb_4bit_use_double_quant to the "
              "directory's (its config.json quantization_config)"));
        }
        ASSIGN_OR_RETURN(const Quant4Imported imported, checkpoint.ImportQuant4(name, blob));
        *offset = imported.nested_offset;
        return true;
      },
      // The directory's reads are const: pieces on several threads.
      progress, [&](TensorId t) -> int64_t {
        // The bytes the directory holds for the tensor's elements (a row block: its rows).
        std::string name = layout.tensor(t).name;
        if (const std::optional<RowBlockName> block = ParseRowBlockName(name); block.has_value()) {
          name = block->base;
        }
        const SafetensorsTensorInfo* info = checkpoint.Find(name);
        const int64_t numel = LogicalNumel(t);
        if (info == nullptr || info->num_elements <= 0) return numel;
        return info->size_bytes() / info->num_elements * numel;
      });
}

absl::Status ModelStateIo::SaveHfCheckpoint(const std::string& dir, DType dtype,
                                            const HfExportOptions& options) const {
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: export the parameters outside an iteration (after EndIteration)");
  }
  if (parts_.store->layout().world_size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::SaveHfCheckpoint: this rank holds the master weights of its own chunks only "
        "(ZeRO, world size ",
        parts_.store->layout().world_size(), "); gather them first, as the trainer's export does"));
  }
  return WriteHfCheckpoint(
      dir, *parts_.model_config, dtype,
      ConvertingFill(
          [&](const TensorSpec& tensor, int64_t first_elem, absl::Span<float> dst) {
            return ReadTensorRange(ChunkType::kMaster, tensor.name, first_elem, dst);
          },
          dtype),
      options);
}

absl::Status ModelStateIo::SaveGpt2Safetensors(const std::string& path, DType dtype) const {
  if (parts_.model_config->architecture() != ModelArchitecture::kGpt2) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::SaveGpt2Safetensors: model '", parts_.config->name, "' is a ",
                     ModelFamilyName(parts_.model_config->family),
                     " model, not GPT-2; export a Hugging Face directory (SaveHfCheckpoint)"));
  }
  if (parts_.manager->in_iteration()) {
    return absl::FailedPreconditionError(
        "GptModel: export the parameters outside an iteration (after EndIteration)");
  }
  if (parts_.store->layout().world_size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptModel::SaveGpt2Safetensors: this rank holds the master weights of its own chunks "
        "only (ZeRO, world size ",
        parts_.store->layout().world_size(),
        "); gather them first, as the trainer's export does (trainer/trainer.h)"));
  }
  return WriteGpt2Safetensors(path, parts_.dims, dtype,
                              [&](absl::string_view name, absl::Span<float> out) -> absl::Status {
                                return ReadTensorInto(ChunkType::kMaster, name, out);
                              });
}

}  // namespace ps
