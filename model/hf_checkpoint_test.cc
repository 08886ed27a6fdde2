// Tests for model/hf_checkpoint.h against directories written by transformers
// (model/testdata/hf_tiny_*, make_hf_testdata.py) and by the exporter itself
// (model/testdata/cpp_export_*, loaded by transformers in check_cpp_export.py).
#include "model/hf_checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "memory/convert.h"
#include "memory/dtype.h"
#include "model/hf_config.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/safetensors_index.h"
#include "model/testing/hf_export_testdata.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::AllOf;
using testing::Fnv1a64;
using ::testing::HasSubstr;
using testing::HfTestValue;
using ::testing::Not;

std::string TestData(const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/patrickstar_cc/model/testdata/", name);
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  const std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::set<std::string> List(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.insert(n);
  }
  ::closedir(d);
  return names;
}

std::string Hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Directories written by transformers.

struct TransformersDir {
  const char* name;
  ModelFamily family;
  DType dtype;
  bool sharded;
};
constexpr TransformersDir kTransformersDirs[] = {
    {"hf_tiny_llama", ModelFamily::kLlama, DType::kBF16, true},
    {"hf_tiny_qwen2", ModelFamily::kQwen2, DType::kF32, true},
    {"hf_tiny_gpt2", ModelFamily::kGpt2, DType::kF16, false},
    {"hf_tiny_qwen3", ModelFamily::kQwen3, DType::kBF16, true},
};

TEST(HfCheckpointTest, ReadsTransformersDirectoriesExactly) {
  for (const TransformersDir& d : kTransformersDirs) {
    SCOPED_TRACE(d.name);
    const std::string dir = TestData(d.name);
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint ckpt, HfCheckpoint::Open(dir));
    EXPECT_EQ(ckpt.config().family, d.family);
    EXPECT_EQ(ckpt.config().torch_dtype, d.dtype);
    EXPECT_EQ(ckpt.weights().sharded(), d.sharded);
    EXPECT_FALSE(ckpt.had_tied_lm_head());
    // Every tensor transformers saved, byte for byte (hashes computed by the Python script).
    const nlohmann::json manifest = nlohmann::json::parse(ReadFile(dir + "/manifest.json"));
    ASSERT_EQ(manifest["tensors"].size(), ckpt.weights().names().size());
    for (const auto& [name, entry] : manifest["tensors"].items()) {
      const ShardedTensorRef ref = ckpt.weights().Find(name);
      ASSERT_NE(ref.info, nullptr) << name;
      EXPECT_EQ(ref.info->shape, entry["shape"].get<std::vector<int64_t>>()) << name;
      EXPECT_EQ(ref.file->path().substr(ref.file->path().rfind('/') + 1), entry["file"]) << name;
      EXPECT_EQ(Hex(Fnv1a64(ref.file->Bytes(*ref.info))), entry["fnv1a64"]) << name;
    }
    // Every parameter is found under its name, with its shape.
    for (const TensorSpec& p : ckpt.parameters()) {
      const SafetensorsTensorInfo* info = ckpt.Find(p.name);
      ASSERT_NE(info, nullptr) << p.name;
      EXPECT_EQ(info->shape, p.shape);
      EXPECT_EQ(info->dtype, d.dtype);
    }
  }
}

TEST(HfCheckpointTest, TransformersConfigsParseToTheirShapes) {
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint llama, HfCheckpoint::Open(TestData("hf_tiny_llama")));
  const ModelConfig& c = llama.config();
  EXPECT_EQ(c.vocab_size, 64);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, (RopeScaling{RopeScalingType::kLlama3, 8, 1, 4, 64}));
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(llama.parameters().back().name, "lm_head.weight");

  ASSERT_OK_AND_ASSIGN(const HfCheckpoint qwen, HfCheckpoint::Open(TestData("hf_tiny_qwen2")));
  EXPECT_EQ(qwen.config().head_dim, 4);
  EXPECT_EQ(qwen.config().num_kv_heads, 2);
  EXPECT_EQ(qwen.config().rope_theta, 1e6);
  EXPECT_TRUE(qwen.config().qkv_bias);
  EXPECT_TRUE(qwen.config().tie_word_embeddings);
  EXPECT_EQ(qwen.parameters().back().name, "model.norm.weight");

  // Qwen3ForCausalLM as transformers 4.57 writes it (rope_theta at the top level, rope_scaling
  // null): head_dim 16 is not hidden_size / num_attention_heads = 8, so q_proj is [4 x 16, 32].
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint qwen3, HfCheckpoint::Open(TestData("hf_tiny_qwen3")));
  const ModelConfig& q3 = qwen3.config();
  EXPECT_EQ(q3.vocab_size, 256);
  EXPECT_EQ(q3.hidden_size, 32);
  EXPECT_EQ(q3.num_layers, 2);
  EXPECT_EQ(q3.num_heads, 4);
  EXPECT_EQ(q3.num_kv_heads, 2);
  EXPECT_EQ(q3.head_dim, 16);
  EXPECT_EQ(q3.intermediate_size, 48);
  EXPECT_EQ(q3.max_position_embeddings, 128);
  EXPECT_EQ(q3.norm_eps, 1e-6);
  EXPECT_EQ(q3.rope_theta, 1e6);
  EXPECT_EQ(q3.rope_scaling, RopeScaling{});
  EXPECT_FALSE(q3.qkv_bias || q3.o_proj_bias || q3.mlp_bias);
  EXPECT_TRUE(q3.qk_norm());
  EXPECT_TRUE(q3.tie_word_embeddings);
  EXPECT_EQ(qwen3.parameters().back().name, "model.norm.weight");
  const std::map<std::string, std::vector<int64_t>> qwen3_shapes = {
      {"model.layers.1.self_attn.q_proj.weight", {64, 32}},
      {"model.layers.1.self_attn.k_proj.weight", {32, 32}},
      {"model.layers.1.self_attn.v_proj.weight", {32, 32}},
      {"model.layers.1.self_attn.o_proj.weight", {32, 64}},
      {"model.layers.1.self_attn.q_norm.weight", {16}},
      {"model.layers.1.self_attn.k_norm.weight", {16}},
  };
  for (const auto& [name, shape] : qwen3_shapes) {
    const SafetensorsTensorInfo* info = qwen3.Find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->shape, shape) << name;
  }
  EXPECT_EQ(qwen3.Find("model.layers.0.self_attn.q_proj.bias"), nullptr);

  ASSERT_OK_AND_ASSIGN(const HfCheckpoint gpt2, HfCheckpoint::Open(TestData("hf_tiny_gpt2")));
  ASSERT_OK_AND_ASSIGN(const GptConfig g, ToGptConfig(gpt2.config()));
  EXPECT_EQ(g.vocab_size, 50);
  EXPECT_EQ(g.max_seq_len, 16);
  EXPECT_EQ(g.hidden, 16);
  EXPECT_EQ(g.num_layers, 2);
  EXPECT_EQ(g.num_heads, 2);
  // GPT2LMHeadModel saved the names with "transformer."; parameters() has them without.
  EXPECT_EQ(gpt2.parameters().front().name, "wte.weight");
  ASSERT_NE(gpt2.Find("wte.weight"), nullptr);
  EXPECT_EQ(gpt2.Find("wte.weight")->name, "transformer.wte.weight");
}

// Import -> export -> import keeps every parameter's bytes, for every stored dtype, sharded or
// not; exporting the re-imported directory again gives identical files.
TEST(HfCheckpointTest, ImportExportRoundTripIsBitExact) {
  for (const TransformersDir& d : kTransformersDirs) {
    SCOPED_TRACE(d.name);
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint src, HfCheckpoint::Open(TestData(d.name)));
    for (const int64_t max_shard_bytes : {int64_t{1000}, int64_t{1} << 30}) {
      const std::string parent = FreshDir(absl::StrCat("roundtrip_", d.name, max_shard_bytes));
      const std::string out1 = parent + "/one";
      const std::string out2 = parent + "/two";
      HfExportOptions options;
      options.max_shard_bytes = max_shard_bytes;
      options.max_piece_bytes = 96;
      options.base_config_json = src.config_json();
      ASSERT_OK(WriteHfCheckpoint(out1, src.config(), d.dtype, FillFromCheckpoint(src, d.dtype),
                                  options));
      ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(out1));
      EXPECT_EQ(back.weights().sharded(), max_shard_bytes == 1000);
      ModelConfig want = src.config();
      want.name = back.config().name;
      EXPECT_EQ(back.config(), want);
      for (const TensorSpec& p : src.parameters()) {
        ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView a, src.Get(p.name));
        ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView b, back.Get(p.name));
        EXPECT_EQ(a.dtype, b.dtype);
        ASSERT_EQ(a.bytes.size(), b.bytes.size());
        EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin())) << p.name;
      }
      // Keys transformers wrote that ModelConfig does not model survive.
      const nlohmann::json written = nlohmann::json::parse(ReadFile(out1 + "/config.json"));
      const nlohmann::json original = nlohmann::json::parse(src.config_json());
      // (transformers 4.57, which wrote hf_tiny_qwen3, leaves a null bos_token_id out.)
      for (const char* key : {"transformers_version", "bos_token_id", "layer_types"}) {
        ASSERT_EQ(written.contains(key), original.contains(key)) << key;
        if (original.contains(key)) {
          EXPECT_EQ(written[key], original[key]) << key;
        }
      }
      // Deterministic: exporting the export gives the same files.
      options.base_config_json = back.config_json();
      ASSERT_OK(WriteHfCheckpoint(out2, back.config(), d.dtype, FillFromCheckpoint(back, d.dtype),
                                  options));
      ASSERT_EQ(List(out1), List(out2));
      for (const std::string& f : List(out1)) {
        EXPECT_EQ(ReadFile(out1 + "/" + f), ReadFile(out2 + "/" + f)) << f;
      }
    }
  }
}

// Phi-3's fused tensors (the Phi3ForCausalLM directories transformers wrote,
// make_family_parity.py): each q/k/v and gate/up parameter reads as its rows of the fused file
// tensor, and an export writes the fused tensors back byte for byte (pieces of 52 bytes straddle
// the parts), longrope and partial rotary in config.json included.
TEST(HfCheckpointTest, Phi3FusedTensorsSplitAndFuseBack) {
  for (const char* name : {"parity_phi3", "parity_phi3_longrope"}) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint src, HfCheckpoint::Open(TestData(name)));
    const ModelConfig& c = src.config();
    ASSERT_EQ(c.family, ModelFamily::kPhi3);
    const int64_t e = c.hidden_size, q = c.q_size(), k = c.kv_size(), i = c.intermediate_size;
    const auto read_file = [&](const std::string& tensor, int64_t first, int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      EXPECT_OK(src.weights().ReadAsF32(tensor, first, absl::MakeSpan(v)));
      return v;
    };
    const auto read_param = [&](const std::string& tensor, int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      EXPECT_OK(src.ReadAsF32(tensor, 0, absl::MakeSpan(v)));
      return v;
    };
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string a = absl::StrCat("model.layers.", l, ".self_attn.");
      const std::string m = absl::StrCat("model.layers.", l, ".mlp.");
      EXPECT_EQ(read_param(a + "q_proj.weight", q * e), read_file(a + "qkv_proj.weight", 0, q * e));
      EXPECT_EQ(read_param(a + "k_proj.weight", k * e),
                read_file(a + "qkv_proj.weight", q * e, k * e));
      EXPECT_EQ(read_param(a + "v_proj.weight", k * e),
                read_file(a + "qkv_proj.weight", (q + k) * e, k * e));
      EXPECT_EQ(read_param(m + "gate_proj.weight", i * e),
                read_file(m + "gate_up_proj.weight", 0, i * e));
      EXPECT_EQ(read_param(m + "up_proj.weight", i * e),
                read_file(m + "gate_up_proj.weight", i * e, i * e));
      // A part has no file entry of its own; a range past it is refused.
      EXPECT_EQ(src.Find(a + "k_proj.weight"), nullptr);
      EXPECT_THAT(src.Get(a + "k_proj.weight"), StatusIs(absl::StatusCode::kNotFound));
      std::vector<float> past(2);
      EXPECT_THAT(src.ReadAsF32(a + "k_proj.weight", k * e - 1, absl::MakeSpan(past)),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("qkv_proj")));
    }
    const std::string out = FreshDir(absl::StrCat("phi3_export_", name)) + "/out";
    HfExportOptions options;
    options.max_piece_bytes = 52;
    options.base_config_json = src.config_json();
    ASSERT_OK(
        WriteHfCheckpoint(out, c, DType::kF32, FillFromCheckpoint(src, DType::kF32), options));
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(out));
    ModelConfig want = c;
    want.name = back.config().name;
    EXPECT_EQ(back.config(), want);
    const std::vector<std::string> names = src.weights().names();
    const std::vector<std::string> back_names = back.weights().names();
    EXPECT_EQ(std::set<std::string>(back_names.begin(), back_names.end()),
              std::set<std::string>(names.begin(), names.end()));
    for (const std::string& t : names) {
      ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView a, src.weights().Get(t));
      ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView b, back.weights().Get(t));
      ASSERT_EQ(a.bytes.size(), b.bytes.size()) << t;
      EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin())) << t;
    }
    const nlohmann::json written = nlohmann::json::parse(ReadFile(out + "/config.json"));
    const nlohmann::json original = nlohmann::json::parse(src.config_json());
    for (const char* key : {"partial_rotary_factor", "rope_scaling", "sliding_window",
                            "original_max_position_embeddings", "architectures"}) {
      ASSERT_TRUE(written.contains(key) && original.contains(key)) << key;
      EXPECT_EQ(written[key], original[key]) << key;
    }
  }
  // A directory whose fused tensors do not fit its config.json: named, with both shapes.
  const std::string bad = FreshDir("phi3_bad");
  ASSERT_EQ(
      std::system(absl::StrCat("cp '", TestData("parity_phi3"), "/model.safetensors' '", bad, "/'")
                      .c_str()),
      0);
  nlohmann::json config = nlohmann::json::parse(ReadFile(TestData("parity_phi3") + "/config.json"));
  config["num_key_value_heads"] = 4;
  WriteFile(bad + "/config.json", config.dump());
  EXPECT_THAT(HfCheckpoint::Open(bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.layers.0.self_attn.qkv_proj.weight [64, 32] "
                                       "(expected [96, 32])"),
                             Not(HasSubstr("q_proj")))));
}

// The exported config.json of the transformers-written Qwen3 directory keeps what makes it a
// Qwen3 model for transformers (model_type, architectures, the head_dim of its own, one
// attention_bias) and reads back to the same configuration.
TEST(HfCheckpointTest, ExportedQwen3ConfigKeepsItsKeysAndReadsBack) {
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint src, HfCheckpoint::Open(TestData("hf_tiny_qwen3")));
  const std::string out = FreshDir("qwen3_config") + "/m";
  HfExportOptions options;
  options.base_config_json = src.config_json();
  ASSERT_OK(WriteHfCheckpoint(out, src.config(), DType::kF32, FillFromCheckpoint(src, DType::kF32),
                              options));
  const nlohmann::json written = nlohmann::json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(written["model_type"], "qwen3");
  EXPECT_EQ(written["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(written["head_dim"], 16);
  EXPECT_EQ(written["hidden_size"], 32);
  EXPECT_EQ(written["num_attention_heads"], 4);
  EXPECT_EQ(written["num_key_value_heads"], 2);
  EXPECT_EQ(written["attention_bias"], false);
  EXPECT_EQ(written["tie_word_embeddings"], true);
  EXPECT_EQ(written["rope_theta"], 1e6);
  EXPECT_EQ(written["torch_dtype"], "float32");
  ASSERT_OK_AND_ASSIGN(const ModelConfig back, ReadHfConfig(out + "/config.json"));
  ModelConfig want = src.config();
  want.name = back.name;
  want.torch_dtype = DType::kF32;
  EXPECT_EQ(back, want);
  // The weights come back as f32 widenings of the bf16 originals, q_norm and k_norm included.
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint reopened, HfCheckpoint::Open(out));
  for (const TensorSpec& p : src.parameters()) {
    std::vector<float> a(static_cast<size_t>(p.numel())), b(a.size());
    ASSERT_OK(src.ReadAsF32(p.name, 0, absl::MakeSpan(a)));
    ASSERT_OK(reopened.ReadAsF32(p.name, 0, absl::MakeSpan(b)));
    EXPECT_EQ(a, b) << p.name;
  }
}

// The transformers-written Gemma 3 directories export to a gemma3_text config.json that keeps its
// keys (hidden_activation, query_pre_attn_scalar, layer_types, rope_local_base_freq, linear rope
// scaling) and reads back to the same configuration; the weights (no lm_head: tied) come back
// bit for bit.
TEST(HfCheckpointTest, ExportedGemma3ReadsBack) {
  for (const char* name : {"parity_gemma3", "parity_gemma3_linear"}) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint src, HfCheckpoint::Open(TestData(name)));
    ASSERT_EQ(src.config().family, ModelFamily::kGemma3);
    const std::string out = FreshDir(absl::StrCat("gemma3_export_", name)) + "/m";
    HfExportOptions options;
    options.base_config_json = src.config_json();
    options.max_piece_bytes = 52;
    ASSERT_OK(WriteHfCheckpoint(out, src.config(), DType::kF32,
                                FillFromCheckpoint(src, DType::kF32), options));
    const nlohmann::json written = nlohmann::json::parse(ReadFile(out + "/config.json"));
    EXPECT_EQ(written["model_type"], "gemma3_text");
    EXPECT_EQ(written["architectures"], nlohmann::json::array({"Gemma3ForCausalLM"}));
    EXPECT_EQ(written["hidden_activation"], "gelu_pytorch_tanh");
    EXPECT_FALSE(written.contains("hidden_act"));
    EXPECT_EQ(written["query_pre_attn_scalar"], 8);
    EXPECT_EQ(written["rope_local_base_freq"], 100.0);
    EXPECT_EQ(written["sliding_window"], 4);
    EXPECT_EQ(written["layer_types"],
              nlohmann::json::array({"sliding_attention", "full_attention", "sliding_attention"}));
    EXPECT_EQ(written["tie_word_embeddings"], true);
    ASSERT_OK_AND_ASSIGN(const ModelConfig back, ReadHfConfig(out + "/config.json"));
    ModelConfig want = src.config();
    want.name = back.name;
    want.torch_dtype = DType::kF32;
    EXPECT_EQ(back, want);
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint reopened, HfCheckpoint::Open(out));
    EXPECT_EQ(reopened.Find("lm_head.weight"), nullptr);
    for (const TensorSpec& p : src.parameters()) {
      std::vector<float> a(static_cast<size_t>(p.numel())), b(a.size());
      ASSERT_OK(src.ReadAsF32(p.name, 0, absl::MakeSpan(a)));
      ASSERT_OK(reopened.ReadAsF32(p.name, 0, absl::MakeSpan(b)));
      EXPECT_EQ(a, b) << p.name;
    }
  }
}

// Exporting in another dtype converts exactly like memory/convert.h (round to nearest even).
TEST(HfCheckpointTest, ExportConvertsDTypes) {
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint src, HfCheckpoint::Open(TestData("hf_tiny_qwen2")));
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string out = FreshDir(absl::StrCat("convert", static_cast<int>(dtype))) + "/m";
    ASSERT_OK(WriteHfCheckpoint(out, src.config(), dtype, FillFromCheckpoint(src, dtype)));
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(out));
    EXPECT_EQ(back.config().torch_dtype, dtype);
    for (const TensorSpec& p : src.parameters()) {
      std::vector<float> f32(static_cast<size_t>(p.numel()));
      ASSERT_OK(src.ReadAsF32(p.name, 0, absl::MakeSpan(f32)));
      std::vector<uint16_t> want(f32.size());
      ASSERT_OK(
          Convert(DType::kF32, f32.data(), dtype, want.data(), static_cast<int64_t>(f32.size())));
      ASSERT_OK_AND_ASSIGN(const SafetensorsTensorView got, back.Get(p.name));
      ASSERT_EQ(got.dtype, dtype);
      ASSERT_EQ(got.bytes.size(), want.size() * 2);
      EXPECT_EQ(std::memcmp(got.bytes.data(), want.data(), got.bytes.size()), 0) << p.name;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Directories written by the exporter and loaded by transformers (check_cpp_export.py).

TEST(HfCheckpointTest, ExporterStillWritesTheFilesTransformersLoaded) {
  const std::string out = FreshDir("cpp_export");
  ASSERT_OK(testing::WriteHfExportTestdata(out));
  for (const testing::HfExportCase& c : testing::HfExportCases()) {
    SCOPED_TRACE(c.dir_name);
    const std::string committed = TestData(c.dir_name);
    const std::string fresh = absl::StrCat(out, "/", c.dir_name);
    ASSERT_EQ(List(fresh), List(committed));
    for (const std::string& f : List(fresh)) {
      EXPECT_EQ(ReadFile(fresh + "/" + f), ReadFile(committed + "/" + f)) << f;
    }
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint ckpt, HfCheckpoint::Open(committed));
    ModelConfig want = c.config;
    want.name = ckpt.config().name;
    want.torch_dtype = c.dtype;
    EXPECT_EQ(ckpt.config(), want);
    for (const TensorSpec& p : ckpt.parameters()) {
      std::vector<float> values(static_cast<size_t>(p.numel()));
      ASSERT_OK(ckpt.ReadAsF32(p.name, 0, absl::MakeSpan(values)));
      for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_EQ(values[i], HfTestValue(p.name, static_cast<int64_t>(i)))
            << p.name << "[" << i << "]";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Streaming and shard boundaries.

HfExportOptions MaxShard(int64_t max_shard_bytes) {
  HfExportOptions o;
  o.max_shard_bytes = max_shard_bytes;
  return o;
}

HfExportOptions Extra(const std::string& file) {
  HfExportOptions o;
  o.extra_files = {file};
  return o;
}

ModelConfig TinyLlama(int64_t vocab) {
  ModelConfig c = *ModelPreset("llama-tiny");
  c.vocab_size = vocab;
  return c;
}

HfExportFillFn ValueFill(DType dtype) {
  return ConvertingFill(
      [](const TensorSpec& t, int64_t first, absl::Span<float> dst) {
        for (size_t j = 0; j < dst.size(); ++j) {
          dst[j] = HfTestValue(t.name, first + static_cast<int64_t>(j));
        }
        return absl::OkStatus();
      },
      dtype);
}

TEST(HfCheckpointTest, ExportStreamsBoundedPiecesInOrder) {
  const ModelConfig c = TinyLlama(5000);  // embedding and head: 5000 x 64 x 4 = 1.28 MB each
  std::map<std::string, int64_t> next;
  int64_t largest_piece = 0;
  const HfExportFillFn values = ValueFill(DType::kF32);
  HfExportOptions options;
  options.max_piece_bytes = 4096;
  const std::string out = FreshDir("stream") + "/m";
  ASSERT_OK(WriteHfCheckpoint(
      out, c, DType::kF32,
      [&](const TensorSpec& t, int64_t first, absl::Span<uint8_t> dst) {
        EXPECT_EQ(first, next[t.name]) << t.name;
        next[t.name] += static_cast<int64_t>(dst.size()) / 4;
        largest_piece = std::max<int64_t>(largest_piece, static_cast<int64_t>(dst.size()));
        return values(t, first, dst);
      },
      options));
  EXPECT_EQ(largest_piece, 4096);
  for (const TensorSpec& p : HfParameterSpecs(c)) EXPECT_EQ(next[p.name], p.numel()) << p.name;
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(out));
  std::vector<float> row(64);
  ASSERT_OK(back.ReadAsF32("model.embed_tokens.weight", 4321 * 64, absl::MakeSpan(row)));
  for (int64_t j = 0; j < 64; ++j) {
    EXPECT_EQ(row[j], HfTestValue("model.embed_tokens.weight", 4321 * 64 + j));
  }
}

TEST(HfCheckpointTest, ShardBoundaries) {
  const ModelConfig c = TinyLlama(256);
  int64_t total = 0, largest = 0;
  for (const TensorSpec& p : HfParameterSpecs(c)) {
    total += 2 * p.numel();
    largest = std::max(largest, 2 * p.numel());
  }
  // Exactly at the limit: one file, no index.
  std::string out = FreshDir("limit") + "/m";
  ASSERT_OK(WriteHfCheckpoint(out, c, DType::kBF16, ValueFill(DType::kBF16), MaxShard(total)));
  EXPECT_EQ(List(out), (std::set<std::string>{"config.json", "model.safetensors"}));
  // One byte less: sharded.
  ASSERT_OK(WriteHfCheckpoint(out, c, DType::kBF16, ValueFill(DType::kBF16), MaxShard(total - 1)));
  EXPECT_TRUE(List(out).contains("model.safetensors.index.json"));
  EXPECT_FALSE(List(out).contains("model.safetensors"));  // the old single file is gone
  EXPECT_OK(HfCheckpoint::Open(out));
  // Tensors larger than the limit (the embedding and the head) get shards of their own.
  ASSERT_OK(
      WriteHfCheckpoint(out, c, DType::kBF16, ValueFill(DType::kBF16), MaxShard(largest - 2)));
  const nlohmann::json index =
      nlohmann::json::parse(ReadFile(out + "/model.safetensors.index.json"));
  std::map<std::string, int> per_shard;
  for (const auto& [name, shard] : index["weight_map"].items()) ++per_shard[shard];
  EXPECT_EQ(per_shard[index["weight_map"]["model.embed_tokens.weight"]], 1);
  EXPECT_EQ(per_shard[index["weight_map"]["lm_head.weight"]], 1);
  EXPECT_EQ(index["metadata"]["total_size"], total);
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(out));
  EXPECT_EQ(back.weights().total_size_bytes(), total);
  // Old shards of a previous export with more shards are gone.
  ASSERT_OK(WriteHfCheckpoint(out, c, DType::kBF16, ValueFill(DType::kBF16), MaxShard(total / 2)));
  for (const std::string& f : List(out)) {
    if (absl::StartsWith(f, "model-")) {
      EXPECT_TRUE(absl::StrContains(f, "-of-00003")) << f;
    }
  }
  EXPECT_OK(HfCheckpoint::Open(out));
}

// ---------------------------------------------------------------------------------------------
// Directories that do not match their config.

// Writes `config` as config.json and `tensors` (name -> shape, F32, filled with 0.5) as
// model.safetensors into a fresh directory.
std::string HandMadeDir(const std::string& name, const ModelConfig& config,
                        const std::vector<SafetensorsTensorSpec>& tensors,
                        const std::string& config_json = "") {
  const std::string dir = FreshDir(name);
  WriteFile(dir + "/config.json", config_json.empty() ? *HfConfigJson(config) : config_json);
  EXPECT_OK(WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}},
                             [&](size_t i, absl::Span<uint8_t> dst) {
                               if (tensors[i].dtype == DType::kF32) {
                                 std::vector<float> v(dst.size() / 4, 0.5f);
                                 std::memcpy(dst.data(), v.data(), dst.size());
                               } else {
                                 std::fill(dst.begin(), dst.end(), 0);
                               }
                               return absl::OkStatus();
                             }));
  return dir;
}

std::vector<SafetensorsTensorSpec> SpecsOf(const ModelConfig& c) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const TensorSpec& p : HfParameterSpecs(c)) specs.push_back({p.name, DType::kF32, p.shape});
  return specs;
}

TEST(HfCheckpointTest, MismatchedWeightsAreListed) {
  const ModelConfig c = TinyLlama(256);
  std::vector<SafetensorsTensorSpec> specs = SpecsOf(c);
  EXPECT_OK(HfCheckpoint::Open(HandMadeDir("exact", c, specs)));

  // Missing, wrong shape and unexpected, all in one message.
  std::vector<SafetensorsTensorSpec> bad = specs;
  bad.erase(bad.begin() + 3);  // model.layers.0.self_attn.k_proj.weight
  bad[1].shape = {65};         // model.layers.0.input_layernorm.weight
  bad.push_back({"model.layers.7.mlp.up_proj.weight", DType::kF32, {2}});
  const std::string dir = HandMadeDir("bad", c, bad);
  EXPECT_THAT(
      HfCheckpoint::Open(dir),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(dir), HasSubstr("missing: model.layers.0.self_attn.k_proj"),
                     HasSubstr("model.layers.0.input_layernorm.weight [65] (expected [64])"),
                     HasSubstr("model.layers.7.mlp.up_proj.weight"))));

  // A config with 3 layers over weights for 2.
  ModelConfig deeper = c;
  deeper.num_layers = 3;
  EXPECT_THAT(HfCheckpoint::Open(HandMadeDir("deeper", deeper, specs)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing: model.layers.2.input_layernorm.weight")));

  // Ignorable RoPE buffers are accepted.
  std::vector<SafetensorsTensorSpec> with_buffers = specs;
  with_buffers.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {8}});
  with_buffers.push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", DType::kF32, {8}});
  EXPECT_OK(HfCheckpoint::Open(HandMadeDir("buffers", c, with_buffers)));

  // Each tensor may have its own dtype.
  std::vector<SafetensorsTensorSpec> f16 = specs;
  f16[0].dtype = DType::kF16;
  EXPECT_OK(HfCheckpoint::Open(HandMadeDir("mixed_dtypes", c, f16)));

  // A parameter in a dtype the project does not compute in: patch F32 to I32 in the header.
  const std::string i32 = HandMadeDir("i32", c, specs);
  std::string bytes = ReadFile(i32 + "/model.safetensors");
  const std::string from = R"("model.norm.weight":{"dtype":"F32")";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), R"("model.norm.weight":{"dtype":"I32")");
  WriteFile(i32 + "/model.safetensors", bytes);
  EXPECT_THAT(HfCheckpoint::Open(i32),
              StatusIs(absl::StatusCode::kUnimplemented,
                       AllOf(HasSubstr("model.norm.weight"), HasSubstr("I32"))));
}

// A parameter holding Inf or NaN is refused at Open, naming the directory, the shard, the tensor
// and the element — in a sharded bf16 directory as in a single f32 file.
TEST(HfCheckpointTest, RefusesNonFiniteParameters) {
  const ModelConfig c = TinyLlama(256);
  const std::string bad_name = "model.layers.1.mlp.down_proj.weight";
  int64_t cols = 0;
  for (const TensorSpec& p : HfParameterSpecs(c)) {
    if (p.name == bad_name) cols = p.shape[1];
  }
  ASSERT_GT(cols, 0);
  const int64_t bad_elem = 2 * cols + 5;
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const HfExportFillFn poisoned = ConvertingFill(
        [&](const TensorSpec& t, int64_t first, absl::Span<float> dst) {
          for (size_t j = 0; j < dst.size(); ++j) {
            const int64_t e = first + static_cast<int64_t>(j);
            dst[j] = t.name == bad_name && e == bad_elem ? std::nanf("") : HfTestValue(t.name, e);
          }
          return absl::OkStatus();
        },
        dtype);
    const std::string out = FreshDir(absl::StrCat("nonfinite_", DTypeName(dtype))) + "/m";
    ASSERT_OK(WriteHfCheckpoint(out, c, dtype, poisoned,
                                MaxShard(dtype == DType::kBF16 ? 64 * 1024 : int64_t{1} << 40)));
    EXPECT_THAT(HfCheckpoint::Open(out),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(out), HasSubstr(".safetensors"),
                               HasSubstr(absl::StrCat("'", bad_name, "' holds NaN at [2, 5]")))));
  }
  // The same directory without the NaN opens.
  const std::string ok = FreshDir("finite") + "/m";
  ASSERT_OK(WriteHfCheckpoint(ok, c, DType::kBF16, ValueFill(DType::kBF16), MaxShard(64 * 1024)));
  EXPECT_OK(HfCheckpoint::Open(ok).status());
}

TEST(HfCheckpointTest, TiedHeadMustEqualTheEmbedding) {
  ModelConfig c = TinyLlama(256);
  c.tie_word_embeddings = true;
  std::vector<SafetensorsTensorSpec> specs = SpecsOf(c);
  specs.push_back({"lm_head.weight", DType::kF32, {256, 64}});
  // HandMadeDir fills every F32 tensor with 0.5: equal.
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint ok, HfCheckpoint::Open(HandMadeDir("tied_eq", c, specs)));
  EXPECT_TRUE(ok.had_tied_lm_head());
  specs.back().dtype = DType::kBF16;  // zeros: differs
  EXPECT_THAT(HfCheckpoint::Open(HandMadeDir("tied_ne", c, specs)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("lm_head.weight"), HasSubstr("tie_word_embeddings"))));
  // An untied config without its head.
  c.tie_word_embeddings = false;
  specs.pop_back();
  EXPECT_THAT(HfCheckpoint::Open(HandMadeDir("untied_no_head", c, specs)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing: lm_head.weight")));
}

TEST(HfCheckpointTest, Gpt2PrefixesAndBuffers) {
  const ModelConfig c = FromGptConfig({"g", 30, 8, 8, 1, 2});
  std::vector<SafetensorsTensorSpec> specs = SpecsOf(c);
  specs.push_back({"h.0.attn.bias", DType::kF32, {1, 1, 8, 8}});
  EXPECT_OK(HfCheckpoint::Open(HandMadeDir("gpt2_plain", c, specs)));
  std::vector<SafetensorsTensorSpec> both = SpecsOf(c);
  both.push_back({"transformer.wte.weight", DType::kF32, {30, 8}});
  EXPECT_THAT(HfCheckpoint::Open(HandMadeDir("gpt2_both", c, both)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wte.weight and transformer.wte.weight")));
}

TEST(HfCheckpointTest, MissingAndMalformedFiles) {
  EXPECT_THAT(HfCheckpoint::Open(FreshDir("nothing") + "/nope"),
              StatusIs(absl::StatusCode::kNotFound));
  const std::string no_config = FreshDir("no_config");
  EXPECT_THAT(HfCheckpoint::Open(no_config),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
  const ModelConfig c = TinyLlama(256);
  const std::string bad_json =
      HandMadeDir("bad_config", c, SpecsOf(c), R"({"model_type": "llama", "hidden_size": 64,)");
  EXPECT_THAT(HfCheckpoint::Open(bad_json),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(bad_json + "/config.json"), HasSubstr("line 1"))));
  const std::string no_weights = FreshDir("no_weights");
  WriteFile(no_weights + "/config.json", *HfConfigJson(c));
  EXPECT_THAT(HfCheckpoint::Open(no_weights),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.safetensors")));
}

// ---------------------------------------------------------------------------------------------
// Export options and failures.

TEST(HfCheckpointTest, ExportKeepsAndCopiesSideFiles) {
  const std::string parent = FreshDir("side_files");
  const std::string out = parent + "/m";
  WriteFile(parent + "/tokenizer.json", "{\"tokenizer\": 1}");
  const ModelConfig c = TinyLlama(256);
  ASSERT_OK(WriteHfCheckpoint(out, c, DType::kBF16, ValueFill(DType::kBF16),
                              Extra(parent + "/tokenizer.json")));
  EXPECT_EQ(ReadFile(out + "/tokenizer.json"), "{\"tokenizer\": 1}");
  WriteFile(out + "/generation_config.json", "{}");
  ASSERT_OK(WriteHfCheckpoint(out, c, DType::kF16, ValueFill(DType::kF16)));
  EXPECT_EQ(List(out), (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json",
                                              "generation_config.json"}));
  EXPECT_THAT(WriteHfCheckpoint(out, c, DType::kF16, ValueFill(DType::kF16),
                                Extra(parent + "/config.json")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("extra_files")));
  EXPECT_THAT(WriteHfCheckpoint(out, c, DType::kF16, ValueFill(DType::kF16),
                                Extra(parent + "/missing.json")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.json")));
  EXPECT_THAT(WriteHfCheckpoint(out, c, DType::kF16, ValueFill(DType::kF16), MaxShard(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_shard_bytes")));
  EXPECT_OK(HfCheckpoint::Open(out));
}

TEST(HfCheckpointTest, AFailedExportLeavesThePreviousOne) {
  const std::string out = FreshDir("failed_export") + "/m";
  const ModelConfig c = TinyLlama(256);
  ASSERT_OK(WriteHfCheckpoint(out, c, DType::kF32, ValueFill(DType::kF32), MaxShard(20000)));
  std::map<std::string, std::string> before;
  for (const std::string& f : List(out)) before[f] = ReadFile(out + "/" + f);
  int calls = 0;
  EXPECT_THAT(WriteHfCheckpoint(
                  out, c, DType::kBF16,
                  [&](const TensorSpec&, int64_t, absl::Span<uint8_t>) {
                    return ++calls == 10 ? absl::ResourceExhaustedError("chunk not resident")
                                         : absl::OkStatus();
                  },
                  MaxShard(20000)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("chunk not resident")));
  std::map<std::string, std::string> after;
  for (const std::string& f : List(out)) after[f] = ReadFile(out + "/" + f);
  EXPECT_EQ(before, after);
  // A directory that is not a model directory is never replaced.
  const std::string home = FreshDir("not_a_model");
  WriteFile(home + "/notes.txt", "keep me");
  EXPECT_THAT(WriteHfCheckpoint(home, c, DType::kF32, ValueFill(DType::kF32)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("config.json")));
  EXPECT_EQ(ReadFile(home + "/notes.txt"), "keep me");
}

TEST(HfCheckpointTest, FileNamesOwnedByTheExport) {
  for (const char* owned :
       {"config.json", "model.safetensors", "model.safetensors.index.json",
        "model-00001-of-00002.safetensors", "model-123456-of-123456.safetensors"}) {
    EXPECT_TRUE(IsHfCheckpointFileName(owned)) << owned;
  }
  for (const char* other : {"tokenizer.json", "model-1.safetensors", "model-00001-of-.safetensors",
                            "model-00001-of-00002.safetensors.tmp", "pytorch_model.bin"}) {
    EXPECT_FALSE(IsHfCheckpointFileName(other)) << other;
  }
}

}  // namespace
}  // namespace ps
