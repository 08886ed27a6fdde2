// Checks of a TrainConfig before any work is done: each value on its own (CheckTrainConfigValues,
// which ParseTrainConfig also runs) and across keys (ValidateTrainConfig), and the model the config
// describes (ResolveModelConfig). Every problem is InvalidArgument naming the key(s) and value(s)
// and what is allowed.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_TRAINER_CONFIG_VALIDATE_H_
#define PATRICKSTAR_TRAINER_CONFIG_VALIDATE_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/gpt_config.h"
#include "model/model_config.h"
#include "trainer/config.h"

namespace ps {

// Each value on its own: ranges, enum names, presets, UTF-8 strings without NUL (they go into JSON
// manifests); with a lora section, lora.r in [1, 2^30], lora_alpha finite and > 0, lora_dropout in
// [0, 1), target_modules non-empty ("all-linear" alone, else names non-empty and each once), bias
// "none", modules_to_save's names non-empty and each once; quantization.llm_int8_skip_modules'
// names non-empty and each once. InvalidArgument "`key` = value: rule"
// for the first bad one (a list element's key as `lora.target_modules[1]`).
[[nodiscard]] absl::Status CheckTrainConfigValues(const TrainConfig& config);

// Every check: each value on its own (as ParseTrainConfig does) and across keys — train_steps > 0,
// not both fp16 and bf16, train_batch_size == micro x accumulation x world_size when set, the model
// resolves (ResolveModelConfig), data.seq_len <= n_positions, an explicit chunk.size holds the
// largest operator (all of an operator's tensors share a chunk), the learning-rate schedule and the
// loss scaler can be built, checkpoint.every / resume need checkpoint.dir, copy_bandwidth only with
// the cpu backend, strings are UTF-8 without NUL (they go into JSON manifests). InvalidArgument
// naming the key(s) and value(s). When checkpoint.init_from names an existing directory (a
// Hugging Face model, whose config.json defines the model), the model section and the checks
// against it are left to the trainer. When it names anything else and the model section does not
// define the model, the path and what is wrong with it come first: the errno's code for a path
// that cannot be examined (NotFound, ELOOP's, PermissionDenied), DataLoss for a file that is not
// safetensors, InvalidArgument saying that GPT-2 safetensors weights do not define the model.
// A file with a Llama-family preset is InvalidArgument (a file is read as GPT-2 weights).
// With a lora section: checkpoint.export_merged needs it (InvalidArgument saying why when it is
// set without one) and must differ from checkpoint.export (the adapter directory); LoRA combines
// with every other mode (precision, accumulation, ZeRO ranks, the disk tier, which then holds the
// adapters' optimizer state), and without checkpoint.init_from its base is the seeded random init
// (legal: benchmarks). Whether the model has lora.target_modules and r fits its layers is
// model/lora_config.h ValidateLoraConfig's (the trainer's). With quantization.load_in_4bit: a lora
// section is required (InvalidArgument naming both keys), bnb_4bit_compute_dtype other than
// float32, fp16/bf16 enabled, and bnb_4bit_use_double_quant with a known world size > 1, are
// Unimplemented naming the key; which weights the model
// quantizes is model/quant4_config.h ValidateQuant4Config's (the trainer's, with the model).
// zero_optimization.offload_param.device "nvme" (a frozen base on disk) needs a lora section
// (InvalidArgument naming offload_param.device otherwise), and with offload_optimizer.device
// "nvme" too both nvme_paths name one directory (InvalidArgument naming both keys). Last (after
// every other check), for either device "nvme": CheckNvmePath; then CheckLoraInitFrom.
//
// `world_size`: the data-parallel ranks of the run. std::nullopt when it is not known yet — the
// train binary under mpirun validates before its ranks have joined (the communicator is made
// after the config is known good): the batch check is then only that train_batch_size is a
// multiple of micro x accumulation (no world size could satisfy it otherwise), and the trainer
// (Trainer::Create, once the communicator exists and before any work) checks the product with the
// real world size, as DeepSpeed's _batch_assertion does.
[[nodiscard]] absl::Status ValidateTrainConfig(const TrainConfig& config,
                                               std::optional<int> world_size = 1);

// For zero_optimization.offload_optimizer.device "nvme" and offload_param.device "nvme" (the disk
// tier; OK for any other device): that section's nvme_path must name an existing directory this
// process may create files in. InvalidArgument
// naming the key (and --nvme_path) when nvme_path is empty or not a directory; the errno's code
// (NotFound, PermissionDenied, ...) naming the key and the path when it cannot be examined or
// written. Whether the filesystem has the space is the pre-flight plan's (it knows the bytes).
[[nodiscard]] absl::Status CheckNvmePath(const TrainConfig& config);

// For lora.init_from (OK when there is no lora section or it is empty): a PEFT adapter directory,
// one holding adapter_config.json and adapter_model.safetensors. The errno's code (NotFound,
// PermissionDenied, ...) naming the key (and --lora_init_from) and the path when it cannot be
// examined; InvalidArgument when it is not a directory or lacks either file (saying how to save
// safetensors when only adapter_model.bin is there). Whether the adapter matches the model is the
// loader's (model/peft_adapter.h).
[[nodiscard]] absl::Status CheckLoraInitFrom(const TrainConfig& config);

// The model: the preset (if any) with the explicit dimensions > 0 replacing its fields, checked by
// ValidateGptConfig and ValidateModelConfig (and for sizes whose parameter count would not fit
// in 2^53). The name is the preset's, or "custom". InvalidArgument naming the model.* keys as a
// config writes them (the missing dimensions, an unknown preset with the valid names, n_embd not
// divisible by n_head, more than 2^20 layers, ...). For a Llama-family preset, the GptConfig
// view (vocab, positions, hidden, layers, heads) of ResolveTrainModel's model.
absl::StatusOr<GptConfig> ResolveModelConfig(const TrainModelConfig& m);

// The model of any architecture the section describes: a GPT-2 preset or five dimensions
// (ResolveModelConfig, as FromGptConfig), or a Llama-family preset of model/model_config.h
// (ModelPresetNames: llama-*, tinyllama-*, qwen2.5-*, mistral-*) with the explicit dimensions
// replacing its fields — n_positions its max_position_embeddings, n_embd and n_head its hidden
// size and query heads (the head dimension becomes n_embd / n_head, which must be even, and
// n_head a multiple of the preset's key/value heads); its key/value heads, MLP width, RoPE, norm
// and biases stay. Errors as ResolveModelConfig's, naming model.* keys.
absl::StatusOr<ModelConfig> ResolveTrainModel(const TrainModelConfig& m);

// --comm=nccl (trainer/train.cc): whether this run can train over the NCCL communicator, checked
// before any work. `nccl_compiled_in` is comm/communicator_factory.h's NcclCompiledIn();
// `probe_gpu` returns OK when a CUDA device is usable and otherwise the cuda backend's error (it is
// called only when the build and the config allow NCCL). Errors, the first that applies:
//  - FailedPrecondition when the binary was built without CUDA: "rebuild with --config=cuda"
//    (and, when accelerator.backend is not "cuda", that it must be too);
//  - InvalidArgument when accelerator.backend is not "cuda": NCCL moves accelerator buffers;
//  - probe_gpu's error with its code, prefixed `--comm=nccl: accelerator.backend "cuda": ` (the
//    wording of the trainer's own check: Unavailable, "no CUDA device is available", on a machine
//    without a GPU);
// OK otherwise: the trainer then creates the NCCL communicator (comm/communicator_factory.h,
// bootstrapped over mpi) on accelerator.device and runs its ZeRO collectives, scalar agreement
// and export gather on device buffers (trainer/trainer.h). The checks are in the order a user
// fixes them.
[[nodiscard]] absl::Status CheckNcclComm(const TrainConfig& config, bool nccl_compiled_in,
                                         const std::function<absl::Status()>& probe_gpu);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_VALIDATE_H_
