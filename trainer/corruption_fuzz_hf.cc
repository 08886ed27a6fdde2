#include "trainer/corruption_fuzz_hf.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"

namespace ps::corruption_fuzz {

absl::Status WriteTinyHfDirectory(const std::string& dir) {
  ASSIGN_OR_RETURN(ModelConfig llama, ModelPreset("llama-tiny"));
  llama.vocab_size = 64;
  HfExportOptions options;
  options.max_shard_bytes = 48 * 1024;
  return WriteHfCheckpoint(
      dir, llama, DType::kBF16,
      ConvertingFill(
          [](const TensorSpec&, int64_t first, absl::Span<float> dst) {
            for (size_t j = 0; j < dst.size(); ++j) {
              dst[j] = static_cast<float>((first + static_cast<int64_t>(j)) % 17) * 0.0625f;
            }
            return absl::OkStatus();
          },
          DType::kBF16),
      options);
}

absl::Status OpenAndReadHfDirectory(const std::string& dir) {
  ASSIGN_OR_RETURN(HfCheckpoint ckpt, HfCheckpoint::Open(dir));
  for (const TensorSpec& p : ckpt.parameters()) {
    std::vector<float> v(static_cast<size_t>(p.numel()));
    if (absl::Status s = ckpt.ReadAsF32(p.name, 0, absl::MakeSpan(v)); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("Open succeeded but reading ", p.name, " failed: ", s.ToString()));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) {
        return absl::InternalError(
            absl::StrCat("Open succeeded but ", p.name, "[", i, "] is ", v[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::corruption_fuzz
