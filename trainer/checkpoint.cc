#include "trainer/checkpoint.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_type.h"
#include "memory/dtype.h"
#include "model/finite_scan.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/kernels/nf4.h"
#include "model/model_state_io.h"
#include "model/quant4_config.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "trainer/io/checkpoint_dir.h"

namespace ps {
namespace {

constexpr absl::string_view kStateFile = "state.safetensors";

// The name of a training-state tensor in the state file: "<type>/<name>" ("master/wte.weight").
std::string StateTensorName(const TrainingStateTensor& t) {
  return absl::StrCat(ChunkTypeName(t.type), "/", t.name);
}

// bnb_4bit_compute_dtype as the quantization section writes it (torch's names).
const char* TorchDTypeName(DType d) {
  return d == DType::kF32 ? "float32" : d == DType::kF16 ? "float16" : "bfloat16";
}

nlohmann::json IdentityJson(const CheckpointIdentity& id) {
  nlohmann::json j;
  j["vocab_size"] = id.vocab_size;
  j["n_positions"] = id.max_seq_len;
  j["n_embd"] = id.hidden;
  j["n_layer"] = id.num_layers;
  j["n_head"] = id.num_heads;
  j["compute_dtype"] = std::string(DTypeName(id.compute_dtype));
  j["world_size"] = id.world_size;
  j["micro_batch"] = id.micro_batch;
  j["seq_len"] = id.seq_len;
  j["shuffle"] = id.shuffle;
  j["data_seed"] = id.data_seed;
  if (!id.data_format.empty()) {
    j["data_format"] = id.data_format;
    j["packing"] = id.packing;
  }
  if (id.lora.has_value()) {
    j["lora"] = {{"r", id.lora->r},
                 {"lora_alpha", id.lora->lora_alpha},
                 {"lora_dropout", id.lora->lora_dropout},
                 {"target_modules", id.lora->target_modules},
                 {"bias", id.lora->bias},
                 {"modules_to_save", id.lora->modules_to_save}};
    j["base_fingerprint"] = id.base_fingerprint;
    j["base_source"] = id.base_source;
  }
  if (id.quant4.has_value()) {
    const Quant4Config& q = *id.quant4;
    j["quantization"] = {{"load_in_4bit", true},
                         {"bnb_4bit_quant_type", Quant4TypeName(q.quant_type)},
                         {"bnb_4bit_use_double_quant", q.double_quant},
                         {"bnb_4bit_compute_dtype", TorchDTypeName(q.compute_dtype)},
                         {"llm_int8_skip_modules", q.skip_modules}};
  }
  return j;
}

// The fields of IdentityJson(a) and IdentityJson(b) that differ, as "key a (this run: b)"; the
// lora section key by key ("lora.r 4 (this run: 8)"); base_source is not compared.
std::vector<std::string> IdentityDiffs(const CheckpointIdentity& checkpoint,
                                       const CheckpointIdentity& run) {
  const nlohmann::json a = IdentityJson(checkpoint);
  const nlohmann::json b = IdentityJson(run);
  std::vector<std::string> diffs;
  const auto value = [](const nlohmann::json& j, const std::string& key) {
    if (j.contains(key)) return j[key].dump();
    // Token data has no data_format key.
    return std::string(key == "data_format" ? "\"llm.c tokens\"" : "none");
  };
  std::vector<std::string> keys;
  for (auto it = a.begin(); it != a.end(); ++it) keys.push_back(it.key());
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (!a.contains(it.key())) keys.push_back(it.key());
  }
  for (const std::string& key : keys) {
    if (key == "base_source" || key == "base_fingerprint") continue;
    const bool section = key == "lora" || key == "quantization";
    if (section && a.contains(key) && b.contains(key)) {
      for (auto it = a[key].begin(); it != a[key].end(); ++it) {
        if (b[key][it.key()] != it.value()) {
          diffs.push_back(absl::StrCat(key, ".", it.key(), " ", it.value().dump(),
                                       " (this run: ", b[key][it.key()].dump(), ")"));
        }
      }
      continue;
    }
    if (value(a, key) != value(b, key)) {
      diffs.push_back(absl::StrCat(section ? absl::StrCat("the ", key, " section") : key, " ",
                                   value(a, key), " (this run: ", value(b, key), ")"));
    }
  }
  return diffs;
}

// Reads a field of the manifest's state, DataLoss naming it when absent, of the wrong type, or
// (for integers) not representable in T — the manifest is not checksummed, so every value is
// checked here.
template <typename T>
absl::Status Get(const nlohmann::json& j, const char* key, const std::string& where, T* out) {
  auto it = j.find(key);
  if (it == j.end()) {
    return absl::DataLossError(absl::StrCat(where, ": the manifest's state has no \"", key, "\""));
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) {
      return absl::DataLossError(absl::StrCat(where, ": \"", key, "\" is not a boolean"));
    }
    *out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const auto out_of_range = [&] {
      return absl::DataLossError(
          absl::StrCat(where, ": \"", key, "\" = ", it->dump(), " is not an integer in [",
                       std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]"));
    };
    if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return out_of_range();
      *out = static_cast<T>(v);
    } else if (it->is_number_integer()) {
      const int64_t v = it->get<int64_t>();
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (v > 0 &&
           static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
        return out_of_range();
      }
      *out = static_cast<T>(v);
    } else {
      return out_of_range();
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) {
      return absl::DataLossError(absl::StrCat(where, ": \"", key, "\" is not a number"));
    }
    *out = it->get<T>();
  } else {
    if (!it->is_string()) {
      return absl::DataLossError(absl::StrCat(where, ": \"", key, "\" is not a string"));
    }
    *out = it->get<T>();
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointIdentity> ParseIdentity(const nlohmann::json& j,
                                                 const std::string& where) {
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(where, ": no identity object"));
  CheckpointIdentity id;
  std::string dtype;
  RETURN_IF_ERROR(Get(j, "vocab_size", where, &id.vocab_size));
  RETURN_IF_ERROR(Get(j, "n_positions", where, &id.max_seq_len));
  RETURN_IF_ERROR(Get(j, "n_embd", where, &id.hidden));
  RETURN_IF_ERROR(Get(j, "n_layer", where, &id.num_layers));
  RETURN_IF_ERROR(Get(j, "n_head", where, &id.num_heads));
  RETURN_IF_ERROR(Get(j, "compute_dtype", where, &dtype));
  RETURN_IF_ERROR(Get(j, "world_size", where, &id.world_size));
  RETURN_IF_ERROR(Get(j, "micro_batch", where, &id.micro_batch));
  RETURN_IF_ERROR(Get(j, "seq_len", where, &id.seq_len));
  RETURN_IF_ERROR(Get(j, "shuffle", where, &id.shuffle));
  RETURN_IF_ERROR(Get(j, "data_seed", where, &id.data_seed));
  if (j.contains("data_format")) {
    RETURN_IF_ERROR(Get(j, "data_format", where, &id.data_format));
    RETURN_IF_ERROR(Get(j, "packing", where, &id.packing));
    if (id.data_format != "examples") {
      return absl::DataLossError(
          absl::StrCat(where, ": unknown data_format \"", id.data_format, "\""));
    }
  }
  if (const auto it = j.find("lora"); it != j.end()) {
    if (!it->is_object()) return absl::DataLossError(absl::StrCat(where, ": bad lora identity"));
    LoraConfig lora;
    RETURN_IF_ERROR(Get(*it, "r", where, &lora.r));
    RETURN_IF_ERROR(Get(*it, "lora_alpha", where, &lora.lora_alpha));
    RETURN_IF_ERROR(Get(*it, "lora_dropout", where, &lora.lora_dropout));
    RETURN_IF_ERROR(Get(*it, "bias", where, &lora.bias));
    for (const char* key : {"target_modules", "modules_to_save"}) {
      const auto list = it->find(key);
      bool ok = list != it->end() && list->is_array();
      std::vector<std::string> names;
      for (size_t i = 0; ok && i < list->size(); ++i) {
        ok = (*list)[i].is_string();
        if (ok) names.push_back((*list)[i].get<std::string>());
      }
      if (!ok) {
        return absl::DataLossError(
            absl::StrCat(where, ": the identity's lora.", key, " is not a list of names"));
      }
      (std::string(key) == "target_modules" ? lora.target_modules : lora.modules_to_save) =
          std::move(names);
    }
    id.lora = std::move(lora);
    RETURN_IF_ERROR(Get(j, "base_fingerprint", where, &id.base_fingerprint));
    RETURN_IF_ERROR(Get(j, "base_source", where, &id.base_source));
  }
  if (const auto it = j.find("quantization"); it != j.end()) {
    if (!it->is_object()) {
      return absl::DataLossError(absl::StrCat(where, ": bad quantization identity"));
    }
    Quant4Config q;
    bool on = false;
    std::string type, compute;
    RETURN_IF_ERROR(Get(*it, "load_in_4bit", where, &on));
    RETURN_IF_ERROR(Get(*it, "bnb_4bit_quant_type", where, &type));
    RETURN_IF_ERROR(Get(*it, "bnb_4bit_use_double_quant", where, &q.double_quant));
    RETURN_IF_ERROR(Get(*it, "bnb_4bit_compute_dtype", where, &compute));
    bool type_known = false, compute_known = false;
    for (Quant4Type t : {Quant4Type::kNf4, Quant4Type::kFp4}) {
      if (type == Quant4TypeName(t)) {
        q.quant_type = t;
        type_known = true;
      }
    }
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (compute == TorchDTypeName(d)) {
        q.compute_dtype = d;
        compute_known = true;
      }
    }
    const auto skip = it->find("llm_int8_skip_modules");
    bool names_ok = skip != it->end() && skip->is_array();
    for (size_t i = 0; names_ok && i < skip->size(); ++i) {
      names_ok = (*skip)[i].is_string();
      if (names_ok) q.skip_modules.push_back((*skip)[i].get<std::string>());
    }
    if (!on || !type_known || !compute_known || !names_ok) {
      return absl::DataLossError(absl::StrCat(where, ": bad quantization identity ", it->dump()));
    }
    id.quant4 = std::move(q);
  }
  bool known = false;
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (DTypeName(d) == dtype) {
      id.compute_dtype = d;
      known = true;
    }
  }
  if (!known) {
    return absl::DataLossError(absl::StrCat(where, ": unknown compute_dtype \"", dtype, "\""));
  }
  return id;
}

}  // namespace

absl::StatusOr<std::string> WriteTrainingCheckpoint(const std::string& root, int64_t keep_last,
                                                    const TrainingCheckpointState& state,
                                                    const GptModel& model) {
  CheckpointOptions options;
  options.keep_last = static_cast<int>(keep_last);
  ASSIGN_OR_RETURN(CheckpointWriter writer, CheckpointWriter::Begin(root, state.step, options));

  // Tensors "<type>/<name>", flat f32, streamed one at a time from the chunks, in the order the
  // model visits its training state (wte's row blocks under their block names).
  const std::vector<TrainingStateTensor> tensors = model.TrainingStateTensors();
  std::vector<SafetensorsTensorSpec> specs;
  for (const TrainingStateTensor& t : tensors) {
    specs.push_back({.name = StateTensorName(t), .dtype = DType::kF32, .shape = t.shape});
  }
  std::map<std::string, std::string> metadata = {{"format", "patrickstar_cc training state"}};
  RETURN_IF_ERROR(WriteSafetensors(
      writer.FilePath(kStateFile), specs, metadata,
      [&](size_t index, absl::Span<uint8_t> dst) -> absl::Status {
        ASSIGN_OR_RETURN(std::vector<float> v,
                         model.ReadTensor(tensors[index].type, tensors[index].name));
        if (v.size() * sizeof(float) != dst.size()) {
          return absl::InternalError(
              absl::StrCat("checkpoint: size of ", specs[index].name, " changed"));
        }
        // Never a checkpoint of a diverged state: the write is abandoned (nothing is committed,
        // the previous checkpoints stay the newest).
        if (const int64_t bad = FindFirstNonFinite(DType::kF32, v.data(), v.size()); bad >= 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "refusing to write checkpoint step ", state.step, " under '", root,
              "': ", specs[index].name, " holds ", NonFiniteKind(DType::kF32, v.data(), bad),
              " at ", ElementCoordinates(specs[index].shape, bad),
              "; the training state is not finite (the run diverged). Nothing was written; "
              "resume from an earlier checkpoint with a lower learning rate or gradient "
              "clipping"));
        }
        std::memcpy(dst.data(), v.data(), dst.size());
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(writer.AddFile(kStateFile));

  nlohmann::json j;
  j["step"] = state.step;
  j["adam_step"] = state.adam_step;
  j["loss_scaler"] = {{"scale", state.loss_scaler.scale},
                      {"iteration", state.loss_scaler.iteration},
                      {"last_overflow_iteration", state.loss_scaler.last_overflow_iteration},
                      {"hysteresis_left", state.loss_scaler.hysteresis_left}};
  j["data_cursor"] = {{"epoch", state.data_cursor.epoch},
                      {"batch_in_epoch", state.data_cursor.batch_in_epoch}};
  j["last_loss"] = state.last_loss;  // null when not finite (a skipped fp16 step)
  j["consecutive_skipped_steps"] = state.consecutive_skipped_steps;
  j["identity"] = IdentityJson(state.identity);
  j["config"] = state.config_json;
  return writer.Commit(j);
}

absl::StatusOr<std::string> LatestTrainingCheckpoint(const std::string& root) {
  absl::StatusOr<CheckpointRef> latest = LatestCheckpoint(root);
  if (!latest.ok()) {
    if (absl::IsNotFound(latest.status())) {
      return absl::NotFoundError(absl::StrCat("no checkpoint to resume from in '", root,
                                              "' (checkpoint.dir / --save_dir)"));
    }
    return latest.status();
  }
  return latest->path;
}

std::string RankCheckpointRoot(const std::string& root, int rank) {
  if (rank == 0) return root;
  return absl::StrCat(root, "/rank-", rank);
}

absl::StatusOr<std::string> TrainingCheckpointAtStep(const std::string& root, int64_t step) {
  ASSIGN_OR_RETURN(std::vector<CheckpointRef> refs, ListCheckpoints(root));
  for (const CheckpointRef& ref : refs) {
    if (ref.step == step) return ref.path;
  }
  return absl::NotFoundError(absl::StrCat("no committed checkpoint of step ", step, " in '", root,
                                          "' (", refs.size(), " checkpoints there)"));
}

absl::StatusOr<TrainingCheckpointState> ReadTrainingCheckpoint(const std::string& dir,
                                                               const CheckpointIdentity& expected,
                                                               GptModel* model) {
  ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenCheckpoint(dir));
  const nlohmann::json& j = checkpoint.state;
  const std::string where = absl::StrCat("checkpoint '", dir, "'");
  if (!j.is_object())
    return absl::DataLossError(absl::StrCat(where, ": the state is not an object"));
  TrainingCheckpointState state;
  RETURN_IF_ERROR(Get(j, "step", where, &state.step));
  RETURN_IF_ERROR(Get(j, "adam_step", where, &state.adam_step));
  // A skipped fp16 step may have a NaN loss, which JSON writes as null.
  if (const auto it = j.find("last_loss"); it != j.end() && it->is_null()) {
    state.last_loss = std::numeric_limits<double>::quiet_NaN();
  } else {
    RETURN_IF_ERROR(Get(j, "last_loss", where, &state.last_loss));
  }
  RETURN_IF_ERROR(Get(j, "config", where, &state.config_json));
  if (j.contains("consecutive_skipped_steps")) {  // absent in checkpoints of earlier versions
    RETURN_IF_ERROR(Get(j, "consecutive_skipped_steps", where, &state.consecutive_skipped_steps));
  }
  if (state.step < 0 || state.adam_step < 0 || state.adam_step > state.step ||
      state.consecutive_skipped_steps < 0 || state.consecutive_skipped_steps > state.step) {
    return absl::DataLossError(
        absl::StrCat(where, ": impossible counters in the manifest: step ", state.step,
                     ", adam_step ", state.adam_step, ", consecutive_skipped_steps ",
                     state.consecutive_skipped_steps, " (each must be in [0, step])"));
  }
  if (!j.contains("loss_scaler") || !j.contains("data_cursor") || !j.contains("identity")) {
    return absl::DataLossError(
        absl::StrCat(where, ": the state lacks loss_scaler, data_cursor or identity"));
  }
  const nlohmann::json& ls = j["loss_scaler"];
  if (!ls.is_object()) return absl::DataLossError(absl::StrCat(where, ": bad loss_scaler"));
  RETURN_IF_ERROR(Get(ls, "scale", where, &state.loss_scaler.scale));
  RETURN_IF_ERROR(Get(ls, "iteration", where, &state.loss_scaler.iteration));
  RETURN_IF_ERROR(
      Get(ls, "last_overflow_iteration", where, &state.loss_scaler.last_overflow_iteration));
  RETURN_IF_ERROR(Get(ls, "hysteresis_left", where, &state.loss_scaler.hysteresis_left));
  const nlohmann::json& dc = j["data_cursor"];
  if (!dc.is_object()) return absl::DataLossError(absl::StrCat(where, ": bad data_cursor"));
  RETURN_IF_ERROR(Get(dc, "epoch", where, &state.data_cursor.epoch));
  RETURN_IF_ERROR(Get(dc, "batch_in_epoch", where, &state.data_cursor.batch_in_epoch));
  ASSIGN_OR_RETURN(state.identity, ParseIdentity(j["identity"], where));

  // Another quantization section changes the base's (dequantized) values, so its fingerprint too:
  // that difference is named as the section's, below, not as another base.
  if (state.identity.lora.has_value() && expected.lora.has_value() &&
      state.identity.quant4 == expected.quant4 &&
      state.identity.base_fingerprint != expected.base_fingerprint) {
    const auto fingerprint = [](const std::string& f) {
      return f.empty() ? std::string("(none: written under ZeRO)") : f;
    };
    return absl::FailedPreconditionError(absl::StrCat(
        where, " holds LoRA adapters trained on another base model: its base has fingerprint ",
        fingerprint(state.identity.base_fingerprint), " (", state.identity.base_source,
        "), this run's base has fingerprint ", fingerprint(expected.base_fingerprint), " (",
        expected.base_source,
        "); resume with the base the adapters were trained on (checkpoint.init_from, "
        "--init_from), or start a new run in another checkpoint directory"));
  }
  if (!(state.identity == expected)) {
    const std::vector<std::string> diffs = IdentityDiffs(state.identity, expected);
    return absl::FailedPreconditionError(
        absl::StrCat(where, " belongs to another run: ", absl::StrJoin(diffs, ", "),
                     "; resume with the same model, precision, world size, batch shape and data "
                     "order, or start a new run in another checkpoint directory"));
  }

  // Exactly the files this program writes, and in the state file exactly the tensors this model
  // (this rank's share of it) needs: anything else is a damaged or foreign checkpoint.
  for (const CheckpointFileInfo& f : checkpoint.files) {
    if (f.name != kStateFile) {
      return absl::DataLossError(absl::StrCat(where, ": its manifest lists file '", f.name,
                                              "', which this program does not write (a "
                                              "checkpoint holds ",
                                              kStateFile, " only)"));
    }
  }
  ASSIGN_OR_RETURN(const std::string path, checkpoint.FilePath(kStateFile));
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  // Check every tensor before touching the model: present, f32, the model's shape, finite.
  absl::flat_hash_set<std::string> expected_names;
  for (const TrainingStateTensor& t : model->TrainingStateTensors()) {
    const std::string name = StateTensorName(t);
    const SafetensorsTensorInfo* info = file.Find(name);
    if (info == nullptr || info->dtype != DType::kF32 || info->shape != t.shape) {
      return absl::DataLossError(absl::StrCat(where, ": ", path, " has no f32 tensor '", name,
                                              "' of shape [", absl::StrJoin(t.shape, ", "), "]"));
    }
    RETURN_IF_ERROR(CheckTensorFinite(absl::StrCat(where, " (", path, ")"), name, DType::kF32,
                                      info->shape, file.Bytes(*info).data(), info->num_elements));
    expected_names.insert(name);
  }
  for (const SafetensorsTensorInfo& info : file.tensors()) {
    if (!expected_names.contains(info.name)) {
      return absl::DataLossError(absl::StrCat(
          where, ": ", path, " holds tensor '", info.name,
          "', which is not part of this rank's training state (", expected_names.size(),
          " tensors); a checkpoint must hold exactly the model's tensors"));
    }
  }
  RETURN_IF_ERROR(
      model->LoadTrainingState([&](absl::string_view name, ChunkType type, absl::Span<float> out) {
        return file.ReadAsF32(absl::StrCat(ChunkTypeName(type), "/", name), out);
      }));
  return state;
}

}  // namespace ps
