// PEFT LoRA adapter directories, in and out: what `peft.PeftModel.from_pretrained(base, dir)`
// loads and `PeftModel.save_pretrained(dir)` writes for a LoRA adapter of a causal LM.
//
// A directory holds two files (peft/utils/constants.py: CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME):
//   adapter_config.json        LoraConfig.to_dict(), json.dumps(indent=2, sort_keys=True)
//                              (peft/config.py PeftConfigMixin.save_pretrained);
//   adapter_model.safetensors  get_peft_model_state_dict(model), metadata {"format": "pt"}
//                              (peft/peft_model.py PeftModel.save_pretrained).
//
// Tensor names, verified in huggingface/peft's source at tags v0.17.1 and v0.18.1
// (src/peft/utils/save_and_load.py get_peft_model_state_dict and set_peft_model_state_dict,
// src/peft/utils/other.py ModulesToSaveWrapper.adapter_state_dict): keys are the PeftModel's
// state_dict keys, so they start with "base_model.model." (PeftModel.base_model is the LoraModel,
// whose .model is the transformers model) followed by the transformers full name, and the adapter
// name is removed ("...q_proj.lora_A.default.weight" is saved as "...q_proj.lora_A.weight"):
//   base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight     [r, in]
//   base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight     [out, r]
//   base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight         (GPT2LMHeadModel)
// With bias "none" only keys containing "lora_" are saved. A modules_to_save module M is saved
// from its wrapper's copy, "M.modules_to_save.default.<param>", as "M.<param>" (the wrapper's
// adapter_state_dict strips "modules_to_save.<adapter>."), so exactly the base model's own
// names: "base_model.model.lm_head.weight", "base_model.model.model.norm.weight",
// "base_model.model.transformer.ln_f.bias". Loading inserts the adapter name back.
// The A/B shapes do not depend on fan_in_fan_out: for GPT-2's Conv1D (weight [in, out]) A is
// still [r, in] and B [out, r] (peft/tuners/lora/layer.py); PEFT itself forces fan_in_fan_out to
// true for Conv1D and false for nn.Linear when it builds the layers, so the key is informational
// when reading.
//
// adapter_config.json keys written: only fields of peft 0.10.0's LoraConfig (src/peft/config.py
// PeftConfig, src/peft/tuners/lora/config.py), because peft before 0.14 builds the config as
// LoraConfig(**json) and raises TypeError on any key it does not have (corda_config,
// eva_config, exclude_modules, lora_bias, peft_version, ... of later releases); later releases
// give an absent key its default. Always written, even at PEFT's default, so that no change of a
// default can change the adapter: peft_type "LORA", task_type "CAUSAL_LM" (PeftModel picks
// PeftModelForCausalLM from it), r, lora_alpha (an integer when integral), target_modules (the
// list, or the string "all-linear", which PEFT expands when it loads). Written only when not
// PEFT's default (the same default in every release from 0.10 to 0.21): base_model_name_or_path
// (null), lora_dropout (0.0), modules_to_save (null), fan_in_fan_out (false; true for GPT-2,
// whose Conv1D PEFT would otherwise switch with a warning), bias ("none"). Everything else is
// left to PEFT's defaults (inference_mode is set by PeftModel.from_pretrained itself). Checked by
// loading an exported directory with peft 0.10.0 and 0.21.2: model/testdata/check_lora_export.py.
//
// Thread safety: pure functions; the writer replaces the directory atomically
// (model/atomic_directory.h).
#ifndef PATRICKSTAR_MODEL_PEFT_ADAPTER_H_
#define PATRICKSTAR_MODEL_PEFT_ADAPTER_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/lora_config.h"
#include "model/model_config.h"

namespace ps {

inline constexpr absl::string_view kPeftAdapterConfigFileName = "adapter_config.json";
inline constexpr absl::string_view kPeftAdapterWeightsFileName = "adapter_model.safetensors";

// The tensors of an adapter directory, under our names (whole tensors, PEFT's shapes): each
// target's A [r, in] and B [out, r] in LoraTargets order, then the tensors modules_to_save covers
// (LoraSavedTensors). REQUIRES: ValidateLoraConfig(model, lora) is OK.
std::vector<TensorSpec> PeftAdapterTensors(const ModelConfig& model, const LoraConfig& lora);

// The adapter_config.json text (see the file comment). An empty base_model_name_or_path is
// written as null. Errors: InvalidArgument from ValidateLoraConfig.
[[nodiscard]] absl::StatusOr<std::string> PeftAdapterConfigJson(
    const ModelConfig& model, const LoraConfig& lora, absl::string_view base_model_name_or_path);

// Fills `dst` (tensor.numel() floats, row-major) with the values of adapter tensor `tensor` (a
// PeftAdapterTensors entry, our name). A non-OK status aborts the write.
using PeftTensorFn = std::function<absl::Status(const TensorSpec& tensor, absl::Span<float> dst)>;

// Writes the adapter directory `dir` (its parent must exist): adapter_config.json and
// adapter_model.safetensors with PEFT's names, the tensors stored as `dtype` (rounded to nearest
// even from f32). `dir` is replaced atomically if absent, empty or an adapter directory (holding
// adapter_config.json); its other files (README.md, ...) are kept; an old adapter_model.bin is
// dropped. Errors: InvalidArgument for an invalid config; FailedPrecondition when `dir` may not
// be replaced; whatever `tensors` returns; I/O errors naming the path. On error `dir` is
// unchanged.
[[nodiscard]] absl::Status WritePeftAdapter(const std::string& dir, const ModelConfig& model,
                                            const LoraConfig& lora,
                                            absl::string_view base_model_name_or_path,
                                            const PeftTensorFn& tensors, DType dtype = DType::kF32);

// An adapter directory as read.
struct PeftAdapter {
  LoraConfig lora;
  std::string base_model_name_or_path;  // empty when null
  // PeftAdapterTensors(model, lora) by our name, as f32 (exact from f16/bf16).
  std::map<std::string, std::vector<float>> tensors;
};

// Reads adapter directory `dir` for a base model `model`. Errors, each naming the file (and the
// key or tensor):
//   NotFound          a missing adapter_config.json or adapter_model.safetensors (an old
//                     adapter_model.bin alone is named as such);
//   InvalidArgument   invalid JSON, a key of the wrong type, peft_type other than "LORA",
//                     task_type other than "CAUSAL_LM" or null, a target_modules null, whatever
//                     ValidateLoraConfig refuses for this model (unknown target modules, r larger
//                     than a layer, ...), a tensor missing or extra (all listed), a tensor whose
//                     shape differs from this model's (both shapes named);
//   Unimplemented     PEFT features this project does not compute: use_dora, use_rslora,
//                     lora_bias, use_qalora, rank_pattern / alpha_pattern, layers_to_transform,
//                     exclude_modules, target_parameters, trainable_token_indices,
//                     layer_replication, alora_invocation_tokens, megatron_config, use_bdlora,
//                     arrow_config, kasa_config, monteclora_config, a regular expression as
//                     target_modules, init_lora_weights that rewrites the base weights (pissa*,
//                     olora, corda, loftq, lora_ga), a tensor dtype other than F32/F16/BF16;
//   DataLoss          a malformed safetensors file, a tensor holding Inf or NaN.
// Keys PEFT has and this project ignores (fan_in_fan_out, revision, inference_mode, ...) are
// ignored, as PEFT ignores unknown keys.
[[nodiscard]] absl::StatusOr<PeftAdapter> ReadPeftAdapter(const std::string& dir,
                                                          const ModelConfig& model);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_PEFT_ADAPTER_H_
