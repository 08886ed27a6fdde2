#include "trainer/config.h"

#include <string>

#include "base/units.h"

namespace ps {

// --- The embedded default: every value in one place ------------------------------------------

// Measured on the emulated accelerator: with micro batch 8 x 128 tokens the activations alone need
// ~32 MiB (~24 MiB with activation checkpointing), above the model data. 8 x 64 tokens with
// activation checkpointing peak at ~6.6 MiB of activations, so a 10 MiB cap — below the 12.9 MiB
// of model data — leaves room for about a quarter of the chunks: ~10 MiB of chunks move per step,
// and the validation loss falls from 5.6 to ~0.43 in 2000 steps (`bazel run //trainer:train`).
TrainConfig DefaultTrainConfig() {
  TrainConfig c;
  // A small GPT-2: 842,496 parameters, 12.9 MiB of f32 model data (16 bytes/param).
  c.model.vocab_size = 256;
  c.model.max_seq_len = 128;
  c.model.hidden = 128;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  // Activations of 8 x 64 tokens with each block recomputed in backward take ~6.6 MiB of the
  // accelerator at their peak; the rest of the cap is left to chunks.
  c.model.activation_checkpointing = true;
  c.data.seq_len = 64;
  c.train_micro_batch_size_per_gpu = 8;
  c.steps = 2000;         // 123 s on 2 idle Zen 3 cores (~62 ms a step; README's headline)
  c.steps_per_print = 1;  // a progress line per step
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 3e-3;
  c.optimizer.weight_decay = 0.01;
  c.scheduler.type = SchedulerType::kWarmupDecayLR;
  c.scheduler.warmup_num_steps = 30;
  c.scheduler.warmup_type = "linear";
  c.scheduler.warmup_min_lr = 0;
  c.scheduler.warmup_max_lr = -1;   // optimizer.lr
  c.scheduler.total_num_steps = 0;  // train_steps
  c.gradient_clipping = 1.0;
  // 80 Ki elements: the largest operator, mlp.c_fc (128 x 512 + 512 = 66,048 elements), fits, and
  // the model takes 13 chunks (80% of their capacity used). 64 Ki would not hold mlp.c_fc.
  c.chunk.size_elems = 80 * kKiB;
  c.accelerator.kind = AcceleratorKind::kCpu;
  // Below the model data (13.5 MB), so chunks move: after the activations' peak about a quarter
  // of the chunks fit.
  c.accelerator.memory_bytes = 10 * kMiB;
  c.data.eval_every = 250;  // on the trainer's synthetic validation split (data.val empty)
  c.data.eval_batches = 4;
  return c;
}

bool LoraSettings::all_linear() const {
  return target_modules.size() == 1 && target_modules[0] == kLoraAllLinear;
}

LoraConfig ToLoraConfig(const LoraSettings& settings) {
  LoraConfig lora;
  lora.r = settings.r;
  lora.lora_alpha = settings.lora_alpha;
  lora.lora_dropout = settings.lora_dropout;
  lora.target_modules = settings.target_modules;
  lora.bias = settings.bias;
  lora.modules_to_save = settings.modules_to_save;
  return lora;
}

std::optional<Quant4Config> ToQuant4Config(const QuantizationSettings& settings) {
  if (!settings.load_in_4bit) return std::nullopt;
  Quant4Config q;
  q.quant_type = settings.quant_type;
  q.double_quant = settings.double_quant;
  q.compute_dtype = settings.compute_dtype;
  q.skip_modules = settings.skip_modules;
  return q;
}

PrecisionMode TrainConfig::precision() const {
  if (fp16.enabled) return PrecisionMode::kF16;
  if (bf16) return PrecisionMode::kBF16;
  return PrecisionMode::kF32;
}

absl::string_view OptimizerTypeName(OptimizerType type) {
  return type == OptimizerType::kAdam ? "Adam" : "AdamW";
}

absl::string_view SchedulerTypeName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kNone:
      return "none";
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "unknown";
}

absl::string_view PrecisionModeName(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kF32:
      return "f32";
    case PrecisionMode::kF16:
      return "f16";
    case PrecisionMode::kBF16:
      return "bf16";
  }
  return "unknown";
}

absl::string_view AcceleratorKindName(AcceleratorKind kind) {
  return kind == AcceleratorKind::kCpu ? "cpu" : "cuda";
}

absl::string_view OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "unknown";
}

bool UsesDiskTier(const ZeroOptimizationConfig& zero) {
  return zero.offload_optimizer.device == OffloadDevice::kNvme ||
         zero.offload_param.device == OffloadDevice::kNvme;
}

const std::string& DiskTierDir(const ZeroOptimizationConfig& zero) {
  static const std::string* const kNone = new std::string();
  if (zero.offload_optimizer.device == OffloadDevice::kNvme) return zero.offload_optimizer.nvme_path;
  if (zero.offload_param.device == OffloadDevice::kNvme) return zero.offload_param.nvme_path;
  return *kNone;
}

std::string DiskTierDirKey(const ZeroOptimizationConfig& zero) {
  if (zero.offload_optimizer.device == OffloadDevice::kNvme) {
    return "zero_optimization.offload_optimizer.nvme_path (--nvme_path)";
  }
  if (zero.offload_param.device == OffloadDevice::kNvme) {
    return "zero_optimization.offload_param.nvme_path (--nvme_path)";
  }
  return std::string();
}

absl::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "unknown";
}

DType ComputeDType(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kF16:
      return DType::kF16;
    case PrecisionMode::kBF16:
      return DType::kBF16;
    case PrecisionMode::kF32:
      break;
  }
  return DType::kF32;
}

int64_t ResolveSeqLen(const TrainConfig& config, const GptConfig& model) {
  return config.data.seq_len > 0 ? config.data.seq_len : model.max_seq_len;
}

int64_t ResolveTrainBatchSize(const TrainConfig& config, int world_size) {
  if (config.train_batch_size > 0) return config.train_batch_size;
  return config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * world_size;
}

}  // namespace ps
