#include "trainer/model_resolution.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/hf_checkpoint.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "trainer/config.h"
#include "trainer/config_validate.h"
#include "trainer/plan_options.h"

namespace ps {
namespace trainer_internal {

absl::Status ResolveModel(const TrainRun& run, ResolvedModel& resolved) {
  const std::string& init_from = run.config.checkpoint.init_from;
  std::error_code ec;
  if (init_from.empty() || !std::filesystem::is_directory(init_from, ec)) {
    // The model section (a GPT-2 or Llama-family preset, or GPT-2 dimensions); init_from, if
    // any, is a GPT-2 safetensors file.
    ASSIGN_OR_RETURN(resolved.model_config, ResolveTrainModel(run.config.model));
    resolved.gpt = GptConfigView(resolved.model_config);
    return absl::OkStatus();
  }
  // A Hugging Face model directory: the model is its config.json's.
  absl::StatusOr<HfCheckpoint> hf = HfCheckpoint::Open(init_from);
  if (!hf.ok()) {
    return absl::Status(hf.status().code(), absl::StrCat("checkpoint.init_from (--init_from): ",
                                                         hf.status().message()));
  }
  resolved.hf.emplace(*std::move(hf));
  resolved.model_config = resolved.hf->config();
  resolved.gpt = GptConfigView(resolved.model_config);
  if (run.config.data.seq_len > resolved.gpt.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("`data.seq_len` (--seq_len) = ", run.config.data.seq_len, " exceeds ",
                     init_from, "/config.json's max_position_embeddings (",
                     resolved.gpt.max_seq_len, "); use at most ", resolved.gpt.max_seq_len));
  }
  // A model section other than the default one must agree with config.json.
  TrainModelConfig defaults = DefaultTrainConfig().model, given = run.config.model;
  defaults.activation_checkpointing = given.activation_checkpointing = false;
  if (given == defaults || given == TrainModelConfig{}) return absl::OkStatus();
  ASSIGN_OR_RETURN(const GptConfig section, ResolveModelConfig(run.config.model));
  const std::string json = absl::StrCat(init_from, "/config.json");
  const std::pair<const char*, std::pair<int64_t, int64_t>> keys[] = {
      {"vocab_size", {section.vocab_size, resolved.gpt.vocab_size}},
      {"n_positions", {section.max_seq_len, resolved.gpt.max_seq_len}},
      {"n_embd", {section.hidden, resolved.gpt.hidden}},
      {"n_layer", {section.num_layers, resolved.gpt.num_layers}},
      {"n_head", {section.num_heads, resolved.gpt.num_heads}}};
  const char* hf_keys[] = {"vocab_size", "max_position_embeddings", "hidden_size",
                           "num_hidden_layers", "num_attention_heads"};
  for (size_t i = 0; i < std::size(keys); ++i) {
    if (keys[i].second.first != keys[i].second.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the config's model section (model.", keys[i].first, " = ", keys[i].second.first,
          run.config.model.preset.empty()
              ? ""
              : absl::StrCat(", model.preset \"", run.config.model.preset, "\""),
          ") contradicts ", json, " (", hf_keys[i], " = ", keys[i].second.second,
          ") of checkpoint.init_from (--init_from); the model comes from the Hugging Face "
          "directory: remove the model section (or --model)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveLora(const TrainRun& run, ResolvedModel& resolved) {
  if (!run.config.lora.has_value()) return absl::OkStatus();
  LoraConfig lora = ToLoraConfig(*run.config.lora);
  if (absl::Status s = ValidateLoraConfig(resolved.model_config, lora); !s.ok()) {
    // ValidateLoraConfig names the key ("lora.r ...", "lora.target_modules entry ..."); a
    // message that does not gets the section's name.
    if (absl::StartsWith(s.message(), "lora.")) return s;
    return absl::Status(s.code(), absl::StrCat("lora: ", s.message()));
  }
  if (run.shape.world > 1) {
    // The merged export needs the whole base in one process; the PEFT export gathers whole
    // adapter tensors, not the row blocks a saved vocabulary matrix may be split in.
    const CheckpointConfig& c = run.config.checkpoint;
    if (!c.export_merged.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint.export_merged (--export_merged) under ZeRO (", run.shape.world,
          " ranks) is not supported: merging needs the whole base in one process, which no rank "
          "holds. Export the adapter (checkpoint.export) and merge it elsewhere (peft's "
          "merge_and_unload), or drop checkpoint.export_merged"));
    }
    if (!c.export_path.empty() && !lora.modules_to_save.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint.export with lora.modules_to_save under ZeRO (", run.shape.world,
          " ranks) is not supported: the export gathers whole adapter tensors only. Drop "
          "lora.modules_to_save or checkpoint.export, or train on one process"));
    }
  }
  resolved.lora = std::move(lora);
  return absl::OkStatus();
}

absl::Status ResolveQuant4(const TrainRun& run, ResolvedModel& resolved) {
  // A pre-quantized checkpoint.init_from: with a lora section (and no 4-bit section) its
  // storage is adopted; without one it loads dequantized. Said on the console either way.
  std::optional<Quant4Config> dir_quant4;
  if (resolved.hf.has_value()) dir_quant4 = resolved.hf->quant4();
  std::optional<Quant4Config> quant4 = RunQuant4(run.config, dir_quant4);
  if (dir_quant4.has_value()) {
    resolved.prequantized_line =
        PrequantizedBaseLine(run.config.checkpoint.init_from, *dir_quant4,
                             resolved.lora.has_value(), ComputeDType(run.config.precision()));
    const bool adopted = quant4.has_value() && !run.config.quantization.load_in_4bit;
    if (adopted && quant4->double_quant && run.shape.world > 1) {
      // As ValidateTrainConfig refuses bnb_4bit_use_double_quant under ZeRO.
      return absl::UnimplementedError(absl::StrCat(
          "checkpoint.init_from (--init_from) ", run.config.checkpoint.init_from,
          " is saved pre-quantized with bnb_4bit_use_double_quant, which under ZeRO (",
          run.shape.world, " ranks) is not supported: each rank quantizes its own chunks, and "
          "the nested scales' offsets would not reach the others; train on one process"));
    }
  }
  if (!quant4.has_value()) return absl::OkStatus();
  if (absl::Status s = ValidateQuant4Config(
          resolved.model_config, resolved.lora.has_value() ? &*resolved.lora : nullptr, *quant4);
      !s.ok()) {
    if (absl::StartsWith(s.message(), "quantization.")) return s;
    return absl::Status(s.code(), absl::StrCat("quantization: ", s.message()));
  }
  resolved.quant4 = std::move(quant4);
  return absl::OkStatus();
}

bool ExportsHfDirectory(const TrainRun& run) {
  // A Llama-family model (from a preset or a directory) has no single-file GPT-2 format.
  if (run.resolved.model_config.architecture() != ModelArchitecture::kGpt2) return true;
  std::error_code ec;
  const bool hf_dir = !run.config.checkpoint.init_from.empty() &&
                      std::filesystem::is_directory(run.config.checkpoint.init_from, ec);
  return hf_dir;
}

}  // namespace trainer_internal
}  // namespace ps
