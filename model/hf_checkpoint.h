// Hugging Face model directories, in and out: config.json plus model.safetensors or a sharded
// model.safetensors.index.json, for every family of model/model_config.h. This is what
// `--init_from=DIR` reads and an export writes; transformers' from_pretrained loads what it writes.
//
// Reading (HfCheckpoint::Open): the configuration comes from config.json (model/hf_config.h), the
// tensors from the weights (model/safetensors_index.h), and the two are checked against each other:
// every parameter of ModelOperators(config) must be present once, with its shape and a supported
// dtype (F32, F16, BF16; each tensor may have its own), and nothing else may be, except
//   - "model.layers.{i}.self_attn.rotary_emb.inv_freq" (RoPE tables older Llama files carry,
//     e.g. Llama-2-7b-hf; recomputed from rope_theta),
//   - GPT-2's attention-mask buffers "h.{i}.attn.bias" and "h.{i}.attn.masked_bias",
//   - "lm_head.weight" of a tied model, if it equals the embedding element for element (after
//     conversion to f32) — transformers does not save it, but some tools do.
// GPT-2 tensors may carry the "transformer." prefix (GPT2LMHeadModel's state dict) or not (the
// original openai-community/gpt2 files); parameters() names them without it, like
// model/gpt2_checkpoint.h. Errors (InvalidArgument naming the directory) list every missing,
// unexpected, duplicated or mis-shaped tensor; Unimplemented names a tensor of an unsupported
// dtype. Every parameter's values must be finite: Open scans the stored bits once
// (model/finite_scan.h, vectorized, about the cost of reading the files) and a tensor holding Inf
// or NaN is DataLoss naming the directory, the file, the tensor and the element's coordinates.
// Layouts are the file's: Linear weights [out, in] (GPT-2's Conv1D: [in, out]).
//
// Fused tensors (Phi-3, model/model_config.h): the file's "p self_attn.qkv_proj.weight"
// [Q + 2K, E] holds the parameters q_proj, k_proj, v_proj.weight as consecutive row ranges, and
// "p mlp.gate_up_proj.weight" [2I, E] gate_proj, up_proj.weight: Open checks the fused tensor's
// shape (a "wrong shape" or "missing" error names the fused tensor), ReadAsF32 of a parameter
// reads its rows, and the writer writes the fused tensor from its parts (HfFileSliceOf). A
// pre-quantized Phi-3 directory is refused (its 4-bit codes quantize the fused matrix whole).
//
// Pre-quantized directories (transformers + bitsandbytes, load_in_4bit; model/quant4_import.h).
// A config.json with a bitsandbytes 4-bit quantization_config (Quant4ConfigFromHfConfig) makes
// every block linear that its llm_int8_skip_modules does not keep (model/quant4_config.h's rule)
// a 4-bit weight: the file holds its packed codes (U8 [(n + 1) / 2, 1]) under the weight's name
// and exactly its Quant4StateKeys beside it; a missing state tensor is "missing", a misshapen
// code tensor "wrong shape", any other state tensor "not a parameter". Open checks names and
// shapes; the state's values are checked when a weight is read (ImportQuant4Weight's errors).
// ReadAsF32 of a 4-bit weight gives its dequantized values (bitsandbytes' dequantize_4bit, in
// the Hugging Face layout), so such a directory also loads into a 16-bit model; a model with a
// 4-bit base of the same format takes the codes and scales as they are (Quant4Of, ImportQuant4).
//
// Writing (WriteHfCheckpoint): config.json (HfConfigJson, over the original file's keys when
// given) and the parameters in one dtype, sharded above max_shard_bytes, streaming — the fill
// callback is asked for element ranges of one tensor at a time, at most max_piece_bytes each, so
// no tensor (a multi-GB embedding included) is ever whole in memory — into a staging directory
// that then replaces `dir` atomically (model/atomic_directory.h: the old directory is replaced only
// if it holds a config.json and files only; its other files, e.g. tokenizer.json, are kept; old
// weight files are dropped). Tied models are written without lm_head.weight; GPT-2 without the
// "transformer." prefix (transformers' GPT2LMHeadModel loads both spellings).
//
// Thread safety: an HfCheckpoint is immutable after Open(); const methods may be called
// concurrently. WriteHfCheckpoint calls `fill` from the calling thread only.
#ifndef PATRICKSTAR_MODEL_HF_CHECKPOINT_H_
#define PATRICKSTAR_MODEL_HF_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/model_config.h"
#include "model/quant4_config.h"
#include "model/quant4_import.h"
#include "model/safetensors.h"
#include "model/safetensors_index.h"

namespace ps {

// The parameters of `config` in forward order (ModelOperators flattened), under the names the
// checkpoint uses. REQUIRES: ValidateModelConfig(config) is OK.
std::vector<TensorSpec> HfParameterSpecs(const ModelConfig& config);

// Where a parameter lives in the files when the family fuses it into a larger tensor (Phi-3's
// qkv_proj and gate_up_proj): the file tensor, its shape, and the parameter's first element in
// it (its rows are contiguous there). nullopt for a parameter stored under its own name.
struct HfFileSlice {
  std::string file_tensor;
  std::vector<int64_t> file_shape;
  int64_t first_elem = 0;
};
std::optional<HfFileSlice> HfFileSliceOf(const ModelConfig& config, absl::string_view name);

// A model directory, opened and validated (see the file comment).
//
// Ownership: owns the mapped weight files; views stay valid while the object lives (moves keep
// them valid).
class HfCheckpoint {
 public:
  // Opens `dir`. Errors: NotFound (no directory, no config.json, no weights, a missing shard);
  // the errors of ReadHfConfig and ShardedSafetensors::OpenDirectory; InvalidArgument /
  // Unimplemented for tensors that do not match the config, DataLoss for a parameter holding
  // Inf or NaN (see the file comment).
  [[nodiscard]] static absl::StatusOr<HfCheckpoint> Open(const std::string& dir);

  HfCheckpoint(HfCheckpoint&&) = default;
  HfCheckpoint& operator=(HfCheckpoint&&) = default;

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  // The original config.json text (pass it as HfExportOptions::base_config_json to keep its
  // other keys in an export).
  const std::string& config_json() const { return config_json_; }
  const ShardedSafetensors& weights() const { return weights_; }
  // HfParameterSpecs(config()).
  const std::vector<TensorSpec>& parameters() const { return parameters_; }
  // Whether the files carried a (verified equal) lm_head.weight for a tied model.
  bool had_tied_lm_head() const { return had_tied_lm_head_; }

  // The file entry of parameter `name` (a parameters() name), or nullptr if it is not one (or
  // is part of a fused file tensor, HfFileSliceOf).
  const SafetensorsTensorInfo* Find(absl::string_view name) const;

  // The raw bytes and dtype of parameter `name`. Errors: NotFound if `name` is not a parameter
  // stored under its own name (a part of a fused tensor is read with ReadAsF32).
  [[nodiscard]] absl::StatusOr<SafetensorsTensorView> Get(absl::string_view name) const;

  // Elements [first_elem, first_elem + out.size()) of parameter `name`, as f32 (exact).
  // Errors: NotFound if `name` is not a parameter; InvalidArgument for a range outside it.
  [[nodiscard]] absl::Status ReadAsF32(absl::string_view name, int64_t first_elem,
                                       absl::Span<float> out) const;

  // The directory's bitsandbytes 4-bit quantization (its storage: quant type, double
  // quantization, skipped modules; compute_dtype as the file says), or nullopt.
  const std::optional<Quant4Config>& quant4() const { return quant4_; }
  // The stored format of parameter `name` when it is a 4-bit weight of the directory, else null.
  const Quant4Format* Quant4Of(absl::string_view name) const;
  // Reads 4-bit weight `name`'s codes and scales into `blob` (ImportQuant4Weight, with its
  // checks and errors). NotFound when `name` is not a 4-bit weight of the directory.
  [[nodiscard]] absl::StatusOr<Quant4Imported> ImportQuant4(absl::string_view name,
                                                            absl::Span<uint8_t> blob) const;

 private:
  HfCheckpoint(std::string dir, ShardedSafetensors weights)
      : dir_(std::move(dir)), weights_(std::move(weights)) {}

  std::string dir_;
  ModelConfig config_;
  std::string config_json_;
  ShardedSafetensors weights_;
  std::vector<TensorSpec> parameters_;
  absl::flat_hash_map<std::string, std::string> file_names_;  // parameter -> name in the files
  // Parameters that are rows of a fused file tensor -> their first element in it, their size.
  absl::flat_hash_map<std::string, std::pair<int64_t, int64_t>> fused_first_;
  bool had_tied_lm_head_ = false;
  std::optional<Quant4Config> quant4_;
  absl::flat_hash_map<std::string, Quant4Format> quant4_formats_;  // parameter -> format
};

// Produces elements [first_elem, first_elem + n) of parameter `tensor` (row-major, the file
// layout) as bytes of the export dtype into `dst` (n * SizeOf(dtype) bytes). Called once per
// piece, tensors in file data order (not forward order), pieces of a tensor in order.
using HfExportFillFn = std::function<absl::Status(const TensorSpec& tensor, int64_t first_elem,
                                                  absl::Span<uint8_t> dst)>;

// As HfExportFillFn, producing f32 values.
using HfExportF32FillFn = std::function<absl::Status(const TensorSpec& tensor, int64_t first_elem,
                                                     absl::Span<float> dst)>;

// An HfExportFillFn that calls `f32_fill` and converts to `dtype` (round to nearest even; exact
// for f32), through a buffer of one piece.
HfExportFillFn ConvertingFill(HfExportF32FillFn f32_fill, DType dtype);

// An HfExportFillFn reading `source`'s parameters: the file's bytes unchanged when the tensor is
// already stored as `dtype` (so import -> export is bit-exact), converted through f32 otherwise.
// REQUIRES: `source` outlives the returned function.
HfExportFillFn FillFromCheckpoint(const HfCheckpoint& source, DType dtype);

struct HfExportOptions {
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  int64_t max_piece_bytes = int64_t{64} << 20;
  // The original config.json text, whose keys this project does not model (token ids, ...) are
  // kept. Empty: a config.json from the ModelConfig alone.
  std::string base_config_json;
  // Files copied into the directory under their base names (tokenizer.json,
  // tokenizer_config.json, generation_config.json, ...). They may not be named like the files
  // written here.
  std::vector<std::string> extra_files;
};

// Writes `config` and its parameters (HfParameterSpecs), all stored as `dtype`, as the Hugging
// Face directory `dir` (see the file comment). config.json declares torch_dtype `dtype`.
// Errors: InvalidArgument for an invalid config or options (naming the option); FailedPrecondition
// when `dir` may not be replaced; whatever `fill` returns; I/O errors naming the path. On any
// error `dir` is unchanged.
[[nodiscard]] absl::Status WriteHfCheckpoint(const std::string& dir, const ModelConfig& config,
                                             DType dtype, const HfExportFillFn& fill,
                                             const HfExportOptions& options = {});

// Whether `name` is a file WriteHfCheckpoint owns in a model directory: config.json,
// model.safetensors, model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors.
bool IsHfCheckpointFileName(absl::string_view name);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_HF_CHECKPOINT_H_
