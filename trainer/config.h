// TrainConfig: the training program's configuration as values — what a DeepSpeed-format JSON file
// plus this project's sections and the command-line flags resolve to. The parts that read, check
// and write it each have their own header:
//   trainer/config_schema.h     the file format: every key, aliases, ignored DeepSpeed keys
//   trainer/config_parse.h      ParseTrainConfig / LoadTrainConfig (JSON text -> TrainConfig)
//   trainer/config_validate.h   ValidateTrainConfig, ResolveModelConfig (checks across keys)
//   trainer/config_overrides.h  ConfigOverrides / ApplyOverrides (command-line flags)
//   trainer/config_json.h       TrainConfigToJson (the canonical JSON; checkpoint manifests)
//   trainer/config_optimizer.h  the optimizer's options built from a config
//
// Keys absent from a file keep the defaults of the structs below (DeepSpeed's defaults where
// DeepSpeed has the key), not DefaultTrainConfig(): a file describes a whole run.
//
// Typical use (the trainer):
//   ASSIGN_OR_RETURN(TrainConfig config, path.empty() ? DefaultTrainConfig()
//                                                      : LoadTrainConfig(path));
//   RETURN_IF_ERROR(ApplyOverrides(overrides_from_flags, &config));
//   RETURN_IF_ERROR(ValidateTrainConfig(config, world_size));
//
// Thread safety: value types and pure functions.
#ifndef PATRICKSTAR_TRAINER_CONFIG_H_
#define PATRICKSTAR_TRAINER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/kernels/nf4_math.h"
#include "model/lora_config.h"
#include "model/quant4_config.h"

namespace ps {

// "Adam" (L2 weight decay, torch.optim.Adam) | "AdamW" (decoupled, torch.optim.AdamW).
enum class OptimizerType { kAdam, kAdamW };
enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
// Derived from fp16.enabled / bf16.enabled.
enum class PrecisionMode { kF32, kF16, kBF16 };
enum class AcceleratorKind { kCpu, kCuda };

// optimizer.type and optimizer.params.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;                   // >= 0, finite
  double beta1 = 0.9, beta2 = 0.999;  // each in [0, 1)
  double eps = 1e-8;                  // > 0, finite
  double weight_decay = 0.0;          // >= 0, finite
  // optimizer.overlap: Adam inside backward, bit-identical to off (docs/pipeline.md).
  bool overlap = false;

  friend bool operator==(const OptimizerConfig&, const OptimizerConfig&) = default;
};

// scheduler.type and scheduler.params (optimizer/lr_schedule.h has the formulas).
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  double warmup_min_lr = 0;
  double warmup_max_lr = -1;  // -1: optimizer.lr
  int64_t warmup_num_steps = 0;
  std::string warmup_type = "linear";  // "log" | "linear"
  int64_t total_num_steps = 0;         // 0: train_steps
  double warmup_min_ratio = 0, cos_min_ratio = 1e-4;

  friend bool operator==(const SchedulerConfig&, const SchedulerConfig&) = default;
};

// fp16 (optimizer/loss_scaler.h has the semantics).
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;             // 0 = dynamic; else a static scale in (0, 2^100]
  int initial_scale_power = 16;      // [0, 100]
  int64_t loss_scale_window = 1000;  // >= 1
  int hysteresis = 2;                // >= 1
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;  // (0, 2^100]
  // >= 0. 0: DeepSpeed's rule — a dynamic scale stops the run when it overflows at
  // min_loss_scale; a static scale, which cannot be lowered, stops at its first overflow.
  // N > 0: also stop when more than N steps in a row were skipped.
  int64_t max_consecutive_skipped_steps = 0;

  friend bool operator==(const Fp16Config&, const Fp16Config&) = default;
};

// model. Either a preset (ModelPresetNames(), model/model_config.h: GPT-2 and the Llama family),
// whose fields the dimensions below override where they are > 0, or no preset and all five
// dimensions > 0 (a GPT-2). trainer/config_validate.h ResolveTrainModel resolves it.
struct TrainModelConfig {
  std::string preset;
  int64_t vocab_size = 0;   // "vocab_size"
  int64_t max_seq_len = 0;  // "n_positions"
  int64_t hidden = 0;       // "n_embd"
  int64_t num_layers = 0;   // "n_layer"
  int64_t num_heads = 0;    // "n_head"
  bool activation_checkpointing = false;

  friend bool operator==(const TrainModelConfig&, const TrainModelConfig&) = default;
};

// chunk.
struct ChunkConfig {
  int64_t size_elems = 0;  // 0 = "auto" (chunk-size search); elements, not bytes

  friend bool operator==(const ChunkConfig&, const ChunkConfig&) = default;
};

// accelerator.
struct AcceleratorConfig {
  AcceleratorKind kind = AcceleratorKind::kCpu;  // "backend"
  int64_t memory_bytes = 0;               // cap of the accelerator memory; 0 = backend default/all
  int64_t host_memory_bytes = 0;          // cap for host memory; 0 = unlimited
  double copy_bandwidth_bytes_per_s = 0;  // emulated link bandwidth, 0 = unthrottled (cpu only)
  int device_index = 0;                   // "device"

  friend bool operator==(const AcceleratorConfig&, const AcceleratorConfig&) = default;
};

// data.
struct DataConfig {
  // "train": an llm.c .bin token file or an example file (docs/data_format.md; the kind is read
  // from the file's magic); empty = built-in synthetic corpus
  std::string train_path;
  std::string val_path;  // "val": either kind too
  int64_t seq_len = 0;   // 0: the model's n_positions
  bool shuffle = false;
  // "packing": example files only — several examples per row (best-fit decreasing,
  // trainer/data/packed_loader.h) or one example per row. Ignored for token files.
  bool packing = true;
  uint64_t seed = 0;
  int64_t eval_every = 0;    // steps; 0 = never validate (N: before step 1, every N, at the end)
  int64_t eval_batches = 4;  // >= 1

  friend bool operator==(const DataConfig&, const DataConfig&) = default;
};

// checkpoint.
struct CheckpointConfig {
  std::string dir;
  int64_t every = 0;      // steps; 0 = only at the end / on a signal
  int64_t keep_last = 2;  // >= 1
  bool resume = false;
  std::string init_from;  // Hugging Face GPT-2 safetensors file or model directory to start from
  // "export": Hugging Face safetensors (a directory for a directory model); with `lora` set, a
  // PEFT adapter directory (adapter_config.json + adapter_model.safetensors).
  std::string export_path;
  // "export_merged": only with `lora` set (ValidateTrainConfig refuses it otherwise): a Hugging
  // Face model directory of the base with the adapters merged in, W + lora_alpha / r * B A.
  std::string export_merged;

  friend bool operator==(const CheckpointConfig&, const CheckpointConfig&) = default;
};

// profile.
struct ProfileConfig {
  std::string trace_path;    // "trace": Chrome trace-event JSON
  std::string metrics_path;  // "metrics": JSONL

  friend bool operator==(const ProfileConfig&, const ProfileConfig&) = default;
};

// zero_optimization.offload_optimizer.device and zero_optimization.offload_param.device:
// "none" | "cpu" | "nvme" (DeepSpeed's names, case-insensitive).
enum class OffloadDevice { kNone, kCpu, kNvme };

// zero_optimization.offload_optimizer: where the optimizer state (the f32 master weights, Adam's
// momentum and variance: 12 of the 14 bytes per parameter of a bf16 run) lives.
struct OffloadOptimizerConfig {
  // kNone / kCpu: the default, the same thing here — the optimizer state lives in host memory
  // (chunks the scheduler may also place on the accelerator for the optimizer step), and Adam
  // runs on the CPU for the chunks in host memory. kNvme: the disk tier — master, momentum and
  // variance chunks that host memory cannot hold live in swap files under nvme_path, read ahead
  // of the optimizer and written behind it.
  OffloadDevice device = OffloadDevice::kNone;
  // The directory of the swap files (a local SSD). Required with kNvme (ValidateTrainConfig: an
  // existing directory); unused otherwise.
  std::string nvme_path;
  // kNvme: the disk tier's read-ahead window, in chunk indices: how many indices' optimizer state
  // (each index's master, momentum and variance chunks) may be read or being read from disk ahead
  // of the one the optimizer works on. >= 1. DeepSpeed's default, 4.
  int64_t buffer_count = 4;
  // kNvme: the host bytes the disk tier may hold of the optimizer state (resident chunks, reads
  // ahead, writes behind); 0: auto — what host memory (accelerator.host_memory, else what the OS
  // can give less a margin) leaves beside the rest of the run (model/gpt_activation_profile.h,
  // GptRunPlanOptions::DiskTier). Below the tier's minimum (two chunk indices' state) the plan
  // refuses the run. This project's key ("host_budget"), not DeepSpeed's.
  int64_t host_budget_bytes = 0;
  // Accepted for DeepSpeed configs; changes nothing: host chunk memory — the disk tier's buffers
  // included, since chunks are read from disk into their own host payloads — is always
  // page-locked memory from the accelerator's backend (plain host memory for the cpu backend).
  bool pin_memory = false;

  friend bool operator==(const OffloadOptimizerConfig&, const OffloadOptimizerConfig&) = default;
};

// zero_optimization.offload_param: where the 16-bit (or f32) parameter chunks live.
struct OffloadParamConfig {
  // kNone / kCpu: the default, the same thing here — parameter chunks live in host memory and
  // stream through the accelerator as the scheduler decides. kNvme: only for a frozen base (a
  // run with a lora section; ValidateTrainConfig refuses it otherwise): the base's param chunks
  // (frozen, without gradients or optimizer state) get slots in the disk tier's swap files under
  // nvme_path and host memory holds at most the budget of them (scheduler/disk_tier.h, "Frozen
  // param chunks"): written once, dropped clean, read back (and ahead) as the schedule needs
  // them. The adapters' chunks stay in host memory (or on disk with offload_optimizer "nvme").
  OffloadDevice device = OffloadDevice::kNone;
  // kNvme: the directory of the swap files (required: an existing directory). With
  // offload_optimizer.device "nvme" too both name the same directory (one swap serves both;
  // ValidateTrainConfig refuses two). --nvme_path sets both.
  std::string nvme_path;
  // kNvme: the frozen chunks read ahead of the compute in the warm-up's access order
  // (DiskTierOptions::frozen_read_ahead), as far as the host budget allows; >= 0 (0: none).
  // DeepSpeed's default for offload_param, 5.
  int64_t buffer_count = 5;
  // kNvme: the parameter elements kept in host memory (DeepSpeed's max_in_cpu): the frozen host
  // budget is max_in_cpu x the param chunks' element size (the compute dtype's). 0 (absent, or
  // "auto"): what the host limit (accelerator.host_memory, else what the OS can give less a
  // margin) leaves beside the rest of the run, as offload_optimizer.host_budget's auto does, and
  // at least the tier's least (one param chunk). A budget below that least is refused.
  int64_t max_in_cpu = 0;
  // As OffloadOptimizerConfig::pin_memory: accepted, changes nothing (host chunks are pinned).
  // (DeepSpeed's buffer_size is accepted and ignored with a warning: whole chunks are the unit
  // of the tier's reads.)
  bool pin_memory = false;

  friend bool operator==(const OffloadParamConfig&, const OffloadParamConfig&) = default;
};

// zero_optimization: only the offload sections are read (chunks replace ZeRO's stages; its other
// keys are accepted and ignored with a warning naming each).
struct ZeroOptimizationConfig {
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;

  friend bool operator==(const ZeroOptimizationConfig&, const ZeroOptimizationConfig&) = default;
};

// Whether the run has the disk tier: offload_optimizer.device or offload_param.device "nvme".
bool UsesDiskTier(const ZeroOptimizationConfig& zero);

// The disk tier's swap directory (offload_optimizer's nvme_path when its device is "nvme", else
// offload_param's), and the key that names it in messages ("" / "" without the tier).
const std::string& DiskTierDir(const ZeroOptimizationConfig& zero);
std::string DiskTierDirKey(const ZeroOptimizationConfig& zero);

// aio: the disk tier's asynchronous I/O (DeepSpeed's names and defaults). Used only with
// offload_optimizer.device "nvme".
struct AioConfig {
  // Bytes per read or write request: each chunk's transfer is split into requests of this size.
  // > 0 and a multiple of 4096 (direct I/O's alignment). "block_size".
  int64_t block_size_bytes = 1048576;
  // Requests kept in flight (the io_uring queue's depth; the thread pool's queue). >= 1.
  int64_t queue_depth = 8;
  // I/O threads the disk tier's engine may use (DeepSpeed's intra-request parallelism): the
  // pread/pwrite fallback's pool. >= 1.
  int64_t thread_count = 1;
  // Submit requests one at a time instead of in batches.
  bool single_submit = false;
  // Reap completions while submitting (overlap submission and completion) instead of submitting
  // a whole batch and then waiting for it.
  bool overlap_events = true;

  friend bool operator==(const AioConfig&, const AioConfig&) = default;
};

// kLoraAllLinear ("all-linear", PEFT's shorthand for every linear layer but the output layer,
// in lora.target_modules) is model/lora_config.h's: one constant for the config and the model.

// lora: LoRA fine-tuning, in PEFT LoraConfig's names (the section present = LoRA on). The base
// model's parameters are frozen (16-bit param-only chunks) and low-rank adapters A [r, in] and
// B [out, r] train: y = W x + (lora_alpha / r) * B (A dropout(x)). The trainer converts this to
// model/lora_config.h LoraConfig; which module names a model has, and whether r fits its layers,
// are that header's ValidateLoraConfig's to check (they need the model).
struct LoraSettings {
  // "r": the adapters' rank, >= 1. Required in the section (no PEFT default is assumed).
  int64_t r = 0;
  // "lora_alpha": > 0, finite; the adapters' output is scaled by lora_alpha / r. PEFT's default.
  double lora_alpha = 8;
  // "lora_dropout": in [0, 1); dropout on the adapters' input (0: none). PEFT's default.
  double lora_dropout = 0;
  // "target_modules": the module names adapted ("q_proj", ..., GPT-2's "c_attn", "c_proj",
  // "c_fc"), each non-empty and listed once; or exactly {kLoraAllLinear} (PEFT's "all-linear"
  // shorthand, written as a string: every linear layer but the output layer). Required.
  std::vector<std::string> target_modules;
  // "bias": only "none" (PEFT's default) is supported.
  std::string bias = "none";
  // "modules_to_save": base modules that stay trainable with full training state (e.g.
  // "lm_head", "embed_tokens"); each non-empty and listed once. Optional.
  std::vector<std::string> modules_to_save;
  // "init_from": a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) to
  // continue from; empty: A Kaiming-uniform, B zero, as PEFT initializes them.
  std::string init_from;

  // Whether target_modules is PEFT's "all-linear" shorthand.
  bool all_linear() const;
  double scale() const { return lora_alpha / static_cast<double>(r); }

  friend bool operator==(const LoraSettings&, const LoraSettings&) = default;
};

// `settings` as model/lora_config.h's LoraConfig (the same PEFT names; "all-linear" is passed
// through, which ValidateLoraConfig expands), without init_from (the trainer's to read).
LoraConfig ToLoraConfig(const LoraSettings& settings);

// quantization: QLoRA's 4-bit frozen base, in transformers' BitsAndBytesConfig names and with its
// defaults. load_in_4bit false (or no section) = no quantization; the other keys are kept even
// then, so --load_in_4bit turns on the file's settings. Only with a lora section (a 4-bit base is
// frozen: ValidateTrainConfig refuses it otherwise, naming both). Which weights are stored in 4
// bits, and how, is model/quant4_config.h's (ToQuant4Config converts).
struct QuantizationSettings {
  // "load_in_4bit": the base's block linear layers stored in 4 bits.
  bool load_in_4bit = false;
  // "bnb_4bit_quant_type": "nf4" | "fp4" (bitsandbytes' spelling; default "fp4").
  Quant4Type quant_type = Quant4Type::kFp4;
  // "bnb_4bit_use_double_quant": the absmax scales quantized again (8-bit, blocks of 256).
  bool double_quant = false;
  // "bnb_4bit_compute_dtype": "float32" | "bfloat16" | "float16" (torch's names): what the 4-bit
  // GEMMs round their operands and results to (bitsandbytes' MatMul4Bit), whatever the run's
  // precision (the param chunks' element type).
  DType compute_dtype = DType::kF32;
  // "llm_int8_skip_modules": modules kept at 16 bits (transformers' matching rule,
  // model/quant4_config.h), each non-empty and listed once.
  std::vector<std::string> skip_modules;

  friend bool operator==(const QuantizationSettings&, const QuantizationSettings&) = default;
};

// `settings` as model/quant4_config.h's Quant4Config, or nullopt when load_in_4bit is false (no
// quantization). Which weights it covers, and whether the model allows it, are that header's
// Quant4Weights / ValidateQuant4Config's (they need the model and the LoRA configuration).
std::optional<Quant4Config> ToQuant4Config(const QuantizationSettings& settings);

struct TrainConfig {
  int64_t train_batch_size = 0;  // 0 = derived: micro * accum * world
  int64_t train_micro_batch_size_per_gpu = 1;
  // Only 1 is supported for now: > 1 is InvalidArgument saying it is not supported yet.
  int64_t gradient_accumulation_steps = 1;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  bool bf16 = false;             // "bf16": {"enabled": ...}
  double gradient_clipping = 0;  // 0 = off
  int64_t steps_per_print = 1;
  int64_t steps = 0;  // "train_steps" (required > 0 after overrides)
  uint64_t seed = 0;  // "seed": parameter init
  int threads = 0;    // "threads": 0 = hardware concurrency
  TrainModelConfig model;
  ChunkConfig chunk;
  AcceleratorConfig accelerator;
  DataConfig data;
  CheckpointConfig checkpoint;
  ProfileConfig profile;
  ZeroOptimizationConfig zero_optimization;
  AioConfig aio;
  // The lora section: LoRA fine-tuning when set.
  std::optional<LoraSettings> lora;
  // The quantization section: the 4-bit base when quantization.load_in_4bit.
  QuantizationSettings quantization;

  // kF16 if fp16.enabled, else kBF16 if bf16, else kF32. (Both enabled is rejected by validation;
  // fp16 wins here.)
  PrecisionMode precision() const;

  friend bool operator==(const TrainConfig&, const TrainConfig&) = default;
};

// The embedded default: a small GPT-2 (vocab 256, 128 positions, n_embd 128, 4 layers, 4 heads,
// activation checkpointing) on the built-in synthetic corpus, micro batch 8 x 64 tokens, 2000
// steps, AdamW (lr 3e-3, weight decay 0.01) with WarmupDecayLR (30 linear warm-up steps),
// clipping at 1.0, f32, chunks of 80 Ki elements, on the cpu accelerator with a 10 MiB cap below
// the 12.9 MiB of model data (so chunks move). All of its values are set in one place, in
// config.cc, with the measurements that chose them. It passes ValidateTrainConfig.
TrainConfig DefaultTrainConfig();

// --- Derived values ------------------------------------------------------------------------------

// data.seq_len, or the model's max_seq_len when it is 0.
int64_t ResolveSeqLen(const TrainConfig& config, const GptConfig& model);

// train_batch_size, or micro x accumulation x world_size when it is 0.
int64_t ResolveTrainBatchSize(const TrainConfig& config, int world_size);

// The compute dtype of the param chunks: f32, f16 or bf16.
DType ComputeDType(PrecisionMode mode);

// --- Names ----------------------------------------------------------------------------------

absl::string_view OptimizerTypeName(OptimizerType type);      // "Adam", "AdamW"
absl::string_view SchedulerTypeName(SchedulerType type);      // "none", "WarmupLR", ...
absl::string_view PrecisionModeName(PrecisionMode mode);      // "f32", "f16", "bf16"
absl::string_view AcceleratorKindName(AcceleratorKind kind);  // "cpu", "cuda"
absl::string_view OffloadDeviceName(OffloadDevice device);    // "none", "cpu", "nvme"
// torch's names, as bnb_4bit_compute_dtype writes them: "float32", "float16", "bfloat16".
absl::string_view TorchDTypeName(DType dtype);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_H_
