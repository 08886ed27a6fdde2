// QLoRA's 4-bit frozen base (issue #37): the configuration in bitsandbytes' words
// (transformers' BitsAndBytesConfig), which weights are stored in 4 bits, and how one such weight
// is laid out inside a chunk.
//
// Which weights. With a LoRA configuration (the base must be frozen), every linear layer of the
// decoder blocks (Llama family: q/k/v/o_proj, gate/up/down_proj; GPT-2: c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj) whose operator is frozen, except those llm_int8_skip_modules names, is
// stored in 4 bits. transformers' rule for skipping (integrations/bitsandbytes.py,
// _replace_with_bnb_linear, 4.57): a module is kept at 16 bits when its short name is an entry, or
// an entry equals its full Hugging Face name, or entry + "." occurs in that full name
// ("model.layers.3" keeps all of layer 3, "mlp" every MLP; "model.layers.3." matches nothing).
// Embeddings, norms, biases and the LM head always stay in the compute dtype (transformers never
// converts them here). GPT-2's Conv1D weights (Hugging Face tensor [in, out]) are quantized
// transposed, as [out, in], which is what transformers does when it loads them into
// bitsandbytes' Linear4bit.
//
// The stored form ("blob"). A 4-bit weight is one tensor of the chunk layout, in the param
// chunks' element type (the compute dtype), of Quant4StoredElems elements; its bytes are, each
// section at a 16-byte boundary of the blob:
//   plain:  absmax   [Quant4NumBlocks(n)] f32, then codes [Quant4CodeBytes(n)] u8;
//   nested: nested_absmax [Quant4NestedNumBlocks(blocks)] f32, nested_codes [blocks] u8, then
//           codes [Quant4CodeBytes(n)] u8.
// The nested offset (one float per weight) is not in the blob: the program needs it on the host
// while the blob may be in accelerator memory, so the model keeps it in a host table. The blob
// itself must start 16-byte aligned: a layout holding 4-bit weights is built with
// tensor_alignment_elems = Quant4AlignmentElems(dtype).
//
// Thread safety: value types and pure functions.
#ifndef PATRICKSTAR_MODEL_QUANT4_CONFIG_H_
#define PATRICKSTAR_MODEL_QUANT4_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/kernels/nf4.h"
#include "model/lora_config.h"
#include "model/model_config.h"

namespace ps {

// BitsAndBytesConfig's 4-bit keys with its defaults (load_in_4bit is the presence of the
// configuration): bnb_4bit_quant_type "fp4", bnb_4bit_use_double_quant false,
// bnb_4bit_compute_dtype float32, llm_int8_skip_modules none.
struct Quant4Config {
  Quant4Type quant_type = Quant4Type::kFp4;
  bool double_quant = false;
  DType compute_dtype = DType::kF32;
  std::vector<std::string> skip_modules;

  friend bool operator==(const Quant4Config&, const Quant4Config&) = default;
};

// "nf4" / "fp4" (bitsandbytes' spelling, lower case only); InvalidArgument naming
// bnb_4bit_quant_type and the choices otherwise.
absl::StatusOr<Quant4Type> ParseQuant4Type(absl::string_view name);

// OK, or an error saying what to change: FailedPrecondition when `lora` is null (a 4-bit base
// must be frozen: "load_in_4bit ... needs a lora section"); InvalidArgument for a LoRA whose
// modules_to_save covers a block linear that would be quantized (a trained weight cannot be
// 4-bit: name it and say to add it to llm_int8_skip_modules); InvalidArgument for an empty
// skip_modules entry. Every compute dtype (f32, bf16, f16) is valid. REQUIRES: ValidateModelConfig(model) and, when lora is non-null,
// ValidateLoraConfig(model, *lora) are OK.
[[nodiscard]] absl::Status ValidateQuant4Config(const ModelConfig& model, const LoraConfig* lora,
                                                const Quant4Config& quant);

// One 4-bit weight: [rows, cols] = [out, in] of the nn.Linear (GPT-2: the transposed Conv1D).
struct Quant4Format {
  Quant4Type type = Quant4Type::kNf4;
  bool nested = false;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features
  // GPT-2's Conv1D: the Hugging Face tensor is [cols, rows] (in, out), stored transposed.
  bool transposed = false;

  int64_t num_elems() const { return rows * cols; }
  friend bool operator==(const Quant4Format&, const Quant4Format&) = default;
};

// Byte offsets of the blob's sections (see the file comment); absent sections are -1.
struct Quant4BlobLayout {
  int64_t absmax = -1;         // plain
  int64_t nested_absmax = -1;  // nested
  int64_t nested_codes = -1;   // nested
  int64_t codes = 0;
  int64_t bytes = 0;  // a multiple of 16
};
Quant4BlobLayout Quant4BlobLayoutOf(const Quant4Format& format);

// Elements of `dtype` the blob takes in a chunk: ceil(bytes / SizeOf(dtype)).
int64_t Quant4StoredElems(const Quant4Format& format, DType dtype);

// Tensor offsets of a layout holding 4-bit weights are multiples of this: 16 bytes.
int64_t Quant4AlignmentElems(DType dtype);

// The quantized view of a blob at `blob` (host or device memory; only pointer arithmetic).
Quant4Tensor Quant4TensorAt(const Quant4Format& format, const void* blob, float nested_offset);

// Logical elements [first_elem, first_elem + out.size()) of the weight `t` of `format` (host
// memory), dequantized to f32: row-major [rows, cols], or for a transposed (GPT-2 Conv1D) weight
// its Hugging Face layout [cols, rows]. InvalidArgument for a range outside the weight.
[[nodiscard]] absl::Status DequantizeQuant4Range(const Quant4Format& format,
                                                 const Quant4Tensor& t, int64_t first_elem,
                                                 absl::Span<float> out);

// One weight stored in 4 bits: our tensor name ("model.layers.0.self_attn.q_proj.weight") and
// its format.
struct Quant4Weight {
  std::string tensor;
  Quant4Format format;
};

// The weights stored in 4 bits, in ModelOperators order. REQUIRES: ValidateQuant4Config(model,
// &lora, quant) is OK.
std::vector<Quant4Weight> Quant4Weights(const ModelConfig& model, const LoraConfig& lora,
                                        const Quant4Config& quant);

// `ops` (LoraModelOperators(model, lora, vocab)) with every weight of `weights` given the shape
// [Quant4StoredElems(format, dtype)]: the operators a layout of the 4-bit model holds.
std::vector<OperatorSpec> Quant4StoredOperators(std::vector<OperatorSpec> ops,
                                                absl::Span<const Quant4Weight> weights,
                                                DType dtype);

// Bytes the 4-bit weights take in chunks (sum of Quant4StoredElems * SizeOf(dtype)) and the
// number of values they hold: the console's and the plan's "bytes per base parameter".
struct Quant4Totals {
  int64_t weights = 0;
  int64_t values = 0;
  int64_t stored_bytes = 0;
};
Quant4Totals Quant4TotalsOf(absl::Span<const Quant4Weight> weights, DType dtype);

// A model's 4-bit weights by tensor id (of its chunk layout) and their nested offsets: host
// values, set when a weight is quantized or imported (0 until then, and for plain absmax).
struct Quant4Table {
  absl::flat_hash_map<int64_t, Quant4Format> format;
  absl::flat_hash_map<int64_t, float> nested_offset;

  // The format of `tensor`, or null when it is not 4-bit.
  const Quant4Format* Find(int64_t tensor) const {
    const auto it = format.find(tensor);
    return it == format.end() ? nullptr : &it->second;
  }
  // bnb_4bit_compute_dtype: what the 4-bit GEMMs round their operands and results to
  // (Kernels::Quant4LinearForward's compute_dtype).
  DType compute_dtype = DType::kF32;

  float Offset(int64_t tensor) const {
    const auto it = nested_offset.find(tensor);
    return it == nested_offset.end() ? 0.0f : it->second;
  }
};

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_QUANT4_CONFIG_H_
