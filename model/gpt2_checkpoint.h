// Hugging Face GPT-2 checkpoints in safetensors files: tensor names, shapes, validation, import
// as f32 and export. Independent of any model class: the model maps these names onto its own
// parameters.
//
// Names and shapes (E = hidden size, V = vocabulary, P = positions, i = block 0..L-1), exactly as
// transformers' GPT2Model saves them:
//   wte.weight                  [V, E]     token embedding; also the (tied) LM head
//   wpe.weight                  [P, E]     learned position embedding
//   h.{i}.ln_1.weight, .bias    [E]
//   h.{i}.attn.c_attn.weight    [E, 3E]    Conv1D: q|k|v projections, stored [in, out]
//   h.{i}.attn.c_attn.bias      [3E]
//   h.{i}.attn.c_proj.weight    [E, E]     Conv1D [in, out]
//   h.{i}.attn.c_proj.bias      [E]
//   h.{i}.ln_2.weight, .bias    [E]
//   h.{i}.mlp.c_fc.weight       [E, 4E]    Conv1D [in, out]
//   h.{i}.mlp.c_fc.bias         [4E]
//   h.{i}.mlp.c_proj.weight     [4E, E]    Conv1D [in, out]
//   h.{i}.mlp.c_proj.bias       [E]
//   ln_f.weight, ln_f.bias      [E]
// Layout: Hugging Face's Conv1D computes y = x W + b with W stored [in, out] row-major — the
// transpose of torch.nn.Linear's [out, in]. Files keep that layout, and so does every tensor this
// layer hands out or accepts: a model whose GEMMs want [out, in] must transpose itself.
//
// Import accepts the names with or without the "transformer." prefix (GPT2LMHeadModel saves them
// prefixed), ignores the attention-mask buffers h.{i}.attn.bias and h.{i}.attn.masked_bias that
// some files carry, and accepts "lm_head.weight" only if it equals wte.weight element for element
// after conversion to f32 (this project's GPT-2 ties the LM head to the token embedding; an untied
// head cannot be represented, so it is an error rather than silently dropped). The MLP width is
// fixed at 4E (GPT-2's n_inner = null).
#ifndef PATRICKSTAR_MODEL_GPT2_CHECKPOINT_H_
#define PATRICKSTAR_MODEL_GPT2_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"
#include "model/safetensors.h"

namespace ps {

// The prefix transformers' GPT2LMHeadModel puts before GPT2Model's names.
inline constexpr absl::string_view kGpt2HfPrefix = "transformer.";

// The dimensions that determine every GPT-2 tensor shape.
struct Gpt2Dims {
  int64_t vocab_size = 0;     // V
  int64_t max_positions = 0;  // P (n_positions)
  int64_t hidden = 0;         // E (n_embd)
  int64_t num_layers = 0;     // L (n_layer)

  friend bool operator==(const Gpt2Dims&, const Gpt2Dims&) = default;
};
std::ostream& operator<<(std::ostream& os, const Gpt2Dims& dims);

// InvalidArgument naming the field unless every dimension is >= 1, num_layers <= 2^20, and no
// tensor's f32 byte size overflows int64.
[[nodiscard]] absl::Status ValidateGpt2Dims(const Gpt2Dims& dims);

// One expected tensor: its Hugging Face name (no prefix) and shape.
struct Gpt2TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// All 4 + 12 L tensors of a GPT-2 with `dims`, in model order: wte, wpe, then per block
// ln_1.weight, ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
// attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight,
// mlp.c_proj.bias, then ln_f.weight, ln_f.bias. REQUIRES: ValidateGpt2Dims(dims) is OK.
std::vector<Gpt2TensorSpec> Gpt2TensorSpecs(const Gpt2Dims& dims);

// Reads the dimensions off a file's shapes: V and E from wte.weight, P from wpe.weight, L from the
// highest block index h.{i}. (prefix optional). Does not check the rest of the file (Load does).
// Errors: InvalidArgument naming the tensor when wte.weight or wpe.weight is missing or not 2-D,
// when their widths differ, or when no block is found.
[[nodiscard]] absl::StatusOr<Gpt2Dims> InferGpt2Dims(const SafetensorsFile& file);

// A safetensors file validated as a GPT-2 checkpoint.
//
// Ownership: owns the SafetensorsFile (and through it the mapping). Thread safety: const methods
// may be called concurrently.
class Gpt2Checkpoint {
 public:
  // Validates `file` as a GPT-2 checkpoint with dimensions `expected`, or with the dimensions
  // inferred from the file (InferGpt2Dims) when `expected` is nullopt. Checks that every expected
  // tensor is present exactly once (prefixed or not), has the expected shape and a supported dtype
  // (F32/F16/BF16), that nothing unexpected is present, that every value is finite (one
  // vectorized pass over the stored bits, model/finite_scan.h), and that a present lm_head.weight
  // equals wte.weight.
  // Errors: InvalidArgument listing every missing, unexpected, duplicated, mis-shaped or
  // unsupported tensor by name (with actual and expected shapes); DataLoss naming the first
  // tensor (in model order) that holds an Inf or NaN, with the element's coordinates;
  // InvalidArgument naming lm_head.weight and the first differing element if the head is not
  // tied; errors of InferGpt2Dims.
  [[nodiscard]] static absl::StatusOr<Gpt2Checkpoint> Load(
      SafetensorsFile file, std::optional<Gpt2Dims> expected = std::nullopt);

  // SafetensorsFile::Open(path) followed by Load().
  [[nodiscard]] static absl::StatusOr<Gpt2Checkpoint> Open(
      const std::string& path, std::optional<Gpt2Dims> expected = std::nullopt);

  const Gpt2Dims& dims() const { return dims_; }
  const std::vector<Gpt2TensorSpec>& specs() const { return specs_; }
  const SafetensorsFile& file() const { return file_; }
  // Whether the file carried an (identical, tied) lm_head.weight.
  bool had_lm_head() const { return had_lm_head_; }

  // The file's entry for the tensor with Hugging Face name `name` (no prefix), or nullptr if
  // `name` is not one of specs().
  const SafetensorsTensorInfo* Find(absl::string_view name) const;

  // Copies tensor `name` (no prefix) into `out` converted to f32, keeping the file's layout
  // (Conv1D weights [in, out]). Errors: NotFound if `name` is not a GPT-2 tensor; InvalidArgument
  // if out.size() is not its element count.
  [[nodiscard]] absl::Status ReadF32(absl::string_view name, absl::Span<float> out) const;
  [[nodiscard]] absl::StatusOr<std::vector<float>> ReadF32(absl::string_view name) const;
  // Elements [first_elem, first_elem + out.size()) of tensor `name`, row-major (a row block of
  // wte.weight is a contiguous range). InvalidArgument if the range is not within the tensor.
  [[nodiscard]] absl::Status ReadF32(absl::string_view name, int64_t first_elem,
                                     absl::Span<float> out) const;

 private:
  explicit Gpt2Checkpoint(SafetensorsFile file) : file_(std::move(file)) {}

  SafetensorsFile file_;
  Gpt2Dims dims_;
  std::vector<Gpt2TensorSpec> specs_;
  absl::flat_hash_map<std::string, std::string> file_names_;  // HF name -> name in the file
  bool had_lm_head_ = false;
};

// Produces the f32 values of tensor `name` (HF name, no prefix) into `out`, whose size is the
// tensor's element count, in the layout documented above (Conv1D weights [in, out]).
using Gpt2FillFn = std::function<absl::Status(absl::string_view name, absl::Span<float> out)>;

// Writes a GPT-2 checkpoint that transformers' GPT2Model / GPT2LMHeadModel.from_pretrained and
// any safetensors reader can load: the names of Gpt2TensorSpecs(dims) without prefix, no
// lm_head.weight (it is tied to wte), every tensor stored as `dtype` (converted from f32 with
// round-to-nearest-even), and metadata {"format": "pt"} (which transformers requires) merged with
// `metadata` (whose entries win). Streaming and atomic as WriteSafetensors: one tensor is
// buffered at a time. `fill` is called once per tensor, in file data order.
// Errors: InvalidArgument for invalid dims; whatever `fill` returns; I/O errors as
// WriteSafetensors.
[[nodiscard]] absl::Status WriteGpt2Safetensors(
    const std::string& path, const Gpt2Dims& dims, DType dtype, const Gpt2FillFn& fill,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_GPT2_CHECKPOINT_H_
