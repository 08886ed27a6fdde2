// ModelStateIo::BaseFingerprint (model/model_state_io.h): the digest of a LoRA run's frozen base
// that checkpoints store. Its value is a format: a change to it turns every saved LoRA checkpoint
// into a refusal.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "chunk/operator_spec.h"
#include "memory/dtype.h"
#include "model/lora_config.h"
#include "model/model_state_io.h"

namespace ps {

absl::StatusOr<std::string> ModelStateIo::BaseFingerprint() const {
  RETURN_IF_ERROR(CheckExport("BaseFingerprint", /*need_lora=*/true, /*whole_model=*/true));
  // FNV-1a's offset and prime over 64-bit words (gpt_model.h's BaseFingerprint comment): a 7B base
  // is 13 GB of f32 values, a multiply per byte took minutes, one per 8 bytes takes seconds.
  uint64_t h = 0xcbf29ce484222325ull;
  const auto mix_word = [&h](uint64_t w) {
    h ^= w;
    h *= 0x100000001b3ull;
    h ^= h >> 32;
  };
  auto mix = [&mix_word](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix_word(w);
    }
    if (i < bytes) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, bytes - i);
      mix_word(w);
    }
    mix_word(static_cast<uint64_t>(bytes));
  };
  const absl::string_view dtype = DTypeName(parts_.store->compute_dtype());
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<float> values;
  // Whole (Hugging Face) tensors, so that the vocabulary split does not change the digest.
  for (const OperatorSpec& op :
       LoraModelOperators(*parts_.model_config, *parts_.lora, {.vocab_block_rows = 0})) {
    if (op.trainable) continue;
    for (const TensorSpec& t : op.tensors) {
      mix(t.name.data(), t.name.size());
      mix("", 1);
      for (const int64_t d : t.shape) mix(&d, sizeof(d));
      mix(dtype.data(), dtype.size());
      ASSIGN_OR_RETURN(const int64_t numel, ShapeNumElems(t.shape));
      for (int64_t first = 0; first < numel; first += kPiece) {
        values.resize(static_cast<size_t>(std::min(kPiece, numel - first)));
        RETURN_IF_ERROR(ReadTensorRange(ChunkType::kParam, t.name, first, absl::MakeSpan(values)));
        mix(values.data(), values.size() * sizeof(float));
      }
    }
  }
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

}  // namespace ps
