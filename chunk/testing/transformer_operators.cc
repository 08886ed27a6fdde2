#include "chunk/testing/transformer_operators.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ps {
namespace chunk_testing {
namespace {

OperatorSpec Linear(const std::string& name, int64_t in, int64_t out) {
  return OperatorSpec{name, {{name + ".weight", {in, out}}, {name + ".bias", {out}}}};
}

OperatorSpec Norm(const std::string& name, int64_t hidden) {
  return OperatorSpec{name, {{name + ".weight", {hidden}}, {name + ".bias", {hidden}}}};
}

}  // namespace

std::vector<OperatorSpec> TransformerOperators(const TransformerShape& s) {
  CHECK(s.vocab_size > 0 && s.positions > 0 && s.hidden > 0 && s.num_layers > 0);
  const int64_t h = s.hidden;
  std::vector<OperatorSpec> ops;
  if (s.vocab_block_rows <= 0 || s.vocab_block_rows >= s.vocab_size) {
    ops.push_back(OperatorSpec{"wte", {{"wte.weight", {s.vocab_size, h}}}});
  } else {
    for (int64_t r = 0; r < s.vocab_size; r += s.vocab_block_rows) {
      const int64_t end = std::min(s.vocab_size, r + s.vocab_block_rows);
      ops.push_back(OperatorSpec{absl::StrCat("wte[", r, ":", end, "]"),
                                 {{absl::StrCat("wte.weight[", r, ":", end, "]"), {end - r, h}}}});
    }
  }
  ops.push_back(OperatorSpec{"wpe", {{"wpe.weight", {s.positions, h}}}});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    ops.push_back(Norm(p + "ln_1", h));
    ops.push_back(Linear(p + "attn.c_attn", h, 3 * h));
    ops.push_back(Linear(p + "attn.c_proj", h, h));
    ops.push_back(Norm(p + "ln_2", h));
    ops.push_back(Linear(p + "mlp.c_fc", h, 4 * h));
    ops.push_back(Linear(p + "mlp.c_proj", 4 * h, h));
  }
  ops.push_back(Norm("ln_f", h));
  return ops;
}

}  // namespace chunk_testing
}  // namespace ps
