// Operator lists shaped like a GPT-2 transformer, for tests of the chunk layer, which knows no
// model: realistic operator sizes and Hugging Face GPT-2 names (wte whole or in row blocks
// "wte[r0:r1]", wpe, per block ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, then ln_f)
// without depending on model/.
// model/gpt_config_test checks that model/gpt_config.h's GptOperators produces exactly these lists
// for every preset, so the chunk tests exercise the model's real shapes. Test-only.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_CHUNK_TESTING_TRANSFORMER_OPERATORS_H_
#define PATRICKSTAR_CHUNK_TESTING_TRANSFORMER_OPERATORS_H_

#include <cstdint>
#include <vector>

#include "chunk/operator_spec.h"

namespace ps {
namespace chunk_testing {

struct TransformerShape {
  int64_t vocab_size = 0;
  int64_t positions = 0;
  int64_t hidden = 0;
  int64_t num_layers = 0;
  // Rows of wte per operator; 0: one operator "wte" (model/gpt_config.h's VocabLayoutOptions).
  int64_t vocab_block_rows = 0;
};

// Shapes of model/gpt_config.h's presets "tiny", "gpt2", "gpt2-medium", "1B" and "10B".
inline constexpr TransformerShape kTinyShape{256, 64, 64, 2};
inline constexpr TransformerShape kGpt2Shape{50257, 1024, 768, 12};
inline constexpr TransformerShape kGpt2MediumShape{50257, 1024, 1024, 24};
inline constexpr TransformerShape k1BShape{50257, 1024, 2048, 20};
inline constexpr TransformerShape k10BShape{50257, 1024, 4096, 50};

// The operators in forward order. REQUIRES: every field > 0.
std::vector<OperatorSpec> TransformerOperators(const TransformerShape& shape);

}  // namespace chunk_testing
}  // namespace ps

#endif  // PATRICKSTAR_CHUNK_TESTING_TRANSFORMER_OPERATORS_H_
