#include "trainer/config_schema.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "base/units.h"
#include "model/gpt_config.h"
#include "model/kernels/nf4.h"
#include "model/model_config.h"

namespace ps {
namespace {

constexpr absl::string_view kTopKeys[] = {"train_batch_size",
                                          "train_micro_batch_size_per_gpu",
                                          "gradient_accumulation_steps",
                                          "train_steps",
                                          "seed",
                                          "threads",
                                          "steps_per_print",
                                          "gradient_clipping",
                                          "optimizer",
                                          "scheduler",
                                          "fp16",
                                          "bf16",
                                          "model",
                                          "chunk",
                                          "accelerator",
                                          "data",
                                          "checkpoint",
                                          "profile",
                                          "zero_optimization",
                                          "aio",
                                          "lora",
                                          "quantization"};
constexpr JsonKeyAlias kTopAliases[] = {
    {"steps", "train_steps"},
    {"max_steps", "train_steps"},
    {"train_iters", "train_steps"},
    {"num_steps", "train_steps"},
    {"batch_size", "train_micro_batch_size_per_gpu"},
    {"micro_batch_size", "train_micro_batch_size_per_gpu"},
    {"train_micro_batch_size", "train_micro_batch_size_per_gpu"},
    {"bfloat16", "bf16"},
    {"lr", "optimizer.params.lr"},
    {"learning_rate", "optimizer.params.lr"},
    {"max_grad_norm", "gradient_clipping"},
    {"grad_clip", "gradient_clipping"},
    {"num_threads", "threads"},
    {"peft", "lora"},
    {"lora_config", "lora"},
    {"quantization_config", "quantization"},
    {"bnb_config", "quantization"},
    {"load_in_4bit", "quantization.load_in_4bit"},
};

constexpr absl::string_view kOptimizerKeys[] = {"type", "params", "overlap"};
constexpr JsonKeyAlias kOptimizerAliases[] = {{"lr", "params"},
                                              {"betas", "params"},
                                              {"eps", "params"},
                                              {"weight_decay", "params"},
                                              {"name", "type"}};
constexpr absl::string_view kOptimizerParamKeys[] = {
    "lr", "betas", "eps", "weight_decay", "adam_w_mode", "amsgrad", "bias_correction"};
constexpr JsonKeyAlias kOptimizerParamAliases[] = {
    {"learning_rate", "lr"}, {"beta1", "betas"}, {"beta2", "betas"}, {"epsilon", "eps"}};

constexpr absl::string_view kSchedulerKeys[] = {"type", "params"};
constexpr JsonKeyAlias kSchedulerAliases[] = {{"name", "type"}};
constexpr absl::string_view kSchedulerParamKeys[] = {
    "warmup_min_lr",   "warmup_max_lr",    "warmup_num_steps", "warmup_type",
    "total_num_steps", "warmup_min_ratio", "cos_min_ratio",    "last_batch_iteration"};
constexpr JsonKeyAlias kSchedulerParamAliases[] = {{"warmup_steps", "warmup_num_steps"},
                                                   {"total_steps", "total_num_steps"}};

constexpr absl::string_view kFp16Keys[] = {"enabled",
                                           "loss_scale",
                                           "initial_scale_power",
                                           "loss_scale_window",
                                           "hysteresis",
                                           "consecutive_hysteresis",
                                           "min_loss_scale",
                                           "max_consecutive_skipped_steps"};
constexpr absl::string_view kBf16Keys[] = {"enabled"};

constexpr absl::string_view kModelKeys[] = {"preset",
                                            "vocab_size",
                                            "n_positions",
                                            "n_embd",
                                            "n_layer",
                                            "n_head",
                                            "activation_checkpointing"};
constexpr JsonKeyAlias kModelAliases[] = {
    {"name", "preset"},
    {"hidden", "n_embd"},
    {"hidden_size", "n_embd"},
    {"d_model", "n_embd"},
    {"num_layers", "n_layer"},
    {"num_hidden_layers", "n_layer"},
    {"num_heads", "n_head"},
    {"num_attention_heads", "n_head"},
    {"n_ctx", "n_positions"},
    {"max_seq_len", "n_positions"},
    {"max_position_embeddings", "n_positions"},
    {"seq_len", "n_positions"},
    {"gradient_checkpointing", "activation_checkpointing"},
};

constexpr absl::string_view kChunkKeys[] = {"size"};
constexpr JsonKeyAlias kChunkAliases[] = {
    {"size_elems", "size"}, {"chunk_size", "size"}, {"elements", "size"}};

constexpr absl::string_view kAcceleratorKeys[] = {"backend", "memory", "host_memory",
                                                  "copy_bandwidth", "device"};
constexpr JsonKeyAlias kAcceleratorAliases[] = {
    {"kind", "backend"},
    {"type", "backend"},
    {"memory_bytes", "memory"},
    {"capacity", "memory"},
    {"bandwidth", "copy_bandwidth"},
    {"device_index", "device"},
};

constexpr absl::string_view kDataKeys[] = {"train",      "val",          "seq_len", "shuffle",
                                           "seed",       "eval_every",   "eval_batches",
                                           "packing"};
constexpr JsonKeyAlias kDataAliases[] = {
    {"train_path", "train"},   {"train_data", "train"}, {"val_path", "val"},
    {"val_data", "val"},       {"validation", "val"},   {"valid", "val"},
    {"seq_length", "seq_len"},
};

constexpr absl::string_view kCheckpointKeys[] = {"dir",       "every",  "keep_last",    "resume",
                                                 "init_from", "export", "export_merged"};
constexpr JsonKeyAlias kCheckpointAliases[] = {
    {"save_dir", "dir"},
    {"path", "dir"},
    {"directory", "dir"},
    {"keep", "keep_last"},
    {"export_path", "export"},
    {"save_every", "every"},
    {"merged_export", "export_merged"},
    {"export_merged_path", "export_merged"},
};

constexpr absl::string_view kProfileKeys[] = {"trace", "metrics"};
constexpr JsonKeyAlias kProfileAliases[] = {{"trace_path", "trace"},
                                            {"trace_out", "trace"},
                                            {"metrics_path", "metrics"},
                                            {"metrics_out", "metrics"}};

// zero_optimization: the offload sections are read; DeepSpeed's other ZeRO keys are ignored (the
// ones listed here with their own reason, any other with kZeroIgnoredWhy).
constexpr absl::string_view kZeroKeys[] = {"offload_optimizer", "offload_param"};
constexpr JsonKeyAlias kZeroAliases[] = {{"offload_optimiser", "offload_optimizer"},
                                         {"optimizer_offload", "offload_optimizer"},
                                         {"offload_params", "offload_param"},
                                         {"offload_parameters", "offload_param"},
                                         {"param_offload", "offload_param"}};
constexpr absl::string_view kZeroIgnoredWhy =
    "chunks replace ZeRO stages; data-parallel ranks shard chunks ZeRO-style on their own";
constexpr absl::string_view kZeroBucketsWhy =
    "collectives move whole chunks (chunk.size sets their granularity)";
constexpr JsonIgnoredKey kZeroIgnoredKeys[] = {
    {"stage", kZeroIgnoredWhy},
    {"allgather_partitions", kZeroBucketsWhy},
    {"allgather_bucket_size", kZeroBucketsWhy},
    {"reduce_scatter", kZeroBucketsWhy},
    {"reduce_bucket_size", kZeroBucketsWhy},
    {"overlap_comm", kZeroBucketsWhy},
    {"contiguous_gradients", "gradients live in the parameter chunks, contiguous by construction"},
    {"sub_group_size", "the optimizer steps one chunk at a time"},
    {"cpu_offload", "use zero_optimization.offload_optimizer.device instead"},
    {"cpu_offload_params", "use zero_optimization.offload_param.device instead"},
    {"cpu_offload_use_pin_memory", "host chunk memory is always page-locked"},
};

constexpr absl::string_view kOffloadOptimizerKeys[] = {"device", "nvme_path", "buffer_count",
                                                       "host_budget", "pin_memory"};
constexpr JsonKeyAlias kOffloadOptimizerAliases[] = {{"path", "nvme_path"},
                                                     {"nvme_dir", "nvme_path"},
                                                     {"swap_path", "nvme_path"},
                                                     {"swap_folder", "nvme_path"},
                                                     {"buffers", "buffer_count"}};
constexpr JsonIgnoredKey kOffloadOptimizerIgnoredKeys[] = {
    {"fast_init", "the optimizer state is created in its chunks directly"},
    {"pipeline_read", "the disk tier always reads ahead of the optimizer"},
    {"pipeline_write", "the disk tier always writes behind the optimizer"},
    {"pipeline", "the disk tier always reads ahead and writes behind the optimizer"},
    {"ratio", "the scheduler places each optimizer-state chunk by the memory plan"},
};

constexpr absl::string_view kOffloadParamKeys[] = {"device", "nvme_path", "buffer_count",
                                                   "max_in_cpu", "pin_memory"};
constexpr JsonKeyAlias kOffloadParamAliases[] = {{"path", "nvme_path"},
                                                 {"nvme_dir", "nvme_path"},
                                                 {"swap_path", "nvme_path"},
                                                 {"swap_folder", "nvme_path"},
                                                 {"buffers", "buffer_count"}};
constexpr JsonIgnoredKey kOffloadParamIgnoredKeys[] = {
    {"buffer_size",
     "the disk tier reads and writes whole param chunks (chunk.size sets their size), not "
     "buffers of a size of their own"},
};

constexpr absl::string_view kAioKeys[] = {"block_size", "queue_depth", "thread_count",
                                          "single_submit", "overlap_events"};
constexpr JsonKeyAlias kAioAliases[] = {{"intra_op_parallelism", "thread_count"},
                                        {"threads", "thread_count"},
                                        {"block_bytes", "block_size"}};
constexpr JsonIgnoredKey kAioIgnoredKeys[] = {
    {"use_gds", "chunks are read from disk into host memory, not directly into the GPU"},
};

// lora: PEFT LoraConfig's names.
constexpr absl::string_view kLoraKeys[] = {
    "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "modules_to_save", "init_from"};
constexpr JsonKeyAlias kLoraAliases[] = {
    {"rank", "r"},
    {"lora_r", "r"},
    {"alpha", "lora_alpha"},
    {"dropout", "lora_dropout"},
    {"target", "target_modules"},
    {"targets", "target_modules"},
    {"modules", "target_modules"},
    {"lora_target_modules", "target_modules"},
    {"adapter", "init_from"},
    {"adapter_path", "init_from"},
    {"adapter_dir", "init_from"},
};
constexpr JsonIgnoredKey kLoraIgnoredKeys[] = {
    {"task_type", "the trainer trains causal language models (PEFT's CAUSAL_LM)"},
};

// quantization: transformers' BitsAndBytesConfig names. quant_method, bnb_4bit_quant_storage and
// load_in_8bit are what transformers writes beside them: accepted with the one value that means
// this section (ReadQuantization checks it), and not part of TrainConfigKeyPaths.
constexpr absl::string_view kQuantizationKeys[] = {"load_in_4bit",
                                                   "bnb_4bit_quant_type",
                                                   "bnb_4bit_use_double_quant",
                                                   "bnb_4bit_compute_dtype",
                                                   "llm_int8_skip_modules",
                                                   "quant_method",
                                                   "bnb_4bit_quant_storage",
                                                   "load_in_8bit",
                                                   "_load_in_4bit",
                                                   "_load_in_8bit"};
// Read and checked, never written back (BitsAndBytesConfig.to_dict() writes _load_in_4bit and
// _load_in_8bit beside load_in_4bit and load_in_8bit: they must agree).
constexpr absl::string_view kQuantizationCheckedOnlyKeys[] = {
    "quant_method", "bnb_4bit_quant_storage", "load_in_8bit", "_load_in_4bit", "_load_in_8bit"};
// BitsAndBytesConfig.to_dict()'s 8-bit (LLM.int8()) settings: their types are checked (as
// transformers' post_init does and model/quant4_import.cc does for config.json), their values
// ignored.
constexpr absl::string_view kInt8SettingWhy =
    "an LLM.int8() (8-bit) setting, which a 4-bit base does not use (bitsandbytes ignores it with "
    "load_in_4bit too)";
constexpr JsonIgnoredKey kQuantizationIgnoredKeys[] = {
    {"llm_int8_threshold", kInt8SettingWhy},
    {"llm_int8_has_fp16_weight", kInt8SettingWhy},
    {"llm_int8_enable_fp32_cpu_offload", kInt8SettingWhy},
};
constexpr JsonKeyAlias kQuantizationAliases[] = {
    {"quant_type", "bnb_4bit_quant_type"},
    {"double_quant", "bnb_4bit_use_double_quant"},
    {"use_double_quant", "bnb_4bit_use_double_quant"},
    {"compute_dtype", "bnb_4bit_compute_dtype"},
    {"skip_modules", "llm_int8_skip_modules"},
    {"modules_to_not_convert", "llm_int8_skip_modules"},
    {"quant_storage", "bnb_4bit_quant_storage"},
};

// Top-level DeepSpeed keys accepted and ignored, with the reason given in the warning.
constexpr JsonIgnoredKey kIgnoredKeys[] = {
    {"zero_allow_untested_optimizer", "the optimizer is always HybridAdam"},
    {"wall_clock_breakdown", "use profile.trace for timings"},
    {"memory_breakdown", "use profile.trace and profile.metrics for memory"},
    {"prescale_gradients", "gradients are averaged after the reduction"},
    {"gradient_predivide_factor", "gradients are averaged after the reduction"},
    {"communication_data_type", "collectives use the chunks' dtype"},
    {"sparse_gradients", "the model has no sparse gradients"},
    {"tensorboard", "use profile.metrics (JSONL)"},
    {"wandb", "use profile.metrics (JSONL)"},
    {"csv_monitor", "use profile.metrics (JSONL)"},
    {"comms_logger", "use profile.trace"},
    {"flops_profiler", "use profile.trace and profile.metrics"},
    {"dump_state", "not applicable"},
    {"activation_checkpointing", "set model.activation_checkpointing instead"},
};

}  // namespace

const TrainConfigSchema& ConfigSchema() {
  static constexpr TrainConfigSchema kSchema{
      .top = {"", kTopKeys, kTopAliases, kIgnoredKeys},
      .optimizer = {"optimizer", kOptimizerKeys, kOptimizerAliases},
      .optimizer_params = {"optimizer.params", kOptimizerParamKeys, kOptimizerParamAliases},
      .scheduler = {"scheduler", kSchedulerKeys, kSchedulerAliases},
      .scheduler_params = {"scheduler.params", kSchedulerParamKeys, kSchedulerParamAliases},
      .fp16 = {"fp16", kFp16Keys},
      .bf16 = {"bf16", kBf16Keys},
      .model = {"model", kModelKeys, kModelAliases},
      .chunk = {"chunk", kChunkKeys, kChunkAliases},
      .accelerator = {"accelerator", kAcceleratorKeys, kAcceleratorAliases},
      .data = {"data", kDataKeys, kDataAliases},
      .checkpoint = {"checkpoint", kCheckpointKeys, kCheckpointAliases},
      .profile = {"profile", kProfileKeys, kProfileAliases},
      .zero_optimization = {"zero_optimization", kZeroKeys, kZeroAliases, kZeroIgnoredKeys},
      .offload_optimizer = {"zero_optimization.offload_optimizer", kOffloadOptimizerKeys,
                            kOffloadOptimizerAliases, kOffloadOptimizerIgnoredKeys},
      .offload_param = {"zero_optimization.offload_param", kOffloadParamKeys,
                        kOffloadParamAliases, kOffloadParamIgnoredKeys},
      .aio = {"aio", kAioKeys, kAioAliases, kAioIgnoredKeys},
      .lora = {"lora", kLoraKeys, kLoraAliases, kLoraIgnoredKeys},
      .quantization = {"quantization", kQuantizationKeys, kQuantizationAliases,
                       kQuantizationIgnoredKeys},
  };
  return kSchema;
}

bool SchedulerParamApplies(SchedulerType type, absl::string_view key) {
  if (key == "last_batch_iteration" || key == "warmup_num_steps" || key == "warmup_type") {
    return type != SchedulerType::kNone;
  }
  switch (type) {
    case SchedulerType::kNone:
      return false;
    case SchedulerType::kWarmupLR:
      return key == "warmup_min_lr" || key == "warmup_max_lr";
    case SchedulerType::kWarmupDecayLR:
      return key == "warmup_min_lr" || key == "warmup_max_lr" || key == "total_num_steps";
    case SchedulerType::kWarmupCosineLR:
      return key == "total_num_steps" || key == "warmup_min_ratio" || key == "cos_min_ratio";
  }
  return false;
}

std::vector<std::string> SchedulerParamsOf(SchedulerType type) {
  std::vector<std::string> keys;
  for (absl::string_view key : kSchedulerParamKeys) {
    if (SchedulerParamApplies(type, key)) keys.emplace_back(key);
  }
  return keys;
}

std::vector<std::string> TrainConfigKeyPaths() {
  std::vector<std::string> paths;
  const auto add = [&paths](const JsonSection& section) {
    for (absl::string_view key : section.keys) {
      // Sections are listed through their own tables.
      if (section.path.empty() &&
          (key == "optimizer" || key == "scheduler" || key == "fp16" || key == "bf16" ||
           key == "model" || key == "chunk" || key == "accelerator" || key == "data" ||
           key == "checkpoint" || key == "profile" || key == "zero_optimization" || key == "aio" ||
           key == "lora" || key == "quantization")) {
        continue;
      }
      if (section.path == "quantization" &&
          std::find(std::begin(kQuantizationCheckedOnlyKeys),
                    std::end(kQuantizationCheckedOnlyKeys),
                    key) != std::end(kQuantizationCheckedOnlyKeys)) {
        continue;
      }
      if (key == "params" || key == "offload_optimizer" || key == "offload_param") continue;
      paths.push_back(JsonReader::JoinKeyPath(section.path, key));
    }
  };
  const TrainConfigSchema& s = ConfigSchema();
  for (const JsonSection* section :
       {&s.top, &s.optimizer, &s.optimizer_params, &s.scheduler, &s.scheduler_params, &s.fp16,
        &s.bf16, &s.model, &s.chunk, &s.accelerator, &s.data, &s.checkpoint, &s.profile,
        &s.offload_optimizer, &s.offload_param, &s.aio, &s.lora, &s.quantization}) {
    add(*section);
  }
  return paths;
}

std::vector<std::string> IgnoredDeepSpeedKeys() {
  std::vector<std::string> keys;
  for (const JsonIgnoredKey& k : kIgnoredKeys) keys.emplace_back(k.key);
  return keys;
}

absl::string_view ZeroOptimizationIgnoredReason(absl::string_view key) {
  for (const JsonIgnoredKey& k : kZeroIgnoredKeys) {
    if (k.key == key) return k.why;
  }
  return kZeroIgnoredWhy;
}

std::vector<std::string> TrainModelPresetNames() {
  std::vector<std::string> names = GptPresetNames();
  const size_t gpt = names.size();
  for (std::string& name : ModelPresetNames()) {
    if (std::find(names.begin(), names.begin() + static_cast<ptrdiff_t>(gpt), name) ==
        names.begin() + static_cast<ptrdiff_t>(gpt)) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name) {
  if (absl::EqualsIgnoreCase(name, "Adam")) return OptimizerType::kAdam;
  if (absl::EqualsIgnoreCase(name, "AdamW")) return OptimizerType::kAdamW;
  return absl::InvalidArgumentError("is not supported; use \"Adam\" or \"AdamW\"");
}

absl::StatusOr<SchedulerType> ParseSchedulerType(absl::string_view name) {
  for (SchedulerType t :
       {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR, SchedulerType::kWarmupCosineLR}) {
    if (absl::EqualsIgnoreCase(name, SchedulerTypeName(t))) return t;
  }
  return absl::InvalidArgumentError(
      "is not supported; use \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\" (omit the "
      "scheduler section for a constant learning rate)");
}

absl::StatusOr<AcceleratorKind> ParseAcceleratorKind(absl::string_view name) {
  if (absl::EqualsIgnoreCase(name, "cpu")) return AcceleratorKind::kCpu;
  if (absl::EqualsIgnoreCase(name, "cuda")) return AcceleratorKind::kCuda;
  return absl::InvalidArgumentError(
      "is not a backend; use \"cpu\" (the emulated accelerator) or \"cuda\"");
}

absl::StatusOr<OffloadDevice> ParseOffloadDevice(absl::string_view name) {
  for (OffloadDevice d : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    if (absl::EqualsIgnoreCase(name, OffloadDeviceName(d))) return d;
  }
  return absl::InvalidArgumentError("is not an offload device; use \"none\", \"cpu\" or \"nvme\"");
}

// "12GB/s", "1.5 GiB/s", "100MB" (the "/s" is optional).
absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (absl::EndsWithIgnoreCase(s, "/s")) s.remove_suffix(2);
  absl::StatusOr<int64_t> bytes = ParseBytes(s);
  if (!bytes.ok()) return bytes.status();
  return static_cast<double>(*bytes);
}

absl::StatusOr<Quant4Type> ParseBnbQuantType(absl::string_view name) {
  for (Quant4Type t : {Quant4Type::kNf4, Quant4Type::kFp4}) {
    if (name == Quant4TypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      "is not a 4-bit quant type; use \"nf4\" or \"fp4\" (bitsandbytes' names, lower case)");
}

absl::StatusOr<DType> ParseTorchDType(absl::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (name == TorchDTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      "is not a compute dtype; use \"float32\", \"bfloat16\" or \"float16\" (torch's names)");
}

std::vector<std::string> ParseLoraModuleList(absl::string_view text) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    names.emplace_back(absl::StripAsciiWhitespace(part));
  }
  return names;
}

}  // namespace ps
