#include "trainer/testing/hf_model_dir.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"

namespace ps::trainer_testing {

absl::Status WriteTinyHfModel(const std::string& dir, const ModelConfig& config, uint64_t seed) {
  return WriteHfCheckpoint(
      dir, config, DType::kF32,
      ConvertingFill(
          [seed](const TensorSpec& t, int64_t first, absl::Span<float> out) -> absl::Status {
            if (absl::StrContains(t.name, "norm") || absl::StrContains(t.name, "ln_")) {
              std::fill(out.begin(), out.end(), 1.0f);
            } else if (absl::EndsWith(t.name, ".bias")) {
              std::fill(out.begin(), out.end(), 0.0f);
            } else {
              std::mt19937_64 gen(std::hash<std::string>()(t.name) ^ static_cast<uint64_t>(first) ^
                                  (seed * 0x9E3779B97F4A7C15ULL));
              std::normal_distribution<double> normal(0.0, 0.02);
              for (float& v : out) v = static_cast<float>(normal(gen));
            }
            return absl::OkStatus();
          },
          DType::kF32));
}

}  // namespace ps::trainer_testing
