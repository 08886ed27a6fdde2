// The seeded initialization of a transformer's parameters, as pure functions of (tensor, seed):
// which distribution each Hugging Face tensor starts from (InitOf), and the values of one
// tensor's stream (FillNormal), reproducible on every platform.
//
// Reproducibility: each normal tensor draws from its own stream, a std::mt19937_64 (its sequence
// is fixed by the C++ standard) seeded with SplitMix64(seed ^ SplitMix64(stream)) — each
// SplitMix64(x) being the first output of base/splitmix64.h's generator from state x — and turns
// pairs of draws into normals by Box-Muller in double (std::normal_distribution is
// implementation-defined). Element 2p is the cosine and 2p + 1 the sine of pair p, which uses the
// generator's draws 2p and 2p + 1, so any element range of a tensor (a row block of the
// embedding) is computed without the elements before it and equals that range of the whole. The
// stream of a tensor is its index in the unsplit ModelOperators order (GptModel resolves it), so
// a model split into row blocks, or across ZeRO ranks, starts from the same values as one whole.
//
// Thread safety: the functions keep no state; any thread may call them.
#ifndef PATRICKSTAR_MODEL_PARAMETER_INIT_H_
#define PATRICKSTAR_MODEL_PARAMETER_INIT_H_

#include <cstdint>
#include <random>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/model_config.h"

namespace ps {

// How one parameter tensor starts: every element `value`, or drawn from N(0, std) of the tensor's
// stream.
struct ParameterInit {
  enum class Kind { kConstant, kNormal };
  Kind kind = Kind::kConstant;
  float value = 0.0f;  // kConstant
  double std = 0.0;    // kNormal
};

// The initialization of Hugging Face tensor `name` (a whole tensor, not a row block) of a model of
// `architecture` with `num_layers` layers, following transformers' _init_weights:
//   - norm weights 1 and norm biases 0 (GPT-2's ln_* LayerNorms; Llama's *layernorm and
//     model.norm RMSNorms; Qwen3's self_attn.q_norm and k_norm);
//   - other biases 0;
//   - every other weight N(0, 0.02), except GPT-2's residual projections (attn.c_proj.weight,
//     mlp.c_proj.weight), N(0, 0.02 / sqrt(2 num_layers)) as in GPT-2's paper; transformers'
//     Llama uses N(0, 0.02) throughout.
// `norm_weight_offset` is the model's RMSNorm gain offset (ModelConfig::norm_weight_offset: Gemma's
// (1 + w) has 1): norm weights start at 1 - offset, so every gain starts at 1 — transformers'
// Gemma3PreTrainedModel._init_weights zeroes its RMSNorm weights for that reason.
// REQUIRES: num_layers >= 1.
ParameterInit InitOf(ModelArchitecture architecture, int64_t num_layers, absl::string_view name,
                     double norm_weight_offset = 0);

// The generator of stream `stream` of `seed` (see the file comment): a std::mt19937_64 seeded
// with SplitMix64(seed ^ SplitMix64(stream)). Every seeded initialization draws from it
// (FillNormal here, InitLoraA in model/lora_config.h).
std::mt19937_64 ParameterStream(uint64_t seed, uint64_t stream);

// Elements [first_elem, first_elem + out.size()) of the N(0, std) values of stream `stream` of
// `seed` (see the file comment). REQUIRES: first_elem >= 0.
void FillNormal(uint64_t seed, uint64_t stream, double std, int64_t first_elem,
                absl::Span<float> out);

// Elements [first_elem, first_elem + out.size()) of a tensor that starts as `init`: the constant,
// or FillNormal(seed, stream, init.std, first_elem, out) (`stream` is read for kNormal only).
void FillInitialValues(const ParameterInit& init, uint64_t seed, uint64_t stream,
                       int64_t first_elem, absl::Span<float> out);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_PARAMETER_INIT_H_
