#include "model/quant4_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "model/hf_json.h"
#include "model/kernels/nf4.h"

namespace ps {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kQuantStatePrefix = "quant_state.bitsandbytes__";

// ---------------------------------------------------------------------------------------------
// quantization_config
// ---------------------------------------------------------------------------------------------

// The keys of BitsAndBytesConfig.to_dict() (transformers 4.57.6).
constexpr absl::string_view kKnownConfigKeys[] = {
    "quant_method",
    "load_in_4bit",
    "load_in_8bit",
    "_load_in_4bit",
    "_load_in_8bit",
    "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
    "bnb_4bit_compute_dtype",
    "bnb_4bit_quant_storage",
    "llm_int8_skip_modules",
    "llm_int8_threshold",
    "llm_int8_has_fp16_weight",
    "llm_int8_enable_fp32_cpu_offload",
};

class ConfigReader {
 public:
  ConfigReader(const json& q, absl::string_view path) : q_(q), path_(path) {}

  std::string Where(absl::string_view key) const {
    return absl::StrCat("config.json '", path_, "': quantization_config.", key);
  }
  absl::Status Invalid(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(key), " ", what));
  }
  absl::Status Unimplemented(absl::string_view key, absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(Where(key), " ", what));
  }

  // The value of `key`, or nullptr when absent or null.
  const json* Find(absl::string_view key) const {
    auto it = q_.find(std::string(key));
    if (it == q_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) {
      return Invalid(key, absl::StrCat("must be a boolean, got ", hf_json::TypeName(*v), " ",
                                       hf_json::Brief(*v)));
    }
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) {
      return Invalid(key, absl::StrCat("must be a string, got ", hf_json::TypeName(*v), " ",
                                       hf_json::Brief(*v)));
    }
    return std::optional<std::string>(v->get<std::string>());
  }

  // load_in_4bit and its attribute copy _load_in_4bit (both written by to_dict), which must agree.
  absl::StatusOr<bool> Flag(absl::string_view key) const {
    const std::string attr = absl::StrCat("_", key);
    ASSIGN_OR_RETURN(std::optional<bool> a, Bool(key));
    ASSIGN_OR_RETURN(std::optional<bool> b, Bool(attr));
    if (a.has_value() && b.has_value() && *a != *b) {
      return Invalid(
          key, absl::StrCat("is ", *a ? "true" : "false", " but ", attr, " is ",
                            *b ? "true" : "false", "; transformers writes both from one setting"));
    }
    return a.value_or(b.value_or(false));
  }

 private:
  const json& q_;
  absl::string_view path_;
};

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "safetensors file '<path>'" or "safetensors index '<path>'": where a missing tensor was looked
// for.
std::string DescribeWeights(const ShardedSafetensors& weights) {
  if (weights.sharded()) return absl::StrCat("safetensors index '", weights.index_path(), "'");
  if (weights.shards().empty()) return "no safetensors file";
  return absl::StrCat("safetensors file '", weights.shards().front().path(), "'");
}

// Reads one 4-bit weight's tensors; every error names the weight, the tensor and its file.
class WeightReader {
 public:
  WeightReader(const ShardedSafetensors& weights, absl::string_view weight,
               const Quant4Format& format)
      : weights_(weights), weight_(weight), format_(format) {}

  std::string Where(absl::string_view key, const ShardedTensorRef& ref) const {
    return absl::StrCat("4-bit weight '", weight_, "': tensor '", key, "' in file '",
                        ref.file->path(), "'");
  }

  // The tensor `key` with dtype `dtype_name` and shape `shape`. `why_needed` says which setting
  // asks for it, for the message when it is missing.
  absl::StatusOr<ShardedTensorRef> Need(const std::string& key, absl::string_view dtype_name,
                                        const std::vector<int64_t>& shape,
                                        absl::string_view why_needed) const {
    const ShardedTensorRef ref = weights_.Find(key);
    if (ref.info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("4-bit weight '", weight_, "': tensor '", key, "' is missing from ",
                       DescribeWeights(weights_), " (", why_needed, ")"));
    }
    if (ref.info->dtype_name != dtype_name) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key, ref), " has dtype ", ref.info->dtype_name, ", expected ", dtype_name));
    }
    if (ref.info->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(key, ref), " has shape ", ShapeString(ref.info->shape), ", expected ",
                       ShapeString(shape), " for a ", format_.rows, " x ", format_.cols,
                       " weight (", format_.num_elems(), " values)"));
    }
    return ref;
  }

  // Refuses a tensor that should not be there.
  absl::Status Absent(const std::string& key, absl::string_view why) const {
    const ShardedTensorRef ref = weights_.Find(key);
    if (ref.info == nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(Where(key, ref), " is present, but ", why));
  }

  // Copies the float32 values of `ref` (F32, checked by Need).
  std::vector<float> Floats(const ShardedTensorRef& ref) const {
    const absl::Span<const uint8_t> bytes = ref.file->Bytes(*ref.info);
    std::vector<float> out(bytes.size() / sizeof(float));
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  }

  absl::Status CheckFinite(const std::string& key, const ShardedTensorRef& ref,
                           absl::Span<const float> values, absl::string_view what) const {
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        return absl::DataLossError(
            absl::StrCat(Where(key, ref), ": ", what, " ", i, " is ", values[i]));
      }
    }
    return absl::OkStatus();
  }

 private:
  const ShardedSafetensors& weights_;
  absl::string_view weight_;
  const Quant4Format& format_;
};

// quant_state's JSON, checked against `format`; returns what it says.
struct QuantStateJson {
  float nested_offset = 0.0f;
  DType source_dtype = DType::kF32;
};

absl::StatusOr<QuantStateJson> ReadQuantState(const WeightReader& reader, const std::string& key,
                                              const ShardedTensorRef& ref,
                                              const Quant4Format& format) {
  const std::string where = reader.Where(key, ref);
  const absl::Span<const uint8_t> bytes = ref.file->Bytes(*ref.info);
  const absl::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  absl::StatusOr<json> parsed =
      hf_json::ParseObject(text, "4-bit quant state", key, absl::StatusCode::kDataLoss);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", parsed.status().message()));
  }
  const json& s = *parsed;
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(where, ": ", what));
  };
  // QuantState.from_dict asserts its keys are a subset of these.
  static constexpr absl::string_view kKnown[] = {"quant_type",   "blocksize",        "dtype",
                                                 "shape",        "nested_blocksize", "nested_dtype",
                                                 "nested_offset"};
  for (const auto& [k, v] : s.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown)) {
      return bad(absl::StrCat("unknown key \"", k, "\" (bitsandbytes' QuantState.from_dict knows ",
                              absl::StrJoin(kKnown, ", "), ")"));
    }
  }
  auto require = [&](absl::string_view k) -> absl::StatusOr<const json*> {
    auto it = s.find(std::string(k));
    if (it == s.end()) return bad(absl::StrCat("no \"", k, "\""));
    return &*it;
  };
  auto string_of = [&](absl::string_view k) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(const json* v, require(k));
    if (!v->is_string()) {
      return bad(absl::StrCat("\"", k, "\" must be a string, got ", hf_json::Brief(*v)));
    }
    return v->get<std::string>();
  };
  auto int_of = [&](absl::string_view k) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(const json* v, require(k));
    if (!v->is_number_integer()) {
      return bad(absl::StrCat("\"", k, "\" must be an integer, got ", hf_json::Brief(*v)));
    }
    return v->get<int64_t>();
  };

  // quant_type: the key's suffix, and the config's.
  ASSIGN_OR_RETURN(const std::string quant_type, string_of("quant_type"));
  const absl::string_view suffix = Quant4TypeName(format.type);
  if (quant_type != suffix) {
    if (quant_type == "nf4" || quant_type == "fp4") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": quant_type is \"", quant_type,
                       "\" but config.json's bnb_4bit_quant_type is \"", suffix, "\""));
    }
    return bad(absl::StrCat("quant_type \"", quant_type, "\" disagrees with the key's suffix \"",
                            suffix, "\""));
  }
  ASSIGN_OR_RETURN(const int64_t blocksize, int_of("blocksize"));
  if (blocksize != kQuant4BlockElems) {
    return absl::UnimplementedError(absl::StrCat(where, ": blocksize ", blocksize, "; only ",
                                                 kQuant4BlockElems,
                                                 " (transformers' and QLoRA's) is supported"));
  }
  QuantStateJson out;
  ASSIGN_OR_RETURN(const std::string dtype, string_of("dtype"));
  if (dtype == "float32") {
    out.source_dtype = DType::kF32;
  } else if (dtype == "bfloat16") {
    out.source_dtype = DType::kBF16;
  } else if (dtype == "float16") {
    out.source_dtype = DType::kF16;
  } else {
    return bad(absl::StrCat("dtype \"", dtype,
                            "\" (bitsandbytes quantizes float32, bfloat16 and float16 only)"));
  }
  ASSIGN_OR_RETURN(const json* shape, require("shape"));
  std::vector<int64_t> dims;
  if (shape->is_array()) {
    for (const json& d : *shape) {
      if (!d.is_number_integer()) {
        dims.clear();
        break;
      }
      dims.push_back(d.get<int64_t>());
    }
  }
  if (dims.empty()) {
    return bad(absl::StrCat("\"shape\" must be a list of integers, got ", hf_json::Brief(*shape)));
  }
  if (dims != std::vector<int64_t>{format.rows, format.cols}) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": shape ", ShapeString(dims),
                                                   ", expected [", format.rows, ", ", format.cols,
                                                   "] ([out, in] of the model's weight)"));
  }
  static constexpr absl::string_view kNestedKeys[] = {"nested_blocksize", "nested_dtype",
                                                      "nested_offset"};
  if (!format.nested) {
    for (absl::string_view k : kNestedKeys) {
      if (s.contains(std::string(k))) {
        return bad(absl::StrCat("\"", k, "\" without double quantization"));
      }
    }
    return out;
  }
  ASSIGN_OR_RETURN(const int64_t nested_blocksize, int_of("nested_blocksize"));
  if (nested_blocksize != kQuant4NestedBlockElems) {
    return bad(absl::StrCat("nested_blocksize ", nested_blocksize, ", expected ",
                            kQuant4NestedBlockElems, " (what quantize_4bit always uses)"));
  }
  ASSIGN_OR_RETURN(const std::string nested_dtype, string_of("nested_dtype"));
  if (nested_dtype != "float32") {
    return bad(absl::StrCat("nested_dtype \"", nested_dtype, "\", expected \"float32\""));
  }
  ASSIGN_OR_RETURN(const json* offset, require("nested_offset"));
  if (!offset->is_number() || !std::isfinite(offset->get<double>())) {
    return bad(
        absl::StrCat("nested_offset must be a finite number, got ", hf_json::Brief(*offset)));
  }
  // as_dict writes offset.item() of a float32 tensor: a double holding a float32 exactly.
  out.nested_offset = static_cast<float>(offset->get<double>());
  if (!std::isfinite(out.nested_offset)) {
    return bad(absl::StrCat("nested_offset ", offset->get<double>(), " overflows float32"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::optional<Quant4Config>> Quant4ConfigFromHfConfig(const json& config,
                                                                     absl::string_view path) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::optional<Quant4Config>();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json '", path, "': quantization_config must be an object, got ",
                     hf_json::TypeName(*it), " ", hf_json::Brief(*it)));
  }
  const ConfigReader r(*it, path);
  for (const auto& [key, value] : it->items()) {
    if (std::find(std::begin(kKnownConfigKeys), std::end(kKnownConfigKeys), key) ==
        std::end(kKnownConfigKeys)) {
      return r.Unimplemented(
          key, absl::StrCat("is not a key this reader knows (BitsAndBytesConfig of transformers "
                            "4.57 writes ",
                            absl::StrJoin(kKnownConfigKeys, ", "), ")"));
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> method, r.String("quant_method"));
  if (method.has_value() && *method != "bitsandbytes") {
    return r.Unimplemented(
        "quant_method",
        absl::StrCat("is \"", *method, "\"; only \"bitsandbytes\" 4-bit directories are read"));
  }
  ASSIGN_OR_RETURN(const bool load_in_8bit, r.Flag("load_in_8bit"));
  ASSIGN_OR_RETURN(const bool load_in_4bit, r.Flag("load_in_4bit"));
  if (load_in_8bit) {
    return r.Unimplemented(
        "load_in_8bit", "is true: 8-bit (LLM.int8) weights are not supported; only load_in_4bit");
  }
  if (!load_in_4bit) {
    return r.Invalid("load_in_4bit",
                     "is not true and neither is load_in_8bit: this quantization_config does not "
                     "say how the weights are stored");
  }
  Quant4Config out;
  ASSIGN_OR_RETURN(std::optional<std::string> type, r.String("bnb_4bit_quant_type"));
  if (type.has_value()) {
    absl::StatusOr<Quant4Type> parsed = ParseQuant4Type(*type);
    if (!parsed.ok()) {
      return r.Invalid("bnb_4bit_quant_type",
                       absl::StrCat("is \"", *type, "\": ", parsed.status().message()));
    }
    out.quant_type = *parsed;
  }
  ASSIGN_OR_RETURN(std::optional<bool> double_quant, r.Bool("bnb_4bit_use_double_quant"));
  out.double_quant = double_quant.value_or(false);
  ASSIGN_OR_RETURN(std::optional<std::string> compute, r.String("bnb_4bit_compute_dtype"));
  if (compute.has_value()) {
    if (*compute == "float32") {
      out.compute_dtype = DType::kF32;
    } else if (*compute == "bfloat16") {
      out.compute_dtype = DType::kBF16;
    } else if (*compute == "float16") {
      out.compute_dtype = DType::kF16;
    } else {
      return r.Invalid(
          "bnb_4bit_compute_dtype",
          absl::StrCat("is \"", *compute, "\"; expected \"float32\", \"bfloat16\" or \"float16\""));
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> storage, r.String("bnb_4bit_quant_storage"));
  if (storage.has_value() && *storage != "uint8") {
    return r.Unimplemented(
        "bnb_4bit_quant_storage",
        absl::StrCat("is \"", *storage, "\"; only \"uint8\" (the default) codes are read"));
  }
  if (const json* skip = r.Find("llm_int8_skip_modules"); skip != nullptr) {
    if (!skip->is_array()) {
      return r.Invalid(
          "llm_int8_skip_modules",
          absl::StrCat("must be a list of strings or null, got ", hf_json::Brief(*skip)));
    }
    for (const json& m : *skip) {
      if (!m.is_string()) {
        return r.Invalid("llm_int8_skip_modules",
                         absl::StrCat("entries must be strings, got ", hf_json::Brief(m)));
      }
      out.skip_modules.push_back(m.get<std::string>());
    }
  }
  // The 8-bit settings are ignored; their types are still checked, as transformers' post_init does.
  for (absl::string_view key : {"llm_int8_has_fp16_weight", "llm_int8_enable_fp32_cpu_offload"}) {
    RETURN_IF_ERROR(r.Bool(key).status());
  }
  if (const json* t = r.Find("llm_int8_threshold"); t != nullptr && !t->is_number()) {
    return r.Invalid("llm_int8_threshold",
                     absl::StrCat("must be a number, got ", hf_json::Brief(*t)));
  }
  return std::optional<Quant4Config>(std::move(out));
}

std::vector<std::string> Quant4StateKeys(absl::string_view weight, Quant4Type type, bool nested) {
  std::vector<std::string> keys = {absl::StrCat(weight, ".absmax"),
                                   absl::StrCat(weight, ".quant_map")};
  if (nested) {
    keys.push_back(absl::StrCat(weight, ".nested_absmax"));
    keys.push_back(absl::StrCat(weight, ".nested_quant_map"));
  }
  keys.push_back(absl::StrCat(weight, ".", kQuantStatePrefix, Quant4TypeName(type)));
  return keys;
}

bool IsQuant4StateTensorName(absl::string_view name) {
  for (absl::string_view suffix :
       {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
        ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"}) {
    if (name.size() > suffix.size() && absl::EndsWith(name, suffix)) return true;
  }
  return false;
}

std::vector<std::string> Quant4StateTensorNames(const ShardedSafetensors& weights) {
  std::vector<std::string> out;
  for (const std::string& name : weights.names()) {
    if (IsQuant4StateTensorName(name)) out.push_back(name);
  }
  return out;  // names() is sorted
}

absl::StatusOr<Quant4Imported> ImportQuant4Weight(const ShardedSafetensors& weights,
                                                  absl::string_view weight,
                                                  const Quant4Format& format,
                                                  absl::Span<uint8_t> blob) {
  const Quant4BlobLayout layout = Quant4BlobLayoutOf(format);
  if (static_cast<int64_t>(blob.size()) != layout.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("4-bit weight '", weight, "': blob of ",
                                                   blob.size(), " bytes, expected ", layout.bytes,
                                                   " (Quant4BlobLayoutOf)"));
  }
  if (format.rows <= 0 || format.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("4-bit weight '", weight, "': shape [", format.rows, ", ", format.cols, "]"));
  }
  const WeightReader reader(weights, weight, format);
  const std::string w(weight);
  const int64_t n = format.num_elems();
  const int64_t blocks = Quant4NumBlocks(n);
  const int64_t nested_blocks = Quant4NestedNumBlocks(blocks);
  const char* type_name = Quant4TypeName(format.type);
  const char* other_type =
      Quant4TypeName(format.type == Quant4Type::kNf4 ? Quant4Type::kFp4 : Quant4Type::kNf4);
  const std::string as_4bit =
      absl::StrCat("config.json's quantization_config makes it a 4-bit ", type_name, " weight",
                   format.nested ? " with bnb_4bit_use_double_quant" : "");

  // The state of the other type, or of the other absmax form, means the config and the tensors
  // disagree: say so rather than report a missing key.
  RETURN_IF_ERROR(
      reader.Absent(absl::StrCat(w, ".", kQuantStatePrefix, other_type),
                    absl::StrCat("config.json's bnb_4bit_quant_type is \"", type_name, "\"")));
  if (!format.nested) {
    for (absl::string_view s : {".nested_absmax", ".nested_quant_map"}) {
      RETURN_IF_ERROR(
          reader.Absent(absl::StrCat(w, s), "config.json's bnb_4bit_use_double_quant is false"));
    }
  }

  // The tensors, nested ones first (a missing one then names bnb_4bit_use_double_quant), then
  // the quant_state JSON.
  ASSIGN_OR_RETURN(const ShardedTensorRef codes,
                   reader.Need(w, "U8", {Quant4CodeBytes(n), 1}, as_4bit));
  const std::string nested_absmax_key = absl::StrCat(w, ".nested_absmax");
  const std::string nested_map_key = absl::StrCat(w, ".nested_quant_map");
  ShardedTensorRef nested_absmax, nested_map;
  if (format.nested) {
    ASSIGN_OR_RETURN(nested_absmax,
                     reader.Need(nested_absmax_key, "F32", {nested_blocks}, as_4bit));
    ASSIGN_OR_RETURN(nested_map, reader.Need(nested_map_key, "F32", {256}, as_4bit));
  }
  const std::string absmax_key = absl::StrCat(w, ".absmax");
  ASSIGN_OR_RETURN(const ShardedTensorRef absmax,
                   reader.Need(absmax_key, format.nested ? "U8" : "F32", {blocks}, as_4bit));
  const std::string map_key = absl::StrCat(w, ".quant_map");
  ASSIGN_OR_RETURN(const ShardedTensorRef quant_map, reader.Need(map_key, "F32", {16}, as_4bit));
  const std::string qs_key = absl::StrCat(w, ".", kQuantStatePrefix, type_name);
  ASSIGN_OR_RETURN(const ShardedTensorRef qs_ref, [&]() -> absl::StatusOr<ShardedTensorRef> {
    const ShardedTensorRef ref = weights.Find(qs_key);
    if (ref.info != nullptr && ref.info->dtype_name == "U8" && ref.info->shape.size() == 1) {
      return ref;  // any byte count
    }
    const int64_t len = ref.info != nullptr && !ref.info->shape.empty() ? ref.info->shape[0] : 0;
    return reader.Need(qs_key, "U8", {len}, as_4bit).status();
  }());
  ASSIGN_OR_RETURN(const QuantStateJson state, ReadQuantState(reader, qs_key, qs_ref, format));

  {
    const std::vector<float> map = reader.Floats(quant_map);
    const float* levels = Quant4Levels(format.type);
    for (int i = 0; i < 16; ++i) {
      // Values, not bits: FP4's entry 8 is +0.0 in bitsandbytes' quant_map, -0.0 in its kernel.
      if (!(map[i] == levels[i])) {
        return absl::DataLossError(absl::StrCat(
            reader.Where(map_key, quant_map), ": entry ", i, " is ", map[i], ", but bitsandbytes' ",
            type_name, " table has ", levels[i],
            "; a non-standard code book is refused (bitsandbytes' CUDA dequantization ignores "
            "quant_map and would decode the codes with the standard table)"));
      }
    }
  }

  std::memset(blob.data(), 0, blob.size());
  const absl::Span<const uint8_t> code_bytes = codes.file->Bytes(*codes.info);
  std::memcpy(blob.data() + layout.codes, code_bytes.data(), code_bytes.size());
  Quant4Imported out;
  out.source_dtype = state.source_dtype;
  if (!format.nested) {
    const std::vector<float> values = reader.Floats(absmax);
    RETURN_IF_ERROR(reader.CheckFinite(absmax_key, absmax, values, "absmax of block"));
    std::memcpy(blob.data() + layout.absmax, values.data(), values.size() * sizeof(float));
    return out;
  }
  {
    const std::vector<float> map = reader.Floats(nested_map);
    const float* dynamic = DynamicMap8();
    for (int i = 0; i < 256; ++i) {
      if (!(map[i] == dynamic[i])) {
        return absl::DataLossError(
            absl::StrCat(reader.Where(nested_map_key, nested_map), ": entry ", i, " is ", map[i],
                         ", but bitsandbytes' create_dynamic_map() has ", dynamic[i],
                         "; a non-standard code book for the nested absmax is refused"));
      }
    }
  }
  const std::vector<float> scales = reader.Floats(nested_absmax);
  RETURN_IF_ERROR(
      reader.CheckFinite(nested_absmax_key, nested_absmax, scales, "absmax of nested block"));
  std::memcpy(blob.data() + layout.nested_absmax, scales.data(), scales.size() * sizeof(float));
  const absl::Span<const uint8_t> nested_codes = absmax.file->Bytes(*absmax.info);
  std::memcpy(blob.data() + layout.nested_codes, nested_codes.data(), nested_codes.size());
  out.nested_offset = state.nested_offset;
  return out;
}

}  // namespace ps
