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
#include "model/parameter_init_simd.h"

namespace ps {
namespace {

// The first output of SplitMix64 from state `x`.
uint64_t FirstSplitMix64(uint64_t x) { return SplitMix64(x).Next(); }

// Box-Muller of the draws (a, b) as the file comment defines it, with libm's log, sin and cos in
// double: the values every vectorized pair equals (parameter_init_simd.h).
void ScalarPair(uint64_t a, uint64_t b, double std, float* cos_value, float* sin_value) {
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  const double u1 = static_cast<double>((a >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;        // [0, 1)
  const double r = std::sqrt(-2.0 * std::log(u1));
  *cos_value = static_cast<float>(std * r * std::cos(kTwoPi * u2));
  *sin_value = static_cast<float>(std * r * std::sin(kTwoPi * u2));
}

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
  using namespace parameter_init_internal;  // NOLINT: the internal kernels' names
  if (out.empty()) return;
  // The engine's state, seeded as std::mt19937_64's constructor does, with NormalBlock's padding.
  alignas(64) uint64_t mt[2 * (kMtPairs + kMtPadPairs)] = {};
  mt[0] = FirstSplitMix64(seed ^ FirstSplitMix64(stream));
  for (int i = 1; i < kMtStateWords; ++i) {
    mt[i] = 6364136223846793005ULL * (mt[i - 1] ^ (mt[i - 1] >> 62)) + static_cast<uint64_t>(i);
  }
  // Element e is draw e's half of pair e / 2; draws [312 k, 312 k + 312) come from twist k + 1.
  int64_t block = first_elem / kMtStateWords;
  for (int64_t k = 0; k < block; ++k) MtTwist(mt);
  float cos_v[kMtPairs + kMtPadPairs];
  float sin_v[kMtPairs + kMtPadPairs];
  int redo[kMtPairs + kMtPadPairs];
  int64_t e = first_elem;
  size_t i = 0;
  while (i < out.size()) {
    MtTwist(mt);
    const int redone = NormalBlock(mt, std, cos_v, sin_v, redo);
    for (int k = 0; k < redone; ++k) {
      const int p = redo[k];
      ScalarPair(MtTemper(mt[2 * p]), MtTemper(mt[2 * p + 1]), std, &cos_v[p], &sin_v[p]);
    }
    for (int64_t j = e - block * kMtStateWords; j < kMtStateWords && i < out.size(); ++j, ++e) {
      out[i++] = (j % 2 == 0 ? cos_v : sin_v)[j / 2];
    }
    ++block;
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
