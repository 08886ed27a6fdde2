// The weights of a Hugging Face model directory: one model.safetensors, or shards listed by
// model.safetensors.index.json — read as one name -> tensor lookup, and written back in
// transformers' layout, streaming.
//
// Index format (transformers' save_pretrained, huggingface_hub's
// split_torch_state_dict_into_shards):
//   {"metadata": {"total_size": <bytes of all tensors>, "total_parameters": <count>, ...},
//    "weight_map": {"<tensor name>": "model-00001-of-00003.safetensors", ...}}
// Shards are named model-{i:05d}-of-{n:05d}.safetensors (i from 1). A model that fits in one shard
// is saved as model.safetensors with no index.
//
// Reading checks, beyond what SafetensorsFile checks in each shard, that the index and the shards
// agree exactly: every weight_map entry is in the shard it names, every tensor of every shard is
// in weight_map under that shard, no tensor is in two shards, no shard name leaves the directory
// (a name is one path component: no '/', not "." or ".."; symlinked shard files, as in the Hub's
// cache, are fine), and metadata.total_size, when present, equals the tensors' total byte count.
// total_parameters is not checked: transformers writes model.num_parameters(), which can differ
// from the stored tensors (it leaves out buffers some files carry, such as Llama-2's
// rotary_emb.inv_freq). Errors name the index file and the key, tensor or shard:
//   NotFound   no weights in the directory, a shard that does not exist;
//   DataLoss   a malformed index (invalid JSON, repeated key, wrong types, missing weight_map), any
//              disagreement above, a malformed shard (see model/safetensors.h);
//   other canonical codes for I/O errors.
//
// Writing (WriteShardedSafetensors) splits tensors, in the order given, into shards of at most
// max_shard_bytes of tensor data as transformers does — a tensor that would tip the current shard
// over the limit starts a new one, a tensor alone larger than the limit gets a shard of its own
// (transformers appends such a shard before the current one; here shards keep the tensor order) —
// and writes each shard streaming (WriteSafetensorsInPieces: one piece buffer, however large the
// tensor) and atomically, then the index. Shard data sizes are known from shapes before anything
// is written, so no tensor is ever held whole.
//
// Thread safety: a ShardedSafetensors is immutable after Open*(); const methods may be called
// concurrently. The write function shares no state.
#ifndef PATRICKSTAR_MODEL_SAFETENSORS_INDEX_H_
#define PATRICKSTAR_MODEL_SAFETENSORS_INDEX_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/safetensors.h"

namespace ps {

inline constexpr absl::string_view kSafetensorsSingleFileName = "model.safetensors";
inline constexpr absl::string_view kSafetensorsIndexFileName = "model.safetensors.index.json";

// transformers 4's default max_shard_size ("5GB" = 5 * 10^9 bytes; transformers 5 uses 50GB).
inline constexpr int64_t kDefaultMaxShardBytes = int64_t{5'000'000'000};

// "model-00002-of-00005.safetensors" for shard 1 (0-based) of 5.
std::string SafetensorsShardName(int64_t shard, int64_t num_shards);

// Where a tensor is.
struct ShardedTensorRef {
  const SafetensorsFile* file = nullptr;
  const SafetensorsTensorInfo* info = nullptr;
};

// The tensors of one or more safetensors files under one lookup.
//
// Ownership: owns the SafetensorsFiles (memory-mapped); every pointer and span handed out stays
// valid until the object is destroyed (moving it keeps them valid).
class ShardedSafetensors {
 public:
  // The weights of directory `dir`: model.safetensors if it exists (transformers looks for it
  // first), else model.safetensors.index.json. NotFound naming both file names when neither exists
  // (mentioning pytorch_model.bin files, which are not read, if there are some).
  [[nodiscard]] static absl::StatusOr<ShardedSafetensors> OpenDirectory(const std::string& dir);

  // The index file at `index_path` and its shards, which lie in the index's directory.
  [[nodiscard]] static absl::StatusOr<ShardedSafetensors> OpenIndex(const std::string& index_path);

  // One safetensors file.
  [[nodiscard]] static absl::StatusOr<ShardedSafetensors> OpenSingle(const std::string& path);

  ShardedSafetensors(ShardedSafetensors&&) = default;
  ShardedSafetensors& operator=(ShardedSafetensors&&) = default;

  // The index file's path, or empty for a single file.
  const std::string& index_path() const { return index_path_; }
  bool sharded() const { return !index_path_.empty(); }

  // The files, sorted by name (one for a single file).
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

  // All tensor names, sorted.
  const std::vector<std::string>& names() const { return names_; }

  // The sum of all tensors' byte sizes (metadata.total_size of an index).
  int64_t total_size_bytes() const { return total_size_bytes_; }

  // The tensor called `name`, or {nullptr, nullptr}.
  ShardedTensorRef Find(absl::string_view name) const;

  // As SafetensorsFile::Get / ReadAsF32 on the file holding `name`.
  // Errors: NotFound naming the directory's weights if no file has `name`; the file's errors.
  [[nodiscard]] absl::StatusOr<SafetensorsTensorView> Get(absl::string_view name) const;
  [[nodiscard]] absl::Status ReadAsF32(absl::string_view name, int64_t first_elem,
                                       absl::Span<float> out) const;

 private:
  ShardedSafetensors() = default;
  // Builds names_ and the lookup from shards_ (each tensor in exactly one shard: checked by the
  // caller for an index; trivially true for one file).
  void BuildLookup();
  // "safetensors index '<path>'" or "safetensors file '<path>'".
  std::string Describe() const;

  std::string index_path_;
  std::vector<SafetensorsFile> shards_;
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, ShardedTensorRef> lookup_;
  int64_t total_size_bytes_ = 0;
};

// How tensors are split into shards.
struct SafetensorsShardPlan {
  std::vector<std::string> file_names;       // one per shard; {"model.safetensors"} when one
  std::vector<std::vector<size_t>> tensors;  // per shard, indices into the specs, in order
  int64_t total_size_bytes = 0;              // all tensors' bytes
  int64_t total_elems = 0;                   // all tensors' elements
  bool sharded() const { return file_names.size() > 1; }
};

// The plan WriteShardedSafetensors follows (see the file comment).
// Errors: InvalidArgument for max_shard_bytes < 1, an empty or repeated tensor name, a negative
// dimension or a size that overflows, more than 99999 shards.
[[nodiscard]] absl::StatusOr<SafetensorsShardPlan> PlanSafetensorsShards(
    absl::Span<const SafetensorsTensorSpec> specs, int64_t max_shard_bytes);

struct ShardedWriteOptions {
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  // The largest piece of a tensor buffered at once.
  int64_t max_piece_bytes = int64_t{64} << 20;
  // Each shard's __metadata__ ({"format": "pt"} is what transformers requires).
  std::map<std::string, std::string> shard_metadata = {{"format", "pt"}};
};

// Writes `specs` into directory `dir` (which must exist) following PlanSafetensorsShards: the
// shards, then — when there is more than one — model.safetensors.index.json (sorted keys, two-space
// indent, metadata total_size and total_parameters). Each file is written atomically (temporary
// file + rename); other files in `dir` are left alone (model/hf_checkpoint.h replaces a whole
// directory atomically on top of this). `fill` receives indices into `specs`.
// Returns the plan. Errors: those of PlanSafetensorsShards and WriteSafetensorsInPieces, naming the
// shard.
[[nodiscard]] absl::StatusOr<SafetensorsShardPlan> WriteShardedSafetensors(
    const std::string& dir, absl::Span<const SafetensorsTensorSpec> specs,
    const SafetensorsPieceFillFn& fill, const ShardedWriteOptions& options = {});

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_SAFETENSORS_INDEX_H_
