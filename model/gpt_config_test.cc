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
    EXPECT_EQ(static_cast<int64_t>(ops.size()), 3 + 6 * config.num_layers);
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
  ASSERT_EQ(ops.size(), 75u);
  EXPECT_EQ(ops[0].name, "wte");
  ASSERT_EQ(ops[0].tensors.size(), 1u);
  EXPECT_EQ(ops[0].tensors[0].name, "wte.weight");
  EXPECT_THAT(ops[0].tensors[0].shape, ElementsAre(50257, 768));
  EXPECT_EQ(ops[1].name, "wpe");
  ASSERT_EQ(ops[1].tensors.size(), 1u);
  EXPECT_EQ(ops[1].tensors[0].name, "wpe.weight");
  EXPECT_THAT(ops[1].tensors[0].shape, ElementsAre(1024, 768));
  const std::vector<std::string> block = {"h.3.ln_1", "h.3.attn.c_attn", "h.3.attn.c_proj",
                                          "h.3.ln_2", "h.3.mlp.c_fc",    "h.3.mlp.c_proj"};
  for (size_t i = 0; i < block.size(); ++i) EXPECT_EQ(ops[2 + 6 * 3 + i].name, block[i]);
  const OperatorSpec& c_attn = ops[2 + 6 * 3 + 1];
  EXPECT_EQ(c_attn.tensors[0].name, "h.3.attn.c_attn.weight");
  EXPECT_THAT(c_attn.tensors[0].shape, ElementsAre(768, 2304));
  EXPECT_EQ(c_attn.tensors[1].name, "h.3.attn.c_attn.bias");
  EXPECT_THAT(c_attn.tensors[1].shape, ElementsAre(2304));
  const OperatorSpec& mlp_proj = ops[2 + 6 * 3 + 5];
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
    for (int64_t block_rows : {int64_t{0}, int64_t{100}, int64_t{2048}}) {
      SCOPED_TRACE(block_rows);
      const std::vector<OperatorSpec> model =
          GptOperators(config, {.vocab_block_rows = block_rows});
      chunk_testing::TransformerShape split = shape;
      split.vocab_block_rows = block_rows;
      const std::vector<OperatorSpec> test = chunk_testing::TransformerOperators(split);
      ASSERT_EQ(model.size(), test.size());
      for (size_t i = 0; i < model.size(); ++i) {
        EXPECT_EQ(model[i].name, test[i].name);
        ASSERT_EQ(model[i].tensors.size(), test[i].tensors.size()) << model[i].name;
        for (size_t t = 0; t < model[i].tensors.size(); ++t) {
          EXPECT_EQ(model[i].tensors[t].name, test[i].tensors[t].name);
          EXPECT_EQ(model[i].tensors[t].shape, test[i].tensors[t].shape)
              << model[i].tensors[t].name;
        }
      }
    }
  }
}

TEST(GptConfig, VocabularyRowBlocks) {
  ASSERT_OK_AND_ASSIGN(GptConfig config, GptPreset("gpt2"));
  // 50257 rows in blocks of 8192: six full blocks and one of 1105 rows.
  const std::vector<GptVocabBlock> blocks = GptVocabBlocks(config, {.vocab_block_rows = 8192});
  ASSERT_EQ(blocks.size(), 7u);
  EXPECT_EQ(blocks[0].op_name, "wte[0:8192]");
  EXPECT_EQ(blocks[0].tensor_name, "wte.weight[0:8192]");
  EXPECT_EQ(blocks[6].row_begin, 6 * 8192);
  EXPECT_EQ(blocks[6].rows, 50257 - 6 * 8192);
  EXPECT_EQ(blocks[6].tensor_name, "wte.weight[49152:50257]");
  const std::vector<OperatorSpec> ops = GptOperators(config, {.vocab_block_rows = 8192});
  EXPECT_EQ(ops.size(), 75u + 6);
  EXPECT_EQ(ModelNumElems(ops), 124'439'808);
  EXPECT_EQ(ops[0].name, "wte[0:8192]");
  EXPECT_THAT(ops[6].tensors[0].shape, ElementsAre(1105, 768));
  EXPECT_EQ(ops[7].name, "wpe");
  // One block covering everything is the whole matrix, under its Hugging Face name.
  for (int64_t rows : {int64_t{0}, int64_t{50257}, int64_t{100000}}) {
    const std::vector<GptVocabBlock> whole = GptVocabBlocks(config, {.vocab_block_rows = rows});
    ASSERT_EQ(whole.size(), 1u);
    EXPECT_EQ(whole[0].tensor_name, "wte.weight");
    EXPECT_EQ(whole[0].rows, 50257);
  }
  // Names round-trip.
  ASSERT_TRUE(ParseRowBlockName("wte.weight[49152:50257]").has_value());
  EXPECT_EQ(ParseRowBlockName("wte.weight[49152:50257]")->base, "wte.weight");
  EXPECT_EQ(ParseRowBlockName("wte.weight[49152:50257]")->row_begin, 49152);
  EXPECT_EQ(ParseRowBlockName("wte.weight[49152:50257]")->row_end, 50257);
  for (const char* bad : {"wte.weight", "wte.weight[3]", "x[5:2]", "[0:1]", "w[a:3]", "w[-1:2]"}) {
    EXPECT_FALSE(ParseRowBlockName(bad).has_value()) << bad;
  }
  EXPECT_EQ(RowBlockNameOf("lm_head.weight", 0, 7), "lm_head.weight[0:7]");
}

TEST(GptConfig, VocabularyBlocksFitTheChunkInWholeTiles) {
  ASSERT_OK_AND_ASSIGN(GptConfig gpt2, GptPreset("gpt2"));
  // 768 columns: a chunk of 2.4M elements holds 3125 rows, one 2048-row tile.
  EXPECT_EQ(GptVocabBlockRowsForChunk(gpt2, 2'400'000), 2048);
  EXPECT_EQ(GptVocabBlockRowsForChunk(gpt2, 6'300'000), 8192);
  EXPECT_EQ(GptVocabBlockRowsForChunk(gpt2, 1'000'000), 0);  // not one tile
  EXPECT_EQ(GptVocabBlockRowsForChunk(gpt2, 1'000'000, 512), 1024);
  EXPECT_EQ(GptVocabBlockRowsForChunk(gpt2, 100'000'000), 50257);  // all of it
  // The smallest chunk: mlp.c_fc (768 x 3072 + 3072) for gpt2; one tile of rows (2048 x 128)
  // for a narrow model, or wpe with a narrower tile.
  EXPECT_EQ(GptMinChunkElems(gpt2), 768 * 3072 + 3072);
  ASSERT_OK_AND_ASSIGN(GptConfig tiny, GptPreset("tiny"));
  EXPECT_EQ(GptMinChunkElems(tiny), 64 * 256 + 256);  // mlp.c_fc; the vocabulary is 256 x 64
  EXPECT_EQ(GptVocabBlockRowsForChunk(tiny, 256 * 64), 256);
  GptConfig narrow = gpt2;
  narrow.hidden = 128;
  narrow.num_heads = 2;
  EXPECT_EQ(GptMinChunkElems(narrow), 2048 * 128);
  EXPECT_EQ(GptMinChunkElems(narrow, 256), 1024 * 128);  // wpe
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
