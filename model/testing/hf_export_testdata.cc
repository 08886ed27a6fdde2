#include "model/testing/hf_export_testdata.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"
#include "model/hf_checkpoint.h"

namespace ps::testing {

uint64_t Fnv1a64(absl::Span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ULL;
  }
  return h;
}

float HfTestValue(absl::string_view name, int64_t i) {
  const uint64_t seed = Fnv1a64(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(name.data()), name.size()));
  const uint64_t k = (Mix64(seed + static_cast<uint64_t>(i)) >> 40) % 129;
  return (static_cast<float>(k) - 64.0f) / 64.0f;
}

std::vector<HfExportCase> HfExportCases() {
  std::vector<HfExportCase> cases;
  ModelConfig llama;
  llama.name = "cpp_export_llama";
  llama.family = ModelFamily::kLlama;
  llama.vocab_size = 48;
  llama.hidden_size = 32;
  llama.num_layers = 2;
  llama.num_heads = 4;
  llama.num_kv_heads = 2;
  llama.head_dim = 8;
  llama.intermediate_size = 40;
  llama.max_position_embeddings = 256;
  llama.norm_eps = 1e-5;
  llama.rope_theta = 500000;
  llama.rope_scaling = {RopeScalingType::kLlama3, 8, 1, 4, 64};
  llama.qkv_bias = llama.o_proj_bias = llama.mlp_bias = true;
  llama.tie_word_embeddings = false;
  cases.push_back({"cpp_export_llama", llama, DType::kBF16, 6000});

  ModelConfig qwen;
  qwen.name = "cpp_export_qwen2";
  qwen.family = ModelFamily::kQwen2;
  qwen.vocab_size = 40;
  qwen.hidden_size = 24;
  qwen.num_layers = 2;
  qwen.num_heads = 4;
  qwen.num_kv_heads = 2;
  qwen.head_dim = 10;  // != 24 / 4
  qwen.intermediate_size = 36;
  qwen.max_position_embeddings = 128;
  qwen.norm_eps = 1e-6;
  qwen.rope_theta = 1000000;
  qwen.qkv_bias = true;
  qwen.tie_word_embeddings = true;
  cases.push_back({"cpp_export_qwen2", qwen, DType::kF16, 4000});

  ModelConfig mistral = llama;
  mistral.name = "cpp_export_mistral";
  mistral.family = ModelFamily::kMistral;
  mistral.rope_scaling = {};
  mistral.rope_theta = 1000000;
  mistral.qkv_bias = mistral.o_proj_bias = mistral.mlp_bias = false;
  cases.push_back({"cpp_export_mistral", mistral, DType::kF32, kDefaultMaxShardBytes});

  GptConfig gpt{"cpp_export_gpt2", 40, 16, 16, 2, 2};
  cases.push_back({"cpp_export_gpt2", FromGptConfig(gpt), DType::kF32, kDefaultMaxShardBytes});
  return cases;
}

absl::Status WriteHfExportTestdata(const std::string& out_dir) {
  for (const HfExportCase& c : HfExportCases()) {
    HfExportOptions options;
    options.max_shard_bytes = c.max_shard_bytes;
    options.max_piece_bytes = 100;  // many pieces per tensor: exercises the streaming path
    RETURN_IF_ERROR(
        WriteHfCheckpoint(absl::StrCat(out_dir, "/", c.dir_name), c.config, c.dtype,
                          ConvertingFill(
                              [](const TensorSpec& t, int64_t first, absl::Span<float> dst) {
                                for (size_t j = 0; j < dst.size(); ++j) {
                                  dst[j] = HfTestValue(t.name, first + static_cast<int64_t>(j));
                                }
                                return absl::OkStatus();
                              },
                              c.dtype),
                          options));
  }
  return absl::OkStatus();
}

}  // namespace ps::testing
