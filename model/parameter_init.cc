#include "model/parameter_init.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/splitmix64.h"
#include "model/model_config.h"

namespace ps {
namespace {

// The first output of SplitMix64 from state `x`.
uint64_t FirstSplitMix64(uint64_t x) { return SplitMix64(x).Next(); }

}  // namespace

ParameterInit InitOf(ModelArchitecture architecture, int64_t num_layers, absl::string_view name,
                     double norm_weight_offset) {
  const bool gpt2 = architecture == ModelArchitecture::kGpt2;
  const bool norm = gpt2 ? absl::StrContains(name, "ln_")
                         : absl::EndsWith(name, "layernorm.weight") ||
                               name == "model.norm.weight" || absl::EndsWith(name, "_norm.weight");
  if (norm) {
    return {.kind = ParameterInit::Kind::kConstant,
            .value = absl::EndsWith(name, ".weight")
                         ? static_cast<float>(1.0 - norm_weight_offset)
                         : 0.0f};
  }
  if (absl::EndsWith(name, ".bias")) return {.kind = ParameterInit::Kind::kConstant, .value = 0.0f};
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(num_layers));
  return {.kind = ParameterInit::Kind::kNormal,
          .std = gpt2 && absl::EndsWith(name, "c_proj.weight") ? residual_std : 0.02};
}

std::mt19937_64 ParameterStream(uint64_t seed, uint64_t stream) {
  return std::mt19937_64(FirstSplitMix64(seed ^ FirstSplitMix64(stream)));
}

void FillNormal(uint64_t seed, uint64_t stream, double std, int64_t first_elem,
                absl::Span<float> out) {
  std::mt19937_64 gen = ParameterStream(seed, stream);
  gen.discard(static_cast<unsigned long long>(first_elem / 2) * 2);
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  int64_t e = first_elem;
  size_t i = 0;
  while (i < out.size()) {
    const double u1 = static_cast<double>((gen() >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(gen() >> 11) * 0x1.0p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    if (e % 2 == 0) {
      out[i++] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
      ++e;
      if (i == out.size()) break;
    }
    out[i++] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
    ++e;
  }
}

void FillInitialValues(const ParameterInit& init, uint64_t seed, uint64_t stream,
                       int64_t first_elem, absl::Span<float> out) {
  if (init.kind == ParameterInit::Kind::kConstant) {
    std::fill(out.begin(), out.end(), init.value);
    return;
  }
  FillNormal(seed, stream, init.std, first_elem, out);
}

}  // namespace ps
