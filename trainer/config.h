// TrainConfig: the training program's configuration — a JSON file in DeepSpeed's format plus this
// project's own sections, command-line overrides on top, validation before any work is done, an
// embedded default, and a canonical JSON form (the checkpoint manifest stores it; resume compares
// it).
//
// The file format. DeepSpeed's keys, spelled as DeepSpeed spells them:
//
//   train_batch_size                  int > 0; optional (derived: micro x accumulation x world)
//   train_micro_batch_size_per_gpu    int >= 1
//   gradient_accumulation_steps       int; only 1 is supported yet
//   optimizer: {type: "Adam" | "AdamW" (case-insensitive),
//               params: {lr, betas: [b1, b2], eps, weight_decay,
//                        adam_w_mode (bool; with "Adam": true = decoupled decay, i.e. AdamW),
//                        amsgrad (false only), bias_correction (true only)}}
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
//          hysteresis, consecutive_hysteresis, min_loss_scale}
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
//   chunk:       {size: <elements, > 0> | "auto"}
//   accelerator: {backend: "cpu" | "cuda", memory: "64MiB" | <bytes>, host_memory: same,
//                 copy_bandwidth: "12GB/s" | <bytes per second>, device: <index>}
//   data:        {train, val, seq_len, shuffle, seed, eval_every, eval_batches}
//   checkpoint:  {dir, every, keep_last, resume, init_from, export}
//   profile:     {trace, metrics}
//
// DeepSpeed keys that do not apply here are accepted and ignored with a LOG(WARNING) — only these
// top-level ones (IgnoredDeepSpeedKeys()): zero_optimization, zero_allow_untested_optimizer,
// wall_clock_breakdown, memory_breakdown, prescale_gradients, gradient_predivide_factor,
// communication_data_type, sparse_gradients, tensorboard, wandb, csv_monitor, comms_logger,
// flops_profiler, dump_state, activation_checkpointing (DeepSpeed's section; ours is
// model.activation_checkpointing). Every other unknown key, at any level, is an error.
//
// Keys absent from a file keep the defaults of the structs below (DeepSpeed's defaults where
// DeepSpeed has the key), not DefaultTrainConfig(): a file describes a whole run.
//
// Errors. Every problem is InvalidArgument with a message naming the source, the full key path and
// the value, and saying what is allowed:
//   - JSON syntax: "config.json:3:12: JSON syntax error: ..." (1-based line and column, the
//     column counted in characters), with the offending line quoted;
//   - a key given twice in one object, or nesting deeper than any config needs;
//   - unknown keys, with "did you mean `betas`?" when a valid key is within a small
//     case-insensitive Damerau-Levenshtein distance (or is a known alias: hidden_size -> n_embd);
//   - wrong JSON types, naming the expected and the found type;
//   - impossible values (per key in ParseTrainConfig; across keys in ValidateTrainConfig).
//
// Typical use (the trainer):
//   ASSIGN_OR_RETURN(TrainConfig config, path.empty() ? DefaultTrainConfig()
//                                                      : LoadTrainConfig(path));
//   RETURN_IF_ERROR(ApplyOverrides(overrides_from_flags, &config));
//   RETURN_IF_ERROR(ValidateTrainConfig(config, world_size));
//
// Thread safety: value types and pure functions (ParseTrainConfig may LOG).
#ifndef PATRICKSTAR_TRAINER_CONFIG_H_
#define PATRICKSTAR_TRAINER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "optimizer/hybrid_adam.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/lr_schedule.h"

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

  friend bool operator==(const Fp16Config&, const Fp16Config&) = default;
};

// model. Either a preset (GptPresetNames(), model/gpt_config.h), whose fields the dimensions
// below override where they are > 0, or no preset and all five dimensions > 0.
struct ModelConfig {
  std::string preset;
  int64_t vocab_size = 0;   // "vocab_size"
  int64_t max_seq_len = 0;  // "n_positions"
  int64_t hidden = 0;       // "n_embd"
  int64_t num_layers = 0;   // "n_layer"
  int64_t num_heads = 0;    // "n_head"
  bool activation_checkpointing = false;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
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
  std::string train_path;  // "train": llm.c .bin token file; empty = built-in synthetic corpus
  std::string val_path;    // "val"
  int64_t seq_len = 0;     // 0: the model's n_positions
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t eval_every = 0;    // steps; 0 = only at the end when there is a validation set
  int64_t eval_batches = 4;  // >= 1

  friend bool operator==(const DataConfig&, const DataConfig&) = default;
};

// checkpoint.
struct CheckpointConfig {
  std::string dir;
  int64_t every = 0;      // steps; 0 = only at the end / on a signal
  int64_t keep_last = 2;  // >= 1
  bool resume = false;
  std::string init_from;    // Hugging Face GPT-2 safetensors to start from
  std::string export_path;  // "export": write Hugging Face safetensors at the end

  friend bool operator==(const CheckpointConfig&, const CheckpointConfig&) = default;
};

// profile.
struct ProfileConfig {
  std::string trace_path;    // "trace": Chrome trace-event JSON
  std::string metrics_path;  // "metrics": JSONL

  friend bool operator==(const ProfileConfig&, const ProfileConfig&) = default;
};

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
  ModelConfig model;
  ChunkConfig chunk;
  AcceleratorConfig accelerator;
  DataConfig data;
  CheckpointConfig checkpoint;
  ProfileConfig profile;

  // kF16 if fp16.enabled, else kBF16 if bf16, else kF32. (Both enabled is rejected by validation;
  // fp16 wins here.)
  PrecisionMode precision() const;

  friend bool operator==(const TrainConfig&, const TrainConfig&) = default;
};

// Overrides from command-line flags; unset fields leave the file's value.
//   model               a preset name; also clears model's explicit dimensions (they belonged to
//                       the file's model), keeping activation_checkpointing
//   train_data, val_data, init_from, save_dir (checkpoint.dir), metrics_out (profile.metrics),
//   trace_out (profile.trace): strings, taken as they are
//   accelerator         "cpu" | "cuda" (case-insensitive)
//   accelerator_memory  a byte quantity, base/units.h ParseBytes ("64MiB", "1.5GB", "1048576")
//   chunk_size          elements (an integer > 0) or "auto"
//   steps (> 0), seq_len (>= 0; 0 = the model's n_positions), seed, resume
//   micro_batch_size    >= 1; also resets train_batch_size to 0 (derived), so a file's
//                       train_batch_size cannot contradict the flag
struct ConfigOverrides {
  std::optional<std::string> model, train_data, val_data, init_from, accelerator,
      accelerator_memory, chunk_size, save_dir, metrics_out, trace_out;
  std::optional<int64_t> steps, seq_len, micro_batch_size;
  std::optional<uint64_t> seed;
  std::optional<bool> resume;
};

// Parses a config file's text. `source` (a file name) prefixes every error message. Checks the
// syntax, duplicate and unknown keys, the JSON types, and each value on its own (ranges, enum
// names, byte quantities, presets); the checks across keys, and train_steps > 0, are
// ValidateTrainConfig's. If `ignored_keys` is non-null, the ignored DeepSpeed keys found are
// appended to it (each is also LOG(WARNING)ed).
absl::StatusOr<TrainConfig> ParseTrainConfig(absl::string_view json_text, absl::string_view source,
                                             std::vector<std::string>* ignored_keys = nullptr);

// Reads and parses a file (ParseTrainConfig with the path as source). NotFound if it does not
// exist, PermissionDenied if it cannot be read, InvalidArgument for a directory, a file over
// 16 MiB, or any parse error.
absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path);

// The embedded default: a small GPT-2 (vocab 256, 128 positions, n_embd 128, 4 layers, 4 heads,
// activation checkpointing) on the built-in synthetic corpus, micro batch 8 x 64 tokens, 2000
// steps, AdamW (lr 3e-3, weight decay 0.01) with WarmupDecayLR (30 linear warm-up steps),
// clipping at 1.0, f32, chunks of 80 Ki elements, on the cpu accelerator with a 10 MiB cap below
// the 12.9 MiB of model data (so chunks move). All of its values are set in one place, in
// config.cc, with the measurements that chose them. It passes ValidateTrainConfig.
TrainConfig DefaultTrainConfig();

// Applies `o` to `config`. InvalidArgument naming the flag and its value for a value it cannot
// parse or that is out of range (the config is then unchanged). Checks only what it parses; call
// ValidateTrainConfig afterwards.
[[nodiscard]] absl::Status ApplyOverrides(const ConfigOverrides& o, TrainConfig* config);

// Every check: each value on its own (as ParseTrainConfig does) and across keys — train_steps > 0,
// not both fp16 and bf16, train_batch_size == micro x accumulation x world_size when set, the model
// resolves (ResolveModelConfig), data.seq_len <= n_positions, an explicit chunk.size holds the
// largest operator (all of an operator's tensors share a chunk), the learning-rate schedule and the
// loss scaler can be built, checkpoint.every / resume need checkpoint.dir, copy_bandwidth only with
// the cpu backend, strings are UTF-8 without NUL (they go into JSON manifests). InvalidArgument
// naming the key(s) and value(s).
[[nodiscard]] absl::Status ValidateTrainConfig(const TrainConfig& config, int world_size = 1);

// The model: the preset (if any) with the explicit dimensions > 0 replacing its fields, checked by
// ValidateGptConfig (and for sizes whose parameter count would not fit in int64). The name is the
// preset's, or "custom". InvalidArgument naming model.* keys (the missing dimensions, an unknown
// preset with the valid names, n_embd not divisible by n_head, ...).
absl::StatusOr<GptConfig> ResolveModelConfig(const ModelConfig& m);

// The canonical JSON of `config`: every key in a fixed order, two-space indented; byte quantities
// as "8MiB"-style strings when a whole number of KiB/MiB/GiB/TiB, else integers; chunk.size 0 as
// "auto"; scheduler params only those of its type (none and no section for kNone); warmup_max_lr
// omitted when -1; train_batch_size omitted when 0. For a config that passes the per-key checks,
// ParseTrainConfig(TrainConfigToJson(c)) == c (scheduler params that do not apply to its type are
// not written, so they come back as defaults).
std::string TrainConfigToJson(const TrainConfig& config);

// --- Derived values ------------------------------------------------------------------------------

// data.seq_len, or the model's max_seq_len when it is 0.
int64_t ResolveSeqLen(const TrainConfig& config, const GptConfig& model);

// train_batch_size, or micro x accumulation x world_size when it is 0.
int64_t ResolveTrainBatchSize(const TrainConfig& config, int world_size);

// The compute dtype of the param chunks: f32, f16 or bf16.
DType ComputeDType(PrecisionMode mode);

// --- Conversions to the optimizer's options --------------------------------------------------

// The loss scaler: None() for f32 and bf16; Static(fp16.loss_scale) if it is > 0; Dynamic from
// the other fp16 keys otherwise. InvalidArgument (naming fp16.*) for values the scaler rejects.
absl::StatusOr<LossScaler> MakeLossScaler(const TrainConfig& config);

// The learning-rate schedule: kConstant at optimizer.lr without a scheduler; otherwise the
// scheduler's type and params, with lr = warmup_max_lr (or optimizer.lr when it is -1, and always
// for WarmupCosineLR, whose peak is the optimizer's lr, as in DeepSpeed) and total_num_steps =
// train_steps when 0. Not validated here: LrSchedule::Create does (ValidateTrainConfig calls it).
LrScheduleOptions MakeLrScheduleOptions(const TrainConfig& config);

// HybridAdam's options: mode from optimizer.type, betas, eps, max_grad_norm = gradient_clipping,
// the loss scaler (MakeLossScaler), and the parameter groups: with weight_decay > 0, "no_decay"
// (biases and LayerNorm parameters, IsBiasOrNormTensor, weight decay 0) then "decay" (every other
// tensor), as Hugging Face's Trainer and DeepSpeed examples group them; otherwise one "default"
// group. Every group starts at optimizer.lr (the trainer sets the scheduled rate each step).
absl::StatusOr<HybridAdamOptions> MakeHybridAdamOptions(const TrainConfig& config);

// --- Names ----------------------------------------------------------------------------------

absl::string_view OptimizerTypeName(OptimizerType type);      // "Adam", "AdamW"
absl::string_view SchedulerTypeName(SchedulerType type);      // "none", "WarmupLR", ...
absl::string_view PrecisionModeName(PrecisionMode mode);      // "f32", "f16", "bf16"
absl::string_view AcceleratorKindName(AcceleratorKind kind);  // "cpu", "cuda"

// Every key path the parser accepts, e.g. "optimizer.params.betas", "model.n_embd", in the order
// of TrainConfigToJson (scheduler params listed once each). For tests and documentation.
std::vector<std::string> TrainConfigKeyPaths();

// The top-level DeepSpeed keys accepted and ignored (see the file comment).
std::vector<std::string> IgnoredDeepSpeedKeys();

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_CONFIG_H_
