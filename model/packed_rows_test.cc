// Packed rows through the chunked model (model/gpt_model.h ModelInputs: positions and key_start,
// issue #36): a row that packs several examples gives every example the loss and the parameter
// gradients it gets alone in a row of its own (positions 0.., plain causal attention, padding
// after it, no positions or key_start given) — for a Llama (RoPE with llama3 scaling, GQA, untied
// head), a Qwen2 (RoPE, q/k/v biases, tied embeddings, one kv head) and a GPT-2 (learned
// positions, tied), with and without activation checkpointing (the recompute passes the same
// positions and key_start). And the whole packed batch's loss and gradients are the trained-target
// weighted means of the examples'. The f32 bound: losses within 1e-6 relative, every gradient
// element within 2e-6 of its tensor's largest magnitude (the packed and the alone run add the same
// terms, in another order where a GEMM or the attention sums over rows or keys, and the packed
// attention skips key tiles). RoPE scores depend on relative positions only, so for the Llama and
// Qwen2 rows it is key_start that the comparison holds (dropping it fails the test by O(1));
// GPT-2's learned positions hold the positions too (dropping them fails it likewise); the RoPE
// kernels' positions are model/kernels' conformance tests'. Also: the activation profile counts the 8 bytes per token of
// positions and key_start (measured tide == replayed profile, moment by moment), and the host
// checks of positions and key_start.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/chunk_store.h"
#include "chunk/chunk_type.h"
#include "gtest/gtest.h"
#include "memory/cpu_backend.h"
#include "memory/device_memory.h"
#include "memory/dtype.h"
#include "model/gpt_activation_profile.h"
#include "model/gpt_config.h"
#include "model/gpt_model.h"
#include "model/hf_checkpoint.h"
#include "model/model_config.h"
#include "scheduler/chunk_manager.h"
#include "scheduler/memory_plan.h"
#include "scheduler/tide_trace.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBatch = 2, kSeqLen = 24, kVocab = 96;
constexpr int64_t kChunkElems = 8192;
constexpr int32_t kIgnore = GptModel::kIgnoreIndex;

ModelConfig Llama() {
  ModelConfig c;
  c.name = "tiny-llama";
  c.family = ModelFamily::kLlama;
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 56;
  c.max_position_embeddings = 128;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 128};
  c.tie_word_embeddings = false;
  c.hidden_act = HiddenAct::kSilu;
  return c;
}

ModelConfig Qwen2() {
  ModelConfig c;
  c.name = "tiny-qwen2";
  c.family = ModelFamily::kQwen2;
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.intermediate_size = 64;
  c.max_position_embeddings = 128;
  c.norm_eps = 1e-6;
  c.rope_theta = 1000000;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.hidden_act = HiddenAct::kSilu;
  return c;
}

ModelConfig Gpt2() {
  GptConfig g;
  g.name = "tiny-gpt2";
  g.vocab_size = kVocab;
  g.max_seq_len = 32;
  g.hidden = 32;
  g.num_layers = 2;
  g.num_heads = 4;
  return FromGptConfig(g);
}

GptModelOptions ModelOptions(bool checkpointing) {
  return {.batch = kBatch,
          .seq_len = kSeqLen,
          .activation_checkpointing = checkpointing,
          .threads = 2,
          .attention_tile = 5,
          .ce_row_tile = 7,
          .ce_vocab_tile = 24,
          .token_metadata = true};
}

struct Rig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemory> accelerator;
  std::unique_ptr<DeviceMemory> host;
  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<ChunkManager> manager;
  std::unique_ptr<GptModel> model;
};

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(const ModelConfig& config,
                                             const GptModelOptions& options) {
  auto rig = std::make_unique<Rig>();
  ASSIGN_OR_RETURN(rig->backend, CreateCpuBackend({.capacity_bytes = 64 * kMiB}));
  DeviceMemoryOptions memory_options;
  memory_options.chunk_block_bytes = kChunkElems * 4;
  ASSIGN_OR_RETURN(rig->accelerator, CreateAcceleratorMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(rig->host, CreateHostMemory(rig->backend.get(), memory_options));
  ASSIGN_OR_RETURN(ChunkLayout layout, ChunkLayout::Build({.capacity_elems = kChunkElems},
                                                          ModelOperators(config, {})));
  ASSIGN_OR_RETURN(rig->store, ChunkStore::Create(std::move(layout), {.compute_dtype = DType::kF32}));
  ASSIGN_OR_RETURN(rig->manager, ChunkManager::Create(rig->store.get(), rig->backend.get(),
                                                      rig->accelerator.get(), rig->host.get(), {}));
  ASSIGN_OR_RETURN(rig->model, GptModel::Create(config, rig->store.get(), rig->manager.get(),
                                                rig->accelerator.get(), options));
  return rig;
}

std::vector<std::string> HfNames(const ModelConfig& config) {
  std::vector<std::string> names;
  for (const TensorSpec& t : HfParameterSpecs(config)) names.push_back(t.name);
  return names;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // HfNames order
};

// One ForwardBackward of `in`; the parameters are then re-initialized (seed 7) for the next.
absl::StatusOr<Result> Step(Rig& rig, const ModelInputs& in) {
  Result r;
  RETURN_IF_ERROR(rig.manager->BeginIteration());
  ASSIGN_OR_RETURN(r.loss, rig.model->ForwardBackward(in));
  for (const std::string& name : HfNames(rig.model->model_config())) {
    ASSIGN_OR_RETURN(std::vector<float> g, rig.model->ReadTensor(ChunkType::kParam, name));
    r.grads.push_back(std::move(g));
  }
  RETURN_IF_ERROR(rig.manager->EndIteration());
  RETURN_IF_ERROR(rig.model->InitializeParameters(7));
  return r;
}

// One example: its tokens, and which of them are trained targets (trained[0] is always false).
struct Example {
  std::vector<int32_t> tokens;
  std::vector<bool> trained;
};

// A batch of rows, each a list of examples placed back to back from column 0, then padding (token
// 0, position counting from 0 at the padding's start, its own key_start). Targets: the example's
// next token where that token is trained and `scored(example index)`, else ignored; never across
// an example's end.
struct Batch {
  std::vector<int32_t> tokens, targets, positions, key_start;
  ModelInputs inputs(bool metadata) const {
    return {.tokens = tokens,
            .targets = targets,
            .positions = metadata ? absl::MakeConstSpan(positions) : absl::Span<const int32_t>(),
            .key_start = metadata ? absl::MakeConstSpan(key_start) : absl::Span<const int32_t>()};
  }
};

Batch Pack(const std::vector<Example>& examples, const std::vector<std::vector<int>>& rows,
           const std::function<bool(int)>& scored) {
  Batch b;
  const size_t n = static_cast<size_t>(kBatch * kSeqLen);
  b.tokens.assign(n, 0);
  b.targets.assign(n, kIgnore);
  b.positions.assign(n, 0);
  b.key_start.assign(n, 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t col = 0;
    const int64_t base = static_cast<int64_t>(r) * kSeqLen;
    for (int e : rows[r]) {
      const Example& ex = examples[static_cast<size_t>(e)];
      const int64_t len = static_cast<int64_t>(ex.tokens.size());
      for (int64_t i = 0; i < len; ++i) {
        const size_t p = static_cast<size_t>(base + col + i);
        b.tokens[p] = ex.tokens[static_cast<size_t>(i)];
        b.positions[p] = static_cast<int32_t>(i);
        b.key_start[p] = static_cast<int32_t>(col);
        if (i + 1 < len && ex.trained[static_cast<size_t>(i + 1)] && scored(e)) {
          b.targets[p] = ex.tokens[static_cast<size_t>(i + 1)];
        }
      }
      col += len;
    }
    for (int64_t c = col; c < kSeqLen; ++c) {
      const size_t p = static_cast<size_t>(base + c);
      b.positions[p] = static_cast<int32_t>(c - col);
      b.key_start[p] = static_cast<int32_t>(col);
    }
  }
  return b;
}

int64_t Trained(const Batch& b) {
  return std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t != kIgnore; });
}

// Worst |a - b| over each tensor relative to the tensor's largest |b|, the worst tensor's value.
double WorstGradError(const Result& got, const std::vector<std::vector<double>>& expected,
                      const std::vector<std::string>& names, std::string* where) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    double scale = 0, err = 0;
    for (size_t j = 0; j < expected[i].size(); ++j) {
      scale = std::max(scale, std::abs(expected[i][j]));
      err = std::max(err, std::abs(expected[i][j] - static_cast<double>(got.grads[i][j])));
    }
    const double rel = scale > 0 ? err / scale : err;
    if (rel > worst) {
      worst = rel;
      *where = names[i];
    }
  }
  return worst;
}

std::vector<std::vector<double>> ToDouble(const Result& r, double weight = 1.0) {
  std::vector<std::vector<double>> out;
  for (const std::vector<float>& g : r.grads) {
    std::vector<double> d(g.size());
    for (size_t j = 0; j < g.size(); ++j) d[j] = weight * static_cast<double>(g[j]);
    out.push_back(std::move(d));
  }
  return out;
}

class PackedRowsTest : public ::testing::TestWithParam<bool> {};

TEST_P(PackedRowsTest, EachExampleAsIfAloneAndTheBatchIsTheirTargetWeightedMean) {
  const bool checkpointing = GetParam();
  std::mt19937_64 gen(11);
  // Five examples of awkward lengths (a row of 24: 7 + 9 + 5 and 3 padding; 13 + 11 exactly),
  // each with a masked "prompt" (trained from a random point on) and a masked token inside.
  const std::vector<int64_t> lengths = {7, 9, 5, 13, 11};
  std::vector<Example> examples;
  for (int64_t len : lengths) {
    Example ex;
    const int64_t first_trained = 1 + static_cast<int64_t>(gen() % 3);
    for (int64_t i = 0; i < len; ++i) {
      ex.tokens.push_back(static_cast<int32_t>(1 + gen() % (kVocab - 1)));
      ex.trained.push_back(i >= first_trained && i != len - 2);
    }
    examples.push_back(std::move(ex));
  }
  const std::vector<std::vector<int>> packed_rows = {{0, 1, 2}, {3, 4}};
  const auto all = [](int) { return true; };

  for (const ModelConfig& config : {Llama(), Qwen2(), Gpt2()}) {
    SCOPED_TRACE(absl::StrCat(config.name, checkpointing ? " with checkpointing" : ""));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, ModelOptions(checkpointing)));
    ASSERT_OK(rig->model->InitializeParameters(7));
    const std::vector<std::string> names = HfNames(config);

    const Batch whole = Pack(examples, packed_rows, all);
    ASSERT_OK_AND_ASSIGN(const Result packed_all, Step(*rig, whole.inputs(true)));
    const int64_t n_all = Trained(whole);
    ASSERT_GT(n_all, 0);
    double loss_sum = 0;
    std::vector<std::vector<double>> grad_sum;
    for (int e = 0; e < static_cast<int>(examples.size()); ++e) {
      SCOPED_TRACE(absl::StrCat("example ", e));
      // The packed batch scoring only example e, and e alone in row 0 (nothing in row 1), without
      // positions or key_start: plain causal attention from column 0.
      const Batch packed = Pack(examples, packed_rows, [e](int x) { return x == e; });
      const Batch alone = Pack(examples, {{e}, {}}, all);
      const int64_t n = Trained(alone);
      ASSERT_EQ(Trained(packed), n);
      ASSERT_GT(n, 0);
      ASSERT_OK_AND_ASSIGN(const Result got, Step(*rig, packed.inputs(true)));
      ASSERT_OK_AND_ASSIGN(const Result want, Step(*rig, alone.inputs(false)));
      EXPECT_NEAR(got.loss, want.loss, 1e-6 * want.loss);
      std::string where;
      EXPECT_LE(WorstGradError(got, ToDouble(want), names, &where), 2e-6) << where;
      // And its own positions given explicitly change nothing of the alone run.
      ASSERT_OK_AND_ASSIGN(const Result want_meta, Step(*rig, alone.inputs(true)));
      EXPECT_NEAR(want_meta.loss, want.loss, 1e-6 * want.loss);
      EXPECT_LE(WorstGradError(want_meta, ToDouble(want), names, &where), 2e-6) << where;

      loss_sum += want.loss * static_cast<double>(n);
      const std::vector<std::vector<double>> g = ToDouble(want, static_cast<double>(n));
      if (grad_sum.empty()) {
        grad_sum = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) {
          for (size_t j = 0; j < g[i].size(); ++j) grad_sum[i][j] += g[i][j];
        }
      }
    }
    // The whole packed batch: the mean over all its trained targets.
    EXPECT_NEAR(packed_all.loss, loss_sum / static_cast<double>(n_all), 1e-6 * packed_all.loss);
    for (std::vector<double>& g : grad_sum) {
      for (double& x : g) x /= static_cast<double>(n_all);
    }
    std::string where;
    EXPECT_LE(WorstGradError(packed_all, grad_sum, names, &where), 2e-6) << where;
    // Evaluate agrees with the training pass.
    ASSERT_OK_AND_ASSIGN(const double eval, rig->model->Evaluate(whole.inputs(true)));
    EXPECT_EQ(eval, packed_all.loss);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, PackedRowsTest, ::testing::Bool());

// Without positions and key_start a model created with token_metadata computes what one without it
// does, bit for bit (the buffer only has room for them).
TEST(PackedRowsModelTest, TokenMetadataWithoutMetadataIsBitIdentical) {
  std::mt19937_64 gen(5);
  std::vector<int32_t> tokens(kBatch * kSeqLen), targets(kBatch * kSeqLen);
  for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % kVocab);
  for (int32_t& t : targets) t = static_cast<int32_t>(gen() % kVocab);
  for (const ModelConfig& config : {Llama(), Gpt2()}) {
    SCOPED_TRACE(config.name);
    std::vector<Result> results;
    for (bool metadata : {false, true}) {
      GptModelOptions o = ModelOptions(false);
      o.token_metadata = metadata;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
      ASSERT_OK(rig->model->InitializeParameters(7));
      ASSERT_OK_AND_ASSIGN(Result r, Step(*rig, {.tokens = tokens, .targets = targets}));
      results.push_back(std::move(r));
    }
    EXPECT_EQ(results[0].loss, results[1].loss);
    for (size_t i = 0; i < results[0].grads.size(); ++i) {
      EXPECT_EQ(results[0].grads[i], results[1].grads[i]) << i;
    }
  }
}

// The activation profile of a model with token_metadata (its inputs buffer 8 bytes per token
// larger) replays the tide a packed batch measures, moment by moment.
TEST(PackedRowsModelTest, ActivationProfileCountsTheMetadata) {
  for (const ModelConfig& config : {Llama(), Gpt2()}) {
    for (bool checkpointing : {false, true}) {
      SCOPED_TRACE(absl::StrCat(config.name, " checkpointing ", checkpointing));
      const GptModelOptions o = ModelOptions(checkpointing);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, o));
      ASSERT_OK(rig->model->InitializeParameters(7));
      std::vector<Example> examples = {{{5, 6, 7, 8, 9}, {false, true, true, true, true}},
                                       {{10, 11, 12}, {false, true, true}}};
      const Batch b = Pack(examples, {{0, 1}, {1}}, [](int) { return true; });
      ASSERT_OK(rig->manager->BeginIteration());
      ASSERT_OK(rig->model->ForwardBackward(b.inputs(true)).status());
      ASSERT_OK(rig->manager->EndIteration());
      const TideTrace& tide = rig->manager->tide();
      ASSERT_TRUE(tide.finished());

      const GptMemoryModel memory = ModelActivationProfile(config, o, DType::kF32, {});
      // The inputs buffer is the program's first allocation: 8 bytes per token more with
      // token_metadata.
      GptModelOptions without = o;
      without.token_metadata = false;
      const GptMemoryModel plain = ModelActivationProfile(config, without, DType::kF32, {});
      ASSERT_FALSE(memory.profile.iteration.empty());
      ASSERT_FALSE(plain.profile.iteration.empty());
      EXPECT_EQ(memory.profile.iteration.front().bytes - plain.profile.iteration.front().bytes,
                8 * kBatch * kSeqLen);
      MemoryPlanOptions p;
      p.ops = memory.ops;
      p.profile = memory.profile;
      p.chunk_elems = kChunkElems;
      p.compute_dtype = DType::kF32;
      p.accelerator_bytes = 64 * kMiB;
      p.scratch = DeviceMemoryOptions{}.scratch;
      ASSERT_OK_AND_ASSIGN(const MemoryPlan plan, PlanMemory(p));
      std::vector<int64_t> predicted;
      for (const PlannedMoment& m : plan.moments) {
        if (m.op >= 0) predicted.push_back(m.nonmodel_peak_bytes);
      }
      ASSERT_EQ(static_cast<int64_t>(predicted.size()), tide.num_recorded());
      for (int64_t m = 0; m < tide.num_recorded(); ++m) {
        EXPECT_EQ(predicted[m], tide.sample(m).accelerator_peak_bytes) << "moment " << m;
      }
    }
  }
}

// The host checks: InvalidArgument naming the rule, nothing computed.
TEST(PackedRowsModelTest, BadPositionsAndKeyStartAreRefused) {
  const ModelConfig config = Llama();
  std::vector<Example> examples = {{{5, 6, 7, 8, 9}, {false, true, true, true, true}}};
  const Batch good = Pack(examples, {{0, 0}, {0}}, [](int) { return true; });
  struct Case {
    std::string name;
    std::function<void(Batch&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"position T", [](Batch& b) { b.positions[3] = kSeqLen; }, "outside [0, 24)"},
      {"negative position", [](Batch& b) { b.positions[30] = -1; }, "position -1 at row 1"},
      {"key_start after t", [](Batch& b) { b.key_start[2] = 3; }, "key_start 3 at row 0, column 2"},
      {"key_start decreasing",
       [](Batch& b) {
         b.key_start[6] = 5;
         b.key_start[7] = 4;
       },
       "decreases at row 0, column 7"},
      {"short key_start", [](Batch& b) { b.key_start.pop_back(); }, "key_start has 47 elements"},
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> rig, MakeRig(config, ModelOptions(false)));
  ASSERT_OK(rig->model->InitializeParameters(7));
  ASSERT_OK(rig->model->CheckInputs(good.inputs(true)));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Batch b = good;
    c.mutate(b);
    EXPECT_THAT(rig->model->Evaluate(b.inputs(true)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  // Positions without key_start.
  ModelInputs half = good.inputs(true);
  half.key_start = {};
  EXPECT_THAT(rig->model->Evaluate(half), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("key_start has 0 elements")));
  // A model created without token_metadata has no room for them.
  GptModelOptions o = ModelOptions(false);
  o.token_metadata = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Rig> plain, MakeRig(config, o));
  ASSERT_OK(plain->model->InitializeParameters(7));
  EXPECT_THAT(plain->model->Evaluate(good.inputs(true)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token_metadata")));
}

}  // namespace
}  // namespace ps
