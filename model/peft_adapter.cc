#include "model/peft_adapter.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "model/atomic_directory.h"
#include "model/hf_json.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using Json = nlohmann::json;

std::string JoinPath(absl::string_view dir, absl::string_view file) {
  return absl::StrCat(dir, "/", file);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Errors about adapter_config.json name the file and the key.
absl::Status ConfigError(absl::StatusCode code, absl::string_view path, absl::string_view message) {
  return absl::Status(code, absl::StrCat("PEFT adapter config '", path, "': ", message));
}

absl::StatusOr<std::vector<std::string>> StringList(const Json& value, absl::string_view key,
                                                    absl::string_view path) {
  if (!value.is_array()) {
    return ConfigError(absl::StatusCode::kInvalidArgument, path,
                       absl::StrCat(key, " must be a list of strings, got ",
                                    hf_json::TypeName(value), " ", hf_json::Brief(value)));
  }
  std::vector<std::string> out;
  for (const Json& v : value) {
    if (!v.is_string()) {
      return ConfigError(absl::StatusCode::kInvalidArgument, path,
                         absl::StrCat(key, " must be a list of strings; it holds ",
                                      hf_json::TypeName(v), " ", hf_json::Brief(v)));
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

// Whether `key` is absent or holds a "not in use" value: null, false, {} or [].
bool Unused(const Json& config, const char* key) {
  if (!config.contains(key)) return true;
  const Json& v = config[key];
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
         ((v.is_object() || v.is_array()) && v.empty());
}

absl::StatusOr<LoraConfig> ParseConfig(const Json& config, absl::string_view path,
                                       std::string* base_model) {
  const auto invalid = [&](absl::string_view message) {
    return ConfigError(absl::StatusCode::kInvalidArgument, path, message);
  };
  if (!config.contains("peft_type") || !config["peft_type"].is_string()) {
    return invalid("peft_type is missing or not a string; a LoRA adapter has peft_type \"LORA\"");
  }
  const std::string peft_type = config["peft_type"].get<std::string>();
  if (peft_type != "LORA") {
    return invalid(absl::StrCat("peft_type is \"", peft_type,
                                "\"; only LoRA adapters (peft_type \"LORA\") are read"));
  }
  if (config.contains("task_type") && !config["task_type"].is_null() &&
      config["task_type"] != "CAUSAL_LM") {
    return invalid(absl::StrCat("task_type is ", hf_json::Brief(config["task_type"]),
                                "; only causal language model adapters (\"CAUSAL_LM\") are read"));
  }
  struct Feature {
    const char* key;
    const char* what;
  };
  static constexpr Feature kUnsupported[] = {
      {"use_dora", "DoRA (weight-decomposed LoRA)"},
      {"use_rslora", "rank-stabilized LoRA (scale lora_alpha / sqrt(r))"},
      {"lora_bias", "a bias on lora_B"},
      {"use_qalora", "QA-LoRA"},
      {"rank_pattern", "per-module ranks"},
      {"alpha_pattern", "per-module alphas"},
      {"layers_to_transform", "adapting only some layers"},
      {"layers_pattern", "adapting only some layers"},
      {"exclude_modules", "excluded modules"},
      {"target_parameters", "LoRA on parameters (target_parameters)"},
      {"trainable_token_indices", "trainable tokens"},
      {"layer_replication", "layer replication"},
      {"alora_invocation_tokens", "activated LoRA"},
      {"megatron_config", "Megatron layers"},
      // LoRA variants of later releases (peft 0.21's LoraConfig) that change the forward or the
      // base weights.
      {"use_bdlora", "block-diagonal LoRA (BD-LoRA)"},
      {"arrow_config", "Arrow routing"},
      {"kasa_config", "KaSA (it truncates the base weights' singular values)"},
      {"monteclora_config", "MonteCLoRA sampling"},
  };
  for (const Feature& f : kUnsupported) {
    if (!Unused(config, f.key)) {
      return ConfigError(absl::StatusCode::kUnimplemented, path,
                         absl::StrCat(f.key, " = ", hf_json::Brief(config[f.key]), ": ", f.what,
                                      " is not supported"));
    }
  }
  if (config.contains("init_lora_weights") && config["init_lora_weights"].is_string()) {
    const std::string init = absl::AsciiStrToLower(config["init_lora_weights"].get<std::string>());
    for (const char* rewrites : {"pissa", "olora", "corda", "loftq", "lora_ga"}) {
      if (absl::StartsWith(init, rewrites)) {
        return ConfigError(
            absl::StatusCode::kUnimplemented, path,
            absl::StrCat("init_lora_weights \"", init,
                         "\" rewrote the base model's weights, so this adapter needs that "
                         "modified base; convert it to plain LoRA with PEFT "
                         "(save_pretrained(path_initial_model_for_weight_conversion=...))"));
      }
    }
  }

  LoraConfig lora;
  if (!config.contains("r") || !config["r"].is_number_integer()) {
    return invalid(absl::StrCat("r must be an integer, got ",
                                config.contains("r") ? hf_json::Brief(config["r"]) : "nothing"));
  }
  lora.r = config["r"].get<int64_t>();
  if (config.contains("lora_alpha")) {
    if (!config["lora_alpha"].is_number()) {
      return invalid(
          absl::StrCat("lora_alpha must be a number, got ", hf_json::Brief(config["lora_alpha"])));
    }
    lora.lora_alpha = config["lora_alpha"].get<double>();
  }
  if (config.contains("lora_dropout")) {
    if (!config["lora_dropout"].is_number()) {
      return invalid(absl::StrCat("lora_dropout must be a number, got ",
                                  hf_json::Brief(config["lora_dropout"])));
    }
    lora.lora_dropout = config["lora_dropout"].get<double>();
  }
  if (config.contains("bias")) {
    if (!config["bias"].is_string()) {
      return invalid(absl::StrCat("bias must be a string, got ", hf_json::Brief(config["bias"])));
    }
    lora.bias = config["bias"].get<std::string>();
  }
  if (!config.contains("target_modules") || config["target_modules"].is_null()) {
    return invalid(
        "target_modules is missing or null; name the adapted modules (PEFT writes them when it "
        "saves an adapter)");
  }
  const Json& targets = config["target_modules"];
  if (targets.is_string()) {
    const std::string t = targets.get<std::string>();
    if (absl::AsciiStrToLower(t) != kLoraAllLinear) {
      return ConfigError(absl::StatusCode::kUnimplemented, path,
                         absl::StrCat("target_modules is the regular expression \"", t,
                                      "\"; only a list of module names or \"all-linear\" is read"));
    }
    lora.target_modules = {std::string(kLoraAllLinear)};
  } else {
    ASSIGN_OR_RETURN(lora.target_modules, StringList(targets, "target_modules", path));
  }
  if (config.contains("modules_to_save") && !config["modules_to_save"].is_null()) {
    ASSIGN_OR_RETURN(lora.modules_to_save,
                     StringList(config["modules_to_save"], "modules_to_save", path));
  }
  base_model->clear();
  if (config.contains("base_model_name_or_path") && config["base_model_name_or_path"].is_string()) {
    *base_model = config["base_model_name_or_path"].get<std::string>();
  }
  return lora;
}

}  // namespace

std::vector<TensorSpec> PeftAdapterTensors(const ModelConfig& model, const LoraConfig& lora) {
  std::vector<TensorSpec> specs;
  for (const LoraTarget& t : LoraTargets(model, lora)) {
    specs.push_back(TensorSpec{t.a, {lora.r, t.in}});
    specs.push_back(TensorSpec{t.b, {t.out, lora.r}});
  }
  const std::vector<std::string> saved = LoraSavedTensors(model, lora);
  if (!saved.empty()) {
    absl::flat_hash_map<std::string, std::vector<int64_t>> shapes;
    for (const OperatorSpec& op : ModelOperators(model)) {
      for (const TensorSpec& t : op.tensors) shapes[t.name] = t.shape;
    }
    for (const std::string& name : saved) specs.push_back(TensorSpec{name, shapes.at(name)});
  }
  return specs;
}

absl::StatusOr<std::string> PeftAdapterConfigJson(const ModelConfig& model, const LoraConfig& lora,
                                                  absl::string_view base_model_name_or_path) {
  RETURN_IF_ERROR(ValidateLoraConfig(model, lora));
  // Only keys peft 0.10's LoraConfig has (older releases raise TypeError on any other key; see
  // the header). Always: what PEFT needs to rebuild the layers and their scale, even at PEFT's
  // default, so that no change of a default can change the adapter. The rest only when it
  // differs from PEFT's default (the same from 0.10 to today).
  Json j = Json::object();
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["r"] = lora.r;
  if (lora.lora_alpha == std::floor(lora.lora_alpha) && std::abs(lora.lora_alpha) < 0x1p53) {
    j["lora_alpha"] = static_cast<int64_t>(lora.lora_alpha);
  } else {
    j["lora_alpha"] = lora.lora_alpha;
  }
  if (lora.target_modules.size() == 1 && lora.target_modules[0] == kLoraAllLinear) {
    j["target_modules"] = std::string(kLoraAllLinear);
  } else {
    j["target_modules"] = lora.target_modules;
  }
  if (!base_model_name_or_path.empty()) {
    j["base_model_name_or_path"] = std::string(base_model_name_or_path);
  }
  if (lora.lora_dropout != 0) j["lora_dropout"] = lora.lora_dropout;
  if (!lora.modules_to_save.empty()) j["modules_to_save"] = lora.modules_to_save;
  // GPT-2's Conv1D stores W as [in, out]; PEFT sets fan_in_fan_out for Conv1D itself (with a
  // warning when the config says false), so writing it only keeps PEFT quiet.
  if (model.architecture() == ModelArchitecture::kGpt2) j["fan_in_fan_out"] = true;
  if (lora.bias != "none") j["bias"] = lora.bias;  // ValidateLoraConfig allows only "none" today
  return j.dump(2);
}

absl::Status WritePeftAdapter(const std::string& dir, const ModelConfig& model,
                              const LoraConfig& lora, absl::string_view base_model_name_or_path,
                              const PeftTensorFn& tensors, DType dtype) {
  ASSIGN_OR_RETURN(const std::string config_json,
                   PeftAdapterConfigJson(model, lora, base_model_name_or_path));
  const std::vector<TensorSpec> ours = PeftAdapterTensors(model, lora);
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(ours.size());
  for (const TensorSpec& t : ours) {
    specs.push_back(SafetensorsTensorSpec{PeftTensorName(model, t.name), dtype, t.shape});
  }
  DirectoryReplaceOptions replace;
  replace.marker_file = std::string(kPeftAdapterConfigFileName);
  replace.is_replaced = [](absl::string_view name) {
    return name == kPeftAdapterConfigFileName || name == kPeftAdapterWeightsFileName ||
           name == "adapter_model.bin";
  };
  return ReplaceDirectoryAtomically(dir, replace, [&](const std::string& staging) -> absl::Status {
    const std::string config_path = JoinPath(staging, kPeftAdapterConfigFileName);
    RETURN_IF_ERROR(
        WriteFileAtomically(config_path, [&](int fd, const std::string&) -> absl::Status {
          return WriteAll(fd, config_json.data(), config_json.size(), config_path);
        }));
    std::vector<float> buffer;
    return WriteSafetensors(
        JoinPath(staging, kPeftAdapterWeightsFileName), specs, {{"format", "pt"}},
        [&](size_t index, absl::Span<uint8_t> dst) -> absl::Status {
          const TensorSpec& t = ours[index];
          buffer.assign(static_cast<size_t>(t.numel()), 0.0f);
          RETURN_IF_ERROR(tensors(t, absl::MakeSpan(buffer)));
          switch (dtype) {
            case DType::kF32:
              std::memcpy(dst.data(), buffer.data(), dst.size());
              break;
            case DType::kF16:
              ConvertF32ToF16(buffer.data(), reinterpret_cast<uint16_t*>(dst.data()), t.numel());
              break;
            case DType::kBF16:
              ConvertF32ToBF16(buffer.data(), reinterpret_cast<uint16_t*>(dst.data()), t.numel());
              break;
          }
          return absl::OkStatus();
        });
  });
}

absl::StatusOr<PeftAdapter> ReadPeftAdapter(const std::string& dir, const ModelConfig& model) {
  const std::string config_path = JoinPath(dir, kPeftAdapterConfigFileName);
  const std::string weights_path = JoinPath(dir, kPeftAdapterWeightsFileName);
  absl::StatusOr<std::string> text = hf_json::ReadTextFile(config_path, "PEFT adapter config");
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat("PEFT adapter directory '", dir, "' has no ",
                                              kPeftAdapterConfigFileName, " (", config_path,
                                              "): not a PEFT adapter directory"));
    }
    return text.status();
  }
  ASSIGN_OR_RETURN(const Json config,
                   hf_json::ParseObject(*text, "PEFT adapter config", config_path,
                                        absl::StatusCode::kInvalidArgument));
  PeftAdapter adapter;
  ASSIGN_OR_RETURN(adapter.lora,
                   ParseConfig(config, config_path, &adapter.base_model_name_or_path));
  if (const absl::Status valid = ValidateLoraConfig(model, adapter.lora); !valid.ok()) {
    return ConfigError(valid.code(), config_path, valid.message());
  }

  if (!FileExists(weights_path)) {
    const std::string bin = JoinPath(dir, "adapter_model.bin");
    return absl::NotFoundError(absl::StrCat(
        "PEFT adapter directory '", dir, "' has no ", kPeftAdapterWeightsFileName,
        FileExists(bin) ? absl::StrCat("; it has ", bin,
                                       ", a PyTorch pickle, which is not read: save the adapter "
                                       "with safe_serialization=True")
                        : ""));
  }
  ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::Open(weights_path));

  const std::vector<TensorSpec> expected = PeftAdapterTensors(model, adapter.lora);
  absl::flat_hash_map<std::string, const TensorSpec*> by_peft_name;
  for (const TensorSpec& t : expected) by_peft_name[PeftTensorName(model, t.name)] = &t;
  std::vector<std::string> missing, extra;
  for (const TensorSpec& t : expected) {
    if (file.Find(PeftTensorName(model, t.name)) == nullptr) {
      missing.push_back(PeftTensorName(model, t.name));
    }
  }
  for (const SafetensorsTensorInfo& info : file.tensors()) {
    if (!by_peft_name.contains(info.name)) extra.push_back(info.name);
  }
  if (!missing.empty() || !extra.empty()) {
    const auto list = [](const std::vector<std::string>& names) {
      constexpr size_t kMax = 8;
      std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kMax));
      return absl::StrCat(
          absl::StrJoin(shown, ", "),
          names.size() > kMax ? absl::StrCat(" and ", names.size() - kMax, " more") : "");
    };
    std::string message = absl::StrCat("PEFT adapter weights '", weights_path,
                                       "' do not match adapter_config.json for this model:");
    if (!missing.empty()) {
      absl::StrAppend(&message, " missing ", missing.size(), " tensor(s): ", list(missing), ";");
    }
    if (!extra.empty()) {
      absl::StrAppend(&message, " unexpected ", extra.size(), " tensor(s): ", list(extra), ";");
    }
    message.pop_back();
    return absl::InvalidArgumentError(message);
  }
  for (const TensorSpec& t : expected) {
    const std::string name = PeftTensorName(model, t.name);
    const SafetensorsTensorInfo* info = file.Find(name);
    if (info->shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PEFT adapter weights '", weights_path, "': tensor ", name, " has shape ",
          ShapeString(info->shape), ", but this model (r = ", adapter.lora.r, ") needs ",
          ShapeString(t.shape), "; the adapter belongs to another base model or rank"));
    }
    std::vector<float> values(static_cast<size_t>(t.numel()));
    RETURN_IF_ERROR(file.ReadAsF32(name, absl::MakeSpan(values)));
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        return absl::DataLossError(absl::StrCat("PEFT adapter weights '", weights_path,
                                                "': tensor ", name, " holds ", values[i],
                                                " at element ", i));
      }
    }
    adapter.tensors.emplace(t.name, std::move(values));
  }
  return adapter;
}

}  // namespace ps
