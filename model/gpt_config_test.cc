#include "model/gpt_config.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "base/testing/status_matchers.h"
#include "chunk/operator_spec.h"
#include "chunk/testing/transformer_operators.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GptConfig, Gpt2Has124439808ParametersLikeHuggingFace) {
  ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset("gpt2"));
  EXPECT_EQ(GptParameterCount(config), 124'439'808);
  EXPECT_EQ(ModelNumElems(GptOperators(config)), 124'439'808);
}

TEST(GptConfig, PresetSizes) {
  // Hugging Face GPT-2 sizes (tied head), and PatrickStar's configurations at seq 1024.
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"tiny", 120'576},           {"gpt2", 124'439'808},      {"gpt2-medium", 354'823'168},
      {"gpt2-large", 774'030'080}, {"gpt2-xl", 1'557'611'200}, {"1B", 1'112'193'024},
      {"2B", 2'119'358'464},       {"4B", 4'196'936'448},      {"6B", 6'161'707'008},
      {"8B", 8'314'143'744},       {"10B", 10'279'047'168},    {"12B", 12'292'845'568},
      {"15B", 15'917'682'688},     {"18B", 18'334'240'768},
  };
  std::vector<std::string> names;
  for (const auto& [name, params] : expected) names.push_back(name);
  EXPECT_EQ(GptPresetNames(), names);
  for (const auto& [name, params] : expected) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset(name));
    EXPECT_EQ(config.name, name);
    EXPECT_OK(ValidateGptConfig(config));
    EXPECT_EQ(GptParameterCount(config), params);
    const std::vector<OperatorSpec> ops = GptOperators(config);
    EXPECT_EQ(ModelNumElems(ops), params);
    EXPECT_EQ(static_cast<int64_t>(ops.size()), 2 + 6 * config.num_layers);
    absl::flat_hash_set<std::string> op_names;
    absl::flat_hash_set<std::string> tensor_names;
    for (const OperatorSpec& op : ops) {
      EXPECT_OK(ValidateOperatorSpec(op));
      EXPECT_TRUE(op_names.insert(op.name).second) << op.name;
      for (const TensorSpec& t : op.tensors) {
        EXPECT_TRUE(tensor_names.insert(t.name).second) << t.name;
      }
    }
  }
}

TEST(GptConfig, HuggingFaceNamesAndShapes) {
  ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset("gpt2"));
  const std::vector<OperatorSpec> ops = GptOperators(config);
  ASSERT_EQ(ops.size(), 74u);
  EXPECT_EQ(ops[0].name, "embedding");
  ASSERT_EQ(ops[0].tensors.size(), 2u);
  EXPECT_EQ(ops[0].tensors[0].name, "wte.weight");
  EXPECT_THAT(ops[0].tensors[0].shape, ElementsAre(50257, 768));
  EXPECT_EQ(ops[0].tensors[1].name, "wpe.weight");
  EXPECT_THAT(ops[0].tensors[1].shape, ElementsAre(1024, 768));
  const std::vector<std::string> block = {"h.3.ln_1", "h.3.attn.c_attn", "h.3.attn.c_proj",
                                          "h.3.ln_2", "h.3.mlp.c_fc",    "h.3.mlp.c_proj"};
  for (size_t i = 0; i < block.size(); ++i) EXPECT_EQ(ops[1 + 6 * 3 + i].name, block[i]);
  const OperatorSpec& c_attn = ops[1 + 6 * 3 + 1];
  EXPECT_EQ(c_attn.tensors[0].name, "h.3.attn.c_attn.weight");
  EXPECT_THAT(c_attn.tensors[0].shape, ElementsAre(768, 2304));
  EXPECT_EQ(c_attn.tensors[1].name, "h.3.attn.c_attn.bias");
  EXPECT_THAT(c_attn.tensors[1].shape, ElementsAre(2304));
  const OperatorSpec& mlp_proj = ops[1 + 6 * 3 + 5];
  EXPECT_THAT(mlp_proj.tensors[0].shape, ElementsAre(3072, 768));
  EXPECT_THAT(mlp_proj.tensors[1].shape, ElementsAre(768));
  EXPECT_EQ(ops.back().name, "ln_f");
  EXPECT_EQ(ops.back().tensors[1].name, "ln_f.bias");
}

// The chunk layer's tests use GPT-2-shaped operator lists of their own (the chunk layer knows no
// model): they must be exactly the model's.
TEST(GptConfig, ChunkTestShapesAreTheModelsOperators) {
  const std::vector<std::pair<std::string, chunk_testing::TransformerShape>> shapes = {
      {"tiny", chunk_testing::kTinyShape},
      {"gpt2", chunk_testing::kGpt2Shape},
      {"gpt2-medium", chunk_testing::kGpt2MediumShape},
      {"1B", chunk_testing::k1BShape},
      {"10B", chunk_testing::k10BShape}};
  for (const auto& [preset, shape] : shapes) {
    SCOPED_TRACE(preset);
    ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset(preset));
    const std::vector<OperatorSpec> model = GptOperators(config);
    const std::vector<OperatorSpec> test = chunk_testing::TransformerOperators(shape);
    ASSERT_EQ(model.size(), test.size());
    for (size_t i = 0; i < model.size(); ++i) {
      EXPECT_EQ(model[i].name, test[i].name);
      ASSERT_EQ(model[i].tensors.size(), test[i].tensors.size()) << model[i].name;
      for (size_t t = 0; t < model[i].tensors.size(); ++t) {
        EXPECT_EQ(model[i].tensors[t].name, test[i].tensors[t].name);
        EXPECT_EQ(model[i].tensors[t].shape, test[i].tensors[t].shape) << model[i].tensors[t].name;
      }
    }
  }
}

TEST(GptConfig, Errors) {
  EXPECT_THAT(GptPreset("gpt5"), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("known presets: tiny, gpt2, gpt2-medium")));
  GptConfig config;
  config.name = "bad";
  config.num_heads = 5;
  EXPECT_THAT(ValidateGptConfig(config),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a multiple of num_heads"));
  config.num_heads = 12;
  config.num_layers = 0;
  EXPECT_THAT(ValidateGptConfig(config),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_layers must be positive"));
}

}  // namespace
}  // namespace ps
