// The transformer program's contract as its recording context sees it (model/transformer_program.h,
// model/gpt_activation_profile.h), for random GPT-2, Llama, Qwen2 and Qwen3 shapes, dtypes,
// vocabulary splits and checkpointing: every buffer allocated is freed and never freed twice,
// accesses and releases pair up one operator at a time, and the operators are accessed in the
// documented order (forward: embedding blocks, wpe, each layer's operators, the final norm, the
// LM-head blocks; backward: the reverse (a SwiGLU's gate before up), each layer but its MLP output
// projection re-accessed in forward first under activation checkpointing). The order is derived
// here from ModelOperators, not from the program. The live context's side (the same events measured
// on a real warm-up) is trainer/activation_profile_match_ test's and model/llama_model_test's.
#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "chunk/operator_spec.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "scheduler/activation_profile.h"

namespace ps {
namespace {

struct Access {
  int64_t op;
  Stage stage;
  bool operator==(const Access& o) const { return op == o.op && stage == o.stage; }
  friend void PrintTo(const Access& a, std::ostream* os) {
    *os << a.op << (a.stage == Stage::kForward ? "F" : "B");
  }
};

// The accesses of `events` (Access then Release of the same operator, nothing accessed at once),
// checking the buffers along the way.
std::vector<Access> CheckEvents(const std::vector<ActivationEvent>& events) {
  std::set<int64_t> live;
  std::vector<Access> accesses;
  int64_t open = -1;
  Stage open_stage = Stage::kForward;
  for (const ActivationEvent& e : events) {
    switch (e.kind) {
      case ActivationEvent::Kind::kAlloc:
        EXPECT_GT(e.bytes, 0);
        EXPECT_TRUE(live.insert(e.buffer).second) << "buffer " << e.buffer << " allocated twice";
        break;
      case ActivationEvent::Kind::kFree:
        EXPECT_EQ(live.erase(e.buffer), 1u) << "buffer " << e.buffer << " freed while not live";
        break;
      case ActivationEvent::Kind::kAccess:
        EXPECT_EQ(open, -1) << "operator " << e.op << " accessed while " << open << " is";
        open = e.op;
        open_stage = e.stage;
        accesses.push_back({e.op, e.stage});
        break;
      case ActivationEvent::Kind::kRelease:
        EXPECT_EQ(e.op, open);
        EXPECT_EQ(e.stage, open_stage);
        open = -1;
        break;
    }
  }
  EXPECT_EQ(open, -1) << "an operator is never released";
  EXPECT_TRUE(live.empty()) << live.size() << " buffers never freed";
  return accesses;
}

// The documented order, from the operator list: indices of the embedding blocks, wpe, each
// layer's operators, the final norm and the untied LM head's blocks.
struct OpGroups {
  std::vector<int64_t> embed, head;
  int64_t wpe = -1, final_norm = -1;
  std::vector<std::vector<int64_t>> layers;
};

OpGroups GroupsOf(const ModelConfig& config, const std::vector<OperatorSpec>& ops) {
  OpGroups g;
  const bool gpt2 = config.architecture() == ModelArchitecture::kGpt2;
  const std::string embed = gpt2 ? "wte" : "model.embed_tokens";
  const std::string layer = gpt2 ? "h." : "model.layers.";
  g.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = 0; i < static_cast<int64_t>(ops.size()); ++i) {
    const std::string& name = ops[i].name;
    if (absl::StartsWith(name, embed)) {
      g.embed.push_back(i);
    } else if (absl::StartsWith(name, "lm_head")) {
      g.head.push_back(i);
    } else if (name == "wpe") {
      g.wpe = i;
    } else if (name == "ln_f" || name == "model.norm") {
      g.final_norm = i;
    } else {
      EXPECT_TRUE(absl::StartsWith(name, layer)) << name;
      const size_t dot = name.find('.', layer.size());
      g.layers[std::stoul(name.substr(layer.size(), dot - layer.size()))].push_back(i);
    }
  }
  if (g.head.empty()) g.head = g.embed;  // tied
  return g;
}

std::vector<Access> ExpectedIteration(const OpGroups& g, bool checkpointing) {
  std::vector<Access> a;
  const auto add = [&a](const std::vector<int64_t>& ops, Stage stage) {
    for (int64_t op : ops) a.push_back({op, stage});
  };
  add(g.embed, Stage::kForward);
  if (g.wpe >= 0) a.push_back({g.wpe, Stage::kForward});
  for (const std::vector<int64_t>& layer : g.layers) add(layer, Stage::kForward);
  a.push_back({g.final_norm, Stage::kForward});
  add(g.head, Stage::kForward);
  add(g.head, Stage::kBackward);
  a.push_back({g.final_norm, Stage::kBackward});
  for (auto layer = g.layers.rbegin(); layer != g.layers.rend(); ++layer) {
    // The recompute stops before the MLP's output projection (the block's output is not needed
    // again).
    if (checkpointing) add(std::vector<int64_t>(layer->begin(), layer->end() - 1), Stage::kForward);
    // In reverse, except a SwiGLU MLP's gate and up: both take their gradients from the one
    // SwiGLU backward, gate's first (forward order: norm, q/k/v, o, norm, gate, up, down).
    std::vector<int64_t> backward(layer->rbegin(), layer->rend());
    if (backward.size() == 7) std::swap(backward[1], backward[2]);
    add(backward, Stage::kBackward);
  }
  if (g.wpe >= 0) a.push_back({g.wpe, Stage::kBackward});
  add(std::vector<int64_t>(g.embed.rbegin(), g.embed.rend()), Stage::kBackward);
  return a;
}

std::vector<Access> ExpectedEvaluation(const OpGroups& g) {
  std::vector<Access> a;
  for (int64_t op : g.embed) a.push_back({op, Stage::kForward});
  if (g.wpe >= 0) a.push_back({g.wpe, Stage::kForward});
  for (const std::vector<int64_t>& layer : g.layers) {
    for (int64_t op : layer) a.push_back({op, Stage::kForward});
  }
  a.push_back({g.final_norm, Stage::kForward});
  for (int64_t op : g.head) a.push_back({op, Stage::kForward});
  return a;
}

ModelConfig RandomConfig(std::mt19937_64& gen, int trial) {
  const auto pick = [&gen](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  ModelConfig c;
  c.name = absl::StrCat("random-", trial);
  c.vocab_size = pick(40, 300);
  c.num_layers = pick(1, 3);
  c.max_position_embeddings = 64;
  switch (trial % 4) {
    case 0: {
      c.family = ModelFamily::kGpt2;
      c.num_heads = pick(1, 4);
      c.hidden_size = c.num_heads * 2 * pick(1, 4);
      c.num_kv_heads = c.num_heads;
      c.head_dim = c.hidden_size / c.num_heads;
      c.intermediate_size = 4 * c.hidden_size;
      c.qkv_bias = c.o_proj_bias = c.mlp_bias = true;
      c.tie_word_embeddings = true;
      c.hidden_act = HiddenAct::kGeluTanh;
      return c;
    }
    case 1:
      c.family = ModelFamily::kLlama;
      c.qkv_bias = c.o_proj_bias = pick(0, 1) == 1;
      c.mlp_bias = pick(0, 1) == 1;
      break;
    case 2:
      c.family = ModelFamily::kQwen2;
      c.qkv_bias = true;
      break;
    default:
      c.family = ModelFamily::kQwen3;
      c.qkv_bias = c.o_proj_bias = pick(0, 1) == 1;
      break;
  }
  c.num_kv_heads = pick(1, 2);
  c.num_heads = c.num_kv_heads * pick(1, 3);
  c.head_dim = 2 * pick(1, 4);
  c.hidden_size = pick(4, 24);
  c.intermediate_size = pick(4, 40);
  c.tie_word_embeddings = pick(0, 1) == 1;
  c.hidden_act = HiddenAct::kSilu;
  return c;
}

TEST(TransformerProgramTest, RecordedPassesKeepTheContract) {
  std::mt19937_64 gen(26);
  for (int trial = 0; trial < 48; ++trial) {
    const ModelConfig config = RandomConfig(gen, trial);
    ASSERT_TRUE(ValidateModelConfig(config).ok()) << ValidateModelConfig(config);
    const bool checkpointing = (trial / 4) % 2 == 1;
    const DType dtype = std::vector<DType>{DType::kF32, DType::kF16, DType::kBF16}[trial % 3];
    const int64_t tile = 8;
    const VocabLayoutOptions layout{.vocab_block_rows = (trial / 8) % 2 == 1 ? 3 * tile : 0};
    const GptModelOptions o{.batch = 1 + trial % 3,
                            .seq_len = 1 + trial % 11,
                            .activation_checkpointing = checkpointing,
                            .threads = 1 + trial % 2,
                            .attention_tile = 5,
                            .ce_row_tile = 7,
                            .ce_vocab_tile = tile};
    SCOPED_TRACE(absl::StrCat(config.name, " ", ModelFamilyName(config.family), " ",
                              DTypeName(dtype), " checkpointing ", checkpointing, " rows ",
                              layout.vocab_block_rows));
    const GptMemoryModel m = ModelActivationProfile(config, o, dtype, layout);
    const OpGroups groups = GroupsOf(config, m.ops);
    EXPECT_EQ(CheckEvents(m.profile.iteration), ExpectedIteration(groups, checkpointing));
    EXPECT_EQ(CheckEvents(m.profile.evaluation), ExpectedEvaluation(groups));
  }
}

// Checkpointing keeps one block's activations instead of all of them: the recorded peak falls.
TEST(TransformerProgramTest, CheckpointingLowersTheRecordedPeak) {
  ModelConfig config = ModelPreset("llama-tiny").value();
  config.num_layers = 4;
  const auto peak = [&](bool checkpointing) {
    const GptMemoryModel m = ModelActivationProfile(
        config, {.batch = 2, .seq_len = 32, .activation_checkpointing = checkpointing}, DType::kF32,
        {});
    int64_t live = 0, highest = 0;
    std::map<int64_t, int64_t> size_of;  // buffer -> bytes
    for (const ActivationEvent& e : m.profile.iteration) {
      if (e.kind == ActivationEvent::Kind::kAlloc) {
        size_of[e.buffer] = e.bytes;
        live += e.bytes;
        highest = std::max(highest, live);
      } else if (e.kind == ActivationEvent::Kind::kFree) {
        live -= size_of.at(e.buffer);
      }
    }
    return highest;
  };
  EXPECT_LT(peak(true), peak(false));
}

// --- LoRA layouts (model/lora_config.h): a frozen base and adapter operators ---------------------

// The documented order with adapters: each adapted base operator's access is followed by its
// adapter operator's ("<base>.lora"), in forward and in backward; Qwen3's q/k/v operator with an
// adapter is accessed again after the adapter for the q/k norms; the recompute of checkpointing
// ends with the MLP output projection's adapter, when it has one; a frozen embedding and wpe are
// not accessed in backward.
std::vector<Access> ExpectedLoraPass(const ModelConfig& config,
                                     const std::vector<OperatorSpec>& ops, bool checkpointing,
                                     bool backward) {
  std::map<std::string, int64_t> index;
  for (int64_t i = 0; i < static_cast<int64_t>(ops.size()); ++i) index[ops[i].name] = i;
  std::vector<OperatorSpec> base;
  for (const OperatorSpec& op : ops) {
    if (!absl::EndsWith(op.name, ".lora")) base.push_back(op);
  }
  const OpGroups g = GroupsOf(config, base);
  const auto adapter = [&](int64_t op) -> int64_t {
    const auto it = index.find(ops[op].name + ".lora");
    return it == index.end() ? -1 : it->second;
  };
  const bool qk_norm = config.family == ModelFamily::kQwen3;
  std::vector<Access> a;
  const auto forward_op = [&](int64_t op) {
    a.push_back({op, Stage::kForward});
    const int64_t l = adapter(op);
    if (l < 0) return;
    a.push_back({l, Stage::kForward});
    if (qk_norm && absl::EndsWith(ops[op].name, "qkv_proj")) a.push_back({op, Stage::kForward});
  };
  for (int64_t op : g.embed) a.push_back({op, Stage::kForward});
  if (g.wpe >= 0) a.push_back({g.wpe, Stage::kForward});
  for (const std::vector<int64_t>& layer : g.layers) {
    for (int64_t op : layer) forward_op(op);
  }
  a.push_back({g.final_norm, Stage::kForward});
  for (int64_t op : g.head) a.push_back({op, Stage::kForward});
  if (!backward) return a;
  for (int64_t op : g.head) a.push_back({op, Stage::kBackward});
  a.push_back({g.final_norm, Stage::kBackward});
  for (auto layer = g.layers.rbegin(); layer != g.layers.rend(); ++layer) {
    if (checkpointing) {
      for (auto op = layer->begin(); op + 1 != layer->end(); ++op) forward_op(*op);
      if (const int64_t l = adapter(layer->back()); l >= 0) a.push_back({l, Stage::kForward});
    }
    std::vector<int64_t> order(layer->rbegin(), layer->rend());
    if (order.size() == 7) std::swap(order[1], order[2]);
    for (int64_t op : order) {
      a.push_back({op, Stage::kBackward});
      if (const int64_t l = adapter(op); l >= 0) a.push_back({l, Stage::kBackward});
    }
  }
  const auto trainable = [&](int64_t op) { return ops[op].trainable; };
  if (g.wpe >= 0 && trainable(g.wpe)) a.push_back({g.wpe, Stage::kBackward});
  if (trainable(g.embed.front())) {
    for (auto op = g.embed.rbegin(); op != g.embed.rend(); ++op) {
      a.push_back({*op, Stage::kBackward});
    }
  }
  return a;
}

TEST(TransformerProgramTest, LoraPassesKeepTheContractAndTheOrder) {
  std::mt19937_64 gen(28);
  for (int trial = 0; trial < 48; ++trial) {
    const ModelConfig config = RandomConfig(gen, trial);
    ASSERT_TRUE(ValidateModelConfig(config).ok()) << ValidateModelConfig(config);
    // A random non-empty subset of the linear layers, r = 1 (fits every layer).
    LoraConfig lora;
    lora.r = 1;
    lora.lora_alpha = 2;
    lora.lora_dropout = trial % 2 == 0 ? 0.0 : 0.1;
    const std::vector<std::string> names = LoraLinearModuleNames(config);
    while (lora.target_modules.empty()) {
      for (const std::string& name : names) {
        if (std::uniform_int_distribution<int>(0, 1)(gen) == 1) {
          lora.target_modules.push_back(name);
        }
      }
    }
    ASSERT_TRUE(ValidateLoraConfig(config, lora).ok()) << ValidateLoraConfig(config, lora);
    const bool checkpointing = (trial / 4) % 2 == 1;
    const DType dtype = std::vector<DType>{DType::kF32, DType::kF16, DType::kBF16}[trial % 3];
    const int64_t tile = 8;
    const VocabLayoutOptions layout{.vocab_block_rows = (trial / 8) % 2 == 1 ? 3 * tile : 0};
    const GptModelOptions o{.batch = 1 + trial % 3,
                            .seq_len = 1 + trial % 11,
                            .activation_checkpointing = checkpointing,
                            .threads = 1 + trial % 2,
                            .attention_tile = 5,
                            .ce_row_tile = 7,
                            .ce_vocab_tile = tile,
                            .lora = lora};
    SCOPED_TRACE(absl::StrCat(config.name, " ", ModelFamilyName(config.family), " ",
                              DTypeName(dtype), " checkpointing ", checkpointing, " targets ",
                              absl::StrJoin(lora.target_modules, ",")));
    const GptMemoryModel m = ModelActivationProfile(config, o, dtype, layout);
    EXPECT_EQ(m.ops.size(), LoraModelOperators(config, lora, layout).size());
    EXPECT_EQ(CheckEvents(m.profile.iteration),
              ExpectedLoraPass(config, m.ops, checkpointing, /*backward=*/true));
    EXPECT_EQ(CheckEvents(m.profile.evaluation),
              ExpectedLoraPass(config, m.ops, checkpointing, /*backward=*/false));
  }
}

int64_t RecordedPeak(const std::vector<ActivationEvent>& events) {
  int64_t live = 0, highest = 0;
  std::map<int64_t, int64_t> size_of;  // buffer -> bytes
  for (const ActivationEvent& e : events) {
    if (e.kind == ActivationEvent::Kind::kAlloc) {
      size_of[e.buffer] = e.bytes;
      live += e.bytes;
      highest = std::max(highest, live);
    } else if (e.kind == ActivationEvent::Kind::kFree) {
      live -= size_of.at(e.buffer);
    }
  }
  return highest;
}

// A frozen base allocates no weight gradients: a LoRA run's recorded tide stays below the full
// model's even with adapters on every projection.
TEST(TransformerProgramTest, FrozenBaseLowersTheRecordedPeak) {
  ModelConfig config = ModelPreset("llama-tiny").value();
  config.num_layers = 2;
  LoraConfig lora;
  lora.r = 2;
  lora.target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                         "gate_proj", "up_proj", "down_proj"};
  GptModelOptions o{.batch = 2, .seq_len = 32};
  const int64_t full =
      RecordedPeak(ModelActivationProfile(config, o, DType::kF32, {}).profile.iteration);
  o.lora = lora;
  const int64_t frozen =
      RecordedPeak(ModelActivationProfile(config, o, DType::kF32, {}).profile.iteration);
  EXPECT_LT(frozen, full);
}

}  // namespace
}  // namespace ps
