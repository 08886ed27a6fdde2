// Which model a training run trains: the config's model section (a GPT-2 or Llama-family preset,
// or GPT-2 dimensions), or the Hugging Face directory checkpoint.init_from names (its config.json;
// a model section other than the default one must agree with it) — and, from that, which format
// checkpoint.export writes.
#ifndef PATRICKSTAR_TRAINER_MODEL_RESOLUTION_H_
#define PATRICKSTAR_TRAINER_MODEL_RESOLUTION_H_

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Sets resolved.model_config, resolved.gpt (its GPT-2 view) and, for a Hugging Face directory,
// resolved.hf (`resolved` is run.resolved: this file writes that part of the run).
// Errors: the directory's (prefixed with checkpoint.init_from); InvalidArgument when data.seq_len
// exceeds the directory's max_position_embeddings, or the model section contradicts config.json
// (naming both keys and values).
[[nodiscard]] absl::Status ResolveModel(const TrainRun& run, ResolvedModel& resolved);

// Sets resolved.lora from the lora section and checks it against resolved.model_config
// (ValidateLoraConfig): unknown target modules (listing the model's linear layers), r larger than
// a targeted layer, modules_to_save that the model lacks, ... as InvalidArgument whose message
// starts with the key the config names ("lora.target_modules entry 'x' matches no module; ...").
// With a lora section under ZeRO (world > 1), also InvalidArgument for checkpoint.export_merged
// (merging needs the whole base in one process) and for checkpoint.export with
// lora.modules_to_save (the export gathers whole adapter tensors only): refused before anything
// runs. REQUIRES: ResolveModel(run, run.resolved) succeeded; `resolved` is run.resolved.
[[nodiscard]] absl::Status ResolveLora(const TrainRun& run, ResolvedModel& resolved);

// Sets resolved.quant4 (RunQuant4: the quantization section when load_in_4bit, or with a lora
// section the storage of a checkpoint.init_from saved pre-quantized; resolved.prequantized_line
// says which for such a directory) and checks it against
// resolved.model_config and resolved.lora (ValidateQuant4Config): InvalidArgument for
// lora.modules_to_save covering a weight that would be 4-bit or an empty skip entry,
// Unimplemented for a compute dtype other than float32, FailedPrecondition without LoRA (which
// ValidateTrainConfig refuses before, as InvalidArgument, with double quantization under ZeRO);
// each message names its quantization.* key. REQUIRES: ResolveLora(run, resolved) succeeded; `resolved` is run.resolved.
[[nodiscard]] absl::Status ResolveQuant4(const TrainRun& run, ResolvedModel& resolved);

// Whether checkpoint.export writes a Hugging Face directory (a Llama-family model, or a model from
// a Hugging Face directory) rather than a GPT-2 safetensors file. Needs only run.config and, after
// ResolveModel, run.resolved.model_config.
bool ExportsHfDirectory(const TrainRun& run);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_MODEL_RESOLUTION_H_
