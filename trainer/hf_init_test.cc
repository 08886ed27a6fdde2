// checkpoint.init_from (--init_from) naming a Hugging Face model directory: tiny
// LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM and GPT2LMHeadModel
// directories, written here with the project's own writer (model/hf_checkpoint.h), train under an
// accelerator cap below their model data with chunk.size "auto" (the plan covers the Llama
// architecture) and the loss falls; so does the Qwen3 directory transformers wrote
// (model/testdata/hf_tiny_qwen3). The model comes from config.json (no model section needed, a
// contradicting one is refused naming both); the export writes the directory back (loadable by our
// reader; bit-exact after a step at lr 0); a stopped run resumes bit for bit; malformed
// directories are errors naming the file and key.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"
#include "trainer/config.h"
#include "trainer/testing/hf_model_dir.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::ps::trainer_testing::FreshTempDir;
using ::ps::trainer_testing::ReadFile;
using ::ps::trainer_testing::WriteTinyHfModel;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Vocabulary 256 (the synthetic corpus's), hidden 64, 2 layers, 4 heads of 16, GQA.
ModelConfig TinyLlama() {
  ModelConfig c;
  c.name = "tiny-llama";
  c.family = ModelFamily::kLlama;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.max_position_embeddings = 128;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64};
  c.tie_word_embeddings = false;
  c.hidden_act = HiddenAct::kSilu;
  return c;
}

ModelConfig TinyQwen2() {
  ModelConfig c = TinyLlama();
  c.name = "tiny-qwen2";
  c.family = ModelFamily::kQwen2;
  c.num_kv_heads = 1;
  c.rope_scaling = {};
  c.rope_theta = 1000000;
  c.norm_eps = 1e-6;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  return c;
}

// Qwen3ForCausalLM: per-head q/k RMSNorm, no biases, head_dim 32 of its own (hidden / heads = 16),
// tied.
ModelConfig TinyQwen3() {
  ModelConfig c = TinyLlama();
  c.name = "tiny-qwen3";
  c.family = ModelFamily::kQwen3;
  c.head_dim = 32;
  c.rope_scaling = {};
  c.rope_theta = 1000000;
  c.norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  return c;
}

// MistralForCausalLM: no biases, untied, no rope scaling (sliding window unused).
ModelConfig TinyMistral() {
  ModelConfig c = TinyLlama();
  c.name = "tiny-mistral";
  c.family = ModelFamily::kMistral;
  c.rope_scaling = {};
  c.rope_theta = 1000000;
  return c;
}

// GPT2LMHeadModel of the same size (learned positions, LayerNorm, GELU, all biases, tied).
ModelConfig TinyGpt2() {
  ModelConfig c = TinyLlama();
  c.name = "tiny-gpt2";
  c.family = ModelFamily::kGpt2;
  c.num_kv_heads = c.num_heads;
  c.intermediate_size = 4 * c.hidden_size;
  c.rope_scaling = {};
  c.rope_theta = 10000;
  c.qkv_bias = c.o_proj_bias = c.mlp_bias = true;
  c.tie_word_embeddings = true;
  c.hidden_act = HiddenAct::kGeluTanh;
  return c;
}

// Synthetic corpus, micro batch 4 x 32 tokens, chunk size "auto", an accelerator cap of 1 MiB:
// below each Llama-family model's f32 model data (~1.7 MB).
TrainConfig HfConfig(const std::string& init_from) {
  TrainConfig c = DefaultTrainConfig();
  c.checkpoint = CheckpointConfig{};
  c.checkpoint.init_from = init_from;
  c.data.seq_len = 32;
  c.train_micro_batch_size_per_gpu = 4;
  c.train_batch_size = 0;
  c.steps = 10;
  c.chunk.size_elems = 0;
  c.accelerator.memory_bytes = 1 * kMiB;
  c.threads = 2;
  c.data.eval_every = 0;
  c.data.eval_batches = 1;
  c.steps_per_print = 100;
  c.profile = ProfileConfig{};
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 2;
  return c;
}

// Every supported architecture: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// MistralForCausalLM and GPT2LMHeadModel directories.
TEST(HfInit, EveryArchitectureTrainsUnderACapBelowItsModelDataAndExports) {
  for (const ModelConfig& model :
       {TinyLlama(), TinyQwen2(), TinyQwen3(), TinyMistral(), TinyGpt2()}) {
    SCOPED_TRACE(model.name);
    const std::string root = FreshTempDir("hf_init", model.name);
    const std::string dir = root + "/model", exported = root + "/exported";
    ASSERT_OK(WriteTinyHfModel(dir, model, /*seed=*/0));
    TrainConfig c = HfConfig(dir);
    c.checkpoint.export_path = exported;
    // GPT-2's 4E-wide MLP keeps more activations than the Llama blocks' SwiGLU of 2E: the plan
    // needs 1.16 MiB there (and refuses 1 MiB up front); 1.5 MiB is still below its model data.
    // Qwen3's head_dim of 32 (twice hidden / heads) doubles q, k, v and the attention output: the
    // plan needs 1.13 MiB; 1.5 MiB is still below its model data (1.76 MiB).
    if (model.family == ModelFamily::kGpt2 || model.family == ModelFamily::kQwen3) {
      c.accelerator.memory_bytes = 3 * kMiB / 2;
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
    ASSERT_OK(trainer->Run());
    const std::vector<StepMetrics>& h = trainer->history();
    ASSERT_EQ(h.size(), 10u);
    const int64_t model_data = ModelParameterCount(model) * 16;
    EXPECT_LT(c.accelerator.memory_bytes, model_data);
    // The loss falls from ln(256) = 5.55.
    EXPECT_NEAR(h.front().loss, std::log(256.0), 0.2);
    EXPECT_LT(h.back().loss, h.front().loss - 0.3) << h.front().loss << " -> " << h.back().loss;
    for (const StepMetrics& m : h) EXPECT_TRUE(std::isfinite(m.loss));
    // The export is a model directory of the same configuration.
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(exported));
    ModelConfig want = model, got = back.config();
    want.name = got.name = "";
    want.torch_dtype = got.torch_dtype = std::nullopt;
    EXPECT_EQ(got, want);
  }
}

// One step at lr 0 (the scheduler's warm-up starts at 0) changes no parameter: the exported
// directory's files equal the imported ones byte for byte (Llama, Qwen2, Qwen3 and GPT-2
// directories).
TEST(HfInit, ImportExportRoundTripIsBitExact) {
  ASSERT_OK_AND_ASSIGN(ModelConfig gpt2, ModelPreset("tiny"));  // a GPT2LMHeadModel directory
  for (const ModelConfig& model : {TinyLlama(), TinyQwen2(), TinyQwen3(), gpt2}) {
    SCOPED_TRACE(model.name);
    const std::string root = FreshTempDir("hf_round_trip", model.name);
    const std::string dir = root + "/model", exported = root + "/exported";
    ASSERT_OK(WriteTinyHfModel(dir, model, /*seed=*/0));
    TrainConfig c = HfConfig(dir);
    c.steps = 1;
    c.accelerator.memory_bytes =
        4 * kMiB;  // room for GPT-2's activations; eviction is tested above
    c.checkpoint.export_path = exported;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
    ASSERT_OK(trainer->Run());
    ASSERT_EQ(trainer->history().front().lr, 0.0);
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      EXPECT_EQ(ReadFile(entry.path().string()), ReadFile(exported + "/" + name)) << name;
      ++files;
    }
    EXPECT_GE(files, 2);
  }
}

// model/testdata/hf_tiny_qwen3 was written by transformers' own save_pretrained
// (make_hf_testdata.py): a bf16, sharded Qwen3ForCausalLM with head_dim 16 of its own (hidden 32,
// 4 heads), GQA and a tied head, over the byte corpus's 256 tokens. It imports as it is: one step
// at lr 0 exports every parameter as the exact f32 widening of its bf16 value; ten steps lower the
// loss and export a directory of the same configuration.
TEST(HfInit, TrainsTheQwen3DirectoryTransformersWrote) {
  const std::string dir = trainer_testing::Runfile("model/testdata/hf_tiny_qwen3");
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint src, HfCheckpoint::Open(dir));
  ASSERT_EQ(src.config().family, ModelFamily::kQwen3);
  ASSERT_EQ(src.config().torch_dtype, DType::kBF16);
  const std::string root = FreshTempDir("hf_transformers", "qwen3");

  TrainConfig lr0 = HfConfig(dir);
  lr0.steps = 1;
  lr0.checkpoint.export_path = root + "/lr0";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t0, Trainer::Create(lr0, {}));
  ASSERT_OK(t0->Run());
  ASSERT_EQ(t0->history().front().lr, 0.0);
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint same, HfCheckpoint::Open(lr0.checkpoint.export_path));
  EXPECT_EQ(same.config().torch_dtype, DType::kF32);
  ASSERT_EQ(same.parameters().size(), src.parameters().size());
  for (const TensorSpec& p : src.parameters()) {
    std::vector<float> want(static_cast<size_t>(p.numel())), got(want.size());
    ASSERT_OK(src.ReadAsF32(p.name, 0, absl::MakeSpan(want)));
    ASSERT_OK(same.ReadAsF32(p.name, 0, absl::MakeSpan(got)));
    EXPECT_EQ(got, want) << p.name;
  }

  TrainConfig c = HfConfig(dir);
  c.checkpoint.export_path = root + "/trained";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
  ASSERT_OK(trainer->Run());
  const std::vector<StepMetrics>& h = trainer->history();
  ASSERT_EQ(h.size(), 10u);
  for (const StepMetrics& m : h) EXPECT_TRUE(std::isfinite(m.loss));
  EXPECT_LT(h.back().loss, h.front().loss - 0.3) << h.front().loss << " -> " << h.back().loss;
  ASSERT_OK_AND_ASSIGN(const HfCheckpoint back, HfCheckpoint::Open(c.checkpoint.export_path));
  ModelConfig want = src.config(), got = back.config();
  want.name = got.name = "";
  want.torch_dtype = got.torch_dtype = std::nullopt;
  EXPECT_EQ(got, want);
  const std::string config_json = ReadFile(c.checkpoint.export_path + "/config.json");
  EXPECT_THAT(config_json, AllOf(HasSubstr("\"Qwen3ForCausalLM\""), HasSubstr("\"head_dim\": 16"),
                                 HasSubstr("\"attention_bias\": false")));
  // Keys transformers wrote that ModelConfig does not model are kept.
  EXPECT_THAT(config_json, HasSubstr("\"transformers_version\": \"4.57.6\""));
}

// A Llama run stopped after 3 steps and resumed (--resume) continues bit for bit: the losses and
// the exported directory equal those of 6 straight steps.
TEST(HfInit, ResumeOfALlamaRunIsBitExact) {
  const std::string root = FreshTempDir("hf_resume", "qwen2");
  const std::string dir = root + "/model";
  ASSERT_OK(WriteTinyHfModel(dir, TinyQwen2(), /*seed=*/0));
  TrainConfig straight = HfConfig(dir);
  straight.steps = 6;
  straight.checkpoint.dir = root + "/straight";
  straight.checkpoint.export_path = root + "/straight_export";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> a, Trainer::Create(straight, {}));
  ASSERT_OK(a->Run());

  TrainConfig first = straight;
  first.checkpoint.dir = root + "/split";
  first.checkpoint.export_path = "";
  int steps_seen = 0;
  TrainerEnvironment env;
  env.stop_requested = [&] { return ++steps_seen >= 3; };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b1, Trainer::Create(first, env));
  ASSERT_OK(b1->Run());
  ASSERT_EQ(b1->summary().last_step, 3);
  TrainConfig second = first;
  second.checkpoint.resume = true;
  second.checkpoint.export_path = root + "/split_export";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b2, Trainer::Create(second, {}));
  ASSERT_OK(b2->Run());

  std::vector<double> want, got;
  for (const StepMetrics& m : a->history()) want.push_back(m.loss);
  for (const Trainer* t : {b1.get(), b2.get()}) {
    for (const StepMetrics& m : t->history()) got.push_back(m.loss);
  }
  EXPECT_EQ(want, got);
  for (const auto& entry : std::filesystem::directory_iterator(straight.checkpoint.export_path)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(ReadFile(entry.path().string()), ReadFile(second.checkpoint.export_path + "/" + name))
        << name;
  }
}

TEST(HfInit, AContradictingModelSectionIsRefusedNamingBoth) {
  const std::string root = FreshTempDir("hf_contradict", "llama");
  const std::string dir = root + "/model";
  ASSERT_OK(WriteTinyHfModel(dir, TinyLlama(), /*seed=*/0));
  TrainConfig c = HfConfig(dir);
  c.model.num_layers = 3;  // hidden stays the default's 128; config.json says 64
  EXPECT_THAT(Trainer::Create(c, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.n_embd = 128"), HasSubstr(dir + "/config.json"),
                             HasSubstr("hidden_size = 64"))));
}

// No model section at all (a config file without one) is fine; the checks against the model use
// config.json's numbers.
TEST(HfInit, NoModelSectionNeededAndSeqLenIsCheckedAgainstConfigJson) {
  const std::string root = FreshTempDir("hf_no_model", "llama");
  const std::string dir = root + "/model";
  ASSERT_OK(WriteTinyHfModel(dir, TinyLlama(), /*seed=*/0));
  TrainConfig c = HfConfig(dir);
  c.model = TrainModelConfig{};
  c.model.activation_checkpointing = true;  // as the default model section (1 MiB cap)
  c.steps = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
  ASSERT_OK(trainer->Run());
  // 129 tokens: more than the default GPT's 128 positions would allow, and more than config.json's
  // max_position_embeddings (128): refused naming both.
  c.data.seq_len = 129;
  EXPECT_THAT(Trainer::Create(c, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("data.seq_len"), HasSubstr(dir + "/config.json"),
                             HasSubstr("max_position_embeddings (128)"))));
}

TEST(HfInit, MalformedDirectoriesNameTheFileAndKey) {
  const std::string root = FreshTempDir("hf_malformed", "llama");
  const std::string dir = root + "/model";
  ASSERT_OK(WriteTinyHfModel(dir, TinyLlama(), /*seed=*/0));
  // config.json with an activation the project does not compute.
  std::string json = ReadFile(dir + "/config.json");
  const size_t key = json.find("\"silu\"");
  ASSERT_NE(key, std::string::npos) << json;
  std::string broken = json;
  broken.replace(key, std::string("\"silu\"").size(), "\"relu\"");
  std::ofstream(dir + "/config.json", std::ios::trunc) << broken;
  absl::Status s = Trainer::Create(HfConfig(dir), {}).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnimplemented,
                          AllOf(HasSubstr("checkpoint.init_from"), HasSubstr("config.json"),
                                HasSubstr("hidden_act"))));
  // No weights.
  std::ofstream(dir + "/config.json", std::ios::trunc) << json;
  std::filesystem::remove(dir + "/model.safetensors");
  s = Trainer::Create(HfConfig(dir), {}).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, HasSubstr("checkpoint.init_from")));
}

}  // namespace
}  // namespace ps
