#include "model/model_config.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "base/testing/status_matchers.h"
#include "chunk/operator_spec.h"
#include "gtest/gtest.h"
#include "model/gpt_config.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// Published parameter counts: the Hugging Face Hub's "safetensors total" of each model (the sum
// of the elements of the tensors in its safetensors files), cross-checked where possible against
// model.safetensors.index.json's total_size: Meta-Llama-3-8B 16,060,522,496 bytes of bf16;
// Llama-2-7b-hf 13,476,839,424 bytes = 2 x 6,738,415,616 f16 parameters + 8,192 bytes of f32
// rotary_emb.inv_freq buffers (32 layers x 64), which are not parameters. TinyLlama's
// safetensors header: {"F32": 1100048384}. Qwen2.5 model cards: 0.49B (0.36B non-embedding),
// 1.54B (1.31B non-embedding) and 3.09B (2.77B non-embedding). Qwen3 model cards: 0.6B (0.44B
// non-embedding), 4.0B (3.6B non-embedding); their embedding is tied (151936 x E). Qwen2.5-14B and
// -32B: the closed form over their config.json values (untied 152064 x 5120 embedding and head,
// q/k/v biases, [L] in model_config.cc) gives 14,770,033,664 and 32,763,876,352 (their model cards
// say "14.7B" and "32.5B"). SmolLM3-3B: transformers 4.57.6's SmolLM3ForCausalLM built on the
// meta device from its config.json values counts 3,075,098,624 ("3B", 3.08B on its model card);
// OLMo-2-0425-1B: Olmo2ForCausalLM likewise counts 1,484,916,736 ("1B", 1.48B); Phi-4-mini:
// Phi3ForCausalLM likewise counts 3,836,021,760 ("3.8B").
struct Published {
  const char* preset;
  int64_t params;
};
constexpr Published kPublished[] = {
    {"llama-3.2-1b", 1'235'814'400}, {"llama-3-8b", 8'030'261'248},
    {"llama-2-7b", 6'738'415'616},   {"tinyllama-1.1b", 1'100'048'384},
    {"qwen2.5-0.5b", 494'032'768},   {"qwen2.5-1.5b", 1'543'714'304},
    {"qwen2.5-3b", 3'085'938'688},   {"mistral-7b-v0.3", 7'248'023'552},
    {"qwen3-0.6b", 596'049'920},     {"qwen3-4b", 4'022'468'096},
    {"qwen2.5-14b", 14'770'033'664}, {"qwen2.5-32b", 32'763'876'352},
    {"smollm3-3b", 3'075'098'624},   {"olmo-2-1b", 1'484'916'736},
    {"phi-4-mini", 3'836'021'760},   {"gemma-3-1b", 999'885'952},
    {"gemma-3-4b", 3'880'263'168},
};

void ExpectSameOperators(const std::vector<OperatorSpec>& a, const std::vector<OperatorSpec>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].tensors.size(), b[i].tensors.size()) << a[i].name;
    for (size_t j = 0; j < a[i].tensors.size(); ++j) {
      EXPECT_EQ(a[i].tensors[j].name, b[i].tensors[j].name);
      EXPECT_EQ(a[i].tensors[j].shape, b[i].tensors[j].shape) << a[i].tensors[j].name;
    }
  }
}

// Every operator valid, every tensor name unique, and the closed form equal to the sum.
void ExpectConsistent(const ModelConfig& c) {
  ASSERT_OK(ValidateModelConfig(c)) << c;
  const std::vector<OperatorSpec> ops = ModelOperators(c);
  std::set<std::string> names;
  for (const OperatorSpec& op : ops) {
    ASSERT_OK(ValidateOperatorSpec(op));
    EXPECT_TRUE(names.insert(op.name).second) << "duplicate operator " << op.name;
    for (const TensorSpec& t : op.tensors) {
      EXPECT_TRUE(names.insert(t.name).second) << "duplicate tensor " << t.name;
    }
  }
  EXPECT_EQ(ModelNumElems(ops), ModelParameterCount(c)) << c;
}

TEST(ModelConfigTest, PresetsHaveThePublishedParameterCounts) {
  for (const Published& p : kPublished) {
    ASSERT_OK_AND_ASSIGN(const ModelConfig c, ModelPreset(p.preset));
    EXPECT_EQ(ModelParameterCount(c), p.params) << p.preset;
    EXPECT_EQ(ModelNumElems(ModelOperators(c)), p.params) << p.preset;
    ExpectConsistent(c);
  }
}

TEST(ModelConfigTest, Llama32OneBShapes) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig c, ModelPreset("llama-3.2-1b"));
  EXPECT_EQ(c.architecture(), ModelArchitecture::kLlama);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  const std::vector<OperatorSpec> ops = ModelOperators(c);
  ASSERT_EQ(ops.size(), 2 + 7 * 16u);  // embed, 7 per layer, norm; tied: no lm_head
  EXPECT_EQ(ops.front().name, "model.embed_tokens");
  EXPECT_EQ(ops.front().tensors[0].shape, (std::vector<int64_t>{128256, 2048}));
  EXPECT_EQ(ops.back().name, "model.norm");
  const OperatorSpec& qkv = ops[2];
  EXPECT_EQ(qkv.name, "model.layers.0.self_attn.qkv_proj");
  ASSERT_EQ(qkv.tensors.size(), 3u);
  EXPECT_EQ(qkv.tensors[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(qkv.tensors[0].shape, (std::vector<int64_t>{2048, 2048}));
  EXPECT_EQ(qkv.tensors[1].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(qkv.tensors[1].shape, (std::vector<int64_t>{512, 2048}));
  EXPECT_EQ(ops[3].tensors[0].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(ops[6].tensors[0].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(ops[7].tensors[0].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(ops[7].tensors[0].shape, (std::vector<int64_t>{2048, 8192}));
}

TEST(ModelConfigTest, Qwen25ThreeBShapes) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig c, ModelPreset("qwen2.5-3b"));
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 36);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  const std::vector<OperatorSpec> ops = ModelOperators(c);
  ASSERT_EQ(ops.size(), 2 + 7 * 36u);                               // tied: no lm_head
  EXPECT_EQ(ops[2].tensors[4].shape, (std::vector<int64_t>{256}));  // k_proj.bias: 2 x 128
}

TEST(ModelConfigTest, QwenHasQkvBiasesAndUntiedLlamaHasAHead) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig qwen, ModelPreset("qwen2.5-0.5b"));
  const OperatorSpec qkv = ModelOperators(qwen)[2];
  ASSERT_EQ(qkv.tensors.size(), 6u);
  EXPECT_EQ(qkv.tensors[3].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(qkv.tensors[3].shape, (std::vector<int64_t>{896}));
  EXPECT_EQ(qkv.tensors[4].shape, (std::vector<int64_t>{128}));
  ASSERT_OK_AND_ASSIGN(const ModelConfig llama3, ModelPreset("llama-3-8b"));
  const std::vector<OperatorSpec> ops = ModelOperators(llama3);
  EXPECT_EQ(ops.back().name, "lm_head");
  EXPECT_EQ(ops.back().tensors[0].name, "lm_head.weight");
  EXPECT_EQ(ops.back().tensors[0].shape, (std::vector<int64_t>{128256, 4096}));
}

TEST(ModelConfigTest, VocabularyMatricesSplitIntoRowBlocks) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig llama3, ModelPreset("llama-3-8b"));
  const std::vector<OperatorSpec> whole = ModelOperators(llama3);
  const std::vector<OperatorSpec> split = ModelOperators(llama3, {.vocab_block_rows = 32768});
  // 128256 rows: four blocks of 32768 rows (the last 29952) for embed_tokens and for lm_head.
  ASSERT_EQ(split.size(), whole.size() + 6);
  EXPECT_EQ(ModelNumElems(split), ModelNumElems(whole));
  EXPECT_EQ(split[0].name, "model.embed_tokens[0:32768]");
  EXPECT_EQ(split[0].tensors[0].name, "model.embed_tokens.weight[0:32768]");
  EXPECT_EQ(split[3].tensors[0].shape, (std::vector<int64_t>{128256 - 3 * 32768, 4096}));
  EXPECT_EQ(split[4].name, "model.layers.0.input_layernorm");
  EXPECT_EQ(split.back().name, "lm_head[98304:128256]");
  EXPECT_EQ(split.back().tensors[0].name, "lm_head.weight[98304:128256]");
  // With blocks of 8192 rows the largest operator is an MLP matrix, not the vocabulary.
  int64_t largest = 0;
  for (const OperatorSpec& op : ModelOperators(llama3, {.vocab_block_rows = 8192})) {
    largest = std::max(largest, OperatorNumElems(op));
  }
  EXPECT_EQ(largest, 14336 * 4096);
  ASSERT_OK_AND_ASSIGN(const ModelConfig tied, ModelPreset("llama-3.2-1b"));
  const std::vector<OperatorSpec> tied_split = ModelOperators(tied, {.vocab_block_rows = 40000});
  EXPECT_EQ(tied_split.size(), ModelOperators(tied).size() + 3);
  EXPECT_EQ(tied_split.back().name, "model.norm");  // the head reuses embed_tokens' blocks
}

// ModelTrainingFlops against the operators themselves: the linear term is 6 per token times the
// elements of every 2-D weight outside the vocabulary and position matrices (counted from
// ModelOperators, not from the formula), the head 6 E V per token, and attention 12 Q per
// query-key pair of the causal triangle (counted by a loop).
TEST(ModelConfigTest, TrainingFlopsCountTheOperatorsWeights) {
  for (const char* preset :
       {"gpt2", "gpt2-medium", "llama-3.2-1b", "qwen2.5-0.5b", "mistral-7b-v0.3"}) {
    SCOPED_TRACE(preset);
    absl::StatusOr<ModelConfig> c = ModelPreset(preset);
    ASSERT_OK(c.status());
    double weights = 0;
    for (const OperatorSpec& op : ModelOperators(*c)) {
      for (const TensorSpec& t : op.tensors) {
        const bool vocabulary =
            absl::StrContains(t.name, "wte") || absl::StrContains(t.name, "wpe") ||
            absl::StrContains(t.name, "embed_tokens") || absl::StrContains(t.name, "lm_head");
        if (t.shape.size() != 2 || vocabulary) continue;
        weights += static_cast<double>(t.shape[0]) * static_cast<double>(t.shape[1]);
      }
    }
    const int64_t batch = 3, seq = 17;
    double pairs = 0;
    for (int64_t q = 0; q < seq; ++q) {
      for (int64_t k = 0; k <= q; ++k) pairs += 1;
    }
    const ModelFlops f = ModelTrainingFlops(*c, batch, seq);
    const double tokens = batch * seq;
    EXPECT_DOUBLE_EQ(f.linear, 6 * tokens * weights);
    EXPECT_DOUBLE_EQ(f.head, 6 * tokens * c->hidden_size * c->vocab_size);
    EXPECT_DOUBLE_EQ(f.attention,
                     12.0 * c->q_size() * pairs * batch * static_cast<double>(c->num_layers));
    EXPECT_DOUBLE_EQ(f.Total(), f.linear + f.head + f.attention);
  }
}

// With a sliding window W the attention term counts, per windowed layer, the pairs (q, k) with
// q - W < k <= q (a loop), the other layers the whole triangle: Mistral's window on every layer,
// Qwen2's on the last layers, a window longer than the sequence (the triangle).
TEST(ModelConfigTest, TrainingFlopsCountWindowedPairs) {
  const int64_t batch = 2, seq = 23;
  auto pairs_of = [&](int64_t w) {
    double pairs = 0;
    for (int64_t q = 0; q < seq; ++q) {
      for (int64_t k = 0; k <= q; ++k) pairs += (w == 0 || k > q - w) ? 1 : 0;
    }
    return pairs;
  };
  for (const int64_t window : {int64_t{1}, int64_t{5}, int64_t{22}, int64_t{23}, int64_t{40}}) {
    for (const bool every_layer : {true, false}) {
      SCOPED_TRACE(absl::StrCat("window ", window, every_layer ? " on every layer" : " on some"));
      ASSERT_OK_AND_ASSIGN(ModelConfig c,
                           ModelPreset(every_layer ? "mistral-7b-v0.3" : "qwen2.5-0.5b"));
      c.sliding_window = window;
      c.sliding_window_layers.assign(c.num_layers, true);
      if (!every_layer) {
        for (int64_t l = 0; l < c.num_layers / 3; ++l) c.sliding_window_layers[l] = false;
      }
      ASSERT_OK(ValidateModelConfig(c));
      double pairs = 0;
      for (int64_t l = 0; l < c.num_layers; ++l) pairs += pairs_of(c.LayerSlidingWindow(l));
      const ModelFlops f = ModelTrainingFlops(c, batch, seq);
      EXPECT_DOUBLE_EQ(f.attention, 12.0 * c.q_size() * pairs * batch);
      if (window < seq) {
        ModelConfig full = c;
        full.sliding_window = 0;
        full.sliding_window_layers.clear();
        EXPECT_LT(f.attention, ModelTrainingFlops(full, batch, seq).attention);
      }
    }
  }
}

TEST(ModelConfigTest, GptPresetsMatchGptShapes) {
  for (const std::string& name : GptPresetNames()) {
    ASSERT_OK_AND_ASSIGN(const GptConfig g, GptPreset(name));
    ASSERT_OK_AND_ASSIGN(const ModelConfig c, ModelPreset(name));
    EXPECT_EQ(c, FromGptConfig(g));
    EXPECT_EQ(c.architecture(), ModelArchitecture::kGpt2);
    ExpectSameOperators(ModelOperators(c), GptOperators(g));
    for (int64_t rows : {int64_t{2048}, int64_t{100}}) {
      ExpectSameOperators(ModelOperators(c, {.vocab_block_rows = rows}),
                          GptOperators(g, {.vocab_block_rows = rows}));
    }
    EXPECT_EQ(ModelParameterCount(c), GptParameterCount(g)) << name;
    ASSERT_OK_AND_ASSIGN(const GptConfig back, ToGptConfig(c));
    EXPECT_EQ(back.name, g.name);
    EXPECT_EQ(back.vocab_size, g.vocab_size);
    EXPECT_EQ(back.max_seq_len, g.max_seq_len);
    EXPECT_EQ(back.hidden, g.hidden);
    EXPECT_EQ(back.num_layers, g.num_layers);
    EXPECT_EQ(back.num_heads, g.num_heads);
  }
}

TEST(ModelConfigTest, ToGptConfigRefusesWhatGptModelCannotCompute) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ModelPreset("gpt2"));
  c.intermediate_size = 1000;
  EXPECT_THAT(ToGptConfig(c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n_inner")));
  ASSERT_OK_AND_ASSIGN(c, ModelPreset("gpt2"));
  c.norm_eps = 1e-6;
  EXPECT_THAT(ToGptConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer_norm_epsilon")));
  ASSERT_OK_AND_ASSIGN(c, ModelPreset("llama-tiny"));
  EXPECT_THAT(ToGptConfig(c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpt2")));
}

TEST(ModelConfigTest, UnknownPresetListsTheKnownOnes) {
  EXPECT_THAT(ModelPreset("llama-9"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("llama-9"), HasSubstr("qwen2.5-0.5b"),
                                        HasSubstr("gpt2-xl"))));
}

// A random valid llama-like config: every flag the family allows, awkward sizes.
ModelConfig RandomLlamaLike(SplitMix64& rng) {
  ModelConfig c;
  c.name = "random";
  c.family = std::vector<ModelFamily>{ModelFamily::kLlama, ModelFamily::kQwen2,
                                      ModelFamily::kMistral}[rng.Below(3)];
  c.vocab_size = 1 + static_cast<int64_t>(rng.Below(1000));
  c.num_kv_heads = 1 + static_cast<int64_t>(rng.Below(4));
  c.num_heads = c.num_kv_heads * (1 + static_cast<int64_t>(rng.Below(4)));
  c.head_dim = 2 * (1 + static_cast<int64_t>(rng.Below(16)));
  c.hidden_size =
      rng.Below(2) == 0 ? c.num_heads * c.head_dim : 1 + static_cast<int64_t>(rng.Below(200));
  c.num_layers = 1 + static_cast<int64_t>(rng.Below(5));
  c.intermediate_size = 1 + static_cast<int64_t>(rng.Below(300));
  c.max_position_embeddings = 1 + static_cast<int64_t>(rng.Below(4096));
  c.norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.tie_word_embeddings = rng.Below(2) == 0;
  if (c.family == ModelFamily::kLlama) {
    c.qkv_bias = c.o_proj_bias = rng.Below(2) == 0;
    c.mlp_bias = rng.Below(2) == 0;
    if (rng.Below(2) == 0) c.rope_scaling = RopeScaling{RopeScalingType::kLlama3, 8, 1, 4, 8192};
  } else if (c.family == ModelFamily::kQwen2) {
    c.qkv_bias = true;
  }
  return c;
}

TEST(ModelConfigTest, ClosedFormEqualsTheOperatorsOnRandomConfigs) {
  SplitMix64 rng(14);
  for (int trial = 0; trial < 300; ++trial) {
    ExpectConsistent(RandomLlamaLike(rng));
  }
  for (int trial = 0; trial < 100; ++trial) {
    GptConfig g;
    g.name = "random-gpt";
    g.num_heads = 1 + static_cast<int64_t>(rng.Below(6));
    g.hidden = g.num_heads * (1 + static_cast<int64_t>(rng.Below(20)));
    g.num_layers = 1 + static_cast<int64_t>(rng.Below(4));
    g.vocab_size = 1 + static_cast<int64_t>(rng.Below(500));
    g.max_seq_len = 1 + static_cast<int64_t>(rng.Below(300));
    ModelConfig c = FromGptConfig(g);
    ExpectConsistent(c);
    EXPECT_EQ(ModelParameterCount(c), GptParameterCount(g));
    c.intermediate_size = 1 + static_cast<int64_t>(rng.Below(100));  // GPT-2 with n_inner
    ExpectConsistent(c);
  }
}

TEST(ModelConfigTest, ValidationNamesTheField) {
  struct Case {
    const char* field;
    std::function<void(ModelConfig&)> mutate;
    const char* preset = "llama-tiny";
  };
  const Case cases[] = {
      {"vocab_size", [](ModelConfig& c) { c.vocab_size = 0; }},
      {"hidden_size", [](ModelConfig& c) { c.hidden_size = -1; }},
      {"num_layers", [](ModelConfig& c) { c.num_layers = 0; }},
      {"num_layers", [](ModelConfig& c) { c.num_layers = (int64_t{1} << 20) + 1; }},
      {"num_heads", [](ModelConfig& c) { c.num_heads = 0; }},
      {"num_kv_heads", [](ModelConfig& c) { c.num_kv_heads = 3; }},
      {"head_dim", [](ModelConfig& c) { c.head_dim = 7; }},
      {"intermediate_size", [](ModelConfig& c) { c.intermediate_size = 0; }},
      {"max_position_embeddings", [](ModelConfig& c) { c.max_position_embeddings = 0; }},
      {"norm_eps", [](ModelConfig& c) { c.norm_eps = 0; }},
      {"rope_theta", [](ModelConfig& c) { c.rope_theta = -1; }},
      {"rope_scaling", [](ModelConfig& c) { c.rope_scaling.factor = 2; }},
      {"rope_scaling.factor",
       [](ModelConfig& c) {
         c.rope_scaling = {RopeScalingType::kLlama3, 0.5, 1, 4, 8192};
       }},
      {"rope_scaling.high_freq_factor",
       [](ModelConfig& c) {
         c.rope_scaling = {RopeScalingType::kLlama3, 8, 4, 4, 8192};
       }},
      {"rope_scaling.original_max_position_embeddings",
       [](ModelConfig& c) {
         c.rope_scaling = {RopeScalingType::kLlama3, 8, 1, 4, 0};
       }},
      {"hidden_act", [](ModelConfig& c) { c.hidden_act = HiddenAct::kGeluTanh; }},
      {"attention_bias", [](ModelConfig& c) { c.qkv_bias = true; }},
      {"qwen2", [](ModelConfig& c) { c.family = ModelFamily::kQwen2; }},
      {"mistral", [](ModelConfig& c) { c.family = ModelFamily::kMistral, c.mlp_bias = true; }},
      {"overflows", [](ModelConfig& c) { c.vocab_size = int64_t{1} << 62; }},
      {"layers_without_rope must be empty",
       [](ModelConfig& c) { c.layers_without_rope.assign(c.num_layers, true); }},
      {"layers_without_rope has", [](ModelConfig& c) { c.layers_without_rope = {true}; },
       "smollm3-3b"},
      {"smollm3's config.json has one attention_bias", [](ModelConfig& c) { c.qkv_bias = true; },
       "smollm3-3b"},
      {"smollm3's config.json has no sliding window",
       [](ModelConfig& c) {
         c.sliding_window = 8;
         c.sliding_window_layers.assign(c.num_layers, true);
       },
       "smollm3-3b"},
      {"olmo2's config.json has one attention_bias", [](ModelConfig& c) { c.mlp_bias = true; },
       "olmo-2-1b"},
      {"phi3 has no biases", [](ModelConfig& c) { c.qkv_bias = true; }, "phi-4-mini"},
      {"gemma3_text's config.json has one attention_bias",
       [](ModelConfig& c) { c.mlp_bias = true; }, "gemma-3-1b"},
      {"gemma3_text uses hidden_act gelu_new",
       [](ModelConfig& c) { c.hidden_act = HiddenAct::kSilu; }, "gemma-3-1b"},
      {"rope_local_base_freq must be finite and positive",
       [](ModelConfig& c) { c.rope_local_base_freq = 0; }, "gemma-3-1b"},
      {"rope_local_base_freq must be 0", [](ModelConfig& c) { c.rope_local_base_freq = 10000; }},
      {"rope_scaling linear is supported for gemma3_text only",
       [](ModelConfig& c) {
         c.rope_scaling = RopeScaling{.type = RopeScalingType::kLinear, .factor = 2.0};
       }},
      {"rope_scaling.factor must be >= 1", [](ModelConfig& c) { c.rope_scaling.factor = 0.5; },
       "gemma-3-4b"},
      {"partial_rotary_factor must be 1", [](ModelConfig& c) { c.partial_rotary_factor = 0.5; }},
      {"partial_rotary_factor must be in (0, 1]",
       [](ModelConfig& c) { c.partial_rotary_factor = 1.25; }, "phi-4-mini"},
      {"gives rotary_dim 3", [](ModelConfig& c) { c.partial_rotary_factor = 3.0 / 128; },
       "phi-4-mini"},
      {"phi3's sliding_window applies to every layer",
       [](ModelConfig& c) {
         c.sliding_window = 8;
         c.sliding_window_layers.assign(c.num_layers, true);
         c.sliding_window_layers[0] = false;
       },
       "phi-4-mini"},
      {"sliding_window must be >= 0", [](ModelConfig& c) { c.sliding_window = -1; }},
      {"sliding_window_layers is set",
       [](ModelConfig& c) { c.sliding_window_layers.assign(c.num_layers, true); }},
      {"sliding_window_layers has",
       [](ModelConfig& c) {
         c.family = ModelFamily::kMistral;
         c.sliding_window = 8;
         c.sliding_window_layers = {true};
       }},
      {"llama's config.json has no sliding window",
       [](ModelConfig& c) {
         c.sliding_window = 8;
         c.sliding_window_layers.assign(c.num_layers, true);
       }},
      {"every layer",
       [](ModelConfig& c) {
         c.family = ModelFamily::kMistral;
         c.sliding_window = 8;
         c.sliding_window_layers.assign(c.num_layers, true);
         c.sliding_window_layers[0] = false;
       }},
      {"tie_word_embeddings", [](ModelConfig& c) { c.tie_word_embeddings = false; }, "gpt2"},
      {"num_kv_heads", [](ModelConfig& c) { c.num_kv_heads = 4; }, "gpt2"},
      {"hidden_size", [](ModelConfig& c) { c.head_dim = 32; }, "gpt2"},
      {"biases", [](ModelConfig& c) { c.mlp_bias = false; }, "gpt2"},
      {"gelu_new", [](ModelConfig& c) { c.hidden_act = HiddenAct::kSilu; }, "gpt2"},
  };
  for (const Case& tc : cases) {
    ASSERT_OK_AND_ASSIGN(ModelConfig c, ModelPreset(tc.preset));
    tc.mutate(c);
    EXPECT_THAT(ValidateModelConfig(c),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(tc.field)))
        << tc.field;
  }
}

}  // namespace
}  // namespace ps
