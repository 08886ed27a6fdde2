#include "model/gpt_config.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace ps {
namespace {

struct Preset {
  const char* name;
  int64_t vocab_size;
  int64_t max_seq_len;
  int64_t hidden;
  int64_t num_layers;
  int64_t num_heads;
};

constexpr Preset kPresets[] = {
    {"tiny", 256, 64, 64, 2, 4},
    {"gpt2", 50257, 1024, 768, 12, 12},
    {"gpt2-medium", 50257, 1024, 1024, 24, 16},
    {"gpt2-large", 50257, 1024, 1280, 36, 20},
    {"gpt2-xl", 50257, 1024, 1600, 48, 25},
    {"1B", 50257, 1024, 2048, 20, 16},
    {"2B", 50257, 1024, 2048, 40, 16},
    {"4B", 50257, 1024, 2304, 64, 16},
    {"6B", 50257, 1024, 3072, 53, 16},
    {"8B", 50257, 1024, 3072, 72, 16},
    {"10B", 50257, 1024, 4096, 50, 16},
    {"12B", 50257, 1024, 4096, 60, 16},
    {"15B", 50257, 1024, 4096, 78, 16},
    {"18B", 50257, 1024, 4096, 90, 16},
};

OperatorSpec LinearOp(const std::string& name, int64_t in, int64_t out) {
  return OperatorSpec{name, {{name + ".weight", {in, out}}, {name + ".bias", {out}}}};
}

OperatorSpec LayerNormOp(const std::string& name, int64_t hidden) {
  return OperatorSpec{name, {{name + ".weight", {hidden}}, {name + ".bias", {hidden}}}};
}

}  // namespace

absl::StatusOr<GptConfig> GptPreset(absl::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      return GptConfig{p.name, p.vocab_size, p.max_seq_len, p.hidden, p.num_layers, p.num_heads};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown GPT preset '", name, "'; known presets: ", absl::StrJoin(GptPresetNames(), ", ")));
}

std::vector<std::string> GptPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

absl::Status ValidateGptConfig(const GptConfig& c) {
  const std::pair<const char*, int64_t> fields[] = {{"vocab_size", c.vocab_size},
                                                    {"max_seq_len", c.max_seq_len},
                                                    {"hidden", c.hidden},
                                                    {"num_layers", c.num_layers},
                                                    {"num_heads", c.num_heads}};
  for (const auto& [field, value] : fields) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPT config '", c.name, "': ", field, " must be positive, got ", value));
    }
  }
  if (c.hidden % c.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPT config '", c.name, "': hidden ", c.hidden,
                                                   " is not a multiple of num_heads ",
                                                   c.num_heads));
  }
  return absl::OkStatus();
}

std::string RowBlockNameOf(absl::string_view base, int64_t row_begin, int64_t row_end) {
  return absl::StrCat(base, "[", row_begin, ":", row_end, "]");
}

std::optional<RowBlockName> ParseRowBlockName(absl::string_view name) {
  if (!absl::EndsWith(name, "]")) return std::nullopt;
  const size_t open = name.rfind('[');
  if (open == absl::string_view::npos || open == 0) return std::nullopt;
  const absl::string_view range = name.substr(open + 1, name.size() - open - 2);
  const size_t colon = range.find(':');
  if (colon == absl::string_view::npos) return std::nullopt;
  RowBlockName out;
  if (!absl::SimpleAtoi(range.substr(0, colon), &out.row_begin) ||
      !absl::SimpleAtoi(range.substr(colon + 1), &out.row_end) || out.row_begin < 0 ||
      out.row_end <= out.row_begin) {
    return std::nullopt;
  }
  out.base = std::string(name.substr(0, open));
  return out;
}

std::vector<GptVocabBlock> GptVocabBlocks(const GptConfig& c, const VocabLayoutOptions& layout) {
  CHECK_GE(layout.vocab_block_rows, 0);
  const int64_t v = c.vocab_size;
  const int64_t rows = layout.vocab_block_rows == 0 ? v : std::min(layout.vocab_block_rows, v);
  std::vector<GptVocabBlock> blocks;
  if (rows == v) {
    blocks.push_back({0, v, "wte", "wte.weight"});
    return blocks;
  }
  for (int64_t r = 0; r < v; r += rows) {
    const int64_t end = std::min(v, r + rows);
    blocks.push_back(
        {r, end - r, RowBlockNameOf("wte", r, end), RowBlockNameOf("wte.weight", r, end)});
  }
  return blocks;
}

int64_t GptVocabBlockRowsForChunk(const GptConfig& c, int64_t chunk_elems, int64_t row_quantum) {
  CHECK_GT(chunk_elems, 0);
  CHECK_GT(row_quantum, 0);
  const int64_t quantum = std::min(row_quantum, c.vocab_size);
  const int64_t fit_rows = chunk_elems / c.hidden;
  const int64_t rows = fit_rows / quantum * quantum;
  return std::min(rows, c.vocab_size);
}

int64_t GptMinChunkElems(const GptConfig& c, int64_t row_quantum) {
  // The largest operator when wte is cut into blocks of row_quantum rows: every other operator is
  // independent of the vocabulary, so the operators of the same model with a vocabulary of one
  // block (unsplit) give it without listing the blocks (a vocabulary of 1e9 rows made this list a
  // billion one-row blocks: minutes and gigabytes before any plan could refuse the model).
  GptConfig one_block = c;
  one_block.vocab_size = std::min(row_quantum, c.vocab_size);
  int64_t largest = 0;
  for (const OperatorSpec& op : GptOperators(one_block, {.vocab_block_rows = 0})) {
    largest = std::max(largest, OperatorNumElems(op));
  }
  return largest;
}

std::vector<OperatorSpec> GptOperators(const GptConfig& c, const VocabLayoutOptions& layout) {
  const absl::Status valid = ValidateGptConfig(c);
  CHECK(valid.ok()) << valid;
  const int64_t h = c.hidden;
  const std::vector<GptVocabBlock> blocks = GptVocabBlocks(c, layout);
  std::vector<OperatorSpec> ops;
  ops.reserve(blocks.size() + 2 + 6 * c.num_layers);
  for (const GptVocabBlock& b : blocks) {
    ops.push_back(OperatorSpec{b.op_name, {{b.tensor_name, {b.rows, h}}}});
  }
  ops.push_back(OperatorSpec{"wpe", {{"wpe.weight", {c.max_seq_len, h}}}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    ops.push_back(LayerNormOp(p + "ln_1", h));
    ops.push_back(LinearOp(p + "attn.c_attn", h, 3 * h));
    ops.push_back(LinearOp(p + "attn.c_proj", h, h));
    ops.push_back(LayerNormOp(p + "ln_2", h));
    ops.push_back(LinearOp(p + "mlp.c_fc", h, 4 * h));
    ops.push_back(LinearOp(p + "mlp.c_proj", 4 * h, h));
  }
  ops.push_back(LayerNormOp("ln_f", h));
  return ops;
}

int64_t GptParameterCount(const GptConfig& c) {
  const int64_t h = c.hidden;
  return (c.vocab_size + c.max_seq_len) * h + c.num_layers * (12 * h * h + 13 * h) + 2 * h;
}

}  // namespace ps
