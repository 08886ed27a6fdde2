#include "model/gpt2_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "model/finite_scan.h"

namespace ps {
namespace {

constexpr absl::string_view kLmHead = "lm_head.weight";
constexpr size_t kMaxListedProblems = 20;
constexpr int64_t kCompareBlockElems = int64_t{1} << 16;

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::string_view StripPrefix(absl::string_view name) {
  absl::ConsumePrefix(&name, kGpt2HfPrefix);
  return name;
}

// For "h.{i}.rest" returns i and sets *rest; nullopt otherwise (also for "h.01.x", "h.-1.x").
std::optional<int64_t> ParseBlockName(absl::string_view name, absl::string_view* rest) {
  if (!absl::ConsumePrefix(&name, "h.")) return std::nullopt;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot > 9) return std::nullopt;
  const absl::string_view digits = name.substr(0, dot);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  int64_t index;
  if (!absl::SimpleAtoi(digits, &index)) return std::nullopt;
  *rest = name.substr(dot + 1);
  return index;
}

// The file's tensor for HF name `name`: unprefixed first, then prefixed.
const SafetensorsTensorInfo* FindEither(const SafetensorsFile& file, absl::string_view name) {
  if (const SafetensorsTensorInfo* t = file.Find(name)) return t;
  return file.Find(absl::StrCat(kGpt2HfPrefix, name));
}

std::string JoinProblems(const std::vector<std::string>& problems) {
  std::string out;
  for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : "; ", problems[i]);
  }
  if (problems.size() > kMaxListedProblems) {
    absl::StrAppend(&out, "; ... and ", problems.size() - kMaxListedProblems, " more");
  }
  return out;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Gpt2Dims& dims) {
  return os << "{vocab_size=" << dims.vocab_size << ", max_positions=" << dims.max_positions
            << ", hidden=" << dims.hidden << ", num_layers=" << dims.num_layers << "}";
}

absl::Status ValidateGpt2Dims(const Gpt2Dims& dims) {
  const std::pair<const char*, int64_t> fields[] = {{"vocab_size", dims.vocab_size},
                                                    {"max_positions", dims.max_positions},
                                                    {"hidden", dims.hidden},
                                                    {"num_layers", dims.num_layers}};
  for (const auto& [field, value] : fields) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPT-2 dimension ", field, " must be >= 1, got ", value));
    }
  }
  constexpr int64_t kMaxLayers = int64_t{1} << 20;
  if (dims.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT-2 num_layers ", dims.num_layers, " exceeds the limit of ", kMaxLayers));
  }
  // Every tensor's f32 byte size must fit in int64: V*E*4, P*E*4 and (4E)*E*4.
  int64_t r;
  const bool overflow = dims.hidden > (int64_t{1} << 32) ||
                        __builtin_mul_overflow(dims.vocab_size, dims.hidden * int64_t{4}, &r) ||
                        __builtin_mul_overflow(dims.max_positions, dims.hidden * int64_t{4}, &r) ||
                        __builtin_mul_overflow(dims.hidden * int64_t{16}, dims.hidden, &r);
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 dimensions ", dims.vocab_size, "/",
                                                   dims.max_positions, "/", dims.hidden,
                                                   " (vocab_size/max_positions/hidden) are too "
                                                   "large: a tensor size overflows 64 bits"));
  }
  return absl::OkStatus();
}

std::vector<Gpt2TensorSpec> Gpt2TensorSpecs(const Gpt2Dims& dims) {
  const int64_t e = dims.hidden;
  std::vector<Gpt2TensorSpec> specs;
  specs.reserve(static_cast<size_t>(4 + 12 * dims.num_layers));
  specs.push_back({"wte.weight", {dims.vocab_size, e}});
  specs.push_back({"wpe.weight", {dims.max_positions, e}});
  for (int64_t i = 0; i < dims.num_layers; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    specs.push_back({p + "ln_1.weight", {e}});
    specs.push_back({p + "ln_1.bias", {e}});
    specs.push_back({p + "attn.c_attn.weight", {e, 3 * e}});
    specs.push_back({p + "attn.c_attn.bias", {3 * e}});
    specs.push_back({p + "attn.c_proj.weight", {e, e}});
    specs.push_back({p + "attn.c_proj.bias", {e}});
    specs.push_back({p + "ln_2.weight", {e}});
    specs.push_back({p + "ln_2.bias", {e}});
    specs.push_back({p + "mlp.c_fc.weight", {e, 4 * e}});
    specs.push_back({p + "mlp.c_fc.bias", {4 * e}});
    specs.push_back({p + "mlp.c_proj.weight", {4 * e, e}});
    specs.push_back({p + "mlp.c_proj.bias", {e}});
  }
  specs.push_back({"ln_f.weight", {e}});
  specs.push_back({"ln_f.bias", {e}});
  return specs;
}

absl::StatusOr<Gpt2Dims> InferGpt2Dims(const SafetensorsFile& file) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot infer GPT-2 dimensions from safetensors file '", file.path(), "': ", what));
  };
  const SafetensorsTensorInfo* wte = FindEither(file, "wte.weight");
  const SafetensorsTensorInfo* wpe = FindEither(file, "wpe.weight");
  if (wte == nullptr)
    return error("tensor wte.weight is missing (with or without \"transformer.\")");
  if (wpe == nullptr)
    return error("tensor wpe.weight is missing (with or without \"transformer.\")");
  if (wte->shape.size() != 2) {
    return error(absl::StrCat("tensor '", wte->name, "' has shape ", ShapeString(wte->shape),
                              ", expected [vocab_size, hidden]"));
  }
  if (wpe->shape.size() != 2 || wpe->shape[1] != wte->shape[1]) {
    return error(absl::StrCat("tensor '", wpe->name, "' has shape ", ShapeString(wpe->shape),
                              ", expected [max_positions, ", wte->shape[1], "]"));
  }
  int64_t max_block = -1;
  for (const SafetensorsTensorInfo& t : file.tensors()) {
    absl::string_view rest;
    if (const std::optional<int64_t> i = ParseBlockName(StripPrefix(t.name), &rest)) {
      max_block = std::max(max_block, *i);
    }
  }
  if (max_block < 0) return error("no transformer block tensors (h.{i}.*) found");
  // A complete file has 12 tensors per block: a higher index means a corrupt or foreign file.
  if (max_block >= static_cast<int64_t>(file.tensors().size())) {
    return error(absl::StrCat("block index h.", max_block, " is impossible in a file of ",
                              file.tensors().size(), " tensors"));
  }
  return Gpt2Dims{.vocab_size = wte->shape[0],
                  .max_positions = wpe->shape[0],
                  .hidden = wte->shape[1],
                  .num_layers = max_block + 1};
}

absl::StatusOr<Gpt2Checkpoint> Gpt2Checkpoint::Open(const std::string& path,
                                                    std::optional<Gpt2Dims> expected) {
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  return Load(std::move(file), expected);
}

absl::StatusOr<Gpt2Checkpoint> Gpt2Checkpoint::Load(SafetensorsFile file,
                                                    std::optional<Gpt2Dims> expected) {
  Gpt2Dims dims;
  if (expected.has_value()) {
    dims = *expected;
  } else {
    ASSIGN_OR_RETURN(dims, InferGpt2Dims(file));
  }
  RETURN_IF_ERROR(ValidateGpt2Dims(dims));

  Gpt2Checkpoint ckpt(std::move(file));
  const SafetensorsFile& f = ckpt.file_;
  ckpt.dims_ = dims;
  ckpt.specs_ = Gpt2TensorSpecs(dims);
  absl::flat_hash_map<absl::string_view, const Gpt2TensorSpec*> by_name;
  for (const Gpt2TensorSpec& s : ckpt.specs_) by_name.emplace(s.name, &s);

  // Map the file's names onto the expected ones.
  std::vector<std::string> missing, unexpected, duplicated, wrong_shape, wrong_dtype;
  const SafetensorsTensorInfo* lm_head = nullptr;
  for (const SafetensorsTensorInfo& t : f.tensors()) {
    if (t.name == kLmHead) {
      lm_head = &t;
      continue;
    }
    const absl::string_view hf_name = StripPrefix(t.name);
    absl::string_view rest;
    const std::optional<int64_t> block = ParseBlockName(hf_name, &rest);
    if (block.has_value() && *block < dims.num_layers &&
        (rest == "attn.bias" || rest == "attn.masked_bias")) {
      continue;  // attention-mask buffers, not parameters
    }
    if (!by_name.contains(hf_name)) {
      unexpected.push_back(absl::StrCat("'", t.name, "'"));
      continue;
    }
    const auto [prev, inserted] = ckpt.file_names_.emplace(std::string(hf_name), t.name);
    if (!inserted) {
      duplicated.push_back(absl::StrCat(hf_name, " is present twice, as '", prev->second,
                                        "' and as '", t.name, "'"));
    }
  }
  // Check them in model order, so the first problems listed are the first tensors.
  const std::vector<int64_t> wte_shape = {dims.vocab_size, dims.hidden};
  auto check = [&](const SafetensorsTensorInfo& t, const std::vector<int64_t>& shape) {
    if (t.shape != shape) {
      wrong_shape.push_back(absl::StrCat("'", t.name, "' has shape ", ShapeString(t.shape),
                                         ", expected ", ShapeString(shape)));
    }
    if (!t.dtype.has_value()) {
      wrong_dtype.push_back(absl::StrCat("'", t.name, "' has dtype ", t.dtype_name));
    }
  };
  for (const Gpt2TensorSpec& s : ckpt.specs_) {
    const auto it = ckpt.file_names_.find(s.name);
    if (it == ckpt.file_names_.end()) {
      missing.push_back(s.name);
    } else {
      check(*f.Find(it->second), s.shape);
    }
  }
  if (lm_head != nullptr) check(*lm_head, wte_shape);

  std::vector<std::string> problems;
  auto add_group = [&](const std::vector<std::string>& items, absl::string_view what) {
    if (!items.empty()) {
      problems.push_back(absl::StrCat(items.size(), " ", what, ": ", JoinProblems(items)));
    }
  };
  add_group(missing, "missing tensor(s)");
  add_group(unexpected, "unexpected tensor(s)");
  add_group(duplicated, "duplicated tensor(s)");
  add_group(wrong_shape, "tensor(s) of the wrong shape");
  add_group(wrong_dtype, "tensor(s) of an unsupported dtype (supported: F32, F16, BF16)");
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", f.path(), "' is not a GPT-2 checkpoint with dimensions ",
                     dims.vocab_size, "/", dims.max_positions, "/", dims.hidden, "/",
                     dims.num_layers, " (vocab_size/max_positions/hidden/num_layers",
                     expected.has_value() ? "" : ", inferred from wte, wpe and h.{i}",
                     "): ", absl::StrJoin(problems, "; ")));
  }

  // Every value must be finite: one pass over the stored bits (model/finite_scan.h), before any
  // of them is loaded. (A present lm_head.weight is compared with wte below, so it is covered.)
  const std::string where = absl::StrCat("safetensors file '", f.path(), "'");
  for (const Gpt2TensorSpec& s : ckpt.specs_) {
    const SafetensorsTensorInfo& t = *f.Find(ckpt.file_names_.at(s.name));
    RETURN_IF_ERROR(
        CheckTensorFinite(where, t.name, *t.dtype, t.shape, f.Bytes(t).data(), t.num_elements));
  }

  if (lm_head != nullptr) {
    // The head is tied: it must equal wte bit for bit after conversion to f32. Compare in
    // blocks so that large vocabularies need no full f32 copies.
    const std::string& wte_name = ckpt.file_names_.at("wte.weight");
    const int64_t n = dims.vocab_size * dims.hidden;
    std::vector<float> a(static_cast<size_t>(std::min(n, kCompareBlockElems)));
    std::vector<float> b(a.size());
    for (int64_t first = 0; first < n; first += kCompareBlockElems) {
      const int64_t count = std::min(kCompareBlockElems, n - first);
      const auto sa = absl::MakeSpan(a.data(), static_cast<size_t>(count));
      const auto sb = absl::MakeSpan(b.data(), static_cast<size_t>(count));
      RETURN_IF_ERROR(f.ReadAsF32(wte_name, first, sa));
      RETURN_IF_ERROR(f.ReadAsF32(kLmHead, first, sb));
      for (int64_t k = 0; k < count; ++k) {
        if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0) {
          const int64_t e = first + k;
          return absl::InvalidArgumentError(absl::StrCat(
              "safetensors file '", f.path(), "': lm_head.weight differs from '", wte_name,
              "' at [", e / dims.hidden, ", ", e % dims.hidden, "] (", b[k], " vs ", a[k],
              "); this GPT-2 ties the LM head to the token embedding, so a checkpoint with an "
              "untied head cannot be loaded"));
        }
      }
    }
    ckpt.had_lm_head_ = true;
  }
  return ckpt;
}

const SafetensorsTensorInfo* Gpt2Checkpoint::Find(absl::string_view name) const {
  const auto it = file_names_.find(name);
  return it == file_names_.end() ? nullptr : file_.Find(it->second);
}

absl::Status Gpt2Checkpoint::ReadF32(absl::string_view name, absl::Span<float> out) const {
  const auto it = file_names_.find(name);
  if (it == file_names_.end()) {
    return absl::NotFoundError(absl::StrCat("'", name, "' is not a GPT-2 tensor of checkpoint '",
                                            file_.path(), "' (use names without \"", kGpt2HfPrefix,
                                            "\", e.g. h.0.attn.c_attn.weight)"));
  }
  return file_.ReadAsF32(it->second, out);
}

absl::Status Gpt2Checkpoint::ReadF32(absl::string_view name, int64_t first_elem,
                                     absl::Span<float> out) const {
  const auto it = file_names_.find(name);
  if (it == file_names_.end()) {
    return absl::NotFoundError(
        absl::StrCat("'", name, "' is not a GPT-2 tensor of checkpoint '", file_.path(), "'"));
  }
  return file_.ReadAsF32(it->second, first_elem, out);
}

absl::StatusOr<std::vector<float>> Gpt2Checkpoint::ReadF32(absl::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  std::vector<float> out(info == nullptr ? 0 : static_cast<size_t>(info->num_elements));
  RETURN_IF_ERROR(ReadF32(name, absl::MakeSpan(out)));
  return out;
}

absl::Status WriteGpt2Safetensors(const std::string& path, const Gpt2Dims& dims, DType dtype,
                                  const Gpt2FillFn& fill,
                                  const std::map<std::string, std::string>& metadata) {
  RETURN_IF_ERROR(ValidateGpt2Dims(dims));
  const std::vector<Gpt2TensorSpec> gpt2_specs = Gpt2TensorSpecs(dims);
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(gpt2_specs.size());
  for (const Gpt2TensorSpec& s : gpt2_specs) specs.push_back({s.name, dtype, s.shape});
  std::map<std::string, std::string> all_metadata = {{"format", "pt"}};
  for (const auto& [key, value] : metadata) all_metadata[key] = value;

  std::vector<float> staging;
  return WriteSafetensors(
      path, specs, all_metadata, [&](size_t index, absl::Span<uint8_t> dst) -> absl::Status {
        const SafetensorsTensorSpec& spec = specs[index];
        const size_t n = dst.size() / static_cast<size_t>(SizeOf(dtype));
        if (dtype == DType::kF32) {
          // dst is aligned to the element size (WriteSafetensors' contract).
          return fill(spec.name, absl::MakeSpan(reinterpret_cast<float*>(dst.data()), n));
        }
        staging.resize(n);
        RETURN_IF_ERROR(fill(spec.name, absl::MakeSpan(staging)));
        return Convert(DType::kF32, staging.data(), dtype, dst.data(), static_cast<int64_t>(n));
      });
}

}  // namespace ps
