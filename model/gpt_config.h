// GptConfig: the dimensions of a GPT-2-architecture model, the named presets (Hugging Face GPT-2
// sizes and PatrickStar's 1B..18B), and the model's parameters as operators for the chunk layer
// (chunk/operator_spec.h): what GptModel places in chunks, what the trainer's chunk-size search
// and the benchmarks lay out. The chunk layer itself knows no model.
//
// Operators, in forward order, with Hugging Face GPT-2 parameter names (without the
// "transformer." prefix) and shapes (Conv1D weights are [in, out]):
//   wte                 wte.weight [vocab, hidden]            (whole: VocabLayoutOptions default)
//   or wte[r0:r1]       wte.weight[r0:r1] [r1 - r0, hidden]   (row blocks, in row order)
//   wpe                 wpe.weight [seq, hidden]
//   h.{i}.ln_1          h.{i}.ln_1.weight [hidden], h.{i}.ln_1.bias [hidden]
//   h.{i}.attn.c_attn   h.{i}.attn.c_attn.weight [hidden, 3 hidden], .bias [3 hidden]
//   h.{i}.attn.c_proj   h.{i}.attn.c_proj.weight [hidden, hidden], .bias [hidden]
//   h.{i}.ln_2          h.{i}.ln_2.weight [hidden], .bias [hidden]
//   h.{i}.mlp.c_fc      h.{i}.mlp.c_fc.weight [hidden, 4 hidden], .bias [4 hidden]
//   h.{i}.mlp.c_proj    h.{i}.mlp.c_proj.weight [4 hidden, hidden], .bias [hidden]
//   ln_f                ln_f.weight [hidden], ln_f.bias [hidden]
// The LM head is tied to wte and has no parameters of its own.
//
// The vocabulary in row blocks. wte is the largest matrix of most GPTs (GPT-2: 38.6M of 124M
// parameters), and an operator is the unit of chunk access, so a whole wte would set the chunk
// size (and the accelerator's working set) for the whole model. Every use of wte is
// row-separable (the embedding gathers rows by token, the LM head computes logits one vocabulary
// tile at a time: model/kernels/vocab_blocks.h), so it is split into blocks of
// VocabLayoutOptions::vocab_block_rows rows, each an ordinary operator; the blocks are sized to the
// chunk (GptVocabBlockRowsForChunk) in whole LM-head vocabulary tiles, so the split changes no
// result. A block named "wte.weight[r0:r1]" holds rows [r0, r1) of Hugging Face's wte.weight.
//
// Thread safety: pure functions.
#ifndef PATRICKSTAR_MODEL_GPT_CONFIG_H_
#define PATRICKSTAR_MODEL_GPT_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chunk/operator_spec.h"

namespace ps {

struct GptConfig {
  std::string name;
  int64_t vocab_size = 50257;
  // Positions (n_positions / n_ctx).
  int64_t max_seq_len = 1024;
  int64_t hidden = 768;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
};

// Rows of one LM-head vocabulary tile (GptModelOptions::ce_vocab_tile's default): vocabulary row
// blocks are multiples of it, so that splitting changes no tile.
inline constexpr int64_t kDefaultVocabTileRows = 2048;

// How GptOperators lays out wte (see the file comment).
struct VocabLayoutOptions {
  // Rows per block; 0 or >= vocab_size: one operator "wte" holding "wte.weight" whole.
  int64_t vocab_block_rows = 0;
};

// One row block of wte.
struct GptVocabBlock {
  int64_t row_begin = 0;
  int64_t rows = 0;
  std::string op_name;      // "wte" (whole) or "wte[r0:r1]"
  std::string tensor_name;  // "wte.weight" (whole) or "wte.weight[r0:r1]"
};

// Presets by name:
//   "tiny"         vocab 256, seq 64, hidden 64, 2 layers, 4 heads (tests)
//   "gpt2"         124M: 768/12/12     "gpt2-medium" 350M: 1024/24/16
//   "gpt2-large"   774M: 1280/36/20    "gpt2-xl"     1.5B: 1600/48/25
//   PatrickStar's (hidden/layers/heads, seq 1024, vocab 50257): "1B" 2048/20/16,
//   "2B" 2048/40/16, "4B" 2304/64/16, "6B" 3072/53/16, "8B" 3072/72/16, "10B" 4096/50/16,
//   "12B" 4096/60/16, "15B" 4096/78/16, "18B" 4096/90/16.
// InvalidArgument listing the known names for anything else.
absl::StatusOr<GptConfig> GptPreset(absl::string_view name);

// The preset names above, in that order.
std::vector<std::string> GptPresetNames();

// InvalidArgument naming the field for a non-positive size or a hidden size that the number of
// heads does not divide.
[[nodiscard]] absl::Status ValidateGptConfig(const GptConfig& config);

// The operators in forward order (see the file comment). REQUIRES: ValidateGptConfig is OK and
// layout.vocab_block_rows >= 0.
std::vector<OperatorSpec> GptOperators(const GptConfig& config,
                                       const VocabLayoutOptions& layout = {});

// The blocks of wte under `layout`, in row order (one block covering every row when unsplit).
// REQUIRES as GptOperators.
std::vector<GptVocabBlock> GptVocabBlocks(const GptConfig& config,
                                          const VocabLayoutOptions& layout);

// The rows per block that chunks of `chunk_elems` elements hold: the largest multiple of
// `row_quantum` rows (min(row_quantum, vocab_size) when the vocabulary is smaller) whose `hidden`
// elements each fit, capped at vocab_size; 0 when not even one quantum fits.
// REQUIRES: chunk_elems > 0, row_quantum > 0, a valid config.
int64_t GptVocabBlockRowsForChunk(const GptConfig& config, int64_t chunk_elems,
                                  int64_t row_quantum = kDefaultVocabTileRows);

// The smallest chunk that holds every operator once wte is split to fit it: the largest
// non-vocabulary operator, and one row quantum of wte. REQUIRES as above.
int64_t GptMinChunkElems(const GptConfig& config, int64_t row_quantum = kDefaultVocabTileRows);

// "wte.weight[0:2048]" -> {"wte.weight", 0, 2048}; nullopt for a name without a row range.
struct RowBlockName {
  std::string base;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};
std::optional<RowBlockName> ParseRowBlockName(absl::string_view name);
// "wte.weight", 0, 2048 -> "wte.weight[0:2048]".
std::string RowBlockNameOf(absl::string_view base, int64_t row_begin, int64_t row_end);

// Closed form of the parameter count: (vocab + seq) h + layers (12 h^2 + 13 h) + 2 h.
int64_t GptParameterCount(const GptConfig& config);

}  // namespace ps

#endif  // PATRICKSTAR_MODEL_GPT_CONFIG_H_
