// checkpoint.export at the end of a training run: the trained weights as f32, in the model's
// format — a Hugging Face directory (Llama family, or a model from one) or a GPT-2 safetensors
// file (trainer/model_resolution.h ExportsHfDirectory). Under ZeRO every master weight is
// broadcast from the rank that owns it, one tensor at a time, and rank 0 writes the file; with a
// device-memory communicator (nccl) each broadcast goes through a device tile
// (AcceleratorReserve::export_tile_bytes) the chunk manager kept free. With LoRA, the export is a
// PEFT adapter directory and checkpoint.export_merged the merged model (below).
#ifndef PATRICKSTAR_TRAINER_EXPORT_H_
#define PATRICKSTAR_TRAINER_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "trainer/internal/train_run.h"

namespace ps {
namespace trainer_internal {

// Writes the model's master weights to `path`. Every rank must call it; every rank returns the
// same outcome (InternalError on the others when rank 0 fails to write).
// REQUIRES: WireRun(run) succeeded.
[[nodiscard]] absl::Status Export(const TrainRun& run, const std::string& path);

// LoRA (run.resolved.lora set): checkpoint.export is a PEFT adapter directory at `path`
// (GptModel::SavePeftAdapter, f32; adapter_config.json's base_model_name_or_path is
// checkpoint.init_from, or the model preset's name for a seeded base), which
// peft.PeftModel.from_pretrained loads over that base. Under ZeRO every adapter tensor is
// broadcast from its owner and rank 0 writes the directory (every rank must call it; every rank
// returns the same outcome); ResolveLora refuses it there with modules_to_save.
// REQUIRES: WireRun(run) succeeded, run.resolved.lora is set.
[[nodiscard]] absl::Status ExportPeftAdapter(const TrainRun& run, const std::string& path);

// LoRA: checkpoint.export_merged, a Hugging Face model directory at `path` of the base with the
// adapters merged in (W + lora_alpha / r * B A; GptModel::SaveMergedHfCheckpoint, f32, streamed
// piece by piece; config.json over the init_from directory's when there is one). One process
// only: ResolveLora refuses it under ZeRO before training.
// REQUIRES: as ExportPeftAdapter, and run.shape.world == 1.
[[nodiscard]] absl::Status ExportMerged(const TrainRun& run, const std::string& path);

}  // namespace trainer_internal
}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_EXPORT_H_
