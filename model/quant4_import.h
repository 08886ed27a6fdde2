// Importing Hugging Face directories that transformers + bitsandbytes saved pre-quantized in 4 bits
// (QLoRA bases such as "...-bnb-4bit" on the Hub): the quantization_config of config.json as a
// Quant4Config, and each 4-bit weight's saved tensors as the blob of model/quant4_config.h.
//
// The saved format, from the primary sources (transformers 4.57.6; bitsandbytes at commit
// 95f9af30, the same one model/kernels/nf4.h was written from):
//   - config.json "quantization_config" is BitsAndBytesConfig.to_dict()
//     (transformers/configuration_utils.py to_diff_dict; utils/quantization_config.py
//     BitsAndBytesConfig.to_dict): quant_method "bitsandbytes", load_in_4bit / load_in_8bit and
//     their attribute copies _load_in_4bit / _load_in_8bit, bnb_4bit_quant_type,
//     bnb_4bit_use_double_quant, bnb_4bit_compute_dtype and bnb_4bit_quant_storage as torch dtype
//     names, llm_int8_skip_modules (null or a list), and the 8-bit settings llm_int8_threshold,
//     llm_int8_has_fp16_weight, llm_int8_enable_fp32_cpu_offload. Without quant_method,
//     transformers takes a config with load_in_4bit or load_in_8bit for bitsandbytes
//     (AutoQuantizationConfig.from_dict); so does this reader.
//   - A 4-bit weight W (a converted nn.Linear; GPT-2's Conv1D transposed to [out, in] before
//     quantization: quantizers/quantizer_bnb_4bit.py create_quantized_param) is saved by
//     bitsandbytes/nn/modules.py Linear4bit._save_to_state_dict as W itself, the packed codes
//     (Params4bit data: uint8 [(n + 1) / 2, 1], backends/cuda/ops.py quantize_4bit with
//     quant_storage uint8), and W + "." + each key of QuantState.as_dict(packed=True)
//     (bitsandbytes/functional.py):
//       W.absmax             f32 [blocks]; with double quantization uint8 [blocks] (the codes of
//                            quantize_blockwise(absmax - offset, blocksize=256))
//       W.quant_map          f32 [16]: get_4bit_type(quant_type), the levels divided by their
//                            largest magnitude (FP4's values / 12; its entry 8 is +0.0 where the
//                            kernel's table has -0.0: equal as values)
//       W.nested_absmax      f32 [ceil(blocks / 256)]              (double quantization only)
//       W.nested_quant_map   f32 [256]: create_dynamic_map()       (double quantization only)
//       W.quant_state.bitsandbytes__<quant_type>
//                            uint8 [bytes]: utils.py pack_dict_to_tensor, the UTF-8 of
//                            json.dumps({"quant_type", "blocksize", "dtype" (the quantized
//                            weight's torch dtype name), "shape" ([out, in]), and with double
//                            quantization "nested_blocksize" (256), "nested_dtype" ("float32"),
//                            "nested_offset" (the offset as a Python float)})
//     QuantState.from_dict reads these back; the quantizer expects exactly these keys per weight
//     (Bnb4BitHfQuantizer.bnb_keys: the quant_state key of the config's quant type, absmax,
//     quant_map, and the nested two when bnb_4bit_use_double_quant).
//   - bitsandbytes' CUDA dequantization ignores quant_map: it decodes with its own table
//     (model/kernels/nf4.h Quant4Levels). So a quant_map that is not the standard table of the
//     quant type is refused rather than silently decoded with the standard one. The same for
//     nested_quant_map, which must be DynamicMap8().
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_QUANT4_IMPORT_H_
#define PATRICKSTAR_MODEL_QUANT4_IMPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/dtype.h"
#include "model/quant4_config.h"
#include "model/safetensors_index.h"
#include "nlohmann/json.hpp"

namespace ps {

// The Quant4Config of a parsed config.json (the whole object, as hf_json::ParseObject gives it;
// `path` names the file in errors): nullopt when it has no "quantization_config" (or null).
// Keys are read as transformers writes them (see the file comment); llm_int8_threshold,
// llm_int8_has_fp16_weight and llm_int8_enable_fp32_cpu_offload are accepted and ignored (they
// govern 8-bit layers and inference-time placement; a module left unquantized shows in the
// tensors). Errors, naming the file and the key "quantization_config.<key>":
//   Unimplemented    quant_method other than "bitsandbytes" (naming it), load_in_8bit true,
//                    bnb_4bit_quant_storage other than "uint8", a key this reader does not know;
//   InvalidArgument  quantization_config not an object, a value of the wrong JSON type,
//                    load_in_4bit and _load_in_4bit (or the 8-bit pair) disagreeing, neither
//                    load_in_4bit nor load_in_8bit true, bnb_4bit_quant_type other than "nf4" /
//                    "fp4", bnb_4bit_compute_dtype other than "float32" / "bfloat16" /
//                    "float16", an llm_int8_skip_modules entry that is not a string.
// The result is not validated against a model (ValidateQuant4Config does that: e.g. a compute
// dtype other than float32 is Unimplemented there).
[[nodiscard]] absl::StatusOr<std::optional<Quant4Config>> Quant4ConfigFromHfConfig(
    const nlohmann::json& config, absl::string_view path);

// The tensors a 4-bit weight is saved as besides `weight` itself, in QuantState.as_dict order:
// weight + ".absmax", ".quant_map", [".nested_absmax", ".nested_quant_map",]
// ".quant_state.bitsandbytes__nf4" (or __fp4).
std::vector<std::string> Quant4StateKeys(absl::string_view weight, Quant4Type type, bool nested);

// Whether `name` is named like a quantization-state tensor: it ends in ".absmax", ".quant_map",
// ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4" or "...__fp4". No
// parameter of a supported model is named so.
bool IsQuant4StateTensorName(absl::string_view name);

// The tensors of `weights` named like quantization state, sorted: those a loader skips when it
// checks the directory's tensors against the model's parameters (each then belongs to a 4-bit
// weight that ImportQuant4Weight reads; a loader that wants no strays compares them with the
// union of Quant4StateKeys over its 4-bit weights).
std::vector<std::string> Quant4StateTensorNames(const ShardedSafetensors& weights);

// What ImportQuant4Weight read besides the blob.
struct Quant4Imported {
  // The double-quantization offset (quant_state's nested_offset as float32); 0 for plain absmax.
  float nested_offset = 0.0f;
  // The dtype the weight had when it was quantized (quant_state's "dtype").
  DType source_dtype = DType::kF32;
};

// Reads the 4-bit weight saved under `weight` (its name in the files, e.g.
// "model.layers.0.self_attn.q_proj.weight"; GPT-2 files may carry the "transformer." prefix, see
// model/hf_checkpoint.h) with its state tensors, checks them against `format` (the weight the
// model expects: quant type and double quantization from the Quant4Config, [rows, cols] =
// [out, in]), and writes its blob (model/quant4_config.h's layout; padding bytes zero) into
// `blob`, which must be Quant4BlobLayoutOf(format).bytes long. Quant4TensorAt(format,
// blob.data(), result.nested_offset) then dequantizes to exactly what bitsandbytes' CUDA
// dequantize_4bit gives for the checkpoint. On error the blob's bytes are unspecified.
// Errors, each naming the tensor and the file holding it (or the directory's weights when it is
// missing):
//   InvalidArgument  blob of the wrong size; a missing tensor; a tensor of the wrong dtype or
//                    shape (codes U8 [(n + 1) / 2, 1]; absmax F32 [blocks], or U8 [blocks] when
//                    nested; quant_map F32 [16]; nested_absmax F32 [ceil(blocks / 256)];
//                    nested_quant_map F32 [256]; quant_state U8 [bytes]); state of the other
//                    quant type (a quant_state key __fp4 where the config says nf4, or the
//                    reverse) or of the other absmax form (nested tensors where the config says
//                    bnb_4bit_use_double_quant false); a quant_state quant_type other than the
//                    config's or shape other than [rows, cols];
//   Unimplemented    quant_state blocksize other than 64 (bitsandbytes allows 32..4096; the codec
//                    here is built for QLoRA's 64);
//   DataLoss         quant_state not a JSON object (invalid UTF-8 or JSON, a repeated key), a key
//                    QuantState.from_dict does not know, a value of the wrong type, quant_type
//                    disagreeing with its key's suffix, dtype other than float32 / float16 /
//                    bfloat16, nested keys without double quantization or missing with it,
//                    nested_blocksize other than 256, nested_dtype other than "float32",
//                    nested_offset not finite; quant_map not the standard table of the type
//                    (naming the entry); nested_quant_map not DynamicMap8(); an absmax or
//                    nested_absmax value that is not finite (naming the block).
[[nodiscard]] absl::StatusOr<Quant4Imported> ImportQuant4Weight(const ShardedSafetensors& weights,
                                                                absl::string_view weight,
                                                                const Quant4Format& format,
                                                                absl::Span<uint8_t> blob);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_QUANT4_IMPORT_H_
