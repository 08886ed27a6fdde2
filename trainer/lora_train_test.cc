// LoRA through the trainer (issue #28): a tiny Llama and a tiny GPT-2 Hugging Face directory
// (written here with the project's writer, over the synthetic corpus's 256 tokens) fine-tuned
// with the lora section on the cpu backend under an accelerator cap that makes chunks move.
// Checked: the loss falls; the frozen base is bit-identical after training and never written
// back (frozen_writeback_bytes); checkpoint.export is a PEFT adapter directory that
// ReadPeftAdapter reads with our values and config; checkpoint.export_merged is a plain Hugging
// Face directory whose loss equals the LoRA model's; checkpoint + resume continues bit for bit
// (with dropout: the masks follow the global micro-batch index); resuming against another base
// or another LoRA config is refused naming both; ValidateLoraConfig's errors name the key; bf16
// with gradient accumulation and dropout trains; the plan brackets the measured peaks and a full
// fine-tune of the same model plans far more host memory.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_type.h"
#include "gtest/gtest.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/lora_config.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "trainer/config.h"
#include "trainer/testing/hf_model_dir.h"
#include "trainer/testing/test_files.h"
#include "trainer/trainer.h"

namespace ps {
namespace {

using ::ps::trainer_testing::FreshTempDir;
using ::ps::trainer_testing::WriteTinyHfModel;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Vocabulary 256 (the synthetic corpus's), hidden 64, 6 layers (model data well above one
// block's activations, so a budget at the plan's minimum evicts base chunks), 4 heads of 16, GQA,
// untied.
ModelConfig TinyLlama() {
  ModelConfig c;
  c.name = "tiny-llama";
  c.family = ModelFamily::kLlama;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_layers = 6;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.max_position_embeddings = 128;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.tie_word_embeddings = false;
  c.hidden_act = HiddenAct::kSilu;
  return c;
}

// GPT2LMHeadModel of the same size (learned positions, LayerNorm, GELU, all biases, tied).
ModelConfig TinyGpt2() {
  ModelConfig c = TinyLlama();
  c.name = "tiny-gpt2";
  c.family = ModelFamily::kGpt2;
  c.num_kv_heads = c.num_heads;
  c.intermediate_size = 4 * c.hidden_size;
  c.qkv_bias = c.o_proj_bias = c.mlp_bias = true;
  c.tie_word_embeddings = true;
  c.hidden_act = HiddenAct::kGeluTanh;
  return c;
}

std::vector<std::string> AttentionTargets(const ModelConfig& model) {
  if (model.family == ModelFamily::kGpt2) return {"c_attn", "c_proj"};
  return {"q_proj", "k_proj", "v_proj", "o_proj"};
}

// Synthetic corpus, micro batch 4 x 32 tokens, chunk size "auto", LoRA r 4 (alpha 8) on the
// attention's linear layers, lr 1e-2 (adapters start with B = 0: a higher rate than a full
// fine-tune's, as usual for LoRA), activation checkpointing and the accelerator at the plan's
// minimum (AtPlanMinimum): below the base's parameters, so base chunks are evicted and reloaded
// every step.
TrainConfig LoraConfigFor(const ModelConfig& model, const std::string& init_from) {
  TrainConfig c = DefaultTrainConfig();
  c.checkpoint = CheckpointConfig{};
  c.checkpoint.init_from = init_from;
  c.data.seq_len = 32;
  c.train_micro_batch_size_per_gpu = 4;
  c.train_batch_size = 0;
  c.steps = 10;
  c.chunk.size_elems = 0;
  c.model.activation_checkpointing = true;
  c.threads = 2;
  c.data.eval_every = 0;
  c.data.eval_batches = 1;
  c.steps_per_print = 100;
  c.profile = ProfileConfig{};
  c.optimizer.lr = 1e-2;
  c.scheduler.total_num_steps = 0;
  c.scheduler.warmup_num_steps = 0;
  LoraSettings lora;
  lora.r = 4;
  lora.lora_alpha = 8;
  lora.target_modules = AttentionTargets(model);
  c.lora = lora;
  return c;
}

// `c` with accelerator.memory at the plan's minimum (as planned at that budget).
absl::StatusOr<TrainConfig> AtPlanMinimum(TrainConfig c) {
  c.accelerator.memory_bytes = 64 * kMiB;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(c, {});
    if (!t.ok()) return t.status();
    const int64_t min_bytes = (*t)->summary().planned_min_accelerator_bytes;
    const int64_t aligned = (min_bytes + 4 * kKiB - 1) / (4 * kKiB) * (4 * kKiB);
    if (aligned == c.accelerator.memory_bytes) break;
    c.accelerator.memory_bytes = aligned;
  }
  return c;
}

bool IsAdapter(const std::string& name) { return absl::StrContains(name, ".lora_"); }

// Every base tensor's stored value (the param slot: a frozen tensor has no master).
std::map<std::string, std::vector<float>> BaseTensors(const GptModel& model) {
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : model.ParameterNames()) {
    if (IsAdapter(name)) continue;
    absl::StatusOr<std::vector<float>> v = model.ReadTensor(ChunkType::kMaster, name);
    EXPECT_OK(v.status());
    if (v.ok()) out[name] = *std::move(v);
  }
  return out;
}

// Trains adapters only: the loss falls from ln(256), the base is bit-identical afterwards and was
// never written back, chunks moved, the counts of trainable and frozen parameters are the
// layout's, and the accelerator stayed within its cap.
TEST(LoraTrain, TrainsAdaptersWhileTheBaseStaysBitIdenticalAndIsNeverWrittenBack) {
  for (const ModelConfig& model : {TinyLlama(), TinyGpt2()}) {
    SCOPED_TRACE(model.name);
    const std::string root = FreshTempDir("lora_train", model.name);
    ASSERT_OK(WriteTinyHfModel(root + "/base", model, /*seed=*/1));
    ASSERT_OK_AND_ASSIGN(const TrainConfig c, AtPlanMinimum(LoraConfigFor(model, root + "/base")));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
    const std::map<std::string, std::vector<float>> before = BaseTensors(trainer->model());
    ASSERT_OK_AND_ASSIGN(const std::string fingerprint, trainer->model().BaseFingerprint());
    ASSERT_OK(trainer->Run());
    const std::vector<StepMetrics>& h = trainer->history();
    ASSERT_EQ(h.size(), 10u);
    EXPECT_NEAR(h.front().loss, std::log(256.0), 0.2);
    EXPECT_LT(h.back().loss, h.front().loss - 0.1) << h.front().loss << " -> " << h.back().loss;
    for (const StepMetrics& m : h) EXPECT_TRUE(std::isfinite(m.loss));

    EXPECT_EQ(BaseTensors(trainer->model()), before);
    EXPECT_THAT(trainer->model().BaseFingerprint(), IsOkAndHolds(fingerprint));
    const TrainSummary& s = trainer->summary();
    EXPECT_EQ(s.frozen_writeback_bytes, 0);
    EXPECT_GT(s.clean_evictions, 0);
    EXPECT_GT(s.loaded_bytes, 0);
    EXPECT_LE(s.accelerator_peak_total_bytes, s.planned_accelerator_bytes);

    LoraConfig lora;
    lora.r = 4;
    lora.lora_alpha = 8;
    lora.target_modules = AttentionTargets(model);
    ASSERT_OK(ValidateLoraConfig(model, lora));
    int64_t adapter_elems = 0;
    for (const TensorSpec& t : PeftAdapterTensors(model, lora)) adapter_elems += t.numel();
    EXPECT_EQ(s.trainable_params, adapter_elems);
    EXPECT_EQ(s.frozen_params, ModelParameterCount(model));
    EXPECT_THAT(trainer->SummaryText(), HasSubstr("frozen base written back: 0 B"));
  }
}

// checkpoint.export is a PEFT adapter directory with our adapters' values, our configuration and
// the base's path; checkpoint.export_merged is a plain Hugging Face directory whose model has the
// LoRA model's loss (within 1e-5 relative): the merged model, and the LoRA model continued from
// the exported adapter (lora.init_from), each take one step at lr 0 on the same first batch.
TEST(LoraTrain, ExportsAPeftAdapterAndAMergedModelWithTheSameLoss) {
  for (const ModelConfig& model : {TinyLlama(), TinyGpt2()}) {
    SCOPED_TRACE(model.name);
    const std::string root = FreshTempDir("lora_export", model.name);
    const std::string base = root + "/base";
    ASSERT_OK(WriteTinyHfModel(base, model, /*seed=*/1));
    TrainConfig c = LoraConfigFor(model, base);
    c.steps = 5;
    c.checkpoint.export_path = root + "/adapter";
    c.checkpoint.export_merged = root + "/merged";
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
    ASSERT_OK(trainer->Run());

    ASSERT_OK_AND_ASSIGN(const PeftAdapter adapter, ReadPeftAdapter(root + "/adapter", model));
    EXPECT_EQ(adapter.lora.r, 4);
    EXPECT_EQ(adapter.lora.lora_alpha, 8);
    EXPECT_EQ(adapter.lora.target_modules, AttentionTargets(model));
    EXPECT_EQ(adapter.base_model_name_or_path, base);
    ASSERT_FALSE(adapter.tensors.empty());
    bool b_trained = false;
    for (const auto& [name, values] : adapter.tensors) {
      EXPECT_THAT(trainer->model().ReadTensor(ChunkType::kMaster, name), IsOkAndHolds(values))
          << name;
      if (absl::StrContains(name, "lora_B")) {
        for (float v : values) b_trained |= v != 0.0f;
      }
    }
    EXPECT_TRUE(b_trained) << "B is still zero: the adapters did not train";

    // One step at lr 0 (warm-up from 0) measures the loss of the first batch.
    TrainConfig lora_again = LoraConfigFor(model, base);
    lora_again.steps = 1;
    lora_again.scheduler.warmup_num_steps = 2;
    lora_again.lora->init_from = root + "/adapter";
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> a, Trainer::Create(lora_again, {}));
    ASSERT_OK(a->Run());
    ASSERT_EQ(a->history().front().lr, 0.0);

    TrainConfig merged = lora_again;
    merged.lora.reset();
    merged.checkpoint.init_from = root + "/merged";
    ASSERT_OK_AND_ASSIGN(const HfCheckpoint m, HfCheckpoint::Open(root + "/merged"));
    EXPECT_EQ(m.config().num_layers, model.num_layers);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> b, Trainer::Create(merged, {}));
    ASSERT_OK(b->Run());
    const double lora_loss = a->history().front().loss;
    const double merged_loss = b->history().front().loss;
    EXPECT_NEAR(merged_loss, lora_loss, 1e-5 * std::abs(lora_loss));
    // Not merely the base's loss: the adapters moved it.
    TrainConfig plain = merged;
    plain.checkpoint.init_from = base;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> p, Trainer::Create(plain, {}));
    ASSERT_OK(p->Run());
    EXPECT_GT(std::abs(p->history().front().loss - lora_loss), 1e-4);
  }
}

// A run checkpointed at step 3 and resumed to step 6 gives the losses of an uninterrupted run
// bit for bit — with dropout on the adapters' input, whose masks follow the global micro-batch
// index — and ends with the same adapters.
TEST(LoraTrain, ResumeContinuesBitForBitWithDropout) {
  const ModelConfig model = TinyLlama();
  const std::string root = FreshTempDir("lora_resume", model.name);
  const std::string base = root + "/base";
  ASSERT_OK(WriteTinyHfModel(base, model, /*seed=*/1));
  TrainConfig c = LoraConfigFor(model, base);
  c.steps = 6;
  c.lora->lora_dropout = 0.1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> whole, Trainer::Create(c, {}));
  ASSERT_OK(whole->Run());

  TrainConfig first = c;
  first.steps = 3;
  first.checkpoint.dir = root + "/ckpt";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t1, Trainer::Create(first, {}));
  ASSERT_OK(t1->Run());
  TrainConfig second = c;
  second.checkpoint.dir = root + "/ckpt";
  second.checkpoint.resume = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t2, Trainer::Create(second, {}));
  ASSERT_OK(t2->Run());

  std::vector<double> want, got;
  for (const StepMetrics& m : whole->history()) want.push_back(m.loss);
  for (const StepMetrics& m : t1->history()) got.push_back(m.loss);
  for (const StepMetrics& m : t2->history()) got.push_back(m.loss);
  EXPECT_EQ(got, want);
  for (const std::string& name : whole->model().ParameterNames()) {
    if (!IsAdapter(name)) continue;
    ASSERT_OK_AND_ASSIGN(const std::vector<float> w,
                         whole->model().ReadTensor(ChunkType::kMaster, name));
    EXPECT_THAT(t2->model().ReadTensor(ChunkType::kMaster, name), IsOkAndHolds(w)) << name;
  }
  // Dropout matters: without it the losses differ.
  TrainConfig no_dropout = c;
  no_dropout.lora->lora_dropout = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> nd, Trainer::Create(no_dropout, {}));
  ASSERT_OK(nd->Run());
  EXPECT_NE(nd->history().back().loss, whole->history().back().loss);
}

// Resuming a LoRA checkpoint over another base is refused naming both fingerprints and both
// init_from paths; over another LoRA configuration, naming the key.
TEST(LoraTrain, ResumeRefusesAnotherBaseOrAnotherLoraConfig) {
  const ModelConfig model = TinyLlama();
  const std::string root = FreshTempDir("lora_resume_refused", model.name);
  ASSERT_OK(WriteTinyHfModel(root + "/base", model, /*seed=*/1));
  ASSERT_OK(WriteTinyHfModel(root + "/other", model, /*seed=*/2));
  TrainConfig c = LoraConfigFor(model, root + "/base");
  c.steps = 1;
  c.checkpoint.dir = root + "/ckpt";
  std::string fingerprint;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Trainer::Create(c, {}));
    ASSERT_OK_AND_ASSIGN(fingerprint, t->model().BaseFingerprint());
    ASSERT_OK(t->Run());
  }
  TrainConfig other = c;
  other.checkpoint.init_from = root + "/other";
  other.checkpoint.resume = true;
  other.steps = 2;
  std::string other_fingerprint;
  {
    TrainConfig probe = other;
    probe.checkpoint.resume = false;
    probe.checkpoint.dir = root + "/ckpt_other";
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Trainer::Create(probe, {}));
    ASSERT_OK_AND_ASSIGN(other_fingerprint, t->model().BaseFingerprint());
  }
  ASSERT_NE(fingerprint, other_fingerprint);
  EXPECT_THAT(Trainer::Create(other, {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(fingerprint), HasSubstr(other_fingerprint),
                             HasSubstr(root + "/base"), HasSubstr(root + "/other"))));

  TrainConfig rank8 = c;
  rank8.lora->r = 8;
  rank8.checkpoint.resume = true;
  rank8.steps = 2;
  EXPECT_THAT(Trainer::Create(rank8, {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("lora.r 4 (this run: 8)")));

  // The same base from another path resumes (the fingerprint is the weights', not the path's).
  ASSERT_OK(WriteTinyHfModel(root + "/copy", model, /*seed=*/1));
  TrainConfig copy = c;
  copy.checkpoint.init_from = root + "/copy";
  copy.checkpoint.resume = true;
  copy.steps = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> t, Trainer::Create(copy, {}));
  ASSERT_OK(t->Run());
  EXPECT_EQ(t->history().size(), 1u);
}

// ValidateLoraConfig's errors reach the user naming the key: an unknown module (listing the
// model's), a rank above a targeted layer's dimensions; and the LoRA exports under ZeRO are
// refused before training.
TEST(LoraTrain, BadLoraConfigsAreRefusedNamingTheKey) {
  const ModelConfig model = TinyLlama();
  const std::string root = FreshTempDir("lora_errors", model.name);
  ASSERT_OK(WriteTinyHfModel(root + "/base", model, /*seed=*/1));
  TrainConfig unknown = LoraConfigFor(model, root + "/base");
  unknown.lora->target_modules = {"q_proj", "query"};
  EXPECT_THAT(Trainer::Create(unknown, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("lora.target_modules"), HasSubstr("'query'"),
                             HasSubstr("q_proj, k_proj, v_proj, o_proj"))));
  TrainConfig too_big = LoraConfigFor(model, root + "/base");
  too_big.lora->r = 65;  // above hidden 64
  EXPECT_THAT(Trainer::Create(too_big, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora.r")));
  TrainConfig gpt2_names = LoraConfigFor(model, root + "/base");
  gpt2_names.lora->target_modules = {"c_attn"};
  EXPECT_THAT(Trainer::Create(gpt2_names, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora.target_modules")));
}

// bf16 with two micro-batches per step and dropout: trains, finite, the base untouched.
TEST(LoraTrain, Bf16WithGradientAccumulationAndDropoutTrains) {
  const ModelConfig model = TinyLlama();
  const std::string root = FreshTempDir("lora_bf16", model.name);
  ASSERT_OK(WriteTinyHfModel(root + "/base", model, /*seed=*/1));
  TrainConfig c = LoraConfigFor(model, root + "/base");
  c.bf16 = true;
  c.gradient_accumulation_steps = 2;
  c.train_micro_batch_size_per_gpu = 2;
  c.lora->lora_dropout = 0.05;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, {}));
  const std::map<std::string, std::vector<float>> before = BaseTensors(trainer->model());
  ASSERT_OK(trainer->Run());
  const std::vector<StepMetrics>& h = trainer->history();
  ASSERT_EQ(h.size(), 10u);
  for (const StepMetrics& m : h) EXPECT_TRUE(std::isfinite(m.loss));
  EXPECT_LT(h.back().loss, h.front().loss - 0.1) << h.front().loss << " -> " << h.back().loss;
  EXPECT_EQ(BaseTensors(trainer->model()), before);
  EXPECT_EQ(trainer->summary().frozen_writeback_bytes, 0);
}

// The pre-flight plan brackets what the run measured (accelerator peak, host chunk blocks), and a
// full fine-tune of the same model and shape plans several times the LoRA run's host model data:
// the frozen bf16 base holds 2 bytes per parameter, a trained parameter 14 (param, master,
// momentum, variance).
TEST(LoraTrain, PlanBracketsTheMeasuredPeaksAndIsFarBelowAFullFineTune) {
  const ModelConfig model = TinyLlama();
  const std::string root = FreshTempDir("lora_plan", model.name);
  ASSERT_OK(WriteTinyHfModel(root + "/base", model, /*seed=*/1));
  TrainConfig c = LoraConfigFor(model, root + "/base");
  c.bf16 = true;
  c.steps = 3;
  ASSERT_OK_AND_ASSIGN(c, AtPlanMinimum(c));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> lora, Trainer::Create(c, {}));
  ASSERT_OK(lora->Run());
  const TrainSummary& s = lora->summary();
  // Measured on this tiny Llama: the accelerator peak 0.978 of the predicted peak, the host's
  // model data exactly the plan's; the bounds leave room for a scheduling difference, not for a
  // plan that is off by more than a few percent.
  EXPECT_LE(s.accelerator_peak_total_bytes, s.planned_accelerator_bytes);
  EXPECT_GE(s.accelerator_peak_total_bytes, 0.95 * s.planned_accelerator_peak_bytes)
      << "planned peak " << s.planned_accelerator_peak_bytes;
  EXPECT_LE(s.host_peak_model_bytes, s.planned_host_model_data_bytes);
  EXPECT_GE(s.host_peak_model_bytes, 0.99 * s.planned_host_model_data_bytes)
      << "planned host model data " << s.planned_host_model_data_bytes;
  // The base's 2 B/param are most of the LoRA run's host model data.
  EXPECT_GE(s.planned_host_model_data_bytes, 2 * ModelParameterCount(model));

  TrainConfig full = c;
  full.lora.reset();
  full.accelerator.memory_bytes = 64 * kMiB;  // the plans are compared, the full run never runs
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> f, Trainer::Create(full, {}));
  EXPECT_GT(f->summary().planned_host_model_data_bytes, 4 * s.planned_host_model_data_bytes)
      << "full " << f->summary().planned_host_model_data_bytes << " vs LoRA "
      << s.planned_host_model_data_bytes;
}

}  // namespace
}  // namespace ps
