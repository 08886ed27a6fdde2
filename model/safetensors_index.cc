#include "model/safetensors_index.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "model/hf_json.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using nlohmann::json;

constexpr absl::string_view kIndexWhat = "safetensors index";

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Whether `path` exists (following symlinks); errno other than ENOENT/ENOTDIR is an error.
absl::StatusOr<bool> Exists(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return ErrnoError(errno, "cannot stat", path);
}

// Why `name` cannot be a shard's file name, or nullopt if it can.
std::optional<std::string> BadShardName(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "is not a file name";
  if (name.find('/') != std::string::npos) {
    return "contains '/': shards must lie in the index's own directory";
  }
  if (name.find('\0') != std::string::npos) return "contains a NUL byte";
  if (!absl::EndsWith(name, ".safetensors")) return "does not end in .safetensors";
  return std::nullopt;
}

// The non-negative integral value of a JSON number (an integer, or a float with an integral value,
// which some converters write), or -1. (A sentinel rather than std::optional: GCC 12 at -O1 warns
// falsely about an uninitialized optional here.)
int64_t NonNegativeIntegral(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1
                                                                          : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    return i < 0 ? -1 : i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= 0) || d >= 0x1p63 || std::floor(d) != d) return -1;
    return static_cast<int64_t>(d);
  }
  return -1;
}

}  // namespace

std::string SafetensorsShardName(int64_t shard, int64_t num_shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, num_shards);
}

// ---------------------------------------------------------------------------------------------
// Reading.

void ShardedSafetensors::BuildLookup() {
  lookup_.clear();
  names_.clear();
  total_size_bytes_ = 0;
  for (const SafetensorsFile& file : shards_) {
    for (const SafetensorsTensorInfo& info : file.tensors()) {
      lookup_.emplace(info.name, ShardedTensorRef{&file, &info});
      names_.push_back(info.name);
      total_size_bytes_ += info.size_bytes();
    }
  }
  std::sort(names_.begin(), names_.end());
}

std::string ShardedSafetensors::Describe() const {
  if (sharded()) return absl::StrCat(kIndexWhat, " '", index_path_, "'");
  return absl::StrCat("safetensors file '", shards_.empty() ? "" : shards_[0].path(), "'");
}

absl::StatusOr<ShardedSafetensors> ShardedSafetensors::OpenSingle(const std::string& path) {
  ShardedSafetensors out;
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  out.shards_.push_back(std::move(file));
  out.BuildLookup();
  return out;
}

absl::StatusOr<ShardedSafetensors> ShardedSafetensors::OpenIndex(const std::string& index_path) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(kIndexWhat, " '", index_path, "': ", what));
  };
  ASSIGN_OR_RETURN(const std::string text, hf_json::ReadTextFile(index_path, kIndexWhat));
  ASSIGN_OR_RETURN(const json index,
                   hf_json::ParseObject(text, kIndexWhat, index_path, absl::StatusCode::kDataLoss));
  const auto map_it = index.find("weight_map");
  if (map_it == index.end()) return corrupt("\"weight_map\" is missing");
  if (!map_it->is_object()) {
    return corrupt(
        absl::StrCat("\"weight_map\" must be an object, got ", hf_json::TypeName(*map_it)));
  }
  if (map_it->empty()) return corrupt("\"weight_map\" is empty: the index lists no tensors");

  int64_t declared_total = -1;  // absent
  if (const auto meta = index.find("metadata"); meta != index.end() && !meta->is_null()) {
    if (!meta->is_object()) {
      return corrupt(
          absl::StrCat("\"metadata\" must be an object, got ", hf_json::TypeName(*meta)));
    }
    if (const auto total = meta->find("total_size"); total != meta->end()) {
      declared_total = NonNegativeIntegral(*total);
      if (declared_total < 0) {
        return corrupt(absl::StrCat("\"metadata.total_size\" must be a non-negative integer, got ",
                                    hf_json::Brief(*total)));
      }
    }
  }

  // tensor -> shard name, and the shards in name order with one tensor each for messages.
  std::map<std::string, std::string> shard_of;
  std::map<std::string, std::string> example_tensor;  // shard -> a tensor it should hold
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it->is_string()) {
      return corrupt(absl::StrCat("\"weight_map\" entry \"", it.key(),
                                  "\" must be a shard file name, got ", hf_json::Brief(*it)));
    }
    const std::string shard = it->get<std::string>();
    if (const std::optional<std::string> bad = BadShardName(shard); bad.has_value()) {
      return corrupt(absl::StrCat("\"weight_map\" entry \"", it.key(), "\": shard name \"", shard,
                                  "\" ", *bad));
    }
    if (it.key().empty()) return corrupt("\"weight_map\" has an empty tensor name");
    shard_of.emplace(it.key(), shard);
    example_tensor.emplace(shard, it.key());
  }

  ShardedSafetensors out;
  out.index_path_ = index_path;
  const std::string dir = DirName(index_path);
  for (const auto& [shard, tensor] : example_tensor) {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(JoinPath(dir, shard));
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat(kIndexWhat, " '", index_path, "': shard \"", shard, "\" (which holds \"",
                       tensor, "\"): ", file.status().message()));
    }
    out.shards_.push_back(*std::move(file));
  }

  // Every tensor of every shard must be in weight_map under that shard, and in no other shard.
  std::map<std::string, std::string> found_in;  // tensor -> shard where it was found
  for (const SafetensorsFile& file : out.shards_) {
    const std::string shard = file.path().substr(file.path().rfind('/') + 1);
    for (const SafetensorsTensorInfo& info : file.tensors()) {
      const auto [prev, inserted] = found_in.emplace(info.name, shard);
      if (!inserted) {
        return corrupt(absl::StrCat("tensor \"", info.name, "\" is in two shards, \"", prev->second,
                                    "\" and \"", shard, "\""));
      }
      const auto mapped = shard_of.find(info.name);
      if (mapped == shard_of.end()) {
        return corrupt(absl::StrCat("shard \"", shard, "\" holds tensor \"", info.name,
                                    "\", which \"weight_map\" does not list"));
      }
      if (mapped->second != shard) {
        return corrupt(absl::StrCat("tensor \"", info.name, "\" is in shard \"", shard,
                                    "\" but \"weight_map\" puts it in \"", mapped->second, "\""));
      }
    }
  }
  for (const auto& [tensor, shard] : shard_of) {
    if (!found_in.contains(tensor)) {
      return corrupt(absl::StrCat("\"weight_map\" puts tensor \"", tensor, "\" in shard \"", shard,
                                  "\", which has no such tensor"));
    }
  }
  out.BuildLookup();
  if (declared_total >= 0 && declared_total != out.total_size_bytes_) {
    return corrupt(absl::StrCat("\"metadata.total_size\" is ", declared_total,
                                " bytes but the shards' tensors hold ", out.total_size_bytes_));
  }
  return out;
}

absl::StatusOr<ShardedSafetensors> ShardedSafetensors::OpenDirectory(const std::string& dir) {
  ASSIGN_OR_RETURN(const bool dir_exists, Exists(dir));
  if (!dir_exists) {
    return absl::NotFoundError(absl::StrCat("model directory '", dir, "' does not exist"));
  }
  const std::string single = JoinPath(dir, kSafetensorsSingleFileName);
  ASSIGN_OR_RETURN(const bool has_single, Exists(single));
  if (has_single) return OpenSingle(single);
  const std::string index = JoinPath(dir, kSafetensorsIndexFileName);
  ASSIGN_OR_RETURN(const bool has_index, Exists(index));
  if (has_index) return OpenIndex(index);
  std::string hint;
  if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
    while (const dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, "pytorch_model") && absl::EndsWith(e->d_name, ".bin")) {
        hint =
            " (it has PyTorch pickle weights, pytorch_model*.bin, which are not read: convert "
            "them to safetensors, e.g. by loading the model in transformers and calling "
            "save_pretrained)";
        break;
      }
    }
    ::closedir(d);
  }
  return absl::NotFoundError(absl::StrCat("model directory '", dir, "' has neither ",
                                          kSafetensorsSingleFileName, " nor ",
                                          kSafetensorsIndexFileName, hint));
}

ShardedTensorRef ShardedSafetensors::Find(absl::string_view name) const {
  const auto it = lookup_.find(name);
  return it == lookup_.end() ? ShardedTensorRef{} : it->second;
}

absl::StatusOr<SafetensorsTensorView> ShardedSafetensors::Get(absl::string_view name) const {
  const ShardedTensorRef ref = Find(name);
  if (ref.file == nullptr) {
    return absl::NotFoundError(absl::StrCat(Describe(), " has no tensor '", name, "'"));
  }
  return ref.file->Get(name);
}

absl::Status ShardedSafetensors::ReadAsF32(absl::string_view name, int64_t first_elem,
                                           absl::Span<float> out) const {
  const ShardedTensorRef ref = Find(name);
  if (ref.file == nullptr) {
    return absl::NotFoundError(absl::StrCat(Describe(), " has no tensor '", name, "'"));
  }
  return ref.file->ReadAsF32(name, first_elem, out);
}

// ---------------------------------------------------------------------------------------------
// Writing.

absl::StatusOr<SafetensorsShardPlan> PlanSafetensorsShards(
    absl::Span<const SafetensorsTensorSpec> specs, int64_t max_shard_bytes) {
  if (max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_bytes must be positive, got ", max_shard_bytes));
  }
  SafetensorsShardPlan plan;
  absl::flat_hash_set<absl::string_view> seen;
  int64_t current_bytes = 0;  // tensor bytes in the open shard
  bool current_open = false;  // whether plan.tensors.back() may take more tensors
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensorSpec& s = specs[i];
    if (s.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor #", i, " has an empty name"));
    }
    if (!seen.insert(s.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "' appears more than once"));
    }
    int64_t numel = 1;
    for (const int64_t d : s.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", s.name, "' has shape [", absl::StrJoin(s.shape, ", "),
                         "] with a negative dimension or too many elements"));
      }
    }
    int64_t bytes;
    if (__builtin_mul_overflow(numel, SizeOf(s.dtype), &bytes) ||
        __builtin_add_overflow(plan.total_size_bytes, bytes, &plan.total_size_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "': the total byte size overflows"));
    }
    plan.total_elems += numel;
    if (bytes > max_shard_bytes) {  // a shard of its own; the next tensor starts a new one
      plan.tensors.push_back({i});
      current_open = false;
      continue;
    }
    if (!current_open || current_bytes + bytes > max_shard_bytes) {
      plan.tensors.emplace_back();
      current_open = true;
      current_bytes = 0;
    }
    plan.tensors.back().push_back(i);
    current_bytes += bytes;
  }
  if (plan.tensors.empty()) plan.tensors.emplace_back();  // no tensors: one empty file
  const auto n = static_cast<int64_t>(plan.tensors.size());
  if (n > 99999) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tensors need ", n, " shards of at most ", max_shard_bytes,
        " bytes; shard names have five digits (at most 99999): raise max_shard_bytes"));
  }
  for (int64_t s = 0; s < n; ++s) {
    plan.file_names.push_back(n == 1 ? std::string(kSafetensorsSingleFileName)
                                     : SafetensorsShardName(s, n));
  }
  return plan;
}

absl::StatusOr<SafetensorsShardPlan> WriteShardedSafetensors(
    const std::string& dir, absl::Span<const SafetensorsTensorSpec> specs,
    const SafetensorsPieceFillFn& fill, const ShardedWriteOptions& options) {
  ASSIGN_OR_RETURN(SafetensorsShardPlan plan,
                   PlanSafetensorsShards(specs, options.max_shard_bytes));
  json weight_map = json::object();
  for (size_t s = 0; s < plan.tensors.size(); ++s) {
    const std::vector<size_t>& members = plan.tensors[s];
    std::vector<SafetensorsTensorSpec> shard_specs;
    shard_specs.reserve(members.size());
    for (const size_t i : members) {
      shard_specs.push_back(specs[i]);
      weight_map[specs[i].name] = plan.file_names[s];
    }
    const std::string path = JoinPath(dir, plan.file_names[s]);
    const absl::Status written = WriteSafetensorsInPieces(
        path, shard_specs, options.shard_metadata,
        [&](size_t local, int64_t first_elem, absl::Span<uint8_t> dst) {
          return fill(members[local], first_elem, dst);
        },
        options.max_piece_bytes);
    if (!written.ok()) {
      return absl::Status(written.code(),
                          absl::StrCat("writing shard ", s + 1, " of ", plan.tensors.size(), ": ",
                                       written.message()));
    }
  }
  if (plan.sharded()) {
    json index = {{"metadata",
                   {{"total_parameters", plan.total_elems}, {"total_size", plan.total_size_bytes}}},
                  {"weight_map", std::move(weight_map)}};
    // Tensor names were checked to be valid UTF-8 by the shard writer: dump cannot throw.
    const std::string text = index.dump(2) + "\n";
    RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, kSafetensorsIndexFileName),
                                        [&](int fd, const std::string& tmp_path) {
                                          return WriteAll(fd, text.data(), text.size(), tmp_path);
                                        }));
  }
  return plan;
}

}  // namespace ps
