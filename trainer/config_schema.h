// The schema of the training config file: every key, where it may appear, the spellings people
// commonly use instead (suggested in errors), the DeepSpeed keys that are accepted and ignored, the
// enum names, and the sanity bounds shared by parsing, validation and overrides.
//
// No string key takes "": every one names a path or a value, and an empty one is refused naming
// the key (json_reader.h GetString); a key left out is its default (for the paths: not set).
//
// The file format. DeepSpeed's keys, spelled as DeepSpeed spells them:
//
//   train_batch_size                  int > 0; optional (derived: micro x accumulation x world);
//                                     given, it must equal that product, checked with the real
//                                     world size (under mpirun once the ranks have joined)
//   train_micro_batch_size_per_gpu    int >= 1
//   gradient_accumulation_steps       int >= 1: micro-batches per optimizer step (absent: 1)
//   optimizer: {type: "Adam" | "AdamW" (case-insensitive),
//               params: {lr, betas: [b1, b2], eps, weight_decay,
//                        adam_w_mode (bool; with "Adam": true = decoupled decay, i.e. AdamW),
//                        amsgrad (false only), bias_correction (true only)},
//               overlap: bool (default false; docs/pipeline.md: Adam inside backward, results
//                        bit-identical to false; a section with only `overlap` needs no type)}
//       "Adam" without adam_w_mode is Adam with L2 weight decay (torch.optim.Adam, PatrickStar's
//       meaning). DeepSpeed's own "Adam" defaults to adam_w_mode = true; write "AdamW" (or
//       adam_w_mode: true) to get that. adam_w_mode: false with "AdamW" is an error.
//   scheduler: {type: "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR" (case-insensitive),
//               params: {...}}             (no section: a constant learning rate)
//       WarmupLR:        warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type
//       WarmupDecayLR:   the above and total_num_steps
//       WarmupCosineLR:  warmup_num_steps, warmup_type, total_num_steps, warmup_min_ratio,
//                        cos_min_ratio
//       each also accepts last_batch_iteration = -1 (resume from a checkpoint instead); a key
//       that does not apply to the type is an error, as in DeepSpeed. warmup_max_lr absent means
//       optimizer.params.lr (stored as -1); total_num_steps 0 means train_steps.
//   fp16: {enabled, loss_scale (0 = dynamic), initial_scale_power, loss_scale_window,
//          hysteresis, consecutive_hysteresis, min_loss_scale,
//          max_consecutive_skipped_steps (ours; int >= 0; 0 = DeepSpeed's rule: a dynamic scale
//          stops the run when it overflows at min_loss_scale, a static scale at its first
//          overflow; N > 0 also stops after more than N skipped steps in a row)}
//   bf16: {enabled}
//   gradient_clipping                 global L2 norm, >= 0; 0 = off
//   steps_per_print                   int >= 1
//
// Our sections:
//
//   train_steps   int >= 0 in a file; > 0 after overrides (ValidateTrainConfig)
//   seed          uint64, parameter initialization      threads   int >= 0, 0 = all cores
//   model:       {preset, vocab_size, n_positions, n_embd, n_layer, n_head,
//                 activation_checkpointing}   (Hugging Face GPT-2 names; 0 = from the preset)
//       preset: any of model/model_config.h ModelPresetNames() — GPT-2's (tiny, gpt2, ..., 18B)
//       and the Llama family's (llama-3.2-1b, ..., qwen2.5-3b, mistral-7b-v0.3, llama-tiny),
//       trained from a seeded random init. Without a preset all five dimensions define a GPT-2.
//       n_layer <= 2^20, the others <= 2^30.
//   chunk:       {size: <elements, > 0> | "auto"}
//   accelerator: {backend: "cpu" | "cuda", memory: "64MiB" | <bytes>, host_memory: same,
//                 copy_bandwidth: "12GB/s" | <bytes per second>, 0 or in [1MB/s, 1PB/s],
//                 device: <index>}
//   data:        {train, val, seq_len, shuffle, seed, eval_every, eval_batches, packing}
//       eval_every: 0 = never validate; N > 0 = on the validation set (data.val, or the built-in
//       corpus's validation split) before the first step, every N steps and after the last.
//   checkpoint:  {dir, every, keep_last, resume, init_from, export, export_merged}
//       export: with a lora section, a PEFT adapter directory (adapter_config.json +
//       adapter_model.safetensors). export_merged: only with a lora section, a Hugging Face model
//       directory of the base with the adapters merged in (W + lora_alpha / r * B A).
//   profile:     {trace, metrics}
//
// LoRA fine-tuning (PEFT LoraConfig's names; the section present = LoRA on; trainer/config.h
// LoraSettings has what each does):
//
//   lora: {r (int >= 1, required), lora_alpha (number > 0; default 8), lora_dropout ([0, 1);
//          default 0), target_modules (required: a non-empty list of module names, each once, or
//          the string "all-linear"), bias ("none" only), modules_to_save (list of module names;
//          null = none), init_from (a PEFT adapter directory to continue from)}
//       task_type is accepted and ignored with a warning. A string target_modules other than
//       "all-linear" (PEFT's regular expression form) is refused. Whether the model has the named
//       modules is model/lora_config.h ValidateLoraConfig's to check.
//
// QLoRA's 4-bit base (transformers' BitsAndBytesConfig names and defaults; trainer/config.h
// QuantizationSettings has what each does):
//
//   quantization: {load_in_4bit (bool; default false = no quantization), bnb_4bit_quant_type
//                  ("nf4" | "fp4"; default "fp4"), bnb_4bit_use_double_quant (bool; default
//                  false), bnb_4bit_compute_dtype ("float32" | "bfloat16" | "float16"; default
//                  "float32"; only "float32" is implemented), llm_int8_skip_modules (list of
//                  module names; null = none)}
//       Also accepted as transformers writes them: quant_method "bitsandbytes",
//       bnb_4bit_quant_storage "uint8", load_in_8bit false (any other value is refused naming
//       the key; load_in_8bit true is Unimplemented). load_in_4bit needs a lora section
//       (ValidateTrainConfig).
//
// DeepSpeed's offload keys (trainer/config.h has what each does here; docs/training.md too):
//
//   zero_optimization: {offload_optimizer: {device: "none" | "cpu" | "nvme", nvme_path,
//                                           buffer_count (>= 1), host_budget (bytes; 0: auto;
//                                           this project's key), pin_memory},
//                       offload_param: {device: "none" | "cpu" ("nvme" is refused), pin_memory}}
//       Every other zero_optimization key (stage, bucket sizes, stage3_*, ...) is accepted and
//       ignored with a warning naming it and why (ZeroOptimizationIgnoredReason), except a close
//       misspelling of offload_optimizer / offload_param, which is an error suggesting it.
//       offload_optimizer's fast_init, pipeline_read, pipeline_write, ratio and offload_param's
//       nvme-only nvme_path, buffer_count, buffer_size, max_in_cpu are accepted and ignored with a
//       warning; offload_optimizer's nvme_path and buffer_count with a device other than "nvme"
//       are kept but warned about (unused).
//   aio: {block_size (bytes, a multiple of 4096), queue_depth, thread_count, single_submit,
//         overlap_events}   (DeepSpeed's defaults: 1048576, 8, 1, false, true)
//
// DeepSpeed keys that do not apply here are accepted and ignored with a LOG(WARNING) — these
// top-level ones (IgnoredDeepSpeedKeys()): zero_allow_untested_optimizer,
// wall_clock_breakdown, memory_breakdown, prescale_gradients, gradient_predivide_factor,
// communication_data_type, sparse_gradients, tensorboard, wandb, csv_monitor, comms_logger,
// flops_profiler, dump_state, activation_checkpointing (DeepSpeed's section; ours is
// model.activation_checkpointing). Every other unknown key, at any level, is an error.
//
// Thread safety: constants and pure functions.
#ifndef PATRICKSTAR_TRAINER_CONFIG_SCHEMA_H_
#define PATRICKSTAR_TRAINER_CONFIG_SCHEMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/config.h"
#include "trainer/json_reader.h"

namespace ps {

// --- Sanity bounds (keep every product below int64 overflow) ------------------------------------

// A config file is a few KiB; the cap stops `--config=/dev/zero` from eating memory.
inline constexpr int64_t kMaxConfigFileBytes = int64_t{16} << 20;
// The deepest config path is 3 objects (optimizer.params.betas); anything much deeper is not a
// config, and the limit keeps every later walk shallow.
inline constexpr int kMaxConfigJsonDepth = 16;
inline constexpr int64_t kMaxChunkElems = int64_t{1} << 40;
inline constexpr int64_t kMaxModelDim = int64_t{1} << 30;
// model.n_layer: model/model_config.h's bound.
inline constexpr int64_t kMaxModelLayers = int64_t{1} << 20;
inline constexpr double kMaxModelParams = 9007199254740992.0;  // 2^53
inline constexpr int kMaxThreads = 1 << 16;
inline constexpr double kMaxBatchElems = 1099511627776.0;  // 2^40 sequences or tokens
inline constexpr int kMaxDeviceIndex = 1 << 16;
// accelerator.copy_bandwidth, when not 0: 1 MB/s (1000x below the slowest link worth emulating;
// below it a step's chunk copies take minutes) to 1 PB/s (far above any link; keeps byte counts
// derived from it in int64).
inline constexpr double kMinCopyBandwidthBytesPerS = 1e6;
inline constexpr double kMaxCopyBandwidthBytesPerS = 1e15;
// zero_optimization.offload_optimizer.buffer_count: a read-ahead window in chunk indices; 2^16
// indices is more than any model's chunk count at a useful chunk size, and keeps the window's
// bytes (count x 3 chunks) far from int64 overflow.
inline constexpr int64_t kMaxOffloadBufferCount = int64_t{1} << 16;
// zero_optimization.offload_param.max_in_cpu: at most 2^50 parameter elements (its bytes stay far
// from int64's range).
inline constexpr int64_t kMaxMaxInCpuElems = int64_t{1} << 50;
// aio: direct I/O's alignment (block_size must be a multiple), the largest request (1 GiB: one
// request per chunk at the largest useful chunks), the deepest io_uring queue (IORING_MAX_ENTRIES)
// and the most I/O threads.
inline constexpr int64_t kAioAlignmentBytes = 4096;
inline constexpr int64_t kMaxAioBlockBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxAioQueueDepth = 32768;
inline constexpr int64_t kMaxAioThreads = 1024;

// --- The key tables ------------------------------------------------------------------------------

// The sections of the file, for JsonReader (the top level lists the ignored DeepSpeed keys).
struct TrainConfigSchema {
  JsonSection top, optimizer, optimizer_params, scheduler, scheduler_params, fp16, bf16, model,
      chunk, accelerator, data, checkpoint, profile, zero_optimization, offload_optimizer,
      offload_param, aio, lora, quantization;
};
const TrainConfigSchema& ConfigSchema();

// Every key path the parser accepts, e.g. "optimizer.params.betas", "model.n_embd", in the order
// of TrainConfigToJson (scheduler params listed once each). For tests and documentation.
std::vector<std::string> TrainConfigKeyPaths();

// The top-level DeepSpeed keys accepted and ignored (see the file comment).
std::vector<std::string> IgnoredDeepSpeedKeys();

// Why zero_optimization.`key` (any key but the offload sections) is ignored: the reason of
// DeepSpeed keys known to the schema, else the general one (chunks replace ZeRO's stages).
absl::string_view ZeroOptimizationIgnoredReason(absl::string_view key);

// The presets model.preset and --model take: GPT-2's (model/gpt_config.h GptPresetNames) first,
// then the Llama family's (the rest of model/model_config.h ModelPresetNames).
std::vector<std::string> TrainModelPresetNames();

// Whether scheduler.params.`key` applies to scheduler `type` (see the file comment), and the keys
// that do, in the schema's order.
bool SchedulerParamApplies(SchedulerType type, absl::string_view key);
std::vector<std::string> SchedulerParamsOf(SchedulerType type);

// --- Names as written in the file and on the command line -------------------------------------
// The errors' messages are rules to print after the offending value ("is not supported; use
// \"Adam\" or \"AdamW\"").

// "Adam" | "AdamW", case-insensitive.
absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name);
// "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR", case-insensitive.
absl::StatusOr<SchedulerType> ParseSchedulerType(absl::string_view name);
// "cpu" | "cuda", case-insensitive.
absl::StatusOr<AcceleratorKind> ParseAcceleratorKind(absl::string_view name);
// "none" | "cpu" | "nvme", case-insensitive.
absl::StatusOr<OffloadDevice> ParseOffloadDevice(absl::string_view name);
// "12GB/s", "1.5 GiB/s", "100MB" (the "/s" is optional): bytes per second.
absl::StatusOr<double> ParseBandwidth(absl::string_view text);
// quantization.bnb_4bit_quant_type: "nf4" | "fp4", lower case only (bitsandbytes' spelling).
absl::StatusOr<Quant4Type> ParseBnbQuantType(absl::string_view name);
// quantization.bnb_4bit_compute_dtype: "float32" | "bfloat16" | "float16" (torch's names).
absl::StatusOr<DType> ParseTorchDType(absl::string_view name);
// --lora_target_modules's comma-separated names, each stripped of surrounding whitespace and kept
// as written otherwise (empty names stay: ApplyOverrides refuses them, naming the flag):
// "q_proj, v_proj" -> {"q_proj", "v_proj"}; "all-linear" -> {"all-linear"}.
std::vector<std::string> ParseLoraModuleList(absl::string_view text);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_SCHEMA_H_
