#include "model/hf_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "memory/convert.h"
#include "model/atomic_directory.h"
#include "model/finite_scan.h"
#include "model/hf_config.h"
#include "model/hf_json.h"
#include "model/lora_config.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

constexpr absl::string_view kGpt2Prefix = "transformer.";

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

// Consumes a run of decimal digits at the front of `s`.
bool ConsumeDigits(absl::string_view& s) {
  size_t n = 0;
  while (n < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[n]))) ++n;
  if (n == 0) return false;
  s.remove_prefix(n);
  return true;
}

// "<prefix><digits><suffix>" exactly.
bool MatchesIndexed(absl::string_view name, absl::string_view prefix, absl::string_view suffix) {
  if (!absl::ConsumePrefix(&name, prefix)) return false;
  if (!ConsumeDigits(name)) return false;
  return name == suffix;
}

// Non-parameter tensors that files of the family may carry (see the header).
bool IsIgnorableBuffer(const ModelConfig& c, absl::string_view name) {
  if (c.architecture() == ModelArchitecture::kLlama) {
    return MatchesIndexed(name, "model.layers.", ".self_attn.rotary_emb.inv_freq");
  }
  absl::ConsumePrefix(&name, kGpt2Prefix);
  return MatchesIndexed(name, "h.", ".attn.bias") ||
         MatchesIndexed(name, "h.", ".attn.masked_bias");
}

std::string EmbeddingName(const ModelConfig& c) {
  return c.architecture() == ModelArchitecture::kGpt2 ? "wte.weight" : "model.embed_tokens.weight";
}

// "a, b, c and 4 more".
std::string ListSome(const std::vector<std::string>& items) {
  constexpr size_t kShown = 8;
  if (items.size() <= kShown) return absl::StrJoin(items, ", ");
  return absl::StrCat(absl::StrJoin(items.begin(), items.begin() + kShown, ", "), " and ",
                      items.size() - kShown, " more");
}

// Whether two tensors hold the same values (as f32), comparing piecewise.
absl::StatusOr<bool> SameValues(const ShardedSafetensors& w, const std::string& a,
                                const std::string& b, int64_t numel) {
  constexpr int64_t kPiece = int64_t{1} << 16;
  std::vector<float> x(static_cast<size_t>(std::min(numel, kPiece)));
  std::vector<float> y(x.size());
  for (int64_t first = 0; first < numel; first += kPiece) {
    const int64_t n = std::min(kPiece, numel - first);
    RETURN_IF_ERROR(w.ReadAsF32(a, first, absl::MakeSpan(x.data(), static_cast<size_t>(n))));
    RETURN_IF_ERROR(w.ReadAsF32(b, first, absl::MakeSpan(y.data(), static_cast<size_t>(n))));
    if (std::memcmp(x.data(), y.data(), static_cast<size_t>(n) * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

// Appends the contents of file `source` to `fd`.
absl::Status CopyInto(const std::string& source, int fd, const std::string& fd_path) {
  const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoError(errno, "cannot open extra file", source);
  absl::Cleanup close_in = [in] { ::close(in); };
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read extra file", source);
    }
    if (n == 0) return absl::OkStatus();
    RETURN_IF_ERROR(WriteAll(fd, buffer.data(), static_cast<size_t>(n), fd_path));
  }
}

int64_t Elems(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// One tensor of the files an export writes: its name and shape, and the parameters (indices into
// HfParameterSpecs) it holds, in row order: one, or the parts of a fused tensor.
struct FileTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<size_t> parts;
};

std::vector<FileTensor> FileTensorsOf(const ModelConfig& config,
                                      const std::vector<TensorSpec>& params) {
  std::vector<FileTensor> files;
  absl::flat_hash_map<std::string, size_t> fused;  // file tensor -> index in files
  for (size_t i = 0; i < params.size(); ++i) {
    const std::optional<HfFileSlice> slice = HfFileSliceOf(config, params[i].name);
    if (!slice.has_value()) {
      files.push_back({params[i].name, params[i].shape, {i}});
      continue;
    }
    const auto [it, inserted] = fused.emplace(slice->file_tensor, files.size());
    if (inserted) files.push_back({slice->file_tensor, slice->file_shape, {}});
    files[it->second].parts.push_back(i);  // parameters come in row order (ModelOperators)
  }
  return files;
}

}  // namespace

std::vector<TensorSpec> HfParameterSpecs(const ModelConfig& config) {
  std::vector<TensorSpec> specs;
  for (OperatorSpec& op : ModelOperators(config)) {
    for (TensorSpec& t : op.tensors) specs.push_back(std::move(t));
  }
  return specs;
}

std::optional<HfFileSlice> HfFileSliceOf(const ModelConfig& c, absl::string_view name) {
  if (c.family != ModelFamily::kPhi3) return std::nullopt;
  const int64_t e = c.hidden_size, q = c.q_size(), k = c.kv_size(), i = c.intermediate_size;
  struct Part {
    const char* suffix;
    const char* fused;
    int64_t first_row;
    int64_t rows;
  };
  const Part parts[] = {{"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, q + 2 * k},
                        {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", q, q + 2 * k},
                        {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", q + k, q + 2 * k},
                        {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, 2 * i},
                        {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", i, 2 * i}};
  if (!absl::StartsWith(name, "model.layers.")) return std::nullopt;
  for (const Part& p : parts) {
    absl::string_view prefix = name;
    if (!absl::ConsumeSuffix(&prefix, p.suffix)) continue;
    return HfFileSlice{absl::StrCat(prefix, p.fused), {p.rows, e}, p.first_row * e};
  }
  return std::nullopt;
}

bool IsHfCheckpointFileName(absl::string_view name) {
  if (name == kHfConfigFileName || name == kSafetensorsSingleFileName ||
      name == kSafetensorsIndexFileName) {
    return true;
  }
  // model-NNNNN-of-NNNNN.safetensors
  if (!absl::ConsumePrefix(&name, "model-") || !ConsumeDigits(name) ||
      !absl::ConsumePrefix(&name, "-of-") || !ConsumeDigits(name)) {
    return false;
  }
  return name == ".safetensors";
}

absl::StatusOr<HfCheckpoint> HfCheckpoint::Open(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoError(errno, "cannot open model directory", dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model directory '", dir, "' is not a directory"));
  }
  const std::string config_path = JoinPath(dir, kHfConfigFileName);
  absl::StatusOr<std::string> text = hf_json::ReadTextFile(config_path, "Hugging Face config");
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", dir, "' has no ", kHfConfigFileName));
  }
  RETURN_IF_ERROR(text.status());
  ASSIGN_OR_RETURN(ModelConfig config, ParseHfConfig(*text, config_path));
  const bool fuses = HfFileSliceOf(config, "model.layers.0.self_attn.q_proj.weight").has_value();
  ASSIGN_OR_RETURN(ShardedSafetensors weights, ShardedSafetensors::OpenDirectory(dir));
  ASSIGN_OR_RETURN(const nlohmann::json config_object, hf_json::ParseObject(*text, "Hugging Face config", config_path,
                                                       absl::StatusCode::kInvalidArgument));
  ASSIGN_OR_RETURN(std::optional<Quant4Config> quant4,
                   Quant4ConfigFromHfConfig(config_object, config_path));

  HfCheckpoint ckpt(dir, std::move(weights));
  if (quant4.has_value() && fuses) {
    return absl::UnimplementedError(absl::StrCat(
        "model directory '", dir, "': a pre-quantized ", ModelFamilyName(config.family),
        " directory (config.json's quantization_config) is not supported: its 4-bit codes "
        "quantize the fused qkv_proj / gate_up_proj whole; load the 16-bit directory and set "
        "quantization in the run instead"));
  }
  if (quant4.has_value()) {
    // The storage of a pre-quantized directory: which block linears are 4-bit (every one its
    // skip list keeps out), whatever compute dtype it names.
    Quant4Config storage = *quant4;
    storage.compute_dtype = DType::kF32;
    LoraConfig all_linear;
    all_linear.r = 1;
    all_linear.target_modules = {std::string(kLoraAllLinear)};
    for (const Quant4Weight& q : Quant4Weights(config, all_linear, storage)) {
      ckpt.quant4_formats_.emplace(q.tensor, q.format);
    }
    ckpt.quant4_ = std::move(quant4);
  }
  ckpt.config_ = std::move(config);
  ckpt.config_json_ = *std::move(text);
  ckpt.parameters_ = HfParameterSpecs(ckpt.config_);
  const ModelConfig& c = ckpt.config_;
  const ShardedSafetensors& w = ckpt.weights_;
  const bool gpt2 = c.architecture() == ModelArchitecture::kGpt2;

  std::vector<std::string> missing, duplicated, misshapen, unexpected;
  absl::flat_hash_set<std::string> used;  // file names accounted for
  for (const TensorSpec& p : ckpt.parameters_) {
    if (const std::optional<HfFileSlice> slice = HfFileSliceOf(c, p.name); slice.has_value()) {
      // Rows of a fused file tensor: its shape is checked (once) instead of the part's.
      const SafetensorsTensorInfo* info = w.Find(slice->file_tensor).info;
      const bool first = used.insert(slice->file_tensor).second;
      if (info == nullptr) {
        if (first) missing.push_back(slice->file_tensor);
        continue;
      }
      if (info->shape != slice->file_shape) {
        if (first) {
          misshapen.push_back(absl::StrCat(slice->file_tensor, " ", ShapeString(info->shape),
                                           " (expected ", ShapeString(slice->file_shape), ")"));
        }
        continue;
      }
      if (!info->dtype.has_value()) {
        return absl::UnimplementedError(absl::StrCat(
            "model directory '", dir, "': tensor '", slice->file_tensor, "' is stored as ",
            info->dtype_name, "; only F32, F16 and BF16 parameters are supported"));
      }
      ckpt.file_names_.emplace(p.name, slice->file_tensor);
      ckpt.fused_first_.emplace(p.name, std::make_pair(slice->first_elem, Elems(p.shape)));
      continue;
    }
    std::vector<std::string> candidates = {p.name};
    if (gpt2) candidates.push_back(absl::StrCat(kGpt2Prefix, p.name));
    std::vector<std::string> present;
    for (const std::string& name : candidates) {
      if (w.Find(name).info != nullptr) present.push_back(name);
    }
    if (present.empty()) {
      missing.push_back(p.name);
      continue;
    }
    if (present.size() > 1) {
      duplicated.push_back(absl::StrCat(present[0], " and ", present[1]));
      continue;
    }
    const SafetensorsTensorInfo* info = w.Find(present[0]).info;
    used.insert(present[0]);
    ckpt.file_names_.emplace(p.name, present[0]);
    if (const auto q = ckpt.quant4_formats_.find(p.name); q != ckpt.quant4_formats_.end()) {
      // A 4-bit weight: its packed codes, and its state tensors beside it.
      const std::vector<int64_t> codes = {Quant4CodeBytes(q->second.num_elems()), 1};
      if (info->shape != codes || info->dtype_name != "U8") {
        misshapen.push_back(absl::StrCat(present[0], " ", info->dtype_name, " ",
                                         ShapeString(info->shape), " (expected the U8 ",
                                         ShapeString(codes), " codes of a 4-bit weight)"));
      }
      for (const std::string& key :
           Quant4StateKeys(present[0], q->second.type, q->second.nested)) {
        if (w.Find(key).info == nullptr) {
          missing.push_back(key);
        } else {
          used.insert(key);
        }
      }
      continue;
    }
    if (info->shape != p.shape) {
      misshapen.push_back(absl::StrCat(present[0], " ", ShapeString(info->shape), " (expected ",
                                       ShapeString(p.shape), ")"));
      continue;
    }
    if (!info->dtype.has_value()) {
      return absl::UnimplementedError(
          absl::StrCat("model directory '", dir, "': tensor '", present[0], "' is stored as ",
                       info->dtype_name, "; only F32, F16 and BF16 parameters are supported"));
    }
  }
  // A tied model's lm_head.weight, if present, must be the embedding.
  const std::string embed = EmbeddingName(c);
  for (const std::string& head :
       {std::string("lm_head.weight"), gpt2 ? absl::StrCat(kGpt2Prefix, "lm_head.weight") : ""}) {
    if (head.empty() || !c.tie_word_embeddings || w.Find(head).info == nullptr) continue;
    used.insert(head);
    const auto embed_file = ckpt.file_names_.find(embed);
    if (embed_file == ckpt.file_names_.end()) continue;  // reported as missing
    const SafetensorsTensorInfo* h = w.Find(head).info;
    const SafetensorsTensorInfo* e = w.Find(embed_file->second).info;
    bool same = false;
    if (h->shape == e->shape && h->dtype.has_value() && e->dtype.has_value()) {
      ASSIGN_OR_RETURN(same, SameValues(w, head, embed_file->second, e->num_elements));
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model directory '", dir, "': config.json says tie_word_embeddings is true, but '", head,
          "' differs from '", embed_file->second,
          "'; an untied head needs tie_word_embeddings false"));
    }
    ckpt.had_tied_lm_head_ = true;
  }
  for (const std::string& name : w.names()) {
    if (!used.contains(name) && !IsIgnorableBuffer(c, name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !duplicated.empty() || !misshapen.empty() || !unexpected.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back(absl::StrCat("missing: ", ListSome(missing)));
    if (!duplicated.empty()) {
      parts.push_back(absl::StrCat("present twice (with and without \"transformer.\"): ",
                                   ListSome(duplicated)));
    }
    if (!misshapen.empty()) parts.push_back(absl::StrCat("wrong shape: ", ListSome(misshapen)));
    if (!unexpected.empty()) {
      parts.push_back(absl::StrCat("not parameters of this ", ModelFamilyName(c.family),
                                   " configuration: ", ListSome(unexpected)));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "model directory '", dir, "': the weights do not match config.json (",
        ModelFamilyName(c.family), ", ", c.num_layers, " layers, hidden ", c.hidden_size,
        ", vocab ", c.vocab_size, c.tie_word_embeddings ? ", tied" : ", untied",
        " LM head): ", absl::StrJoin(parts, "; ")));
  }
  // Every parameter's values must be finite: one pass over the stored bits of each
  // (model/finite_scan.h). A tied lm_head.weight equals the embedding (checked above).
  absl::flat_hash_set<std::string> scanned;  // a fused tensor once
  for (const TensorSpec& p : ckpt.parameters_) {
    if (ckpt.quant4_formats_.contains(p.name)) continue;  // ImportQuant4Weight checks its scales
    if (!scanned.insert(ckpt.file_names_.at(p.name)).second) continue;
    const ShardedTensorRef ref = w.Find(ckpt.file_names_.at(p.name));
    RETURN_IF_ERROR(
        CheckTensorFinite(absl::StrCat("model directory '", dir, "' (", ref.file->path(), ")"),
                          ref.info->name, *ref.info->dtype, ref.info->shape,
                          ref.file->Bytes(*ref.info).data(), ref.info->num_elements));
  }
  return ckpt;
}

const SafetensorsTensorInfo* HfCheckpoint::Find(absl::string_view name) const {
  const auto it = file_names_.find(name);
  if (it == file_names_.end() || fused_first_.contains(name)) return nullptr;
  return weights_.Find(it->second).info;
}

absl::StatusOr<SafetensorsTensorView> HfCheckpoint::Get(absl::string_view name) const {
  const auto it = file_names_.find(name);
  if (it == file_names_.end() || fused_first_.contains(name)) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", dir_, "': '", name, "' is not a parameter"));
  }
  return weights_.Get(it->second);
}

absl::Status HfCheckpoint::ReadAsF32(absl::string_view name, int64_t first_elem,
                                     absl::Span<float> out) const {
  const auto it = file_names_.find(name);
  if (it == file_names_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", dir_, "': '", name, "' is not a parameter"));
  }
  if (const Quant4Format* q = Quant4Of(name)) {
    std::vector<uint8_t> blob(static_cast<size_t>(Quant4BlobLayoutOf(*q).bytes));
    ASSIGN_OR_RETURN(const Quant4Imported imported, ImportQuant4(name, absl::MakeSpan(blob)));
    return DequantizeQuant4Range(*q, Quant4TensorAt(*q, blob.data(), imported.nested_offset),
                                 first_elem, out);
  }
  int64_t offset = 0;
  if (const auto f = fused_first_.find(name); f != fused_first_.end()) {
    // Rows of a fused tensor: the range must stay inside the part.
    const int64_t n = f->second.second;
    if (first_elem < 0 || first_elem + static_cast<int64_t>(out.size()) > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("model directory '", dir_, "': elements [", first_elem, ", ",
                       first_elem + static_cast<int64_t>(out.size()), ") are outside '", name,
                       "' (", n, " elements, rows of '", it->second, "')"));
    }
    offset = f->second.first;
  }
  return weights_.ReadAsF32(it->second, offset + first_elem, out);
}

const Quant4Format* HfCheckpoint::Quant4Of(absl::string_view name) const {
  const auto it = quant4_formats_.find(name);
  return it == quant4_formats_.end() ? nullptr : &it->second;
}

absl::StatusOr<Quant4Imported> HfCheckpoint::ImportQuant4(absl::string_view name,
                                                          absl::Span<uint8_t> blob) const {
  const Quant4Format* q = Quant4Of(name);
  if (q == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", dir_, "': '", name, "' is not a 4-bit weight"));
  }
  return ImportQuant4Weight(weights_, file_names_.at(name), *q, blob);
}

HfExportFillFn ConvertingFill(HfExportF32FillFn f32_fill, DType dtype) {
  return [f32_fill = std::move(f32_fill), dtype, buffer = std::vector<float>()](
             const TensorSpec& tensor, int64_t first_elem,
             absl::Span<uint8_t> dst) mutable -> absl::Status {
    const int64_t n = static_cast<int64_t>(dst.size()) / SizeOf(dtype);
    if (dtype == DType::kF32) {
      // The writer's buffer is aligned for any element type.
      return f32_fill(tensor, first_elem,
                      absl::MakeSpan(reinterpret_cast<float*>(dst.data()), static_cast<size_t>(n)));
    }
    buffer.resize(static_cast<size_t>(n));
    RETURN_IF_ERROR(f32_fill(tensor, first_elem, absl::MakeSpan(buffer)));
    return Convert(DType::kF32, buffer.data(), dtype, dst.data(), n);
  };
}

HfExportFillFn FillFromCheckpoint(const HfCheckpoint& source, DType dtype) {
  return [&source, dtype, buffer = std::vector<uint8_t>()](
             const TensorSpec& tensor, int64_t first_elem,
             absl::Span<uint8_t> dst) mutable -> absl::Status {
    const int64_t n = static_cast<int64_t>(dst.size()) / SizeOf(dtype);
    if (source.Quant4Of(tensor.name) != nullptr || source.Find(tensor.name) == nullptr) {
      // A 4-bit weight of a pre-quantized directory (its dequantized values), or rows of a
      // fused tensor.
      std::vector<float> values(static_cast<size_t>(n));
      RETURN_IF_ERROR(source.ReadAsF32(tensor.name, first_elem, absl::MakeSpan(values)));
      return Convert(DType::kF32, values.data(), dtype, dst.data(), n);
    }
    ASSIGN_OR_RETURN(const SafetensorsTensorView view, source.Get(tensor.name));
    if (view.info->num_elements < first_elem + n || view.info->shape != tensor.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor.name, "' of '", source.dir(), "' has shape ",
                       ShapeString(view.info->shape), ", not ", ShapeString(tensor.shape)));
    }
    const int64_t src_size = SizeOf(view.dtype);
    const uint8_t* src = view.bytes.data() + first_elem * src_size;
    if (view.dtype == dtype) {
      std::memcpy(dst.data(), src, dst.size());
      return absl::OkStatus();
    }
    // Through an aligned copy: files from other writers may hold tensors at odd offsets.
    buffer.resize(static_cast<size_t>(n * src_size));
    std::memcpy(buffer.data(), src, buffer.size());
    return Convert(view.dtype, buffer.data(), dtype, dst.data(), n);
  };
}

absl::Status WriteHfCheckpoint(const std::string& dir, const ModelConfig& config, DType dtype,
                               const HfExportFillFn& fill, const HfExportOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  if (options.max_shard_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HfExportOptions.max_shard_bytes must be positive, got ", options.max_shard_bytes));
  }
  if (options.max_piece_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HfExportOptions.max_piece_bytes must be positive, got ", options.max_piece_bytes));
  }
  std::vector<std::pair<std::string, std::string>> extra;  // (source, base name)
  for (const std::string& path : options.extra_files) {
    const size_t slash = path.rfind('/');
    std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    if (base.empty() || base == "." || base == ".." || IsHfCheckpointFileName(base)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HfExportOptions.extra_files: '", path,
          "' cannot be copied into a model directory under that name (config.json and the "
          "weight files are written by the export itself)"));
    }
    for (const auto& [other, other_base] : extra) {
      if (other_base == base) {
        return absl::InvalidArgumentError(absl::StrCat(
            "HfExportOptions.extra_files: '", path, "' and '", other, "' have the same file name"));
      }
    }
    extra.emplace_back(path, std::move(base));
  }
  ASSIGN_OR_RETURN(
      const std::string config_json,
      HfConfigJson(config, {.torch_dtype = dtype, .base_json = options.base_config_json}));
  const std::vector<TensorSpec> params = HfParameterSpecs(config);
  const std::vector<FileTensor> files = FileTensorsOf(config, params);
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(files.size());
  for (const FileTensor& f : files) specs.push_back({f.name, dtype, f.shape});
  // Elements [first_elem, first_elem + n) of file tensor `index`, from the parts they span.
  auto fill_file = [&](size_t index, int64_t first_elem, absl::Span<uint8_t> dst) {
    const FileTensor& f = files[index];
    if (f.parts.size() == 1) return fill(params[f.parts[0]], first_elem, dst);
    const int64_t size = SizeOf(dtype);
    const int64_t end = first_elem + static_cast<int64_t>(dst.size()) / size;
    int64_t part_first = 0;
    for (const size_t part : f.parts) {
      const int64_t part_end = part_first + Elems(params[part].shape);
      const int64_t lo = std::max(first_elem, part_first), hi = std::min(end, part_end);
      if (lo < hi) {
        RETURN_IF_ERROR(fill(params[part], lo - part_first,
                             dst.subspan(static_cast<size_t>((lo - first_elem) * size),
                                         static_cast<size_t>((hi - lo) * size))));
      }
      part_first = part_end;
    }
    return absl::OkStatus();
  };

  DirectoryReplaceOptions replace;
  replace.marker_file = std::string(kHfConfigFileName);
  replace.is_replaced = [](absl::string_view name) { return IsHfCheckpointFileName(name); };
  return ReplaceDirectoryAtomically(dir, replace, [&](const std::string& staging) -> absl::Status {
    ShardedWriteOptions write;
    write.max_shard_bytes = options.max_shard_bytes;
    write.max_piece_bytes = options.max_piece_bytes;
    RETURN_IF_ERROR(WriteShardedSafetensors(staging, specs, fill_file, write).status());
    RETURN_IF_ERROR(WriteFileAtomically(
        JoinPath(staging, kHfConfigFileName), [&](int fd, const std::string& tmp_path) {
          return WriteAll(fd, config_json.data(), config_json.size(), tmp_path);
        }));
    for (const auto& [source, base] : extra) {
      RETURN_IF_ERROR(WriteFileAtomically(
          JoinPath(staging, base),
          [&](int fd, const std::string& tmp_path) { return CopyInto(source, fd, tmp_path); }));
    }
    return absl::OkStatus();
  });
}

}  // namespace ps
