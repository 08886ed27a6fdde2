#include "trainer/config_validate.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "model/gpt_activation_profile.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/lr_schedule.h"
#include "trainer/config_optimizer.h"
#include "trainer/config_schema.h"
#include "trainer/json_reader.h"

namespace ps {
namespace {

absl::Status BadValue(absl::string_view key, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("`", key, "` = ", value, ": ", rule));
}
absl::Status BadValue(absl::string_view key, int64_t value, absl::string_view rule) {
  return BadValue(key, absl::StrCat(value), rule);
}
absl::Status BadDouble(absl::string_view key, double value, absl::string_view rule) {
  return BadValue(key, FormatShortestDouble(value), rule);
}

absl::Status CheckString(absl::string_view key, const std::string& value) {
  if (!IsValidUtf8(value)) {
    return BadValue(key, QuoteForMessage(value),
                    "is not valid UTF-8 (the config is stored as JSON)");
  }
  if (value.find('\0') != std::string::npos) {
    return BadValue(key, QuoteForMessage(value), "contains a NUL character");
  }
  return absl::OkStatus();
}

// The model section's dimensions under the keys a config writes them with, and the largest
// value each may take (model/model_config.h refuses more than 2^20 layers; the trainer says so
// naming the key the user wrote, not ModelConfig's field).
struct ModelDimension {
  absl::string_view key;
  int64_t value;
  int64_t max;
};
std::vector<ModelDimension> ModelDimensions(const TrainModelConfig& m) {
  return {{"model.vocab_size", m.vocab_size, kMaxModelDim},
          {"model.n_positions", m.max_seq_len, kMaxModelDim},
          {"model.n_embd", m.hidden, kMaxModelDim},
          {"model.n_layer", m.num_layers, kMaxModelLayers},
          {"model.n_head", m.num_heads, kMaxModelDim}};
}

absl::Status CheckModelDimensions(const TrainModelConfig& m) {
  for (const ModelDimension& d : ModelDimensions(m)) {
    if (d.value < 0 || d.value > d.max) {
      return BadValue(d.key, d.value,
                      absl::StrCat("must be in [1, ", d.max, "] (or 0: the preset's)"));
    }
  }
  return absl::OkStatus();
}

std::string PresetList() { return absl::StrJoin(TrainModelPresetNames(), ", "); }

// The Llama-family preset `name` (any architecture but GPT-2), or nullopt.
std::optional<ModelConfig> LlamaFamilyPreset(absl::string_view name) {
  if (name.empty()) return std::nullopt;
  absl::StatusOr<ModelConfig> preset = ModelPreset(name);
  if (!preset.ok() || preset->architecture() == ModelArchitecture::kGpt2) return std::nullopt;
  return *std::move(preset);
}

GptConfig GptView(const ModelConfig& c) {
  return GptConfig{c.name,        c.vocab_size, c.max_position_embeddings,
                   c.hidden_size, c.num_layers, c.num_heads};
}

// A Llama-family preset with the section's explicit dimensions replacing its fields: n_embd and
// n_head set hidden_size and num_heads, and the head dimension becomes n_embd / n_head; the
// preset's key/value heads, MLP width, RoPE and norm stay. Errors name the keys as written.
absl::StatusOr<ModelConfig> ResolveLlamaPreset(const TrainModelConfig& m, ModelConfig c) {
  const std::string preset = absl::StrCat("model.preset \"", m.preset, "\"");
  if (m.vocab_size > 0) c.vocab_size = m.vocab_size;
  if (m.max_seq_len > 0) c.max_position_embeddings = m.max_seq_len;
  if (m.num_layers > 0) c.num_layers = m.num_layers;
  if (m.hidden > 0 || m.num_heads > 0) {
    if (m.hidden > 0) c.hidden_size = m.hidden;
    if (m.num_heads > 0) c.num_heads = m.num_heads;
    if (c.hidden_size % c.num_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`model.n_embd` = ", c.hidden_size, m.hidden > 0 ? "" : absl::StrCat(" (", preset, ")"),
          " is not divisible by `model.n_head` = ", c.num_heads,
          m.num_heads > 0 ? "" : absl::StrCat(" (", preset, ")"),
          ": each head gets n_embd / n_head dimensions"));
    }
    c.head_dim = c.hidden_size / c.num_heads;
    if (c.num_heads % c.num_kv_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`model.n_head` = ", c.num_heads, " is not a multiple of the ", c.num_kv_heads,
          " key/value heads of ", preset,
          " (grouped-query attention shares each key/value head among a whole number of query "
          "heads); use a multiple of ",
          c.num_kv_heads));
    }
    if (c.head_dim % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("`model.n_embd` / `model.n_head` = ", c.hidden_size, " / ", c.num_heads,
                       " = ", c.head_dim, " dimensions per head, an odd number: RoPE (", preset,
                       ") rotates pairs of dimensions"));
    }
  }
  // The closed form of ModelParameterCount, in floating point so it cannot overflow.
  const double e = static_cast<double>(c.hidden_size), q = static_cast<double>(c.q_size()),
               k = static_cast<double>(c.kv_size()), i = static_cast<double>(c.intermediate_size);
  const double per_layer = 2 * e + 2 * e * q + 2 * e * k + 3 * e * i + (c.qkv_bias ? q + 2 * k : 0);
  const double params = static_cast<double>(c.vocab_size) * e * (c.tie_word_embeddings ? 1 : 2) +
                        e + static_cast<double>(c.num_layers) * per_layer;
  if (params > kMaxModelParams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model (", preset, ", vocab_size ", c.vocab_size, ", n_embd ", c.hidden_size,
        ", n_layer ", c.num_layers, ") would have ", FormatShortestDouble(params),
        " parameters, more than 2^53; use smaller dimensions"));
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

// checkpoint.init_from names no directory and the model section defines no model: the path
// and the reason it cannot be read come first (what the trainer would say with a model section),
// then that a GPT-2 safetensors file does not define the model.
absl::Status ExplainInitFromWithoutModel(const std::string& path, const absl::Status& undefined) {
  constexpr absl::string_view kKey = "checkpoint.init_from (--init_from)";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return ErrnoError(err, absl::StrCat("cannot examine ", kKey), path);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kKey, " '", path,
                     "' is neither a Hugging Face model directory nor a GPT-2 safetensors file"));
  }
  if (absl::Status header = SafetensorsFile::Open(path).status(); !header.ok()) {
    return absl::Status(header.code(), absl::StrCat(kKey, ": ", header.message()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kKey, " '", path,
      "' is a safetensors file: GPT-2 weights, which do not say the model's dimensions; ",
      undefined.message(), " (or give a Hugging Face model directory, whose config.json does)"));
}

// A list of module names as a config writes it, for messages: ["q_proj", "v_proj"].
std::string ModuleListForMessage(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& name : names) quoted.push_back(QuoteForMessage(name));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

// lora.target_modules or lora.modules_to_save: names non-empty, UTF-8 without NUL, each once, and
// "all-linear" nowhere (CheckLoraValues accepts it alone in target_modules before this).
absl::Status CheckModuleNames(absl::string_view key, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string element = absl::StrCat(key, "[", i, "]");
    RETURN_IF_ERROR(CheckString(element, names[i]));
    if (names[i].empty()) {
      return BadValue(element, "\"\"", "a module name cannot be empty");
    }
    if (absl::EqualsIgnoreCase(names[i], kLoraAllLinear)) {
      return BadValue(element, QuoteForMessage(names[i]),
                      key == "lora.target_modules"
                          ? "\"all-linear\" stands alone: write target_modules: \"all-linear\" "
                            "(a string, as PEFT does), not inside a list of module names"
                          : "is not a module name");
    }
    for (size_t j = 0; j < i; ++j) {
      if (names[j] == names[i]) {
        return BadValue(
            key, ModuleListForMessage(names),
            absl::StrCat("lists ", QuoteForMessage(names[i]), " twice; list each once"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoraValues(const LoraSettings& l) {
  if (l.r < 1 || l.r > kMaxModelDim) {
    return BadValue(
        "lora.r", l.r,
        absl::StrCat(l.r < 1 ? "must be >= 1" : absl::StrCat("must be <= ", kMaxModelDim),
                     ": the adapters' rank, e.g. 8 or 16"));
  }
  if (!(l.lora_alpha > 0) || !std::isfinite(l.lora_alpha)) {
    return BadDouble("lora.lora_alpha", l.lora_alpha,
                     "must be finite and > 0: the adapters' output is scaled by lora_alpha / r "
                     "(PEFT's default: 8)");
  }
  if (!(l.lora_dropout >= 0 && l.lora_dropout < 1)) {
    return BadDouble("lora.lora_dropout", l.lora_dropout,
                     "must be in [0, 1): the probability of dropping an adapter input (0: none)");
  }
  if (l.target_modules.empty()) {
    return BadValue("lora.target_modules", "[]",
                    "name the modules to adapt, e.g. [\"q_proj\", \"v_proj\"] (GPT-2: "
                    "[\"c_attn\"]; --lora_target_modules=q_proj,v_proj), or \"all-linear\"");
  }
  if (!l.all_linear()) RETURN_IF_ERROR(CheckModuleNames("lora.target_modules", l.target_modules));
  RETURN_IF_ERROR(CheckString("lora.bias", l.bias));
  if (l.bias != "none") {
    return BadValue("lora.bias", QuoteForMessage(l.bias),
                    "only \"none\" is supported: no bias is trained (PEFT's \"all\" and "
                    "\"lora_only\" are not)");
  }
  RETURN_IF_ERROR(CheckModuleNames("lora.modules_to_save", l.modules_to_save));
  RETURN_IF_ERROR(CheckString("lora.init_from", l.init_from));
  return absl::OkStatus();
}

// The 4-bit base: frozen (a lora section); double quantization only on one rank (each rank
// quantizes its own chunks; the nested offsets stay on it). Any run dtype: the 4-bit weights'
// GEMMs compute in bnb_4bit_compute_dtype whatever the param chunks' element type.
absl::Status CheckQuantizationAcrossKeys(const TrainConfig& c, std::optional<int> world_size) {
  const QuantizationSettings& q = c.quantization;
  if (!q.load_in_4bit) return absl::OkStatus();
  if (!c.lora.has_value()) {
    return absl::InvalidArgumentError(
        "`quantization.load_in_4bit` = true (--load_in_4bit) stores the base model in 4 bits, "
        "which only a frozen base can be, but the config has no `lora` section: add a lora "
        "section (or --lora_r and --lora_target_modules) to train adapters over the 4-bit base "
        "(QLoRA), or drop quantization.load_in_4bit");
  }
  if (q.double_quant && world_size.value_or(1) > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "`quantization.bnb_4bit_use_double_quant` = true under ZeRO (", *world_size,
        " ranks) is not supported: each rank quantizes its own chunks, and the nested scales' "
        "offsets would not reach the others; set it to false (plain absmax: 0.5625 bytes per "
        "4-bit parameter instead of 0.5159) or train on one process"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTrainConfigValues(const TrainConfig& c) {
  // Batch and steps.
  if (c.train_batch_size < 0) {
    return BadValue("train_batch_size", c.train_batch_size,
                    "must be >= 1 (or omitted: micro batch x accumulation x world size)");
  }
  if (c.train_micro_batch_size_per_gpu < 1) {
    return BadValue("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu,
                    "must be >= 1");
  }
  if (c.gradient_accumulation_steps < 1) {
    return BadValue("gradient_accumulation_steps", c.gradient_accumulation_steps,
                    "must be >= 1 (micro-batches per optimizer step)");
  }
  if (c.steps < 0) {
    return BadValue("train_steps", c.steps, "must be > 0 (or 0 in a file, set with --steps)");
  }
  if (c.threads < 0 || c.threads > kMaxThreads) {
    return BadValue("threads", c.threads,
                    absl::StrCat("must be in [0, ", kMaxThreads, "]; 0 uses every core"));
  }
  if (c.steps_per_print < 1) {
    return BadValue("steps_per_print", c.steps_per_print, "must be >= 1");
  }
  if (!(c.gradient_clipping >= 0) || !std::isfinite(c.gradient_clipping)) {
    return BadDouble("gradient_clipping", c.gradient_clipping,
                     "must be finite and >= 0 (the global L2 norm to clip to; 0 = off)");
  }

  // Optimizer.
  const OptimizerConfig& o = c.optimizer;
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) {
    return BadDouble("optimizer.params.lr", o.lr, "the learning rate must be finite and >= 0");
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return BadDouble("optimizer.params.betas[0]", o.beta1, "must be in [0, 1), e.g. 0.9");
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return BadDouble("optimizer.params.betas[1]", o.beta2, "must be in [0, 1), e.g. 0.999");
  }
  if (!(o.eps > 0) || !std::isfinite(o.eps)) {
    return BadDouble("optimizer.params.eps", o.eps, "must be finite and > 0, e.g. 1e-8");
  }
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) {
    return BadDouble("optimizer.params.weight_decay", o.weight_decay, "must be finite and >= 0");
  }

  // Scheduler.
  const SchedulerConfig& s = c.scheduler;
  if (!(s.warmup_min_lr >= 0) || !std::isfinite(s.warmup_min_lr)) {
    return BadDouble("scheduler.params.warmup_min_lr", s.warmup_min_lr, "must be finite and >= 0");
  }
  if (!(s.warmup_max_lr == -1 || (s.warmup_max_lr >= 0 && std::isfinite(s.warmup_max_lr)))) {
    return BadDouble("scheduler.params.warmup_max_lr", s.warmup_max_lr,
                     "must be finite and >= 0 (or omitted: optimizer.params.lr)");
  }
  if (s.warmup_num_steps < 0) {
    return BadValue("scheduler.params.warmup_num_steps", s.warmup_num_steps, "must be >= 0");
  }
  if (s.warmup_type != "log" && s.warmup_type != "linear") {
    return BadValue("scheduler.params.warmup_type", QuoteForMessage(s.warmup_type),
                    "use \"log\" or \"linear\"");
  }
  if (s.total_num_steps < 0) {
    return BadValue("scheduler.params.total_num_steps", s.total_num_steps,
                    "must be >= 0 (0: train_steps)");
  }
  if (!(s.warmup_min_ratio >= 0 && s.warmup_min_ratio <= 1)) {
    return BadDouble("scheduler.params.warmup_min_ratio", s.warmup_min_ratio, "must be in [0, 1]");
  }
  if (!(s.cos_min_ratio >= 0 && s.cos_min_ratio <= 1)) {
    return BadDouble("scheduler.params.cos_min_ratio", s.cos_min_ratio, "must be in [0, 1]");
  }

  // fp16.
  const Fp16Config& f = c.fp16;
  if (!(f.loss_scale >= 0 && f.loss_scale <= kMaxLossScale)) {
    return BadDouble("fp16.loss_scale", f.loss_scale,
                     "must be in [0, 2^100]; 0 selects dynamic loss scaling");
  }
  if (f.initial_scale_power < 0 || f.initial_scale_power > 100) {
    return BadValue("fp16.initial_scale_power", f.initial_scale_power,
                    "must be in [0, 100] (the initial scale is 2^power)");
  }
  if (f.loss_scale_window < 1) {
    return BadValue("fp16.loss_scale_window", f.loss_scale_window, "must be >= 1 clean steps");
  }
  if (f.hysteresis < 1) return BadValue("fp16.hysteresis", f.hysteresis, "must be >= 1");
  if (!(f.min_loss_scale > 0 && f.min_loss_scale <= kMaxLossScale)) {
    return BadDouble("fp16.min_loss_scale", f.min_loss_scale, "must be in (0, 2^100]");
  }
  if (f.max_consecutive_skipped_steps < 0) {
    return BadValue("fp16.max_consecutive_skipped_steps", f.max_consecutive_skipped_steps,
                    "must be >= 0 (0: stop where DeepSpeed does, at an overflow with the loss "
                    "scale at fp16.min_loss_scale)");
  }

  // Model.
  const TrainModelConfig& m = c.model;
  RETURN_IF_ERROR(CheckString("model.preset", m.preset));
  if (!m.preset.empty()) {
    const std::vector<std::string> names = TrainModelPresetNames();
    if (std::find(names.begin(), names.end(), m.preset) == names.end()) {
      return BadValue("model.preset", QuoteForMessage(m.preset),
                      absl::StrCat("unknown preset; valid presets: ", absl::StrJoin(names, ", "),
                                   " (or omit it and give every dimension of a GPT-2)"));
    }
  }
  RETURN_IF_ERROR(CheckModelDimensions(m));

  // Chunk.
  if (c.chunk.size_elems < 0 || c.chunk.size_elems > kMaxChunkElems) {
    return BadValue("chunk.size", c.chunk.size_elems,
                    absl::StrCat("must be in [1, ", kMaxChunkElems, "] elements, or \"auto\" (0)"));
  }

  // Accelerator.
  const AcceleratorConfig& a = c.accelerator;
  if (a.memory_bytes < 0) {
    return BadValue("accelerator.memory", a.memory_bytes, "must be >= 0 bytes (0: default)");
  }
  if (a.host_memory_bytes < 0) {
    return BadValue("accelerator.host_memory", a.host_memory_bytes,
                    "must be >= 0 bytes (0: unlimited)");
  }
  if (a.copy_bandwidth_bytes_per_s != 0 &&
      !(a.copy_bandwidth_bytes_per_s >= kMinCopyBandwidthBytesPerS &&
        a.copy_bandwidth_bytes_per_s <= kMaxCopyBandwidthBytesPerS)) {
    return BadDouble("accelerator.copy_bandwidth", a.copy_bandwidth_bytes_per_s,
                     "must be 0 (unthrottled) or between 1MB/s and 1PB/s: a slower emulated link "
                     "makes every chunk copy of a step take seconds to years (PCIe moves ~10GB/s)");
  }
  if (!(a.copy_bandwidth_bytes_per_s >= 0) || !std::isfinite(a.copy_bandwidth_bytes_per_s)) {
    return BadDouble("accelerator.copy_bandwidth", a.copy_bandwidth_bytes_per_s,
                     "must be finite and >= 0 bytes/s (0: unthrottled)");
  }
  if (a.device_index < 0 || a.device_index > kMaxDeviceIndex) {
    return BadValue("accelerator.device", a.device_index,
                    absl::StrCat("must be in [0, ", kMaxDeviceIndex, "]"));
  }

  // Data.
  const DataConfig& d = c.data;
  RETURN_IF_ERROR(CheckString("data.train", d.train_path));
  RETURN_IF_ERROR(CheckString("data.val", d.val_path));
  if (d.seq_len < 0) {
    return BadValue("data.seq_len", d.seq_len, "must be >= 0 (0: the model's n_positions)");
  }
  if (d.eval_every < 0) {
    return BadValue("data.eval_every", d.eval_every,
                    "must be >= 0 steps (0: never validate; N: before the first step, every N "
                    "steps and after the last)");
  }
  if (d.eval_batches < 1) return BadValue("data.eval_batches", d.eval_batches, "must be >= 1");

  // Checkpoint and profile.
  const CheckpointConfig& k = c.checkpoint;
  RETURN_IF_ERROR(CheckString("checkpoint.dir", k.dir));
  RETURN_IF_ERROR(CheckString("checkpoint.init_from", k.init_from));
  RETURN_IF_ERROR(CheckString("checkpoint.export", k.export_path));
  RETURN_IF_ERROR(CheckString("checkpoint.export_merged", k.export_merged));
  if (k.every < 0) {
    return BadValue("checkpoint.every", k.every, "must be >= 0 steps (0: only at the end)");
  }
  if (k.keep_last < 1) {
    return BadValue("checkpoint.keep_last", k.keep_last, "must be >= 1 checkpoints");
  }
  RETURN_IF_ERROR(CheckString("profile.trace", c.profile.trace_path));
  RETURN_IF_ERROR(CheckString("profile.metrics", c.profile.metrics_path));

  // ZeRO offload and aio (the disk tier).
  const OffloadOptimizerConfig& oo = c.zero_optimization.offload_optimizer;
  RETURN_IF_ERROR(CheckString("zero_optimization.offload_optimizer.nvme_path", oo.nvme_path));
  if (oo.buffer_count < 1 || oo.buffer_count > kMaxOffloadBufferCount) {
    return BadValue("zero_optimization.offload_optimizer.buffer_count", oo.buffer_count,
                    absl::StrCat("must be in [1, ", kMaxOffloadBufferCount,
                                 "]: the chunk indices whose optimizer state the disk tier reads "
                                 "ahead (DeepSpeed's default: 4)"));
  }
  const OffloadParamConfig& op = c.zero_optimization.offload_param;
  RETURN_IF_ERROR(CheckString("zero_optimization.offload_param.nvme_path", op.nvme_path));
  if (op.buffer_count < 0 || op.buffer_count > kMaxOffloadBufferCount) {
    return BadValue("zero_optimization.offload_param.buffer_count", op.buffer_count,
                    absl::StrCat("must be in [0, ", kMaxOffloadBufferCount,
                                 "]: the frozen param chunks the disk tier reads ahead of the "
                                 "compute (0: none; DeepSpeed's default: 5)"));
  }
  if (op.max_in_cpu < 0 || op.max_in_cpu > kMaxMaxInCpuElems) {
    return BadValue("zero_optimization.offload_param.max_in_cpu", op.max_in_cpu,
                    absl::StrCat("must be in [0, ", kMaxMaxInCpuElems,
                                 "] parameter elements kept in host memory (0 or \"auto\": what "
                                 "the host limit leaves)"));
  }
  const AioConfig& aio = c.aio;
  if (aio.block_size_bytes < kAioAlignmentBytes || aio.block_size_bytes > kMaxAioBlockBytes ||
      aio.block_size_bytes % kAioAlignmentBytes != 0) {
    return BadValue("aio.block_size", aio.block_size_bytes,
                    absl::StrCat("must be a multiple of ", kAioAlignmentBytes,
                                 " bytes (direct I/O's alignment) in [", kAioAlignmentBytes, ", ",
                                 kMaxAioBlockBytes, "]; DeepSpeed's default is 1048576 (1MiB)"));
  }
  if (aio.queue_depth < 1 || aio.queue_depth > kMaxAioQueueDepth) {
    return BadValue("aio.queue_depth", aio.queue_depth,
                    absl::StrCat("must be in [1, ", kMaxAioQueueDepth,
                                 "] requests in flight (DeepSpeed's default: 8)"));
  }
  if (aio.thread_count < 1 || aio.thread_count > kMaxAioThreads) {
    return BadValue(
        "aio.thread_count", aio.thread_count,
        absl::StrCat("must be in [1, ", kMaxAioThreads, "] I/O threads (DeepSpeed's default: 1)"));
  }
  if (c.lora.has_value()) RETURN_IF_ERROR(CheckLoraValues(*c.lora));
  RETURN_IF_ERROR(
      CheckModuleNames("quantization.llm_int8_skip_modules", c.quantization.skip_modules));
  return absl::OkStatus();
}

namespace {

// One tier's nvme_path (`key`, for `device_key` "nvme"): an existing directory this process may
// create files in.
absl::Status CheckSwapDir(absl::string_view device_key, absl::string_view key,
                          const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`", device_key, "` = \"nvme\" needs a directory for the swap files: set ", key,
        " (or pass --nvme_path=DIR), a directory on a local SSD"));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return ErrnoError(err,
                      absl::StrCat("cannot use ", key,
                                   " (--nvme_path), the directory of the disk tier's swap files,"),
                      path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " (--nvme_path) '", path,
                     "' is not a directory; name the directory the swap files go in"));
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    return ErrnoError(err,
                      absl::StrCat("cannot create swap files in ", key,
                                   " (--nvme_path): no write access to the directory"),
                      path);
  }
  return absl::OkStatus();
}

// Whether `a` and `b` name the same directory (the same inode when both exist, else the same
// normalized path).
bool SameDirectory(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool equivalent = std::filesystem::equivalent(a, b, ec);
  if (!ec) return equivalent;
  return std::filesystem::path(a).lexically_normal() == std::filesystem::path(b).lexically_normal();
}

absl::Status CheckOffloadParamAcrossKeys(const TrainConfig& c) {
  const OffloadParamConfig& op = c.zero_optimization.offload_param;
  if (op.device != OffloadDevice::kNvme) return absl::OkStatus();
  if (!c.lora.has_value()) {
    return absl::InvalidArgumentError(
        "`zero_optimization.offload_param.device` = \"nvme\" needs a lora section: only a "
        "frozen base (LoRA/QLoRA: param chunks without gradients or optimizer state) can live on "
        "disk; trained parameters stay in host memory. Add a lora section (or --lora_r and "
        "--lora_target_modules), or use offload_param.device \"cpu\" and put the optimizer "
        "state on disk with zero_optimization.offload_optimizer.device \"nvme\" (--nvme_path)");
  }
  const OffloadOptimizerConfig& oo = c.zero_optimization.offload_optimizer;
  if (oo.device == OffloadDevice::kNvme && !op.nvme_path.empty() && !oo.nvme_path.empty() &&
      !SameDirectory(op.nvme_path, oo.nvme_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`zero_optimization.offload_param.nvme_path` = ", QuoteForMessage(op.nvme_path),
        " and `zero_optimization.offload_optimizer.nvme_path` = ", QuoteForMessage(oo.nvme_path),
        " name different directories: one swap serves both the frozen base and the optimizer "
        "state; give both the same directory (--nvme_path sets both)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckNvmePath(const TrainConfig& c) {
  const OffloadOptimizerConfig& oo = c.zero_optimization.offload_optimizer;
  if (oo.device == OffloadDevice::kNvme) {
    RETURN_IF_ERROR(CheckSwapDir("zero_optimization.offload_optimizer.device",
                                 "zero_optimization.offload_optimizer.nvme_path", oo.nvme_path));
  }
  const OffloadParamConfig& op = c.zero_optimization.offload_param;
  if (op.device == OffloadDevice::kNvme) {
    RETURN_IF_ERROR(CheckSwapDir("zero_optimization.offload_param.device",
                                 "zero_optimization.offload_param.nvme_path", op.nvme_path));
  }
  return absl::OkStatus();
}

absl::Status CheckLoraInitFrom(const TrainConfig& c) {
  if (!c.lora.has_value() || c.lora->init_from.empty()) return absl::OkStatus();
  const std::string& dir = c.lora->init_from;
  constexpr absl::string_view kKey = "lora.init_from (--lora_init_from)";
  constexpr absl::string_view kWhat =
      "PeftModel.save_pretrained writes adapter_config.json and adapter_model.safetensors";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    return ErrnoError(
        err, absl::StrCat("cannot use ", kKey, ", the PEFT adapter directory to continue from,"),
        dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(kKey, " '", dir,
                                                   "' is not a directory: name a PEFT adapter "
                                                   "directory (",
                                                   kWhat, ")"));
  }
  // Whether `name` in the directory is a regular file; the errno's code when it cannot be
  // examined for another reason than its absence.
  const auto has_file = [&dir](absl::string_view name) -> absl::StatusOr<bool> {
    const std::string path = (std::filesystem::path(dir) / std::string(name)).string();
    struct stat fst {};
    if (::stat(path.c_str(), &fst) != 0) {
      const int err = errno;
      if (err == ENOENT) return false;
      return ErrnoError(err, absl::StrCat("cannot examine ", kKey), path);
    }
    return S_ISREG(fst.st_mode);
  };
  ASSIGN_OR_RETURN(const bool config, has_file("adapter_config.json"));
  if (!config) {
    return absl::InvalidArgumentError(absl::StrCat(
        kKey, " '", dir, "' is not a PEFT adapter directory: it has no adapter_config.json (",
        kWhat, ")"));
  }
  ASSIGN_OR_RETURN(const bool weights, has_file("adapter_model.safetensors"));
  if (!weights) {
    ASSIGN_OR_RETURN(const bool pickle, has_file("adapter_model.bin"));
    return absl::InvalidArgumentError(absl::StrCat(
        kKey, " '", dir, "' has no adapter_model.safetensors",
        pickle ? ", only adapter_model.bin (a PyTorch pickle, which is not read): save the "
                 "adapter with save_pretrained(..., safe_serialization=True)"
               : absl::StrCat(" (the adapter's weights; ", kWhat, ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> ResolveModelConfig(const TrainModelConfig& m) {
  RETURN_IF_ERROR(CheckModelDimensions(m));
  GptConfig g;
  if (!m.preset.empty()) {
    if (std::optional<ModelConfig> llama = LlamaFamilyPreset(m.preset); llama.has_value()) {
      ASSIGN_OR_RETURN(const ModelConfig c, ResolveLlamaPreset(m, *std::move(llama)));
      return GptView(c);
    }
    absl::StatusOr<GptConfig> preset = GptPreset(m.preset);
    if (!preset.ok()) {
      return BadValue("model.preset", QuoteForMessage(m.preset),
                      absl::StrCat("unknown preset; valid presets: ", PresetList()));
    }
    g = *std::move(preset);
  } else {
    std::vector<std::string> missing;
    if (m.vocab_size == 0) missing.push_back("model.vocab_size");
    if (m.max_seq_len == 0) missing.push_back("model.n_positions");
    if (m.hidden == 0) missing.push_back("model.n_embd");
    if (m.num_layers == 0) missing.push_back("model.n_layer");
    if (m.num_heads == 0) missing.push_back("model.n_head");
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model is not defined: set model.preset (", PresetList(),
          ") or all five dimensions of a GPT-2; missing: ", absl::StrJoin(missing, ", ")));
    }
    g.name = "custom";
  }
  if (m.vocab_size > 0) g.vocab_size = m.vocab_size;
  if (m.max_seq_len > 0) g.max_seq_len = m.max_seq_len;
  if (m.hidden > 0) g.hidden = m.hidden;
  if (m.num_layers > 0) g.num_layers = m.num_layers;
  if (m.num_heads > 0) g.num_heads = m.num_heads;
  if (g.hidden % g.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`model.n_embd` = ", g.hidden, " is not divisible by `model.n_head` = ", g.num_heads,
        ": each head gets n_embd / n_head dimensions"));
  }
  // The closed form of GptParameterCount, in floating point so it cannot overflow.
  const double h = static_cast<double>(g.hidden);
  const double params =
      (static_cast<double>(g.vocab_size) + static_cast<double>(g.max_seq_len)) * h +
      static_cast<double>(g.num_layers) * (12 * h * h + 13 * h) + 2 * h;
  if (params > kMaxModelParams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model (vocab_size ", g.vocab_size, ", n_positions ", g.max_seq_len, ", n_embd ",
        g.hidden, ", n_layer ", g.num_layers, ") would have ", FormatShortestDouble(params),
        " parameters, more than 2^53; use smaller dimensions"));
  }
  RETURN_IF_ERROR(ValidateGptConfig(g));
  // What ModelConfig adds to GptConfig's checks, named as the config writes it.
  RETURN_IF_ERROR(ValidateModelConfig(FromGptConfig(g)));
  return g;
}

absl::StatusOr<ModelConfig> ResolveTrainModel(const TrainModelConfig& m) {
  RETURN_IF_ERROR(CheckModelDimensions(m));
  if (std::optional<ModelConfig> llama = LlamaFamilyPreset(m.preset); llama.has_value()) {
    return ResolveLlamaPreset(m, *std::move(llama));
  }
  ASSIGN_OR_RETURN(const GptConfig g, ResolveModelConfig(m));
  return FromGptConfig(g);
}

absl::Status ValidateTrainConfig(const TrainConfig& c, std::optional<int> known_world_size) {
  RETURN_IF_ERROR(CheckTrainConfigValues(c));
  if (known_world_size.has_value() && *known_world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be >= 1 ranks, got ", *known_world_size));
  }
  // Not known yet: the bounds below take a world of one (the trainer checks them again).
  const int world_size = known_world_size.value_or(1);
  if (c.steps < 1) {
    return BadValue("train_steps", c.steps,
                    "must be > 0: set train_steps in the config or pass --steps");
  }
  if (c.fp16.enabled && c.bf16) {
    return absl::InvalidArgumentError(
        "`fp16.enabled` and `bf16.enabled` are both true; enable at most one (neither: f32)");
  }
  RETURN_IF_ERROR(CheckQuantizationAcrossKeys(c, known_world_size));
  if (c.train_batch_size > 0 && !known_world_size.has_value()) {
    // Whatever the world size, train_batch_size must be a multiple of micro x accumulation.
    const double per_rank = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                            static_cast<double>(c.gradient_accumulation_steps);
    const double ranks = static_cast<double>(c.train_batch_size) / per_rank;
    if (ranks != std::floor(ranks)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`train_batch_size` = ", c.train_batch_size,
          " is not a multiple of train_micro_batch_size_per_gpu (", c.train_micro_batch_size_per_gpu,
          ") x gradient_accumulation_steps (", c.gradient_accumulation_steps, ") = ",
          FormatShortestDouble(per_rank),
          ", so no world size makes train_batch_size = micro x accumulation x world size; fix one "
          "of them or omit train_batch_size to derive it"));
    }
  } else if (c.train_batch_size > 0) {
    // Both factors are bounded by the checks above only from below; compare in floating point.
    const double derived = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                           static_cast<double>(c.gradient_accumulation_steps) * world_size;
    if (static_cast<double>(c.train_batch_size) != derived) {
      // DeepSpeed's _batch_assertion sentence, then the keys as the user wrote them.
      return absl::InvalidArgumentError(absl::StrCat(
          "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu "
          "* gradient_acc_step * world_size ",
          c.train_batch_size, " != ", c.train_micro_batch_size_per_gpu, " * ",
          c.gradient_accumulation_steps, " * ", world_size,
          ": `train_batch_size` = ", c.train_batch_size,
          " does not equal train_micro_batch_size_per_gpu (", c.train_micro_batch_size_per_gpu,
          ") x gradient_accumulation_steps (", c.gradient_accumulation_steps, ") x world size (",
          world_size, ") = ", FormatShortestDouble(derived),
          "; fix one of them or omit train_batch_size to derive it"));
    }
  }
  // checkpoint.init_from naming a Hugging Face directory: the model is its config.json's (the
  // trainer reads it and checks seq_len and chunk.size against it); the model section is then
  // not checked here.
  std::error_code ec;
  const bool model_from_directory =
      !c.checkpoint.init_from.empty() && std::filesystem::is_directory(c.checkpoint.init_from, ec);
  GptConfig model;
  std::optional<ModelConfig> resolved;
  if (model_from_directory) {
    model.name = c.checkpoint.init_from;
    model.max_seq_len = std::max<int64_t>(c.data.seq_len, 1);
  } else {
    absl::StatusOr<ModelConfig> m = ResolveTrainModel(c.model);
    if (!m.ok() && !c.checkpoint.init_from.empty()) {
      // No directory there: what is wrong with the path comes first when the section leaves the
      // model undefined (a model section makes the trainer read the file and say so itself).
      RETURN_IF_ERROR(ExplainInitFromWithoutModel(c.checkpoint.init_from, m.status()));
    }
    RETURN_IF_ERROR(m.status());
    resolved = *std::move(m);
    model = GptView(*resolved);
    if (!c.checkpoint.init_from.empty() && resolved->architecture() != ModelArchitecture::kGpt2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint.init_from (--init_from) '", c.checkpoint.init_from,
          "' is not a directory, so it would be read as GPT-2 safetensors weights, but "
          "model.preset "
          "\"",
          c.model.preset, "\" is a ", ModelFamilyName(resolved->family),
          " model: give a Hugging Face model directory (config.json + safetensors) to start a ",
          ModelFamilyName(resolved->family), " model from, or no --init_from for a random init"));
    }
  }
  // Bounds that keep the trainer's batch and token arithmetic far from int64 overflow.
  const double global_batch = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                              static_cast<double>(c.gradient_accumulation_steps) * world_size;
  const double micro_tokens = static_cast<double>(c.train_micro_batch_size_per_gpu) *
                              static_cast<double>(ResolveSeqLen(c, model));
  if (global_batch > kMaxBatchElems || micro_tokens > kMaxBatchElems) {
    return BadValue(
        "train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu,
        absl::StrCat("with world size ", world_size, " and seq_len ", ResolveSeqLen(c, model),
                     " this is ", FormatShortestDouble(global_batch), " sequences, ",
                     FormatShortestDouble(micro_tokens),
                     " tokens per micro batch; both must be at most 2^40"));
  }
  if (c.data.seq_len > model.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("`data.seq_len` = ", c.data.seq_len, " exceeds the model's n_positions (",
                     model.max_seq_len, ", model ", model.name, "); use at most ",
                     model.max_seq_len, ", or 0 for n_positions"));
  }
  if (c.chunk.size_elems > 0 && resolved.has_value()) {
    // The vocabulary matrices are split into row blocks sized to the chunk (model/gpt_config.h):
    // the chunk must hold the largest other operator and one LM-head vocabulary tile of rows.
    const int64_t min_elems = ModelMinChunkElems(*resolved, kDefaultVocabTileRows);
    if (min_elems > c.chunk.size_elems) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`chunk.size` = ", c.chunk.size_elems, " elements is below the smallest chunk of model ",
          model.name, " (", min_elems,
          " elements: its largest operator, or one vocabulary tile of ", kDefaultVocabTileRows,
          " wte rows); use chunk.size >= ", min_elems, " or \"auto\""));
    }
  }
  if (absl::StatusOr<LrSchedule> schedule = LrSchedule::Create(MakeLrScheduleOptions(c));
      !schedule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler ", SchedulerTypeName(c.scheduler.type), ": ", schedule.status().message()));
  }
  RETURN_IF_ERROR(MakeLossScaler(c).status());
  if (c.checkpoint.every > 0 && c.checkpoint.dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("`checkpoint.every` = ", c.checkpoint.every,
                     " needs a checkpoint directory: set checkpoint.dir (or --save_dir)"));
  }
  if (c.checkpoint.resume && c.checkpoint.dir.empty()) {
    return absl::InvalidArgumentError(
        "`checkpoint.resume` = true needs checkpoint.dir (or --save_dir) to resume from");
  }
  // The accelerator holds chunks whole (their blocks are chunk.size f32 elements).
  if (c.accelerator.memory_bytes > 0 && c.chunk.size_elems > 0 &&
      static_cast<double>(c.chunk.size_elems) * 4 >
          static_cast<double>(c.accelerator.memory_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`accelerator.memory` = ", c.accelerator.memory_bytes,
                     " bytes cannot hold one chunk of `chunk.size` = ", c.chunk.size_elems,
                     " elements (", c.chunk.size_elems * 4,
                     " bytes: chunks move whole, in f32-sized blocks); raise accelerator.memory "
                     "(--accelerator_memory) or lower chunk.size (--chunk_size)"));
  }
  if (c.accelerator.kind == AcceleratorKind::kCuda &&
      c.accelerator.copy_bandwidth_bytes_per_s > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`accelerator.copy_bandwidth` = ",
        FormatShortestDouble(c.accelerator.copy_bandwidth_bytes_per_s),
        " bytes/s emulates a link and applies only to backend \"cpu\"; remove it (or set 0) for "
        "\"cuda\""));
  }
  // LoRA's outputs: the merged model needs adapters to merge, and the two exports are different
  // directories (the adapter, the merged model).
  const CheckpointConfig& k = c.checkpoint;
  if (!k.export_merged.empty() && !c.lora.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`checkpoint.export_merged` = ", QuoteForMessage(k.export_merged),
        " (--export_merged) writes a LoRA run's base model with its adapters merged in, but the "
        "config has no lora section, so there are no adapters to merge: add a lora section (or "
        "--lora_r and --lora_target_modules), or use checkpoint.export to export the trained "
        "model"));
  }
  if (!k.export_merged.empty() && k.export_merged == k.export_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`checkpoint.export` and `checkpoint.export_merged` both name ",
        QuoteForMessage(k.export_path),
        ": with a lora section, export writes the PEFT adapter directory and export_merged the "
        "merged Hugging Face model directory; give them different paths"));
  }
  RETURN_IF_ERROR(CheckOffloadParamAcrossKeys(c));
  RETURN_IF_ERROR(CheckNvmePath(c));
  RETURN_IF_ERROR(CheckLoraInitFrom(c));
  return absl::OkStatus();
}

absl::Status CheckNcclComm(const TrainConfig& config, bool nccl_compiled_in,
                           const std::function<absl::Status()>& probe_gpu) {
  const bool cuda = config.accelerator.kind == AcceleratorKind::kCuda;
  if (!nccl_compiled_in) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--comm=nccl: this binary was built without CUDA, so it has no NCCL; rebuild with "
        "--config=cuda (bazel build --config=cuda //trainer:train)",
        cuda ? "" : " and set accelerator.backend to \"cuda\" (--accelerator=cuda)",
        ", or use --comm=mpi"));
  }
  if (!cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--comm=nccl needs accelerator.backend \"cuda\" (--accelerator=cuda), got \"",
        AcceleratorKindName(config.accelerator.kind),
        "\": NCCL moves accelerator buffers; the emulated accelerator's memory is host memory, "
        "which --comm=mpi handles"));
  }
  if (absl::Status gpu = probe_gpu(); !gpu.ok()) {
    return absl::Status(gpu.code(),
                        absl::StrCat("--comm=nccl: accelerator.backend \"cuda\": ", gpu.message()));
  }
  return absl::OkStatus();
}

}  // namespace ps
