#include "trainer/config_parse.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "glog/logging.h"
#include "trainer/config_schema.h"
#include "trainer/config_validate.h"
#include "trainer/json_reader.h"

namespace ps {
namespace {

absl::Status ReadOptimizer(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* opt, r.GetSection(top, ConfigSchema().optimizer, "optimizer"));
  if (opt == nullptr) return absl::OkStatus();
  // optimizer.overlap (docs/pipeline.md): Adam inside backward, bit-identical either way.
  RETURN_IF_ERROR(r.GetBool(*opt, "optimizer", "overlap", &c->optimizer.overlap));
  const Json* type = JsonReader::Find(*opt, "type");
  // A section with only `overlap` keeps the default optimizer.
  if (type == nullptr && opt->is_object() && opt->size() == 1 &&
      JsonReader::Find(*opt, "overlap") != nullptr) {
    return absl::OkStatus();
  }
  if (type == nullptr) {
    return r.Error(
        "`optimizer.type` is required when an optimizer section is given: \"Adam\" or "
        "\"AdamW\"");
  }
  if (!type->is_string()) return r.TypeError("optimizer.type", "a string", *type);
  absl::StatusOr<OptimizerType> parsed = ParseOptimizerType(type->get_ref<const std::string&>());
  if (!parsed.ok()) return r.ValueError("optimizer.type", *type, parsed.status().message());
  c->optimizer.type = *parsed;

  ASSIGN_OR_RETURN(const Json* params,
                   r.GetSection(*opt, ConfigSchema().optimizer_params, "params"));
  if (params == nullptr) return absl::OkStatus();
  constexpr absl::string_view p = "optimizer.params";
  RETURN_IF_ERROR(r.GetDouble(*params, p, "lr", &c->optimizer.lr));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "eps", &c->optimizer.eps));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "weight_decay", &c->optimizer.weight_decay));
  if (const Json* betas = JsonReader::Find(*params, "betas"); betas != nullptr) {
    if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
        !(*betas)[1].is_number()) {
      return r.TypeError("optimizer.params.betas", "an array of two numbers [beta1, beta2]",
                         *betas);
    }
    c->optimizer.beta1 = (*betas)[0].get<double>();
    c->optimizer.beta2 = (*betas)[1].get<double>();
  }
  if (const Json* mode = JsonReader::Find(*params, "adam_w_mode"); mode != nullptr) {
    bool adam_w_mode = false;
    RETURN_IF_ERROR(r.GetBool(*params, p, "adam_w_mode", &adam_w_mode));
    if (c->optimizer.type == OptimizerType::kAdamW && !adam_w_mode) {
      return r.ValueError("optimizer.params.adam_w_mode", *mode,
                          "contradicts optimizer.type \"AdamW\"; use type \"Adam\" for L2 weight "
                          "decay");
    }
    if (adam_w_mode) c->optimizer.type = OptimizerType::kAdamW;
  }
  if (const Json* amsgrad = JsonReader::Find(*params, "amsgrad"); amsgrad != nullptr) {
    bool value = false;
    RETURN_IF_ERROR(r.GetBool(*params, p, "amsgrad", &value));
    if (value)
      return r.ValueError("optimizer.params.amsgrad", *amsgrad, "not supported; use false");
  }
  if (const Json* bc = JsonReader::Find(*params, "bias_correction"); bc != nullptr) {
    bool value = true;
    RETURN_IF_ERROR(r.GetBool(*params, p, "bias_correction", &value));
    if (!value) {
      return r.ValueError("optimizer.params.bias_correction", *bc,
                          "not supported; bias correction is always applied (use true)");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadScheduler(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* sched, r.GetSection(top, ConfigSchema().scheduler, "scheduler"));
  if (sched == nullptr) return absl::OkStatus();
  const Json* type = JsonReader::Find(*sched, "type");
  if (type == nullptr) {
    return r.Error(
        "`scheduler.type` is required when a scheduler section is given: \"WarmupLR\", "
        "\"WarmupDecayLR\" or \"WarmupCosineLR\" (omit the section for a constant learning rate)");
  }
  if (!type->is_string()) return r.TypeError("scheduler.type", "a string", *type);
  absl::StatusOr<SchedulerType> parsed = ParseSchedulerType(type->get_ref<const std::string&>());
  if (!parsed.ok()) return r.ValueError("scheduler.type", *type, parsed.status().message());
  SchedulerConfig& s = c->scheduler;
  s.type = *parsed;

  ASSIGN_OR_RETURN(const Json* params,
                   r.GetSection(*sched, ConfigSchema().scheduler_params, "params"));
  if (params == nullptr) return absl::OkStatus();
  for (auto it = params->begin(); it != params->end(); ++it) {
    if (!SchedulerParamApplies(s.type, it.key())) {
      return r.Error(
          absl::StrCat("`scheduler.params.", it.key(), "` does not apply to scheduler type ",
                       SchedulerTypeName(s.type),
                       ", which takes: ", absl::StrJoin(SchedulerParamsOf(s.type), ", ")));
    }
  }
  constexpr absl::string_view p = "scheduler.params";
  RETURN_IF_ERROR(r.GetDouble(*params, p, "warmup_min_lr", &s.warmup_min_lr));
  if (const Json* v = JsonReader::Find(*params, "warmup_max_lr"); v != nullptr) {
    RETURN_IF_ERROR(r.GetDouble(*params, p, "warmup_max_lr", &s.warmup_max_lr));
    if (!(s.warmup_max_lr >= 0)) {
      return r.ValueError("scheduler.params.warmup_max_lr", *v,
                          "must be >= 0 (omit it to use optimizer.params.lr)");
    }
  }
  RETURN_IF_ERROR(r.GetInt(*params, p, "warmup_num_steps", &s.warmup_num_steps));
  if (const Json* v = JsonReader::Find(*params, "warmup_type"); v != nullptr) {
    RETURN_IF_ERROR(r.GetString(*params, p, "warmup_type", &s.warmup_type));
    s.warmup_type = absl::AsciiStrToLower(s.warmup_type);
    if (s.warmup_type != "log" && s.warmup_type != "linear") {
      return r.ValueError("scheduler.params.warmup_type", *v, "use \"log\" or \"linear\"");
    }
  }
  RETURN_IF_ERROR(r.GetInt(*params, p, "total_num_steps", &s.total_num_steps));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "warmup_min_ratio", &s.warmup_min_ratio));
  RETURN_IF_ERROR(r.GetDouble(*params, p, "cos_min_ratio", &s.cos_min_ratio));
  if (const Json* v = JsonReader::Find(*params, "last_batch_iteration"); v != nullptr) {
    int64_t last = -1;
    RETURN_IF_ERROR(r.GetInt(*params, p, "last_batch_iteration", &last));
    if (last != -1) {
      return r.ValueError("scheduler.params.last_batch_iteration", *v,
                          "only -1 (a fresh start) is accepted; to continue a run, resume from "
                          "its checkpoint (checkpoint.resume), which restores the schedule");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadPrecision(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* fp16, r.GetSection(top, ConfigSchema().fp16, "fp16"));
  if (fp16 != nullptr) {
    Fp16Config& f = c->fp16;
    RETURN_IF_ERROR(r.GetBool(*fp16, "fp16", "enabled", &f.enabled));
    RETURN_IF_ERROR(r.GetDouble(*fp16, "fp16", "loss_scale", &f.loss_scale));
    RETURN_IF_ERROR(r.GetInt(*fp16, "fp16", "initial_scale_power", &f.initial_scale_power));
    RETURN_IF_ERROR(r.GetInt(*fp16, "fp16", "loss_scale_window", &f.loss_scale_window));
    RETURN_IF_ERROR(r.GetInt(*fp16, "fp16", "hysteresis", &f.hysteresis));
    RETURN_IF_ERROR(r.GetBool(*fp16, "fp16", "consecutive_hysteresis", &f.consecutive_hysteresis));
    RETURN_IF_ERROR(r.GetDouble(*fp16, "fp16", "min_loss_scale", &f.min_loss_scale));
    RETURN_IF_ERROR(
        r.GetInt(*fp16, "fp16", "max_consecutive_skipped_steps", &f.max_consecutive_skipped_steps));
  }
  ASSIGN_OR_RETURN(const Json* bf16, r.GetSection(top, ConfigSchema().bf16, "bf16"));
  if (bf16 != nullptr) RETURN_IF_ERROR(r.GetBool(*bf16, "bf16", "enabled", &c->bf16));
  return absl::OkStatus();
}

absl::Status ReadModel(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* model, r.GetSection(top, ConfigSchema().model, "model"));
  if (model == nullptr) return absl::OkStatus();
  TrainModelConfig& m = c->model;
  RETURN_IF_ERROR(r.GetString(*model, "model", "preset", &m.preset));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "vocab_size", &m.vocab_size));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_positions", &m.max_seq_len));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_embd", &m.hidden));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_layer", &m.num_layers));
  RETURN_IF_ERROR(r.GetInt(*model, "model", "n_head", &m.num_heads));
  RETURN_IF_ERROR(
      r.GetBool(*model, "model", "activation_checkpointing", &m.activation_checkpointing));
  return absl::OkStatus();
}

absl::Status ReadChunk(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* chunk, r.GetSection(top, ConfigSchema().chunk, "chunk"));
  if (chunk == nullptr) return absl::OkStatus();
  const Json* size = JsonReader::Find(*chunk, "size");
  if (size == nullptr) return absl::OkStatus();
  if (size->is_string()) {
    if (!absl::EqualsIgnoreCase(size->get_ref<const std::string&>(), "auto")) {
      return r.ValueError("chunk.size", *size,
                          "use \"auto\" (chunk-size search) or an integer number of elements "
                          "(not bytes)");
    }
    c->chunk.size_elems = 0;
    return absl::OkStatus();
  }
  if (!size->is_number()) {
    return r.TypeError("chunk.size", "an integer number of elements or \"auto\"", *size);
  }
  ASSIGN_OR_RETURN(c->chunk.size_elems, r.ToInt64(*size, "chunk.size", 1, kMaxChunkElems));
  return absl::OkStatus();
}

absl::Status ReadAccelerator(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* acc, r.GetSection(top, ConfigSchema().accelerator, "accelerator"));
  if (acc == nullptr) return absl::OkStatus();
  AcceleratorConfig& a = c->accelerator;
  if (const Json* backend = JsonReader::Find(*acc, "backend"); backend != nullptr) {
    if (!backend->is_string()) return r.TypeError("accelerator.backend", "a string", *backend);
    absl::StatusOr<AcceleratorKind> kind =
        ParseAcceleratorKind(backend->get_ref<const std::string&>());
    if (!kind.ok()) return r.ValueError("accelerator.backend", *backend, kind.status().message());
    a.kind = *kind;
  }
  RETURN_IF_ERROR(r.GetBytes(*acc, "accelerator", "memory", &a.memory_bytes));
  RETURN_IF_ERROR(r.GetBytes(*acc, "accelerator", "host_memory", &a.host_memory_bytes));
  if (const Json* bw = JsonReader::Find(*acc, "copy_bandwidth"); bw != nullptr) {
    if (bw->is_string()) {
      absl::StatusOr<double> parsed = ParseBandwidth(bw->get_ref<const std::string&>());
      if (!parsed.ok()) {
        return r.ValueError("accelerator.copy_bandwidth", *bw,
                            absl::StrCat(parsed.status().message(),
                                         "; write e.g. \"12GB/s\" or a number of bytes per "
                                         "second (0: unthrottled)"));
      }
      a.copy_bandwidth_bytes_per_s = *parsed;
    } else if (bw->is_number()) {
      a.copy_bandwidth_bytes_per_s = bw->get<double>();
    } else {
      return r.TypeError("accelerator.copy_bandwidth",
                         "a bandwidth (a string like \"12GB/s\" or a number of bytes per second)",
                         *bw);
    }
  }
  RETURN_IF_ERROR(r.GetInt(*acc, "accelerator", "device", &a.device_index));
  return absl::OkStatus();
}

absl::Status ReadData(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* data, r.GetSection(top, ConfigSchema().data, "data"));
  if (data == nullptr) return absl::OkStatus();
  DataConfig& d = c->data;
  RETURN_IF_ERROR(r.GetString(*data, "data", "train", &d.train_path));
  RETURN_IF_ERROR(r.GetString(*data, "data", "val", &d.val_path));
  RETURN_IF_ERROR(r.GetInt(*data, "data", "seq_len", &d.seq_len));
  RETURN_IF_ERROR(r.GetBool(*data, "data", "shuffle", &d.shuffle));
  RETURN_IF_ERROR(r.GetBool(*data, "data", "packing", &d.packing));
  RETURN_IF_ERROR(r.GetUint64(*data, "data", "seed", &d.seed));
  RETURN_IF_ERROR(r.GetInt(*data, "data", "eval_every", &d.eval_every));
  RETURN_IF_ERROR(r.GetInt(*data, "data", "eval_batches", &d.eval_batches));
  return absl::OkStatus();
}

absl::Status ReadCheckpoint(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* ckpt, r.GetSection(top, ConfigSchema().checkpoint, "checkpoint"));
  if (ckpt == nullptr) return absl::OkStatus();
  CheckpointConfig& k = c->checkpoint;
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "dir", &k.dir));
  RETURN_IF_ERROR(r.GetInt(*ckpt, "checkpoint", "every", &k.every));
  RETURN_IF_ERROR(r.GetInt(*ckpt, "checkpoint", "keep_last", &k.keep_last));
  RETURN_IF_ERROR(r.GetBool(*ckpt, "checkpoint", "resume", &k.resume));
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "init_from", &k.init_from));
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "export", &k.export_path));
  RETURN_IF_ERROR(r.GetString(*ckpt, "checkpoint", "export_merged", &k.export_merged));
  return absl::OkStatus();
}

absl::Status ReadProfile(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* prof, r.GetSection(top, ConfigSchema().profile, "profile"));
  if (prof == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(r.GetString(*prof, "profile", "trace", &c->profile.trace_path));
  RETURN_IF_ERROR(r.GetString(*prof, "profile", "metrics", &c->profile.metrics_path));
  return absl::OkStatus();
}

// An offload section's "device" into `device` when present.
absl::Status ReadOffloadDevice(const JsonReader& r, const Json& section, absl::string_view path,
                               OffloadDevice* device) {
  const Json* v = JsonReader::Find(section, "device");
  if (v == nullptr) return absl::OkStatus();
  const std::string key = JsonReader::JoinKeyPath(path, "device");
  if (!v->is_string()) return r.TypeError(key, "a string", *v);
  absl::StatusOr<OffloadDevice> parsed = ParseOffloadDevice(v->get_ref<const std::string&>());
  if (!parsed.ok()) return r.ValueError(key, *v, parsed.status().message());
  *device = *parsed;
  return absl::OkStatus();
}

// Whether `obj` has a key `section` lists as ignored (CheckKeys warned about it).
bool HasIgnoredKey(const Json& obj, const JsonSection& section) {
  for (const JsonIgnoredKey& k : section.ignored) {
    if (JsonReader::Find(obj, k.key) != nullptr) return true;
  }
  return false;
}

// zero_optimization.offload_param.max_in_cpu: parameter elements (an integer >= 0, DeepSpeed
// writes 1e9) or "auto" (0).
absl::Status ReadMaxInCpu(const JsonReader& r, const Json& param, int64_t* out) {
  constexpr absl::string_view kKey = "zero_optimization.offload_param.max_in_cpu";
  const Json* v = JsonReader::Find(param, "max_in_cpu");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    if (!absl::EqualsIgnoreCase(v->get_ref<const std::string&>(), "auto")) {
      return r.ValueError(kKey, *v,
                          "use \"auto\" (what the host limit leaves) or an integer number of "
                          "parameter elements (not bytes)");
    }
    *out = 0;
    return absl::OkStatus();
  }
  if (!v->is_number()) {
    return r.TypeError(kKey, "an integer number of parameter elements or \"auto\"", *v);
  }
  ASSIGN_OR_RETURN(*out, r.ToInt64(*v, kKey, 0, kMaxMaxInCpuElems));
  return absl::OkStatus();
}

// zero_optimization: the offload sections are read; every other key is ignored with a warning
// naming it and the reason (as the whole section was before the disk tier), except a close
// misspelling of an offload section, which is an error suggesting it. Any key ignored at any depth
// reports "zero_optimization" once in `ignored_keys`.
absl::Status ReadZeroOptimization(const JsonReader& r, const Json& top, TrainConfig* c,
                                  std::vector<std::string>* ignored_keys) {
  const TrainConfigSchema& schema = ConfigSchema();
  const Json* zero = JsonReader::Find(top, "zero_optimization");
  if (zero == nullptr) return absl::OkStatus();
  if (!zero->is_object()) return r.TypeError("zero_optimization", "an object", *zero);
  // The nested sections' ignored keys are reported here, under the section's name.
  const JsonReader quiet(r.source());
  bool ignored = false;
  for (auto it = zero->begin(); it != zero->end(); ++it) {
    const std::string& key = it.key();
    if (key == "offload_optimizer" || key == "offload_param") continue;
    const std::string suggestion = SuggestKey(key, schema.zero_optimization);
    if (suggestion == "offload_optimizer" || suggestion == "offload_param") {
      return r.Error(absl::StrCat("unknown key `zero_optimization.", key, "`; did you mean `",
                                  suggestion,
                                  "`? (zero_optimization reads offload_optimizer and "
                                  "offload_param; its other keys are ignored)"));
    }
    LOG(WARNING) << r.source() << ": ignoring key `zero_optimization." << key
                 << "`: " << ZeroOptimizationIgnoredReason(key);
    ignored = true;
  }

  // DeepSpeed takes null for an absent offload section (its default, no offload).
  const auto present = [&](absl::string_view key) {
    const Json* v = JsonReader::Find(*zero, key);
    return v != nullptr && !v->is_null();
  };
  const Json* opt = nullptr;
  if (present("offload_optimizer")) {
    ASSIGN_OR_RETURN(opt, quiet.GetSection(*zero, schema.offload_optimizer, "offload_optimizer"));
  }
  if (opt != nullptr) {
    constexpr absl::string_view p = "zero_optimization.offload_optimizer";
    OffloadOptimizerConfig& o = c->zero_optimization.offload_optimizer;
    ignored |= HasIgnoredKey(*opt, schema.offload_optimizer);
    RETURN_IF_ERROR(ReadOffloadDevice(r, *opt, p, &o.device));
    RETURN_IF_ERROR(r.GetString(*opt, p, "nvme_path", &o.nvme_path));
    RETURN_IF_ERROR(r.GetInt(*opt, p, "buffer_count", &o.buffer_count));
    RETURN_IF_ERROR(r.GetBytes(*opt, p, "host_budget", &o.host_budget_bytes));
    RETURN_IF_ERROR(r.GetBool(*opt, p, "pin_memory", &o.pin_memory));
    if (o.device != OffloadDevice::kNvme) {
      // Kept (the config round-trips), but they do nothing without the disk tier: said when set
      // to anything but the default (the canonical JSON writes the defaults).
      const OffloadOptimizerConfig defaults;
      for (absl::string_view key : {"nvme_path", "buffer_count"}) {
        if (key == "nvme_path" ? o.nvme_path == defaults.nvme_path
                               : o.buffer_count == defaults.buffer_count) {
          continue;
        }
        LOG(WARNING) << r.source() << ": `" << p << "." << key << "` applies only to device "
                     << "\"nvme\" (the disk tier); with \"" << OffloadDeviceName(o.device)
                     << "\" the optimizer state stays in host memory and it is not used";
      }
    }
  }

  const Json* param = nullptr;
  if (present("offload_param")) {
    ASSIGN_OR_RETURN(param, quiet.GetSection(*zero, schema.offload_param, "offload_param"));
  }
  if (param != nullptr) {
    constexpr absl::string_view p = "zero_optimization.offload_param";
    OffloadParamConfig& o = c->zero_optimization.offload_param;
    ignored |= HasIgnoredKey(*param, schema.offload_param);
    RETURN_IF_ERROR(ReadOffloadDevice(r, *param, p, &o.device));
    RETURN_IF_ERROR(r.GetString(*param, p, "nvme_path", &o.nvme_path));
    RETURN_IF_ERROR(r.GetInt(*param, p, "buffer_count", &o.buffer_count));
    RETURN_IF_ERROR(ReadMaxInCpu(r, *param, &o.max_in_cpu));
    RETURN_IF_ERROR(r.GetBool(*param, p, "pin_memory", &o.pin_memory));
    if (o.device != OffloadDevice::kNvme) {
      const OffloadParamConfig defaults;
      for (absl::string_view key : {"nvme_path", "buffer_count", "max_in_cpu"}) {
        const bool same = key == "nvme_path"      ? o.nvme_path == defaults.nvme_path
                          : key == "buffer_count" ? o.buffer_count == defaults.buffer_count
                                                  : o.max_in_cpu == defaults.max_in_cpu;
        if (same) continue;
        LOG(WARNING) << r.source() << ": `" << p << "." << key << "` applies only to device "
                     << "\"nvme\" (a frozen base on disk); with \"" << OffloadDeviceName(o.device)
                     << "\" the parameter chunks stay in host memory and it is not used";
      }
    }
  }
  if (ignored && ignored_keys != nullptr) ignored_keys->push_back("zero_optimization");
  return absl::OkStatus();
}

absl::Status ReadAio(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* aio, r.GetSection(top, ConfigSchema().aio, "aio"));
  if (aio == nullptr) return absl::OkStatus();
  AioConfig& a = c->aio;
  RETURN_IF_ERROR(r.GetBytes(*aio, "aio", "block_size", &a.block_size_bytes));
  RETURN_IF_ERROR(r.GetInt(*aio, "aio", "queue_depth", &a.queue_depth));
  RETURN_IF_ERROR(r.GetInt(*aio, "aio", "thread_count", &a.thread_count));
  RETURN_IF_ERROR(r.GetBool(*aio, "aio", "single_submit", &a.single_submit));
  RETURN_IF_ERROR(r.GetBool(*aio, "aio", "overlap_events", &a.overlap_events));
  return absl::OkStatus();
}

// A list of module names at `path` (`v` an array): each element a string. The values themselves
// (non-empty, each once, "all-linear" only alone) are CheckTrainConfigValues's.
absl::Status ReadModuleNames(const JsonReader& r, const Json& v, absl::string_view path,
                             std::vector<std::string>* out) {
  std::vector<std::string> names;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      return r.TypeError(absl::StrCat(path, "[", i, "]"), "a string (a module name)", v[i]);
    }
    names.push_back(v[i].get<std::string>());
  }
  *out = std::move(names);
  return absl::OkStatus();
}

// lora: PEFT LoraConfig's keys; r and target_modules are required.
absl::Status ReadLora(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* lora, r.GetSection(top, ConfigSchema().lora, "lora"));
  if (lora == nullptr) return absl::OkStatus();
  LoraSettings l;
  if (JsonReader::Find(*lora, "r") == nullptr) {
    return r.Error(
        "`lora.r` is required in a lora section: the adapters' rank, e.g. 8 or 16 (or pass "
        "--lora_r)");
  }
  RETURN_IF_ERROR(r.GetInt(*lora, "lora", "r", &l.r));
  RETURN_IF_ERROR(r.GetDouble(*lora, "lora", "lora_alpha", &l.lora_alpha));
  RETURN_IF_ERROR(r.GetDouble(*lora, "lora", "lora_dropout", &l.lora_dropout));
  const Json* targets = JsonReader::Find(*lora, "target_modules");
  if (targets == nullptr) {
    return r.Error(
        "`lora.target_modules` is required in a lora section: the modules to adapt, e.g. "
        "[\"q_proj\", \"v_proj\"] (GPT-2: [\"c_attn\"]), or \"all-linear\"");
  }
  if (targets->is_string()) {
    if (!absl::EqualsIgnoreCase(targets->get_ref<const std::string&>(), kLoraAllLinear)) {
      return r.ValueError(
          "lora.target_modules", *targets,
          "a string other than \"all-linear\" is a regular expression over module names in "
          "PEFT, which is not supported; list the module names, e.g. [\"q_proj\", \"v_proj\"]");
    }
    l.target_modules = {std::string(kLoraAllLinear)};
  } else if (targets->is_array()) {
    RETURN_IF_ERROR(ReadModuleNames(r, *targets, "lora.target_modules", &l.target_modules));
    // PEFT reads a list entry as a module name: the shorthand in a list would adapt nothing.
    for (size_t i = 0; i < l.target_modules.size(); ++i) {
      if (absl::EqualsIgnoreCase(l.target_modules[i], kLoraAllLinear)) {
        return r.ValueError(absl::StrCat("lora.target_modules[", i, "]"), (*targets)[i],
                            "\"all-linear\" stands alone: write target_modules: \"all-linear\" "
                            "(a string, as PEFT does), not inside a list of module names");
      }
    }
  } else {
    return r.TypeError("lora.target_modules", "a list of module names or the string \"all-linear\"",
                       *targets);
  }
  RETURN_IF_ERROR(r.GetString(*lora, "lora", "bias", &l.bias));
  // PEFT writes null for no modules_to_save.
  if (const Json* save = JsonReader::Find(*lora, "modules_to_save");
      save != nullptr && !save->is_null()) {
    if (!save->is_array()) {
      return r.TypeError("lora.modules_to_save", "a list of module names (or null)", *save);
    }
    RETURN_IF_ERROR(ReadModuleNames(r, *save, "lora.modules_to_save", &l.modules_to_save));
  }
  RETURN_IF_ERROR(r.GetString(*lora, "lora", "init_from", &l.init_from));
  c->lora = std::move(l);
  return absl::OkStatus();
}

// quantization: BitsAndBytesConfig's keys; and the three transformers writes beside them, each
// accepted only with the value that means this section.
absl::Status ReadQuantization(const JsonReader& r, const Json& top, TrainConfig* c) {
  ASSIGN_OR_RETURN(const Json* q,
                   r.GetSection(top, ConfigSchema().quantization, "quantization"));
  if (q == nullptr) return absl::OkStatus();
  QuantizationSettings s;
  // BitsAndBytesConfig.to_dict() writes each flag twice (load_in_4bit and its attribute
  // _load_in_4bit): read either, and refuse two that disagree, as model/quant4_import.cc does.
  const auto flag = [&](absl::string_view key, std::optional<bool>* out) -> absl::Status {
    const std::string attr = absl::StrCat("_", key);
    std::optional<bool> a, b;
    if (JsonReader::Find(*q, key) != nullptr) {
      a = false;
      RETURN_IF_ERROR(r.GetBool(*q, "quantization", key, &*a));
    }
    if (JsonReader::Find(*q, attr) != nullptr) {
      b = false;
      RETURN_IF_ERROR(r.GetBool(*q, "quantization", attr, &*b));
    }
    if (a.has_value() && b.has_value() && *a != *b) {
      return r.Error(absl::StrCat("`quantization.", key, "` = ", *a ? "true" : "false",
                                  " but `quantization.", attr, "` = ", *b ? "true" : "false",
                                  ": BitsAndBytesConfig.to_dict() writes both from one setting; "
                                  "make them agree (or drop ",
                                  attr, ")"));
    }
    *out = a.has_value() ? a : b;
    return absl::OkStatus();
  };
  std::optional<bool> eight_bit, four_bit;
  RETURN_IF_ERROR(flag("load_in_8bit", &eight_bit));
  RETURN_IF_ERROR(flag("load_in_4bit", &four_bit));
  // The 8-bit settings are ignored (the schema says why); their types are checked.
  for (absl::string_view key : {"llm_int8_has_fp16_weight", "llm_int8_enable_fp32_cpu_offload"}) {
    bool unused = false;
    RETURN_IF_ERROR(r.GetBool(*q, "quantization", key, &unused));
  }
  if (const Json* t = JsonReader::Find(*q, "llm_int8_threshold"); t != nullptr) {
    double unused = 0;
    RETURN_IF_ERROR(r.GetDouble(*q, "quantization", "llm_int8_threshold", &unused));
  }
  if (eight_bit.value_or(false)) {
    return absl::UnimplementedError(absl::StrCat(
        r.source(), ": `quantization.load_in_8bit` = true: 8-bit bases (LLM.int8()) are not "
                    "implemented; use load_in_4bit: true (QLoRA's 4-bit base) or remove the key"));
  }
  if (const Json* v = JsonReader::Find(*q, "quant_method"); v != nullptr) {
    std::string method;
    RETURN_IF_ERROR(r.GetString(*q, "quantization", "quant_method", &method));
    if (method != "bitsandbytes") {
      return r.ValueError("quantization.quant_method", *v,
                          "only \"bitsandbytes\" (the 4-bit formats of bitsandbytes) is supported");
    }
  }
  if (const Json* v = JsonReader::Find(*q, "bnb_4bit_quant_storage"); v != nullptr) {
    std::string storage;
    RETURN_IF_ERROR(r.GetString(*q, "quantization", "bnb_4bit_quant_storage", &storage));
    if (storage != "uint8") {
      return r.ValueError("quantization.bnb_4bit_quant_storage", *v,
                          "only \"uint8\" (two codes per byte, bitsandbytes' default) is "
                          "supported; remove the key or write \"uint8\"");
    }
  }
  s.load_in_4bit = four_bit.value_or(false);
  if (const Json* v = JsonReader::Find(*q, "bnb_4bit_quant_type"); v != nullptr) {
    std::string name;
    RETURN_IF_ERROR(r.GetString(*q, "quantization", "bnb_4bit_quant_type", &name));
    absl::StatusOr<Quant4Type> type = ParseBnbQuantType(name);
    if (!type.ok()) {
      return r.ValueError("quantization.bnb_4bit_quant_type", *v, type.status().message());
    }
    s.quant_type = *type;
  }
  RETURN_IF_ERROR(
      r.GetBool(*q, "quantization", "bnb_4bit_use_double_quant", &s.double_quant));
  if (const Json* v = JsonReader::Find(*q, "bnb_4bit_compute_dtype"); v != nullptr) {
    std::string name;
    RETURN_IF_ERROR(r.GetString(*q, "quantization", "bnb_4bit_compute_dtype", &name));
    absl::StatusOr<DType> dtype = ParseTorchDType(name);
    if (!dtype.ok()) {
      return r.ValueError("quantization.bnb_4bit_compute_dtype", *v, dtype.status().message());
    }
    s.compute_dtype = *dtype;
  }
  // transformers writes null for none.
  if (const Json* skip = JsonReader::Find(*q, "llm_int8_skip_modules");
      skip != nullptr && !skip->is_null()) {
    if (!skip->is_array()) {
      return r.TypeError("quantization.llm_int8_skip_modules", "a list of module names (or null)",
                         *skip);
    }
    RETURN_IF_ERROR(
        ReadModuleNames(r, *skip, "quantization.llm_int8_skip_modules", &s.skip_modules));
  }
  c->quantization = std::move(s);
  return absl::OkStatus();
}

absl::StatusOr<TrainConfig> ParseTrainConfigImpl(absl::string_view text, absl::string_view source,
                                                 std::vector<std::string>* ignored_keys) {
  RETURN_IF_ERROR(CheckJsonSyntax(text, source, kMaxConfigJsonDepth,
                                  " (a config needs 3); this is not a config file"));
  const Json top = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (top.is_discarded()) {
    // The SAX pass accepted the same text; this cannot happen.
    return absl::InternalError(absl::StrCat(source, ": the JSON parser rejected the text"));
  }
  const JsonReader r(source, ignored_keys);
  if (!top.is_object()) {
    return r.Error(absl::StrCat("a config is a JSON object ({...}), found ", DescribeJson(top)));
  }
  RETURN_IF_ERROR(r.CheckKeys(top, ConfigSchema().top));

  TrainConfig c;
  RETURN_IF_ERROR(r.GetInt(top, "", "train_batch_size", &c.train_batch_size));
  RETURN_IF_ERROR(
      r.GetInt(top, "", "train_micro_batch_size_per_gpu", &c.train_micro_batch_size_per_gpu));
  RETURN_IF_ERROR(r.GetInt(top, "", "gradient_accumulation_steps", &c.gradient_accumulation_steps));
  RETURN_IF_ERROR(r.GetInt(top, "", "train_steps", &c.steps));
  RETURN_IF_ERROR(r.GetUint64(top, "", "seed", &c.seed));
  RETURN_IF_ERROR(r.GetInt(top, "", "threads", &c.threads));
  RETURN_IF_ERROR(r.GetInt(top, "", "steps_per_print", &c.steps_per_print));
  RETURN_IF_ERROR(r.GetDouble(top, "", "gradient_clipping", &c.gradient_clipping));
  RETURN_IF_ERROR(ReadOptimizer(r, top, &c));
  RETURN_IF_ERROR(ReadScheduler(r, top, &c));
  RETURN_IF_ERROR(ReadPrecision(r, top, &c));
  RETURN_IF_ERROR(ReadModel(r, top, &c));
  RETURN_IF_ERROR(ReadChunk(r, top, &c));
  RETURN_IF_ERROR(ReadAccelerator(r, top, &c));
  RETURN_IF_ERROR(ReadData(r, top, &c));
  RETURN_IF_ERROR(ReadCheckpoint(r, top, &c));
  RETURN_IF_ERROR(ReadProfile(r, top, &c));
  RETURN_IF_ERROR(ReadZeroOptimization(r, top, &c, ignored_keys));
  RETURN_IF_ERROR(ReadAio(r, top, &c));
  RETURN_IF_ERROR(ReadLora(r, top, &c));
  RETURN_IF_ERROR(ReadQuantization(r, top, &c));
  return c;
}

}  // namespace

absl::StatusOr<TrainConfig> ParseTrainConfig(absl::string_view json_text, absl::string_view source,
                                             std::vector<std::string>* ignored_keys) {
  // nlohmann/json throws; nothing here should (types are checked before every get), but no
  // exception may leave this function.
  try {
    ASSIGN_OR_RETURN(TrainConfig config, ParseTrainConfigImpl(json_text, source, ignored_keys));
    const absl::Status values = CheckTrainConfigValues(config);
    if (!values.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", values.message()));
    }
    return config;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(source, ": unexpected error parsing the config: ", e.what()));
  }
}

absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot open config file ", path, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("config path ", path, " is a directory, not a JSON file"));
  }
  std::string text;
  char buffer[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read config file ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > kMaxConfigFileBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, " is larger than ",
                                                     FormatBytes(kMaxConfigFileBytes),
                                                     "; it is not a config"));
    }
  }
  ::close(fd);
  return ParseTrainConfig(text, path);
}

}  // namespace ps
