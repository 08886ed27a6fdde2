#include "model/quant4_config.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace ps {
namespace {

constexpr int64_t kBlobAlign = 16;
constexpr absl::string_view kPeftPrefix = "base_model.model.";

int64_t Align16(int64_t bytes) { return (bytes + kBlobAlign - 1) / kBlobAlign * kBlobAlign; }

// The Hugging Face full name of our module name (GPT-2: "transformer." + ours).
std::string HfModuleName(const ModelConfig& model, absl::string_view module) {
  std::string peft = PeftTensorName(model, module);
  absl::string_view name = peft;
  absl::ConsumePrefix(&name, kPeftPrefix);
  return std::string(name);
}

// transformers' _replace_with_bnb_linear (integrations/bitsandbytes.py, 4.57): a linear stays
// unconverted when its short name is listed, or an entry equals its full name, or entry + "."
// occurs in it.
bool Skipped(const ModelConfig& model, absl::string_view module,
             absl::Span<const std::string> skip) {
  const std::string full = HfModuleName(model, module);
  const size_t dot = full.rfind('.');
  const absl::string_view short_name =
      dot == std::string::npos ? absl::string_view(full) : absl::string_view(full).substr(dot + 1);
  for (const std::string& key : skip) {
    if (key == short_name || key == full || absl::StrContains(full, absl::StrCat(key, "."))) {
      return true;
    }
  }
  return false;
}

// Every block linear, as LoraTargets names them (all-linear; the LM head is never one).
std::vector<LoraTarget> BlockLinears(const ModelConfig& model) {
  LoraConfig all;
  all.r = 1;
  all.target_modules = {std::string(kLoraAllLinear)};
  return LoraTargets(model, all);
}

}  // namespace

absl::StatusOr<Quant4Type> ParseQuant4Type(absl::string_view name) {
  if (name == "nf4") return Quant4Type::kNf4;
  if (name == "fp4") return Quant4Type::kFp4;
  return absl::InvalidArgumentError(absl::StrCat(
      "bnb_4bit_quant_type \"", name, "\" is not a 4-bit type: use \"nf4\" or \"fp4\""));
}

absl::Status ValidateQuant4Config(const ModelConfig& model, const LoraConfig* lora,
                                  const Quant4Config& quant) {
  if (lora == nullptr) {
    return absl::FailedPreconditionError(
        "quantization.load_in_4bit needs a lora section: a 4-bit base is frozen and only LoRA "
        "adapters train on it (add \"lora\": {\"r\": 16, ...} or --lora_r=16, or drop "
        "load_in_4bit)");
  }
  for (const std::string& key : quant.skip_modules) {
    if (key.empty()) {
      return absl::InvalidArgumentError(
          "quantization.llm_int8_skip_modules has an empty entry: give module names such as "
          "\"down_proj\" or \"model.layers.0\"");
    }
  }
  const std::vector<std::string> saved_list = LoraSavedTensors(model, *lora);
  const absl::flat_hash_set<std::string> saved(saved_list.begin(), saved_list.end());
  for (const LoraTarget& t : BlockLinears(model)) {
    if (saved.contains(t.base_weight) && !Skipped(model, t.module, quant.skip_modules)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lora.modules_to_save trains ", HfModuleName(model, t.module),
          ", which load_in_4bit would store in 4 bits (a 4-bit weight cannot be trained): add \"",
          HfModuleName(model, t.module), "\" to quantization.llm_int8_skip_modules"));
    }
  }
  return absl::OkStatus();
}

Quant4BlobLayout Quant4BlobLayoutOf(const Quant4Format& f) {
  const int64_t n = f.num_elems();
  const int64_t blocks = Quant4NumBlocks(n);
  Quant4BlobLayout b;
  int64_t at = 0;
  if (f.nested) {
    b.nested_absmax = at;
    at = Align16(at + 4 * Quant4NestedNumBlocks(blocks));
    b.nested_codes = at;
    at = Align16(at + blocks);
  } else {
    b.absmax = at;
    at = Align16(at + 4 * blocks);
  }
  b.codes = at;
  b.bytes = Align16(at + Quant4CodeBytes(n));
  return b;
}

int64_t Quant4StoredElems(const Quant4Format& format, DType dtype) {
  const int64_t size = SizeOf(dtype);
  return (Quant4BlobLayoutOf(format).bytes + size - 1) / size;
}

int64_t Quant4AlignmentElems(DType dtype) { return kBlobAlign / SizeOf(dtype); }

Quant4Tensor Quant4TensorAt(const Quant4Format& format, const void* blob, float nested_offset) {
  const Quant4BlobLayout b = Quant4BlobLayoutOf(format);
  const auto* base = static_cast<const uint8_t*>(blob);
  Quant4Tensor t;
  t.type = format.type;
  t.num_elems = format.num_elems();
  t.codes = base + b.codes;
  if (format.nested) {
    t.nested_codes = base + b.nested_codes;
    t.nested_absmax = reinterpret_cast<const float*>(base + b.nested_absmax);
    t.nested_offset = nested_offset;
  } else {
    t.absmax = reinterpret_cast<const float*>(base + b.absmax);
  }
  return t;
}

absl::Status DequantizeQuant4Range(const Quant4Format& format, const Quant4Tensor& t,
                                   int64_t first_elem, absl::Span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  if (first_elem < 0 || first_elem + n > format.num_elems()) {
    return absl::InvalidArgumentError(absl::StrCat("4-bit weight: elements [", first_elem, ", ",
                                                   first_elem + n, ") are outside its ",
                                                   format.num_elems()));
  }
  if (!format.transposed) return Dequantize4Bit(t, first_elem, n, DType::kF32, out.data());
  // Logical element e = (i, o) of [in, out] is stored (o, i) of [out, in] (GPT-2's small
  // matrices: the whole weight is dequantized once per call).
  std::vector<float> all(static_cast<size_t>(format.num_elems()));
  RETURN_IF_ERROR(Dequantize4Bit(t, 0, format.num_elems(), DType::kF32, all.data()));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t e = first_elem + k;
    out[k] = all[(e % format.rows) * format.cols + e / format.rows];
  }
  return absl::OkStatus();
}

std::vector<Quant4Weight> Quant4Weights(const ModelConfig& model, const LoraConfig& lora,
                                        const Quant4Config& quant) {
  const std::vector<std::string> saved_list = LoraSavedTensors(model, lora);
  const absl::flat_hash_set<std::string> saved(saved_list.begin(), saved_list.end());
  std::vector<Quant4Weight> out;
  for (const LoraTarget& t : BlockLinears(model)) {
    if (saved.contains(t.base_weight) || Skipped(model, t.module, quant.skip_modules)) continue;
    out.push_back(Quant4Weight{t.base_weight,
                               Quant4Format{.type = quant.quant_type,
                                            .nested = quant.double_quant,
                                            .rows = t.out,
                                            .cols = t.in,
                                            .transposed = t.conv1d}});
  }
  return out;
}

std::vector<OperatorSpec> Quant4StoredOperators(std::vector<OperatorSpec> ops,
                                                absl::Span<const Quant4Weight> weights,
                                                DType dtype) {
  absl::flat_hash_map<absl::string_view, const Quant4Weight*> by_name;
  for (const Quant4Weight& w : weights) by_name[w.tensor] = &w;
  int64_t found = 0;
  for (OperatorSpec& op : ops) {
    for (TensorSpec& t : op.tensors) {
      const auto it = by_name.find(t.name);
      if (it == by_name.end()) continue;
      CHECK_EQ(t.numel(), it->second->format.num_elems()) << t.name;
      t.shape = {Quant4StoredElems(it->second->format, dtype)};
      ++found;
    }
  }
  CHECK_EQ(found, static_cast<int64_t>(weights.size()));
  return ops;
}

Quant4Totals Quant4TotalsOf(absl::Span<const Quant4Weight> weights, DType dtype) {
  Quant4Totals totals;
  for (const Quant4Weight& w : weights) {
    ++totals.weights;
    totals.values += w.format.num_elems();
    totals.stored_bytes += Quant4StoredElems(w.format, dtype) * SizeOf(dtype);
  }
  return totals;
}

}  // namespace ps
