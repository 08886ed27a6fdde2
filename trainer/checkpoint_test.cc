// Tests for trainer/checkpoint.h on a small GptModel (no trainer): the round trip, and every way a
// checkpoint directory can hold something other than exactly this model's finite training state
// — extra, missing, reshaped or re-typed tensors, Inf/NaN values, foreign files, manifest values of
// the wrong type or range — each refused with DataLoss naming what is wrong, before the model is
// touched; and a diverged (non-finite) state is never written.
#include "trainer/checkpoint.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "chunk/chunk_type.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/lora_config.h"
#include "model/quant4_config.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "trainer/io/checkpoint_dir.h"
#include "trainer/testing/model_rig.h"
#include "trainer/testing/test_files.h"

namespace ps {
namespace {

using ::ps::trainer_testing::MakeModelRig;
using ::ps::trainer_testing::ModelRig;
using ::ps::trainer_testing::ReadFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

GptConfig SmallConfig() {
  return GptConfig{.name = "small",
                   .vocab_size = 64,
                   .max_seq_len = 16,
                   .hidden = 32,
                   .num_layers = 2,
                   .num_heads = 4};
}
constexpr int64_t kChunkElems = 5120;

CheckpointIdentity Identity(const GptConfig& c) {
  CheckpointIdentity id;
  id.vocab_size = c.vocab_size;
  id.max_seq_len = c.max_seq_len;
  id.hidden = c.hidden;
  id.num_layers = c.num_layers;
  id.num_heads = c.num_heads;
  id.micro_batch = 2;
  id.seq_len = 16;
  return id;
}

TrainingCheckpointState State(int64_t step) {
  TrainingCheckpointState s;
  s.step = step;
  s.adam_step = step - 1;
  s.loss_scaler.iteration = step;
  s.data_cursor = {.epoch = 0, .batch_in_epoch = step};
  s.last_loss = 3.5;
  s.consecutive_skipped_steps = 1;
  s.identity = Identity(SmallConfig());
  s.config_json = "{}";
  return s;
}

std::unique_ptr<ModelRig> Rig(uint64_t seed) {
  absl::StatusOr<std::unique_ptr<ModelRig>> rig =
      MakeModelRig(SmallConfig(), DType::kF32, kChunkElems, seed);
  EXPECT_OK(rig.status());
  return rig.ok() ? *std::move(rig) : nullptr;
}

// Every file under `root`, path -> bytes.
std::map<std::string, std::string> Snapshot(const std::string& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    files[e.path().string()] = e.is_regular_file() ? ReadFile(e.path().string()) : "<dir>";
  }
  return files;
}

std::vector<float> Tensor(const GptModel& model, ChunkType type, const std::string& name) {
  absl::StatusOr<std::vector<float>> v = model.ReadTensor(type, name);
  EXPECT_OK(v.status());
  return v.ok() ? *v : std::vector<float>{};
}

TEST(TrainingCheckpoint, RoundTripsTheStateExactly) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "roundtrip");
  std::unique_ptr<ModelRig> a = Rig(1);
  std::unique_ptr<ModelRig> b = Rig(2);
  ASSERT_OK_AND_ASSIGN(const std::string dir,
                       WriteTrainingCheckpoint(root, 2, State(5), *a->model));
  ASSERT_OK_AND_ASSIGN(const TrainingCheckpointState s,
                       ReadTrainingCheckpoint(dir, Identity(SmallConfig()), b->model.get()));
  EXPECT_EQ(s.step, 5);
  EXPECT_EQ(s.adam_step, 4);
  EXPECT_EQ(s.consecutive_skipped_steps, 1);
  EXPECT_EQ(s.data_cursor.batch_in_epoch, 5);
  for (const std::string& name : a->model->ParameterNames()) {
    for (ChunkType type : {ChunkType::kMaster, ChunkType::kMomentum, ChunkType::kVariance}) {
      EXPECT_EQ(Tensor(*a->model, type, name), Tensor(*b->model, type, name)) << name;
    }
  }
  // The last step was a skipped fp16 step whose loss is NaN (JSON null): still resumable.
  TrainingCheckpointState skipped = State(6);
  skipped.last_loss = std::nan("");
  ASSERT_OK_AND_ASSIGN(const std::string dir6,
                       WriteTrainingCheckpoint(root, 2, skipped, *a->model));
  ASSERT_OK_AND_ASSIGN(const TrainingCheckpointState s6,
                       ReadTrainingCheckpoint(dir6, Identity(SmallConfig()), b->model.get()));
  EXPECT_TRUE(std::isnan(s6.last_loss));
}

// A master weight that became NaN: the write is refused naming it, nothing is committed, the
// temporary directory is gone and the earlier checkpoint is byte for byte what it was.
TEST(TrainingCheckpoint, NeverWritesANonFiniteState) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "nonfinite_write");
  std::unique_ptr<ModelRig> rig = Rig(1);
  ASSERT_OK(WriteTrainingCheckpoint(root, 2, State(1), *rig->model).status());
  const std::map<std::string, std::string> before = Snapshot(root);
  for (const ChunkType bad_type : {ChunkType::kMaster, ChunkType::kVariance}) {
    SCOPED_TRACE(ChunkTypeName(bad_type));
    ASSERT_OK(rig->model->LoadTrainingState(
        [&](absl::string_view name, ChunkType type, absl::Span<float> out) -> absl::Status {
          for (float& x : out) x = 0.25f;
          if (name == "h.1.mlp.c_fc.weight" && type == bad_type) out[2 * 128 + 7] = NAN;
          return absl::OkStatus();
        }));
    EXPECT_THAT(WriteTrainingCheckpoint(root, 2, State(2), *rig->model),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr(absl::StrCat(ChunkTypeName(bad_type),
                                                      "/h.1.mlp.c_fc.weight holds NaN at [2, 7]")),
                               HasSubstr("Nothing was written"))));
    EXPECT_EQ(Snapshot(root), before);
  }
}

// The tensors of the state file, transformed by `edit`, written as a new checkpoint of step
// `step` under `root` with the original manifest's state (so the checksums are right and only the
// contents differ).
using TensorEdit = std::function<void(std::vector<SafetensorsTensorSpec>& specs,
                                      std::vector<std::vector<uint8_t>>& bytes)>;
std::string Rewrite(const std::string& valid_dir, const std::string& root, int64_t step,
                    const TensorEdit& edit, const std::string& extra_file = "") {
  absl::StatusOr<Checkpoint> ckpt = OpenCheckpoint(valid_dir);
  EXPECT_OK(ckpt.status());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(valid_dir + "/state.safetensors");
  EXPECT_OK(file.status());
  std::vector<SafetensorsTensorSpec> specs;
  std::vector<std::vector<uint8_t>> bytes;
  for (const SafetensorsTensorInfo& t : file->tensors()) {
    specs.push_back({t.name, *t.dtype, t.shape});
    const absl::Span<const uint8_t> b = file->Bytes(t);
    bytes.emplace_back(b.begin(), b.end());
  }
  edit(specs, bytes);
  absl::StatusOr<CheckpointWriter> writer = CheckpointWriter::Begin(root, step);
  EXPECT_OK(writer.status());
  std::vector<SafetensorsTensorData> data;
  for (size_t i = 0; i < specs.size(); ++i) {
    data.push_back({specs[i], absl::MakeConstSpan(bytes[i])});
  }
  EXPECT_OK(WriteSafetensors(writer->FilePath("state.safetensors"), data, {}));
  EXPECT_OK(writer->AddFile("state.safetensors"));
  if (!extra_file.empty()) {
    EXPECT_OK(writer->WriteFile(extra_file, "x"));
  }
  absl::StatusOr<std::string> dir = writer->Commit(ckpt->state);
  EXPECT_OK(dir.status());
  return dir.ok() ? *dir : "";
}

size_t IndexOf(const std::vector<SafetensorsTensorSpec>& specs, const std::string& name) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) return i;
  }
  ADD_FAILURE() << "no tensor " << name;
  return 0;
}

TEST(TrainingCheckpoint, RefusesAnythingButExactlyTheModelsFiniteTensors) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "exact");
  std::unique_ptr<ModelRig> source = Rig(1);
  ASSERT_OK_AND_ASSIGN(const std::string valid,
                       WriteTrainingCheckpoint(root + "/valid", 2, State(3), *source->model));
  std::unique_ptr<ModelRig> target = Rig(7);
  const std::vector<float> untouched = Tensor(*target->model, ChunkType::kMaster, "wte.weight");
  int64_t step = 10;
  const auto refused = [&](const std::string& dir, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_THAT(ReadTrainingCheckpoint(dir, Identity(SmallConfig()), target->model.get()),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(dir), HasSubstr(what))));
    EXPECT_EQ(Tensor(*target->model, ChunkType::kMaster, "wte.weight"), untouched)
        << "the model was touched";
  };

  // The rewrite itself changes nothing: the copy loads.
  ASSERT_OK(ReadTrainingCheckpoint(Rewrite(valid, root, ++step, [](auto&, auto&) {}),
                                   Identity(SmallConfig()), Rig(3)->model.get())
                .status());

  refused(Rewrite(valid, root, ++step,
                  [](auto& specs, auto& bytes) {
                    specs.push_back({"master/h.9.attn.c_attn.weight", DType::kF32, {2}});
                    bytes.push_back(std::vector<uint8_t>(8, 0));
                  }),
          "holds tensor 'master/h.9.attn.c_attn.weight', which is not part of");
  refused(Rewrite(valid, root, ++step,
                  [](auto& specs, auto& bytes) {
                    const size_t i = IndexOf(specs, "momentum/h.0.ln_2.bias");
                    specs.erase(specs.begin() + i);
                    bytes.erase(bytes.begin() + i);
                  }),
          "has no f32 tensor 'momentum/h.0.ln_2.bias' of shape [32]");
  // Same number of elements, another shape (a transposed Conv1D weight).
  refused(Rewrite(valid, root, ++step,
                  [](auto& specs, auto&) {
                    specs[IndexOf(specs, "master/h.1.mlp.c_fc.weight")].shape = {128, 32};
                  }),
          "has no f32 tensor 'master/h.1.mlp.c_fc.weight' of shape [32, 128]");
  refused(Rewrite(valid, root, ++step,
                  [](auto& specs, auto& bytes) {
                    const size_t i = IndexOf(specs, "variance/ln_f.weight");
                    specs[i].dtype = DType::kBF16;
                    bytes[i].resize(bytes[i].size() / 2);
                  }),
          "has no f32 tensor 'variance/ln_f.weight'");
  refused(Rewrite(valid, root, ++step,
                  [](auto& specs, auto& bytes) {
                    const float inf = -INFINITY;
                    std::memcpy(bytes[IndexOf(specs, "variance/h.0.attn.c_proj.weight")].data() +
                                    4 * (3 * 32 + 4),
                                &inf, 4);
                  }),
          "tensor 'variance/h.0.attn.c_proj.weight' holds -Inf at [3, 4]");
  refused(Rewrite(
              valid, root, ++step, [](auto&, auto&) {}, "rng.bin"),
          "lists file 'rng.bin'");
}

// The manifest is not checksummed: each value is checked for type and range.
TEST(TrainingCheckpoint, RefusesManifestValuesOfTheWrongTypeOrRange) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "manifest");
  std::unique_ptr<ModelRig> rig = Rig(1);
  ASSERT_OK_AND_ASSIGN(const std::string dir,
                       WriteTrainingCheckpoint(root, 2, State(4), *rig->model));
  const std::string manifest_path = dir + "/manifest.json";
  const nlohmann::json original = nlohmann::json::parse(ReadFile(manifest_path));
  const auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    SCOPED_TRACE(what);
    nlohmann::json m = original;
    edit(m["state"]);
    std::ofstream(manifest_path, std::ios::trunc) << m.dump();
    EXPECT_THAT(ReadTrainingCheckpoint(dir, Identity(SmallConfig()), rig->model.get()),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(what)));
  };
  with([](nlohmann::json& s) { s["step"] = -1; }, "impossible counters");
  with([](nlohmann::json& s) { s["adam_step"] = 9; }, "impossible counters");
  with([](nlohmann::json& s) { s["step"] = 1.5; }, "\"step\" = 1.5 is not an integer");
  with([](nlohmann::json& s) { s["loss_scaler"]["hysteresis_left"] = int64_t{1} << 32; },
       "\"hysteresis_left\" = 4294967296 is not an integer");
  with([](nlohmann::json& s) { s["identity"]["data_seed"] = -1; },
       "\"data_seed\" = -1 is not an integer");
  with([](nlohmann::json& s) { s["step"] = "4"; }, "\"step\" = \"4\" is not an integer");
  with([](nlohmann::json& s) { s["consecutive_skipped_steps"] = 5; }, "impossible counters");
  // Written before the key existed: 0.
  nlohmann::json old = original;
  old["state"].erase("consecutive_skipped_steps");
  std::ofstream(manifest_path, std::ios::trunc) << old.dump();
  ASSERT_OK_AND_ASSIGN(const TrainingCheckpointState s,
                       ReadTrainingCheckpoint(dir, Identity(SmallConfig()), rig->model.get()));
  EXPECT_EQ(s.consecutive_skipped_steps, 0);
}

// A 4-bit base's checkpoint records the quantization section: resuming with another one, or a
// 16-bit run from a 4-bit checkpoint (and the reverse), is refused naming the key before the model
// is touched, as for the lora section; the same section loads.
TEST(TrainingCheckpoint, RefusesAnotherQuantizationSectionNamingTheKey) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "quant4_identity");
  std::unique_ptr<ModelRig> rig = Rig(1);
  std::unique_ptr<ModelRig> other = Rig(2);
  Quant4Config nf4;
  nf4.quant_type = Quant4Type::kNf4;
  nf4.double_quant = true;
  nf4.skip_modules = {"lm_head"};
  TrainingCheckpointState state = State(3);
  state.identity.quant4 = nf4;
  ASSERT_OK_AND_ASSIGN(const std::string dir,
                       WriteTrainingCheckpoint(root, 2, state, *rig->model));
  const nlohmann::json manifest = nlohmann::json::parse(ReadFile(dir + "/manifest.json"));
  EXPECT_EQ(manifest["state"]["identity"]["quantization"],
            nlohmann::json::parse(R"({"load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "float32",
                "llm_int8_skip_modules": ["lm_head"]})"));
  const std::vector<float> before = Tensor(*other->model, ChunkType::kMaster, "wte.weight");
  const auto read_as = [&](const std::optional<Quant4Config>& quant4) {
    CheckpointIdentity expected = Identity(SmallConfig());
    expected.quant4 = quant4;
    return ReadTrainingCheckpoint(dir, expected, other->model.get());
  };
  Quant4Config fp4 = nf4;
  fp4.quant_type = Quant4Type::kFp4;
  EXPECT_THAT(read_as(fp4).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("belongs to another run"),
                             HasSubstr("quantization.bnb_4bit_quant_type \"nf4\" (this run: "
                                       "\"fp4\")"))));
  Quant4Config plain = nf4;
  plain.double_quant = false;
  plain.skip_modules = {};
  EXPECT_THAT(read_as(plain).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("quantization.bnb_4bit_use_double_quant true (this run: "
                                       "false)"),
                             HasSubstr("quantization.llm_int8_skip_modules [\"lm_head\"] (this "
                                       "run: [])"))));
  EXPECT_THAT(read_as(std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the quantization section {")));
  EXPECT_THAT(read_as(std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("(this run: none)")));
  EXPECT_EQ(Tensor(*other->model, ChunkType::kMaster, "wte.weight"), before)
      << "a refused checkpoint touched the model";
  ASSERT_OK_AND_ASSIGN(const TrainingCheckpointState same, read_as(nf4));
  ASSERT_TRUE(same.identity.quant4.has_value());
  EXPECT_EQ(*same.identity.quant4, nf4);

  // A 16-bit checkpoint resumed by a 4-bit run.
  ASSERT_OK_AND_ASSIGN(const std::string plain_dir,
                       WriteTrainingCheckpoint(root, 2, State(4), *rig->model));
  CheckpointIdentity four_bit = Identity(SmallConfig());
  four_bit.quant4 = nf4;
  EXPECT_THAT(ReadTrainingCheckpoint(plain_dir, four_bit, other->model.get()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("the quantization section none (this run: {"),
                             HasSubstr("\"bnb_4bit_quant_type\":\"nf4\""))));
}

// A LoRA checkpoint over a 4-bit base: another quantization also changes the base's fingerprint
// (the dequantized values differ); the refusal names the quantization key, not "another base".
TEST(TrainingCheckpoint, AnotherQuantizationIsNamedBeforeTheBaseFingerprint) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "quant4_fingerprint");
  std::unique_ptr<ModelRig> rig = Rig(1);
  LoraConfig lora;
  lora.r = 2;
  lora.target_modules = {"c_attn"};
  Quant4Config nf4;
  nf4.quant_type = Quant4Type::kNf4;
  TrainingCheckpointState state = State(3);
  state.identity.lora = lora;
  state.identity.quant4 = nf4;
  state.identity.base_fingerprint = "aaaa";
  state.identity.base_source = "seed 0";
  ASSERT_OK_AND_ASSIGN(const std::string dir,
                       WriteTrainingCheckpoint(root, 2, state, *rig->model));
  CheckpointIdentity expected = state.identity;
  expected.quant4 = Quant4Config{};  // fp4
  expected.base_fingerprint = "bbbb";
  const absl::Status refused = ReadTrainingCheckpoint(dir, expected, rig->model.get()).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("quantization.bnb_4bit_quant_type \"nf4\" (this run: "
                                          "\"fp4\")")));
  EXPECT_THAT(refused.message(), ::testing::Not(HasSubstr("another base model")));
  // The same quantization over another base: the base is named.
  expected.quant4 = nf4;
  EXPECT_THAT(ReadTrainingCheckpoint(dir, expected, rig->model.get()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another base model")));
}

// A damaged quantization identity is DataLoss naming it, like every other manifest value.
TEST(TrainingCheckpoint, RefusesADamagedQuantizationIdentity) {
  const std::string root = trainer_testing::FreshTempDir("checkpoint_test", "quant4_damaged");
  std::unique_ptr<ModelRig> rig = Rig(1);
  TrainingCheckpointState state = State(2);
  state.identity.quant4 = Quant4Config{};
  ASSERT_OK_AND_ASSIGN(const std::string dir,
                       WriteTrainingCheckpoint(root, 2, state, *rig->model));
  const std::string manifest_path = dir + "/manifest.json";
  const nlohmann::json original = nlohmann::json::parse(ReadFile(manifest_path));
  CheckpointIdentity expected = Identity(SmallConfig());
  expected.quant4 = Quant4Config{};
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"bnb_4bit_quant_type", "int4"},
           {"bnb_4bit_compute_dtype", "f32"},
           {"load_in_4bit", false},
           {"llm_int8_skip_modules", nlohmann::json::array({1})},
           {"bnb_4bit_use_double_quant", "no"}}) {
    SCOPED_TRACE(key);
    nlohmann::json m = original;
    m["state"]["identity"]["quantization"][key] = value;
    std::ofstream(manifest_path, std::ios::trunc) << m.dump();
    EXPECT_THAT(ReadTrainingCheckpoint(dir, expected, rig->model.get()),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(key)));
  }
  nlohmann::json m = original;
  m["state"]["identity"]["quantization"] = 4;
  std::ofstream(manifest_path, std::ios::trunc) << m.dump();
  EXPECT_THAT(ReadTrainingCheckpoint(dir, expected, rig->model.get()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad quantization identity")));
}

}  // namespace
}  // namespace ps
