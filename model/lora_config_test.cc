#include "model/lora_config.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "base/testing/status_matchers.h"
#include "chunk/operator_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gpt_config.h"
#include "model/hf_config.h"
#include "model/model_config.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelConfig Tiny(const std::string& family) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const std::string path =
      absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/hf_tiny_", family,
                   "/config.json");
  absl::StatusOr<ModelConfig> config = ReadHfConfig(path);
  EXPECT_THAT(config.status(), IsOk());
  return *config;
}

LoraConfig Lora(std::vector<std::string> targets, int64_t r = 4) {
  LoraConfig lora;
  lora.r = r;
  lora.lora_alpha = 8;
  lora.target_modules = std::move(targets);
  return lora;
}

std::vector<std::string> Modules(const std::vector<LoraTarget>& targets) {
  std::vector<std::string> names;
  for (const LoraTarget& t : targets) names.push_back(t.module);
  return names;
}

absl::Status Check(const ModelConfig& model, const LoraConfig& lora) {
  return ValidateLoraConfig(model, lora);
}

TEST(LoraConfigTest, Scale) {
  LoraConfig lora = Lora({"q_proj"}, 16);
  lora.lora_alpha = 32;
  EXPECT_DOUBLE_EQ(lora.scale(), 2.0);
}

TEST(LoraConfigTest, ScalarFieldErrors) {
  const ModelConfig llama = Tiny("llama");
  LoraConfig lora = Lora({"q_proj"});
  EXPECT_THAT(Check(llama, lora), IsOk());

  lora.r = 0;
  EXPECT_THAT(Check(llama, lora),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora.r must be a positive")));
  lora.r = -3;
  EXPECT_THAT(Check(llama, lora), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-3")));
  lora.r = 4;

  for (double alpha : {0.0, -1.0, std::nan(""), double{INFINITY}}) {
    lora.lora_alpha = alpha;
    EXPECT_THAT(Check(llama, lora),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora.lora_alpha")))
        << alpha;
  }
  lora.lora_alpha = 8;

  for (double p : {-0.1, 1.0, 1.5, std::nan("")}) {
    lora.lora_dropout = p;
    EXPECT_THAT(Check(llama, lora),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora.lora_dropout")))
        << p;
  }
  lora.lora_dropout = 0.999;
  EXPECT_THAT(Check(llama, lora), IsOk());
  lora.lora_dropout = 0;

  lora.bias = "all";
  EXPECT_THAT(Check(llama, lora),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lora.bias 'all' is not supported: only \"none\"")));
  lora.bias = "lora_only";
  EXPECT_THAT(Check(llama, lora), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LoraConfigTest, TargetErrors) {
  const ModelConfig llama = Tiny("llama");
  EXPECT_THAT(Check(llama, Lora({})), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("lora.target_modules is empty")));
  EXPECT_THAT(Check(llama, Lora({"q_proj", "qq_proj"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'qq_proj' matches no module; LoRA applies to the blocks' linear "
                                 "layers of model '")));
  EXPECT_THAT(Check(llama, Lora({"qq_proj"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj")));
  // A plain substring is not a dotted suffix.
  EXPECT_THAT(Check(llama, Lora({"proj"})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'proj' matches no module")));
  EXPECT_THAT(Check(llama, Lora({"input_layernorm"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.layers.0.input_layernorm, which is not a linear layer")));
  EXPECT_THAT(Check(llama, Lora({"embed_tokens"})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a linear layer")));
  EXPECT_THAT(Check(llama, Lora({"self_attn"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.layers.0.self_attn, a module with submodules")));
  EXPECT_THAT(Check(llama, Lora({"lm_head"})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets the LM head")));
  EXPECT_THAT(Check(llama, Lora({"all-linear", "q_proj"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"all-linear\" must be the only entry")));
  EXPECT_THAT(Check(llama, Lora({""})), StatusIs(absl::StatusCode::kInvalidArgument));

  const ModelConfig gpt2 = Tiny("gpt2");
  EXPECT_THAT(Check(gpt2, Lora({"q_proj"})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("c_attn, c_proj, c_fc")));
}

TEST(LoraConfigTest, RankLargerThanLayer) {
  // Tiny llama: E 32, Q 32, K 16, I 48. k_proj is 16 x 32.
  const ModelConfig llama = Tiny("llama");
  EXPECT_THAT(Check(llama, Lora({"k_proj"}, 16)), IsOk());
  EXPECT_THAT(Check(llama, Lora({"k_proj"}, 17)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lora.r = 17 exceeds min(in, out) = 16 of targeted layer "
                                 "model.layers.0.self_attn.k_proj (in 32, out 16)")));
  EXPECT_THAT(Check(llama, Lora({"q_proj"}, 32)), IsOk());
  EXPECT_THAT(Check(llama, Lora({"q_proj"}, 33)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("q_proj (in 32, out 32)")));
  const ModelConfig gpt2 = Tiny("gpt2");  // E 16
  EXPECT_THAT(Check(gpt2, Lora({"c_fc"}, 17)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("transformer.h.0.mlp.c_fc (in 16, out 64)")));
}

TEST(LoraConfigTest, ModulesToSaveErrors) {
  const ModelConfig llama = Tiny("llama");  // untied
  LoraConfig lora = Lora({"q_proj", "v_proj"});
  lora.modules_to_save = {"lm_head", "embed_tokens", "model.norm"};
  EXPECT_THAT(Check(llama, lora), IsOk());

  lora.modules_to_save = {"nonexistent"};
  EXPECT_THAT(Check(llama, lora),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'nonexistent' matches no module of model '")));
  EXPECT_THAT(Check(llama, lora), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("embed_tokens, input_layernorm")));
  lora.modules_to_save = {"mlp"};
  EXPECT_THAT(Check(llama, lora),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("matches model.layers.0.mlp, a module with submodules")));
  lora.modules_to_save = {"q_proj"};  // shares the q/k/v operator
  lora.target_modules = {"o_proj"};
  EXPECT_THAT(
      Check(llama, lora),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("covers only part of operator model.layers.0.self_attn.qkv_proj")));
  lora.modules_to_save = {"o_proj"};
  EXPECT_THAT(Check(llama, lora),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.layers.0.self_attn.o_proj is both targeted")));
  lora.target_modules = {"self_attn.o_proj"};
  EXPECT_THAT(Check(llama, lora),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("both targeted")));
  lora.modules_to_save = {""};
  EXPECT_THAT(Check(llama, lora), StatusIs(absl::StatusCode::kInvalidArgument));

  // Tied embeddings.
  for (const std::string family : {"qwen2", "qwen3", "gpt2"}) {
    const ModelConfig tied = Tiny(family);
    ASSERT_TRUE(tied.tie_word_embeddings);
    LoraConfig t = Lora({family == "gpt2" ? "c_attn" : "q_proj"});
    for (const std::string name : {"lm_head", family == "gpt2" ? "wte" : "embed_tokens"}) {
      t.modules_to_save = {name};
      EXPECT_THAT(Check(tied, t),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("ties to the token embedding (tie_word_embeddings)")))
          << family << " " << name;
    }
  }
  // Qwen3's q_norm shares the q/k/v operator.
  LoraConfig q3 = Lora({"o_proj"});
  q3.modules_to_save = {"q_norm"};
  EXPECT_THAT(Check(Tiny("qwen3"), q3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("covers only part")));
}

TEST(LoraConfigTest, SuffixMatchingOnDottedBoundaries) {
  const ModelConfig llama = Tiny("llama");
  EXPECT_THAT(Modules(LoraTargets(llama, Lora({"self_attn.q_proj"}))),
              ElementsAre("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"));
  EXPECT_THAT(Modules(LoraTargets(llama, Lora({"model.layers.1.mlp.down_proj", "v_proj"}))),
              ElementsAre("model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.v_proj",
                          "model.layers.1.mlp.down_proj"));
  EXPECT_THAT(Modules(LoraTargets(llama, Lora({"layers.0.mlp.up_proj"}))),
              ElementsAre("model.layers.0.mlp.up_proj"));
  const ModelConfig gpt2 = Tiny("gpt2");
  EXPECT_THAT(Modules(LoraTargets(gpt2, Lora({"attn.c_proj"}))),
              ElementsAre("h.0.attn.c_proj", "h.1.attn.c_proj"));
  EXPECT_THAT(Modules(LoraTargets(gpt2, Lora({"transformer.h.1.mlp.c_proj"}))),
              ElementsAre("h.1.mlp.c_proj"));
  EXPECT_THAT(
      Modules(LoraTargets(gpt2, Lora({"c_proj"}))),
      ElementsAre("h.0.attn.c_proj", "h.0.mlp.c_proj", "h.1.attn.c_proj", "h.1.mlp.c_proj"));
}

TEST(LoraConfigTest, AllLinear) {
  const ModelConfig llama = Tiny("llama");
  const std::vector<LoraTarget> all = LoraTargets(llama, Lora({"all-linear"}));
  ASSERT_EQ(all.size(), 14u);
  EXPECT_EQ(all[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(all[6].module, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(all[13].module, "model.layers.1.mlp.down_proj");
  // As in PEFT, modules_to_save wins over all-linear.
  LoraConfig lora = Lora({"all-linear"});
  lora.modules_to_save = {"o_proj", "lm_head"};
  EXPECT_THAT(Check(llama, lora), IsOk());
  const std::vector<LoraTarget> some = LoraTargets(llama, lora);
  ASSERT_EQ(some.size(), 12u);
  for (const LoraTarget& t : some) EXPECT_EQ(t.module.find("o_proj"), std::string::npos);
  EXPECT_EQ(LoraTargets(Tiny("gpt2"), Lora({"all-linear"})).size(), 8u);
}

TEST(LoraConfigTest, LlamaTargetsAndOperators) {
  // E 32, Q 32, K 16, I 48, untied, no biases.
  const ModelConfig llama = Tiny("llama");
  LoraConfig lora = Lora({"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"}, 4);
  lora.modules_to_save = {"lm_head"};
  ASSERT_THAT(Check(llama, lora), IsOk());
  const std::vector<LoraTarget> targets = LoraTargets(llama, lora);
  ASSERT_EQ(targets.size(), 10u);
  const LoraTarget& k = targets[1];
  EXPECT_EQ(k.module, "model.layers.0.self_attn.k_proj");
  EXPECT_EQ(k.base_op, "model.layers.0.self_attn.qkv_proj");
  EXPECT_EQ(k.base_weight, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.adapter_op, "model.layers.0.self_attn.qkv_proj.lora");
  EXPECT_EQ(k.a, "model.layers.0.self_attn.k_proj.lora_A.weight");
  EXPECT_EQ(k.b, "model.layers.0.self_attn.k_proj.lora_B.weight");
  EXPECT_EQ(k.in, 32);
  EXPECT_EQ(k.out, 16);
  EXPECT_FALSE(k.conv1d);
  EXPECT_EQ(targets[4].module, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(targets[4].in, 48);
  EXPECT_EQ(targets[4].out, 32);

  const std::vector<OperatorSpec> base = ModelOperators(llama);
  const std::vector<OperatorSpec> ops = LoraModelOperators(llama, lora);
  ASSERT_EQ(ops.size(), base.size() + 6);  // per layer: qkv, o, down adapters
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(ops[i].name, base[i].name);
    EXPECT_EQ(ops[i].trainable, ops[i].name == "lm_head") << ops[i].name;
  }
  const OperatorSpec& qkv = ops[base.size()];
  EXPECT_EQ(qkv.name, "model.layers.0.self_attn.qkv_proj.lora");
  EXPECT_TRUE(qkv.trainable);
  ASSERT_EQ(qkv.tensors.size(), 6u);
  EXPECT_EQ(qkv.tensors[0].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_THAT(qkv.tensors[0].shape, ElementsAre(4, 32));
  EXPECT_EQ(qkv.tensors[1].name, "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_THAT(qkv.tensors[1].shape, ElementsAre(32, 4));
  EXPECT_EQ(qkv.tensors[3].name, "model.layers.0.self_attn.k_proj.lora_B.weight");
  EXPECT_THAT(qkv.tensors[3].shape, ElementsAre(16, 4));
  EXPECT_EQ(qkv.tensors[5].name, "model.layers.0.self_attn.v_proj.lora_B.weight");
  EXPECT_EQ(ops[base.size() + 1].name, "model.layers.0.self_attn.o_proj.lora");
  EXPECT_EQ(ops[base.size() + 2].name, "model.layers.0.mlp.down_proj.lora");
  EXPECT_THAT(ops[base.size() + 2].tensors[0].shape, ElementsAre(4, 48));
  EXPECT_EQ(ops[base.size() + 3].name, "model.layers.1.self_attn.qkv_proj.lora");
  for (const OperatorSpec& op : ops) EXPECT_THAT(ValidateOperatorSpec(op), IsOk());

  EXPECT_THAT(LoraSavedTensors(llama, lora), ElementsAre("lm_head.weight"));
  // Vocabulary row blocks: every block of a saved matrix is trainable.
  const std::vector<OperatorSpec> split = LoraModelOperators(llama, lora, {.vocab_block_rows = 16});
  int lm_head_blocks = 0;
  for (const OperatorSpec& op : split) {
    if (op.name.rfind("lm_head[", 0) == 0) {
      ++lm_head_blocks;
      EXPECT_TRUE(op.trainable);
    } else if (op.name.rfind("model.embed_tokens", 0) == 0) {
      EXPECT_FALSE(op.trainable);
    }
  }
  EXPECT_EQ(lm_head_blocks, 4);
}

TEST(LoraConfigTest, Qwen2AndQwen3Targets) {
  // qwen2: E 24, 6 heads x 4, 2 kv heads: Q 24, K 8, I 40; q/k/v biases stay in the frozen base.
  const ModelConfig qwen2 = Tiny("qwen2");
  LoraConfig lora = Lora({"k_proj", "gate_proj", "up_proj"}, 8);
  ASSERT_THAT(Check(qwen2, lora), IsOk());
  std::vector<LoraTarget> t = LoraTargets(qwen2, lora);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].out, 8);
  EXPECT_EQ(t[1].module, "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(t[1].base_op, "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(t[1].out, 40);
  EXPECT_THAT(Check(qwen2, Lora({"k_proj"}, 9)), StatusIs(absl::StatusCode::kInvalidArgument));

  // qwen3: head_dim 16: Q 64, K 32; o_proj is [32, 64].
  const ModelConfig qwen3 = Tiny("qwen3");
  lora = Lora({"q_proj", "o_proj"}, 2);
  lora.modules_to_save = {"norm"};  // PEFT's plain suffix: every *norm module, q_norm too
  EXPECT_THAT(Check(qwen3, lora),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("covers only part")));
  lora.modules_to_save = {"layernorm", "model.norm"};
  ASSERT_THAT(Check(qwen3, lora), IsOk());
  t = LoraTargets(qwen3, lora);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].out, 64);
  EXPECT_EQ(t[1].module, "model.layers.0.self_attn.o_proj");
  EXPECT_EQ(t[1].in, 64);
  EXPECT_EQ(t[1].out, 32);
  const std::vector<OperatorSpec> ops = LoraModelOperators(qwen3, lora);
  for (const OperatorSpec& op : ops) {
    const bool norm = op.name.find("layernorm") != std::string::npos || op.name == "model.norm";
    const bool adapter = op.name.size() > 5 && op.name.substr(op.name.size() - 5) == ".lora";
    EXPECT_EQ(op.trainable, norm || adapter) << op.name;
  }
  EXPECT_EQ(ops.back().name, "model.layers.1.self_attn.o_proj.lora");
}

// Phi-3 (its checkpoint fuses qkv_proj and gate_up_proj, which PEFT adapts whole): o_proj and
// down_proj are adapted; the fused layers, their split parts and all-linear are refused naming
// lora.target_modules.
TEST(LoraConfigTest, Phi3Targets) {
  ASSERT_OK_AND_ASSIGN(ModelConfig phi3, ModelPreset("phi-4-mini"));
  phi3.num_layers = 2;
  phi3.vocab_size = 64;
  LoraConfig lora = Lora({"o_proj", "down_proj"}, 4);
  ASSERT_THAT(Check(phi3, lora), IsOk());
  const std::vector<LoraTarget> t = LoraTargets(phi3, lora);
  EXPECT_THAT(Modules(t),
              ElementsAre("model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj",
                          "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.down_proj"));
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"qkv_proj"},
                                              {"self_attn.qkv_proj", "o_proj"},
                                              {"gate_up_proj"},
                                              {"q_proj"},
                                              {"up_proj"},
                                              {std::string(kLoraAllLinear)}}) {
    SCOPED_TRACE(bad[0]);
    EXPECT_THAT(Check(phi3, Lora(bad)),
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("lora.target_modules")));
  }
}

TEST(LoraConfigTest, Gpt2TargetsAndOperators) {
  // E 16, I 64; Conv1D weights [in, out].
  const ModelConfig gpt2 = Tiny("gpt2");
  LoraConfig lora = Lora({"c_attn", "c_fc"}, 2);
  lora.modules_to_save = {"ln_f", "wpe"};
  ASSERT_THAT(Check(gpt2, lora), IsOk());
  const std::vector<LoraTarget> t = LoraTargets(gpt2, lora);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].module, "h.0.attn.c_attn");
  EXPECT_EQ(t[0].base_op, "h.0.attn.c_attn");
  EXPECT_EQ(t[0].adapter_op, "h.0.attn.c_attn.lora");
  EXPECT_EQ(t[0].a, "h.0.attn.c_attn.lora_A.weight");
  EXPECT_EQ(t[0].in, 16);
  EXPECT_EQ(t[0].out, 48);
  EXPECT_TRUE(t[0].conv1d);
  EXPECT_EQ(t[1].module, "h.0.mlp.c_fc");
  EXPECT_EQ(t[1].out, 64);
  const std::vector<OperatorSpec> ops = LoraModelOperators(gpt2, lora);
  const std::vector<OperatorSpec> base = ModelOperators(gpt2);
  ASSERT_EQ(ops.size(), base.size() + 4);
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(ops[i].trainable, ops[i].name == "ln_f" || ops[i].name == "wpe") << ops[i].name;
  }
  EXPECT_THAT(ops[base.size()].tensors[1].shape, ElementsAre(48, 2));
  EXPECT_THAT(LoraSavedTensors(gpt2, lora), ElementsAre("wpe.weight", "ln_f.weight", "ln_f.bias"));
}

TEST(LoraConfigTest, PeftNamesRoundTrip) {
  const ModelConfig llama = Tiny("llama");
  const ModelConfig gpt2 = Tiny("gpt2");
  EXPECT_EQ(PeftTensorName(llama, "model.layers.0.self_attn.q_proj.lora_A.weight"),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(PeftTensorName(llama, "lm_head.weight"), "base_model.model.lm_head.weight");
  EXPECT_EQ(PeftTensorName(gpt2, "h.0.attn.c_attn.lora_A.weight"),
            "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  EXPECT_EQ(PeftTensorName(gpt2, "ln_f.bias"), "base_model.model.transformer.ln_f.bias");
  EXPECT_EQ(PeftTensorName(gpt2, "lm_head.weight"), "base_model.model.lm_head.weight");
  for (const ModelConfig& model : {llama, gpt2, Tiny("qwen2"), Tiny("qwen3")}) {
    for (const OperatorSpec& op : LoraModelOperators(model, Lora({"all-linear"}, 1))) {
      for (const TensorSpec& t : op.tensors) {
        EXPECT_THAT(TensorNameFromPeft(model, PeftTensorName(model, t.name)), IsOkAndHolds(t.name));
      }
    }
  }
  EXPECT_THAT(TensorNameFromPeft(llama, "model.layers.0.self_attn.q_proj.lora_A.weight"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("base_model.model.")));
  EXPECT_THAT(TensorNameFromPeft(gpt2, "base_model.model.h.0.attn.c_attn.lora_A.weight"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("transformer.")));
}

TEST(LoraConfigTest, InitLoraADistribution) {
  const int64_t in = 100;
  std::vector<float> a(64 * in);
  InitLoraA(1234, 7, absl::MakeSpan(a), in);
  const float bound = static_cast<float>(1.0 / std::sqrt(100.0));  // 0.1
  double sum = 0, sum_sq = 0;
  float lo = 1, hi = -1;
  for (float x : a) {
    EXPECT_LE(std::abs(x), bound);
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  const double n = static_cast<double>(a.size());
  // U(-b, b): mean 0, variance b^2 / 3. 6400 draws: the mean's sd is b / sqrt(3 n) ~ 7e-4.
  EXPECT_NEAR(sum / n, 0.0, 0.004);
  EXPECT_NEAR(sum_sq / n, 0.01 / 3, 0.0004);
  EXPECT_LT(lo, -0.099f);
  EXPECT_GT(hi, 0.099f);

  // Reproducible; distinct streams and seeds differ.
  std::vector<float> again(a.size()), other_stream(a.size()), other_seed(a.size());
  InitLoraA(1234, 7, absl::MakeSpan(again), in);
  InitLoraA(1234, 8, absl::MakeSpan(other_stream), in);
  InitLoraA(1235, 7, absl::MakeSpan(other_seed), in);
  EXPECT_EQ(a, again);
  EXPECT_NE(a, other_stream);
  EXPECT_NE(a, other_seed);
  // The documented stream: mt19937_64 seeded with SplitMix64(seed ^ SplitMix64(stream)), as
  // model/parameter_init.h seeds a tensor's stream; element i = (2 u_i - 1) / sqrt(in).
  std::mt19937_64 gen(SplitMix64(1234 ^ SplitMix64(7).Next()).Next());
  for (int i = 0; i < 3; ++i) {
    const double u = static_cast<double>(gen() >> 11) * 0x1.0p-53;
    EXPECT_EQ(a[i], static_cast<float>((2 * u - 1) / std::sqrt(100.0))) << i;
  }
  // A prefix of a longer fill equals a shorter fill (element i uses draw i).
  std::vector<float> prefix(10);
  InitLoraA(1234, 7, absl::MakeSpan(prefix), in);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
}

}  // namespace
}  // namespace ps
